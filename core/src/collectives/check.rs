//! The call check (`MSCCLPP_CHECK_CALLS=1`, off by default): before a collective runs, every
//! rank sends its fingerprint of the call (sequence number on the communicator, collective,
//! count, type, operation, root, world size) to every other rank over the bootstrap and
//! compares them; on a mismatch every rank fails the call with the same error naming the ranks
//! and their calls, instead of hanging until a timeout. A rank that skipped a call shows as a
//! sequence or collective mismatch at its next call. Point-to-point batches are checked per
//! pair ([`P2pCheck`]): each rank sends every peer of a batch the list of its operations with
//! that peer, and a send must meet a receive of the same size.
//!
//! Off: one relaxed atomic load per call. On: one small bootstrap message to each peer and one
//! from each peer per call (a few tens of microseconds inside a host); under CUDA-graph capture
//! the check runs when the call is captured, not at each replay.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::algorithm::Call;
use super::types::{CollectiveKind, DataType, ReduceOp};
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};

/// Bootstrap tag of the collectives' fingerprints.
const TAG_COLL: u64 = 0xC4EC_0001;
/// Bootstrap tag of the point-to-point fingerprints.
const TAG_P2P: u64 = 0xC4EC_0002;

pub(crate) fn kind_code(k: CollectiveKind) -> u8 {
    CollectiveKind::ALL
        .iter()
        .position(|&x| x == k)
        .unwrap_or(0) as u8
}
pub(crate) fn dtype_code(d: DataType) -> u8 {
    DataType::ALL.iter().position(|&x| x == d).unwrap_or(0) as u8
}
pub(crate) fn op_code(o: ReduceOp) -> u8 {
    ReduceOp::ALL.iter().position(|&x| x == o).unwrap_or(0) as u8
}
/// The identity of one collective call: what every rank must issue alike (the call check's
/// [`Fingerprint`]) and what the flight recorder keeps of it
/// ([`super::recorder::CallRecord`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallKey {
    /// The call's sequence number on the communicator (0, 1, ...; every rank counts alike).
    pub seq: u64,
    /// The collective.
    pub kind: CollectiveKind,
    /// Elements (per rank: all-gather's send count, reduce-scatter's receive count).
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (`sum` for the collectives without one).
    pub op: ReduceOp,
    /// Root (broadcast; 0 for the others).
    pub root: usize,
}

/// The bytes of an encoded [`CallKey`].
pub(crate) const KEY_BYTES: usize = 27;

impl CallKey {
    /// The key of `call`, the `seq`-th call of a communicator.
    pub fn of(call: &Call, seq: u64) -> CallKey {
        CallKey {
            seq,
            kind: call.kind,
            count: call.count,
            dtype: call.dtype,
            op: call.op,
            root: call.root,
        }
    }

    /// Appends the key's [`KEY_BYTES`] bytes: seq, count, root (u64 LE each), then the codes
    /// of kind, dtype and op.
    pub(crate) fn encode_into(&self, v: &mut Vec<u8>) {
        v.extend_from_slice(&self.seq.to_le_bytes());
        v.extend_from_slice(&(self.count as u64).to_le_bytes());
        v.extend_from_slice(&(self.root as u64).to_le_bytes());
        v.push(kind_code(self.kind));
        v.push(dtype_code(self.dtype));
        v.push(op_code(self.op));
    }

    /// The key in the first [`KEY_BYTES`] of `b`; `None` when too short or a code is unknown.
    pub(crate) fn decode(b: &[u8]) -> Option<CallKey> {
        let b = b.get(..KEY_BYTES)?;
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Some(CallKey {
            seq: u(0),
            count: usize::try_from(u(8)).ok()?,
            root: usize::try_from(u(16)).ok()?,
            kind: *CollectiveKind::ALL.get(b[24] as usize)?,
            dtype: *DataType::ALL.get(b[25] as usize)?,
            op: *ReduceOp::ALL.get(b[26] as usize)?,
        })
    }
}

impl std::fmt::Display for CallKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "call #{} {} count {} {}",
            self.seq, self.kind, self.count, self.dtype
        )?;
        match self.kind {
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter => write!(f, " {}", self.op)?,
            CollectiveKind::Broadcast => write!(f, " root {}", self.root)?,
            CollectiveKind::AllGather => {}
        }
        if self.root != 0 && self.kind != CollectiveKind::Broadcast {
            write!(f, " root {}", self.root)?;
        }
        Ok(())
    }
}

/// What every rank must agree on for one collective call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// The call.
    pub call: CallKey,
    /// World size of the communicator.
    pub nranks: usize,
    /// The rank refused the call itself (its arguments or algorithm check failed there).
    pub refused: bool,
}

const FP_BYTES: usize = KEY_BYTES + 9;

impl Fingerprint {
    /// The fingerprint of `call`, the `seq`-th call of a communicator of `nranks`.
    pub fn of(call: &Call, seq: u64, nranks: usize) -> Fingerprint {
        Fingerprint {
            call: CallKey::of(call, seq),
            nranks,
            refused: false,
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FP_BYTES);
        self.call.encode_into(&mut b);
        b.extend_from_slice(&(self.nranks as u64).to_le_bytes());
        b.push(u8::from(self.refused));
        b
    }

    fn decode(b: &[u8]) -> Option<Fingerprint> {
        if b.len() != FP_BYTES {
            return None;
        }
        let n = u64::from_le_bytes(b[KEY_BYTES..KEY_BYTES + 8].try_into().ok()?);
        Some(Fingerprint {
            call: CallKey::decode(b)?,
            nranks: usize::try_from(n).ok()?,
            refused: b[FP_BYTES - 1] != 0,
        })
    }

    /// The fields where `self` and `other` differ, in words.
    fn differences(&self, other: &Fingerprint) -> Vec<&'static str> {
        let (a, b) = (&self.call, &other.call);
        [
            (
                a.seq != b.seq,
                "sequence number (a rank skipped or added a call)",
            ),
            (a.kind != b.kind, "collective"),
            (a.count != b.count, "count"),
            (a.dtype != b.dtype, "datatype"),
            (a.op != b.op, "reduction op"),
            (a.root != b.root, "root"),
            (self.nranks != other.nranks, "communicator size"),
            (
                self.refused != other.refused,
                "refusing the call (that rank's own error says why)",
            ),
        ]
        .into_iter()
        .filter_map(|(differs, what)| differs.then_some(what))
        .collect()
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} on a communicator of {} ranks",
            self.call, self.nranks
        )?;
        if self.refused {
            f.write_str(" and refused it")?;
        }
        Ok(())
    }
}

/// The error of a mismatch: the groups of ranks that issued each distinct call, the group of
/// the lowest rank first. `None` when every rank agrees.
pub fn mismatch(prints: &[Fingerprint]) -> Option<Error> {
    let first = prints.first()?;
    if prints.iter().all(|p| p == first) {
        return None;
    }
    let mut groups: Vec<(Fingerprint, Vec<usize>)> = Vec::new();
    for (r, p) in prints.iter().enumerate() {
        match groups.iter_mut().find(|(q, _)| q == p) {
            Some((_, ranks)) => ranks.push(r),
            None => groups.push((*p, vec![r])),
        }
    }
    // The biggest group is the reference (ties: the one of the lowest rank).
    let reference = groups
        .iter()
        .enumerate()
        .max_by(|(i, a), (j, b)| a.1.len().cmp(&b.1.len()).then(j.cmp(i)))
        .map(|(i, _)| i)
        .unwrap_or(0);
    let ranks = |rs: &[usize]| {
        let s: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
        if rs.len() == 1 {
            format!("rank {}", s[0])
        } else {
            format!("ranks {}", s.join(", "))
        }
    };
    let (rf, rr) = &groups[reference];
    let mut parts = vec![format!("{} issued {rf}", ranks(rr))];
    let mut odd = Vec::new();
    for (i, (f, rs)) in groups.iter().enumerate() {
        if i != reference {
            parts.push(format!(
                "{} issued {f} (differs in {})",
                ranks(rs),
                f.differences(rf).join(", ")
            ));
            odd.extend(rs.iter().copied());
        }
    }
    odd.sort_unstable();
    Some(Error::invalid(format!(
        "collective call mismatch ({}=1): {} diverged: {}",
        crate::env::CHECK_CALLS,
        ranks(&odd),
        parts.join("; ")
    )))
}

/// Sends `msg` to every other rank under `tag` and receives theirs, indexed by rank.
fn exchange(b: &dyn Bootstrap, msg: &[u8], tag: u64) -> Result<Vec<Vec<u8>>> {
    let (me, n) = (b.rank(), b.nranks());
    for p in (0..n).filter(|&p| p != me) {
        b.send(msg, p, tag)?;
    }
    (0..n)
        .map(|p| {
            if p == me {
                Ok(msg.to_vec())
            } else {
                b.recv(p, tag)
            }
        })
        .collect()
}

/// The check of one communicator's collectives (see the module doc).
#[derive(Debug)]
pub struct CallCheck {
    on: AtomicBool,
}

impl CallCheck {
    /// On or off (`MSCCLPP_CHECK_CALLS`).
    pub fn new(on: bool) -> CallCheck {
        CallCheck {
            on: AtomicBool::new(on),
        }
    }

    /// Whether calls are checked.
    #[inline]
    pub fn enabled(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Turns the check on or off (every rank alike, between calls).
    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed)
    }

    /// Compares `call`, the `seq`-th call of this communicator, with every rank's (collective:
    /// every rank of `bootstrap` calls it for the same call). An error naming the diverging
    /// ranks and both calls on a mismatch. `refused`: this rank cannot run the call (it
    /// fails it anyway; the others learn it and fail too instead of waiting for it).
    pub fn check(
        &self,
        bootstrap: &dyn Bootstrap,
        call: &Call,
        seq: u64,
        refused: bool,
    ) -> Result<()> {
        let n = bootstrap.nranks();
        let own = Fingerprint {
            refused,
            ..Fingerprint::of(call, seq, n)
        };
        let all = exchange(bootstrap, &own.encode(), TAG_COLL).map_err(|e| {
            e.context(format!(
                "{}: exchanging the fingerprint of {own}",
                crate::env::CHECK_CALLS
            ))
        })?;
        let mut prints = Vec::with_capacity(n);
        for (r, b) in all.iter().enumerate() {
            prints.push(Fingerprint::decode(b).ok_or_else(|| {
                Error::invalid(format!(
                    "collective call check: rank {r} sent an unreadable fingerprint ({} bytes; \
                     is it a point-to-point or another library version?)",
                    b.len()
                ))
            })?);
        }
        match mismatch(&prints) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// The point-to-point check of one communicator: per peer, the number of batches exchanged
/// (`None` bootstrap: the check is off, and a batch costs one branch).
#[derive(Default)]
pub struct P2pCheck {
    bootstrap: Option<Arc<dyn Bootstrap>>,
    seq: Mutex<Vec<u64>>,
}

impl std::fmt::Debug for P2pCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("P2pCheck")
            .field("on", &self.bootstrap.is_some())
            .finish()
    }
}

/// One point-to-point operation as the check sees it: (is a send, bytes).
pub type P2pPrint = (bool, usize);

impl P2pCheck {
    /// The check of the point-to-point state of `comm`: on when `MSCCLPP_CHECK_CALLS` is (read
    /// now).
    pub fn new(comm: &crate::communicator::Communicator) -> P2pCheck {
        let on = crate::env::Env::current().check_calls().unwrap_or(false);
        P2pCheck {
            bootstrap: on.then(|| comm.bootstrap().clone()),
            seq: Mutex::new(Vec::new()),
        }
    }

    /// Checks a batch when the check is on ([`P2pCheck::check`]): `ops()` lists its
    /// operations as (peer, is a send, bytes); not called when the check is off.
    pub fn check_ops<I: IntoIterator<Item = (usize, bool, usize)>>(
        &self,
        ops: impl FnOnce() -> I,
    ) -> Result<()> {
        let Some(b) = &self.bootstrap else {
            return Ok(());
        };
        let prints: Vec<(usize, bool, usize)> = ops().into_iter().collect();
        self.check(b.as_ref(), &prints)
    }

    /// Checks a batch: `ops` are (peer, is a send, bytes). Every peer named (other than this
    /// rank) gets the list of this rank's operations with it and sends its own; in call order
    /// a send must meet a receive of the same size. An error naming both ranks and both lists
    /// on a mismatch (both ends fail).
    pub fn check(&self, b: &dyn Bootstrap, ops: &[(usize, bool, usize)]) -> Result<()> {
        let (me, n) = (b.rank(), b.nranks());
        let mut peers: Vec<usize> = ops
            .iter()
            .map(|o| o.0)
            .filter(|&p| p != me && p < n)
            .collect();
        peers.sort_unstable();
        peers.dedup();
        let mut seqs = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        if seqs.len() != n {
            *seqs = vec![0; n];
        }
        let with = |p: usize| -> Vec<P2pPrint> {
            ops.iter()
                .filter(|o| o.0 == p)
                .map(|o| (o.1, o.2))
                .collect()
        };
        let encode = |seq: u64, l: &[P2pPrint]| {
            let mut v = seq.to_le_bytes().to_vec();
            for (s, bytes) in l {
                v.push(u8::from(*s));
                v.extend_from_slice(&(*bytes as u64).to_le_bytes());
            }
            v
        };
        for &p in &peers {
            b.send(&encode(seqs[p], &with(p)), p, TAG_P2P)?;
        }
        let show = |l: &[P2pPrint]| {
            l.iter()
                .map(|(s, bytes)| format!("{} {bytes} B", if *s { "send" } else { "recv" }))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut err = None;
        for &p in &peers {
            let m = b.recv(p, TAG_P2P)?;
            let seq = seqs[p];
            seqs[p] += 1;
            if m.len() < 8 || (m.len() - 8) % 9 != 0 {
                err.get_or_insert(Error::invalid(format!(
                    "point-to-point call check: rank {p} sent an unreadable fingerprint"
                )));
                continue;
            }
            let their_seq = u64::from_le_bytes(m[0..8].try_into().unwrap_or([0; 8]));
            let theirs: Vec<P2pPrint> = m[8..]
                .chunks(9)
                .map(|c| {
                    (
                        c[0] != 0,
                        u64::from_le_bytes(c[1..9].try_into().unwrap_or([0; 8])) as usize,
                    )
                })
                .collect();
            let mine = with(p);
            // My sends in order must meet their receives in order, and the other way round.
            let sends = |l: &[P2pPrint], s: bool| -> Vec<usize> {
                l.iter().filter(|o| o.0 == s).map(|o| o.1).collect()
            };
            let ok = their_seq == seq
                && sends(&mine, true) == sends(&theirs, false)
                && sends(&mine, false) == sends(&theirs, true);
            if !ok && err.is_none() {
                err = Some(Error::invalid(format!(
                    "point-to-point call mismatch ({}=1) between rank {me} and rank {p}: rank \
                     {me}'s batch #{seq} with rank {p} is [{}], rank {p}'s batch #{their_seq} \
                     with rank {me} is [{}] (expected each send to meet a receive of the same \
                     size, in order)",
                    crate::env::CHECK_CALLS,
                    show(&mine),
                    show(&theirs)
                )));
            }
        }
        match err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(count: usize) -> Fingerprint {
        Fingerprint::of(
            &Call::all_reduce(1, 2, count, DataType::F32, ReduceOp::Sum),
            3,
            4,
        )
    }

    #[test]
    fn fingerprints_round_trip_and_mismatches_name_the_ranks() {
        let a = fp(1024);
        assert_eq!(Fingerprint::decode(&a.encode()), Some(a));
        assert!(mismatch(&[a, a, a]).is_none());
        let e = mismatch(&[a, fp(2048), a, a]).unwrap().to_string();
        assert!(e.contains("rank 1 diverged"), "{e}");
        assert!(
            e.contains("ranks 0, 2, 3 issued call #3 allreduce count 1024"),
            "{e}"
        );
        assert!(
            e.contains("count 2048") && e.contains("differs in count"),
            "{e}"
        );
        let skip = Fingerprint {
            call: CallKey {
                seq: 4,
                kind: CollectiveKind::Broadcast,
                ..a.call
            },
            ..a
        };
        let e = mismatch(&[a, skip]).unwrap().to_string();
        assert!(
            e.contains("sequence number") && e.contains("collective"),
            "{e}"
        );
    }
}
