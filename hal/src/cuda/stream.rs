//! CUDA streams and events; waits poll cuStreamQuery/cuEventQuery with a timeout.
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html>,
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html>.

use super::conv::check;
use super::device::CudaDevice;
use crate::{deferred, poll_until, Result};
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
        let r = self.dev.bind().and_then(|_| {
            check("cuStreamDestroy", unsafe {
                sys::cuStreamDestroy_v2(self.raw)
            })
        });
        if let Err(e) = r {
            deferred::record(e);
        }
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: raw was created by cuEventCreate and is destroyed once.
        let r = self.dev.bind().and_then(|_| {
            check("cuEventDestroy", unsafe {
                sys::cuEventDestroy_v2(self.raw)
            })
        });
        if let Err(e) = r {
            deferred::record(e);
        }
    }
}

pub(super) fn create_stream(dev: &CudaDevice) -> Result<CudaStream> {
    dev.bind()?;
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: valid out pointer; context current.
    check("cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
    })?;
    Ok(CudaStream {
        dev: dev.clone(),
        raw: s,
    })
}

fn ready(op: &'static str, r: sys::CUresult) -> Result<bool> {
    if r == sys::CUresult::CUDA_ERROR_NOT_READY {
        Ok(false)
    } else {
        check(op, r).map(|_| true)
    }
}

pub(super) fn stream_synchronize(s: &CudaStream, timeout: Duration) -> Result<()> {
    s.dev.bind()?;
    // SAFETY: live stream.
    poll_until("cuStreamSynchronize", timeout, || {
        ready("cuStreamQuery", unsafe { sys::cuStreamQuery(s.raw) })
    })
}

pub(super) fn create_event(dev: &CudaDevice) -> Result<CudaEvent> {
    dev.bind()?;
    let mut e: sys::CUevent = std::ptr::null_mut();
    // SAFETY: valid out pointer; context current.
    check("cuEventCreate", unsafe {
        sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
    })?;
    Ok(CudaEvent {
        dev: dev.clone(),
        raw: e,
    })
}

pub(super) fn record(e: &CudaEvent, s: &CudaStream) -> Result<()> {
    e.dev.bind()?;
    // SAFETY: live event and stream.
    check("cuEventRecord", unsafe { sys::cuEventRecord(e.raw, s.raw) })
}

pub(super) fn event_synchronize(e: &CudaEvent, timeout: Duration) -> Result<()> {
    e.dev.bind()?;
    // SAFETY: live event.
    poll_until("cuEventSynchronize", timeout, || {
        ready("cuEventQuery", unsafe { sys::cuEventQuery(e.raw) })
    })
}

pub(super) fn elapsed_ms(start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
    start.dev.bind()?;
    let mut ms = 0f32;
    // SAFETY: valid out pointer; live events.
    check("cuEventElapsedTime", unsafe {
        sys::cuEventElapsedTime_v2(&mut ms, start.raw, end.raw)
    })?;
    Ok(ms)
}
