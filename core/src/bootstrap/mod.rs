//! Bootstrap: how ranks find each other and exchange small control messages before any
//! GPU connection exists.
//!
//! [`Bootstrap`] is the contract: rank, size, ranks per node, tagged point-to-point bytes and
//! a few collectives. Everything above it (communicator, endpoints, memory exchange) uses only
//! this trait, so a third-party bootstrapper (MPI, a torch store) plugs in by implementing
//! `rank`, `nranks`, `nranks_per_node`, `send` and `recv`; the collectives have default
//! implementations on top of those.
//!
//! [`TcpBootstrap`] is the built-in implementation: rank 0 runs a root that collects every
//! rank's listen address and host hash and hands out the table; ranks then connect in a full
//! mesh and one receive thread per rank (an event loop over every peer socket) demultiplexes
//! `(kind, tag, len, payload)` frames by `(peer, kind, tag)`. Every blocking operation honours
//! the timeout given to `initialize`; a peer that never comes or dies gives an error naming it
//! instead of a hang.

mod netif;
pub(crate) mod socket;
mod tcp;
mod unique_id;

pub use netif::{select_interface, Interface};
pub use tcp::{InitAddr, TcpBootstrap, MAX_MESSAGE_BYTES};
pub use unique_id::{UniqueId, UNIQUE_ID_BYTES};

/// Re-exported from [`crate::identity`] (where it lives) for existing callers.
pub use crate::identity::host_hash;

use crate::error::{Error, Result};

/// Tags at or above this value are reserved for the default collective implementations of
/// [`Bootstrap`]; user code must send with smaller tags.
pub const RESERVED_TAG_BASE: u64 = 0xFFFF_FFFF_0000_0000;

const TAG_ALL_GATHER: u64 = RESERVED_TAG_BASE + 1;
const TAG_BROADCAST: u64 = RESERVED_TAG_BASE + 2;
const TAG_GROUP_BARRIER: u64 = RESERVED_TAG_BASE + 3;

/// How ranks exchange control messages. Implementations must be usable from several threads;
/// for one `(peer, tag)` messages arrive in the order they were sent, and receives for
/// different peers or tags may be issued in any order.
///
/// Collectives must be called by every participating rank in the same order.
pub trait Bootstrap: Send + Sync {
    /// This process's rank, `0..nranks()`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn nranks(&self) -> usize;
    /// The number of ranks on this rank's host (same host hash).
    fn nranks_per_node(&self) -> usize;
    /// Sends `data` to `peer` under `tag`. May return before the peer received it.
    fn send(&self, data: &[u8], peer: usize, tag: u64) -> Result<()>;
    /// Receives the next message `peer` sent under `tag`.
    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>>;
    /// The next message `peer` sent under `tag` if one has arrived; never waits (default:
    /// `Ok(None)`, a bootstrap that cannot tell). Used for out-of-band notices (a point-to-point
    /// peer reporting a size mismatch) that a waiting rank polls.
    fn try_recv(&self, _peer: usize, _tag: u64) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
    /// The bound this bootstrap puts on blocking operations, if it has one; the communicator
    /// waits as long for peers' connections (default: none known).
    fn operation_timeout(&self) -> Option<std::time::Duration> {
        None
    }
    /// Why `peer` failed (it died or lost its connection without closing its bootstrap on
    /// purpose), if this bootstrap knows; never blocks (default: it never knows).
    fn peer_failure(&self, _peer: usize) -> Option<String> {
        None
    }
    /// The lowest rank that failed (see [`Bootstrap::peer_failure`]) and why; never blocks.
    fn first_peer_failure(&self) -> Option<(usize, String)> {
        None
    }

    /// Every rank's `data`, indexed by rank (this rank's own data included).
    fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let (rank, n) = (self.rank(), self.nranks());
        for peer in (0..n).filter(|&p| p != rank) {
            self.send(data, peer, TAG_ALL_GATHER)?;
        }
        let mut out = Vec::with_capacity(n);
        for peer in 0..n {
            if peer == rank {
                out.push(data.to_vec());
            } else {
                out.push(self.recv(peer, TAG_ALL_GATHER)?);
            }
        }
        Ok(out)
    }

    /// Returns once every rank has entered the barrier.
    fn barrier(&self) -> Result<()> {
        self.all_gather(&[]).map(|_| ())
    }

    /// `root`'s `data` on every rank (`data` is ignored on the others).
    fn broadcast(&self, data: &[u8], root: usize) -> Result<Vec<u8>> {
        let (rank, n) = (self.rank(), self.nranks());
        if root >= n {
            return Err(Error::invalid(format!(
                "broadcast root {root}: expected a rank below nranks {n}"
            )));
        }
        if rank == root {
            for peer in (0..n).filter(|&p| p != rank) {
                self.send(data, peer, TAG_BROADCAST)?;
            }
            Ok(data.to_vec())
        } else {
            self.recv(root, TAG_BROADCAST)
        }
    }

    /// A barrier among `ranks` only; every listed rank must call it with the same list, which
    /// must contain the caller.
    fn group_barrier(&self, ranks: &[usize]) -> Result<()> {
        let me = self.rank();
        check_group(ranks, me, self.nranks())?;
        for &peer in ranks.iter().filter(|&&p| p != me) {
            self.send(&[], peer, TAG_GROUP_BARRIER)?;
        }
        for &peer in ranks.iter().filter(|&&p| p != me) {
            self.recv(peer, TAG_GROUP_BARRIER)?;
        }
        Ok(())
    }
}

pub(crate) fn check_group(ranks: &[usize], me: usize, n: usize) -> Result<()> {
    if let Some(bad) = ranks.iter().find(|&&r| r >= n) {
        return Err(Error::invalid(format!(
            "group_barrier: rank {bad} in {ranks:?}: expected ranks below nranks {n}"
        )));
    }
    if !ranks.contains(&me) {
        return Err(Error::invalid(format!(
            "group_barrier: {ranks:?} does not contain the calling rank {me}"
        )));
    }
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::invalid(format!(
            "group_barrier: {ranks:?}: expected each rank at most once"
        )));
    }
    Ok(())
}
