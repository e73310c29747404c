//! One host thread of one thread block and what every operation needs from it: the launch
//! it belongs to, where chunks live (local buffers, peers' buffers, the scratch half of this
//! launch), polling with the launch's timeout and abort, the block's barrier, this thread's
//! share of the work.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::collectives::DataType;
use crate::device_emu::packet::HostPacket;
use crate::device_emu::spin_until;
use crate::error::{Error, Result};
use crate::executor::lower::device::{ExecArgs, ExecBlock, ExecOp, REF_REMOTE};
use crate::executor::run::config::PacketType;
use crate::switch_channel::SwitchChannelDeviceHandle;

/// One host launch: the lowered blocks, the addresses they run on (the kernel's argument;
/// its `blocks` is unused here) and what only the host needs.
pub(crate) struct HostLaunch<'a> {
    pub blocks: &'a [Box<ExecBlock>],
    /// Per block: its switch channels (the slots its switch chunk references name).
    pub switch: &'a [Vec<SwitchChannelDeviceHandle>],
    pub args: ExecArgs,
    pub dtype: DataType,
    pub packet: PacketType,
    pub threads: u32,
    pub timeout: Duration,
}

/// A block-wide barrier (the threads of one host "thread block") that gives up on abort or
/// after the timeout.
pub(super) struct BlockBarrier {
    n: u32,
    state: Mutex<(u32, u64)>,
    cv: Condvar,
}

impl BlockBarrier {
    /// A barrier of `n` threads.
    pub(super) fn new(n: u32) -> BlockBarrier {
        BlockBarrier {
            n,
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
        }
    }

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

/// The error of a thread that stopped because another block failed.
pub(super) fn aborted() -> Error {
    Error::Aborted("executor: another thread block of this launch failed".into())
}

/// One host thread of one block.
pub(super) struct Thread<'a> {
    pub l: &'a HostLaunch<'a>,
    pub block: &'a ExecBlock,
    /// The block's switch channels (the slots its switch chunk references name).
    pub sw: &'a [SwitchChannelDeviceHandle],
    pub tid: u32,
    /// Threads of the block.
    pub n: u32,
    /// This launch's flag (LL packets, scratch parity).
    pub flag: u32,
    pub abort: &'a AtomicBool,
    pub bar: &'a BlockBarrier,
}

/// Where an op's chunk lives: base address (parity included) and whether it is scratch.
#[derive(Clone, Copy)]
pub(super) struct Loc {
    pub base: *mut u8,
    pub scratch: bool,
}

impl Thread<'_> {
    pub(super) fn even(&self) -> bool {
        self.flag & 1 == 0
    }

    pub(super) fn spin(&self, what: &str, mut cond: impl FnMut() -> bool) -> Result<()> {
        spin_until(what, self.l.timeout, || {
            self.abort.load(Ordering::Relaxed) || cond()
        })?;
        if self.abort.load(Ordering::Acquire) {
            return Err(aborted());
        }
        Ok(())
    }

    pub(super) fn sync(&self) -> Result<()> {
        self.bar.wait(self.abort, self.l.timeout)
    }

    pub(super) fn local(&self, ty: u8) -> Loc {
        let (base, scratch) = match ty {
            0 => (self.l.args.input, false),
            1 => (self.l.args.output, false),
            _ => {
                let half = if self.even() {
                    self.l.args.scratch_half
                } else {
                    0
                };
                (self.l.args.scratch + half, true)
            }
        };
        Loc {
            base: base as usize as *mut u8,
            scratch,
        }
    }

    /// A chunk reference: local buffer, or remote (memory channel) buffer of the block.
    pub(super) fn loc(&self, r: u8, ty: u8) -> Loc {
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
    pub(super) fn it(&self, scratch: bool, offset: u64) -> u64 {
        if scratch && self.l.args.reuse_chunk > 0 {
            offset % self.l.args.reuse_chunk
        } else {
            offset
        }
    }

    /// Indexes `tid, tid + n, ...` below `count` (what `tid < count` does on a GPU, for any
    /// thread count).
    pub(super) fn mine(&self, count: usize) -> impl Iterator<Item = usize> {
        (self.tid as usize..count).step_by(self.n as usize)
    }

    /// This thread's contiguous share of `n` items.
    pub(super) fn share(&self, n: u64) -> (u64, u64) {
        let per = n.div_ceil(u64::from(self.n));
        let b = (per * u64::from(self.tid)).min(n);
        (b, (b + per).min(n))
    }

    /// (dst memory id, dst offset, src memory id, src offset) of output `i` of a port op;
    /// `packets` doubles the chunk offsets (packet buffers are twice the data).
    pub(super) fn port_endpoints(
        &self,
        o: &ExecOp,
        i: usize,
        off: u64,
        packets: bool,
    ) -> (u32, u64, u32, u64) {
        let k = if packets { 2 } else { 1 };
        let slot = (o.output_refs[i] & !REF_REMOTE) as usize;
        let dst_scratch = o.output_types[i] == 2;
        let dst_half = if self.even() {
            u64::from(self.block.port_buffer_halves[slot])
        } else {
            0
        };
        let j = if (i as u8) < o.n_inputs { i } else { 0 };
        let src_ty = o.input_refs[j];
        let src_half = if src_ty == 2 && self.even() {
            self.l.args.scratch_half
        } else {
            0
        };
        (
            self.block.port_buffers[slot],
            k * u64::from(o.output_offsets[i]) + dst_half + self.it(dst_scratch, off),
            u32::from(src_ty),
            k * u64::from(o.input_offsets[j]) + src_half + self.it(src_ty == 2, off),
        )
    }

    /// The address of byte `chunk_off` of `l` at pipeline offset `off`.
    ///
    /// # Safety
    /// The result lies inside the buffer behind `l` (validated and lowered ranges).
    pub(super) unsafe fn addr(&self, l: Loc, chunk_off: u32, off: u64) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        unsafe {
            l.base
                .add((u64::from(chunk_off) + self.it(l.scratch, off)) as usize)
        }
    }

    /// The packet at `index` of the packet buffer that chunk offset `off` of a buffer maps to.
    pub(super) fn pkt<P: HostPacket>(base: *mut u8, off: u32, index: u64) -> *mut P {
        // SAFETY: callers pass ranges inside the (doubled) packet buffer.
        unsafe { base.add(2 * off as usize).cast::<P>().add(index as usize) }
    }

    /// Waits for the packet at `p` of this launch and copies its payload to `out`.
    pub(super) fn read<P: HostPacket>(&self, p: *const P, out: *mut u32) -> Result<()> {
        let flag = self.flag;
        // SAFETY: p is a live packet slot, out holds PAYLOAD_BYTES.
        self.spin(P::NAME, || unsafe { P::read_once(p, flag, out) })
    }

    /// Meets the other `n` blocks at barrier `id` (one thread per block calls it).
    pub(super) fn grid_barrier(&self, id: usize, n: u32) -> Result<()> {
        let words = self.l.args.barriers as usize as *mut u32;
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
