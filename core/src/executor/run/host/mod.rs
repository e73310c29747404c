//! The host backend's interpreter: one CPU thread group per thread block runs the block's
//! lowered op list ([`crate::executor::device::ExecBlock`]) through the CPU device API ([`crate::device_emu`]), with the
//! GPU kernel's semantics: the same flag (one per launch, per-block counters), the same
//! double-scratch parity, `nop` as the block's `__syncthreads`, `barrier` across blocks,
//! work split by thread id. Every wait polls with the launch timeout and stops early when
//! another block of the launch failed.
//!
//! `thread` is one thread of a block (addressing, polling, barriers); `ops` the plain
//! operations, `packets` the LL packet ones, `switch` the NVLS ones, `reduce` the element-wise
//! math; this file starts the threads and dispatches each operation code.

mod ops;
mod packets;
mod reduce;
mod switch;
mod thread;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::device_emu::packet::HostPacket;
use crate::error::{Error, Result};
use crate::executor::lower::device::{op, ExecOp, TRACE_HEADER_WORDS, TRACE_WORDS};
use crate::executor::run::config::PacketType;
use crate::packet::{LL16Packet, LL8Packet};
pub(crate) use thread::HostLaunch;
use thread::{BlockBarrier, Thread};

/// Runs every block of `l` to completion (or the first error).
///
/// # Safety
/// Every address in `l` and in its blocks (channels, remote buffers) is live host memory of
/// the sizes the plan was lowered for, for the whole call.
pub(crate) unsafe fn run(l: &HostLaunch) -> Result<()> {
    let abort = AtomicBool::new(false);
    let threads = l.threads.max(1);
    let flags = l.args.flags as usize as *mut u32;
    let mut per_block = Vec::with_capacity(l.blocks.len());
    for b in 0..l.blocks.len() {
        // SAFETY: the flags array holds one counter per block (caller's contract).
        let flag = unsafe { flags.add(b).read_volatile() }.wrapping_add(1);
        per_block.push(flag);
    }
    let barriers: Vec<BlockBarrier> = (0..l.blocks.len())
        .map(|_| BlockBarrier::new(threads))
        .collect();
    let first_err: Mutex<Option<Error>> = Mutex::new(None);
    // The caller's watches (abort flag, peer liveness) end the "thread block" waits too.
    let watches = crate::backoff::current_watches();
    std::thread::scope(|s| {
        for (b, block) in l.blocks.iter().enumerate() {
            for tid in 0..threads {
                let (abort, bar, first_err) = (&abort, &barriers[b], &first_err);
                let (flag, watches) = (per_block[b], &watches);
                s.spawn(move || {
                    crate::backoff::watching_all(watches, || {
                        let t = Thread {
                            l,
                            block,
                            sw: l.switch.get(b).map_or(&[], Vec::as_slice),
                            tid,
                            n: threads,
                            flag,
                            abort,
                            bar,
                        };
                        // SAFETY: forwarded from the caller.
                        let r = unsafe {
                            match l.packet {
                                PacketType::LL16 => t.run::<LL16Packet>(b),
                                PacketType::LL8 => t.run::<LL8Packet>(b),
                            }
                        };
                        if let Err(e) = r {
                            abort.store(true, Ordering::Release);
                            let mut f = first_err.lock().unwrap_or_else(|p| p.into_inner());
                            if f.is_none() || matches!(*f, Some(Error::Aborted(_))) {
                                *f = Some(e);
                            }
                        }
                    })
                });
            }
        }
    });
    for (b, flag) in per_block.into_iter().enumerate() {
        // SAFETY: as above.
        unsafe { flags.add(b).write_volatile(flag) };
    }
    match first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Thread 0's trace counters of one block (`ExecArgs.trace`, the GPU kernel's layout) with
/// nanoseconds for cycles.
struct Trace<'a> {
    words: &'a [AtomicU64],
    start: Instant,
}

impl Trace<'_> {
    fn add(&self, word: usize, v: u64) {
        if let Some(w) = self.words.get(word) {
            w.fetch_add(v, Ordering::Relaxed);
        }
    }

    /// Adds the time since `since` and one run to op `i`'s pair.
    fn op(&self, i: usize, since: Instant) {
        self.add(TRACE_HEADER_WORDS + 2 * i, nanos(since));
        self.add(TRACE_HEADER_WORDS + 2 * i + 1, 1);
    }
}

/// The clock now when tracing, for [`Trace::op`] (no clock read per op otherwise).
fn mark(tr: &Option<Trace<'_>>) -> Option<Instant> {
    tr.as_ref().map(|_| Instant::now())
}

fn nanos(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// `at` on a process-wide nanosecond clock (the GPU's `%globaltimer` stand-in).
fn clock_ns(at: Instant) -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let e = *EPOCH.get_or_init(Instant::now);
    u64::try_from(at.saturating_duration_since(e).as_nanos()).unwrap_or(u64::MAX)
}

impl Thread<'_> {
    /// Thread 0's trace counters of this block, when the launch traces.
    fn trace(&self, block: usize) -> Option<Trace<'_>> {
        if self.l.args.trace == 0 || self.tid != 0 {
            return None;
        }
        let at = self.l.args.trace as usize as *const AtomicU64;
        // SAFETY: the trace buffer holds TRACE_WORDS words per block of the launch (the
        // executor allocates it for the most lanes), alive for the launch; u64 words are
        // aligned for AtomicU64, and every access to them is atomic.
        let words = unsafe { std::slice::from_raw_parts(at.add(block * TRACE_WORDS), TRACE_WORDS) };
        Some(Trace {
            words,
            start: Instant::now(),
        })
    }

    /// # Safety
    /// See [`run`].
    unsafe fn run<P: HostPacket>(&self, block: usize) -> Result<()> {
        let tr = self.trace(block);
        let ops = &self.block.ops[..self.block.n_ops as usize];
        let mut i = 0;
        while i < ops.len() {
            let o = &ops[i];
            let s = mark(&tr);
            if o.op_type == op::PIPELINE {
                let inner = &ops[i + 1..(i + 1 + o.n_inner as usize).min(ops.len())];
                for it in 0..o.n_iterations {
                    let off = u64::from(it) * u64::from(o.unit_size);
                    for (k, p) in inner.iter().enumerate() {
                        let sk = mark(&tr);
                        // SAFETY: forwarded.
                        unsafe { self.exec::<P>(p, off, u64::from(o.unit_size))? };
                        if let (Some(t), Some(sk)) = (&tr, sk) {
                            t.op(i + 1 + k, sk);
                        }
                    }
                }
                if let (Some(t), Some(s)) = (&tr, s) {
                    t.op(i, s);
                }
                i += 1 + inner.len();
            } else {
                // SAFETY: forwarded.
                unsafe { self.exec::<P>(o, 0, u64::MAX)? };
                if let (Some(t), Some(s)) = (&tr, s) {
                    t.op(i, s);
                }
                i += 1;
            }
        }
        if let Some(t) = &tr {
            let total = nanos(t.start);
            let (start, end) = (clock_ns(t.start), clock_ns(Instant::now()));
            let last = t.words[6].load(Ordering::Relaxed);
            if t.words[0].load(Ordering::Relaxed) > 0 && start >= last {
                let gap = start - last;
                if gap < 1_000_000 {
                    t.add(4, gap);
                    t.add(5, 1);
                }
                let least = t.words[7].load(Ordering::Relaxed);
                if least == 0 || gap + 1 < least {
                    t.words[7].store(gap + 1, Ordering::Relaxed);
                }
            }
            t.add(0, 1);
            t.add(1, total);
            t.add(2, total);
            t.words[6].store(end, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Runs one operation with pipeline offset `off` and step `unit` (`u64::MAX`: the whole
    /// chunk).
    ///
    /// # Safety
    /// See [`run`].
    unsafe fn exec<P: HostPacket>(&self, o: &ExecOp, off: u64, unit: u64) -> Result<()> {
        // SAFETY: forwarded (every arm).
        unsafe {
            match o.op_type {
                op::NOP => self.sync(),
                op::BARRIER => self.barrier(o),
                op::SIGNAL | op::RELAXED_SIGNAL => self.signal(o),
                op::WAIT | op::RELAXED_WAIT => self.wait(o),
                op::FLUSH => self.flush(o),
                op::PUT | op::PUT_WITH_SIGNAL | op::PUT_WITH_SIGNAL_AND_FLUSH => {
                    self.put(o, off, unit)
                }
                op::GET | op::COPY => self.copy(o, off, unit),
                op::REDUCE | op::REDUCE_SEND | op::READ_REDUCE | op::READ_REDUCE_SEND => {
                    self.reduce(o, off, unit)
                }
                op::PUT_PACKETS | op::READ_PUT_PACKETS | op::COPY_PACKETS | op::UNPACK_PACKETS => {
                    self.move_packets::<P>(o)
                }
                op::REDUCE_PACKETS
                | op::REDUCE_SEND_PACKETS
                | op::REDUCE_COPY_PACKETS
                | op::REDUCE_COPY_SEND_PACKETS => self.reduce_packets::<P>(o),
                op::SEM_ACQUIRE | op::SEM_RELEASE => self.semaphore(o),
                op::GROUP_LOAD_REDUCE | op::GROUP_LOAD_REDUCE_STORE | op::GROUP_STORE => {
                    self.switch_op(o, off, unit)
                }
                other => Err(Error::Executor(format!(
                    "host interpreter: unknown operation code {other}"
                ))),
            }
        }
    }
}
