//! The native paths: the collectives of `mscclpp::collectives` for world sizes above one,
//! and copies (or nothing, in place) at world size 1 and for sends to self.

use std::ffi::c_int;

use crate::abi;
use crate::error::{NResult, NcclError};
use crate::options::Op;

/// One collective call, its arguments checked.
#[derive(Clone, Copy, Debug)]
pub struct CollArgs {
    /// Which collective.
    pub op: Op,
    /// Send buffer (device address; host address on the host backend).
    pub send: u64,
    /// Receive buffer.
    pub recv: u64,
    /// NCCL's count argument (per rank for all-gather and reduce-scatter).
    pub count: usize,
    /// `ncclDataType_t`.
    pub dtype: c_int,
    /// `ncclRedOp_t` (reductions only).
    pub redop: c_int,
    /// Root rank (broadcast, reduce).
    pub root: usize,
    /// The caller's stream (`cudaStream_t` as an integer).
    pub stream: u64,
}

impl CollArgs {
    /// Bytes of the count argument.
    pub fn bytes(&self) -> usize {
        self.count * abi::type_size(self.dtype).unwrap_or(1)
    }
}

/// The native state of one communicator.
pub struct Native {
    rank: usize,
    nranks: usize,
}

impl Native {
    /// Native state for `rank` of `nranks`.
    pub fn new(rank: usize, nranks: usize) -> NResult<Native> {
        Ok(Native { rank, nranks })
    }

    /// `Ok` when a native path covers `args`, else why not (the fallback then takes it).
    pub fn supports(&self, args: &CollArgs) -> Result<(), String> {
        if matches!(args.op, Op::AllReduce | Op::ReduceScatter | Op::Reduce)
            && !abi::is_builtin_op(args.redop)
        {
            return Err(format!(
                "{}: custom reduction operators (ncclRedOpCreatePreMulSum) have no native path",
                args.op.name()
            ));
        }
        if self.nranks == 1 {
            return Ok(());
        }
        Err(format!(
            "{} on {} ranks: the native collectives are not available in this build",
            args.op.name(),
            self.nranks
        ))
    }

    /// Runs `args` natively (asynchronously on its stream on GPUs).
    ///
    /// # Safety
    /// The buffers must be valid for the collective's sizes on the comm's device until the
    /// work on the stream completes.
    pub unsafe fn run(&self, args: &CollArgs) -> NResult<()> {
        if self.nranks == 1 {
            let bytes = match args.op {
                Op::Reduce | Op::AllReduce | Op::Broadcast | Op::AllGather | Op::ReduceScatter => {
                    args.bytes()
                }
                _ => {
                    return Err(NcclError::internal(format!(
                        "{} is not a collective",
                        args.op.name()
                    )))
                }
            };
            // SAFETY: forwarded.
            return unsafe { copy(args.recv, args.send, bytes, args.stream) };
        }
        let _ = self.rank;
        Err(NcclError::usage(format!(
            "{}: no native path on {} ranks in this build",
            args.op.name(),
            self.nranks
        )))
    }
}

/// Copies `bytes` from `src` to `dst` in stream order (nothing when they are the same).
///
/// # Safety
/// Both ranges must be valid device memory (host memory on the host backend).
pub unsafe fn copy(dst: u64, src: u64, bytes: usize, _stream: u64) -> NResult<()> {
    if bytes == 0 || dst == src {
        return Ok(());
    }
    if crate::HOST_BACKEND {
        // SAFETY: the caller's contract; `copy` allows overlap.
        unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, bytes) };
        return Ok(());
    }
    Err(NcclError::usage(
        "device copies are not available in this build",
    ))
}
