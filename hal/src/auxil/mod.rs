//! Helpers shared by the backends that are not part of the HAL contract: system calls
//! (`os`, through rustix), fd passing between processes ([`fdpass`]), NUMA placement
//! ([`numa`]), drop-time failures surfaced later (`deferred`), the polling back-off
//! ([`Backoff`], [`poll_until`]), the driver-call count ([`driver_calls_on_this_thread`]) and
//! argument range checks and the host-memory
//! registration of every backend ([`registration`]).

pub(crate) mod deferred;
pub mod fdpass;
pub mod numa;
pub(crate) mod os;
pub mod registration;

mod backoff;
mod calls;
#[cfg(any(hal_cuda, hal_rocm))]
mod image;
mod range;

pub use backoff::{poll_until, Backoff};
#[allow(unused_imports)] // used only by the GPU backends
pub(crate) use calls::count_driver_call;
pub use calls::driver_calls_on_this_thread;
#[cfg(any(hal_cuda, hal_rocm))]
pub(crate) use image::aligned_code_image;
#[cfg(any(hal_cuda, hal_rocm))]
pub(crate) use range::register_then_map;
pub(crate) use range::{check_host_range, check_range};
