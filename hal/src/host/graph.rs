//! Stream interop of the host backend: every stream is the same completed-work stream; graphs
//! are unsupported (work completes before it returns, so there is nothing to capture).

use std::mem::ManuallyDrop;

use super::{Host, HostDevice, HostStream};
use crate::graph::StreamInterop;

/// Never constructed: the host backend has no graphs.
#[derive(Debug)]
pub struct HostGraph(());

impl StreamInterop for Host {
    type Graph = HostGraph;
    unsafe fn borrow_stream(_dev: &HostDevice, _raw: u64) -> ManuallyDrop<HostStream> {
        ManuallyDrop::new(HostStream)
    }
    fn raw_stream(_stream: &HostStream) -> u64 {
        0
    }
    no_graph_capture!(
        "host",
        "host streams complete every operation at once; there is no graph to capture",
        HostStream,
        HostGraph
    );
}
