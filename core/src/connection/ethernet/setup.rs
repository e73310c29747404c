//! Pairing the two sockets of an Ethernet connection, bounded by the caller's timeout.
//!
//! 1. Connect to the peer's listener (retrying while it is unreachable; a refusal is final
//!    after a few quick retries, since the listener exists as long as the peer's endpoint
//!    does: a refusal means the peer exited or dropped it) and send the hello.
//! 2. Accept the peer's socket on our listener: every accepted client is read without
//!    blocking until it said a full hello, so a silent or wrong client never delays the peer;
//!    meanwhile our outbound socket is watched, so a peer that dies now is reported at once.
//! 3. Confirm: send our confirmation on the outbound socket and wait for the peer's on the
//!    inbound one. A side returns `Ok` only after the peer confirmed, so both sides agree: a
//!    peer that gave up (its timeout expired, or it failed) closes its sockets and this side
//!    fails too instead of ending half-connected. (The one window left is a peer whose
//!    deadline passes between sending its confirmation and reading ours; its sockets then
//!    close and this side's connection breaks on first use, naming the peer.)

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::wire::{self, CONFIRM_LEN, HELLO_LEN};
use crate::backoff::Backoff;
use crate::error::{Error, Result};

/// Refusals tolerated (10 ms apart) before the peer's listener counts as gone.
const REFUSALS: u32 = 3;

pub(super) fn io_err(op: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { op, source }
}

/// The timeout error of the handshake, naming the peer and the step.
fn timed_out(peer: &str, step: &str, timeout: Duration) -> Error {
    Error::timeout(format!("Ethernet connect to {peer}: {step}"), timeout)
}

/// The error for a peer that went away during the handshake.
fn gone(peer: &str, step: &str, detail: impl std::fmt::Display) -> Error {
    Error::io(
        format!("Ethernet connect to {peer}: {step}"),
        std::io::Error::new(ErrorKind::ConnectionAborted, detail.to_string()),
    )
}

/// Step 1: the outbound socket, hello sent.
pub(super) fn connect_out(
    addr: SocketAddr,
    hello: &[u8; HELLO_LEN],
    deadline: Instant,
    timeout: Duration,
    peer: &str,
) -> Result<TcpStream> {
    let mut backoff = Backoff::sleeping(Duration::from_millis(1), Duration::from_millis(100));
    let mut refused = 0;
    let out = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(10))) {
            Ok(s) => break s,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused && refused + 1 >= REFUSALS => {
                return Err(gone(
                    peer,
                    "connecting",
                    format!(
                        "refused ({e}): the peer's endpoint no longer listens (the peer exited \
                         or dropped the endpoint)"
                    ),
                ))
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(timed_out(
                    peer,
                    &format!("connecting (last error: {e})"),
                    timeout,
                ))
            }
            Err(e) => {
                if e.kind() == ErrorKind::ConnectionRefused {
                    refused += 1;
                    std::thread::sleep(Duration::from_millis(10));
                } else {
                    backoff.snooze();
                }
            }
        }
    };
    out.set_nodelay(true)
        .map_err(io_err("set_nodelay".into()))?;
    (&out)
        .write_all(hello)
        .map_err(|e| gone(peer, "sending the hello", e))?;
    Ok(out)
}

/// Whether the peer closed or reset `out` (checked without blocking).
fn closed(out: &TcpStream) -> Option<String> {
    if out.set_nonblocking(true).is_err() {
        return None;
    }
    let mut b = [0u8; 1];
    let r = match out.peek(&mut b) {
        Ok(0) => Some("the peer closed the connection".to_string()),
        Err(e) if e.kind() != ErrorKind::WouldBlock => Some(e.to_string()),
        _ => None,
    };
    let _ = out.set_nonblocking(false);
    r
}

/// Step 2: the peer's socket, the one whose hello names `local_id` as target and `remote_id`
/// as source.
pub(super) fn accept_peer(
    listener: &TcpListener,
    out: &TcpStream,
    (local_id, remote_id): (u64, u64),
    deadline: Instant,
    timeout: Duration,
    peer: &str,
) -> Result<TcpStream> {
    listener
        .set_nonblocking(true)
        .map_err(io_err("listener set_nonblocking".into()))?;
    let mut pending: Vec<(TcpStream, Vec<u8>)> = Vec::new();
    let mut backoff = Backoff::sleeping(Duration::from_micros(100), Duration::from_millis(20));
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(true)
                    .map_err(io_err("accepted socket set_nonblocking".into()))?;
                pending.push((s, Vec::with_capacity(HELLO_LEN)));
                backoff.reset();
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => {
                return Err(Error::io(
                    format!("accept on Ethernet endpoint for {peer}"),
                    e,
                ))
            }
        }
        let mut i = 0;
        while i < pending.len() {
            let (s, got) = &mut pending[i];
            let mut b = [0u8; HELLO_LEN];
            let keep = match s.read(&mut b[..HELLO_LEN - got.len()]) {
                Ok(0) => false,
                Ok(n) => {
                    got.extend_from_slice(&b[..n]);
                    got.len() < HELLO_LEN
                        || wire::decode_hello(got).is_ok_and(|ids| ids == (local_id, remote_id))
                }
                Err(e) => e.kind() == ErrorKind::WouldBlock,
            };
            if keep && got.len() == HELLO_LEN {
                let (s, _) = pending.swap_remove(i);
                s.set_nonblocking(false)
                    .map_err(io_err("accepted socket set_nonblocking".into()))?;
                s.set_nodelay(true).map_err(io_err("set_nodelay".into()))?;
                return Ok(s);
            }
            if keep {
                i += 1;
            } else {
                // A stray client or a wrong hello: turned away.
                pending.swap_remove(i);
            }
        }
        if let Some(why) = closed(out) {
            return Err(gone(peer, "waiting for the peer to connect back", why));
        }
        if Instant::now() >= deadline {
            return Err(timed_out(
                peer,
                "waiting for the peer to connect back",
                timeout,
            ));
        }
        backoff.snooze();
    }
}

/// Step 3: confirmations both ways.
pub(super) fn confirm(
    out: &TcpStream,
    inbound: &TcpStream,
    (local_id, remote_id): (u64, u64),
    deadline: Instant,
    timeout: Duration,
    peer: &str,
) -> Result<()> {
    (&*out)
        .write_all(&wire::confirm(local_id))
        .map_err(|e| gone(peer, "sending the confirmation", e))?;
    let left = deadline.saturating_duration_since(Instant::now());
    inbound
        .set_read_timeout(Some(left.max(Duration::from_millis(50))))
        .map_err(io_err("set_read_timeout".into()))?;
    let mut b = [0u8; CONFIRM_LEN];
    let r = (&*inbound).read_exact(&mut b);
    inbound
        .set_read_timeout(None)
        .map_err(io_err("set_read_timeout".into()))?;
    match r {
        Ok(()) => {}
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            return Err(timed_out(
                peer,
                "waiting for the peer's confirmation",
                timeout,
            ))
        }
        Err(e) => {
            return Err(gone(
                peer,
                "waiting for the peer's confirmation",
                format!("{e} (the peer gave up: its side timed out or failed)"),
            ))
        }
    }
    let id = wire::decode_confirm(&b)?;
    if id != remote_id {
        return Err(Error::invalid(format!(
            "Ethernet connect to {peer}: expected the confirmation of endpoint {remote_id:#x}, \
             got {id:#x}"
        )));
    }
    Ok(())
}
