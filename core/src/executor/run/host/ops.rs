//! The plain operations of the host interpreter: block barriers, signals, waits and flushes,
//! copies (local and through memory channels), puts (memory and port channels), reductions
//! with remote reads and writes, device semaphores.

use std::sync::atomic::{AtomicI32, Ordering};

use super::reduce;
use super::thread::Thread;
use crate::device_emu::copy;
use crate::device_emu::memory_channel::MemorySemaphoreOps;
use crate::error::{Error, Result};
use crate::executor::json::PlanReduceOp;
use crate::executor::lower::device::{op, ExecOp, CHANNEL_MEMORY};

impl Thread<'_> {
    /// barrier: the block's threads, then (thread 0) the other blocks, then the threads again.
    pub(super) fn barrier(&self, o: &ExecOp) -> Result<()> {
        self.sync()?;
        if self.tid == 0 && o.n_blocks > 1 {
            self.grid_barrier(o.barrier_id as usize, o.n_blocks)?;
        }
        self.sync()
    }

    /// The op's channels this thread serves.
    fn my_channels<'o>(&self, o: &'o ExecOp) -> impl Iterator<Item = usize> + 'o {
        let chans = &o.channels[..o.n_channels as usize];
        self.mine(chans.len()).map(move |k| chans[k] as usize)
    }

    /// signal / rlxsignal.
    ///
    /// # Safety
    /// See [`super::run`].
    pub(super) unsafe fn signal(&self, o: &ExecOp) -> Result<()> {
        for c in self.my_channels(o) {
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
                unsafe { self.block.port_channels[c].signal(self.l.timeout)? };
            }
        }
        Ok(())
    }

    /// wait / rlxwait.
    ///
    /// # Safety
    /// See [`super::run`].
    pub(super) unsafe fn wait(&self, o: &ExecOp) -> Result<()> {
        for c in self.my_channels(o) {
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
        Ok(())
    }

    /// flush.
    ///
    /// # Safety
    /// See [`super::run`].
    pub(super) unsafe fn flush(&self, o: &ExecOp) -> Result<()> {
        for c in self.my_channels(o) {
            // SAFETY: as above.
            unsafe { self.block.port_channels[c].flush(self.l.timeout)? };
        }
        Ok(())
    }

    /// Copies input chunk `i` to output chunk `i`: `bytes` from pipeline offset `off`, at
    /// most `unit`, split across the block's threads.
    ///
    /// # Safety
    /// See [`super::run`].
    unsafe fn copy_pair(
        &self,
        o: &ExecOp,
        i: usize,
        bytes: u32,
        off: u64,
        unit: u64,
    ) -> Result<()> {
        let size = u64::from(bytes).saturating_sub(off).min(unit);
        if size == 0 {
            return Ok(());
        }
        let s = self.loc(o.input_refs[i], o.input_types[i]);
        let d = self.loc(o.output_refs[i], o.output_types[i]);
        // SAFETY: chunk ranges inside the buffers (validated and lowered).
        unsafe {
            copy::copy(
                self.addr(d, o.output_offsets[i], off),
                self.addr(s, o.input_offsets[i], off),
                size,
                self.tid,
                self.n,
            )
        }
    }

    /// get / copy: every input chunk into its output chunk.
    ///
    /// # Safety
    /// See [`super::run`].
    pub(super) unsafe fn copy(&self, o: &ExecOp, off: u64, unit: u64) -> Result<()> {
        for i in 0..o.n_inputs as usize {
            // SAFETY: forwarded.
            unsafe { self.copy_pair(o, i, o.input_sizes[i], off, unit)? };
        }
        Ok(())
    }

    /// put / pws / pwsf.
    ///
    /// # Safety
    /// See [`super::run`].
    pub(super) unsafe fn put(&self, o: &ExecOp, off: u64, unit: u64) -> Result<()> {
        let t = self.l.timeout;
        let size_of = |s: u32| u64::from(s).saturating_sub(off).min(unit);
        if o.channel_type == CHANNEL_MEMORY {
            for i in 0..o.n_outputs as usize {
                // SAFETY: forwarded.
                unsafe { self.copy_pair(o, i, o.output_sizes[i], off, unit)? };
            }
            return Ok(());
        }
        for i in self.mine(o.n_outputs as usize) {
            let size = size_of(o.output_sizes[i]);
            if size == 0 {
                continue;
            }
            let (dst, dst_off, src, src_off) = self.port_endpoints(o, i, off, false);
            let ch = &self.block.port_channels[o.channels[i] as usize];
            // SAFETY: live port channel handles (caller's contract).
            unsafe {
                match o.op_type {
                    op::PUT => ch.put(dst, dst_off, src, src_off, size, t)?,
                    op::PUT_WITH_SIGNAL => {
                        ch.put_with_signal(dst, dst_off, src, src_off, size, t)?
                    }
                    _ => ch.put_with_signal_and_flush(dst, dst_off, src, src_off, size, t)?,
                }
            }
        }
        Ok(())
    }

    /// re / res / rre / rres: `dst[0] = op(src...)`, then the result to the remote outputs.
    ///
    /// # Safety
    /// See [`super::run`].
    pub(super) unsafe fn reduce(&self, o: &ExecOp, off: u64, unit: u64) -> Result<()> {
        let size = u64::from(o.input_sizes[0]).saturating_sub(off).min(unit);
        let es = self.l.dtype.size_in_bytes() as u64;
        if size == 0 {
            return Ok(());
        }
        if !size.is_multiple_of(es) {
            return Err(Error::Executor(format!(
                "reduce of {size} bytes: not a whole number of {} elements",
                self.l.dtype
            )));
        }
        let (b, e) = self.share(size / es);
        if e <= b {
            return Ok(());
        }
        let at = |r: u8, ty: u8, o_: u32| -> *mut u8 {
            // SAFETY: the chunk range is inside its buffer (validated and lowered).
            unsafe { self.addr(self.loc(r, ty), o_, off).add((b * es) as usize) }
        };
        let inputs: Vec<*const u8> = (0..o.n_inputs as usize)
            .map(|i| at(o.input_refs[i], o.input_types[i], o.input_offsets[i]).cast_const())
            .collect();
        let dst = at(o.output_refs[0], o.output_types[0], o.output_offsets[0]);
        let bytes = ((e - b) * es) as usize;
        let op = PlanReduceOp::from_code(o.reduce_op);
        // SAFETY: every range holds `bytes` from this thread's start.
        unsafe { reduce::reduce(self.l.dtype, op, dst, &inputs, bytes) };
        for i in 1..o.n_outputs as usize {
            let r = at(o.output_refs[i], o.output_types[i], o.output_offsets[i]);
            // SAFETY: as above; this thread wrote dst's range itself.
            unsafe { std::ptr::copy_nonoverlapping(dst, r, bytes) };
        }
        Ok(())
    }

    /// sem_acquire / sem_release: this thread's share of the op's device semaphores.
    ///
    /// # Safety
    /// See [`super::run`].
    pub(super) unsafe fn semaphore(&self, o: &ExecOp) -> Result<()> {
        let sems = self.l.args.semaphores as usize as *mut i32;
        for k in self.mine(o.n_semaphores as usize) {
            // SAFETY: ids validated below the context's semaphore count.
            let s = unsafe { AtomicI32::from_ptr(sems.add(o.semaphore_ids[k] as usize)) };
            if o.op_type == op::SEM_RELEASE {
                s.fetch_add(1, Ordering::Release);
            } else {
                self.spin("a device semaphore", || {
                    let v = s.load(Ordering::Relaxed);
                    v > 0
                        && s.compare_exchange(v, v - 1, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                })?;
            }
        }
        Ok(())
    }
}
