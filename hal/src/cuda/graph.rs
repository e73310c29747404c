//! CUDA stream interop and graphs: a borrowed CUstream, cuStreamIsCapturing, capture in
//! thread-local mode, cuGraphInstantiateWithFlags, cuGraphLaunch.
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html>

use std::mem::ManuallyDrop;

use super::result::checked;
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

// SAFETY: graph handles may be used from any thread (launches are serialised by the caller).
unsafe impl Send for CudaGraph {}
// SAFETY: as above.
unsafe impl Sync for CudaGraph {}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: both handles were created by end_capture and are destroyed once.
        let r = self.dev.bind().and_then(|_| {
            checked("cuGraphExecDestroy", || unsafe {
                sys::cuGraphExecDestroy(self.exec)
            })?;
            checked("cuGraphDestroy", || unsafe {
                sys::cuGraphDestroy(self.graph)
            })
        });
        if let Err(e) = r {
            deferred::record(e);
        }
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
        deferred::check()?;
        stream.dev.bind()?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: live stream, valid out pointer.
        checked("cuStreamIsCapturing", || unsafe {
            sys::cuStreamIsCapturing(stream.raw, &mut status)
        })?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
    fn begin_capture(stream: &CudaStream) -> Result<()> {
        deferred::check()?;
        stream.dev.bind()?;
        // SAFETY: live stream.
        checked("cuStreamBeginCapture", || unsafe {
            sys::cuStreamBeginCapture_v2(
                stream.raw,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }
    fn end_capture(stream: &CudaStream) -> Result<CudaGraph> {
        deferred::check()?;
        stream.dev.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: live stream in capture, valid out pointer.
        checked("cuStreamEndCapture", || unsafe {
            sys::cuStreamEndCapture(stream.raw, &mut graph)
        })?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: graph was just created; valid out pointer.
        let r = checked("cuGraphInstantiateWithFlags", || unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
        });
        if let Err(e) = r {
            // SAFETY: the graph is ours and not used afterwards.
            unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(CudaGraph {
            dev: stream.dev.clone(),
            graph,
            exec,
        })
    }
    fn launch_graph(graph: &CudaGraph, stream: &CudaStream) -> Result<()> {
        deferred::check()?;
        stream.dev.bind()?;
        // SAFETY: live graph exec and stream.
        checked("cuGraphLaunch", || unsafe {
            sys::cuGraphLaunch(graph.exec, stream.raw)
        })
    }
}
