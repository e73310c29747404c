//! The exported C functions of `nccl.h` (2.28.3) that manage communicators, memory, errors
//! and groups; the collectives and point-to-point are in `exports_ops.rs`.
//!
//! Each function exists as `ncclX` and as its profiling twin `pncclX`. Every body runs in
//! the C boundary's guard (`boundary.rs`), so errors become `ncclResult_t` codes with a
//! message for `ncclGetLastError` and no panic ever unwinds into C.

// The exported names are NCCL's (`ncclGetVersion`, ...), not snake case.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

use mscclpp::TcpBootstrap;

use crate::abi::{self, NcclConfig, NcclResult, NcclSimInfo, NcclUniqueId};
use crate::boundary::{guard, guard_value};
use crate::checks::{elem_size, out};
use crate::comm::{self, lookup, ready as ready_comm, Comm};
use crate::error::{last_error_ptr, NResult, NcclError};
use crate::group::OpenGroupCheck;
use crate::{group, init, mem, split};

/// Warns when `call` finalizes, destroys or aborts `comm` inside an open group.
fn teardown_check(call: &'static str, comm: *const Comm) {
    if !comm.is_null() {
        group::warn_if_open(call, comm as usize, OpenGroupCheck::Teardown);
    }
}

/// Registers `[buff, buff + size)` with `comm` and writes the handle to `handle`.
fn register_into(
    comm: *const Comm,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
    name: &str,
) -> NResult<NcclResult> {
    let o = out(name, handle)?;
    let c = lookup(comm)?;
    let h = mem::register(std::sync::Arc::as_ptr(&c) as usize, buff, size)?;
    if let Ok(ready) = c.ready() {
        // Registered whole at the next zero-copy miss outside capture, so later calls inside
        // it are views, under capture too (a communicator still initializing registers its
        // buffers call by call instead).
        ready.native.declare_buffer(buff as u64, size);
    }
    // SAFETY: checked non-NULL; the caller's pointer.
    unsafe { *o = h };
    Ok(abi::SUCCESS)
}

/// Releases a registration `handle` of `comm`, and the collectives' mappings of buffers in it.
fn deregister(comm: *const Comm, handle: *mut c_void) -> NResult<NcclResult> {
    let c = lookup(comm)?;
    let (ptr, size) = mem::deregister(std::sync::Arc::as_ptr(&c) as usize, handle)?;
    if let Ok(ready) = c.ready() {
        ready.native.forget_buffers(ptr, size);
    }
    Ok(abi::SUCCESS)
}

nccl_export! {
    /// Allocates communication memory on the current device.
    fn ncclMemAlloc, pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
        // SAFETY: the caller's pointer, checked inside.
        guard("ncclMemAlloc", || unsafe { mem::alloc(ptr, size) })
    }
}

nccl_export! {
    /// Frees memory from `ncclMemAlloc`.
    fn ncclMemFree, pncclMemFree(ptr: *mut c_void) -> NcclResult {
        guard("ncclMemFree", || mem::free(ptr))
    }
}

nccl_export! {
    /// Writes `NCCL_VERSION_CODE` (22803).
    fn ncclGetVersion, pncclGetVersion(version: *mut c_int) -> NcclResult {
        guard("ncclGetVersion", || {
            let v = out("version", version)?;
            // SAFETY: checked non-NULL; the caller's pointer.
            unsafe { *v = abi::VERSION_CODE };
            Ok(abi::SUCCESS)
        })
    }
}

nccl_export! {
    /// Makes a unique id: the address of a bootstrap root this process reserves for rank 0.
    fn ncclGetUniqueId, pncclGetUniqueId(unique_id: *mut NcclUniqueId) -> NcclResult {
        guard("ncclGetUniqueId", || {
            let o = out("uniqueId", unique_id)?;
            let id = TcpBootstrap::create_unique_id().map_err(NcclError::from)?;
            // SAFETY: checked non-NULL; the caller's pointer.
            unsafe { *o = NcclUniqueId::from_bytes(id.as_bytes()) };
            Ok(abi::SUCCESS)
        })
    }
}

nccl_export! {
    /// Creates this rank's communicator with options.
    fn ncclCommInitRankConfig, pncclCommInitRankConfig(
        comm: *mut *mut Comm, nranks: c_int, comm_id: NcclUniqueId, rank: c_int,
        config: *mut NcclConfig
    ) -> NcclResult {
        // SAFETY: the caller's pointers, checked inside.
        guard("ncclCommInitRankConfig", || unsafe {
            init::init_rank(comm, nranks, &comm_id, rank, config)
        })
    }
}

nccl_export! {
    /// Creates this rank's communicator.
    fn ncclCommInitRank, pncclCommInitRank(
        comm: *mut *mut Comm, nranks: c_int, comm_id: NcclUniqueId, rank: c_int
    ) -> NcclResult {
        // SAFETY: the caller's pointer, checked inside.
        guard("ncclCommInitRank", || unsafe {
            init::init_rank(comm, nranks, &comm_id, rank, std::ptr::null())
        })
    }
}

nccl_export! {
    /// Creates `ndev` communicators of one clique in this process.
    fn ncclCommInitAll, pncclCommInitAll(comm: *mut *mut Comm, ndev: c_int, devlist: *const c_int) -> NcclResult {
        // SAFETY: the caller's pointers, checked inside.
        guard("ncclCommInitAll", || unsafe { split::init_all(comm, ndev, devlist) })
    }
}

nccl_export! {
    /// Creates this rank's communicator from several ids (the first is used).
    fn ncclCommInitRankScalable, pncclCommInitRankScalable(
        newcomm: *mut *mut Comm, nranks: c_int, myrank: c_int, n_id: c_int,
        comm_ids: *mut NcclUniqueId, config: *mut NcclConfig
    ) -> NcclResult {
        // SAFETY: the caller's pointers, checked inside.
        guard("ncclCommInitRankScalable", || unsafe {
            split::init_scalable(newcomm, nranks, myrank, n_id, comm_ids, config)
        })
    }
}

nccl_export! {
    /// Tells the peers this rank is done with the communicator.
    fn ncclCommFinalize, pncclCommFinalize(comm: *mut Comm) -> NcclResult {
        guard("ncclCommFinalize", || {
            teardown_check("ncclCommFinalize", comm);
            comm::finalize(comm)
        })
    }
}

nccl_export! {
    /// Frees the communicator (NULL: nothing to do, as in NCCL).
    fn ncclCommDestroy, pncclCommDestroy(comm: *mut Comm) -> NcclResult {
        guard("ncclCommDestroy", || {
            teardown_check("ncclCommDestroy", comm);
            if comm.is_null() {
                return Ok(abi::SUCCESS);
            }
            comm::destroy(comm)
        })
    }
}

nccl_export! {
    /// Stops and frees the communicator within about a second (NULL: nothing to do).
    fn ncclCommAbort, pncclCommAbort(comm: *mut Comm) -> NcclResult {
        guard("ncclCommAbort", || {
            teardown_check("ncclCommAbort", comm);
            if comm.is_null() {
                return Ok(abi::SUCCESS);
            }
            comm::abort(comm)
        })
    }
}

nccl_export! {
    /// Splits the communicator by color, ordering by key.
    fn ncclCommSplit, pncclCommSplit(
        comm: *mut Comm, color: c_int, key: c_int, newcomm: *mut *mut Comm, config: *mut NcclConfig
    ) -> NcclResult {
        // SAFETY: the caller's pointers, checked inside.
        guard("ncclCommSplit", || unsafe { split::split(comm, color, key, newcomm, config) })
    }
}

nccl_export! {
    /// A new communicator of the ranks not excluded.
    fn ncclCommShrink, pncclCommShrink(
        comm: *mut Comm, exclude_ranks_list: *mut c_int, exclude_ranks_count: c_int,
        newcomm: *mut *mut Comm, config: *mut NcclConfig, shrink_flags: c_int
    ) -> NcclResult {
        // SAFETY: the caller's pointers, checked inside.
        guard("ncclCommShrink", || unsafe {
            split::shrink(comm, exclude_ranks_list, exclude_ranks_count, newcomm, config, shrink_flags)
        })
    }
}

nccl_export! {
    /// The text of a result code (a static string).
    fn ncclGetErrorString, pncclGetErrorString(result: NcclResult) -> *const c_char {
        guard_value("ncclGetErrorString", c"unknown result code".as_ptr(), || {
            crate::error::result_string(result).as_ptr()
        })
    }
}

nccl_export! {
    /// The message of the last error in this process (valid until this thread's next call).
    fn ncclGetLastError, pncclGetLastError(_comm: *mut Comm) -> *const c_char {
        guard_value("ncclGetLastError", c"".as_ptr(), last_error_ptr)
    }
}

nccl_export! {
    /// Logging is configured once from `MSCCLPP_LOG_*`; there is nothing to reload.
    fn ncclResetDebugInit, pncclResetDebugInit() -> () {
        guard_value("ncclResetDebugInit", (), || ())
    }
}

nccl_export! {
    /// The communicator's asynchronous error: `ncclInProgress` during a non-blocking init,
    /// `ncclRemoteError` once a peer died, else `ncclSuccess`.
    fn ncclCommGetAsyncError, pncclCommGetAsyncError(comm: *mut Comm, async_error: *mut NcclResult) -> NcclResult {
        guard("ncclCommGetAsyncError", || {
            let o = out("asyncError", async_error)?;
            let c = lookup(comm)?;
            group::warn_if_open("ncclCommGetAsyncError", comm as usize, OpenGroupCheck::Query);
            let mut e = c.async_error();
            if e == abi::SUCCESS {
                if let Ok(r) = c.ready() {
                    if let Some(fb) = &r.fallback {
                        e = fb.async_error();
                    }
                }
            }
            // SAFETY: checked non-NULL; the caller's pointer.
            unsafe { *o = e };
            Ok(abi::SUCCESS)
        })
    }
}

nccl_export! {
    /// The number of ranks.
    fn ncclCommCount, pncclCommCount(comm: *const Comm, count: *mut c_int) -> NcclResult {
        guard("ncclCommCount", || {
            let o = out("count", count)?;
            let c = lookup(comm)?;
            // SAFETY: checked non-NULL; the caller's pointer.
            unsafe { *o = c.nranks as c_int };
            Ok(abi::SUCCESS)
        })
    }
}

nccl_export! {
    /// The device ordinal of the communicator (0 on the host backend).
    fn ncclCommCuDevice, pncclCommCuDevice(comm: *const Comm, device: *mut c_int) -> NcclResult {
        guard("ncclCommCuDevice", || {
            let o = out("device", device)?;
            let c = lookup(comm)?;
            // SAFETY: checked non-NULL; the caller's pointer.
            unsafe { *o = c.device };
            Ok(abi::SUCCESS)
        })
    }
}

nccl_export! {
    /// This rank.
    fn ncclCommUserRank, pncclCommUserRank(comm: *const Comm, rank: *mut c_int) -> NcclResult {
        guard("ncclCommUserRank", || {
            let o = out("rank", rank)?;
            let c = lookup(comm)?;
            // SAFETY: checked non-NULL; the caller's pointer.
            unsafe { *o = c.rank as c_int };
            Ok(abi::SUCCESS)
        })
    }
}

nccl_export! {
    /// Registers a buffer; returns a handle for `ncclCommDeregister`.
    fn ncclCommRegister, pncclCommRegister(
        comm: *const Comm, buff: *mut c_void, size: usize, handle: *mut *mut c_void
    ) -> NcclResult {
        guard("ncclCommRegister", || register_into(comm, buff, size, handle, "handle"))
    }
}

nccl_export! {
    /// Releases a handle from `ncclCommRegister`.
    fn ncclCommDeregister, pncclCommDeregister(comm: *const Comm, handle: *mut c_void) -> NcclResult {
        guard("ncclCommDeregister", || deregister(comm, handle))
    }
}

nccl_export! {
    /// Registers a window (flags NCCL_WIN_DEFAULT or NCCL_WIN_COLL_SYMMETRIC).
    fn ncclCommWindowRegister, pncclCommWindowRegister(
        comm: *mut Comm, buff: *mut c_void, size: usize, win: *mut *mut c_void, win_flags: c_int
    ) -> NcclResult {
        guard("ncclCommWindowRegister", || {
            out("win", win)?;
            if win_flags != 0 && win_flags != 1 {
                return Err(NcclError::arg(format!(
                    "winFlags {win_flags}: expected NCCL_WIN_DEFAULT (0) or NCCL_WIN_COLL_SYMMETRIC (1)"
                )));
            }
            register_into(comm, buff, size, win, "win")
        })
    }
}

nccl_export! {
    /// Releases a window.
    fn ncclCommWindowDeregister, pncclCommWindowDeregister(comm: *mut Comm, win: *mut c_void) -> NcclResult {
        guard("ncclCommWindowDeregister", || deregister(comm, win))
    }
}

nccl_export! {
    /// Creates a pre-multiplied sum operator (needs the fallback NCCL: no native path).
    fn ncclRedOpCreatePreMulSum, pncclRedOpCreatePreMulSum(
        op: *mut c_int, scalar: *mut c_void, datatype: c_int, residence: c_int, comm: *mut Comm
    ) -> NcclResult {
        guard("ncclRedOpCreatePreMulSum", || {
            let o = out("op", op)?;
            elem_size(datatype)?;
            if residence != 0 && residence != 1 {
                return Err(NcclError::arg(format!(
                    "residence {residence}: expected ncclScalarDevice (0) or ncclScalarHostImmediate (1)"
                )));
            }
            if scalar.is_null() {
                return Err(NcclError::arg("scalar is NULL"));
            }
            let (_, ready) = ready_comm(comm)?;
            let fb = ready.fallback.as_ref().ok_or_else(|| {
                NcclError::usage(format!(
                    "custom reduction operators have no native path and no fallback NCCL is \
                     loaded{}",
                    ready.fallback_note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default()
                ))
            })?;
            // SAFETY: the caller's scalar, valid as NCCL documents for `residence`.
            let id = unsafe { fb.pre_mul_sum(scalar, datatype, residence)? };
            ready.note_custom_op(id, true)?;
            // SAFETY: checked non-NULL; the caller's pointer.
            unsafe { *o = id };
            Ok(abi::SUCCESS)
        })
    }
}

nccl_export! {
    /// Destroys an operator from `ncclRedOpCreatePreMulSum`.
    fn ncclRedOpDestroy, pncclRedOpDestroy(op: c_int, comm: *mut Comm) -> NcclResult {
        guard("ncclRedOpDestroy", || {
            if abi::is_builtin_op(op) {
                return Err(NcclError::arg(format!(
                    "op {op} ({}) is built in: expected an operator from ncclRedOpCreatePreMulSum",
                    abi::op_name(op)
                )));
            }
            let (_, ready) = ready_comm(comm)?;
            ready.note_custom_op(op, false)?;
            match &ready.fallback {
                Some(fb) => fb.op_destroy(op)?,
                None => return Err(NcclError::internal("a custom operator without a fallback")),
            }
            Ok(abi::SUCCESS)
        })
    }
}

nccl_export! {
    /// Starts a group (nestable, per thread).
    fn ncclGroupStart, pncclGroupStart() -> NcclResult {
        guard("ncclGroupStart", group::start)
    }
}

nccl_export! {
    /// Ends a group: the outermost end issues every queued call.
    fn ncclGroupEnd, pncclGroupEnd() -> NcclResult {
        guard("ncclGroupEnd", || group::end(false))
    }
}

nccl_export! {
    /// Ends a group without issuing its calls; reports an estimated time of 0 (no model).
    fn ncclGroupSimulateEnd, pncclGroupSimulateEnd(sim_info: *mut NcclSimInfo) -> NcclResult {
        guard("ncclGroupSimulateEnd", || {
            let o = out("simInfo", sim_info)?;
            // SAFETY: checked non-NULL; the caller's struct.
            let (magic, size) = unsafe { ((*o).magic, (*o).size) };
            if magic != abi::SIM_INFO_MAGIC || size < std::mem::size_of::<NcclSimInfo>() {
                return Err(NcclError::arg(format!(
                    "simInfo: magic {magic:#x} size {size}: expected NCCL_SIM_INFO_INITIALIZER"
                )));
            }
            let r = group::end(true)?;
            // SAFETY: as above.
            unsafe { (*o).estimated_time = 0.0 };
            Ok(r)
        })
    }
}

nccl_export! {
    /// NCCL 2.28.7+: stops the communicator; afterwards only destroy and abort work.
    fn ncclCommRevoke, pncclCommRevoke(comm: *mut Comm, revoke_flags: c_int) -> NcclResult {
        guard("ncclCommRevoke", || {
            if revoke_flags != 0 {
                return Err(NcclError::arg(format!(
                    "revokeFlags {revoke_flags}: expected NCCL_REVOKE_DEFAULT (0)"
                )));
            }
            lookup(comm)?.revoke();
            Ok(abi::SUCCESS)
        })
    }
}
