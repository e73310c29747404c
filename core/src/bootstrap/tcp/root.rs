//! The bootstrap root: rank 0's setup server, which collects every rank's hello and answers
//! with the table of listen addresses and host hashes (or an abort naming what went wrong).

use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use super::wire::*;
use crate::backoff::Backoff;
use crate::bootstrap::socket::{random_u64, read_exact_by, write_all_by, Deadline};
use crate::bootstrap::unique_id::{encode_addr, ADDR_BYTES};
use crate::error::{Error, Result};

struct RootClient {
    stream: TcpStream,
    hello: Hello,
}

fn root_abort_all(clients: &mut [Option<RootClient>], code: u8, msg: &str, deadline: &Deadline) {
    let bytes = encode_abort(code, msg);
    // Give the aborts a moment even when the deadline has just passed.
    let grace = Deadline::after(Duration::from_millis(500));
    let d = if deadline.remaining().is_some() {
        deadline
    } else {
        &grace
    };
    for c in clients.iter_mut().flatten() {
        // Best effort: a rank that cannot be told times out on its own deadline.
        let _ = write_all_by(&mut c.stream, &bytes, d);
    }
}

/// Collects `nranks` hellos on `listener`, then answers everyone with the table.
pub(super) fn run_root(
    listener: TcpListener,
    nranks: usize,
    nonce: u64,
    deadline: Deadline,
) -> Result<()> {
    let root_addr = listener
        .local_addr()
        .map_err(|e| Error::io("getsockname on the bootstrap root listener", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io(format!("set non-blocking on root listener {root_addr}"), e))?;
    let mut clients: Vec<Option<RootClient>> = (0..nranks).map(|_| None).collect();
    let mut joined = 0;
    let mut backoff = Backoff::sleeping(Duration::from_millis(1), Duration::from_millis(20));
    while joined < nranks {
        let (mut stream, from) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if deadline.remaining().is_none() {
                    let missing: Vec<usize> =
                        (0..nranks).filter(|&r| clients[r].is_none()).collect();
                    let msg = format!(
                        "ranks {missing:?} of {nranks} did not connect to the bootstrap root at \
                         {root_addr} within {:?}",
                        deadline.timeout
                    );
                    root_abort_all(&mut clients, ABORT_TIMEOUT, &msg, &deadline);
                    return Err(deadline.timeout_error(format!("bootstrap root (rank 0): {msg}")));
                }
                backoff.snooze_at_most(deadline.remaining());
                continue;
            }
            Err(e) => {
                crate::log_warn!(
                    "BOOTSTRAP",
                    "root {root_addr}: accept failed: {e}; continuing"
                );
                backoff.snooze_at_most(deadline.remaining());
                continue;
            }
        };
        backoff.reset();
        if let Err(e) = stream.set_nonblocking(false) {
            crate::log_warn!("BOOTSTRAP", "root {root_addr}: connection from {from}: {e}");
            continue;
        }
        let mut buf = [0u8; HELLO_BYTES];
        if let Err(e) = read_exact_by(&mut stream, &mut buf, &first_bytes_deadline(&deadline)) {
            crate::log_warn!(
                "BOOTSTRAP",
                "root {root_addr}: connection from {from} sent no hello ({e}); ignored"
            );
            continue;
        }
        let hello = match Hello::decode(&buf) {
            Ok(h) => h,
            Err(e) => {
                crate::log_warn!("BOOTSTRAP", "root {root_addr}: from {from}: {e}; ignored");
                continue;
            }
        };
        if hello.nonce != nonce {
            let msg = format!(
                "rank {} at {from} joined with group nonce {:#x}, but this root serves {nonce:#x}: \
                 expected every rank to use the same UniqueId / address",
                hello.rank, hello.nonce
            );
            crate::log_warn!("BOOTSTRAP", "root {root_addr}: {msg}; ignored");
            let _ = write_all_by(&mut stream, &encode_abort(ABORT_INVALID, &msg), &deadline);
            continue;
        }
        let problem = if hello.nranks != nranks {
            Some(format!(
                "rank {} at {from} says nranks = {}, but rank 0 says {nranks}: expected every rank \
                 to pass the same nranks",
                hello.rank, hello.nranks
            ))
        } else if hello.rank >= nranks {
            Some(format!(
                "a rank at {from} says it is rank {}: expected a rank below nranks {nranks}",
                hello.rank
            ))
        } else if clients[hello.rank].is_some() {
            Some(format!(
                "rank {} joined twice (again from {from}): expected each rank exactly once",
                hello.rank
            ))
        } else {
            None
        };
        if let Some(msg) = problem {
            let _ = write_all_by(&mut stream, &encode_abort(ABORT_INVALID, &msg), &deadline);
            root_abort_all(&mut clients, ABORT_INVALID, &msg, &deadline);
            return Err(Error::invalid(format!("bootstrap root (rank 0): {msg}")));
        }
        let r = hello.rank;
        clients[r] = Some(RootClient { stream, hello });
        joined += 1;
    }
    // Everyone is in: stop listening before anyone can start a new round on this port.
    drop(listener);

    let session = random_u64();
    let mut reply = Vec::with_capacity(13 + nranks * (ADDR_BYTES + 8));
    reply.push(REPLY_OK);
    reply.extend_from_slice(&session.to_le_bytes());
    reply.extend_from_slice(&(nranks as u32).to_le_bytes());
    for c in clients.iter().flatten() {
        encode_addr(&c.hello.listen, &mut reply);
        reply.extend_from_slice(&c.hello.host_hash.to_le_bytes());
    }
    for (r, c) in clients.iter_mut().enumerate() {
        if let Some(c) = c {
            if let Err(e) = write_all_by(&mut c.stream, &reply, &deadline) {
                crate::log_warn!(
                    "BOOTSTRAP",
                    "root {root_addr}: sending the address table to rank {r} failed: {e:?}"
                );
            }
        }
    }
    Ok(())
}
