//! Broadcast `hier_allreduce` (worlds spanning nodes): the broadcast as an all-reduce of bytes.
//! Every rank but the root zeroes its output, then all ranks run the hierarchical all-reduce
//! (`hier_rsag_port`: memory channels inside each node, port channels between nodes) of the
//! buffer as `u8` with sum, the root from its input. Each output byte is the root's byte plus
//! zeros, so the result is the root's buffer bit for bit (any type, NaN payloads and negative
//! zeros included; a `u8` sum never rounds).
//!
//! It moves about twice the bytes of a tree broadcast (a reduce-scatter and an all-gather
//! phase, the network phase carrying each shard once), with the all-reduce's three-phase
//! latency; it exists so that broadcast runs natively across nodes (PyTorch broadcasts the
//! parameters at start-up and in DDP) instead of needing a fallback NCCL. A dedicated
//! pipelined tree is the follow-up.

use super::super::algorithm::{native_algorithm, Call};
use super::super::allreduce::hier_rsag_port::HierRsagPort;
use super::super::setup::Resources;
use super::super::types::{CollectiveKind, DataType, ReduceOp};
use crate::memory::hal_err;
use mscclpp_hal::{prelude::*, Gpu, StreamInterop};

/// The algorithm object.
pub struct HierAllreduce;

/// The all-reduce this rank runs for the broadcast `call`: bytes, sum, in place on non-roots
/// (their input is the zeroed output).
fn as_allreduce(res: &Resources, call: &Call) -> Call {
    Call {
        kind: CollectiveKind::AllReduce,
        send: if res.rank() == call.root {
            call.send
        } else {
            call.recv
        },
        recv: call.recv,
        count: call.bytes(),
        dtype: DataType::U8,
        op: ReduceOp::Sum,
        root: 0,
    }
}

native_algorithm! {
    HierAllreduce: "hier_allreduce", Broadcast, multi_node = true;
    check(self, res, call) {
        HierRsagPort.check(res, &as_allreduce(res, call))
    }

    launch_gpu(self, res, gpu, call, stream) {
        if res.rank() != call.root {
            // SAFETY: the caller's live stream (or 0) of this device.
            let s = unsafe { Gpu::borrow_stream(gpu.device(), stream) };
            // SAFETY: the output holds `bytes` and stays valid until the stream ran the call.
            unsafe { Gpu::memset_async(&s, call.recv, 0, call.bytes()) }
                .map_err(|e| hal_err("broadcast hier_allreduce: zeroing the output", e))?;
        }
        HierRsagPort.launch_gpu(res, gpu, &as_allreduce(res, call), stream)
    }

    run_host(self, res, call) {
        if res.rank() != call.root {
            // SAFETY: the output is a live host buffer of `bytes` (the collective's contract).
            unsafe { std::ptr::write_bytes(call.recv as usize as *mut u8, 0, call.bytes()) };
        }
        HierRsagPort.run_host(res, &as_allreduce(res, call))
    }
}
