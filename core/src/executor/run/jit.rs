//! Plans compiled at load time (issue 31): the lowered blocks of one message size become the
//! source of a kernel in which every op is a constant, compiled for the GPU at run time (NVRTC
//! on CUDA, through the HAL's [`ModuleApi::compile_source`]) and launched instead of the
//! interpreter.
//!
//! Why: the interpreter (kernels/cuda/src/executor/executor_body.cuh) decodes each op at run
//! time, copies its block's ops into shared memory first and calls out-of-line op functions;
//! on the H100 that cost about 2.3 us per launch at 1 KiB over the native kernel of the same
//! algorithm (docs/perf.md, round 14). The generated kernel includes the same body with
//! `MSCCLPP_EXECUTOR_JIT`: the op functions are inlined, each op's type, channels, buffer
//! references and counts are literals, so the compiler keeps only the code each op runs; the
//! element type and the packet format are compiled in too. Semantics are the interpreter's by
//! construction (the same functions run).
//!
//! What stays run-time: the byte offsets and sizes of the ops and the pipelines' iteration
//! counts and step sizes ("values", passed in the kernel parameter after the `ExecArgs`), so
//! one compiled kernel serves every message size whose lowered ops have the same structure;
//! the channel and buffer tables (read from the uploaded blocks, as the interpreter does);
//! lanes and lane sync.
//!
//! Blocks with the same op structure share one function; each block's values start at
//! `p.v[p.v[block]]` (the first `nblocks` values are those starts; the functions read value k
//! of their block as `v(k)`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use mscclpp_hal::{prelude::*, Gpu};

use crate::collectives::DataType;
use crate::executor::lower::device::{op, ExecArgs, ExecBlock, ExecOp};

/// The kernel name of every generated source.
pub(crate) const KERNEL_NAME: &str = "executor_jit";

/// The most bytes of values a kernel parameter may carry: the parameter is an `ExecArgs` and the
/// values, and CUDA 12.1+ takes up to 32764 bytes of parameters on Volta and newer. Plans with
/// more fall back to the interpreter.
const MAX_VALUE_BYTES: usize = 32 * 1024 - 256;

/// A generated kernel source and the values of the size it was generated from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Generated {
    /// The CUDA C++ source (also the cache key of its compiled module).
    pub source: String,
    /// The values, in the order the source reads them.
    pub values: Vec<u32>,
}

/// The C++ element type of reductions for `d` (executor_body.cuh's types).
fn elem_type(d: DataType) -> &'static str {
    match d {
        DataType::I8 => "int8_t",
        DataType::U8 => "uint8_t",
        DataType::I32 => "int32_t",
        DataType::U32 => "uint32_t",
        DataType::I64 => "int64_t",
        DataType::U64 => "uint64_t",
        DataType::F16 => "__half",
        DataType::F32 => "float",
        DataType::F64 => "double",
        DataType::Bf16 => "coll::bf16_t",
        DataType::Fp8E4M3 => "__nv_fp8_e4m3",
        DataType::Fp8E5M2 => "__nv_fp8_e5m2",
    }
}

/// Writes `o.<name>[i] = v;` for each non-zero byte of an array field (structure).
fn bytes(out: &mut String, name: &str, arr: &[u8]) {
    for (i, &v) in arr.iter().enumerate() {
        if v != 0 {
            let _ = write!(out, " o.{name}[{i}] = {v};");
        }
    }
}

/// Writes a scalar field when non-zero.
fn scalar(out: &mut String, name: &str, v: u64) {
    if v != 0 {
        let _ = write!(out, " o.{name} = {v};");
    }
}

/// One op as a block of C++ that builds it and runs `step`: structure as literals, the offsets
/// and sizes from the values.
fn op_code(out: &mut String, o: &ExecOp, values: &mut Vec<u32>, off: &str, unit: &str) {
    out.push_str("    {\n      ExecOp o{};");
    scalar(out, "opType", o.op_type.into());
    scalar(out, "channelType", o.channel_type.into());
    scalar(out, "nChannels", o.n_channels.into());
    scalar(out, "nInputs", o.n_inputs.into());
    scalar(out, "nOutputs", o.n_outputs.into());
    scalar(out, "reduceOp", o.reduce_op.into());
    scalar(out, "nSemaphores", o.n_semaphores.into());
    scalar(out, "flags", o.flags.into());
    bytes(out, "channels", &o.channels);
    bytes(out, "inputRefs", &o.input_refs);
    bytes(out, "outputRefs", &o.output_refs);
    bytes(out, "inputTypes", &o.input_types);
    bytes(out, "outputTypes", &o.output_types);
    bytes(out, "semaphoreIds", &o.semaphore_ids);
    scalar(out, "barrierId", o.barrier_id.into());
    scalar(out, "nBlocks", o.n_blocks.into());
    // The entries the op functions read (below max(inputs, outputs)), and any non-zero one past
    // them: every value the interpreter could see reaches the kernel (the rest are 0 in both).
    let arrays = [
        &o.input_offsets,
        &o.input_sizes,
        &o.output_offsets,
        &o.output_sizes,
    ];
    let last_set = arrays
        .iter()
        .filter_map(|a| a.iter().rposition(|&v| v != 0))
        .max()
        .map_or(0, |i| i + 1);
    let live = usize::from(o.n_inputs.max(o.n_outputs))
        .max(last_set)
        .min(o.input_offsets.len());
    for (name, arr) in [
        ("inputOffsets", &o.input_offsets),
        ("inputSizes", &o.input_sizes),
        ("outputOffsets", &o.output_offsets),
        ("outputSizes", &o.output_sizes),
    ] {
        for (i, &v) in arr.iter().enumerate().take(live) {
            let _ = write!(out, "\n      o.{name}[{i}] = v({});", values.len());
            values.push(v);
        }
    }
    // step<type>: only this op type's code is instantiated (executor_body.cuh's execOp).
    let _ = write!(
        out,
        "\n      step<{}>(r, o, {off}, {unit}, st);\n    }}\n",
        o.op_type
    );
}

/// The op structure of one block as a C++ function body, with its values.
fn block_code(b: &ExecBlock) -> (String, Vec<u32>) {
    let mut out = String::new();
    let mut values = Vec::new();
    let n_ops = (b.n_ops as usize).min(b.ops.len());
    let mut i = 0;
    while i < n_ops {
        let o = &b.ops[i];
        if o.op_type == op::PIPELINE {
            // The interpreter's bound on the body (executorRun).
            let n_inner = (o.n_inner as usize).min(n_ops - i - 1);
            let _ = write!(
                out,
                "    {{\n      const uint32_t nIt = v({});\n      const uint64_t unit = v({});\n      for (uint32_t itr = 0; itr < nIt; ++itr) {{\n      const uint64_t off = (uint64_t)itr * unit;\n",
                values.len(),
                values.len() + 1
            );
            values.push(o.n_iterations);
            values.push(o.unit_size);
            for k in 0..n_inner {
                op_code(&mut out, &b.ops[i + 1 + k], &mut values, "off", "unit");
            }
            out.push_str("      }\n    }\n");
            i += 1 + n_inner;
        } else {
            op_code(&mut out, o, &mut values, "0", "~0ull");
            i += 1;
        }
    }
    (out, values)
}

/// The kernel source and values for `blocks` with reductions of `dtype`, packets LL8 when
/// `ll8`, launches of up to `bound` threads per GPU block and lane sync `lane_sync`
/// (`ExecArgs.laneSync`: the kernel compiles only that mode's crossings, besides one lane's);
/// an error with the reason when the plan cannot be compiled (too many values for a kernel
/// parameter).
pub(crate) fn generate(
    blocks: &[Box<ExecBlock>],
    dtype: DataType,
    ll8: bool,
    bound: u32,
    lane_sync: u32,
) -> std::result::Result<Generated, String> {
    let nb = blocks.len();
    // Blocks with the same structure share a function (and a case of the switch).
    let mut bodies: Vec<String> = Vec::new();
    let mut cases: Vec<Vec<usize>> = Vec::new();
    let mut starts = Vec::with_capacity(nb);
    let mut rest: Vec<u32> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (bi, b) in blocks.iter().enumerate() {
        let (body, vals) = block_code(b);
        starts.push(nb + rest.len());
        rest.extend_from_slice(&vals);
        let f = *index.entry(body.clone()).or_insert_with(|| {
            bodies.push(body);
            cases.push(Vec::new());
            bodies.len() - 1
        });
        cases[f].push(bi);
    }
    let mut values: Vec<u32> = Vec::with_capacity(nb + rest.len());
    for s in starts {
        values.push(u32::try_from(s).map_err(|_| "too many values".to_string())?);
    }
    values.extend_from_slice(&rest);
    if values.len() * 4 > MAX_VALUE_BYTES {
        return Err(format!(
            "{} offsets and sizes do not fit a kernel parameter ({} bytes at most)",
            values.len(),
            MAX_VALUE_BYTES
        ));
    }
    let nv = values.len().max(1);
    let unroll = crate::env::env().executor_packet_unroll();
    let mut s = String::new();
    let _ = write!(
        s,
        "// Generated by mscclpp-rs (core/src/executor/run/jit.rs): one execution plan's ops compiled in.\n\
         #define MSCCLPP_EXECUTOR_JIT 1\n\
         #define MSCCLPP_EXECUTOR_JIT_TYPE {}\n\
         #define MSCCLPP_EXECUTOR_JIT_LL8 {}\n\
         #define MSCCLPP_EXECUTOR_JIT_LANE_SYNC {lane_sync}\n\
         #define MSCCLPP_EXECUTOR_PACKET_UNROLL {unroll}\n\
         {}#include \"executor_body.cuh\"\n\n\
         struct JitParams {{\n  ExecArgs a;\n  uint32_t v[{nv}];\n}};\n\n\
         namespace {{\n",
        elem_type(dtype),
        u8::from(ll8),
        // The interpreter's default for launches of up to 256 threads: reductions load the next
        // input while they combine one (executor_prefetch.cu).
        if bound <= 256 {
            "#define MSCCLPP_EXECUTOR_PREFETCH 1\n"
        } else {
            ""
        }
    );
    for (f, body) in bodies.iter().enumerate() {
        let _ = write!(
            s,
            "__device__ __forceinline__ void block{f}(Run& r, LaneState& st, const JitParams& p, uint32_t base) {{\n  const auto v = [&](uint32_t k) {{ return p.v[base + k]; }};\n  (void)v;\n"
        );
        s.push_str(body);
        s.push_str("}\n");
    }
    // `__grid_constant__`: the values are read at run-time indexes (`p.v[pb]`), which made the
    // compiler copy the whole parameter into local memory per thread first (ptxas -v, sm_90:
    // up to 176 bytes of stack); read in place from the parameter space with it.
    let _ = write!(
        s,
        "}}  // namespace\n\n\
         extern \"C\" __global__ void __launch_bounds__({bound}) {KERNEL_NAME}(const __grid_constant__ JitParams p) {{\n  \
         Run r;\n  const uint32_t pb = jitBegin(r, p.a);\n  LaneState st;\n  const uint32_t base = p.v[pb];\n  switch (pb) {{\n"
    );
    for (f, bs) in cases.iter().enumerate() {
        s.push_str("    ");
        for b in bs {
            let _ = write!(s, "case {b}: ");
        }
        let _ = writeln!(s, "block{f}(r, st, p, base); break;");
    }
    s.push_str("    default: break;\n  }\n  runFinish(r, st);\n}\n");
    Ok(Generated { source: s, values })
}

/// The bytes after the `ExecArgs` in a generated kernel's parameter: `values` (little-endian
/// u32s; one 0 where there are none, the C array has at least one) padded to 8 bytes.
pub(crate) fn values_tail(values: &[u32]) -> Vec<u8> {
    let mut out: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    if values.is_empty() {
        out.extend_from_slice(&[0; 4]);
    }
    let head = std::mem::size_of::<ExecArgs>();
    while !(head + out.len()).is_multiple_of(8) {
        out.push(0);
    }
    out
}

/// A compiled kernel (it keeps its module loaded) and the values of the size it runs (what a
/// launch needs).
pub(crate) struct JitLaunch {
    pub kernel: <Gpu as Api>::Kernel,
    /// [`values_tail`] of the size's values.
    pub tail: Vec<u8>,
}

/// A generated kernel's parameter: `args`, then `tail` ([`values_tail`]). Made once per call
/// the executor has not launched just before; a repeated call launches the same bytes again
/// (run/mod.rs, `LastLaunch`), with no heap allocation (issue 28).
pub(crate) fn params(args: &ExecArgs, tail: &[u8]) -> Vec<u8> {
    let head = std::mem::size_of::<ExecArgs>();
    // SAFETY: ExecArgs is a #[repr(C)] struct of integers; its bytes are plain data.
    let args_bytes =
        unsafe { std::slice::from_raw_parts((args as *const ExecArgs).cast::<u8>(), head) };
    let mut buf = Vec::with_capacity(head + tail.len());
    buf.extend_from_slice(args_bytes);
    buf.extend_from_slice(tail);
    buf
}

/// Compiled kernels by source, per GPU context (a failed compile is remembered as `None`, so it
/// is tried once).
#[derive(Default)]
pub(crate) struct JitCache {
    kernels: Mutex<HashMap<String, Option<<Gpu as Api>::Kernel>>>,
}

/// The headers the generated source includes, by the names its includes use (executor_body.cuh
/// includes `<mscclpp/...>` and `"../collectives/common.hpp"`; the mscclpp headers include each
/// other by bare name). The toolkit's own headers (cuda_fp16.h, libcu++) come from its include
/// folder (the HAL finds it).
pub(crate) fn headers() -> Vec<(&'static str, &'static str)> {
    macro_rules! dev {
        ($($f:literal),*) => {
            vec![$(
                (concat!("mscclpp/", $f), include_str!(concat!("../../../../kernels/cuda/include/mscclpp/", $f))),
                ($f, include_str!(concat!("../../../../kernels/cuda/include/mscclpp/", $f))),
            )*]
        };
    }
    let mut h = dev!(
        "atomic_device.hpp",
        "copy_device.hpp",
        "device.hpp",
        "executor_device.hpp",
        "fifo_device.hpp",
        "memory_channel_device.hpp",
        "packet_device.hpp",
        "port_channel_device.hpp",
        "semaphore_device.hpp"
    );
    h.push((
        "../collectives/common.hpp",
        include_str!("../../../../kernels/cuda/src/collectives/common.hpp"),
    ));
    h.push((
        "executor_body.cuh",
        include_str!("../../../../kernels/cuda/src/executor/executor_body.cuh"),
    ));
    h
}

/// Compiles a generated `source` for compute capability `arch` (the HAL's run-time compiler).
pub(crate) fn compile(arch: (u32, u32), source: &str) -> mscclpp_hal::Result<Vec<u8>> {
    Gpu::compile_source(arch, "executor_jit.cu", source, &headers(), &[])
}

impl JitCache {
    /// The kernel compiled from `source` for `dev` of compute capability `arch` (compiled and
    /// loaded on first use); `None` when it cannot be (no run-time compiler, a compile error:
    /// logged once).
    pub(crate) fn get(
        &self,
        dev: &<Gpu as Api>::Device,
        arch: (u32, u32),
        source: &str,
    ) -> Option<<Gpu as Api>::Kernel> {
        let mut m = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = m.get(source) {
            return k.clone();
        }
        let t0 = std::time::Instant::now();
        let built = compile(arch, source)
            .and_then(|code| Gpu::load_module(dev, &code))
            // The kernel keeps its module loaded.
            .and_then(|module| Gpu::get_kernel(&module, KERNEL_NAME));
        let k = match built {
            Ok(k) => {
                log::info!(
                    "executor: compiled a plan kernel in {:.2} s",
                    t0.elapsed().as_secs_f64()
                );
                Some(k)
            }
            // A backend without a run-time compiler (ROCm for now): expected with the default
            // on, so not a warning.
            Err(e @ mscclpp_hal::Error::Unsupported { .. }) => {
                log::info!("executor: plans run on the interpreter: {e}");
                None
            }
            Err(e) => {
                log::warn!(
                    "executor: a plan could not be compiled, it runs on the interpreter: {e}"
                );
                None
            }
        };
        m.insert(source.to_string(), k.clone());
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(ops: &[ExecOp]) -> Box<ExecBlock> {
        let mut b = ExecBlock::zeroed();
        b.n_ops = ops.len() as u32;
        b.ops[..ops.len()].copy_from_slice(ops);
        b
    }

    fn put_packets(off: u32, size: u32) -> ExecOp {
        let mut o = ExecOp::zeroed();
        o.op_type = op::PUT_PACKETS;
        o.channel_type = 1;
        o.n_channels = 1;
        o.n_inputs = 1;
        o.n_outputs = 1;
        o.output_refs[0] = 0x80;
        o.output_types[0] = 2;
        o.input_offsets[0] = off;
        o.input_sizes[0] = size;
        o.output_offsets[0] = off;
        o.output_sizes[0] = size;
        o
    }

    /// The kernel of one block with one packet put of `size` bytes (LL16).
    fn put_kernel(size: u32, dtype: DataType, bound: u32, lane_sync: u32) -> Generated {
        generate(
            &[block(&[put_packets(0, size)])],
            dtype,
            false,
            bound,
            lane_sync,
        )
        .unwrap()
    }

    #[test]
    fn sizes_of_one_structure_share_a_source() {
        let a = put_kernel(1024, DataType::F16, 256, 2);
        let b = put_kernel(4096, DataType::F16, 256, 2);
        assert_eq!(a.source, b.source);
        assert_eq!(a.values, vec![1, 0, 1024, 0, 1024]);
        assert_eq!(b.values, vec![1, 0, 4096, 0, 4096]);
        // Another element type or packet format is another kernel.
        let c = put_kernel(1024, DataType::F32, 256, 2);
        assert_ne!(a.source, c.source);
        assert!(c.source.contains("MSCCLPP_EXECUTOR_JIT_TYPE float"));
        // So is another lane sync: the kernel compiles only its launches' (here async).
        assert!(a
            .source
            .contains("#define MSCCLPP_EXECUTOR_JIT_LANE_SYNC 2\n"));
        let d = put_kernel(1024, DataType::F16, 256, 0);
        assert!(d
            .source
            .contains("#define MSCCLPP_EXECUTOR_JIT_LANE_SYNC 0\n"));
        assert_eq!(a.source.replace("LANE_SYNC 2", "LANE_SYNC 0"), d.source);
    }

    #[test]
    fn blocks_of_one_structure_share_a_function_with_their_own_values() {
        let g = generate(
            &[
                block(&[put_packets(0, 512)]),
                block(&[put_packets(512, 512)]),
            ],
            DataType::F32,
            true,
            256,
            2,
        )
        .unwrap();
        assert!(g.source.contains("case 0: case 1: block0("));
        assert!(!g.source.contains("block1("));
        // Starts, then block 0's four values, then block 1's.
        assert_eq!(g.values, vec![2, 6, 0, 512, 0, 512, 512, 512, 512, 512]);
        assert!(g.source.contains("MSCCLPP_EXECUTOR_JIT_LL8 1"));
    }

    #[test]
    fn pipelines_loop_over_their_body_with_run_time_counts() {
        let mut p = ExecOp::zeroed();
        p.op_type = op::PIPELINE;
        p.n_inner = 1;
        p.n_iterations = 4;
        p.unit_size = 256;
        let g = generate(
            &[block(&[p, put_packets(0, 1024)])],
            DataType::F16,
            false,
            1024,
            2,
        )
        .unwrap();
        assert_eq!(g.values, vec![1, 4, 256, 0, 1024, 0, 1024]);
        assert!(g
            .source
            .contains("for (uint32_t itr = 0; itr < nIt; ++itr)"));
        assert!(g.source.contains("step<14>(r, o, off, unit, st);"));
        assert!(g.source.contains("__launch_bounds__(1024)"));
        assert!(!g.source.contains("MSCCLPP_EXECUTOR_PREFETCH"));
        let narrow = put_kernel(1024, DataType::F16, 256, 2);
        assert!(narrow
            .source
            .contains("#define MSCCLPP_EXECUTOR_PREFETCH 1\n"));
    }

    #[test]
    fn the_parameter_is_the_args_then_the_values_padded() {
        // SAFETY: ExecArgs is integers only.
        let mut args: ExecArgs = unsafe { std::mem::zeroed() };
        args.nblocks = 3;
        let head = std::mem::size_of::<ExecArgs>();
        for values in [vec![7u32, 9, 11], (0..1000).collect()] {
            let p = params(&args, &values_tail(&values));
            assert!(p.len().is_multiple_of(8));
            assert_eq!(p.len(), (head + 4 * values.len()).div_ceil(8) * 8);
            // SAFETY: ExecArgs is integers only.
            let args_bytes = unsafe {
                std::slice::from_raw_parts((&args as *const ExecArgs).cast::<u8>(), head)
            };
            assert_eq!(&p[..head], args_bytes);
            assert_eq!(&p[head..head + 4], &values[0].to_le_bytes());
            assert_eq!(&p[head + 8..head + 12], &values[2].to_le_bytes());
        }
        // No values: one zero (the C array has a length of at least one).
        assert_eq!(params(&args, &values_tail(&[])).len(), head + 8);
    }

    #[test]
    fn offsets_past_the_counts_still_reach_the_kernel() {
        let mut w = ExecOp::zeroed();
        w.op_type = op::WAIT;
        w.n_channels = 1;
        let plain = generate(&[block(&[w])], DataType::F16, false, 256, 2).unwrap();
        assert_eq!(plain.values, vec![1]);
        w.input_sizes[1] = 64;
        let g = generate(&[block(&[w])], DataType::F16, false, 256, 2).unwrap();
        // Entries 0 and 1 of the four arrays.
        assert_eq!(g.values, vec![1, 0, 0, 0, 64, 0, 0, 0, 0]);
        assert!(g.source.contains("o.inputSizes[1] = v(3);"));
    }

    #[test]
    fn too_many_values_fall_back() {
        let ops: Vec<ExecOp> = (0..64).map(|i| put_packets(i, 16)).collect();
        let blocks: Vec<_> = (0..40).map(|_| block(&ops)).collect();
        let e = generate(&blocks, DataType::F16, false, 256, 2).unwrap_err();
        assert!(e.contains("kernel parameter"), "{e}");
    }
}
