//! The executor's `#[repr(C)]` device structs (core/src/executor/lower/device.rs) equal the C
//! structs of kernels/cuda/include/mscclpp/executor_device.hpp: compiles
//! kernels/cuda/tests/executor_layout_dump.cpp with the host C++ compiler (`$CXX`, else `c++`),
//! runs it, and compares every size, alignment, field offset and a few operation codes.

use std::collections::HashMap;
use std::mem::{align_of, offset_of, size_of};

use mscclpp::executor::device::{
    op, ExecArgs, ExecBlock, ExecOp, ASYNC_ROUNDS, CHANNEL_SWITCH, EXEC_BLOCK_HEADER_BYTES,
    LANE_WORDS, OP_LANE_ASYNC, OP_LANE_LOCAL, REF_SWITCH, TRACE_HEADER_WORDS, TRACE_WORDS,
};

#[path = "common/cpp_dump.rs"]
mod cpp_dump;

fn dump() -> HashMap<String, usize> {
    let out = cpp_dump::run("executor_layout_dump");
    let mut m = HashMap::new();
    for l in out.lines() {
        let p: Vec<&str> = l.split_whitespace().collect();
        if p.len() == 3 {
            let v = p[2].parse().unwrap_or_else(|e| panic!("line `{l}`: {e}"));
            m.insert(format!("{} {}", p[0], p[1]), v);
        }
    }
    m
}

#[test]
fn executor_structs_match_the_c_header() {
    let m = dump();
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("the dump has no `{k}`"));
    macro_rules! size {
        ($t:ty, $c:literal) => {
            assert_eq!(size_of::<$t>(), get(concat!($c, " size")), "{} size", $c);
            assert_eq!(align_of::<$t>(), get(concat!($c, " align")), "{} align", $c);
        };
    }
    macro_rules! field {
        ($t:ty, $f:ident, $c:literal) => {
            assert_eq!(offset_of!($t, $f), get(concat!($c, " offset")), "{}", $c);
        };
    }
    size!(ExecOp, "ExecOp");
    assert_eq!(size_of::<ExecOp>(), 256);
    field!(ExecOp, op_type, "ExecOp.opType");
    field!(ExecOp, channel_type, "ExecOp.channelType");
    field!(ExecOp, n_channels, "ExecOp.nChannels");
    field!(ExecOp, n_inputs, "ExecOp.nInputs");
    field!(ExecOp, n_outputs, "ExecOp.nOutputs");
    field!(ExecOp, reduce_op, "ExecOp.reduceOp");
    field!(ExecOp, n_semaphores, "ExecOp.nSemaphores");
    field!(ExecOp, flags, "ExecOp.flags");
    field!(ExecOp, channels, "ExecOp.channels");
    field!(ExecOp, input_refs, "ExecOp.inputRefs");
    field!(ExecOp, output_refs, "ExecOp.outputRefs");
    field!(ExecOp, input_types, "ExecOp.inputTypes");
    field!(ExecOp, output_types, "ExecOp.outputTypes");
    field!(ExecOp, semaphore_ids, "ExecOp.semaphoreIds");
    field!(ExecOp, input_offsets, "ExecOp.inputOffsets");
    field!(ExecOp, input_sizes, "ExecOp.inputSizes");
    field!(ExecOp, output_offsets, "ExecOp.outputOffsets");
    field!(ExecOp, output_sizes, "ExecOp.outputSizes");
    field!(ExecOp, barrier_id, "ExecOp.barrierId");
    field!(ExecOp, n_blocks, "ExecOp.nBlocks");
    field!(ExecOp, unit_size, "ExecOp.unitSize");
    field!(ExecOp, n_iterations, "ExecOp.nIterations");
    field!(ExecOp, n_inner, "ExecOp.nInner");

    size!(ExecBlock, "ExecBlock");
    field!(ExecBlock, n_ops, "ExecBlock.nOps");
    field!(ExecBlock, n_memory_channels, "ExecBlock.nMemoryChannels");
    field!(ExecBlock, n_port_channels, "ExecBlock.nPortChannels");
    field!(ExecBlock, memory_channels, "ExecBlock.memoryChannels");
    field!(ExecBlock, port_channels, "ExecBlock.portChannels");
    field!(ExecBlock, memory_buffers, "ExecBlock.memoryBuffers");
    field!(ExecBlock, port_buffers, "ExecBlock.portBuffers");
    field!(
        ExecBlock,
        memory_buffer_halves,
        "ExecBlock.memoryBufferHalves"
    );
    field!(ExecBlock, port_buffer_halves, "ExecBlock.portBufferHalves");
    field!(ExecBlock, ops, "ExecBlock.ops");
    assert_eq!(
        EXEC_BLOCK_HEADER_BYTES,
        get("EXEC_BLOCK_HEADER_BYTES value")
    );
    assert_eq!(
        EXEC_BLOCK_HEADER_BYTES % 16,
        0,
        "the kernel copies the header in 16-byte words"
    );

    size!(ExecArgs, "ExecArgs");
    field!(ExecArgs, blocks, "ExecArgs.blocks");
    field!(ExecArgs, input, "ExecArgs.input");
    field!(ExecArgs, output, "ExecArgs.output");
    field!(ExecArgs, scratch, "ExecArgs.scratch");
    field!(ExecArgs, scratch_half, "ExecArgs.scratchHalf");
    field!(ExecArgs, reuse_chunk, "ExecArgs.reuseChunk");
    field!(ExecArgs, flags, "ExecArgs.flags");
    field!(ExecArgs, barriers, "ExecArgs.barriers");
    field!(ExecArgs, semaphores, "ExecArgs.semaphores");
    field!(ExecArgs, dtype, "ExecArgs.dtype");
    field!(ExecArgs, packet, "ExecArgs.packet");
    field!(ExecArgs, nblocks, "ExecArgs.nBlocks");
    field!(ExecArgs, lanes, "ExecArgs.lanes");
    field!(ExecArgs, trace, "ExecArgs.trace");
    field!(ExecArgs, lane_sync, "ExecArgs.laneSync");
    assert_eq!(LANE_WORDS, get("EXEC_LANE_WORDS value"));
    assert_eq!(TRACE_WORDS, get("EXEC_TRACE_WORDS value"));
    assert_eq!(TRACE_HEADER_WORDS, get("EXEC_TRACE_HEADER_WORDS value"));

    assert_eq!(usize::from(op::PIPELINE), get("EXEC_PIPELINE value"));
    assert_eq!(usize::from(op::SEM_RELEASE), get("EXEC_SEM_RELEASE value"));
    assert_eq!(
        usize::from(op::GROUP_LOAD_REDUCE),
        get("EXEC_GROUP_LOAD_REDUCE value")
    );
    assert_eq!(
        usize::from(op::GROUP_LOAD_REDUCE_STORE),
        get("EXEC_GROUP_LOAD_REDUCE_STORE value")
    );
    assert_eq!(usize::from(op::GROUP_STORE), get("EXEC_GROUP_STORE value"));
    assert_eq!(usize::from(REF_SWITCH), get("EXEC_REF_SWITCH value"));
    assert_eq!(usize::from(OP_LANE_LOCAL), get("EXEC_OP_LANE_LOCAL value"));
    assert_eq!(usize::from(OP_LANE_ASYNC), get("EXEC_OP_LANE_ASYNC value"));
    assert_eq!(ASYNC_ROUNDS, get("EXEC_ASYNC_ROUNDS value"));
    assert_eq!(
        usize::from(CHANNEL_SWITCH),
        get("EXEC_CHANNEL_SWITCH value")
    );
    assert_eq!(
        usize::from(op::REDUCE_COPY_SEND_PACKETS),
        get("EXEC_REDUCE_COPY_SEND_PACKETS value")
    );
}
