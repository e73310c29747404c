//! TCP helpers with deadlines: bind (a port in use is an error at once, naming its holder),
//! connect with retries until a deadline, and reads/writes that give up at the deadline.

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

/// Binds a listener on `addr`. A port another socket listens on is an error at once (no
/// retries: waiting would not free it), naming the port and, where `/proc` tells, the process
/// that holds it. std sets `SO_REUSEADDR`, so a port in TIME_WAIT binds at once.
pub(crate) fn bind_listener(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| {
        if e.kind() == ErrorKind::AddrInUse {
            Error::io(
                format!(
                    "bind {addr}: port {} is already in use ({}): expected a free port; pick \
                     another one (the bootstrap's ip:port, e.g. mp_unit_tests --ip_port) or stop \
                     the program listening there",
                    addr.port(),
                    port_holder(addr.port())
                ),
                e,
            )
        } else {
            Error::io(format!("bind {addr}"), e)
        }
    })
}

/// Who listens on TCP `port`, as far as `/proc` tells this user: `pid 123 (name)`, or the
/// owning uid when the process is not visible.
pub(crate) fn port_holder(port: u16) -> String {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .find_map(|t| listening_inode(&t, port));
    let Some((inode, uid)) = inode else {
        return "its holder is not visible in /proc/net/tcp".to_string();
    };
    let want = format!("socket:[{inode}]");
    let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    for pid in pids.filter_map(|d| d.file_name().to_str()?.parse::<u32>().ok()) {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let holds = fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()));
        if holds {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            return format!("listening: pid {pid} ({})", comm.trim());
        }
    }
    format!("listening: a process of uid {uid} this user cannot see")
}

/// The (inode, uid) of the socket listening on `port` in a `/proc/net/tcp` table.
fn listening_inode(table: &str, port: u16) -> Option<(u64, u32)> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let local_port = f.get(1)?.rsplit(':').next()?;
        let listening = *f.get(3)? == "0A";
        (listening && u16::from_str_radix(local_port, 16).ok()? == port)
            .then(|| Some((f.get(9)?.parse().ok()?, f.get(7)?.parse().ok()?)))
            .flatten()
    })
}

/// Set when the local bootstrap root has failed: the local rank stops retrying at once.
pub(crate) type Cancel = std::sync::atomic::AtomicBool;

/// The error for a join abandoned because the local root failed (the caller reports the
/// root's own error instead).
pub(crate) fn cancelled() -> Error {
    Error::Aborted("the local bootstrap root failed".into())
}

/// How long [`connect_retry`] retries refused connections (nothing listens at the address)
/// before it gives up, and what its error then says about why.
pub(crate) struct RefusedLimit {
    /// Refusals in a row for this long end the retries.
    pub(crate) limit: Duration,
    /// The likely causes, for the error (`the UniqueId may be stale`).
    pub(crate) hint: String,
}

/// Connects to `who` at `addr`, retrying refused/unreachable attempts until `deadline` (or
/// until `cancel` is set, or, with `refused`, until connections were refused for its limit
/// in a row).
pub(crate) fn connect_retry(
    addr: SocketAddr,
    deadline: &Deadline,
    who: &str,
    cancel: &Cancel,
    refused: Option<&RefusedLimit>,
) -> Result<TcpStream> {
    let mut backoff = Backoff::sleeping(Duration::from_millis(1), Duration::from_millis(50));
    let mut last_err: Option<std::io::Error> = None;
    let mut refused_since: Option<Instant> = None;
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
                if e.kind() != ErrorKind::ConnectionRefused {
                    refused_since = None;
                } else if let Some(r) = refused {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= r.limit {
                        return Err(Error::io(
                            format!(
                                "connecting to {who} at {addr}: every connection was refused \
                                 for {:?} (nothing listens at {addr}): {}",
                                r.limit, r.hint
                            ),
                            e,
                        ));
                    }
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
