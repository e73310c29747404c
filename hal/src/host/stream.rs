//! Host streams (every operation completes before it returns) and wall-clock events
//! ([`crate::StreamApi`] for [`Host`]).

use super::{Host, HostDevice};
use crate::{Error, Result, StreamApi};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A host stream: work submitted to it is already done.
#[derive(Debug, Default)]
pub struct HostStream;

/// A host event: the instant of its last record.
#[derive(Debug, Default)]
pub struct HostEvent {
    at: Mutex<Option<Instant>>,
}

impl HostEvent {
    fn record(&self) {
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }
    fn instant(&self) -> Option<Instant> {
        *self.at.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl StreamApi for Host {
    fn create_stream(_dev: &HostDevice) -> Result<HostStream> {
        HostDevice::enter()?;
        Ok(HostStream)
    }
    fn stream_synchronize(_stream: &HostStream, _timeout: Duration) -> Result<()> {
        HostDevice::enter()
    }
    fn create_event(_dev: &HostDevice) -> Result<HostEvent> {
        HostDevice::enter()?;
        Ok(HostEvent::default())
    }
    fn record_event(event: &HostEvent, _stream: &HostStream) -> Result<()> {
        HostDevice::enter()?;
        event.record();
        Ok(())
    }
    fn event_synchronize(_event: &HostEvent, _timeout: Duration) -> Result<()> {
        HostDevice::enter()
    }
    fn event_elapsed_ms(start: &HostEvent, end: &HostEvent) -> Result<f32> {
        HostDevice::enter()?;
        match (start.instant(), end.instant()) {
            (Some(s), Some(e)) => Ok(e.saturating_duration_since(s).as_secs_f32() * 1000.0),
            _ => Err(Error::invalid(
                "event_elapsed_ms(host)",
                "two recorded events",
                "an event never recorded",
            )),
        }
    }
    unsafe fn memset_async(_stream: &HostStream, dst: u64, value: u8, len: usize) -> Result<()> {
        HostDevice::enter()?;
        // SAFETY: the caller guarantees dst..dst+len is live memory (host addresses here).
        unsafe { std::ptr::write_bytes(dst as usize as *mut u8, value, len) };
        Ok(())
    }
    unsafe fn memcpy_async(_stream: &HostStream, dst: u64, src: u64, len: usize) -> Result<()> {
        HostDevice::enter()?;
        // SAFETY: the caller guarantees both ranges are live and do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src as usize as *const u8, dst as usize as *mut u8, len)
        };
        Ok(())
    }
    unsafe fn write_value64_async(_stream: &HostStream, dst: u64, value: u64) -> Result<()> {
        HostDevice::enter()?;
        // SAFETY: the caller guarantees an aligned, live u64 that others access atomically.
        let atom = unsafe { AtomicU64::from_ptr(dst as usize as *mut u64) };
        atom.store(value, Ordering::Release);
        Ok(())
    }
}
