//! The host backend's point-to-point (moved here from the NCCL crate): chunks staged through a
//! per-peer slot ring in the receiver's registered memory, written over a connection (CudaIpc
//! within a host, Ethernet across hosts) and announced/acknowledged with two
//! `Host2HostSemaphore`s per peer.
//!
//! A batch of operations is progressed together by one non-blocking loop, so matched sends and
//! receives complete in any order without deadlock. A send completes when the receiver has
//! acknowledged its last chunk, so no acknowledgement ever targets a rank that has returned
//! (and may have destroyed the communicator). Per peer and direction, messages match in call
//! order, as NCCL specifies. Each chunk carries a header with the message size, so a receive
//! whose size differs from the matching send's is an error naming both sizes, not silent
//! corruption. A stalled loop checks the peers' liveness ([`Hooks`]) and gives up after the
//! timeout without progress.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Dir, Hooks, P2pOp};
use crate::bootstrap::Bootstrap;
use crate::communicator::Communicator;
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::future::Future;
use crate::identity::host_hash;
use crate::memory::LocalMemory;
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::{Host2HostSemaphore, Semaphore};
use crate::transport::{Device, EndpointConfig, Transport};

/// Payload bytes per chunk.
const CHUNK: usize = 512 * 1024;
/// Header bytes in front of each chunk's payload.
const HEADER: usize = 16;
/// Bytes per slot.
const STRIDE: usize = HEADER + CHUNK;
/// Slots per direction (chunks in flight).
const SLOTS: u64 = 4;
/// Marks a chunk header.
const CHUNK_MAGIC: u32 = u32::from_le_bytes(*b"NCP2");
/// Communicator tags of the setup exchange.
const TAG_CONN: u64 = 0x4e43_0001;
const TAG_MEM: u64 = 0x4e43_0002;
const TAG_DATA: u64 = 0x4e43_0003;
const TAG_ACK: u64 = 0x4e43_0004;
/// How often a stalled loop checks its peers.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);
/// Bootstrap tag of a size-mismatch notice: the receiver that found the mismatch tells the
/// sender, whose send would otherwise wait for acknowledgements that never come.
const TAG_MISMATCH: u64 = 0x4d50_3250_4d49_5300; // "MP2PMIS\0"
/// A stalled batch warns (naming what it waits for) after this, then at every doubling.
pub(super) const WARN_AFTER: Duration = Duration::from_secs(5);

struct Link {
    conn: Connection,
    /// Where the peer writes chunks for this rank.
    inbox: LocalMemory,
    /// The peer's inbox for this rank's chunks.
    outbox: RegisteredMemory,
    staging: LocalMemory,
    staging_reg: RegisteredMemory,
    /// signal: "a chunk is in your inbox"; poll: "a chunk is in mine".
    data: Host2HostSemaphore,
    /// signal: "I consumed a chunk of yours"; poll: "the peer consumed one of mine".
    ack: Host2HostSemaphore,
    /// Chunks sent / acknowledged / received so far (slot = count % SLOTS).
    sent: u64,
    acked: u64,
    received: u64,
    /// The registration of `inbox` (kept alive while the peer maps it).
    _inbox_reg: RegisteredMemory,
}

/// Whether the next chunk of receive `r` would overwrite bytes that a send to the same peer
/// (`sends`) has yet to read out of the very same buffer (same address and size: an in-place
/// all-to-all's block), as the GPU kernel decides. Both ends cut messages into the same chunks,
/// so the send's chunk j never waits for the receive's chunk j: no circle.
fn overwrites_unsent(r: &Progress, sends: &VecDeque<Progress>) -> bool {
    let end = r.done + CHUNK.min(r.op.bytes - r.done);
    sends
        .iter()
        .any(|s| s.op.buf == r.op.buf && s.op.bytes == r.op.bytes && s.done < end)
}

/// The point-to-point state of one communicator.
pub(super) struct HostP2p {
    rank: usize,
    links: Vec<Option<Link>>,
    /// Out-of-band notices to and from peers (size mismatches).
    bootstrap: Arc<dyn Bootstrap>,
    /// This instance's random id, and every rank's: a notice names the instance it is for, so
    /// one meant for an earlier `PointToPoint` of the communicator is ignored.
    ids: Vec<u64>,
}

fn core_err(what: &str) -> impl FnOnce(Error) -> Error + '_ {
    move |e| context(e, what)
}

/// `e` with `what: ` in front of its message, same kind.
fn context(e: Error, what: &str) -> Error {
    match e {
        Error::InvalidUsage(m) => Error::InvalidUsage(format!("{what}: {m}")),
        Error::Remote { peer, what: w } => Error::Remote {
            peer,
            what: format!("{what}: {w}"),
        },
        Error::Timeout { what: w, after } => Error::Timeout {
            what: format!("{what}: {w}"),
            after,
        },
        Error::Internal(m) => Error::Internal(format!("{what}: {m}")),
        other => other,
    }
}

impl HostP2p {
    /// Connects to every peer (collective over the communicator).
    pub(super) fn setup(comm: &Communicator) -> Result<HostP2p> {
        let b = comm.bootstrap();
        let (rank, n) = (b.rank(), b.nranks());
        let mut mine = host_hash().to_le_bytes().to_vec();
        mine.extend_from_slice(&crate::bootstrap::socket::random_u64().to_le_bytes());
        let gathered: Vec<Vec<u8>> = b.all_gather(&mine).map_err(core_err("p2p setup"))?;
        let word = |v: &[u8], at: usize| {
            v.get(at..at + 8)
                .and_then(|w| w.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "p2p setup: a peer sent {} bytes, expected 16",
                        v.len()
                    ))
                })
        };
        let hashes = gathered
            .iter()
            .map(|v| word(v, 0))
            .collect::<Result<Vec<u64>>>()?;
        let ids = gathered
            .iter()
            .map(|v| word(v, 8))
            .collect::<Result<Vec<u64>>>()?;
        let mut pending = Vec::new();
        for p in (0..n).filter(|&p| p != rank) {
            let transport = if hashes[p] == hashes[rank] {
                Transport::CudaIpc
            } else {
                Transport::Ethernet
            };
            let what = format!("p2p setup with rank {p}");
            let inbox = LocalMemory::alloc(Device::CPU, STRIDE * SLOTS as usize)
                .map_err(core_err(&what))?;
            let inbox_reg = comm
                .register_memory(inbox.ptr(), inbox.size(), transport.into())
                .map_err(core_err(&what))?;
            let staging = LocalMemory::alloc(Device::CPU, STRIDE * SLOTS as usize)
                .map_err(core_err(&what))?;
            let staging_reg = comm
                .register_memory(staging.ptr(), staging.size(), transport.into())
                .map_err(core_err(&what))?;
            let conn = comm.connect(EndpointConfig::new(transport, Device::CPU), p, TAG_CONN);
            comm.send_memory(&inbox_reg, p, TAG_MEM)
                .map_err(core_err(&what))?;
            let outbox = comm.recv_memory(p, TAG_MEM);
            pending.push((p, inbox, inbox_reg, staging, staging_reg, conn, outbox));
        }
        let mut joined = Vec::new();
        for (p, inbox, inbox_reg, staging, staging_reg, conn, outbox) in pending {
            let what = format!("p2p setup with rank {p}");
            let conn = conn.get().map_err(core_err(&what))?;
            let outbox = outbox.get().map_err(core_err(&what))?;
            let data = comm.build_semaphore(&conn, p, TAG_DATA);
            let ack = comm.build_semaphore(&conn, p, TAG_ACK);
            joined.push((
                p,
                inbox,
                inbox_reg,
                staging,
                staging_reg,
                conn,
                outbox,
                data,
                ack,
            ));
        }
        let mut links: Vec<Option<Link>> = (0..n).map(|_| None).collect();
        for (p, inbox, inbox_reg, staging, staging_reg, conn, outbox, data, ack) in joined {
            let what = format!("p2p semaphores with rank {p}");
            let h2h = |f: Future<Semaphore>| {
                f.get()
                    .and_then(Host2HostSemaphore::new)
                    .map_err(core_err(&what))
            };
            let (data, ack) = (h2h(data)?, h2h(ack)?);
            links[p] = Some(Link {
                conn,
                inbox,
                outbox,
                staging,
                staging_reg,
                data,
                ack,
                sent: 0,
                acked: 0,
                received: 0,
                _inbox_reg: inbox_reg,
            });
        }
        Ok(HostP2p {
            rank,
            links,
            bootstrap: b.clone(),
            ids,
        })
    }

    /// A size-mismatch notice `peer` sent to this instance, if one has arrived.
    fn mismatch_from(&self, peer: usize) -> Result<Option<String>> {
        while let Some(m) = self.bootstrap.try_recv(peer, TAG_MISMATCH)? {
            if m.len() >= 8 && m[..8] == self.ids[self.rank].to_le_bytes() {
                return Ok(Some(String::from_utf8_lossy(&m[8..]).into_owned()));
            }
        }
        Ok(None)
    }
}

/// Tells `peer` (its instance `id`) that its send does not match this rank's receive (best
/// effort: a peer that cannot be told times out instead).
fn tell_mismatch(bootstrap: &dyn Bootstrap, id: u64, peer: usize, what: &str) {
    let mut msg = id.to_le_bytes().to_vec();
    msg.extend_from_slice(what.as_bytes());
    if let Err(e) = bootstrap.send(&msg, peer, TAG_MISMATCH) {
        crate::log_warn!("P2P", "telling rank {peer} of a size mismatch failed: {e}");
    }
}

/// The size-mismatch message of a receive of `expects` bytes from `peer` whose matching send
/// sends `sends` bytes (the receiver's view; the sender is told the same words).
fn mismatch(peer: usize, sends: u64, expects: usize) -> String {
    format!(
        "point-to-point receive from rank {peer}: the matching send sends {sends} bytes, this \
         receive expects {expects} bytes: expected the same count and datatype on both sides"
    )
}

/// What a stalled batch still waits for, per peer: sends and receives with their sizes and how
/// far each got (for the warning and the timeout).
fn pending_text(sends: &[VecDeque<Progress>], recvs: &[VecDeque<Progress>]) -> String {
    let mut parts = Vec::new();
    for (p, (s, r)) in sends.iter().zip(recvs).enumerate() {
        for x in s {
            parts.push(format!(
                "a send of {} bytes to rank {p} ({} bytes taken so far)",
                x.op.bytes, x.done
            ));
        }
        for x in r {
            parts.push(if x.done == 0 {
                format!(
                    "a receive of {} bytes from rank {p} (nothing arrived: rank {p} has not \
                     posted the matching send)",
                    x.op.bytes
                )
            } else {
                format!(
                    "a receive of {} bytes from rank {p} ({} bytes arrived so far)",
                    x.op.bytes, x.done
                )
            });
        }
    }
    parts.join("; ")
}

/// Where one operation stands.
struct Progress {
    op: P2pOp,
    done: usize,
    chunks: u32,
}

fn header(total: usize, chunk: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0..8].copy_from_slice(&(total as u64).to_le_bytes());
    h[8..12].copy_from_slice(&chunk.to_le_bytes());
    h[12..16].copy_from_slice(&CHUNK_MAGIC.to_le_bytes());
    h
}

fn backoff(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    if *spins < 64 {
        std::hint::spin_loop();
    } else if *spins < 256 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

impl Link {
    /// Sends the next chunk of `s`.
    ///
    /// # Safety
    /// `s.op.buf` must be readable for `s.op.bytes` bytes.
    unsafe fn send_chunk(&mut self, s: &mut Progress) -> Result<()> {
        let slot = (self.sent % SLOTS) as usize * STRIDE;
        let len = CHUNK.min(s.op.bytes - s.done);
        self.staging.write(slot, &header(s.op.bytes, s.chunks))?;
        // SAFETY: inside the caller's readable buffer (done + len <= bytes).
        let src =
            unsafe { std::slice::from_raw_parts((s.op.buf as usize + s.done) as *const u8, len) };
        self.staging.write(slot + HEADER, src)?;
        let off = slot as u64;
        self.conn.write(
            &self.outbox,
            off,
            &self.staging_reg,
            off,
            (HEADER + len) as u64,
        )?;
        self.data.signal()?;
        self.sent += 1;
        s.done += len;
        s.chunks += 1;
        Ok(())
    }

    /// Receives the chunk that has arrived for `r`.
    ///
    /// # Safety
    /// `r.op.buf` must be writable for `r.op.bytes` bytes.
    unsafe fn recv_chunk(&mut self, r: &mut Progress, peer: usize) -> Result<()> {
        let slot = (self.received % SLOTS) as usize * STRIDE;
        let mut h = [0u8; HEADER];
        self.inbox.read(slot, &mut h)?;
        let total = u64::from_le_bytes(h[0..8].try_into().unwrap_or_default());
        let chunk = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
        let magic = u32::from_le_bytes(h[12..16].try_into().unwrap_or_default());
        if magic != CHUNK_MAGIC || chunk != r.chunks {
            return Err(Error::remote(
                peer,
                format!(
                    "point-to-point receive: chunk header {h:02x?} is not chunk {} of a message",
                    r.chunks
                ),
            ));
        }
        if total != r.op.bytes as u64 {
            return Err(Error::invalid(mismatch(peer, total, r.op.bytes)));
        }
        let len = CHUNK.min(r.op.bytes - r.done);
        // SAFETY: inside the caller's writable buffer (done + len <= bytes).
        let dst =
            unsafe { std::slice::from_raw_parts_mut((r.op.buf as usize + r.done) as *mut u8, len) };
        self.inbox.read(slot + HEADER, dst)?;
        self.ack.signal()?;
        self.received += 1;
        r.done += len;
        r.chunks += 1;
        Ok(())
    }
}

impl HostP2p {
    /// Runs every operation of `ops` with other ranks to completion (the caller copied those
    /// with this rank), progressing all of them together; a stalled loop stops when
    /// `hooks.aborted()` says so, checks the liveness of its peers and gives up after
    /// `timeout` without progress.
    ///
    /// # Safety
    /// Each buffer must be host memory valid for its `bytes` (readable for sends, writable
    /// for receives) until this returns.
    pub(super) unsafe fn run(
        &mut self,
        ops: &[P2pOp],
        hooks: &Hooks,
        timeout: Duration,
    ) -> Result<()> {
        let n = self.links.len();
        let mut sends: Vec<VecDeque<Progress>> = (0..n).map(|_| VecDeque::new()).collect();
        let mut recvs: Vec<VecDeque<Progress>> = (0..n).map(|_| VecDeque::new()).collect();
        for op in ops.iter().filter(|o| o.peer != self.rank && o.bytes > 0) {
            let q = match op.dir {
                Dir::Send => &mut sends[op.peer],
                Dir::Recv => &mut recvs[op.peer],
            };
            q.push_back(Progress {
                op: *op,
                done: 0,
                chunks: 0,
            });
        }
        let (mut last_progress, mut last_check, mut spins) = (Instant::now(), Instant::now(), 0);
        let first_warning = WARN_AFTER.min(timeout / 4);
        let mut next_warning = first_warning;
        loop {
            let (mut progressed, mut pending) = (false, false);
            for p in 0..n {
                if sends[p].is_empty() && recvs[p].is_empty() {
                    continue;
                }
                let link = self.links[p].as_mut().ok_or_else(|| {
                    Error::Internal(format!("no point-to-point link to rank {p}"))
                })?;
                if let Some(s) = sends[p].front_mut() {
                    loop {
                        while link.acked < link.sent && link.ack.poll() {
                            link.acked += 1;
                            progressed = true;
                        }
                        if s.done == s.op.bytes || link.sent - link.acked >= SLOTS {
                            break;
                        }
                        // SAFETY: the caller's contract on the buffers.
                        unsafe { link.send_chunk(s) }
                            .map_err(|e| context(e, &format!("point-to-point send to rank {p}")))?;
                        progressed = true;
                    }
                    // A send completes once the receiver has read every chunk (all acks in):
                    // the receiver's last ack must never reach a sender that already returned
                    // and may have destroyed the communicator, and its ack semaphore, since.
                    if s.done == s.op.bytes && link.acked == link.sent {
                        sends[p].pop_front();
                    }
                }
                if let Some(r) = recvs[p].front_mut() {
                    while r.done < r.op.bytes
                        && !overwrites_unsent(r, &sends[p])
                        && link.data.poll()
                    {
                        // SAFETY: the caller's contract on the buffers.
                        if let Err(e) = unsafe { link.recv_chunk(r, p) } {
                            if let Error::InvalidUsage(m) = &e {
                                tell_mismatch(&*self.bootstrap, self.ids[p], p, m);
                            }
                            return Err(e);
                        }
                        progressed = true;
                    }
                    if r.done == r.op.bytes {
                        recvs[p].pop_front();
                    }
                }
                pending |= !sends[p].is_empty() || !recvs[p].is_empty();
            }
            if !pending {
                return Ok(());
            }
            if progressed {
                last_progress = Instant::now();
                next_warning = first_warning;
                spins = 0;
                continue;
            }
            if (hooks.aborted)() {
                return Err(Error::Aborted(
                    "the communicator was aborted while send/recv were in progress".into(),
                ));
            }
            if last_check.elapsed() >= LIVENESS_EVERY {
                for p in (0..n).filter(|&p| !sends[p].is_empty() || !recvs[p].is_empty()) {
                    (hooks.check_peer)(p)?;
                    if sends[p].is_empty() {
                        continue;
                    }
                    if let Some(why) = self.mismatch_from(p)? {
                        return Err(Error::invalid(format!(
                            "point-to-point send to rank {p}: rank {p} found a size mismatch and \
                             failed: rank {p}'s {why}"
                        )));
                    }
                }
                last_check = Instant::now();
            }
            let stalled = last_progress.elapsed();
            if stalled >= timeout {
                return Err(Error::timeout(
                    format!(
                        "point-to-point send/recv made no progress (pending: {}): expected each \
                         peer to post the matching calls (MSCCLPP_P2P_TIMEOUT sets this bound)",
                        pending_text(&sends, &recvs)
                    ),
                    timeout,
                ));
            }
            if stalled >= next_warning {
                crate::log_warn!(
                    "P2P",
                    "rank {}: point-to-point send/recv has made no progress for {:.1?}, still \
                     waiting for: {}; fails after {timeout:?} without progress \
                     (MSCCLPP_P2P_TIMEOUT)",
                    self.rank,
                    stalled,
                    pending_text(&sends, &recvs)
                );
                next_warning = next_warning.saturating_mul(2);
            }
            backoff(&mut spins);
        }
    }
}
