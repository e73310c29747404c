//! Stream interop of the host backend: every stream is the same completed-work stream; graphs
//! are unsupported (work completes before it returns, so there is nothing to capture).

use std::mem::ManuallyDrop;

use super::{Host, HostDevice, HostStream};
use crate::graph::StreamInterop;
use crate::{Error, Result};

/// Never constructed: the host backend has no graphs.
#[derive(Debug)]
pub struct HostGraph(());

fn unsupported<T>(op: &'static str) -> Result<T> {
    Err(Error::Unsupported {
        op,
        backend: "host",
        reason: "host streams complete every operation at once; there is no graph to capture"
            .into(),
    })
}

impl StreamInterop for Host {
    type Graph = HostGraph;
    unsafe fn borrow_stream(_dev: &HostDevice, _raw: u64) -> ManuallyDrop<HostStream> {
        ManuallyDrop::new(HostStream)
    }
    fn raw_stream(_stream: &HostStream) -> u64 {
        0
    }
    fn is_capturing(_stream: &HostStream) -> Result<bool> {
        Ok(false)
    }
    fn begin_capture(_stream: &HostStream) -> Result<()> {
        unsupported("begin_capture")
    }
    fn end_capture(_stream: &HostStream) -> Result<HostGraph> {
        unsupported("end_capture")
    }
    fn launch_graph(_graph: &HostGraph, _stream: &HostStream) -> Result<()> {
        unsupported("launch_graph")
    }
}
