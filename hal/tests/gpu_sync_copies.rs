//! The synchronous copies and sets (`write`, `read`, `memset`, `copy`) complete while a kernel
//! runs on the legacy default stream (CUDA's stream 0, HIP's null stream) and waits for exactly
//! that copy.
//!
//! PyTorch queues its kernels on the legacy stream behind a wait for the collective's kernel (or
//! runs the collective there), and a collective's kernel may wait for a copy the host makes (the
//! Ethernet receiver writing a peer's signal into GPU memory, the proxy reading a put's source).
//! A HAL that copied through the legacy stream would wait for that kernel, which waits for the
//! copy. Here `hal_wait_u64` runs on the legacy stream until a flag in
//! device memory reaches a value or ~5 s of clock cycles pass; the host then sets the flag with
//! the operation under test. The kernel must report that it saw the value (1), not that it gave
//! up (2), which is what a copy queued behind it would make it do. Skipped with a reason where
//! there is no GPU.

#[path = "common/gpu_ipc.rs"]
mod common;

use mscclpp_hal::{prelude::*, Buffer, Gpu, LaunchConfig, MemoryKind, StreamInterop};
use std::time::{Duration, Instant};

#[repr(C)]
#[derive(Clone, Copy)]
struct WaitArgs {
    flag: u64,
    value: u64,
    max_cycles: i64,
    result: u64,
}

/// About 5 s at the clock rates of current GPUs (1.5-2.1 GHz).
const MAX_CYCLES: i64 = 10_000_000_000;

fn read_u64(dev: &<Gpu as Api>::Device, m: &<Gpu as Api>::Memory) -> u64 {
    let mut b = [0u8; 8];
    Gpu::read(dev, m, 0, &mut b).expect("read");
    u64::from_le_bytes(b)
}

#[test]
fn sync_copies_do_not_wait_for_the_legacy_stream() {
    let Some((dev, wait)) = common::gpu_and_kernel(
        "sync_copies_do_not_wait_for_the_legacy_stream",
        "hal_wait_u64",
    ) else {
        return;
    };
    let alloc = |n| Gpu::alloc(&dev, n, MemoryKind::Device).expect("alloc");
    let (flag, result, source, other) = (alloc(8), alloc(8), alloc(8), alloc(4096));
    Gpu::write(&dev, &source, 0, &7u64.to_le_bytes()).expect("write the copy source");
    // SAFETY: 0 is the legacy default stream of the device's context, which outlives this test.
    let legacy = unsafe { <Gpu as StreamInterop>::borrow_stream(&dev, 0) };

    type Op<'a> = (&'static str, u64, Box<dyn Fn() + 'a>);
    let ops: Vec<Op> = vec![
        (
            "write",
            5,
            Box::new(|| Gpu::write(&dev, &flag, 0, &5u64.to_le_bytes()).expect("write")),
        ),
        (
            "memset",
            0x0101_0101_0101_0101,
            Box::new(|| Gpu::memset(&dev, &flag, 0, 1, 8).expect("memset")),
        ),
        (
            "copy",
            7,
            Box::new(|| Gpu::copy(&dev, &flag, 0, &source, 0, 8).expect("copy")),
        ),
        (
            "read",
            9,
            Box::new(|| {
                // The read comes first: if it waited for the kernel, the kernel gives up.
                let mut b = vec![0u8; other.size()];
                Gpu::read(&dev, &other, 0, &mut b).expect("read");
                Gpu::write(&dev, &flag, 0, &9u64.to_le_bytes()).expect("write after the read");
            }),
        ),
    ];
    let mut failures = Vec::new();
    for (name, value, op) in &ops {
        Gpu::memset(&dev, &flag, 0, 0, 8).expect("clear the flag");
        Gpu::memset(&dev, &result, 0, 0, 8).expect("clear the result");
        let args = WaitArgs {
            flag: flag.device_ptr(),
            value: *value,
            max_cycles: MAX_CYCLES,
            result: result.device_ptr(),
        };
        // SAFETY: WaitArgs matches hal_wait_u64(const u64*, u64, i64, u64*); both buffers
        // outlive the kernel (the stream is synchronised below).
        unsafe { Gpu::launch(&wait, &LaunchConfig::linear(1, 32), &legacy, &args) }
            .expect("launch hal_wait_u64 on the legacy stream");
        let t0 = Instant::now();
        op();
        let took = t0.elapsed();
        Gpu::stream_synchronize(&legacy, Duration::from_secs(60)).expect("legacy stream");
        let got = read_u64(&dev, &result);
        println!("{name}: returned after {took:?} while the kernel ran; kernel result {got}");
        if got != 1 {
            failures.push(format!(
                "{name}: the kernel on the legacy stream never saw the value (result {got}, \
                 expected 1: the {name} waited {took:?}, for the kernel to give up)"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
