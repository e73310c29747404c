//! ROCm stream interop: a borrowed hipStream_t. Graph capture is not wired up on this
//! backend yet (it needs hipStreamBeginCapture & co. in the run-time function table).

use std::mem::ManuallyDrop;

use super::{Rocm, RocmDevice, RocmStream};
use crate::graph::StreamInterop;

/// Never constructed: graph capture is not wired up on ROCm yet.
#[derive(Debug)]
pub struct RocmGraph(());

impl StreamInterop for Rocm {
    type Graph = RocmGraph;
    unsafe fn borrow_stream(dev: &RocmDevice, raw: u64) -> ManuallyDrop<RocmStream> {
        ManuallyDrop::new(RocmStream {
            dev: *dev,
            raw: raw as usize as *mut std::ffi::c_void,
        })
    }
    fn raw_stream(stream: &RocmStream) -> u64 {
        stream.raw as usize as u64
    }
    no_graph_capture!(
        "rocm",
        "HIP graph capture is not wired up in this backend yet",
        RocmStream,
        RocmGraph
    );
}
