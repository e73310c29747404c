//! Caller-owned streams and CUDA-graph capture: wrapping a raw `CUstream` / `hipStream_t`
//! without taking ownership (collectives launch on the caller's stream), asking whether a
//! stream is capturing, and capturing + replaying a graph (tests and benchmarks).

use std::mem::ManuallyDrop;

use crate::{Api, Result};

/// Stream interop and graphs of a backend.
pub trait StreamInterop: Api {
    /// An instantiated, launchable graph; destroyed on drop.
    type Graph: Send + Sync + std::fmt::Debug;

    /// Wraps the raw stream handle `raw` (0 = the legacy default stream) of `dev` without
    /// owning it: the wrapper must never be dropped as a stream (it is `ManuallyDrop`).
    ///
    /// # Safety
    /// `raw` is 0 or a live stream of `dev`'s context that outlives every use of the wrapper.
    unsafe fn borrow_stream(dev: &Self::Device, raw: u64) -> ManuallyDrop<Self::Stream>;
    /// The raw handle of a stream (for passing to [`StreamInterop::borrow_stream`]).
    fn raw_stream(stream: &Self::Stream) -> u64;
    /// Whether `stream` is being captured into a graph.
    fn is_capturing(stream: &Self::Stream) -> Result<bool>;
    /// Starts capturing `stream` (thread-local mode).
    fn begin_capture(stream: &Self::Stream) -> Result<()>;
    /// Ends the capture and instantiates the graph.
    fn end_capture(stream: &Self::Stream) -> Result<Self::Graph>;
    /// Launches an instantiated graph on `stream`.
    fn launch_graph(graph: &Self::Graph, stream: &Self::Stream) -> Result<()>;
    /// Sets this thread's stream-capture mode to relaxed and returns the previous mode for
    /// [`StreamInterop::restore_capture_mode`]: driver calls that are no stream work (exporting
    /// and mapping memory for a registration) are then allowed while a stream of any thread
    /// captures in global mode, as NCCL does around its graph registrations. Backends without
    /// graph capture have nothing to relax (0).
    fn relax_capture_mode() -> Result<u32> {
        Ok(0)
    }
    /// Restores the mode [`StreamInterop::relax_capture_mode`] returned.
    fn restore_capture_mode(_previous: u32) -> Result<()> {
        Ok(())
    }
}
