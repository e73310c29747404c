//! Accepting setup connections concurrently: one `poll` loop over a listener and every
//! connection that has not yet sent its first message (a hello to the root, a handshake to a
//! rank's listener). Each connection has its own deadline for that message, so silent or slow
//! strangers never hold up a real rank, and the number waiting is capped (the oldest goes
//! first), so a flood cannot exhaust file descriptors.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, MsgFlags};

use super::wire::first_bytes_deadline;
use crate::bootstrap::socket::Deadline;
use crate::error::{Error, Result};

/// Connections waiting for their first message at most; beyond, the oldest is closed.
const MAX_PENDING: usize = 512;
/// How often a wait checks its stop condition.
const TICK: Duration = Duration::from_millis(20);

struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    buf: Vec<u8>,
    until: Instant,
}

/// What [`Acceptor::next`] found.
pub(super) enum Next {
    /// A connection and its first `first_len` bytes (the stream is blocking again).
    Conn(TcpStream, SocketAddr, Vec<u8>),
    /// The overall deadline passed.
    Deadline,
    /// The caller's stop condition became true.
    Stopped,
}

pub(super) struct Acceptor {
    listener: TcpListener,
    label: String,
    first_len: usize,
    pending: VecDeque<Pending>,
}

impl Acceptor {
    /// Serves `listener`; `label` names it in logs (e.g. `bootstrap root 10.0.0.1:29053`).
    pub(super) fn new(listener: TcpListener, first_len: usize, label: String) -> Result<Acceptor> {
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(format!("set non-blocking on {label}"), e))?;
        Ok(Acceptor {
            listener,
            label,
            first_len,
            pending: VecDeque::new(),
        })
    }

    fn evict_oldest(&mut self, why: &str) -> bool {
        match self.pending.pop_front() {
            Some(p) => {
                crate::log_warn!(
                    "BOOTSTRAP",
                    "{}: closed the connection from {} ({why})",
                    self.label,
                    p.from
                );
                true
            }
            None => false,
        }
    }

    /// Accepts everything queued on the listener.
    fn accept_all(&mut self, deadline: &Deadline) {
        loop {
            match self.listener.accept() {
                Ok((stream, from)) => {
                    if let Err(e) = stream.set_nonblocking(true) {
                        crate::log_warn!(
                            "BOOTSTRAP",
                            "{}: connection from {from}: {e}",
                            self.label
                        );
                        continue;
                    }
                    if self.pending.len() >= MAX_PENDING {
                        self.evict_oldest("too many connections waiting for a first message");
                    }
                    let until = first_bytes_deadline(deadline).end();
                    self.pending.push_back(Pending {
                        stream,
                        from,
                        buf: Vec::with_capacity(self.first_len),
                        until,
                    });
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock) => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE/ENFILE and the like: free a descriptor if a stranger holds one,
                    // else wait for the next round.
                    if !self.evict_oldest(&format!("accept failed: {e}")) {
                        crate::log_warn!("BOOTSTRAP", "{}: accept failed: {e}", self.label);
                        std::thread::sleep(TICK);
                    }
                    return;
                }
            }
        }
    }

    /// Reads what pending connection `i` has sent; `Some` once its first message is complete.
    fn read_pending(&mut self, i: usize) -> Option<bool> {
        let p = &mut self.pending[i];
        let mut chunk = [0u8; 256];
        let want = (self.first_len - p.buf.len()).min(chunk.len());
        match recv(
            p.stream.as_raw_fd(),
            &mut chunk[..want],
            MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => {
                crate::log_info!(
                    "BOOTSTRAP",
                    "{}: {} closed after {} of {} bytes; ignored",
                    self.label,
                    p.from,
                    p.buf.len(),
                    self.first_len
                );
                Some(false)
            }
            Ok(n) => {
                p.buf.extend_from_slice(&chunk[..n]);
                (p.buf.len() == self.first_len).then_some(true)
            }
            Err(Errno::EAGAIN) | Err(Errno::EINTR) => None,
            Err(e) => {
                crate::log_info!("BOOTSTRAP", "{}: {}: {e}; ignored", self.label, p.from);
                Some(false)
            }
        }
    }

    /// Waits for the next connection that delivers its first message, until `deadline` or
    /// until `stop()` holds (checked every 20 ms).
    pub(super) fn next(&mut self, deadline: &Deadline, stop: &dyn Fn() -> bool) -> Result<Next> {
        loop {
            if stop() {
                return Ok(Next::Stopped);
            }
            let Some(left) = deadline.remaining() else {
                return Ok(Next::Deadline);
            };
            let now = Instant::now();
            while let Some(i) = self.pending.iter().position(|p| p.until <= now) {
                if let Some(p) = self.pending.remove(i) {
                    crate::log_warn!(
                        "BOOTSTRAP",
                        "{}: {} sent {} of {} bytes in time; closed",
                        self.label,
                        p.from,
                        p.buf.len(),
                        self.first_len
                    );
                }
            }
            let wait = left.min(TICK);
            let (listener_ready, ready): (bool, Vec<usize>) = {
                let mut fds = Vec::with_capacity(self.pending.len() + 1);
                fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
                for p in &self.pending {
                    fds.push(PollFd::new(p.stream.as_fd(), PollFlags::POLLIN));
                }
                let ms = u16::try_from(wait.as_millis().max(1)).unwrap_or(u16::MAX);
                match poll(&mut fds, PollTimeout::from(ms)) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(e) => {
                        return Err(Error::io(
                            format!("poll on {}", self.label),
                            std::io::Error::from(e),
                        ))
                    }
                }
                let hit = |fd: &PollFd| fd.any().unwrap_or(true);
                let ready = fds[1..]
                    .iter()
                    .enumerate()
                    .filter(|(_, fd)| hit(fd))
                    .map(|(i, _)| i)
                    .collect();
                (hit(&fds[0]), ready)
            };
            // Back to front, so removing one keeps the other indices valid.
            for &i in ready.iter().rev() {
                match self.read_pending(i) {
                    None => {}
                    Some(false) => {
                        self.pending.remove(i);
                    }
                    Some(true) => {
                        let Some(p) = self.pending.remove(i) else {
                            continue;
                        };
                        if let Err(e) = p.stream.set_nonblocking(false) {
                            crate::log_warn!("BOOTSTRAP", "{}: {}: {e}", self.label, p.from);
                            continue;
                        }
                        return Ok(Next::Conn(p.stream, p.from, p.buf));
                    }
                }
            }
            if listener_ready {
                self.accept_all(deadline);
            }
        }
    }
}
