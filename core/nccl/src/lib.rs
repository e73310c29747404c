//! `libmscclpp_nccl.so`: the C interface of NCCL 2.28 (`include/nccl.h`) over mscclpp-rs, a
//! drop-in for libnccl (link it, or `LD_PRELOAD` it in front of the real one).
//!
//! Collectives run natively where `mscclpp::collectives` has an algorithm (and as copies at
//! world size 1); point-to-point runs natively on the host backend; everything else, and every
//! operation named in `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`, goes to a real NCCL opened from
//! `MSCCLPP_NCCL_LIB_PATH`, which gets its own communicator beside ours at init. Without one,
//! an unsupported call returns `ncclInvalidUsage` and `ncclGetLastError` says which call and why.
//!
//! The `extern "C"` functions in [`exports`] and [`exports_ops`] are the C interface of
//! mscclpp-rs's core: the NCCL ABI (the operations hold the same ABI's function pointer types,
//! to call a real NCCL). One extension beside it, `include/mscclpp_nccl_ext.h`:
//! [`ext_algorithm`]'s `mscclppNcclRegisterAlgorithm` (algorithms of one's own through C).

// No unwrap() a peer, a file or the environment could make panic (tests may).
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

/// Defines an exported C function `$name` and its profiling twin `$pname` (which calls it).
macro_rules! nccl_export {
    ($(#[doc = $doc:literal])* fn $name:ident, $pname:ident ($($a:ident: $t:ty),* $(,)?) -> $r:ty $body:block) => {
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// Pointer arguments must be valid as `nccl.h` documents for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $r $body

        #[doc = concat!("The profiling twin of [`", stringify!($name), "`].")]
        ///
        /// # Safety
        /// As the function it forwards to.
        #[no_mangle]
        pub unsafe extern "C" fn $pname($($a: $t),*) -> $r {
            // SAFETY: the same contract as the function called.
            unsafe { $name($($a),*) }
        }
    };
}

// The layers, lowest first; a module imports only modules of the layers below it.
// C types:            abi
// errors:             error
// checks, settings:   checks, env, backend
// resources:          peers, fallback, native, mem (point-to-point: mscclpp::p2p)
// communicators:      comm
// operations:         ops (work, then collective and point_to_point)
// group semantics:    group
// creation:           init, split
// the C boundary:     boundary, exports, exports_ops, ext_algorithm
pub mod abi;
mod backend;
mod boundary;
mod checks;
mod comm;
pub mod env;
pub mod error;
pub mod exports;
pub mod exports_ops;
pub mod ext_algorithm;
mod fallback;
mod group;
mod init;
mod mem;
mod native;
mod ops;
mod peers;
mod split;

/// Whether this build runs on the host backend (host pointers, NULL streams, work done
/// before the call returns).
pub const HOST_BACKEND: bool = <mscclpp_hal::Gpu as mscclpp_hal::Api>::HOST_ADDRESSABLE;
