//! A rank's side of bootstrap setup: the hello to the root and the table back, then the full
//! mesh (connect to every lower rank, accept every higher one) and the [`Session`] it leaves:
//! the peer connections, the mailbox and its receive threads.

use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::mailbox::{receive_loop, Mailbox};
use super::wire::*;
use crate::backoff::Backoff;
use crate::bootstrap::netif::{
    choose_interface, iface_bind_addr, list_interfaces, select_interface,
};
use crate::bootstrap::socket::{
    bind_listener, cancelled, connect_retry, lock, read_exact_by, write_all_by, Cancel, Deadline,
    ReadFail,
};
use crate::bootstrap::unique_id::{decode_addr, ADDR_BYTES};
use crate::env::SocketFamily;
use crate::error::{Error, Result};
use crate::identity::host_hash;

pub(super) struct PeerConn {
    pub(super) addr: SocketAddr,
    pub(super) writer: Mutex<Writer>,
}

pub(super) struct Writer {
    pub(super) stream: TcpStream,
    /// Set after a failed write: the stream may hold a partial frame, so it is unusable.
    pub(super) broken: Option<String>,
}

/// Everything an initialized `TcpBootstrap` owns; dropping it closes every socket and joins
/// every receive thread.
pub(super) struct Session {
    pub(super) timeout: Duration,
    pub(super) host_hashes: Vec<u64>,
    pub(super) nranks_per_node: usize,
    pub(super) peers: Vec<Option<PeerConn>>,
    pub(super) mailbox: Arc<Mailbox>,
    pub(super) threads: Vec<JoinHandle<()>>,
    pub(super) collective: Mutex<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        lock(&self.mailbox.state).closing = true;
        for p in self.peers.iter().flatten() {
            // Wakes the receive thread (its read returns EOF); errors mean it is already closed.
            let _ = lock(&p.writer).stream.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            // A receive thread never panics; if one did, there is nothing left to clean up.
            let _ = t.join();
        }
    }
}

pub(super) struct Table {
    session: u64,
    addrs: Vec<SocketAddr>,
    hashes: Vec<u64>,
    listener: TcpListener,
}

/// The rank doing setup (what [`TcpBootstrap`](super::TcpBootstrap) knows before a session).
pub(super) struct Member {
    pub(super) rank: usize,
    pub(super) nranks: usize,
}

impl Member {
    /// Binds this rank's listener for its peers: on `ifname`'s address, else on the interface
    /// `MSCCLPP_SOCKET_IFNAME` selects, else on the local address of the root connection.
    fn bind_peer_listener(
        &self,
        root_conn: &TcpStream,
        root: SocketAddr,
        ifname: Option<&str>,
    ) -> Result<TcpListener> {
        let local = match ifname {
            Some(name) => {
                let family = if root.is_ipv4() {
                    SocketFamily::Inet
                } else {
                    SocketFamily::Inet6
                };
                let spec = format!("={name}");
                iface_bind_addr(&choose_interface(
                    &list_interfaces()?,
                    Some(&spec),
                    Some(family),
                )?)
            }
            None if crate::env::env().socket_ifname().is_some() => {
                iface_bind_addr(&select_interface()?)
            }
            None => {
                let mut a = root_conn
                    .local_addr()
                    .map_err(|e| Error::io(format!("getsockname on connection to {root}"), e))?;
                a.set_port(0);
                a
            }
        };
        bind_listener(local, None)
    }

    /// Client side of setup: hello to the root, then the table back.
    pub(super) fn join(
        &self,
        root: SocketAddr,
        nonce: u64,
        ifname: Option<&str>,
        deadline: &Deadline,
        cancel: &Cancel,
    ) -> Result<Table> {
        let root_who = "the bootstrap root (rank 0)";
        let read_fail = |what: &str, e: ReadFail| match e {
            ReadFail::Timeout => deadline.timeout_error(format!(
                "waiting for {what} from {root_who} at {root} (rank {} of {})",
                self.rank, self.nranks
            )),
            e => Error::remote(0, format!("reading {what} from the root at {root}: {e}")),
        };
        let mut listener: Option<(TcpListener, SocketAddr)> = None;
        let mut backoff = Backoff::sleeping(Duration::from_millis(1), Duration::from_millis(50));
        // A connection that closes before the root answered (a stale listener on the port, a
        // root that restarted) is retried until the deadline.
        let (mut stream, status) = loop {
            let mut stream = connect_retry(root, deadline, root_who, cancel)?;
            let listen = match &listener {
                Some((_, a)) => *a,
                None => {
                    let l = self.bind_peer_listener(&stream, root, ifname)?;
                    let a = l
                        .local_addr()
                        .map_err(|e| Error::io("getsockname on the peer listener", e))?;
                    listener = Some((l, a));
                    a
                }
            };
            let hello = Hello {
                rank: self.rank,
                nranks: self.nranks,
                nonce,
                host_hash: host_hash(),
                listen,
            };
            let retry_why = match write_all_by(&mut stream, &hello.encode(), deadline) {
                Err(None) => {
                    return Err(
                        deadline.timeout_error(format!("sending hello to {root_who} at {root}"))
                    )
                }
                Err(Some(e)) => e.to_string(),
                Ok(()) => {
                    // The root answers at the deadline at the latest (with an abort naming the
                    // missing ranks): give its answer a moment to arrive.
                    let mut status = [0u8; 1];
                    match read_exact_by(
                        &mut stream,
                        &mut status,
                        &deadline.extended(ROOT_REPLY_GRACE),
                    ) {
                        Ok(()) => break (stream, status[0]),
                        Err(ReadFail::Timeout) => {
                            return Err(read_fail("the address table", ReadFail::Timeout))
                        }
                        Err(e) => e.to_string(),
                    }
                }
            };
            if cancel.load(std::sync::atomic::Ordering::Acquire) {
                return Err(cancelled());
            }
            if deadline.remaining().is_none() {
                return Err(deadline.timeout_error(format!(
                    "joining {root_who} at {root} (last error: {retry_why})"
                )));
            }
            crate::log_info!(
                "BOOTSTRAP",
                "rank {}: root {root} closed the connection ({retry_why}); retrying",
                self.rank
            );
            backoff.snooze_at_most(deadline.remaining());
        };
        let Some((listener, _)) = listener else {
            return Err(Error::Internal(
                "peer listener missing after joining the root".into(),
            ));
        };
        match status {
            REPLY_OK => {}
            REPLY_ABORT => {
                let late = deadline.extended(Duration::from_secs(1));
                let mut head = [0u8; 5];
                read_exact_by(&mut stream, &mut head, &late)
                    .map_err(|e| read_fail("the abort message", e))?;
                let len = (rd_u32(&head, 1) as usize).min(MAX_ABORT_MSG);
                let mut msg = vec![0u8; len];
                read_exact_by(&mut stream, &mut msg, &late)
                    .map_err(|e| read_fail("the abort message", e))?;
                let msg = String::from_utf8_lossy(&msg);
                return Err(match head[0] {
                    ABORT_TIMEOUT => deadline.timeout_error(format!("{root_who} at {root}: {msg}")),
                    _ => Error::invalid(format!(
                        "{root_who} at {root} rejected rank {}: {msg}",
                        self.rank
                    )),
                });
            }
            s => {
                return Err(Error::remote(
                    0,
                    format!(
                    "the root at {root} replied with status {s}: expected 0 (table) or 1 (abort)"
                ),
                ))
            }
        }
        let late = deadline.extended(Duration::from_secs(1));
        let mut head = [0u8; 12];
        read_exact_by(&mut stream, &mut head, &late)
            .map_err(|e| read_fail("the address table", e))?;
        let session = rd_u64(&head, 0);
        let n = rd_u32(&head, 8) as usize;
        if n != self.nranks {
            return Err(Error::remote(
                0,
                format!(
                    "the root at {root} sent a table of {n} ranks: expected {}",
                    self.nranks
                ),
            ));
        }
        let mut body = vec![0u8; n * (ADDR_BYTES + 8)];
        read_exact_by(&mut stream, &mut body, &late)
            .map_err(|e| read_fail("the address table", e))?;
        let mut addrs = Vec::with_capacity(n);
        let mut hashes = Vec::with_capacity(n);
        for entry in body.chunks_exact(ADDR_BYTES + 8) {
            let a = decode_addr(entry).map_err(|e| {
                Error::remote(
                    0,
                    format!("the root at {root} sent a bad address table: {e}"),
                )
            })?;
            addrs.push(a);
            hashes.push(rd_u64(entry, ADDR_BYTES));
        }
        Ok(Table {
            session,
            addrs,
            hashes,
            listener,
        })
    }

    /// Connects to every lower rank, accepts every higher one, starts the receive threads.
    pub(super) fn connect_mesh(
        &self,
        table: Table,
        deadline: &Deadline,
        timeout: Duration,
    ) -> Result<Session> {
        let Table {
            session,
            addrs,
            hashes,
            listener,
        } = table;
        let me = self.rank;
        let n = self.nranks;
        let mut streams: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();

        let mut hs = Vec::with_capacity(PEER_HELLO_BYTES);
        hs.extend_from_slice(&PEER_MAGIC.to_le_bytes());
        hs.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        hs.extend_from_slice(&session.to_le_bytes());
        hs.extend_from_slice(&(me as u32).to_le_bytes());
        for (peer, slot) in streams.iter_mut().enumerate().take(me) {
            let who = format!("rank {peer}");
            let mut s = connect_retry(addrs[peer], deadline, &who, &Cancel::new(false))?;
            write_all_by(&mut s, &hs, deadline).map_err(|e| match e {
                None => deadline.timeout_error(format!(
                    "sending handshake to rank {peer} at {}",
                    addrs[peer]
                )),
                Some(e) => Error::remote(
                    peer,
                    format!("sending handshake to {} failed: {e}", addrs[peer]),
                ),
            })?;
            *slot = Some(s);
        }

        let listen_addr = listener
            .local_addr()
            .map_err(|e| Error::io("getsockname on the peer listener", e))?;
        listener.set_nonblocking(true).map_err(|e| {
            Error::io(
                format!("set non-blocking on peer listener {listen_addr}"),
                e,
            )
        })?;
        let mut missing = n - 1 - me;
        let mut backoff = Backoff::sleeping(Duration::from_millis(1), Duration::from_millis(20));
        while missing > 0 {
            match listener.accept() {
                Ok((mut s, from)) => {
                    backoff.reset();
                    if s.set_nonblocking(false).is_err() {
                        continue;
                    }
                    let mut buf = [0u8; PEER_HELLO_BYTES];
                    if let Err(e) = read_exact_by(&mut s, &mut buf, &first_bytes_deadline(deadline))
                    {
                        crate::log_warn!(
                            "BOOTSTRAP",
                            "rank {me}: connection from {from} sent no handshake ({e}); ignored"
                        );
                        continue;
                    }
                    let peer = rd_u32(&buf, 14) as usize;
                    let ok = rd_u32(&buf, 0) == PEER_MAGIC
                        && rd_u16(&buf, 4) == WIRE_VERSION
                        && rd_u64(&buf, 6) == session
                        && peer > me
                        && peer < n
                        && streams[peer].is_none();
                    if !ok {
                        crate::log_warn!(
                            "BOOTSTRAP",
                            "rank {me}: unexpected handshake from {from} (claims rank {peer}; expected a higher rank of session {session:#x}); ignored"
                        );
                        continue;
                    }
                    if let Err(e) = s.set_nodelay(true) {
                        return Err(Error::io(
                            format!("set TCP_NODELAY on connection from rank {peer}"),
                            e,
                        ));
                    }
                    streams[peer] = Some(s);
                    missing -= 1;
                }
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted =>
                {
                    if deadline.remaining().is_none() {
                        let who: Vec<String> = (me + 1..n)
                            .filter(|&r| streams[r].is_none())
                            .map(|r| format!("rank {r} ({})", addrs[r]))
                            .collect();
                        return Err(deadline.timeout_error(format!(
                            "rank {me} waiting for {} to connect to its listener at {listen_addr}",
                            who.join(", ")
                        )));
                    }
                    backoff.snooze_at_most(deadline.remaining());
                }
                Err(e) => {
                    return Err(Error::io(
                        format!("accept on peer listener {listen_addr}"),
                        e,
                    ))
                }
            }
        }
        // All peers are in: no listening socket stays open.
        drop(listener);

        let mailbox = Arc::new(Mailbox::default());
        let mut peers = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n.saturating_sub(1));
        let mut session_obj = Session {
            timeout,
            nranks_per_node: hashes.iter().filter(|&&h| h == hashes[me]).count(),
            host_hashes: hashes,
            peers: Vec::new(),
            mailbox: mailbox.clone(),
            threads: Vec::new(),
            collective: Mutex::new(()),
        };
        for (peer, s) in streams.into_iter().enumerate() {
            let Some(s) = s else {
                peers.push(None);
                continue;
            };
            let addr = addrs[peer];
            let reader = s
                .try_clone()
                .map_err(|e| Error::io(format!("dup the socket to rank {peer}"), e))?;
            // Clear the setup read timeout: the receive thread blocks until data or shutdown.
            reader.set_read_timeout(None).map_err(|e| {
                Error::io(format!("clear read timeout on socket to rank {peer}"), e)
            })?;
            peers.push(Some(PeerConn {
                addr,
                writer: Mutex::new(Writer {
                    stream: s,
                    broken: None,
                }),
            }));
            let mb = mailbox.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("mscclpp-bootstrap-recv-{peer}"))
                .spawn(move || receive_loop(reader, peer, addr, mb));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    session_obj.peers = peers;
                    session_obj.threads = threads;
                    return Err(Error::io(
                        format!("spawn the receive thread for rank {peer}"),
                        e,
                    ));
                }
            }
        }
        session_obj.peers = peers;
        session_obj.threads = threads;
        Ok(session_obj)
    }
}
