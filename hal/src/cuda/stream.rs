//! CUDA streams and events, and the work enqueued on a stream; waits poll
//! cuStreamQuery/cuEventQuery with a timeout ([`crate::StreamApi`] for [`Cuda`]).

use super::device::CudaDevice;
use super::result::{event, mem, stream};
use super::Cuda;
use cudarc::driver::sys;

/// A non-blocking CUDA stream; destroyed on drop.
#[derive(Debug)]
pub struct CudaStream {
    pub(super) dev: CudaDevice,
    pub(super) raw: sys::CUstream,
}

/// A CUDA event with timing; destroyed on drop.
#[derive(Debug)]
pub struct CudaEvent {
    dev: CudaDevice,
    raw: sys::CUevent,
}

impl CudaStream {
    /// The raw CUstream (for interop).
    pub fn cu_stream(&self) -> sys::CUstream {
        self.raw
    }
}

// Thread-safe: stream and event handles may be used from any thread.
owned_handle!(CudaStream, stream::destroy);
owned_handle!(CudaEvent, event::destroy);

gpu_stream_api! { Cuda, CudaDevice, CudaStream("cuStreamSynchronize"),
CudaEvent("cuEventSynchronize"), mem::set_d8_async }
