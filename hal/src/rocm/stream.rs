//! ROCm streams and events, and the work enqueued on a stream; waits poll
//! hipStreamQuery/hipEventQuery with a timeout ([`crate::StreamApi`] for [`Rocm`]).

use super::device::RocmDevice;
use super::result::{event, mem, stream};
use super::sys::{HipEvent, HipStream};
use super::Rocm;

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

// Thread-safe: HIP stream/event handles may be used from any thread.
owned_handle!(RocmStream, stream::destroy);
owned_handle!(RocmEvent, event::destroy);

gpu_stream_api! { Rocm, RocmDevice, RocmStream("hipStreamSynchronize"),
RocmEvent("hipEventSynchronize"), mem::set_async }
