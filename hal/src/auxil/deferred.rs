//! Failures recorded inside `Drop` (frees, unmaps): logged at once, surfaced by the next
//! `device_count` / `open_device` (see the crate doc for why no other call returns them).

use crate::{Error, Result};
use std::sync::Mutex;

static PENDING: Mutex<Vec<Error>> = Mutex::new(Vec::new());

/// Records a failure that happened where it could not be returned (inside `Drop`).
pub(crate) fn record(err: Error) {
    log::warn!(target: "mscclpp::hal", "failure in a destructor (surfaced by the next device_count/open_device): {err}");
    // A poisoned lock only means another thread panicked while pushing; the Vec is still valid.
    let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    pending.push(err);
}

/// The body of a GPU handle's `Drop`: once `bind` (making the owning device current) succeeded,
/// runs `release` (the driver's free/destroy call); a failure of either is [`record`]ed.
#[cfg(any(hal_cuda, hal_rocm))]
pub(crate) fn release(bind: Result<()>, release: impl FnOnce() -> Result<()>) {
    if let Err(e) = bind.and_then(|()| release()) {
        record(e);
    }
}

/// Returns the oldest recorded drop-time failure, if any, as [`Error::Deferred`].
pub(crate) fn check() -> Result<()> {
    let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    if pending.is_empty() {
        Ok(())
    } else {
        Err(Error::Deferred(Box::new(pending.remove(0))))
    }
}

/// Takes every recorded drop-time failure (for callers that want to inspect them all).
pub fn take_deferred_errors() -> Vec<Error> {
    let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    std::mem::take(&mut *pending)
}
