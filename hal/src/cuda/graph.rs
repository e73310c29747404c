//! CUDA stream interop and graphs: a borrowed CUstream, cuStreamIsCapturing, capture in
//! thread-local mode, cuGraphInstantiateWithFlags, cuGraphLaunch (driver calls through
//! `result/graph.rs`). <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html>

use std::mem::ManuallyDrop;

use super::result::graph;
use super::{Cuda, CudaDevice, CudaStream};
use crate::auxil::deferred;
use crate::graph::StreamInterop;
use crate::Result;
use cudarc::driver::sys;

/// An instantiated CUDA graph (and the graph it came from); destroyed on drop.
#[derive(Debug)]
pub struct CudaGraph {
    dev: CudaDevice,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// Thread-safe: graph handles may be used from any thread (launches are serialised by the caller).
thread_safe!(CudaGraph);

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: both handles were created by end_capture and are destroyed once.
        deferred::release(self.dev.bind(), || unsafe {
            let a = graph::exec_destroy(self.exec);
            let b = graph::destroy(self.graph);
            a.and(b)
        });
    }
}

impl StreamInterop for Cuda {
    type Graph = CudaGraph;
    unsafe fn borrow_stream(dev: &CudaDevice, raw: u64) -> ManuallyDrop<CudaStream> {
        ManuallyDrop::new(CudaStream {
            dev: dev.clone(),
            raw: raw as usize as sys::CUstream,
        })
    }
    fn raw_stream(stream: &CudaStream) -> u64 {
        stream.raw as usize as u64
    }
    fn is_capturing(stream: &CudaStream) -> Result<bool> {
        stream.dev.enter()?;
        // SAFETY: a live (or borrowed live) stream.
        unsafe { graph::is_capturing(stream.raw) }
    }
    fn begin_capture(stream: &CudaStream) -> Result<()> {
        stream.dev.enter()?;
        // SAFETY: a live stream.
        unsafe { graph::begin_capture(stream.raw) }
    }
    fn end_capture(stream: &CudaStream) -> Result<CudaGraph> {
        stream.dev.enter()?;
        // SAFETY: a live stream in capture.
        let g = unsafe { graph::end_capture(stream.raw) }?;
        // SAFETY: g was just created.
        match unsafe { graph::instantiate(g) } {
            Ok(exec) => Ok(CudaGraph {
                dev: stream.dev.clone(),
                graph: g,
                exec,
            }),
            Err(e) => {
                // SAFETY: the graph is ours and not used afterwards.
                let _ = unsafe { graph::destroy(g) };
                Err(e)
            }
        }
    }
    fn launch_graph(g: &CudaGraph, stream: &CudaStream) -> Result<()> {
        stream.dev.enter()?;
        // SAFETY: live graph exec and stream.
        unsafe { graph::launch(g.exec, stream.raw) }
    }
    fn relax_capture_mode() -> Result<u32> {
        graph::exchange_capture_mode(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map(|m| m as u32)
    }
    fn restore_capture_mode(previous: u32) -> Result<()> {
        let mode = match previous {
            0 => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            1 => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            _ => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        graph::exchange_capture_mode(mode).map(|_| ())
    }
}
