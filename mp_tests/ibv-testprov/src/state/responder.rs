//! The responder side: each context's accept loop, and the thread per connection that runs a
//! peer requester's writes, writes with immediate and atomics against the local MRs.

use super::*;
use crate::wire::Hello;

pub(super) fn accept_loop(ctx: Arc<CtxShared>, listener: TcpListener) {
    loop {
        let conn = listener.accept();
        if ctx.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let Ok((stream, _)) = conn else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if let Err(e) = accept_one(&ctx, stream) {
            eprintln!("ibv-testprov {}: rejected a connection: {e}", ctx.name);
        }
    }
}

/// Reads the hello, finds the target QP and starts a responder thread for the connection.
fn accept_one(ctx: &Arc<CtxShared>, mut stream: TcpStream) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    stream
        .set_read_timeout(Some(CONNECT_TIMEOUT))
        .map_err(|e| format!("set_read_timeout: {e}"))?;
    let hello = wire::read_hello(&mut stream).map_err(|e| format!("reading hello: {e}"))?;
    let idx = (hello.dst_qpn & 0xff) as usize;
    let qp = lock(&ctx.qps)[idx]
        .clone()
        .filter(|q| q.qpn == hello.dst_qpn);
    let Some(qp) = qp else {
        let _ = wire::write_hello_ack(&mut stream, 2);
        return Err(format!("no QP {:#x} here", hello.dst_qpn));
    };
    wire::write_hello_ack(&mut stream, 0).map_err(|e| format!("writing hello ack: {e}"))?;
    stream
        .set_read_timeout(None)
        .map_err(|e| format!("set_read_timeout: {e}"))?;
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let keep = stream
        .try_clone()
        .map_err(|e| format!("cloning the stream: {e}"))?;
    lock(&qp.responder_streams).push(keep);
    let q2 = qp.clone();
    let handle = std::thread::Builder::new()
        .name(format!("testprov-resp-{:#x}", qp.qpn))
        .spawn(move || responder_loop(q2, stream, hello))
        .map_err(|e| format!("spawning a responder thread: {e}"))?;
    lock(&qp.threads).push(handle);
    Ok(())
}

impl QpShared {
    /// Waits (bounded, the RNR timeout) until `check` on the QP's state answers; `Err(late)`
    /// when the time is up first.
    fn wait_for<T>(
        &self,
        late: u32,
        mut check: impl FnMut(&QpInner) -> Option<Result<T, u32>>,
    ) -> Result<T, u32> {
        let deadline = Instant::now() + self.ctx.config.rnr_timeout;
        let mut inner = lock(&self.inner);
        loop {
            if let Some(answer) = check(&inner) {
                return answer;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(late);
            }
            inner = self
                .cond
                .wait_timeout(inner, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits (bounded) until the QP can receive (RTR or RTS). Returns the status to answer
    /// with when it cannot.
    fn wait_receivable(&self, src_qpn: u32) -> Result<u32, u32> {
        self.wait_for(wcs::IBV_WC_RETRY_EXC_ERR, |inner| {
            if self.destroyed.load(Ordering::SeqCst) {
                return Some(Err(wcs::IBV_WC_RETRY_EXC_ERR));
            }
            match inner.state {
                qps::IBV_QPS_RTR | qps::IBV_QPS_RTS if inner.dest_qpn != src_qpn => {
                    Some(Err(wcs::IBV_WC_REM_INV_REQ_ERR))
                }
                qps::IBV_QPS_RTR | qps::IBV_QPS_RTS => Some(Ok(inner.access)),
                qps::IBV_QPS_RESET | qps::IBV_QPS_INIT => None,
                _ => Some(Err(wcs::IBV_WC_RETRY_EXC_ERR)),
            }
        })
    }

    /// Waits (bounded, the RNR timeout) for a posted receive; does not take it.
    fn wait_recv_posted(&self) -> Result<(), u32> {
        self.wait_for(wcs::IBV_WC_RNR_RETRY_EXC_ERR, |inner| {
            if self.destroyed.load(Ordering::SeqCst) || inner.state == qps::IBV_QPS_ERR {
                Some(Err(wcs::IBV_WC_RETRY_EXC_ERR))
            } else if !inner.recvs.is_empty() {
                Some(Ok(()))
            } else {
                None
            }
        })
    }

    /// Checks a remote write against the MR table: key, PD, access, bounds.
    fn check_remote(&self, rkey: u32, addr: u64, len: u64, need: u32) -> Result<(), u32> {
        match self.ctx.mr_lookup(rkey) {
            Some(mr) if mr.pd == self.pd && mr.access & need == need && mr.contains(addr, len) => {
                Ok(())
            }
            _ => Err(wcs::IBV_WC_REM_ACCESS_ERR),
        }
    }

    /// Copies `len` bytes from the connection into `[addr, addr + len)` in chunks, re-checking
    /// the region under the table's read lock for each chunk (a concurrent dereg waits).
    fn receive_into(
        &self,
        stream: &mut TcpStream,
        rkey: u32,
        addr: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> std::io::Result<u32> {
        use std::io::Read;
        let mut done = 0usize;
        let mut status = wcs::IBV_WC_SUCCESS;
        while done < len {
            let n = (len - done).min(CHUNK);
            buf.resize(n, 0);
            stream.read_exact(&mut buf[..n])?;
            if status == wcs::IBV_WC_SUCCESS {
                let mrs = self.ctx.mrs.read().unwrap_or_else(|e| e.into_inner());
                let dst = addr + done as u64;
                match mrs.get(&rkey) {
                    Some(mr) if mr.pd == self.pd && mr.contains(dst, n as u64) => {
                        // SAFETY: the destination lies inside a registered region that cannot be
                        // deregistered while we hold the read lock.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                buf.as_ptr(),
                                mr.host_addr(dst) as *mut u8,
                                n,
                            )
                        };
                    }
                    _ => status = wcs::IBV_WC_REM_ACCESS_ERR,
                }
            }
            done += n;
        }
        Ok(status)
    }

    fn drain(stream: &mut TcpStream, len: usize, buf: &mut Vec<u8>) -> std::io::Result<()> {
        use std::io::Read;
        let mut left = len;
        while left > 0 {
            let n = left.min(CHUNK);
            buf.resize(n, 0);
            stream.read_exact(&mut buf[..n])?;
            left -= n;
        }
        Ok(())
    }

    /// Serves one connection from a peer's requester: executes its requests in order.
    fn handle_request(
        &self,
        stream: &mut TcpStream,
        src_qpn: u32,
        req: Request,
        buf: &mut Vec<u8>,
    ) -> std::io::Result<Option<Response>> {
        match req {
            Request::Bye => Ok(None),
            Request::Write {
                rkey,
                addr,
                len,
                imm,
            } => {
                let len_us = len as usize;
                let mut status = match self.wait_receivable(src_qpn) {
                    Ok(access) if access & ACCESS_REMOTE_WRITE == 0 => wcs::IBV_WC_REM_INV_REQ_ERR,
                    // A zero-length RDMA write does not validate the rkey (IB spec).
                    Ok(_) if len == 0 => wcs::IBV_WC_SUCCESS,
                    Ok(_) => match self.check_remote(rkey, addr, len as u64, ACCESS_REMOTE_WRITE) {
                        Ok(()) => wcs::IBV_WC_SUCCESS,
                        Err(s) => s,
                    },
                    Err(s) => s,
                };
                if status == wcs::IBV_WC_SUCCESS && imm.is_some() {
                    if let Err(s) = self.wait_recv_posted() {
                        status = s;
                    }
                }
                if status == wcs::IBV_WC_SUCCESS && len_us > 0 {
                    status = self.receive_into(stream, rkey, addr, len_us, buf)?;
                } else if len_us > 0 {
                    Self::drain(stream, len_us, buf)?;
                }
                if status == wcs::IBV_WC_SUCCESS {
                    if let Some(imm) = imm {
                        let mut inner = lock(&self.inner);
                        match inner.recvs.pop_front() {
                            Some(r) => {
                                let mut c = wc(
                                    r.wr_id,
                                    wcs::IBV_WC_SUCCESS,
                                    wco::IBV_WC_RECV_RDMA_WITH_IMM,
                                    len,
                                    self.qpn,
                                );
                                c.imm_data = imm;
                                c.wc_flags = ibverbs_sys::ibv_wc_flags::IBV_WC_WITH_IMM.0;
                                c.src_qp = src_qpn;
                                self.recv_cq.push(c);
                            }
                            None => status = wcs::IBV_WC_RNR_RETRY_EXC_ERR,
                        }
                    }
                }
                Ok(Some(Response::Ack { status, value: 0 }))
            }
            Request::FetchAdd { rkey, addr, add } => {
                let mut value = 0;
                let status = match self.wait_receivable(src_qpn) {
                    Ok(access) if access & ACCESS_REMOTE_ATOMIC == 0 => wcs::IBV_WC_REM_INV_REQ_ERR,
                    Ok(_) if addr % 8 != 0 => wcs::IBV_WC_REM_INV_REQ_ERR,
                    Ok(_) => {
                        let mrs = self.ctx.mrs.read().unwrap_or_else(|e| e.into_inner());
                        match mrs.get(&rkey) {
                            Some(mr)
                                if mr.pd == self.pd
                                    && mr.access & ACCESS_REMOTE_ATOMIC != 0
                                    && mr.contains(addr, 8) =>
                            {
                                // SAFETY: 8-byte aligned, inside a registered region that stays
                                // registered while we hold the read lock; all accesses through
                                // the provider to it are atomic.
                                let a =
                                    unsafe { AtomicU64::from_ptr(mr.host_addr(addr) as *mut u64) };
                                value = a.fetch_add(add, Ordering::SeqCst);
                                wcs::IBV_WC_SUCCESS
                            }
                            _ => wcs::IBV_WC_REM_ACCESS_ERR,
                        }
                    }
                    Err(s) => s,
                };
                Ok(Some(Response::Ack { status, value }))
            }
        }
    }
}

fn responder_loop(qp: Arc<QpShared>, mut stream: TcpStream, hello: Hello) {
    let mut buf = Vec::new();
    loop {
        let req = wire::read_request(&mut stream);
        let result = match req {
            Ok(r) => qp.handle_request(&mut stream, hello.src_qpn, r, &mut buf),
            Err(e) => Err(e),
        };
        match result {
            Ok(Some(resp)) => {
                if stream.write_all(&wire::encode_response(&resp)).is_err() {
                    break;
                }
            }
            Ok(None) => return, // clean bye
            Err(_) => break,
        }
    }
    // The requester vanished without a bye (its process died, or it hit an error): like the
    // responder of a real RC connection, this QP goes to ERR so its receives are flushed.
    if !qp.destroyed.load(Ordering::SeqCst) && qp.state() != qps::IBV_QPS_RESET {
        qp.to_error();
    }
}
