//! The CPU stand-in for device code: the device-side API implemented for the host backend, where
//! CPU threads play the GPU kernels' part on the same `#[repr(C)]` handles, with std atomics and
//! the memory orderings of the CUDA headers. (Named `device_emu` so it does not read as the
//! [`crate::Device`] type.)
//!
//! | CUDA (kernels/cuda/include/mscclpp) | here |
//! |---|---|
//! | `red.release.sys.global.add.u64` (signal) | one `fetch_add(1, Release)` |
//! | `ld.acquire.sys` spin (wait) | `load(Acquire)` spin with backoff and a timeout |
//! | FIFO `st.release.sys.b128` publish | `fst` relaxed store, then `snd` (commit bit) `Release` |
//! | LL packet 8/16-byte relaxed stores | one relaxed `AtomicU64` store per 8-byte half |
//! | `multimem.ld_reduce` / `multimem.st` (switch) | read and add / write every member's copy |
//!
//! Every wait takes a timeout (the GPU's spin bound) and returns [`crate::Error::Timeout`].
//! Polling loops spin briefly, then yield, then sleep: CI runs 4 ranks on 2 cores.

pub mod copy;
pub mod fifo;
pub mod memory_channel;
pub mod packet;
pub mod port_channel;
pub mod semaphore;
pub mod switch_channel;

/// The condition-with-timeout wait every operation here uses (it lives in [`crate::backoff`]):
/// as a GPU wait polls the abort word, it ends once the word is up.
pub use crate::backoff::spin_until_device as spin_until;
