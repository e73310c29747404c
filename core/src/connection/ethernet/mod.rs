//! The Ethernet connection: TCP between two endpoints, a receive thread per direction.
//!
//! Each Ethernet endpoint owns a listening socket. Connecting endpoint A to B opens an
//! outbound socket from A to B's listener (A's writes and B's acks travel on it) and accepts
//! B's outbound socket on A's listener (B's writes and A's acks); [`setup`] pairs them within
//! the caller's timeout and makes both sides confirm, so they agree on the outcome.
//!
//! Frames ([`wire`]) carry the destination's registration id. The receiver applies a frame
//! only inside the live local registration with that id, registered for Ethernet (address
//! range and size; a signal needs an aligned u64): a stale handle (a registration the
//! receiver dropped, whatever now lives at that address) or an unknown range is never
//! written: the payload is drained, the frame is acked as rejected with the reason, and the
//! error is reported by the next write or flush of BOTH sides' connections. `flush` waits
//! (with a timeout) until every frame sent so far is acked. A peer that closes or dies breaks
//! the connection: every later operation is an error naming the peer (its rank when known),
//! and [`BaseConnection::health`] reports it without blocking.
//!
//! Closing is graceful for what was already delivered: dropping a connection stops reading new
//! frames but lets the receive thread send the ack of the frame it is applying (waiting for it
//! up to [`CLOSE_GRACE`]), and a flush succeeds once every frame is acked even when the peer
//! has closed since. Both matter at the end of a collective: the peer's kernel may finish on our
//! last signal and its communicator go away before the ack of that signal reached us.
//!
//! GPU memory: the sender reads a write's payload and the receiver stores payloads and signals
//! with plain CPU loads and stores wherever the memory is host-addressable (host memory, and
//! GPU memory allocated `MemoryKind::HostMapped`: pinned host pages the kernels address), and
//! through the GPU backend's copies only for device memory. Those copies can wait behind an
//! unrelated thread of the application: while a thread is blocked in a synchronous pageable
//! copy on the legacy stream behind a kernel (PyTorch reading a result), the CUDA driver held
//! another thread's copy into GPU memory for 4.75 s on an H200 (docs/perf.md). A kernel that
//! waits for such a signal then never gets it. So GPU users that run while the application
//! blocks (the hierarchical collectives, see collectives/net.rs) put their network buffers
//! and semaphore tokens in host-mapped memory, as NCCL's socket transport does.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub(crate) mod receiver;
mod setup;
pub(crate) mod wire;

use self::receiver::CHUNK;
use self::setup::io_err;
use self::wire::{Frame, Op, ACK_LEN};
use super::{BaseConnection, Peer};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::memory::read_from;
use crate::registered_memory::RegisteredMemory;
use crate::transport::{Device, Transport};

/// Writes whole buffers to a socket, a frame (header and payload) at most `timeout` in all:
/// the socket's write timeout (`timeout`) bounds one blocked call, and once a call came back
/// short the rest runs against the frame's deadline (a frozen peer never stalls a send for
/// longer).
struct Sender<'a> {
    sock: &'a TcpStream,
    timeout: Duration,
    deadline: Instant,
    /// Whether the socket's write timeout was shortened (restored on drop).
    shortened: bool,
}

impl Sender<'_> {
    fn send(&mut self, mut b: &[u8]) -> std::io::Result<()> {
        while !b.is_empty() {
            match (&*self.sock).write(b) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => b = &b[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "the peer took no data for {:?} (frozen or not reading)",
                            self.timeout
                        ),
                    ))
                }
                Err(e) => return Err(e),
            }
            if !b.is_empty() {
                let left = self.deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("a frame took longer than {:?} to send", self.timeout),
                    ));
                }
                self.sock.set_write_timeout(Some(left))?;
                self.shortened = true;
            }
        }
        Ok(())
    }
}

impl Drop for Sender<'_> {
    fn drop(&mut self) {
        if self.shortened {
            let _ = self.sock.set_write_timeout(Some(self.timeout));
        }
    }
}

#[derive(Default)]
struct State {
    sent: u64,
    acked: u64,
    /// Set once the socket pair is unusable (peer closed or died).
    broken: Option<String>,
    /// Set when no more acks can arrive (the ack thread ended, a send failed, an abort): a
    /// flush with frames still unacked fails then. A broken receive side alone does not end
    /// it: the acks travel on the other socket and may still be on their way.
    acks_ended: bool,
    /// Set when the receive thread has ended (its last ack is written or failed).
    recv_done: bool,
    /// Errors to report once each on the next write/flush (rejected or invalid frames); at
    /// most [`MAX_REPORTS`] kept, the rest counted.
    reported: Vec<String>,
    unreported: u64,
}

/// Rejection messages kept until the next write/flush reports them (a peer sending millions of
/// refused frames costs a counter, not memory).
const MAX_REPORTS: usize = 16;

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    closing: AtomicBool,
    peer: Peer,
}

impl State {
    fn push_report(&mut self, msg: String) {
        if self.reported.len() < MAX_REPORTS {
            self.reported.push(msg);
        } else {
            self.unreported += 1;
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Waits at most `left` on the condition variable with the held guard `s` (a poisoned lock
    /// is taken over, as in [`Shared::lock`]).
    fn wait<'a>(
        &self,
        s: std::sync::MutexGuard<'a, State>,
        left: Duration,
    ) -> std::sync::MutexGuard<'a, State> {
        self.cv
            .wait_timeout(s, left)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }
    fn report(&self, msg: String) {
        self.lock().push_report(msg);
        self.cv.notify_all();
    }
    /// Marks the connection broken by `msg`; `acks_ended` when no ack can arrive any more.
    fn break_with(&self, msg: String, acks_ended: bool) {
        let mut s = self.lock();
        s.acks_ended |= acks_ended;
        if s.broken.is_none() && !self.closing.load(Ordering::Acquire) {
            s.broken = Some(msg);
        }
        drop(s);
        self.cv.notify_all();
    }
    /// The error of a broken connection: [`Error::Remote`] when the rank is known.
    fn broken_error(&self, why: &str) -> Error {
        match self.peer.rank {
            Some(r) => Error::remote(
                r,
                format!("Ethernet connection ({}): {why}", self.peer.addr),
            ),
            None => Error::Io {
                op: format!("Ethernet connection to {}", self.peer),
                source: std::io::Error::new(std::io::ErrorKind::ConnectionAborted, why),
            },
        }
    }

    /// The first pending error: a sticky break, else a reported one (taken).
    fn take_error(&self, s: &mut State) -> Option<Error> {
        if let Some(b) = &s.broken {
            return Some(self.broken_error(b));
        }
        if !s.reported.is_empty() {
            let mut msgs = std::mem::take(&mut s.reported);
            let more = std::mem::take(&mut s.unreported);
            if more > 0 {
                msgs.push(format!("and {more} more"));
            }
            return Some(Error::invalid(format!(
                "Ethernet connection to {}: {}",
                self.peer,
                msgs.join("; ")
            )));
        }
        None
    }
}

pub(crate) struct EthernetConnection {
    local_device: Device,
    out: Mutex<TcpStream>,
    /// A handle of the outbound socket outside the send lock, to shut it down (abort, drop)
    /// while a send blocks on it.
    out_ctl: TcpStream,
    inbound: TcpStream,
    /// The most a frame may take to send (the caller's connect timeout).
    send_timeout: Duration,
    shared: Arc<Shared>,
}

/// How long dropping a connection waits for its receive thread to send the ack of the frame it
/// is applying (it stops reading at once; see the module doc).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

impl Drop for EthernetConnection {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        // The ack thread sees EOF and exits; our frames already sent stay queued before the FIN.
        let _ = self.out_ctl.shutdown(Shutdown::Both);
        // The receive thread's next read returns EOF, but the ack of the frame it may be
        // applying can still be written: the peer's flush then sees it.
        let _ = self.inbound.shutdown(Shutdown::Read);
        let deadline = Instant::now() + CLOSE_GRACE;
        let mut s = self.shared.lock();
        while !s.recv_done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = self.shared.wait(s, left);
        }
        drop(s);
        let _ = self.inbound.shutdown(Shutdown::Both);
    }
}

impl EthernetConnection {
    /// Pairs `local` (created here) with `remote` (the endpoint of rank `rank` when known);
    /// both sides must call this within `timeout`, and both return `Ok` only together.
    pub(crate) fn connect(
        local: &Endpoint,
        remote: &Endpoint,
        timeout: Duration,
        rank: Option<usize>,
    ) -> Result<EthernetConnection> {
        let listener = local.listener().ok_or_else(|| {
            Error::invalid(
                "Ethernet connect: expected a local endpoint created by this process's context, \
                 got a deserialized one"
                    .to_string(),
            )
        })?;
        let addr = remote.ethernet_address()?;
        let peer = Peer {
            rank,
            addr: addr.to_string(),
        };
        let label = peer.to_string();
        let deadline = Instant::now() + timeout;
        let ids = (local.id(), remote.id());
        let hello = wire::hello(remote.id(), local.id());
        let out = setup::connect_out(addr, &hello, deadline, timeout, &label)?;
        let inbound = setup::accept_peer(listener, &out, ids, deadline, timeout, &label)?;
        setup::confirm(&out, &inbound, ids, deadline, timeout, &label)?;
        out.set_write_timeout(Some(timeout))
            .map_err(io_err("set_write_timeout".into()))?;
        inbound
            .set_write_timeout(Some(timeout))
            .map_err(io_err("set_write_timeout".into()))?;

        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            closing: AtomicBool::new(false),
            peer,
        });
        let clone = |s: &TcpStream| s.try_clone().map_err(io_err("clone socket".into()));
        let (ack_sock, recv_sock) = (clone(&out)?, clone(&inbound)?);
        let s1 = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("mscclpp-eth-ack".into())
            .spawn(move || ack_loop(ack_sock, s1))
            .map_err(io_err("spawn Ethernet ack thread".into()))?;
        let s2 = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("mscclpp-eth-recv".into())
            .spawn(move || recv_loop(recv_sock, s2))
            .map_err(io_err("spawn Ethernet receive thread".into()))?;
        Ok(EthernetConnection {
            local_device: local.device(),
            out_ctl: clone(&out)?,
            out: Mutex::new(out),
            inbound,
            send_timeout: timeout,
            shared,
        })
    }

    /// Sends one frame (and, for a write, the payload from `payload`) under the send lock.
    fn send_frame(
        &self,
        registration: u64,
        addr: u64,
        op: Op,
        payload: Option<(&RegisteredMemory, u64)>,
    ) -> Result<()> {
        let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let seq = {
            let mut s = self.shared.lock();
            if let Some(e) = self.shared.take_error(&mut s) {
                return Err(e);
            }
            s.sent += 1;
            s.sent
        };
        crate::log_trace!(
            "NET",
            "Ethernet to {}: sending frame #{seq} {op:?} at {addr:#x}",
            self.shared.peer
        );
        let h = Frame {
            seq,
            registration,
            addr,
            op,
        }
        .encode();
        let fail = |e: std::io::Error| {
            let msg = format!("sending frame #{seq}: {e}");
            self.shared.break_with(msg.clone(), true);
            // An abort (or the receive side) may have broken it first: report that cause.
            let first = self.shared.lock().broken.clone().unwrap_or(msg);
            self.shared.broken_error(&first)
        };
        let mut tx = Sender {
            sock: &out,
            timeout: self.send_timeout,
            deadline: Instant::now() + self.send_timeout,
            shortened: false,
        };
        tx.send(&h).map_err(fail)?;
        let len_or_value = match op {
            Op::Write { len } => len,
            Op::Signal { value } => value,
        };
        if let Some((src, src_offset)) = payload {
            let mut done = 0u64;
            while done < len_or_value {
                let n = (len_or_value - done).min(CHUNK as u64) as usize;
                let at = src.data() + src_offset + done;
                if let Some(host) = src.host_address(at) {
                    // SAFETY: the range is inside `src` (checked by Connection), which the
                    // borrow keeps alive; the bytes are only read.
                    let bytes = unsafe { std::slice::from_raw_parts(host as *const u8, n) };
                    tx.send(bytes).map_err(fail)?;
                } else {
                    // SAFETY: as above, read through the GPU backend.
                    let bytes = unsafe { read_from(src.device(), at, n) }?;
                    tx.send(&bytes).map_err(fail)?;
                }
                done += n as u64;
            }
        }
        Ok(())
    }
}

impl BaseConnection for EthernetConnection {
    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_offset: u64,
        src: &RegisteredMemory,
        src_offset: u64,
        size: u64,
    ) -> Result<()> {
        self.send_frame(
            dst.registration_id(),
            dst.original_data_ptr() + dst_offset,
            Op::Write { len: size },
            Some((src, src_offset)),
        )
    }

    fn update_and_sync(
        &self,
        dst: &RegisteredMemory,
        dst_offset: u64,
        src: &AtomicU64,
        new_value: u64,
    ) -> Result<()> {
        src.store(new_value, Ordering::Release);
        self.send_frame(
            dst.registration_id(),
            dst.original_data_ptr() + dst_offset,
            Op::Signal { value: new_value },
            None,
        )
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.lock();
        loop {
            // Rejected frames first; then done once everything is acked, even if the peer has
            // closed since (see the module doc); a break only fails a flush that still misses
            // acks which can no longer come.
            let unacked = s.acked < s.sent;
            if !s.reported.is_empty() || (unacked && s.broken.is_some() && s.acks_ended) {
                if let Some(e) = self.shared.take_error(&mut s) {
                    return Err(e);
                }
            }
            if !unacked {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::timeout(
                    format!(
                        "Ethernet flush to {}: {} of {} frames acknowledged (the peer is \
                         frozen or overloaded)",
                        self.shared.peer, s.acked, s.sent
                    ),
                    timeout,
                ));
            }
            s = self.shared.wait(s, left);
        }
    }
    fn transport(&self) -> Transport {
        Transport::Ethernet
    }
    fn remote_transport(&self) -> Transport {
        Transport::Ethernet
    }
    fn local_device(&self) -> Device {
        self.local_device
    }
    fn health(&self) -> Result<()> {
        match &self.shared.lock().broken {
            Some(b) => Err(self.shared.broken_error(b)),
            None => Ok(()),
        }
    }
    fn abort(&self, reason: &str) {
        self.shared.break_with(format!("aborted: {reason}"), true);
        // Unblocks a send stuck on a frozen peer and both threads.
        let _ = self.out_ctl.shutdown(Shutdown::Both);
        let _ = self.inbound.shutdown(Shutdown::Both);
    }
}

/// Reads acks of our writes from the outbound socket.
fn ack_loop(mut sock: TcpStream, shared: Arc<Shared>) {
    let mut a = [0u8; ACK_LEN];
    loop {
        if let Err(e) = sock.read_exact(&mut a) {
            shared.break_with(format!("the peer closed the connection ({e})"), true);
            return;
        }
        let (seq, status) = match wire::decode_ack(&a) {
            Ok(x) => x,
            Err(e) => return shared.break_with(format!("protocol error: {e}"), true),
        };
        let mut s = shared.lock();
        if seq != s.acked + 1 || seq > s.sent {
            let msg = format!(
                "protocol error: expected ack {} (sent {}), got ack {seq}",
                s.acked + 1,
                s.sent
            );
            drop(s);
            shared.break_with(msg, true);
            return;
        }
        s.acked = seq;
        if let Some(why) = status.reason() {
            s.push_report(format!("the peer rejected write #{seq}: {why}"));
        }
        drop(s);
        shared.cv.notify_all();
    }
}

/// Applies the peer's frames from the inbound socket and acks each (see [`receiver`]); when
/// they end, breaks the connection with why and marks the receive thread done.
fn recv_loop(mut sock: TcpStream, shared: Arc<Shared>) {
    let end = match sock.try_clone() {
        Ok(mut ack_sock) => {
            let mut buf = Vec::new();
            receiver::serve(&mut sock, &mut ack_sock, &mut buf, &mut |m| {
                shared.report(m)
            })
        }
        Err(e) => format!("cloning the receive socket: {e}"),
    };
    shared.break_with(end, false);
    shared.lock().recv_done = true;
    shared.cv.notify_all();
}
