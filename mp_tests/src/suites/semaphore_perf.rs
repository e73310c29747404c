//! SemaphorePerfTest.SignalPingPong: one-hop latency of MemoryDevice2DeviceSemaphore signals
//! between rank r and r^1 (one iteration = one one-way hop, as upstream counts). GPU builds run
//! semaphore_ping_pong of kernels/cuda/test_kernels/semaphore_tests.cu, red-based and, for the seed's
//! comparison, the old store-based signal; the host backend runs the same loop on a CPU thread
//! with `mscclpp::device_emu`. Also a correctness test of signal counting.

use std::time::Instant;

use mscclpp::device_emu::memory_channel::MemorySemaphoreOps;
use mscclpp::semaphore::{MemoryDevice2DeviceSemaphore, MemoryDevice2DeviceSemaphoreDeviceHandle};
use mscclpp::{GpuBuffer, Transport};
use mscclpp_framework::*;

use super::memory_channel::common::*;

#[repr(C)]
#[derive(Clone, Copy)]
struct PingPongArgs {
    h: MemoryDevice2DeviceSemaphoreDeviceHandle,
    iters: i32,
    initiator: i32,
    use_store_signal: i32,
    outbound_counter: *mut u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct SignalNArgs {
    h: MemoryDevice2DeviceSemaphoreDeviceHandle,
    n: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct WaitNArgs {
    h: MemoryDevice2DeviceSemaphoreDeviceHandle,
    n: i32,
    use_poll: i32,
    seen: *mut u64,
}

/// A fresh d2d semaphore with the peer (over CudaIpc).
fn semaphore(pair: &Pair, tag: u64) -> MemoryDevice2DeviceSemaphore {
    let conn = pair.connect(Transport::CudaIpc, tag);
    ok!(
        MemoryDevice2DeviceSemaphore::new(pair.semaphore(&conn, tag + 1)),
        "d2d semaphore"
    )
}

/// `iters` round trips (2 * iters hops); returns seconds.
fn round_trips(
    pair: &Pair,
    sem: &MemoryDevice2DeviceSemaphore,
    iters: u32,
    store: bool,
    counter: Option<&GpuBuffer<u64>>,
) -> f64 {
    pair.sync();
    let h = sem.device_handle();
    if is_gpu_build() {
        let k = ok!(
            GpuKernel::load(pair.device, "semaphore_tests", "semaphore_ping_pong"),
            "loading semaphore_ping_pong"
        );
        let a = PingPongArgs {
            h,
            iters: iters as i32,
            initiator: pair.initiator as i32,
            use_store_signal: store as i32,
            outbound_counter: counter
                .map(|c| c.data() as usize as *mut u64)
                .unwrap_or(std::ptr::null_mut()),
        };
        // SAFETY: PingPongArgs mirrors the kernel's parameters; the semaphore outlives the launch.
        ok!(
            unsafe { k.run(1, 1, &a, pair.timeout) },
            "running semaphore_ping_pong"
        ) / 1e3
    } else {
        let start = Instant::now();
        for _ in 0..iters {
            // SAFETY: the semaphore outlives the loop; this thread is the handle's only waiter.
            let r = unsafe {
                if pair.initiator {
                    h.signal();
                    h.wait(pair.timeout)
                } else {
                    h.wait(pair.timeout).map(|()| h.signal())
                }
            };
            ok!(r, "semaphore ping-pong");
        }
        start.elapsed().as_secs_f64()
    }
}

TEST!(SemaphorePerfTest, SignalCounting, |ctx| {
    let pair = pair(ctx);
    let sem = semaphore(&pair, 30);
    let h = sem.device_handle();
    let n = 1000u32;
    pair.sync();
    // The initiator signals n times; the other side consumes them (waits, then polls), and
    // sees exactly n: no signal lost or duplicated.
    if is_gpu_build() {
        if pair.initiator {
            let k = ok!(
                GpuKernel::load(pair.device, "semaphore_tests", "semaphore_signal_n"),
                "loading semaphore_signal_n"
            );
            ok!(
                // SAFETY: SignalNArgs mirrors the kernel's parameters.
                unsafe { k.run(1, 1, &SignalNArgs { h, n: n as i32 }, pair.timeout) },
                "signal_n"
            );
        } else {
            let seen: GpuBuffer<u64> = ok!(GpuBuffer::new(pair.device, 1), "allocating");
            let k = ok!(
                GpuKernel::load(pair.device, "semaphore_tests", "semaphore_wait_n"),
                "loading semaphore_wait_n"
            );
            for use_poll in [0, 1] {
                let a = WaitNArgs {
                    h,
                    n: (n / 2) as i32,
                    use_poll,
                    seen: seen.data() as usize as *mut u64,
                };
                // SAFETY: WaitNArgs mirrors the kernel's parameters.
                ok!(unsafe { k.run(1, 1, &a, pair.timeout) }, "wait_n");
            }
            let got = ok!(seen.to_vec(), "reading");
            EXPECT_EQ!(got[0], u64::from(n));
        }
    } else if pair.initiator {
        for _ in 0..n {
            // SAFETY: the semaphore outlives the call.
            unsafe { h.signal() };
        }
    } else {
        for i in 0..n {
            // SAFETY: as above; this thread is the only waiter.
            unsafe {
                if i % 2 == 0 {
                    ok!(h.wait(pair.timeout), "wait {i}");
                } else {
                    let start = Instant::now();
                    while !h.poll() {
                        ASSERT_TRUE!(start.elapsed() < pair.timeout, "poll {} never succeeded", i);
                        std::thread::yield_now();
                    }
                }
            }
        }
        // SAFETY: as above.
        EXPECT_FALSE!(unsafe { h.poll() }, "an extra signal appeared");
        // SAFETY: the token is a live u64 of the semaphore.
        EXPECT_EQ!(unsafe { h.inbound_token.read_volatile() }, u64::from(n));
    }
    pair.sync();
});

PERF_TEST!(SemaphorePerfTest, SignalPingPong, |ctx| {
    let pair = pair(ctx);
    let sem = semaphore(&pair, 32);
    let (warm, iters) = if is_gpu_build() {
        (2000u32, 20000u32)
    } else {
        (200, 1000)
    };
    round_trips(&pair, &sem, warm, false, None);
    let secs = round_trips(&pair, &sem, iters, false, None);
    let us = secs * 1e6 / f64::from(2 * iters);
    report_on_rank0(
        ctx,
        "signal ping-pong, red.release signal (one hop)",
        us,
        "us/iter",
    );
    if is_gpu_build() {
        // The store-based signal of the seed's old design, on a fresh semaphore (the two kinds
        // must not share a token).
        let sem2 = semaphore(&pair, 34);
        let counter: GpuBuffer<u64> = ok!(
            GpuBuffer::new(pair.device, 1),
            "allocating the outbound counter"
        );
        round_trips(&pair, &sem2, warm, true, Some(&counter));
        let secs = round_trips(&pair, &sem2, iters, true, Some(&counter));
        if ctx.rank() == 0 {
            ctx.report_perf(
                "signal ping-pong, store-based signal (one hop)",
                secs * 1e6 / f64::from(2 * iters),
                "us/iter",
            );
        }
    }
    pair.sync();
});
