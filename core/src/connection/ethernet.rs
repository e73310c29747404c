//! The Ethernet connection: TCP between two endpoints, a receive thread per direction.
//!
//! Each Ethernet endpoint owns a listening socket. Connecting endpoint A to B opens an
//! outbound socket from A to B's listener (A's writes and B's acks travel on it) and accepts
//! B's outbound socket on A's listener (B's writes and A's acks). Both sides start with a
//! hello naming the target and source endpoint ids, so a stray client is turned away.
//!
//! Frames (little endian): `type u8 (1 write, 2 signal) | seq u64 | dst address u64 |
//! len-or-value u64`, a write followed by `len` payload bytes. The receiver validates every
//! frame against its registry of live local memories registered for Ethernet (address range
//! and size; a signal needs an aligned u64); an unknown range is never written: the payload is
//! drained, the frame is acked as rejected, and the error is reported by the next write or
//! flush of BOTH sides' connections. Acks: `seq u64 | status u8 (0 ok, 1 rejected)`.
//! `flush` waits (with a timeout) until every frame sent so far is acked. A peer that closes
//! or dies turns every later operation into an error.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::BaseConnection;
use crate::backoff::Backoff;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::memory::{host_addressable, read_from, write_to};
use crate::registered_memory::{find_local, RegisteredMemory};
use crate::transport::{Device, Transport};

const HELLO_MAGIC: &[u8; 4] = b"METH";
const HELLO_VERSION: u16 = 1;
const HELLO_LEN: usize = 4 + 2 + 8 + 8;
const FRAME_LEN: usize = 1 + 8 + 8 + 8;
const ACK_LEN: usize = 9;
const FRAME_WRITE: u8 = 1;
const FRAME_SIGNAL: u8 = 2;
/// Payload bytes moved per chunk (bounds the receiver's buffer whatever a peer claims).
const CHUNK: usize = 1 << 20;
/// How long a blocked socket send may take before the peer counts as stuck.
const SEND_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct State {
    sent: u64,
    acked: u64,
    /// Set once the socket pair is unusable (peer closed or died).
    broken: Option<String>,
    /// Errors to report once each on the next write/flush (rejected or invalid frames).
    reported: Vec<String>,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    closing: AtomicBool,
    peer: String,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn report(&self, msg: String) {
        self.lock().reported.push(msg);
        self.cv.notify_all();
    }
    fn break_with(&self, msg: String) {
        if self.closing.load(Ordering::Acquire) {
            return;
        }
        let mut s = self.lock();
        if s.broken.is_none() {
            s.broken = Some(msg);
        }
        drop(s);
        self.cv.notify_all();
    }
    /// The first pending error: a sticky break, else a reported one (taken).
    fn take_error(&self, s: &mut State) -> Option<Error> {
        if let Some(b) = &s.broken {
            return Some(Error::Io {
                op: format!("Ethernet connection to {}", self.peer),
                source: std::io::Error::new(std::io::ErrorKind::ConnectionAborted, b.clone()),
            });
        }
        if !s.reported.is_empty() {
            let msgs = std::mem::take(&mut s.reported);
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
    inbound: TcpStream,
    shared: Arc<Shared>,
}

impl Drop for EthernetConnection {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        // Wakes both threads (they see EOF or an error and exit).
        let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = out.shutdown(Shutdown::Both);
        let _ = self.inbound.shutdown(Shutdown::Both);
    }
}

fn hello(target: u64, source: u64) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[..4].copy_from_slice(HELLO_MAGIC);
    b[4..6].copy_from_slice(&HELLO_VERSION.to_le_bytes());
    b[6..14].copy_from_slice(&target.to_le_bytes());
    b[14..22].copy_from_slice(&source.to_le_bytes());
    b
}

fn io_err(op: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { op, source }
}

fn connect_with_retry(addr: SocketAddr, deadline: Instant, timeout: Duration) -> Result<TcpStream> {
    let mut backoff = Backoff::sleeping(Duration::from_millis(1), Duration::from_millis(100));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(10))) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::timeout(
                    format!("connecting to Ethernet endpoint {addr} (last error: {e})"),
                    timeout,
                ))
            }
            Err(_) => {
                backoff.snooze();
            }
        }
    }
}

/// Accepts the peer's outbound socket on `listener`: the one whose hello names `local_id` as
/// target and `remote_id` as source.
fn accept_peer(
    listener: &TcpListener,
    local_id: u64,
    remote_id: u64,
    deadline: Instant,
    timeout: Duration,
    peer: SocketAddr,
) -> Result<TcpStream> {
    listener
        .set_nonblocking(true)
        .map_err(io_err("listener set_nonblocking".into()))?;
    let mut backoff = Backoff::sleeping(Duration::from_micros(100), Duration::from_millis(20));
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(io_err("accepted socket set_nonblocking".into()))?;
                let left = deadline.saturating_duration_since(Instant::now());
                s.set_read_timeout(Some(left.max(Duration::from_millis(100))))
                    .map_err(io_err("accepted socket read timeout".into()))?;
                let mut h = [0u8; HELLO_LEN];
                // A client that does not say the expected hello is dropped; keep waiting.
                if (&s).read_exact(&mut h).is_ok() && h == hello(local_id, remote_id) {
                    s.set_read_timeout(None)
                        .map_err(io_err("accepted socket read timeout".into()))?;
                    return Ok(s);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                return Err(Error::io(
                    format!("accept on Ethernet endpoint for {peer}"),
                    e,
                ))
            }
        }
        if Instant::now() >= deadline {
            return Err(Error::timeout(
                format!("waiting for Ethernet peer {peer} to connect back"),
                timeout,
            ));
        }
        backoff.snooze();
    }
}

impl EthernetConnection {
    /// Pairs `local` (created here) with `remote`; both sides must call this within `timeout`.
    pub(crate) fn connect(
        local: &Endpoint,
        remote: &Endpoint,
        timeout: Duration,
    ) -> Result<EthernetConnection> {
        let listener = local.listener().ok_or_else(|| {
            Error::invalid(
                "Ethernet connect: expected a local endpoint created by this process's context, \
                 got a deserialized one"
                    .to_string(),
            )
        })?;
        let addr = remote.ethernet_address()?;
        let deadline = Instant::now() + timeout;
        let out = connect_with_retry(addr, deadline, timeout)?;
        out.set_nodelay(true)
            .map_err(io_err("set_nodelay".into()))?;
        (&out)
            .write_all(&hello(remote.id(), local.id()))
            .map_err(io_err(format!("sending hello to {addr}")))?;
        let inbound = accept_peer(listener, local.id(), remote.id(), deadline, timeout, addr)?;
        inbound
            .set_nodelay(true)
            .map_err(io_err("set_nodelay".into()))?;
        out.set_write_timeout(Some(SEND_TIMEOUT))
            .map_err(io_err("set_write_timeout".into()))?;
        inbound
            .set_write_timeout(Some(SEND_TIMEOUT))
            .map_err(io_err("set_write_timeout".into()))?;

        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            closing: AtomicBool::new(false),
            peer: addr.to_string(),
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
            out: Mutex::new(out),
            inbound,
            shared,
        })
    }

    /// Sends one frame (and payload chunks produced by `payload`) under the send lock.
    fn send_frame(
        &self,
        kind: u8,
        addr: u64,
        len_or_value: u64,
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
        let mut h = [0u8; FRAME_LEN];
        h[0] = kind;
        h[1..9].copy_from_slice(&seq.to_le_bytes());
        h[9..17].copy_from_slice(&addr.to_le_bytes());
        h[17..25].copy_from_slice(&len_or_value.to_le_bytes());
        let fail = |e: std::io::Error| {
            let msg = format!("sending to {}: {e}", self.shared.peer);
            self.shared.break_with(msg.clone());
            Error::io(format!("Ethernet connection to {}", self.shared.peer), e)
        };
        (&*out).write_all(&h).map_err(fail)?;
        if let Some((src, src_offset)) = payload {
            let mut done = 0u64;
            while done < len_or_value {
                let n = (len_or_value - done).min(CHUNK as u64) as usize;
                let at = src.data() + src_offset + done;
                if host_addressable(src.device()) {
                    // SAFETY: the range is inside `src` (checked by Connection), which the
                    // borrow keeps alive; the bytes are only read.
                    let bytes = unsafe { std::slice::from_raw_parts(at as usize as *const u8, n) };
                    (&*out).write_all(bytes).map_err(fail)?;
                } else {
                    // SAFETY: as above, read through the GPU backend.
                    let bytes = unsafe { read_from(src.device(), at, n) }?;
                    (&*out).write_all(&bytes).map_err(fail)?;
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
            FRAME_WRITE,
            dst.original_data_ptr() + dst_offset,
            size,
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
            FRAME_SIGNAL,
            dst.original_data_ptr() + dst_offset,
            new_value,
            None,
        )
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.lock();
        loop {
            if let Some(e) = self.shared.take_error(&mut s) {
                return Err(e);
            }
            if s.acked >= s.sent {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::timeout(
                    format!(
                        "Ethernet flush to {}: {} of {} writes acknowledged",
                        self.shared.peer, s.acked, s.sent
                    ),
                    timeout,
                ));
            }
            s = self
                .shared
                .cv
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
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
}

/// Reads acks of our writes from the outbound socket.
fn ack_loop(mut sock: TcpStream, shared: Arc<Shared>) {
    let mut a = [0u8; ACK_LEN];
    loop {
        if let Err(e) = sock.read_exact(&mut a) {
            shared.break_with(format!("peer closed the connection ({e})"));
            return;
        }
        let mut seq_b = [0u8; 8];
        seq_b.copy_from_slice(&a[..8]);
        let seq = u64::from_le_bytes(seq_b);
        let mut s = shared.lock();
        if seq != s.acked + 1 || seq > s.sent {
            let msg = format!(
                "protocol error: expected ack {} (sent {}), got ack {seq}",
                s.acked + 1,
                s.sent
            );
            drop(s);
            shared.break_with(msg);
            return;
        }
        s.acked = seq;
        if a[8] != 0 {
            s.reported.push(format!(
                "peer rejected write #{seq}: its destination is not inside live memory \
                 registered for Ethernet there"
            ));
        }
        drop(s);
        shared.cv.notify_all();
    }
}

/// Applies the peer's frames from the inbound socket and acks each.
fn recv_loop(mut sock: TcpStream, shared: Arc<Shared>) {
    let mut ack_sock = match sock.try_clone() {
        Ok(s) => s,
        Err(e) => {
            shared.break_with(format!("cloning the receive socket: {e}"));
            return;
        }
    };
    let mut h = [0u8; FRAME_LEN];
    let mut buf = Vec::new();
    loop {
        if let Err(e) = sock.read_exact(&mut h) {
            shared.break_with(format!("peer closed the connection ({e})"));
            return;
        }
        let kind = h[0];
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let (seq, addr, arg) = (word(1), word(9), word(17));
        let ok = match kind {
            FRAME_WRITE => match apply_write(&mut sock, &mut buf, addr, arg) {
                Ok(ok) => ok,
                Err(e) => {
                    shared.break_with(format!("receiving write #{seq}: {e}"));
                    return;
                }
            },
            FRAME_SIGNAL => apply_signal(addr, arg),
            other => {
                shared.break_with(format!(
                    "protocol error: expected frame type 1 or 2, got {other}"
                ));
                return;
            }
        };
        if !ok {
            shared.report(format!(
                "rejected incoming {} #{seq} to {addr:#x} (+{} bytes): not inside live memory \
                 registered for Ethernet in this process",
                if kind == FRAME_WRITE {
                    "write"
                } else {
                    "signal"
                },
                if kind == FRAME_WRITE { arg } else { 8 }
            ));
        }
        let mut a = [0u8; ACK_LEN];
        a[..8].copy_from_slice(&seq.to_le_bytes());
        a[8] = u8::from(!ok);
        if let Err(e) = ack_sock.write_all(&a) {
            shared.break_with(format!("acknowledging write #{seq}: {e}"));
            return;
        }
    }
}

/// Reads `len` payload bytes and stores them at `addr` if a live Ethernet registration covers
/// it (else drains them). Returns whether the write was applied.
fn apply_write(sock: &mut TcpStream, buf: &mut Vec<u8>, addr: u64, len: u64) -> Result<bool> {
    let target = find_local(addr, len, Transport::Ethernet);
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        buf.resize(n, 0);
        sock.read_exact(&mut buf[..n])
            .map_err(|e| Error::io("reading write payload", e))?;
        if let Some(mem) = &target {
            let at = addr + done;
            if host_addressable(mem.device()) {
                // SAFETY: `at..at+n` lies inside the live registration `mem` (checked by
                // find_local), which keeps the allocation alive during the copy.
                unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), at as usize as *mut u8, n) };
            } else {
                // SAFETY: as above, through the GPU backend.
                unsafe { write_to(mem.device(), at, &buf[..n]) }?;
            }
        }
        done += n as u64;
    }
    Ok(target.is_some())
}

/// Stores `value` at `addr` with release semantics if a live Ethernet registration covers the
/// aligned u64 there.
fn apply_signal(addr: u64, value: u64) -> bool {
    if addr & 7 != 0 {
        return false;
    }
    let Some(mem) = find_local(addr, 8, Transport::Ethernet) else {
        return false;
    };
    if host_addressable(mem.device()) {
        // SAFETY: aligned and inside the live registration `mem`; shared u64 tokens are only
        // accessed atomically.
        let atom = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
        atom.store(value, Ordering::Release);
        true
    } else {
        // SAFETY: inside the live registration `mem`.
        unsafe { write_to(mem.device(), addr, &value.to_le_bytes()) }.is_ok()
    }
}
