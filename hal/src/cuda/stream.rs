//! CUDA streams and events, and the work enqueued on a stream; waits poll
//! cuStreamQuery/cuEventQuery with a timeout ([`crate::StreamApi`] for [`Cuda`]).

use super::device::CudaDevice;
use super::result::{event, mem, stream};
use super::Cuda;
use crate::auxil::{deferred, poll_until};
use crate::{Result, StreamApi};
use cudarc::driver::sys;
use std::time::Duration;

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

// SAFETY: stream and event handles may be used from any thread.
unsafe impl Send for CudaStream {}
// SAFETY: as above.
unsafe impl Sync for CudaStream {}
// SAFETY: as above.
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}

impl CudaStream {
    /// The raw CUstream (for interop).
    pub fn cu_stream(&self) -> sys::CUstream {
        self.raw
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        // SAFETY: raw was created by cuStreamCreate and is destroyed once.
        deferred::release(self.dev.bind(), || unsafe { stream::destroy(self.raw) });
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: raw was created by cuEventCreate and is destroyed once.
        deferred::release(self.dev.bind(), || unsafe { event::destroy(self.raw) });
    }
}

impl StreamApi for Cuda {
    fn create_stream(dev: &CudaDevice) -> Result<CudaStream> {
        dev.enter()?;
        Ok(CudaStream {
            dev: dev.clone(),
            raw: stream::create_non_blocking()?,
        })
    }

    fn stream_synchronize(s: &CudaStream, timeout: Duration) -> Result<()> {
        s.dev.enter()?;
        // SAFETY: the stream is live while `s` is borrowed.
        poll_until("cuStreamSynchronize", timeout, || unsafe {
            stream::query(s.raw)
        })
    }

    fn create_event(dev: &CudaDevice) -> Result<CudaEvent> {
        dev.enter()?;
        Ok(CudaEvent {
            dev: dev.clone(),
            raw: event::create()?,
        })
    }

    fn record_event(e: &CudaEvent, s: &CudaStream) -> Result<()> {
        e.dev.enter()?;
        // SAFETY: both are live while borrowed.
        unsafe { event::record(e.raw, s.raw) }
    }

    fn event_synchronize(e: &CudaEvent, timeout: Duration) -> Result<()> {
        e.dev.enter()?;
        // SAFETY: the event is live while `e` is borrowed.
        poll_until("cuEventSynchronize", timeout, || unsafe {
            event::query(e.raw)
        })
    }

    fn event_elapsed_ms(start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        start.dev.enter()?;
        // SAFETY: both events are live while borrowed.
        unsafe { event::elapsed_ms(start.raw, end.raw) }
    }

    unsafe fn memset_async(s: &CudaStream, dst: u64, value: u8, len: usize) -> Result<()> {
        s.dev.enter()?;
        // SAFETY: the caller keeps the range alive until the stream is done.
        unsafe { mem::set_d8_async(dst, value, len, s.raw) }
    }

    unsafe fn memcpy_async(s: &CudaStream, dst: u64, src: u64, len: usize) -> Result<()> {
        s.dev.enter()?;
        // SAFETY: the caller keeps both ranges alive until the stream is done.
        unsafe { mem::copy_async(dst, src, len, s.raw) }
    }

    unsafe fn write_value64_async(s: &CudaStream, dst: u64, value: u64) -> Result<()> {
        s.dev.enter()?;
        // SAFETY: the caller keeps the aligned target alive until the stream is done.
        unsafe { stream::write_value64(s.raw, dst, value) }
    }
}
