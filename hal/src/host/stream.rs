//! Host streams (every operation completes before it returns) and wall-clock events.

use crate::{Error, Result};
use std::sync::Mutex;
use std::time::Instant;

/// A host stream: work submitted to it is already done.
#[derive(Debug, Default)]
pub struct HostStream;

/// A host event: the instant of its last record.
#[derive(Debug, Default)]
pub struct HostEvent {
    at: Mutex<Option<Instant>>,
}

impl HostEvent {
    pub(super) fn record(&self) {
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }
    fn instant(&self) -> Option<Instant> {
        *self.at.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(super) fn elapsed_ms(start: &HostEvent, end: &HostEvent) -> Result<f32> {
    match (start.instant(), end.instant()) {
        (Some(s), Some(e)) => Ok(e.saturating_duration_since(s).as_secs_f32() * 1000.0),
        _ => Err(Error::invalid(
            "event_elapsed_ms(host)",
            "two recorded events",
            "an event never recorded",
        )),
    }
}
