//! The requester side of a queue pair: connecting to the peer's responder (INIT -> RTR) and
//! completing pending sends from the responses it reads.

use super::*;
use crate::wire::Hello;

impl QpShared {
    /// Connects to the peer's responder (INIT -> RTR). A failure is remembered; sends then
    /// complete with RETRY_EXC_ERR, like a real RC QP whose peer never answers.
    pub fn connect(self: &Arc<Self>, remote: SocketAddrV4, dest_qpn: u32) {
        let result = (|| -> Result<TcpStream, String> {
            let mut s = TcpStream::connect_timeout(&remote.into(), CONNECT_TIMEOUT)
                .map_err(|e| format!("connecting to {remote}: {e}"))?;
            let _ = s.set_nodelay(true);
            s.set_read_timeout(Some(CONNECT_TIMEOUT))
                .map_err(|e| format!("set_read_timeout: {e}"))?;
            wire::write_hello(
                &mut s,
                Hello {
                    dst_qpn: dest_qpn,
                    src_qpn: self.qpn,
                },
            )
            .map_err(|e| format!("sending hello to {remote}: {e}"))?;
            let st = wire::read_hello_ack(&mut s)
                .map_err(|e| format!("reading hello ack from {remote}: {e}"))?;
            if st != 0 {
                return Err(format!("{remote} has no QP {dest_qpn:#x} (status {st})"));
            }
            s.set_read_timeout(None)
                .map_err(|e| format!("set_read_timeout: {e}"))?;
            let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
            Ok(s)
        })();
        let mut send = lock(&self.send);
        send.generation += 1;
        if let Some(old) = send.stream.take() {
            let _ = old.shutdown(Shutdown::Both);
        }
        match result.and_then(|s| {
            s.try_clone()
                .map(|r| (s, r))
                .map_err(|e| format!("cloning stream: {e}"))
        }) {
            Ok((s, reader)) => {
                send.stream = Some(s);
                send.broken = None;
                let gen = send.generation;
                let me = self.clone();
                match std::thread::Builder::new()
                    .name(format!("testprov-req-{:#x}", self.qpn))
                    .spawn(move || me.response_loop(reader, gen))
                {
                    Ok(h) => lock(&self.threads).push(h),
                    Err(e) => {
                        send.stream = None;
                        send.broken = Some(format!("spawning the response thread: {e}"));
                    }
                }
            }
            Err(msg) => send.broken = Some(msg),
        }
    }

    /// Reads responses of the peer's responder and completes pending sends in order.
    fn response_loop(self: Arc<Self>, mut reader: TcpStream, gen: u64) {
        loop {
            let msg = wire::read_response(&mut reader);
            let mut send = lock(&self.send);
            if send.generation != gen || self.destroyed.load(Ordering::SeqCst) {
                return;
            }
            match msg {
                Ok(Response::Ack { status, value }) => {
                    let Some(p) = send.pending.pop_front() else {
                        send.broken = Some("response without a pending request".into());
                        self.enter_error(&mut send, None);
                        return;
                    };
                    let mut status = status;
                    if status == wcs::IBV_WC_SUCCESS {
                        if let Some((addr, lkey)) = p.result_at {
                            status = self.store_atomic_result(addr, lkey, value);
                        }
                    }
                    if status == wcs::IBV_WC_SUCCESS {
                        if p.signaled {
                            self.send_cq
                                .push(wc(p.wr_id, status, p.opcode, p.byte_len, self.qpn));
                        }
                    } else {
                        send.pending.push_front(p);
                        self.enter_error(&mut send, Some(status));
                        return;
                    }
                }
                Ok(Response::Bye) => {
                    send.broken = Some("the remote QP was destroyed".into());
                    if !send.pending.is_empty() {
                        self.enter_error(&mut send, Some(wcs::IBV_WC_RETRY_EXC_ERR));
                    }
                    return;
                }
                Err(e) => {
                    // The peer vanished (process died, connection reset): like a real RC QP
                    // whose retries run out.
                    send.broken = Some(format!("connection to the peer lost: {e}"));
                    self.enter_error(&mut send, Some(wcs::IBV_WC_RETRY_EXC_ERR));
                    return;
                }
            }
        }
    }

    fn store_atomic_result(&self, addr: u64, lkey: u32, value: u64) -> u32 {
        let mrs = self.ctx.mrs.read().unwrap_or_else(|e| e.into_inner());
        match mrs.get(&lkey) {
            Some(mr)
                if mr.pd == self.pd
                    && mr.contains(addr, 8)
                    && mr.access & ACCESS_LOCAL_WRITE != 0 =>
            {
                // SAFETY: the range lies inside a registered region (whose owner keeps it alive
                // while registered, and dereg waits for this read lock).
                unsafe { std::ptr::write_unaligned(mr.host_addr(addr) as *mut u64, value) };
                wcs::IBV_WC_SUCCESS
            }
            _ => wcs::IBV_WC_LOC_PROT_ERR,
        }
    }
}
