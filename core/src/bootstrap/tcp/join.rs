//! A rank's first step of setup: bind its listener for peers, say hello to the root and read
//! the root's reply (the address table, or an abort saying why), retrying a connection the
//! root closed before answering until the one deadline of `initialize`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::wire::*;
use crate::backoff::Backoff;
use crate::bootstrap::netif::{
    choose_interface, iface_bind_addr, list_interfaces, select_interface,
};
use crate::bootstrap::socket::{
    bind_listener, cancelled, connect_retry, read_exact_by, write_all_by, Cancel, Deadline,
    ReadFail, RefusedLimit,
};
use crate::env::SocketFamily;
use crate::error::{Error, Result};
use crate::identity::host_hash;

/// What the root's table says, and this rank's listener for the mesh.
pub(super) struct Table {
    pub(super) session: u64,
    pub(super) addrs: Vec<SocketAddr>,
    pub(super) hashes: Vec<u64>,
    pub(super) listener: TcpListener,
}

/// The rank doing setup (what [`TcpBootstrap`](super::TcpBootstrap) knows before a session).
pub(super) struct Member {
    pub(super) rank: usize,
    pub(super) nranks: usize,
}

const ROOT_WHO: &str = "the bootstrap root (rank 0)";

/// How long a joining rank tolerates a root address that does not behave like a root.
pub(super) struct JoinLimits {
    /// Refused connections (nothing listens) for this long end the retries.
    pub(super) refused: Option<RefusedLimit>,
    /// A listener that accepted the hello but sent no acknowledgement ([`REPLY_ACK`]) within
    /// this is not a bootstrap root. Only for `ip:port`: a `UniqueId`'s listener exists (and
    /// accepts) from the moment the id is made, before rank 0 serves it.
    pub(super) ack_wait: Option<Duration>,
}

impl Member {
    /// Binds this rank's listener for its peers when its interface is known without talking to
    /// the root (`ifname` given, or `MSCCLPP_SOCKET_IFNAME` set), so a bad interface fails
    /// before anything starts. `Ok(None)`: bind on the root connection's local address later.
    pub(super) fn early_listener(
        &self,
        root: SocketAddr,
        ifname: Option<&str>,
    ) -> Result<Option<TcpListener>> {
        let local = match ifname {
            Some(name) => {
                let family = if root.is_ipv4() {
                    SocketFamily::Inet
                } else {
                    SocketFamily::Inet6
                };
                let spec = format!("={name}");
                let all = list_interfaces()?;
                let pick = choose_interface(&all, Some(&spec), Some(family)).map_err(|_| {
                    let names: Vec<String> = all
                        .iter()
                        .filter(|i| i.up)
                        .map(|i| format!("{}={}", i.name, i.addr))
                        .collect();
                    Error::invalid(format!(
                        "the bootstrap address names interface {name:?}, which has no up {} \
                         address: expected one of [{}]",
                        if root.is_ipv4() { "IPv4" } else { "IPv6" },
                        names.join(", ")
                    ))
                })?;
                iface_bind_addr(&pick)
            }
            None if crate::env::env().socket_ifname().is_some() => {
                iface_bind_addr(&select_interface()?)
            }
            None => return Ok(None),
        };
        bind_listener(local).map(Some)
    }

    fn late_listener(&self, root_conn: &TcpStream, root: SocketAddr) -> Result<TcpListener> {
        let mut a = root_conn
            .local_addr()
            .map_err(|e| Error::io(format!("getsockname on the connection to {root}"), e))?;
        a.set_port(0);
        bind_listener(a)
    }

    fn read_fail(&self, what: &str, root: SocketAddr, e: ReadFail, d: &Deadline) -> Error {
        match e {
            ReadFail::Timeout => d.timeout_error(format!(
                "rank {} of {} waiting for {what} from {ROOT_WHO} at {root}",
                self.rank, self.nranks
            )),
            e => Error::remote(0, format!("reading {what} from the root at {root}: {e}")),
        }
    }

    /// Hello to the root, then its reply. `key_source` says where this rank's job key came
    /// from (`ip:port` mode), for the error when the root refuses it; `refused` bounds the
    /// retries of a root address where nothing listens.
    #[allow(clippy::too_many_arguments)] // the hello's fields, listener, deadline, cancel
    pub(super) fn join(
        &self,
        root: SocketAddr,
        nonce: u64,
        key_source: Option<&str>,
        mut listener: Option<TcpListener>,
        deadline: &Deadline,
        cancel: &Cancel,
        limits: &JoinLimits,
    ) -> Result<Table> {
        let mut backoff = Backoff::sleeping(Duration::from_millis(1), Duration::from_millis(50));
        let reply_by = deadline.extended(ROOT_REPLY_GRACE);
        // A connection that closes before the root answered (a stale listener on the port, a
        // root that restarted, a stranger's socket) is retried until the deadline.
        let (stream, reply) = loop {
            let mut stream =
                connect_retry(root, deadline, ROOT_WHO, cancel, limits.refused.as_ref())?;
            let l = match listener.take() {
                Some(l) => l,
                None => self.late_listener(&stream, root)?,
            };
            let listen = l
                .local_addr()
                .map_err(|e| Error::io("getsockname on the peer listener", e))?;
            listener = Some(l);
            let hello = Hello {
                rank: self.rank as u32,
                nranks: self.nranks as u32,
                nonce,
                host_hash: host_hash(),
                listen,
            };
            let retry_why = match write_all_by(&stream, &hello.encode(), deadline) {
                Err(None) => {
                    return Err(
                        deadline.timeout_error(format!("sending hello to {ROOT_WHO} at {root}"))
                    )
                }
                Err(Some(e)) => e.to_string(),
                Ok(()) => match self.read_reply(&mut stream, root, &reply_by, limits.ack_wait) {
                    Ok(reply) => break (stream, reply),
                    Err(Retry::No(e)) => return Err(e),
                    Err(Retry::Yes(why)) => why,
                },
            };
            if cancel.load(std::sync::atomic::Ordering::Acquire) {
                return Err(cancelled());
            }
            if deadline.remaining().is_none() {
                return Err(deadline.timeout_error(format!(
                    "joining {ROOT_WHO} at {root} (last error: {retry_why})"
                )));
            }
            crate::log_info!(
                "BOOTSTRAP",
                "rank {}: root {root} closed the connection ({retry_why}); retrying",
                self.rank
            );
            backoff.snooze_at_most(deadline.remaining());
        };
        drop(stream);
        let Some(listener) = listener else {
            return Err(Error::Internal(
                "peer listener missing after joining the root".into(),
            ));
        };
        match reply {
            Reply::Table { session, entries } => Ok(Table {
                session,
                addrs: entries.iter().map(|e| e.0).collect(),
                hashes: entries.iter().map(|e| e.1).collect(),
                listener,
            }),
            Reply::Abort { code, msg } => Err(match code {
                ABORT_TIMEOUT => deadline.timeout_error(format!("{ROOT_WHO} at {root}: {msg}")),
                ABORT_INVALID => Error::invalid(format!(
                    "{ROOT_WHO} at {root} refused rank {}: {msg}{}",
                    self.rank,
                    key_source.map_or_else(String::new, |s| format!(" (this rank's job key: {s})"))
                )),
                ABORT_ROOT_FAILED => Error::remote(0, msg),
                ABORT_PEER_REFUSED => Error::invalid(format!(
                    "{ROOT_WHO} at {root} stopped the setup of rank {} of {}: {msg}",
                    self.rank, self.nranks
                )),
                c => Error::remote(
                    0,
                    format!("the root at {root} aborted with code {c}: {msg}"),
                ),
            }),
        }
    }

    /// The error for a program at the root address that accepted the hello but never
    /// answered as a root does.
    fn no_answer(&self, root: SocketAddr) -> Error {
        // Only a local address's holder can be looked up here.
        let local = TcpListener::bind(SocketAddr::new(root.ip(), 0)).is_ok();
        let holder = if local {
            crate::bootstrap::socket::port_holder(root.port())
        } else {
            format!("on host {}", root.ip())
        };
        Error::io(
            format!(
                "rank {} joining the bootstrap root at {root}: the program listening there \
                 accepted the connection but sent no bootstrap answer within {ROOT_ACK_WAIT:?}: \
                 expected rank 0's bootstrap root (a root answers at once); another program \
                 ({holder}) may hold the port, or the address is not rank 0's",
                self.rank
            ),
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        )
    }

    /// Reads the root's acknowledgement within `ack_wait` (a refusal may come instead), then
    /// the whole reply: status byte by `reply_by`, the rest shortly after.
    fn read_reply(
        &self,
        stream: &mut TcpStream,
        root: SocketAddr,
        reply_by: &Deadline,
        ack_wait: Option<Duration>,
    ) -> std::result::Result<Reply, Retry> {
        let mut buf = vec![0u8; 1];
        let fail = |e: ReadFail| match e {
            ReadFail::Timeout => {
                Retry::No(self.read_fail("the address table", root, ReadFail::Timeout, reply_by))
            }
            e => Retry::Yes(e.to_string()),
        };
        let ack_by = ack_wait.map_or(*reply_by, |w| reply_by.capped(w));
        match read_exact_by(stream, &mut buf, &ack_by) {
            Ok(()) => {}
            Err(ReadFail::Timeout) if reply_by.remaining().is_some() => {
                return Err(Retry::No(self.no_answer(root)))
            }
            Err(e) => return Err(fail(e)),
        }
        if buf[0] == REPLY_ACK {
            read_exact_by(stream, &mut buf, reply_by).map_err(fail)?;
        }
        let rest_by = reply_by.extended(Duration::from_millis(500));
        let bad = |e: String| Retry::No(Error::remote(0, format!("the root at {root} sent {e}")));
        let total = loop {
            match reply_len(&buf, self.nranks).map_err(bad)? {
                Some(total) => break total,
                None => {
                    let mut b = [0u8; 1];
                    read_exact_by(stream, &mut b, &rest_by)
                        .map_err(|e| Retry::No(self.read_fail("the reply", root, e, &rest_by)))?;
                    buf.push(b[0]);
                }
            }
        };
        let have = buf.len();
        buf.resize(total, 0);
        read_exact_by(stream, &mut buf[have..], &rest_by)
            .map_err(|e| Retry::No(self.read_fail("the reply", root, e, &rest_by)))?;
        decode_reply(&buf, self.nranks).map_err(bad)
    }
}

enum Retry {
    /// The connection closed before the root answered: try again.
    Yes(String),
    No(Error),
}
