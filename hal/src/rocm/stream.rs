//! ROCm streams and events; waits poll hipStreamQuery/hipEventQuery with a timeout.

use super::conv::{check, hip, HipEvent, HipStream, HIP_ERROR_NOT_READY};
use super::device::RocmDevice;
use crate::{deferred, poll_until, Result};
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
        let r = hip().and_then(|h| {
            self.dev.bind().and_then(|_| {
                check("hipStreamDestroy", unsafe {
                    (h.hipStreamDestroy)(self.raw)
                })
            })
        });
        if let Err(e) = r {
            deferred::record(e);
        }
    }
}

impl Drop for RocmEvent {
    fn drop(&mut self) {
        // SAFETY: raw came from hipEventCreate and is destroyed once.
        let r = hip().and_then(|h| {
            self.dev
                .bind()
                .and_then(|_| check("hipEventDestroy", unsafe { (h.hipEventDestroy)(self.raw) }))
        });
        if let Err(e) = r {
            deferred::record(e);
        }
    }
}

fn ready(op: &'static str, rc: i32) -> Result<bool> {
    if rc == HIP_ERROR_NOT_READY {
        Ok(false)
    } else {
        check(op, rc).map(|_| true)
    }
}

pub(super) fn create_stream(dev: &RocmDevice) -> Result<RocmStream> {
    let h = hip()?;
    dev.bind()?;
    let mut s: HipStream = std::ptr::null_mut();
    // SAFETY: valid out pointer; 1 = hipStreamNonBlocking.
    check("hipStreamCreateWithFlags", unsafe {
        (h.hipStreamCreateWithFlags)(&mut s, 1)
    })?;
    Ok(RocmStream { dev: *dev, raw: s })
}

pub(super) fn stream_synchronize(s: &RocmStream, timeout: Duration) -> Result<()> {
    let h = hip()?;
    s.dev.bind()?;
    // SAFETY: live stream.
    poll_until("hipStreamSynchronize", timeout, || {
        ready("hipStreamQuery", unsafe { (h.hipStreamQuery)(s.raw) })
    })
}

pub(super) fn create_event(dev: &RocmDevice) -> Result<RocmEvent> {
    let h = hip()?;
    dev.bind()?;
    let mut e: HipEvent = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    check("hipEventCreate", unsafe { (h.hipEventCreate)(&mut e) })?;
    Ok(RocmEvent { dev: *dev, raw: e })
}

pub(super) fn record(e: &RocmEvent, s: &RocmStream) -> Result<()> {
    let h = hip()?;
    e.dev.bind()?;
    // SAFETY: live event and stream.
    check("hipEventRecord", unsafe {
        (h.hipEventRecord)(e.raw, s.raw)
    })
}

pub(super) fn event_synchronize(e: &RocmEvent, timeout: Duration) -> Result<()> {
    let h = hip()?;
    e.dev.bind()?;
    // SAFETY: live event.
    poll_until("hipEventSynchronize", timeout, || {
        ready("hipEventQuery", unsafe { (h.hipEventQuery)(e.raw) })
    })
}

pub(super) fn elapsed_ms(start: &RocmEvent, end: &RocmEvent) -> Result<f32> {
    let h = hip()?;
    let mut ms = 0f32;
    // SAFETY: valid out pointer; live events.
    check("hipEventElapsedTime", unsafe {
        (h.hipEventElapsedTime)(&mut ms, start.raw, end.raw)
    })?;
    Ok(ms)
}

pub(super) fn device_synchronize(dev: &RocmDevice, timeout: Duration) -> Result<()> {
    // hipDeviceSynchronize has no timeout: run it on a helper thread and stop waiting at the limit.
    let d = *dev;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("mscclpp-hal-hipsync".into())
        .spawn(move || {
            // SAFETY: hipDeviceSynchronize has no preconditions beyond a current device.
            let r = hip().and_then(|h| {
                d.bind().and_then(|_| {
                    check("hipDeviceSynchronize", unsafe {
                        (h.hipDeviceSynchronize)()
                    })
                })
            });
            let _ = tx.send(r);
        })
        .map_err(|source| crate::Error::Os {
            op: "spawn device sync thread",
            source,
        })?;
    rx.recv_timeout(timeout)
        .unwrap_or(Err(crate::Error::Timeout {
            op: "hipDeviceSynchronize",
            waited: timeout,
        }))
}
