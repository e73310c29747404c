//! CollectivesKernelPerfTest (GPU only): the local reduction kernel of the collectives (fp16
//! sum of two 256 MiB buffers into a third) against device-to-device copies measured in the
//! same run (the vectorised `coll_copy` kernel and cuMemcpy), as bytes read + written per
//! second. Target: the reduction reaches >= 95 % of the copy. Rank 0 measures; the others wait.

use mscclpp::collectives::copy::CopyArgs;
use mscclpp::collectives::{DataType, ReduceOp};
use mscclpp::kernels::collectives::copy as copy_kernels;
use mscclpp::{Device, GpuBuffer};
use mscclpp_framework::*;
use mscclpp_hal::{prelude::*, Gpu, LaunchConfig};

use super::memory_channel::common::{is_gpu_build, ok};
use crate::world::mp_env;

#[repr(C)]
#[derive(Clone, Copy)]
struct Reduce2Args {
    c: u64,
    a: u64,
    b: u64,
    n: u64,
}

PERF_TEST!(CollectivesKernelPerfTest, LocalReduceBandwidth, |ctx| {
    if !is_gpu_build() {
        SKIP!("measures a GPU kernel: this is a host-backend build");
    }
    let n_gpus = match crate::world::visible_gpus() {
        Ok(n) => n,
        Err(reason) => SKIP!("{}", reason),
    };
    let _ = n_gpus;
    if ctx.rank() != 0 {
        ok!(mp_env().bootstrap.barrier(), "waiting for rank 0");
        return;
    }
    let bytes: usize = 256 << 20;
    let device = Device::gpu(0);
    let a: GpuBuffer<u8> = ok!(GpuBuffer::new(device, bytes), "allocating a");
    let b: GpuBuffer<u8> = ok!(GpuBuffer::new(device, bytes), "allocating b");
    let c: GpuBuffer<u8> = ok!(GpuBuffer::new(device, bytes), "allocating c");
    let dev = ok!(Gpu::open_device(0), "opening GPU 0");
    let props = ok!(Gpu::properties(&dev), "GPU properties");
    let code = match copy_kernels::OBJECT.code() {
        Some(c) => c,
        None => FAIL!("this build embeds no collectives/copy code object"),
    };
    let module = ok!(Gpu::load_module(&dev, code), "loading collectives/copy");
    let reduce2 = ok!(
        copy_kernels::COLL_REDUCE2.instance(DataType::F16, ReduceOp::Sum),
        "coll_reduce2 f16 sum"
    );
    let reduce = ok!(
        Gpu::get_kernel(&module, reduce2.name()),
        "{}",
        reduce2.name()
    );
    let copy_name = copy_kernels::COLL_COPY.name();
    let copy = ok!(Gpu::get_kernel(&module, copy_name), "{copy_name}");
    let stream = ok!(Gpu::create_stream(&dev), "stream");
    let (start, end) = (
        ok!(Gpu::create_event(&dev), "event"),
        ok!(Gpu::create_event(&dev), "event"),
    );
    let iters = 20;
    let blocks = props.sm_count * 4;
    let cfg = LaunchConfig::linear(blocks, 512);
    // Times `f` (one launch) over `iters` runs after 3 warm-ups; seconds per run.
    let time = |f: &dyn Fn() -> mscclpp_hal::Result<()>| -> f64 {
        for _ in 0..3 {
            ok!(f(), "warm-up launch");
        }
        ok!(Gpu::record_event(&start, &stream), "record");
        for _ in 0..iters {
            ok!(f(), "launch");
        }
        ok!(Gpu::record_event(&end, &stream), "record");
        ok!(Gpu::stream_synchronize(&stream, mp_env().timeout), "sync");
        f64::from(ok!(Gpu::event_elapsed_ms(&start, &end), "elapsed")) / 1e3 / f64::from(iters)
    };
    let ra = Reduce2Args {
        c: c.data(),
        a: a.data(),
        b: b.data(),
        n: (bytes / 2) as u64,
    };
    // SAFETY: Reduce2Args mirrors coll_reduce2_f16_sum's parameters; the buffers outlive the sync.
    let t_reduce = time(&|| unsafe { Gpu::launch(&reduce, &cfg, &stream, &ra) });
    let ca = CopyArgs {
        dst: c.data(),
        src: a.data(),
        bytes: bytes as u64,
    };
    let (cb, ct) = mscclpp_copy_grid(bytes, props.sm_count);
    // SAFETY: CopyArgs mirrors coll_copy's parameters.
    let t_copy =
        time(&|| unsafe { Gpu::launch(&copy, &LaunchConfig::linear(cb, ct), &stream, &ca) });
    // SAFETY: both 256 MiB ranges are live allocations until after the sync.
    let t_memcpy = time(&|| unsafe { Gpu::memcpy_async(&stream, c.data(), a.data(), bytes) });
    let gbps = |moved: usize, t: f64| moved as f64 / t / 1e9;
    let reduce_bw = gbps(3 * bytes, t_reduce);
    let copy_bw = gbps(2 * bytes, t_copy);
    let memcpy_bw = gbps(2 * bytes, t_memcpy);
    ctx.report_perf(
        "fp16 sum 2 x 256 MiB -> 256 MiB (read + write)",
        reduce_bw,
        "GB/s",
    );
    ctx.report_perf("coll_copy 256 MiB (read + write)", copy_bw, "GB/s");
    ctx.report_perf("cuMemcpy D2D 256 MiB (read + write)", memcpy_bw, "GB/s");
    ctx.report_perf(
        "reduction / best copy (target >= 95)",
        100.0 * reduce_bw / copy_bw.max(memcpy_bw),
        "%",
    );
    EXPECT_GT!(reduce_bw, 0.0);
    // The sum is right (a few elements; the buffers start zeroed, so write ones and twos).
    let one = half::f16::from_f32(1.0).to_bits().to_le_bytes();
    let two = half::f16::from_f32(2.0).to_bits().to_le_bytes();
    ok!(a.copy_from_host(0, &one.repeat(8)), "writing a");
    ok!(b.copy_from_host(0, &two.repeat(8)), "writing b");
    ok!(
        // SAFETY: as above.
        unsafe { Gpu::launch(&reduce, &cfg, &stream, &ra) },
        "launch"
    );
    ok!(Gpu::stream_synchronize(&stream, mp_env().timeout), "sync");
    let mut got = [0u8; 16];
    ok!(c.copy_to_host(0, &mut got), "reading c");
    let three = half::f16::from_f32(3.0).to_bits().to_le_bytes();
    EXPECT_EQ!(got.to_vec(), three.repeat(8), "1 + 2 in f16");
    ok!(mp_env().bootstrap.barrier(), "releasing the other ranks");
});

/// The copy grid of the collectives' world-size-1 copy (copy.rs `copy_grid`).
fn mscclpp_copy_grid(bytes: usize, sms: u32) -> (u32, u32) {
    mscclpp::collectives::copy::copy_grid(bytes, sms)
}
