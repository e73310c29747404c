//! ROCm streams and events, and the work enqueued on a stream; waits poll
//! hipStreamQuery/hipEventQuery with a timeout ([`crate::StreamApi`] for [`Rocm`]).

use super::device::RocmDevice;
use super::result::{event, mem, stream};
use super::sys::{HipEvent, HipStream};
use super::Rocm;
use crate::auxil::{deferred, poll_until};
use crate::{Result, StreamApi};
use std::time::Duration;

/// A non-blocking HIP stream; destroyed on drop.
#[derive(Debug)]
pub struct RocmStream {
    pub(super) dev: RocmDevice,
    pub(super) raw: HipStream,
}

/// A HIP event; destroyed on drop.
#[derive(Debug)]
pub struct RocmEvent {
    dev: RocmDevice,
    raw: HipEvent,
}

// SAFETY: HIP stream/event handles may be used from any thread.
unsafe impl Send for RocmStream {}
// SAFETY: as above.
unsafe impl Sync for RocmStream {}
// SAFETY: as above.
unsafe impl Send for RocmEvent {}
// SAFETY: as above.
unsafe impl Sync for RocmEvent {}

impl Drop for RocmStream {
    fn drop(&mut self) {
        // SAFETY: raw came from hipStreamCreateWithFlags and is destroyed once.
        deferred::release(self.dev.bind(), || unsafe { stream::destroy(self.raw) });
    }
}

impl Drop for RocmEvent {
    fn drop(&mut self) {
        // SAFETY: raw came from hipEventCreate and is destroyed once.
        deferred::release(self.dev.bind(), || unsafe { event::destroy(self.raw) });
    }
}

impl StreamApi for Rocm {
    fn create_stream(dev: &RocmDevice) -> Result<RocmStream> {
        dev.enter()?;
        Ok(RocmStream {
            dev: *dev,
            raw: stream::create_non_blocking()?,
        })
    }

    fn stream_synchronize(s: &RocmStream, timeout: Duration) -> Result<()> {
        s.dev.enter()?;
        // SAFETY: the stream is live while `s` is borrowed.
        poll_until("hipStreamSynchronize", timeout, || unsafe {
            stream::query(s.raw)
        })
    }

    fn create_event(dev: &RocmDevice) -> Result<RocmEvent> {
        dev.enter()?;
        Ok(RocmEvent {
            dev: *dev,
            raw: event::create()?,
        })
    }

    fn record_event(e: &RocmEvent, s: &RocmStream) -> Result<()> {
        e.dev.enter()?;
        // SAFETY: both are live while borrowed.
        unsafe { event::record(e.raw, s.raw) }
    }

    fn event_synchronize(e: &RocmEvent, timeout: Duration) -> Result<()> {
        e.dev.enter()?;
        // SAFETY: the event is live while `e` is borrowed.
        poll_until("hipEventSynchronize", timeout, || unsafe {
            event::query(e.raw)
        })
    }

    fn event_elapsed_ms(start: &RocmEvent, end: &RocmEvent) -> Result<f32> {
        start.dev.enter()?;
        // SAFETY: both events are live while borrowed.
        unsafe { event::elapsed_ms(start.raw, end.raw) }
    }

    unsafe fn memset_async(s: &RocmStream, dst: u64, value: u8, len: usize) -> Result<()> {
        s.dev.enter()?;
        // SAFETY: the caller keeps the range alive until the stream is done.
        unsafe { mem::set_async(dst, value, len, s.raw) }
    }

    unsafe fn memcpy_async(s: &RocmStream, dst: u64, src: u64, len: usize) -> Result<()> {
        s.dev.enter()?;
        // SAFETY: the caller keeps both ranges alive until the stream is done.
        unsafe { mem::copy_async(dst, src, len, s.raw) }
    }

    unsafe fn write_value64_async(s: &RocmStream, dst: u64, value: u64) -> Result<()> {
        s.dev.enter()?;
        // SAFETY: the caller keeps the aligned target alive until the stream is done.
        unsafe { stream::write_value64(s.raw, dst, value) }
    }
}
