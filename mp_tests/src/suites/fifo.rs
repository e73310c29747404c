//! FifoTest and FifoPerfTest: the proxy FIFO on every rank independently. Device pushers are
//! kernels/cuda/test_kernels/fifo_tests.cu on GPU builds, CPU threads (`mscclpp::device_emu`) on the host
//! backend; the test thread is the host side (poll, check, pop).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mscclpp::fifo::{Fifo, FifoDeviceHandle, ProxyTrigger, TRIGGER_COMMIT_BIT};
use mscclpp::{Device, GpuBuffer};
use mscclpp_framework::*;
use mscclpp_hal::Gpu;

use super::memory_channel::common::*;
use crate::world::mp_env;

#[repr(C)]
#[derive(Clone, Copy)]
struct PushArgs {
    fifo: FifoDeviceHandle,
    n: u64,
    sync_every: i32,
    out: *mut u64,
}

/// Test trigger k of fifo_tests.cu.
fn test_trigger(k: u64) -> ProxyTrigger {
    ProxyTrigger {
        fst: k,
        snd: k.wrapping_mul(0x9E37_79B9_7F4A_7C15) & !TRIGGER_COMMIT_BIT,
    }
}

fn gpu_device() -> Device {
    match crate::world::rank_gpu() {
        Ok(d) => d,
        Err(reason) => SKIP!("{}", reason),
    }
}

/// The pusher kernel `name` of fifo_tests on GPU builds; `None` on the host backend, where CPU
/// threads push.
fn pusher_kernel(name: &str) -> Option<GpuKernel> {
    is_gpu_build().then(|| {
        ok!(
            GpuKernel::load(gpu_device(), "fifo_tests", name),
            "loading {name}"
        )
    })
}

fn new_fifo(size: u32, k: Option<&GpuKernel>) -> Fifo {
    match k {
        Some(k) => ok!(
            Fifo::new_on::<Gpu>(&k.dev, size),
            "creating a GPU FIFO of {size}"
        ),
        None => ok!(Fifo::new_host(size), "creating a host FIFO of {size}"),
    }
}

/// How a drain waits for the next trigger: spins `spin_polls` polls, then yields, failing the
/// test once it waited `timeout` after the spinning. The clock is read only once spinning is
/// over (a read per trigger shows in the perf figures).
struct Idle {
    polls: u32,
    spin_polls: u32,
    since: Option<Instant>,
    timeout: Duration,
}

impl Idle {
    fn new(spin_polls: u32, timeout: Duration) -> Idle {
        Idle {
            polls: 0,
            spin_polls,
            since: None,
            timeout,
        }
    }

    /// One empty poll of `fifo` more.
    fn wait(&mut self, fifo: &Fifo) {
        self.polls = self.polls.saturating_add(1);
        if self.polls < self.spin_polls {
            std::hint::spin_loop();
            return;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        ASSERT_TRUE!(
            since.elapsed() < self.timeout,
            "no trigger at tail {} within {:?}",
            fifo.tail(),
            self.timeout
        );
        std::thread::yield_now();
    }
}

/// Pops `total` triggers from pushers of `per` triggers each; checks each appears once and
/// each pusher's in order. Returns the number of problems.
fn drain_and_check(fifo: &Fifo, pushers: u64, per: u64, timeout: Duration) -> u64 {
    let mut last: HashMap<u64, u64> = HashMap::new();
    let mut problems = 0;
    let spin_polls: u32 = if is_gpu_build() { 4096 } else { 16 };
    for _ in 0..pushers * per {
        // Spin briefly (a GPU answers within microseconds), then back off; CPU pushers share
        // our cores, so on the host backend back off almost at once.
        let mut idle = Idle::new(spin_polls, timeout);
        let t = loop {
            if let Some(t) = fifo.poll() {
                break t;
            }
            idle.wait(fifo);
        };
        let k = t.fst;
        if t.snd & !TRIGGER_COMMIT_BIT != test_trigger(k).snd || k / per >= pushers {
            problems += 1;
        } else {
            let g = k / per;
            let expected_next = last.get(&g).map(|p| p + 1).unwrap_or(g * per);
            if k != expected_next {
                problems += 1;
            }
            last.insert(g, k);
        }
        fifo.pop();
    }
    EXPECT_TRUE!(fifo.poll().is_none(), "an extra trigger appeared");
    problems
}

/// Pops `total` triggers as fast as it can, checking nothing but the count (and that the last
/// one is trigger `total - 1`); returns the number of problems (0 or 1).
fn drain_unchecked(fifo: &Fifo, total: u64, timeout: Duration) -> u64 {
    let mut last = None;
    let mut popped = 0;
    let mut idle = Idle::new(4096, timeout);
    while popped < total {
        if let Some(t) = fifo.poll() {
            last = Some(t.fst);
            fifo.pop();
            popped += 1;
            idle = Idle::new(4096, timeout);
            continue;
        }
        idle.wait(fifo);
    }
    u64::from(last != Some(total - 1))
}

TEST!(FifoTest, PushPollPop, |_ctx| {
    let timeout = mp_env().timeout;
    // (FIFO size, pushers, triggers per pusher, sync every): lap wrap-around over many laps
    // with one pusher, concurrent pushers with and without syncs.
    for (size, pushers, per, sync_every) in [
        (4u32, 1u64, 4000u64, 0i32),
        (16, 4, 1000, 0),
        (8, 8, 200, 7),
    ] {
        let k = pusher_kernel("fifo_push");
        let fifo = new_fifo(size, k.as_ref());
        let h = fifo.device_handle();
        let problems = if let Some(k) = &k {
            let a = PushArgs {
                fifo: h,
                n: per,
                sync_every,
                out: std::ptr::null_mut(),
            };
            ok!(
                // SAFETY: PushArgs mirrors fifo_push's parameters; the FIFO outlives the kernel.
                unsafe { k.launch(1, pushers as u32, &a) },
                "launching fifo_push"
            );
            let p = drain_and_check(&fifo, pushers, per, timeout);
            ok!(k.wait(timeout), "fifo_push");
            p
        } else {
            std::thread::scope(|s| {
                for g in 0..pushers {
                    s.spawn(move || -> mscclpp::Result<()> {
                        for j in 0..per {
                            // SAFETY: the FIFO outlives the scope; host backend memory.
                            let pos = unsafe { h.push(test_trigger(g * per + j), timeout) }?;
                            if sync_every > 0 && ((j + 1) % sync_every as u64 == 0 || j + 1 == per)
                            {
                                // SAFETY: as above.
                                unsafe { h.sync(pos, timeout) }?;
                            }
                        }
                        Ok(())
                    });
                }
                drain_and_check(&fifo, pushers, per, timeout)
            })
        };
        EXPECT_EQ!(
            problems,
            0,
            "FIFO of {}, {} pushers x {}",
            size,
            pushers,
            per
        );
        EXPECT_EQ!(fifo.tail(), pushers * per);
    }
});

TEST!(FifoTest, FailedTriggersReachTheDevice, |_ctx| {
    // The host fails the pusher's trigger (counting it before the pop, as the proxy does);
    // the pusher reads the count before its push and after its sync.
    let timeout = mp_env().timeout;
    let k = pusher_kernel("fifo_failed_triggers");
    let fifo = new_fifo(8, k.as_ref());
    let h = fifo.device_handle();
    let fail_one = |fifo: &Fifo| -> bool {
        let start = Instant::now();
        while fifo.poll().is_none() {
            if start.elapsed() > timeout {
                return false;
            }
            std::thread::yield_now();
        }
        fifo.record_failure();
        fifo.pop();
        true
    };
    let (before, after) = if let Some(k) = &k {
        let out: GpuBuffer<u64> = ok!(GpuBuffer::new(gpu_device(), 2), "allocating");
        let a = PushArgs {
            fifo: h,
            n: 1,
            sync_every: 0,
            out: out.data() as usize as *mut u64,
        };
        ok!(
            // SAFETY: PushArgs mirrors fifo_failed_triggers' parameters; the FIFO outlives it.
            unsafe { k.launch(1, 1, &a) },
            "launching fifo_failed_triggers"
        );
        ASSERT_TRUE!(fail_one(&fifo), "no trigger within {:?}", timeout);
        ok!(k.wait(timeout), "fifo_failed_triggers");
        let v = ok!(out.to_vec(), "reading the counts");
        (v[0], v[1])
    } else {
        std::thread::scope(|s| {
            let pusher = s.spawn(move || -> mscclpp::Result<(u64, u64)> {
                // SAFETY: the FIFO outlives the scope; host backend memory.
                unsafe {
                    let before = h.failed_triggers();
                    let pos = h.push(test_trigger(0), timeout)?;
                    h.sync(pos, timeout)?;
                    Ok((before, h.failed_triggers()))
                }
            });
            ASSERT_TRUE!(fail_one(&fifo), "no trigger within {:?}", timeout);
            ok!(
                pusher
                    .join()
                    .unwrap_or_else(|_| Err(mscclpp::Error::Internal("pusher panicked".into()))),
                "pusher"
            )
        })
    };
    EXPECT_EQ!(before, 0);
    EXPECT_EQ!(
        after,
        1,
        "the device sees the failure once its trigger is popped"
    );
    EXPECT_EQ!(fifo.failed(), 1);
});

PERF_TEST!(FifoPerfTest, PushPollPop, |ctx| {
    let timeout = mp_env().timeout;
    let n: u64 = if is_gpu_build() { 100_000 } else { 20_000 };
    // sync_every 1: push then wait for the pop (round trip); 0: throughput. `checked`: the host
    // verifies every trigger as it pops (drain_and_check); otherwise it only pops and counts, to
    // show what the checking costs the figure.
    for (sync_every, checked, label) in [
        (1i32, true, "FIFO push/poll/pop round trip"),
        (0, true, "FIFO push throughput (per trigger)"),
        (
            0,
            false,
            "FIFO push throughput, host pops without checking (per trigger)",
        ),
    ] {
        let k = pusher_kernel("fifo_push_perf");
        let fifo = new_fifo(mscclpp::fifo::DEFAULT_FIFO_SIZE, k.as_ref());
        let h = fifo.device_handle();
        let us = if let Some(k) = &k {
            let elapsed: GpuBuffer<u64> = ok!(GpuBuffer::new(gpu_device(), 1), "allocating");
            let a = PushArgs {
                fifo: h,
                n,
                sync_every,
                out: elapsed.data() as usize as *mut u64,
            };
            // SAFETY: PushArgs mirrors fifo_push_perf's parameters.
            ok!(unsafe { k.launch(1, 1, &a) }, "launching fifo_push_perf");
            let problems = if checked {
                drain_and_check(&fifo, 1, n, timeout)
            } else {
                drain_unchecked(&fifo, n, timeout)
            };
            ok!(k.wait(timeout), "fifo_push_perf");
            EXPECT_EQ!(problems, 0);
            let ns = ok!(elapsed.to_vec(), "reading the time")[0];
            ns as f64 / 1e3 / n as f64
        } else {
            std::thread::scope(|s| {
                let pusher = s.spawn(move || -> mscclpp::Result<f64> {
                    let start = Instant::now();
                    let mut pos = 0;
                    for j in 0..n {
                        // SAFETY: the FIFO outlives the scope.
                        pos = unsafe { h.push(test_trigger(j), timeout) }?;
                        if sync_every == 1 {
                            // SAFETY: as above.
                            unsafe { h.sync(pos, timeout) }?;
                        }
                    }
                    // SAFETY: as above.
                    unsafe { h.sync(pos, timeout) }?;
                    Ok(start.elapsed().as_secs_f64())
                });
                let problems = if checked {
                    drain_and_check(&fifo, 1, n, timeout)
                } else {
                    drain_unchecked(&fifo, n, timeout)
                };
                EXPECT_EQ!(problems, 0);
                let secs = ok!(
                    pusher
                        .join()
                        .unwrap_or_else(|_| Err(mscclpp::Error::Internal(
                            "pusher panicked".into()
                        ))),
                    "pusher"
                );
                secs * 1e6 / n as f64
            })
        };
        report_on_rank0(ctx, label, us, "us/iter");
    }
});
