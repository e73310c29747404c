//! The peers of a communicator as its bootstrap sees them: whether one died (closed its
//! bootstrap connection without saying goodbye) or left on purpose, and the goodbye itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mscclpp::{Bootstrap, TcpBootstrap};

use crate::error::{NResult, NcclError};

/// Bootstrap tag of the "this rank leaves on purpose" message (below the communicator's
/// tags, so it never meets them).
pub const TAG_BYE: u64 = 0x4e43_434c_0000_0001;

/// Liveness of the peers over one bootstrap.
pub struct Peers {
    bootstrap: Arc<TcpBootstrap>,
    /// Peers that said goodbye (left on purpose): their closed connection is not an error.
    departed: Mutex<Vec<bool>>,
}

impl Peers {
    /// Every peer of `bootstrap`, none departed yet.
    pub fn new(bootstrap: Arc<TcpBootstrap>) -> Peers {
        let n = bootstrap.nranks();
        Peers {
            bootstrap,
            departed: Mutex::new(vec![false; n]),
        }
    }

    /// `Err(ncclRemoteError)` naming `peer` if it closed its bootstrap connection without
    /// saying goodbye (it died or aborted). Never blocks.
    pub fn check_peer(&self, peer: usize) -> NResult<()> {
        if peer == self.bootstrap.rank() {
            return Ok(());
        }
        let mut departed = self.departed.lock().unwrap_or_else(|p| p.into_inner());
        if departed.get(peer).copied().unwrap_or(true) {
            return Ok(());
        }
        match self.bootstrap.recv_timeout(peer, TAG_BYE, Duration::ZERO) {
            Ok(_) => {
                departed[peer] = true;
                Ok(())
            }
            Err(e) if e.code() == mscclpp::ErrorCode::RemoteError => Err(NcclError::remote(
                format!("rank {peer} failed or exited without destroying its communicator: {e}"),
            )),
            Err(_) => Ok(()),
        }
    }

    /// The lowest peer [`Peers::check_peer`] fails, with its error.
    pub fn first_failure(&self) -> Option<(usize, NcclError)> {
        (0..self.bootstrap.nranks()).find_map(|p| self.check_peer(p).err().map(|e| (p, e)))
    }

    /// [`Peers::check_peer`] for every peer.
    pub fn check_all(&self) -> NResult<()> {
        (0..self.bootstrap.nranks()).try_for_each(|p| self.check_peer(p))
    }

    /// Tells every peer this rank leaves on purpose (best effort: a peer already gone is
    /// not an error).
    pub fn say_goodbye(&self) {
        let me = self.bootstrap.rank();
        for p in (0..self.bootstrap.nranks()).filter(|&p| p != me) {
            let _ = self.bootstrap.send(b"bye", p, TAG_BYE);
        }
    }
}
