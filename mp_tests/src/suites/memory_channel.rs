//! MemoryChannelOneToOneTest: put/get ping-pong and LL8/LL16 packet ping-pong between rank r
//! and r^1, data checked element by element with fresh data every round. On a GPU build the
//! kernels of kernels/cuda/test_kernels/memory_channel_tests.cu run; on the host backend CPU threads play
//! the device with `mscclpp::device_emu` (same protocol, std atomics). Also holds the helpers the
//! other data-plane suites share (`common`).

use mscclpp::device_emu::memory_channel::MemorySemaphoreOps;
use mscclpp::packet::{LL16Packet, LL8Packet};
use mscclpp::semaphore::MemoryDevice2DeviceSemaphore;
use mscclpp::{GpuBuffer, MemoryChannel, MemoryChannelDeviceHandle, Transport};
use mscclpp_framework::*;

use self::common::*;

/// Helpers shared by the data-plane suites.
pub(crate) mod common {
    use std::hash::BuildHasher;
    use std::sync::{Condvar, Mutex};
    use std::time::{Duration, Instant};

    use mscclpp::bootstrap::Bootstrap;
    use mscclpp::{Communicator, Context, Device, EndpointConfig, RegisteredMemory, Transport};
    use mscclpp_framework::*;
    use mscclpp_hal::{prelude::*, Gpu, LaunchConfig, StreamInterop};

    use crate::world::mp_env;

    /// Unwraps a `Result`, failing the test with `what` and the error otherwise.
    macro_rules! ok {
        ($e:expr, $($what:tt)+) => {
            match $e {
                Ok(v) => v,
                Err(err) => FAIL!("{}: {}", format!($($what)+), err),
            }
        };
    }
    pub(crate) use ok;

    /// Loads kernel `name` of module `stem` on `device` and zeroes the error counter `errors`
    /// it will count into.
    pub(crate) fn load_zeroing_errors(
        device: Device,
        stem: &str,
        name: &str,
        errors: &mscclpp::GpuBuffer<i32>,
    ) -> GpuKernel {
        let k = ok!(GpuKernel::load(device, stem, name), "loading {name}");
        ok!(errors.copy_from_host(0, &[0]), "zeroing the error counter");
        k
    }

    /// What the error counter `errors` holds.
    pub(crate) fn read_errors(errors: &mscclpp::GpuBuffer<i32>) -> u64 {
        let mut e = [0i32];
        ok!(errors.copy_to_host(0, &mut e), "reading the error counter");
        e[0] as u64
    }

    /// Rank 0 reports `value` (in `unit`) as the figure `what`; on every rank it must be
    /// positive.
    pub(crate) fn report_on_rank0(ctx: &TestContext, what: &str, value: f64, unit: &str) {
        if ctx.rank() == 0 {
            ctx.report_perf(what, value, unit);
        }
        EXPECT_GT!(value, 0.0);
    }

    /// Whether this build drives real GPUs (`--features cuda`/`rocm`).
    pub(crate) fn is_gpu_build() -> bool {
        Gpu::NAME != "host"
    }

    /// This rank, its partner (rank ^ 1) and what they share.
    pub(crate) struct Pair {
        pub peer: usize,
        /// The lower rank of the pair starts.
        pub initiator: bool,
        pub device: Device,
        pub comm: Communicator,
        /// Same on both ranks of the pair, fresh every test.
        pub seed: u64,
        pub timeout: Duration,
    }

    /// Pairs rank r with r ^ 1; with an odd world the last rank skips (as does a lone rank).
    pub(crate) fn pair(ctx: &TestContext) -> Pair {
        let env = mp_env();
        let (rank, size) = (ctx.rank(), ctx.size());
        let peer = rank ^ 1;
        if peer >= size {
            SKIP!("rank {rank} has no partner in a world of {size} (ranks pair up as r, r^1)");
        }
        let device = if is_gpu_build() {
            match crate::world::rank_gpu() {
                Ok(d) => d,
                Err(reason) => SKIP!("{}", reason),
            }
        } else {
            Device::CPU
        };
        let context = ok!(Context::new(), "creating a context");
        let comm = Communicator::new(env.bootstrap.clone(), context);
        // A fresh seed per test, agreed by the pair (the lower rank's).
        let mine = std::collections::hash_map::RandomState::new().hash_one((rank, Instant::now()));
        let b: &dyn Bootstrap = env.bootstrap.as_ref();
        ok!(
            b.send(&mine.to_le_bytes(), peer, PAIR_TAG),
            "sending the seed to rank {peer}"
        );
        let theirs = ok!(b.recv(peer, PAIR_TAG), "receiving the seed of rank {peer}");
        let theirs = ok!(
            <[u8; 8]>::try_from(theirs.as_slice()).map(u64::from_le_bytes),
            "seed of rank {peer}"
        );
        let seed = if rank < peer { mine } else { theirs };
        Pair {
            peer,
            initiator: rank < peer,
            device,
            comm,
            seed,
            timeout: env.timeout,
        }
    }

    /// Bootstrap tag of the pair helpers (below the communicator's tag space).
    const PAIR_TAG: u64 = 0x0D50_0000;

    impl Pair {
        /// Both ranks of the pair reach this point (a two-way message).
        pub fn sync(&self) {
            let b = &mp_env().bootstrap;
            ok!(
                b.send(&[1], self.peer, PAIR_TAG + 1),
                "pair barrier send to rank {}",
                self.peer
            );
            ok!(
                b.recv(self.peer, PAIR_TAG + 1),
                "pair barrier recv from rank {}",
                self.peer
            );
        }

        /// Connects to the peer over `transport` from this rank's device.
        pub fn connect(&self, transport: Transport, tag: u64) -> mscclpp::Connection {
            let cfg = EndpointConfig::new(transport, self.device);
            ok!(
                self.comm.connect(cfg, self.peer, tag).get(),
                "connecting to rank {} over {transport}",
                self.peer
            )
        }

        /// Builds a semaphore over `conn` with the peer.
        pub fn semaphore(
            &self,
            conn: &mscclpp::Connection,
            tag: u64,
        ) -> mscclpp::semaphore::Semaphore {
            ok!(
                self.comm.build_semaphore(conn, self.peer, tag).get(),
                "building a semaphore with rank {}",
                self.peer
            )
        }

        /// Sends `mine` to the peer and receives the peer's memory.
        pub fn exchange(&self, mine: &RegisteredMemory, tag: u64) -> RegisteredMemory {
            let fut = self.comm.recv_memory(self.peer, tag);
            ok!(
                self.comm.send_memory(mine, self.peer, tag),
                "sending memory to rank {}",
                self.peer
            );
            ok!(fut.get(), "receiving memory from rank {}", self.peer)
        }

        /// Whether this rank sends round `r` (the initiator sends even rounds).
        pub fn sends(&self, r: u32) -> bool {
            r.is_multiple_of(2) == self.initiator
        }
    }

    /// `testPattern` of kernels/cuda/test_kernels/test_pattern.hpp.
    pub(crate) fn test_pattern(seed: u64, round: u32, i: u64) -> u32 {
        let mut x = (seed as u32)
            ^ ((seed >> 32) as u32)
            ^ round.wrapping_mul(0x9E37_79B9)
            ^ (i as u32).wrapping_mul(0x85EB_CA6B);
        x ^= x >> 16;
        x = x.wrapping_mul(0x7FEB_352D);
        x ^= x >> 15;
        x = x.wrapping_mul(0x846C_A68B);
        x ^= x >> 16;
        x
    }

    /// This thread's share of `fillPattern` over `n` u32 at `buf`.
    ///
    /// # Safety
    /// `buf` is valid for `n` u32 and other threads write other indices.
    pub(crate) unsafe fn fill_pattern(
        buf: *mut u32,
        n: u64,
        seed: u64,
        round: u32,
        tid: u32,
        nthreads: u32,
    ) {
        let mut i = u64::from(tid);
        while i < n {
            // SAFETY: i < n by the caller's contract.
            unsafe {
                buf.add(i as usize)
                    .write_volatile(test_pattern(seed, round, i))
            };
            i += u64::from(nthreads);
        }
    }

    /// This thread's share of `checkPattern`: mismatches among its indices.
    ///
    /// # Safety
    /// As [`fill_pattern`] (reads only).
    pub(crate) unsafe fn check_pattern(
        buf: *const u32,
        n: u64,
        seed: u64,
        round: u32,
        tid: u32,
        nthreads: u32,
    ) -> u64 {
        let mut errors = 0;
        let mut i = u64::from(tid);
        while i < n {
            // SAFETY: i < n by the caller's contract.
            if unsafe { buf.add(i as usize).read_volatile() } != test_pattern(seed, round, i) {
                errors += 1;
            }
            i += u64::from(nthreads);
        }
        errors
    }

    /// The `__syncthreads()` of a host "thread block": a barrier whose wait ends with an error
    /// when another thread of the block has failed (it will never arrive) or after
    /// [`BlockBarrier::LIMIT`], instead of blocking forever as `std::sync::Barrier` does.
    const BARRIER_ABORTED: &str = "another thread of this host block failed";

    pub(crate) struct BlockBarrier {
        n: usize,
        /// (threads arrived in this generation, generation, aborted)
        state: Mutex<(usize, u64, bool)>,
        cv: Condvar,
    }

    impl BlockBarrier {
        /// The longest a thread waits for the others (every test's own waits are shorter).
        pub(crate) const LIMIT: Duration = Duration::from_secs(300);

        fn new(n: usize) -> Self {
            BlockBarrier {
                n,
                state: Mutex::new((0, 0, false)),
                cv: Condvar::new(),
            }
        }

        /// Waits until all `n` threads arrived; Err once a thread of the block failed.
        pub(crate) fn wait(&self) -> mscclpp::Result<()> {
            let aborted = || mscclpp::Error::Aborted(BARRIER_ABORTED.into());
            let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if g.2 {
                return Err(aborted());
            }
            g.0 += 1;
            if g.0 == self.n {
                g.0 = 0;
                g.1 += 1;
                self.cv.notify_all();
                return Ok(());
            }
            let (gen, start) = (g.1, Instant::now());
            while g.1 == gen {
                if g.2 {
                    return Err(aborted());
                }
                let left = Self::LIMIT.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return Err(mscclpp::Error::timeout(
                        "the other threads of this host block at a barrier".to_string(),
                        Self::LIMIT,
                    ));
                }
                g = self
                    .cv
                    .wait_timeout(g, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            Ok(())
        }

        fn abort(&self) {
            let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
            g.2 = true;
            self.cv.notify_all();
        }
    }

    /// Runs `body(tid, barrier)` on `n` threads (a host "thread block"); sums what they return.
    /// A thread that fails (or panics) releases the others' barrier waits with an error.
    pub(crate) fn run_block<F>(n: u32, body: F) -> mscclpp::Result<u64>
    where
        F: Fn(u32, &BlockBarrier) -> mscclpp::Result<u64> + Sync,
    {
        let barrier = BlockBarrier::new(n as usize);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|t| {
                    let (b, f) = (&barrier, &body);
                    s.spawn(move || {
                        // Aborts the barrier if this thread leaves early by error or panic.
                        struct OnExit<'a>(&'a BlockBarrier, bool);
                        impl Drop for OnExit<'_> {
                            fn drop(&mut self) {
                                if !self.1 {
                                    self.0.abort();
                                }
                            }
                        }
                        let mut guard = OnExit(b, false);
                        let r = f(t, b);
                        guard.1 = r.is_ok();
                        r
                    })
                })
                .collect();
            let mut sum = 0;
            let mut first_err = None;
            for h in handles {
                match h.join() {
                    Ok(Ok(v)) => sum += v,
                    // The failing thread's own error, not the others' barrier aborts.
                    Ok(Err(e)) => match &first_err {
                        Some(mscclpp::Error::Aborted(m)) if m == BARRIER_ABORTED => {
                            first_err = Some(e)
                        }
                        None => first_err = Some(e),
                        Some(_) => {}
                    },
                    Err(_) => {
                        first_err.get_or_insert(mscclpp::Error::Internal(
                            "a device thread panicked".into(),
                        ));
                    }
                }
            }
            match first_err {
                Some(e) => Err(e),
                None => Ok(sum),
            }
        })
    }

    /// A kernel of an embedded code object, with a stream and timing events on one GPU.
    pub(crate) struct GpuKernel {
        pub dev: <Gpu as Api>::Device,
        _module: <Gpu as Api>::Module,
        kernel: <Gpu as Api>::Kernel,
        stream: <Gpu as Api>::Stream,
        start: <Gpu as Api>::Event,
        end: <Gpu as Api>::Event,
    }

    impl GpuKernel {
        /// Loads `name` from the code object `stem` on GPU `device.id`.
        pub fn load(device: Device, stem: &str, name: &str) -> Result<GpuKernel, String> {
            let code = mscclpp_test_kernels::object(stem)
                .ok_or_else(|| format!("this build embeds no code object `{stem}`"))?;
            let e = |what: &str, err: mscclpp_hal::Error| format!("{what}: {err}");
            let dev =
                Gpu::open_device(device.id.max(0) as usize).map_err(|x| e("opening the GPU", x))?;
            let module = Gpu::load_module(&dev, code).map_err(|x| e("loading the module", x))?;
            let kernel = Gpu::get_kernel(&module, name).map_err(|x| e("finding the kernel", x))?;
            let stream = Gpu::create_stream(&dev).map_err(|x| e("creating a stream", x))?;
            let start = Gpu::create_event(&dev).map_err(|x| e("creating an event", x))?;
            let end = Gpu::create_event(&dev).map_err(|x| e("creating an event", x))?;
            Ok(GpuKernel {
                dev,
                _module: module,
                kernel,
                stream,
                start,
                end,
            })
        }

        /// Launches with `args` (a `#[repr(C)]` struct of the kernel's parameters) and waits.
        /// Returns the kernel's time in milliseconds.
        ///
        /// # Safety
        /// `A` matches the kernel's parameter list and every pointer in it is live.
        pub unsafe fn run<A: Copy>(
            &self,
            blocks: u32,
            threads: u32,
            args: &A,
            timeout: Duration,
        ) -> mscclpp_hal::Result<f64> {
            // SAFETY: forwarded from the caller.
            unsafe { self.run_on(&self.stream, blocks, threads, args, timeout) }
        }

        /// [`GpuKernel::run`] on `stream`.
        unsafe fn run_on<A: Copy>(
            &self,
            stream: &<Gpu as Api>::Stream,
            blocks: u32,
            threads: u32,
            args: &A,
            timeout: Duration,
        ) -> mscclpp_hal::Result<f64> {
            Gpu::record_event(&self.start, stream)?;
            // SAFETY: forwarded from the caller.
            unsafe {
                Gpu::launch(
                    &self.kernel,
                    &LaunchConfig::linear(blocks, threads),
                    stream,
                    args,
                )?
            };
            Gpu::record_event(&self.end, stream)?;
            Gpu::stream_synchronize(stream, timeout)?;
            Ok(f64::from(Gpu::event_elapsed_ms(&self.start, &self.end)?))
        }

        /// Launches without waiting (the host serves the kernel meanwhile); see [`GpuKernel::wait`].
        ///
        /// # Safety
        /// As [`GpuKernel::run`]; the pointers stay live until `wait` returned.
        pub unsafe fn launch<A: Copy>(
            &self,
            blocks: u32,
            threads: u32,
            args: &A,
        ) -> mscclpp_hal::Result<()> {
            // SAFETY: forwarded from the caller.
            unsafe {
                Gpu::launch(
                    &self.kernel,
                    &LaunchConfig::linear(blocks, threads),
                    &self.stream,
                    args,
                )
            }
        }

        /// Waits for launched work.
        pub fn wait(&self, timeout: Duration) -> mscclpp_hal::Result<()> {
            Gpu::stream_synchronize(&self.stream, timeout)
        }

        /// Launches on the legacy default stream (stream 0, where PyTorch runs synchronous
        /// collectives) and waits for it. Returns the kernel's time in milliseconds.
        ///
        /// # Safety
        /// As [`GpuKernel::run`].
        pub unsafe fn run_on_legacy_stream<A: Copy>(
            &self,
            blocks: u32,
            threads: u32,
            args: &A,
            timeout: Duration,
        ) -> mscclpp_hal::Result<f64> {
            // SAFETY: 0 is the legacy default stream of the device's primary context, which
            // outlives the borrow.
            let legacy = unsafe { <Gpu as StreamInterop>::borrow_stream(&self.dev, 0) };
            // SAFETY: forwarded from the caller.
            unsafe { self.run_on(&legacy, blocks, threads, args, timeout) }
        }
    }
}

/// Arguments of memory_channel_put_ping_pong / memory_channel_get_ping_pong.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PingPongArgs {
    ch: MemoryChannelDeviceHandle,
    offset: u64,
    n_elem: u64,
    iters: i32,
    initiator: i32,
    seed: u64,
    check: i32,
    error_count: *mut i32,
}

/// Arguments of memory_channel_ll8_ping_pong / memory_channel_ll16_ping_pong.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PacketArgs {
    ch: MemoryChannelDeviceHandle,
    n_elem: u64,
    iters: i32,
    initiator: i32,
    flag_base: u32,
    seed: u64,
    check: i32,
    error_count: *mut i32,
}

/// Arguments of memory_channel_put_bandwidth.
#[repr(C)]
#[derive(Clone, Copy)]
struct BandwidthArgs {
    ch: MemoryChannelDeviceHandle,
    bytes: u64,
    iters: i32,
    role: i32,
    peer_blocks: i32,
}

/// The pair's memory-channel setup: data and packet buffers, one channel for put/get (dst =
/// the peer's data buffer) and one for packets (dst = the peer's packet buffer).
pub(crate) struct McSetup {
    pub pair: Pair,
    pub data: GpuBuffer<u32>,
    pub _packets: GpuBuffer<u32>,
    pub put_channel: MemoryChannel,
    pub packet_channel: MemoryChannel,
    pub errors: GpuBuffer<i32>,
    pub n_max: usize,
}

pub(crate) fn mc_setup(ctx: &TestContext, n_max: usize) -> McSetup {
    let pair = pair(ctx);
    let data: GpuBuffer<u32> = ok!(GpuBuffer::new(pair.device, n_max), "allocating {n_max} u32");
    // LL8: 8 bytes per element; LL16: 16 per two. So 2 u32 of packet space per element.
    let packets: GpuBuffer<u32> = ok!(GpuBuffer::new(pair.device, n_max * 2), "allocating packets");
    let errors: GpuBuffer<i32> = ok!(
        GpuBuffer::new(pair.device, 1),
        "allocating the error counter"
    );
    let conn = pair.connect(Transport::CudaIpc, 10);
    let reg_data = ok!(
        pair.comm
            .register_memory(data.data(), data.bytes(), Transport::CudaIpc.into()),
        "registering data"
    );
    let reg_packets = ok!(
        pair.comm
            .register_memory(packets.data(), packets.bytes(), Transport::CudaIpc.into()),
        "registering packets"
    );
    let peer_data = pair.exchange(&reg_data, 11);
    let peer_packets = pair.exchange(&reg_packets, 12);
    let sem_put = ok!(
        MemoryDevice2DeviceSemaphore::new(pair.semaphore(&conn, 13)),
        "d2d semaphore"
    );
    let sem_packet = ok!(
        MemoryDevice2DeviceSemaphore::new(pair.semaphore(&conn, 14)),
        "d2d semaphore"
    );
    let put_channel = ok!(
        MemoryChannel::new(sem_put, peer_data, data.data(), Some(packets.data())),
        "put channel"
    );
    let packet_channel = ok!(
        MemoryChannel::new(sem_packet, peer_packets, data.data(), Some(packets.data())),
        "packet channel"
    );
    pair.sync();
    McSetup {
        pair,
        data,
        _packets: packets,
        put_channel,
        packet_channel,
        errors,
        n_max,
    }
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Mode {
    Put,
    Get,
    Ll8,
    Ll16,
}

/// Host "kernel": the ping-pong of memory_channel_tests.cu on `threads` CPU threads.
fn host_ping_pong(
    s: &McSetup,
    mode: Mode,
    n: u64,
    iters: u32,
    flag_base: u32,
    check: bool,
    threads: u32,
) -> mscclpp::Result<u64> {
    let ch = match mode {
        Mode::Put | Mode::Get => s.put_channel.device_handle(),
        Mode::Ll8 | Mode::Ll16 => s.packet_channel.device_handle(),
    };
    let (seed, t) = (s.pair.seed, s.pair.timeout);
    let buf_addr = ch.src as usize;
    let bytes = n * 4;
    run_block(threads, |tid, bar: &BlockBarrier| {
        let buf = buf_addr as *mut u32;
        let mut errors = 0;
        for r in 0..iters {
            let flag = flag_base + r + 1;
            // SAFETY: the setup (channels, buffers) outlives the block; n <= n_max.
            unsafe {
                if s.pair.sends(r) {
                    if check {
                        fill_pattern(buf, n, seed, r, tid, threads);
                        bar.wait()?;
                    }
                    match mode {
                        Mode::Put => {
                            bar.wait()?;
                            ch.put(0, 0, bytes, tid, threads)?;
                            bar.wait()?;
                            if tid == 0 {
                                ch.signal();
                            }
                        }
                        Mode::Get => {
                            bar.wait()?;
                            if tid == 0 {
                                ch.signal();
                            }
                        }
                        Mode::Ll8 => {
                            ch.put_packets::<LL8Packet>(0, 0, bytes, tid, threads, flag)?
                        }
                        Mode::Ll16 => {
                            ch.put_packets::<LL16Packet>(0, 0, bytes, tid, threads, flag)?
                        }
                    }
                } else {
                    match mode {
                        Mode::Put | Mode::Get => {
                            if tid == 0 {
                                ch.wait(t)?;
                            }
                            bar.wait()?;
                            if mode == Mode::Get {
                                ch.get(0, 0, bytes, tid, threads)?;
                                bar.wait()?;
                            }
                        }
                        Mode::Ll8 => {
                            ch.unpack_packets::<LL8Packet>(0, 0, bytes, tid, threads, flag, t)?
                        }
                        Mode::Ll16 => {
                            ch.unpack_packets::<LL16Packet>(0, 0, bytes, tid, threads, flag, t)?
                        }
                    }
                    if check {
                        bar.wait()?;
                        errors += check_pattern(buf, n, seed, r, tid, threads);
                    }
                }
            }
            bar.wait()?;
        }
        Ok(errors)
    })
}

/// Runs `iters` rounds of `mode` with `n` elements; returns (mismatches, seconds).
pub(crate) fn ping_pong(
    s: &McSetup,
    mode: Mode,
    n: u64,
    iters: u32,
    flag_base: u32,
    check: bool,
) -> (u64, f64) {
    ASSERT_LE!(n as usize, s.n_max);
    s.pair.sync();
    if is_gpu_build() {
        let (name, packet) = match mode {
            Mode::Put => ("memory_channel_put_ping_pong", false),
            Mode::Get => ("memory_channel_get_ping_pong", false),
            Mode::Ll8 => ("memory_channel_ll8_ping_pong", true),
            Mode::Ll16 => ("memory_channel_ll16_ping_pong", true),
        };
        let k = load_zeroing_errors(s.pair.device, "memory_channel_tests", name, &s.errors);
        let err_ptr = s.errors.data() as usize as *mut i32;
        let ms = if packet {
            let a = PacketArgs {
                ch: s.packet_channel.device_handle(),
                n_elem: n,
                iters: iters as i32,
                initiator: s.pair.initiator as i32,
                flag_base,
                seed: s.pair.seed,
                check: check as i32,
                error_count: err_ptr,
            };
            ok!(
                // SAFETY: PacketArgs mirrors the kernel's parameters; the setup outlives the launch.
                unsafe { k.run(1, 1024, &a, s.pair.timeout) },
                "running {name}"
            )
        } else {
            let a = PingPongArgs {
                ch: s.put_channel.device_handle(),
                offset: 0,
                n_elem: n,
                iters: iters as i32,
                initiator: s.pair.initiator as i32,
                seed: s.pair.seed,
                check: check as i32,
                error_count: err_ptr,
            };
            ok!(
                // SAFETY: PingPongArgs mirrors the kernel's parameters.
                unsafe { k.run(1, 1024, &a, s.pair.timeout) },
                "running {name}"
            )
        };
        (read_errors(&s.errors), ms / 1e3)
    } else {
        let threads = if check { 2 } else { 1 };
        let start = std::time::Instant::now();
        let errors = ok!(
            host_ping_pong(s, mode, n, iters, flag_base, check, threads),
            "host ping-pong"
        );
        (errors, start.elapsed().as_secs_f64())
    }
}

fn correctness(ctx: &TestContext, mode: Mode) {
    let sizes: [u64; 3] = [1, 1000, 1 << 16];
    let s = mc_setup(ctx, 1 << 16);
    let iters = if is_gpu_build() { 100 } else { 16 };
    let mut flag_base = 0;
    for n in sizes {
        let n = if mode == Mode::Ll16 {
            n.next_multiple_of(2)
        } else {
            n
        };
        let (errors, _) = ping_pong(&s, mode, n, iters, flag_base, true);
        flag_base += iters;
        EXPECT_EQ!(
            errors,
            0,
            "{} elements: mismatches over {} rounds",
            n,
            iters
        );
    }
    // The data really moved: the last round's pattern is in this rank's buffer.
    let last = iters - 1;
    let n = *sizes.last().unwrap_or(&1) as usize;
    let got = ok!(s.data.to_vec(), "reading the buffer");
    let bad = (0..n)
        .filter(|&i| got[i] != test_pattern(s.pair.seed, last, i as u64))
        .count();
    EXPECT_EQ!(bad, 0, "elements differing from round {} at the end", last);
    s.pair.sync();
}

TEST!(MemoryChannelOneToOneTest, PutPingPong, |ctx| correctness(
    ctx,
    Mode::Put
));
TEST!(MemoryChannelOneToOneTest, GetPingPong, |ctx| correctness(
    ctx,
    Mode::Get
));
TEST!(MemoryChannelOneToOneTest, LL8PacketPingPong, |ctx| {
    correctness(ctx, Mode::Ll8)
});
TEST!(MemoryChannelOneToOneTest, LL16PacketPingPong, |ctx| {
    correctness(ctx, Mode::Ll16)
});

fn latency(ctx: &TestContext, mode: Mode, label: &str) {
    let s = mc_setup(ctx, 1 << 10);
    let (warm, iters) = if is_gpu_build() {
        (1000, 10_000)
    } else {
        (200, 2000)
    };
    // LL packets: one u64 packet (LL8) / one 16-byte packet (LL16) per hop, like upstream.
    let n = if mode == Mode::Ll16 { 2 } else { 1 };
    ping_pong(&s, mode, n, warm, 0, false);
    let (_, secs) = ping_pong(&s, mode, n, iters, warm, false);
    let us = secs * 1e6 / f64::from(iters);
    report_on_rank0(ctx, label, us, "us/iter");
    s.pair.sync();
}

PERF_TEST!(MemoryChannelOneToOneTest, LL8PacketPingPongPerf, |ctx| {
    latency(ctx, Mode::Ll8, "LL8 packet ping-pong (one hop)")
});
PERF_TEST!(MemoryChannelOneToOneTest, LL16PacketPingPongPerf, |ctx| {
    latency(ctx, Mode::Ll16, "LL16 packet ping-pong (one hop)")
});
PERF_TEST!(MemoryChannelOneToOneTest, PutPingPongPerf, |ctx| latency(
    ctx,
    Mode::Put,
    "put+signal ping-pong, 4 bytes (one hop)"
));

PERF_TEST!(MemoryChannelOneToOneTest, PutBandwidth, |ctx| {
    let bytes: u64 = if is_gpu_build() { 1 << 30 } else { 64 << 20 };
    let s = mc_setup(ctx, (bytes / 4) as usize);
    let iters = if is_gpu_build() { 20 } else { 4 };
    let ch = s.put_channel.device_handle();
    s.pair.sync();
    let secs = if is_gpu_build() {
        let k = ok!(
            GpuKernel::load(
                s.pair.device,
                "memory_channel_tests",
                "memory_channel_put_bandwidth"
            ),
            "loading the kernel"
        );
        let blocks = 132;
        let (role, grid, threads) = if s.pair.initiator {
            (1, blocks, 1024)
        } else {
            (0, 1, 1)
        };
        // Warm-up, then the measured run.
        for (it, measured) in [(2, false), (iters, true)] {
            s.pair.sync();
            let a = BandwidthArgs {
                ch,
                bytes,
                iters: it,
                role,
                peer_blocks: blocks as i32,
            };
            // SAFETY: BandwidthArgs mirrors the kernel's parameters.
            let ms = ok!(
                unsafe { k.run(grid, threads, &a, s.pair.timeout) },
                "running put bandwidth"
            );
            if measured {
                return report_bw(ctx, &s, bytes, iters, ms / 1e3);
            }
        }
        0.0
    } else {
        // Warm-up (first touch of the peer's pages), then the measured run.
        let mut secs = 0.0;
        for it in [1, iters] {
            s.pair.sync();
            let start = std::time::Instant::now();
            let r = run_block(1, |_, _| {
                // SAFETY: the setup outlives the block; bytes fit both buffers.
                unsafe {
                    if s.pair.initiator {
                        for _ in 0..it {
                            ch.put(0, 0, bytes, 0, 1)?;
                        }
                        ch.signal();
                        ch.wait(s.pair.timeout)?;
                    } else {
                        ch.wait(s.pair.timeout)?;
                        ch.signal();
                    }
                }
                Ok(0)
            });
            ok!(r, "host put bandwidth");
            secs = start.elapsed().as_secs_f64();
        }
        secs
    };
    report_bw(ctx, &s, bytes, iters, secs);
});

fn report_bw(ctx: &TestContext, s: &McSetup, bytes: u64, iters: i32, secs: f64) {
    let gbps = bytes as f64 * f64::from(iters) / secs / 1e9;
    if s.pair.initiator && ctx.rank() == 0 {
        ctx.report_perf(
            &format!("put bandwidth, {} MiB x {iters}", bytes >> 20),
            gbps,
            "GB/s",
        );
    }
    EXPECT_GT!(gbps, 0.0);
    s.pair.sync();
}

#[cfg(test)]
mod block_tests {
    use super::common::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_failed_thread_releases_the_others_barrier_waits() {
        let start = Instant::now();
        let r = run_block(4, |tid, bar| {
            if tid == 2 {
                return Err(mscclpp::Error::Internal("thread 2 failed".into()));
            }
            bar.wait()?;
            Ok(1)
        });
        // std::sync::Barrier (the old one) blocked the three others forever here.
        match r {
            Err(mscclpp::Error::Internal(m)) => assert!(m.contains("thread 2"), "{m}"),
            other => panic!("expected thread 2's error first, got {other:?}"),
        }
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_barrier_of_live_threads_synchronises_every_round() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let arrived = AtomicU32::new(0);
        let r = run_block(3, |_, bar| {
            let mut bad = 0;
            for round in 1..=50u32 {
                arrived.fetch_add(1, Ordering::SeqCst);
                bar.wait()?;
                if arrived.load(Ordering::SeqCst) != 3 * round {
                    bad += 1;
                }
                bar.wait()?;
            }
            Ok(bad)
        });
        assert_eq!(r.unwrap(), 0);
    }
}
