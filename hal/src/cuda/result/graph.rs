//! Stream capture and graphs. <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html>,
//! capture state <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html>

use super::*;

/// `cuStreamIsCapturing`: whether `s` is being captured.
///
/// # Safety
/// `s` is a live stream or null (the legacy default stream).
pub(in crate::cuda) unsafe fn is_capturing(s: sys::CUstream) -> Result<bool> {
    // SAFETY: valid out pointer; the caller vouches for the stream.
    let status = checked_out(
        "cuStreamIsCapturing",
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
        |status| unsafe { sys::cuStreamIsCapturing(s, status) },
    )?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// `cuThreadExchangeStreamCaptureMode`: sets this thread's capture mode to `mode`, returns
/// the previous one.
pub(in crate::cuda) fn exchange_capture_mode(
    mode: sys::CUstreamCaptureMode,
) -> Result<sys::CUstreamCaptureMode> {
    let mut m = mode;
    // SAFETY: a valid in/out pointer; no context needed.
    checked("cuThreadExchangeStreamCaptureMode", || unsafe {
        sys::cuThreadExchangeStreamCaptureMode(&mut m)
    })?;
    Ok(m)
}

/// `cuStreamBeginCapture(s, THREAD_LOCAL)`.
///
/// # Safety
/// `s` is a live stream.
pub(in crate::cuda) unsafe fn begin_capture(s: sys::CUstream) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuStreamBeginCapture", || unsafe {
        sys::cuStreamBeginCapture_v2(
            s,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    })
}

/// `cuStreamEndCapture`: the captured graph (the caller destroys it).
///
/// # Safety
/// `s` is a live stream in capture.
pub(in crate::cuda) unsafe fn end_capture(s: sys::CUstream) -> Result<sys::CUgraph> {
    // SAFETY: valid out pointer; the caller vouches for the stream.
    checked_out("cuStreamEndCapture", std::ptr::null_mut(), |graph| unsafe {
        sys::cuStreamEndCapture(s, graph)
    })
}

/// `cuGraphInstantiateWithFlags(graph, 0)`.
///
/// # Safety
/// `graph` is live.
pub(in crate::cuda) unsafe fn instantiate(graph: sys::CUgraph) -> Result<sys::CUgraphExec> {
    // SAFETY: valid out pointer; the caller vouches for the graph.
    checked_out(
        "cuGraphInstantiateWithFlags",
        std::ptr::null_mut(),
        |exec| unsafe { sys::cuGraphInstantiateWithFlags(exec, graph, 0) },
    )
}

/// `cuGraphLaunch(exec, s)`.
///
/// # Safety
/// `exec` and `s` are live.
pub(in crate::cuda) unsafe fn launch(exec: sys::CUgraphExec, s: sys::CUstream) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuGraphLaunch", || unsafe { sys::cuGraphLaunch(exec, s) })
}

/// `cuGraphExecDestroy`.
///
/// # Safety
/// `exec` came from [`instantiate`] and is destroyed once.
pub(in crate::cuda) unsafe fn exec_destroy(exec: sys::CUgraphExec) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuGraphExecDestroy", || unsafe {
        sys::cuGraphExecDestroy(exec)
    })
}

/// `cuGraphDestroy`.
///
/// # Safety
/// `graph` came from [`end_capture`] and is destroyed once.
pub(in crate::cuda) unsafe fn destroy(graph: sys::CUgraph) -> Result<()> {
    // SAFETY: forwarded from the caller.
    checked("cuGraphDestroy", || unsafe { sys::cuGraphDestroy(graph) })
}
