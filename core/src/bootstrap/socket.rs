//! TCP helpers with deadlines: bind with EADDRINUSE retries, connect with retries until a
//! deadline, and reads/writes that give up at the deadline.

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A point in time by which an operation must finish, and the timeout it came from (for
/// error messages).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    end: Instant,
    pub(crate) timeout: Duration,
}

impl Deadline {
    pub(crate) fn after(timeout: Duration) -> Deadline {
        let now = Instant::now();
        // A timeout too large to add (Duration::MAX) means "about forever".
        let end = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        Deadline { end, timeout }
    }

    /// The same deadline moved `grace` later (error messages still name the original timeout).
    pub(crate) fn extended(&self, grace: Duration) -> Deadline {
        Deadline {
            end: self.end + grace,
            timeout: self.timeout,
        }
    }

    /// The earlier of this deadline and `cap` from now.
    pub(crate) fn capped(&self, cap: Duration) -> Deadline {
        let now = Instant::now();
        Deadline {
            end: self.end.min(now.checked_add(cap).unwrap_or(self.end)),
            timeout: self.timeout,
        }
    }

    /// The instant it ends.
    pub(crate) fn end(&self) -> Instant {
        self.end
    }

    /// Time left, or `None` once the deadline has passed.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        let left = self.end.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    pub(crate) fn timeout_error(&self, what: impl Into<String>) -> Error {
        Error::timeout(what, self.timeout)
    }
}

const BIND_ATTEMPTS: u32 = 10;

/// Binds a listener on `addr`, retrying up to 10 times (about 2.5 s in all) while the address
/// is in use, and never past `deadline` when one is given. std sets `SO_REUSEADDR`, so a port
/// in TIME_WAIT binds at once.
pub(crate) fn bind_listener(addr: SocketAddr, deadline: Option<&Deadline>) -> Result<TcpListener> {
    let mut backoff = Backoff::sleeping(Duration::from_millis(1), Duration::from_millis(500));
    let mut attempt = 1;
    loop {
        match TcpListener::bind(addr) {
            Ok(l) => return Ok(l),
            Err(e)
                if e.kind() == ErrorKind::AddrInUse
                    && attempt < BIND_ATTEMPTS
                    && deadline.is_none_or(|d| d.remaining().is_some()) =>
            {
                crate::log_info!(
                    "BOOTSTRAP",
                    "bind {addr}: address in use, retry {attempt}/{BIND_ATTEMPTS}"
                );
                attempt += 1;
                backoff.snooze_at_most(deadline.and_then(Deadline::remaining));
            }
            Err(e) if e.kind() == ErrorKind::AddrInUse => {
                return Err(Error::io(
                    format!("bind {addr} (still in use after {attempt} attempts; is another bootstrap root or program listening there?)"),
                    e,
                ));
            }
            Err(e) => return Err(Error::io(format!("bind {addr}"), e)),
        }
    }
}

/// Set when the local bootstrap root has failed: the local rank stops retrying at once.
pub(crate) type Cancel = std::sync::atomic::AtomicBool;

/// The error for a join abandoned because the local root failed (the caller reports the
/// root's own error instead).
pub(crate) fn cancelled() -> Error {
    Error::Aborted("the local bootstrap root failed".into())
}

/// Connects to `who` at `addr`, retrying refused/unreachable attempts until `deadline` (or
/// until `cancel` is set).
pub(crate) fn connect_retry(
    addr: SocketAddr,
    deadline: &Deadline,
    who: &str,
    cancel: &Cancel,
) -> Result<TcpStream> {
    let mut backoff = Backoff::sleeping(Duration::from_millis(1), Duration::from_millis(50));
    let mut last_err: Option<std::io::Error> = None;
    while let Some(left) = deadline.remaining() {
        if cancel.load(std::sync::atomic::Ordering::Acquire) {
            return Err(cancelled());
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(s) => {
                s.set_nodelay(true).map_err(|e| {
                    Error::io(format!("set TCP_NODELAY on connection to {addr}"), e)
                })?;
                return Ok(s);
            }
            Err(e) => {
                let retry = matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused
                        | ErrorKind::TimedOut
                        | ErrorKind::WouldBlock
                        | ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::Interrupted
                        | ErrorKind::HostUnreachable
                        | ErrorKind::NetworkUnreachable
                );
                if !retry {
                    return Err(Error::io(format!("connect to {who} at {addr}"), e));
                }
                last_err = Some(e);
                backoff.snooze_at_most(deadline.remaining());
            }
        }
    }
    Err(deadline.timeout_error(format!(
        "connecting to {who} at {addr} (last error: {})",
        last_err.map_or_else(|| "none".to_string(), |e| e.to_string())
    )))
}

/// Why a deadline-bounded read failed.
#[derive(Debug)]
pub(crate) enum ReadFail {
    /// The deadline passed.
    Timeout,
    /// The peer closed the connection.
    Eof,
    /// Any other OS error.
    Io(std::io::Error),
}

impl std::fmt::Display for ReadFail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadFail::Timeout => write!(f, "timed out"),
            ReadFail::Eof => write!(f, "connection closed (EOF)"),
            ReadFail::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Fills `buf` from `s`, giving up at `deadline`.
pub(crate) fn read_exact_by(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: &Deadline,
) -> std::result::Result<(), ReadFail> {
    let mut done = 0;
    while done < buf.len() {
        let left = deadline.remaining().ok_or(ReadFail::Timeout)?;
        s.set_read_timeout(Some(left)).map_err(ReadFail::Io)?;
        match s.read(&mut buf[done..]) {
            Ok(0) => return Err(ReadFail::Eof),
            Ok(n) => done += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Err(ReadFail::Eof),
            Err(e) => return Err(ReadFail::Io(e)),
        }
    }
    Ok(())
}

/// Writes all of `buf` to `s`, giving up at `deadline` (`Err(None)` = timed out). Writes go in
/// pieces of at most 1 MiB, each bounded by the time left, so a slow reader cannot stretch one
/// call past the deadline. After an error the stream may hold part of `buf`.
pub(crate) fn write_all_by(
    s: &TcpStream,
    buf: &[u8],
    deadline: &Deadline,
) -> std::result::Result<(), Option<std::io::Error>> {
    const PIECE: usize = 1 << 20;
    let mut w = s;
    let mut done = 0;
    while done < buf.len() {
        let left = deadline.remaining().ok_or(None)?;
        w.set_write_timeout(Some(left)).map_err(Some)?;
        let end = (done + PIECE).min(buf.len());
        match w.write(&buf[done..end]) {
            Ok(0) => return Err(Some(std::io::Error::from(ErrorKind::WriteZero))),
            Ok(n) => done += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(Some(e)),
        }
    }
    Ok(())
}

/// Locks `m`, also when poisoned.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked while holding it; the data here
    // (queues, a stream) stays consistent, so keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A random u64 from std's per-process random hasher keys, the clock and a counter.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}
