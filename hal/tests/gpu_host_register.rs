//! `Api::register_host` on a GPU: a kernel writes a `Vec`'s buffer through the registered
//! device pointer and the host checks every element. Skipped with a reason where there is no
//! GPU (or the build has no GPU backend).

#[path = "common/gpu_ipc.rs"]
mod common;

use common::FillArgs;
use mscclpp_hal::{prelude::*, Gpu, LaunchConfig};
use std::time::Duration;

/// Not a multiple of the page size or of the launch width, on purpose.
const WORDS: usize = (16 << 20) / 4 + 123;
const POISON: u32 = 0xabab_abab;

/// Registers `words`, has `hal_fill_u32` write them through the registration's device pointer,
/// waits for the kernel, and unregisters (the registration is dropped on return).
fn fill_through_registration(
    dev: &<Gpu as Api>::Device,
    fill: &<Gpu as Api>::Kernel,
    stream: &<Gpu as Api>::Stream,
    words: &mut [u32],
    seed: u32,
    round: usize,
) {
    // SAFETY: `words` is borrowed mutably for this whole function, so it is neither touched,
    // resized nor freed before `reg` is dropped, and the kernel is synchronised before that.
    let reg = unsafe { Gpu::register_host(dev, words.as_mut_ptr().cast(), words.len() * 4) }
        .unwrap_or_else(|e| panic!("round {round}: register_host: {e}"));
    let args = FillArgs {
        dst: Gpu::host_registration_device_ptr(&reg),
        n: words.len() as u64,
        seed,
    };
    assert_ne!(args.dst, 0, "round {round}: null device pointer");
    let blocks = words.len().div_ceil(256).min(1024) as u32;
    // SAFETY: FillArgs matches hal_fill_u32(uint32_t*, uint64_t, uint32_t); the registered
    // range holds `n` u32 and outlives the kernel (synchronised below).
    unsafe { Gpu::launch(fill, &LaunchConfig::linear(blocks, 256), stream, &args) }
        .unwrap_or_else(|e| panic!("round {round}: launch: {e}"));
    Gpu::stream_synchronize(stream, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("round {round}: synchronize: {e}"));
}

#[test]
fn kernel_writes_registered_host_memory() {
    let Some((dev, fill)) =
        common::gpu_and_kernel("kernel_writes_registered_host_memory", "hal_fill_u32")
    else {
        return;
    };
    let stream = Gpu::create_stream(&dev).expect("stream");

    let mut words = vec![0u32; WORDS];
    for round in 0..2 {
        words.fill(POISON);
        let seed = common::random_seed();
        // Round 1 registers the same range again: that only works if the drop at the end of
        // round 0's helper unregistered it.
        fill_through_registration(&dev, &fill, &stream, &mut words, seed, round);
        let wrong: Vec<usize> = words
            .iter()
            .enumerate()
            .filter(|(i, w)| **w != common::pattern(*i, seed))
            .map(|(i, _)| i)
            .take(8)
            .collect();
        let mismatches = words
            .iter()
            .enumerate()
            .filter(|(i, w)| **w != common::pattern(*i, seed))
            .count();
        println!(
            "round {round}: {WORDS} elements written by the GPU through the registration, \
             {mismatches} wrong"
        );
        assert_eq!(
            mismatches, 0,
            "round {round}: {mismatches} of {WORDS} elements wrong (first at {wrong:?})"
        );
    }
    // A failed cuMemHostUnregister/hipHostUnregister would surface here as Error::Deferred.
    Gpu::device_count().expect("no deferred error from unregistering");
}
