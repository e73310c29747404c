//! The switch-channel (NVLS) operations of the host interpreter: glre, glres and gstore on
//! the host backend's multicast emulation ([`crate::device_emu::switch_channel`]), in 16-byte
//! vectors of the launch's data type, each thread of a block taking a contiguous share.

use super::thread::Thread;
use crate::collectives::DataType;
use crate::device_emu::switch_channel::{Bf16x8, F16x8, F32x4, MultimemVector};
use crate::error::{Error, Result};
use crate::executor::lower::device::{op, ExecOp, REF_REMOTE, REF_SWITCH, SWITCH_VECTOR_BYTES};
use crate::switch_channel::SwitchChannelDeviceHandle;

impl Thread<'_> {
    /// The switch channel behind a chunk reference.
    fn switch_ref(&self, r: u8) -> Result<&SwitchChannelDeviceHandle> {
        let slot = (r & !REF_SWITCH) as usize;
        if r & REF_SWITCH == 0 || r & REF_REMOTE != 0 {
            return Err(Error::Executor(format!(
                "host interpreter: switch operation with chunk reference {r:#x}: expected a switch channel slot"
            )));
        }
        self.sw.get(slot).ok_or_else(|| {
            Error::Executor(format!(
                "host interpreter: switch channel slot {slot}: the block has {}",
                self.sw.len()
            ))
        })
    }

    /// Byte offset of a switch chunk in its bound buffer (double scratch: the launch's half).
    fn switch_offset(&self, ty: u8, chunk_off: u32, off: u64) -> u64 {
        let scratch = ty == 2;
        let half = if scratch && self.even() {
            self.l.args.scratch_half
        } else {
            0
        };
        half + u64::from(chunk_off) + self.it(scratch, off)
    }

    /// glre / glres / gstore with pipeline offset `off` and step `unit`.
    ///
    /// # Safety
    /// See [`super::run`]; the block's switch handles come from live channels.
    pub(super) unsafe fn switch_op(&self, o: &ExecOp, off: u64, unit: u64) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            match self.l.dtype {
                DataType::F32 => self.switch_typed::<F32x4>(o, off, unit),
                DataType::F16 => self.switch_typed::<F16x8>(o, off, unit),
                DataType::Bf16 => self.switch_typed::<Bf16x8>(o, off, unit),
                other => Err(Error::Executor(format!(
                    "switch operation on {other}: NVLS reduces f32, f16 and bf16 only"
                ))),
            }
        }
    }

    /// # Safety
    /// As [`Thread::switch_op`].
    unsafe fn switch_typed<V: MultimemVector>(
        &self,
        o: &ExecOp,
        off: u64,
        unit: u64,
    ) -> Result<()> {
        let size = u64::from(o.input_sizes[0]).saturating_sub(off).min(unit);
        if size == 0 {
            return Ok(());
        }
        let v = SWITCH_VECTOR_BYTES;
        let src = if o.op_type == op::GROUP_STORE {
            let l = self.local(o.input_refs[0]);
            u64::from(o.input_offsets[0]) + self.it(l.scratch, off)
        } else {
            self.switch_offset(o.input_types[0], o.input_offsets[0], off)
        };
        let dst = if o.op_type == op::GROUP_LOAD_REDUCE {
            let l = self.local(o.output_refs[0]);
            u64::from(o.output_offsets[0]) + self.it(l.scratch, off)
        } else {
            self.switch_offset(o.output_types[0], o.output_offsets[0], off)
        };
        if !size.is_multiple_of(v) || !src.is_multiple_of(v) || !dst.is_multiple_of(v) {
            return Err(Error::Executor(format!(
                "switch operation: {size} bytes from byte {src} to byte {dst}: expected multiples of {v} (16-byte vectors; pipeline unit sizes too)"
            )));
        }
        let n = size / v;
        let (tid, nt) = (self.tid, self.n);
        // SAFETY: the lowered chunks lie inside the bound buffers and local buffers (validated
        // and lowered for this size); the handles are live (caller's contract).
        unsafe {
            match o.op_type {
                op::GROUP_LOAD_REDUCE => {
                    let h = self.switch_ref(o.input_refs[0])?;
                    let d = self.local(o.output_refs[0]).base.add(dst as usize);
                    h.reduce_to::<V>(d.cast(), src / v, n, tid, nt)
                }
                op::GROUP_STORE => {
                    let h = self.switch_ref(o.output_refs[0])?;
                    let s = self.local(o.input_refs[0]).base.add(src as usize);
                    h.broadcast_from::<V>(s.cast_const().cast(), dst / v, n, tid, nt)
                }
                _ => {
                    let (hs, hd) = (
                        self.switch_ref(o.input_refs[0])?,
                        self.switch_ref(o.output_refs[0])?,
                    );
                    if src == dst {
                        return hs.reduce_store_to::<V>(hd, src / v, n, tid, nt);
                    }
                    // Different offsets: vector by vector over this thread's share.
                    let (b, e) = self.share(n);
                    for k in b..e {
                        let x = hs.reduce::<V>(src / v + k)?;
                        hd.broadcast::<V>(dst / v + k, x)?;
                    }
                    Ok(())
                }
            }
        }
    }
}
