//! The host backend's interpreter: one CPU thread group per thread block runs the block's
//! lowered op list ([`ExecBlock`]) through the CPU device API ([`crate::device`]), with the
//! GPU kernel's semantics: the same flag (one per launch, per-block counters), the same
//! double-scratch parity, `nop` as the block's `__syncthreads`, `barrier` across blocks,
//! work split by thread id. Every wait polls with the launch timeout and stops early when
//! another block of the launch failed.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::device::{op, ExecBlock, ExecOp, CHANNEL_MEMORY, CHANNEL_PORT, REF_REMOTE};
use super::json::PlanReduceOp;
use super::reduce;
use super::run::PacketType;
use crate::collectives::DataType;
use crate::device_emu::memory_channel::MemorySemaphoreOps;
use crate::device_emu::packet::HostPacket;
use crate::device_emu::{copy, packet, spin_until};
use crate::error::{Error, Result};
use crate::packet::{LL16Packet, LL8Packet};

/// One host launch: the lowered blocks and the addresses they run on.
pub(crate) struct HostLaunch<'a> {
    pub blocks: &'a [Box<ExecBlock>],
    /// Per block: its switch channels (the slots its switch chunk references name).
    pub switch: &'a [Vec<crate::switch_channel::SwitchChannelDeviceHandle>],
    pub input: u64,
    pub output: u64,
    pub scratch: u64,
    pub scratch_half: u64,
    pub reuse_chunk: u64,
    pub flags: u64,
    pub barriers: u64,
    pub semaphores: u64,
    pub dtype: DataType,
    pub packet: PacketType,
    pub threads: u32,
    pub timeout: Duration,
}

/// A block-wide barrier (the threads of one host "thread block") that gives up on abort or
/// after the timeout.
struct BlockBarrier {
    n: u32,
    state: Mutex<(u32, u64)>,
    cv: Condvar,
}

impl BlockBarrier {
    fn wait(&self, abort: &AtomicBool, timeout: Duration) -> Result<()> {
        if self.n <= 1 {
            return Ok(());
        }
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let gen = g.1;
        g.0 += 1;
        if g.0 == self.n {
            g.0 = 0;
            g.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let start = Instant::now();
        while g.1 == gen {
            if abort.load(Ordering::Acquire) {
                return Err(aborted());
            }
            if start.elapsed() > timeout {
                return Err(Error::timeout(
                    "executor: threads of a block at nop",
                    timeout,
                ));
            }
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(5))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }
}

fn aborted() -> Error {
    Error::Aborted("executor: another thread block of this launch failed".into())
}

/// Runs every block of `l` to completion (or the first error).
///
/// # Safety
/// Every address in `l` and in its blocks (channels, remote buffers) is live host memory of
/// the sizes the plan was lowered for, for the whole call.
pub(crate) unsafe fn run(l: &HostLaunch) -> Result<()> {
    let abort = AtomicBool::new(false);
    let threads = l.threads.max(1);
    let flags = l.flags as usize as *mut u32;
    let mut per_block = Vec::with_capacity(l.blocks.len());
    for b in 0..l.blocks.len() {
        // SAFETY: the flags array holds one counter per block (caller's contract).
        let flag = unsafe { flags.add(b).read_volatile() }.wrapping_add(1);
        per_block.push(flag);
    }
    let barriers: Vec<BlockBarrier> = (0..l.blocks.len())
        .map(|_| BlockBarrier {
            n: threads,
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
        })
        .collect();
    let first_err: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for (b, block) in l.blocks.iter().enumerate() {
            for tid in 0..threads {
                let (abort, bar, first_err) = (&abort, &barriers[b], &first_err);
                let flag = per_block[b];
                s.spawn(move || {
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
                            PacketType::LL16 => t.run::<LL16Packet>(),
                            PacketType::LL8 => t.run::<LL8Packet>(),
                        }
                    };
                    if let Err(e) = r {
                        abort.store(true, Ordering::Release);
                        let mut f = first_err.lock().unwrap_or_else(|p| p.into_inner());
                        if f.is_none() || matches!(*f, Some(Error::Aborted(_))) {
                            *f = Some(e);
                        }
                    }
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

/// One host thread of one block.
struct Thread<'a> {
    l: &'a HostLaunch<'a>,
    block: &'a ExecBlock,
    sw: &'a [crate::switch_channel::SwitchChannelDeviceHandle],
    tid: u32,
    n: u32,
    flag: u32,
    abort: &'a AtomicBool,
    bar: &'a BlockBarrier,
}

/// Where an op's chunk lives: base address (parity included) and whether it is scratch.
#[derive(Clone, Copy)]
struct Loc {
    base: *mut u8,
    scratch: bool,
}

impl Thread<'_> {
    fn even(&self) -> bool {
        self.flag & 1 == 0
    }

    fn spin(&self, what: &str, mut cond: impl FnMut() -> bool) -> Result<()> {
        spin_until(what, self.l.timeout, || {
            self.abort.load(Ordering::Relaxed) || cond()
        })?;
        if self.abort.load(Ordering::Acquire) {
            return Err(aborted());
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.bar.wait(self.abort, self.l.timeout)
    }

    fn local(&self, ty: u8) -> Loc {
        let (base, scratch) = match ty {
            0 => (self.l.input, false),
            1 => (self.l.output, false),
            _ => {
                let half = if self.even() { self.l.scratch_half } else { 0 };
                (self.l.scratch + half, true)
            }
        };
        Loc {
            base: base as usize as *mut u8,
            scratch,
        }
    }

    /// A chunk reference: local buffer, or remote (memory channel) buffer of the block.
    fn loc(&self, r: u8, ty: u8) -> Loc {
        if r & REF_REMOTE == 0 {
            return self.local(r);
        }
        let slot = (r & !REF_REMOTE) as usize;
        let half = if self.even() {
            u64::from(self.block.memory_buffer_halves[slot])
        } else {
            0
        };
        Loc {
            base: (self.block.memory_buffers[slot] + half) as usize as *mut u8,
            scratch: ty == 2,
        }
    }

    /// The pipeline offset of an access (reused scratch wraps modulo its chunk).
    fn it(&self, scratch: bool, offset: u64) -> u64 {
        if scratch && self.l.reuse_chunk > 0 {
            offset % self.l.reuse_chunk
        } else {
            offset
        }
    }

    /// # Safety
    /// See [`run`].
    unsafe fn run<P: HostPacket>(&self) -> Result<()> {
        let ops = &self.block.ops[..self.block.n_ops as usize];
        let mut i = 0;
        while i < ops.len() {
            let o = &ops[i];
            if o.op_type == op::PIPELINE {
                let inner = &ops[i + 1..(i + 1 + o.n_inner as usize).min(ops.len())];
                for it in 0..o.n_iterations {
                    let off = u64::from(it) * u64::from(o.unit_size);
                    for p in inner {
                        // SAFETY: forwarded.
                        unsafe { self.exec::<P>(p, off, u64::from(o.unit_size))? };
                    }
                }
                i += 1 + inner.len();
            } else {
                // SAFETY: forwarded.
                unsafe { self.exec::<P>(o, 0, u64::MAX)? };
                i += 1;
            }
        }
        Ok(())
    }

    /// Indexes `tid, tid + n, ...` below `count` (what `tid < count` does on a GPU, for any
    /// thread count).
    fn mine(&self, count: usize) -> impl Iterator<Item = usize> {
        (self.tid as usize..count).step_by(self.n as usize)
    }

    /// # Safety
    /// See [`run`].
    unsafe fn exec<P: HostPacket>(&self, o: &ExecOp, off: u64, unit: u64) -> Result<()> {
        let t = self.l.timeout;
        let chans = &o.channels[..o.n_channels as usize];
        let size_of = |s: u32| u64::from(s).saturating_sub(off).min(unit);
        match o.op_type {
            op::NOP => self.sync()?,
            op::BARRIER => {
                self.sync()?;
                if self.tid == 0 && o.n_blocks > 1 {
                    self.grid_barrier(o.barrier_id as usize, o.n_blocks)?;
                }
                self.sync()?;
            }
            op::SIGNAL | op::RELAXED_SIGNAL => {
                for k in self.mine(chans.len()) {
                    let c = chans[k] as usize;
                    if o.channel_type == CHANNEL_MEMORY {
                        let h = &self.block.memory_channels[c];
                        // SAFETY: live channel handles (caller's contract).
                        unsafe {
                            if o.op_type == op::SIGNAL {
                                h.signal()
                            } else {
                                h.relaxed_signal()
                            }
                        }
                    } else {
                        // SAFETY: as above.
                        unsafe { self.block.port_channels[c].signal(t)? };
                    }
                }
            }
            op::WAIT | op::RELAXED_WAIT => {
                for k in self.mine(chans.len()) {
                    let c = chans[k] as usize;
                    if o.channel_type == CHANNEL_MEMORY {
                        let h = &self.block.memory_channels[c];
                        // SAFETY: as above; one waiter per handle (the plan's contract).
                        self.spin("a memory channel signal", || unsafe { h.poll() })?;
                    } else {
                        let h = &self.block.port_channels[c];
                        // SAFETY: as above.
                        self.spin("a port channel signal", || unsafe { h.poll() })?;
                    }
                }
            }
            op::FLUSH => {
                for k in self.mine(chans.len()) {
                    // SAFETY: as above.
                    unsafe { self.block.port_channels[chans[k] as usize].flush(t)? };
                }
            }
            op::PUT | op::PUT_WITH_SIGNAL | op::PUT_WITH_SIGNAL_AND_FLUSH => {
                // SAFETY: forwarded.
                unsafe { self.put(o, off, unit)? }
            }
            op::GET => {
                for i in 0..o.n_inputs as usize {
                    let size = size_of(o.input_sizes[i]);
                    if size == 0 {
                        continue;
                    }
                    let (s, d) = (
                        self.loc(o.input_refs[i], o.input_types[i]),
                        self.loc(o.output_refs[i], o.output_types[i]),
                    );
                    // SAFETY: chunk ranges inside the buffers (validated and lowered).
                    unsafe {
                        copy::copy(
                            d.base.add(
                                (u64::from(o.output_offsets[i]) + self.it(d.scratch, off)) as usize,
                            ),
                            s.base.add(
                                (u64::from(o.input_offsets[i]) + self.it(s.scratch, off)) as usize,
                            ),
                            size,
                            self.tid,
                            self.n,
                        )?
                    };
                }
            }
            op::COPY => {
                let size = size_of(o.input_sizes[0]);
                if size > 0 {
                    let (s, d) = (self.local(o.input_refs[0]), self.local(o.output_refs[0]));
                    // SAFETY: as above.
                    unsafe {
                        copy::copy(
                            d.base.add(
                                (u64::from(o.output_offsets[0]) + self.it(d.scratch, off)) as usize,
                            ),
                            s.base.add(
                                (u64::from(o.input_offsets[0]) + self.it(s.scratch, off)) as usize,
                            ),
                            size,
                            self.tid,
                            self.n,
                        )?
                    };
                }
            }
            op::REDUCE | op::REDUCE_SEND | op::READ_REDUCE | op::READ_REDUCE_SEND => {
                // SAFETY: forwarded.
                unsafe { self.reduce(o, off, unit)? }
            }
            op::PUT_PACKETS | op::READ_PUT_PACKETS | op::COPY_PACKETS | op::UNPACK_PACKETS => {
                // SAFETY: forwarded.
                unsafe { self.move_packets::<P>(o)? }
            }
            op::REDUCE_PACKETS
            | op::REDUCE_SEND_PACKETS
            | op::REDUCE_COPY_PACKETS
            | op::REDUCE_COPY_SEND_PACKETS => {
                // SAFETY: forwarded.
                unsafe { self.reduce_packets::<P>(o)? }
            }
            op::SEM_ACQUIRE | op::SEM_RELEASE => {
                let sems = self.l.semaphores as usize as *mut i32;
                for k in self.mine(o.n_semaphores as usize) {
                    // SAFETY: ids validated below the context's semaphore count.
                    let s = unsafe { AtomicI32::from_ptr(sems.add(o.semaphore_ids[k] as usize)) };
                    if o.op_type == op::SEM_RELEASE {
                        s.fetch_add(1, Ordering::Release);
                    } else {
                        self.spin("a device semaphore", || {
                            let v = s.load(Ordering::Relaxed);
                            v > 0
                                && s.compare_exchange(
                                    v,
                                    v - 1,
                                    Ordering::Acquire,
                                    Ordering::Relaxed,
                                )
                                .is_ok()
                        })?;
                    }
                }
            }
            op::GROUP_LOAD_REDUCE | op::GROUP_LOAD_REDUCE_STORE | op::GROUP_STORE => {
                // SAFETY: forwarded.
                unsafe { self.switch_op(o, off, unit)? }
            }
            other => {
                return Err(Error::Executor(format!(
                    "host interpreter: unknown operation code {other}"
                )))
            }
        }
        Ok(())
    }

    fn grid_barrier(&self, id: usize, n: u32) -> Result<()> {
        let words = self.l.barriers as usize as *mut u32;
        // SAFETY: the barrier array holds MAX_BARRIERS pairs; ids are validated.
        let (count, gen) = unsafe {
            (
                AtomicU32::from_ptr(words.add(2 * id)),
                AtomicU32::from_ptr(words.add(2 * id + 1)),
            )
        };
        let g = gen.load(Ordering::Acquire);
        if count.fetch_add(1, Ordering::AcqRel) == n - 1 {
            count.store(0, Ordering::Relaxed);
            gen.fetch_add(1, Ordering::Release);
            return Ok(());
        }
        self.spin("the other thread blocks at a barrier", || {
            gen.load(Ordering::Acquire) != g
        })
    }
}

#[path = "host_ops.rs"]
mod ops;
#[path = "host_switch.rs"]
mod switch;
