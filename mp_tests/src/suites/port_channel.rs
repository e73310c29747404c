//! PortChannelOneToOneTest: ping-pong through the proxy (CudaIpc and Ethernet connections),
//! with wait or poll, LL16 packets moved by the proxy, and the perf figures (one-hop latency,
//! bandwidth). Ranks r and r^1 pair up. GPU builds run kernels/cuda/test_kernels/port_channel_tests.cu;
//! the host backend runs the same protocol on CPU threads with `mscclpp::device_emu`. The helpers
//! take an [`EndpointConfig`] and are shared with the IB variants (`port_channel_ib`), which
//! run on `Device::CPU` endpoints and CPU threads whatever the build.

use std::time::Instant;

use mscclpp::device_emu::packet::{copy_from_packets, copy_to_packets};
use mscclpp::packet::LL16Packet;
use mscclpp::semaphore::Host2DeviceSemaphore;
use mscclpp::{
    Device, DeviceType, EndpointConfig, GpuBuffer, PortChannel, PortChannelDeviceHandle,
    ProxyService, Transport,
};
use mscclpp_framework::*;

use super::memory_channel::common::*;

/// Arguments of port_channel_ping_pong.
#[repr(C)]
#[derive(Clone, Copy)]
struct PingPongArgs {
    ch: PortChannelDeviceHandle,
    buff: *mut u32,
    n_elem: u64,
    iters: i32,
    initiator: i32,
    use_poll: i32,
    seed: u64,
    check: i32,
    error_count: *mut i32,
}

/// Arguments of port_channel_packet_ping_pong.
#[repr(C)]
#[derive(Clone, Copy)]
struct PacketArgs {
    ch: PortChannelDeviceHandle,
    buff: *mut u32,
    packet_buffer: *mut u32,
    n_elem: u64,
    iters: i32,
    initiator: i32,
    flag_base: u32,
    seed: u64,
    check: i32,
    error_count: *mut i32,
}

/// Arguments of port_channel_put_bandwidth.
#[repr(C)]
#[derive(Clone, Copy)]
struct BandwidthArgs {
    ch: PortChannelDeviceHandle,
    bytes: u64,
    chunk_bytes: u64,
    iters: i32,
    role: i32,
}

pub(crate) struct PcSetup {
    pub(crate) pair: Pair,
    /// Where the buffers, tokens and FIFO live; `Device::CPU`: CPU threads play the device.
    device: Device,
    pub(crate) data: GpuBuffer<u32>,
    packets: GpuBuffer<u32>,
    errors: GpuBuffer<i32>,
    /// data -> peer's data.
    pub(crate) channel: PortChannel,
    /// own packet buffer -> peer's packet buffer.
    packet_channel: PortChannel,
    pub(crate) proxy: ProxyService,
    n_max: usize,
}

/// Connects the pair over `cfg` and builds the data and packet channels of `n_max` u32.
///
/// IB transports run where `cfg.device` says (the IB variants: `Device::CPU`, host memory);
/// the other transports run on the pair's device (a GPU on GPU builds), so a bare
/// `Transport::X.into()` keeps its old meaning.
pub(crate) fn setup(ctx: &TestContext, cfg: EndpointConfig, n_max: usize) -> PcSetup {
    let pair = pair(ctx);
    let mut cfg = cfg;
    if !cfg.transport.is_ib() {
        cfg.device = pair.device;
    }
    let (device, transport) = (cfg.device, cfg.transport);
    let data: GpuBuffer<u32> = ok!(GpuBuffer::new(device, n_max), "allocating data");
    // Packet memory: [0, P) receives, [P, 2P) stages; P = n_max * 8 bytes = n_max * 2 u32.
    let packets: GpuBuffer<u32> = ok!(GpuBuffer::new(device, n_max * 4), "allocating packets");
    let errors: GpuBuffer<i32> = ok!(GpuBuffer::new(device, 1), "allocating the error counter");
    let conn = ok!(
        pair.comm.connect(cfg, pair.peer, 20).get(),
        "connecting to rank {} over {transport}",
        pair.peer
    );
    let flags = transport.into();
    let reg_data = ok!(
        pair.comm.register_memory(data.data(), data.bytes(), flags),
        "registering data"
    );
    let reg_packets = ok!(
        pair.comm
            .register_memory(packets.data(), packets.bytes(), flags),
        "registering packets"
    );
    let peer_data = pair.exchange(&reg_data, 21);
    let peer_packets = pair.exchange(&reg_packets, 22);
    let sem_data = ok!(
        Host2DeviceSemaphore::new(pair.semaphore(&conn, 23)),
        "h2d semaphore"
    );
    let sem_packets = ok!(
        Host2DeviceSemaphore::new(pair.semaphore(&conn, 24)),
        "h2d semaphore"
    );
    let mut proxy = ok!(
        if device.kind == DeviceType::Gpu {
            ProxyService::new()
        } else {
            ProxyService::new_host()
        },
        "creating the proxy"
    );
    let sid = ok!(proxy.add_semaphore(sem_data), "adding a semaphore");
    let sid_p = ok!(proxy.add_semaphore(sem_packets), "adding a semaphore");
    let m_local = ok!(proxy.add_memory(reg_data), "adding memory");
    let m_peer = ok!(proxy.add_memory(peer_data), "adding memory");
    let p_local = ok!(proxy.add_memory(reg_packets), "adding memory");
    let p_peer = ok!(proxy.add_memory(peer_packets), "adding memory");
    let channel = ok!(proxy.port_channel(sid, m_peer, m_local), "port channel");
    let packet_channel = ok!(proxy.port_channel(sid_p, p_peer, p_local), "port channel");
    ok!(proxy.start_proxy(), "starting the proxy");
    pair.sync();
    PcSetup {
        pair,
        device,
        data,
        packets,
        errors,
        channel,
        packet_channel,
        proxy,
        n_max,
    }
}

impl PcSetup {
    /// Whether GPU kernels play the device (else CPU threads with `mscclpp::device_emu`).
    pub(crate) fn on_gpu(&self) -> bool {
        self.device.kind == DeviceType::Gpu
    }

    /// Kernel `name` of port_channel_tests, with the error counter zeroed.
    fn kernel(&self, name: &str) -> GpuKernel {
        load_zeroing_errors(self.pair.device, "port_channel_tests", name, &self.errors)
    }

    /// The kernels' error counter.
    fn error_count(&self) -> *mut i32 {
        self.errors.data() as usize as *mut i32
    }

    /// Stops the proxy (surfacing any failed request) after both ranks are done.
    pub(crate) fn finish(mut self) {
        self.pair.sync();
        ok!(self.proxy.stop_proxy(), "proxy requests");
        self.pair.sync();
    }
}

/// port_channel_ping_pong on the host (thread 0 pushes, 2 threads fill/check).
fn host_ping_pong(
    s: &PcSetup,
    n: u64,
    iters: u32,
    use_poll: bool,
    check: bool,
) -> mscclpp::Result<u64> {
    let ch = s.channel.device_handle();
    let buf_addr = s.data.data() as usize;
    let (seed, t) = (s.pair.seed, s.pair.timeout);
    let threads = if check { 2 } else { 1 };
    run_block(threads, |tid, bar| {
        let buf = buf_addr as *mut u32;
        let mut errors = 0;
        for r in 0..iters {
            // SAFETY: the setup outlives the block; n <= n_max.
            unsafe {
                if s.pair.sends(r) {
                    if check {
                        fill_pattern(buf, n, seed, r, tid, threads);
                    }
                    bar.wait()?;
                    if tid == 0 {
                        if n > 0 {
                            ch.put_with_signal(0, 0, n * 4, t)?;
                        } else {
                            ch.signal(t)?;
                        }
                    }
                } else {
                    if tid == 0 {
                        if use_poll {
                            let start = Instant::now();
                            while !ch.poll() {
                                if start.elapsed() > t {
                                    return Err(mscclpp::Error::timeout(
                                        format!("polling for round {r}"),
                                        t,
                                    ));
                                }
                                std::thread::yield_now();
                            }
                        } else {
                            ch.wait(t)?;
                        }
                    }
                    bar.wait()?;
                    if check {
                        errors += check_pattern(buf, n, seed, r, tid, threads);
                    }
                    bar.wait()?;
                }
            }
        }
        if tid == 0 {
            // SAFETY: as above.
            unsafe { ch.flush(t)? };
        }
        Ok(errors)
    })
}

/// port_channel_packet_ping_pong on the host.
fn host_packet_ping_pong(s: &PcSetup, n: u64, iters: u32, flag_base: u32) -> mscclpp::Result<u64> {
    let ch = s.packet_channel.device_handle();
    let (buf_addr, pk_addr) = (s.data.data() as usize, s.packets.data() as usize);
    let p = n * 8;
    let (seed, t) = (s.pair.seed, s.pair.timeout);
    let threads = 2;
    run_block(threads, |tid, bar| {
        let (buf, pk) = (buf_addr as *mut u32, pk_addr as *mut u8);
        let mut errors = 0;
        for r in 0..iters {
            let flag = flag_base + r + 1;
            // SAFETY: the setup outlives the block; 2P bytes fit the packet buffer.
            unsafe {
                if s.pair.sends(r) {
                    fill_pattern(buf, n, seed, r, tid, threads);
                    bar.wait()?;
                    copy_to_packets(
                        pk.add(p as usize).cast::<LL16Packet>(),
                        buf.cast(),
                        n * 4,
                        tid,
                        threads,
                        flag,
                    )?;
                    bar.wait()?;
                    if tid == 0 {
                        ch.put(0, p, p, t)?;
                    }
                } else {
                    copy_from_packets(
                        buf.cast(),
                        pk.cast::<LL16Packet>(),
                        n * 4,
                        tid,
                        threads,
                        flag,
                        t,
                    )?;
                    bar.wait()?;
                    errors += check_pattern(buf, n, seed, r, tid, threads);
                }
            }
            bar.wait()?;
        }
        if tid == 0 {
            // SAFETY: as above.
            unsafe { ch.flush(t)? };
        }
        Ok(errors)
    })
}

/// Runs the ping-pong; returns (mismatches, seconds).
fn ping_pong(s: &PcSetup, n: u64, iters: u32, use_poll: bool, check: bool) -> (u64, f64) {
    ping_pong_on(s, n, iters, use_poll, check, false)
}

/// [`ping_pong`], with the GPU kernel on the legacy default stream when `legacy`.
fn ping_pong_on(
    s: &PcSetup,
    n: u64,
    iters: u32,
    use_poll: bool,
    check: bool,
    legacy: bool,
) -> (u64, f64) {
    ASSERT_LE!(n as usize, s.n_max);
    s.pair.sync();
    if s.on_gpu() {
        let k = s.kernel("port_channel_ping_pong");
        let a = PingPongArgs {
            ch: s.channel.device_handle(),
            buff: s.data.data() as usize as *mut u32,
            n_elem: n,
            iters: iters as i32,
            initiator: s.pair.initiator as i32,
            use_poll: use_poll as i32,
            seed: s.pair.seed,
            check: check as i32,
            error_count: s.error_count(),
        };
        // SAFETY: PingPongArgs mirrors the kernel's parameters; the setup outlives the launch.
        let ms = ok!(
            unsafe {
                if legacy {
                    k.run_on_legacy_stream(1, 1024, &a, s.pair.timeout)
                } else {
                    k.run(1, 1024, &a, s.pair.timeout)
                }
            },
            "running port_channel_ping_pong{}",
            if legacy { " on the legacy stream" } else { "" }
        );
        (read_errors(&s.errors), ms / 1e3)
    } else {
        let start = Instant::now();
        let errors = ok!(
            host_ping_pong(s, n, iters, use_poll, check),
            "host ping-pong"
        );
        (errors, start.elapsed().as_secs_f64())
    }
}

/// Ping-pong of 0, 1, 1000 and 2^16 elements, checked every round and at the end.
pub(crate) fn correctness(ctx: &TestContext, cfg: EndpointConfig, use_poll: bool) {
    let s = setup(ctx, cfg, 1 << 16);
    let iters = if s.on_gpu() { 100 } else { 10 };
    for n in [0u64, 1, 1000, 1 << 16] {
        let (errors, _) = ping_pong(&s, n, iters, use_poll, true);
        EXPECT_EQ!(
            errors,
            0,
            "{} elements: mismatches over {} rounds",
            n,
            iters
        );
    }
    let got = ok!(s.data.to_vec(), "reading the buffer");
    let bad = (0..1usize << 16)
        .filter(|&i| got[i] != test_pattern(s.pair.seed, iters - 1, i as u64))
        .count();
    EXPECT_EQ!(bad, 0, "elements differing from the last round");
    EXPECT_GT!(s.proxy.handled(), 0u64);
    s.finish();
}

TEST!(PortChannelOneToOneTest, PingPong, |ctx| correctness(
    ctx,
    Transport::CudaIpc.into(),
    false
));
TEST!(
    PortChannelOneToOneTest,
    PingPongWithPoll,
    |ctx| correctness(ctx, Transport::CudaIpc.into(), true)
);
TEST!(
    PortChannelOneToOneTest,
    PingPongEthernet,
    |ctx| correctness(ctx, Transport::Ethernet.into(), false)
);

// Ethernet with the kernels on the legacy default stream, where PyTorch runs its synchronous
// collectives: while the ping-pong kernel waits there for the peer's data and token, the
// Ethernet threads must deliver both without GPU work that would queue behind it (the HAL's
// copies once synchronised with the legacy stream, and this deadlocked until the timeout).
TEST!(
    PortChannelOneToOneTest,
    PingPongEthernetLegacyStream,
    |ctx| {
        if !is_gpu_build() {
            SKIP!("needs a GPU build: the host backend has no legacy stream");
        }
        let s = setup(ctx, Transport::Ethernet.into(), 1 << 16);
        let iters = 100;
        for n in [1u64, 1 << 16] {
            let (errors, _) = ping_pong_on(&s, n, iters, false, true, true);
            EXPECT_EQ!(
                errors,
                0,
                "{} elements on the legacy stream: mismatches over {} rounds",
                n,
                iters
            );
        }
        s.finish();
    }
);

/// LL16 packets moved by the proxy (2, 1000 and 2^14 elements), checked every round.
pub(crate) fn packet_ping_pong(ctx: &TestContext, cfg: EndpointConfig) {
    let s = setup(ctx, cfg, 1 << 14);
    let iters = if s.on_gpu() { 100 } else { 10 };
    let mut flag_base = 0;
    for n in [2u64, 1000, 1 << 14] {
        s.pair.sync();
        let errors = if s.on_gpu() {
            let k = s.kernel("port_channel_packet_ping_pong");
            let a = PacketArgs {
                ch: s.packet_channel.device_handle(),
                buff: s.data.data() as usize as *mut u32,
                packet_buffer: s.packets.data() as usize as *mut u32,
                n_elem: n,
                iters: iters as i32,
                initiator: s.pair.initiator as i32,
                flag_base,
                seed: s.pair.seed,
                check: 1,
                error_count: s.error_count(),
            };
            ok!(
                // SAFETY: PacketArgs mirrors the kernel's parameters.
                unsafe { k.run(1, 1024, &a, s.pair.timeout) },
                "running port_channel_packet_ping_pong"
            );
            read_errors(&s.errors)
        } else {
            ok!(
                host_packet_ping_pong(&s, n, iters, flag_base),
                "host packet ping-pong"
            )
        };
        flag_base += iters;
        EXPECT_EQ!(
            errors,
            0,
            "{} elements: mismatches over {} rounds",
            n,
            iters
        );
    }
    s.finish();
}

TEST!(PortChannelOneToOneTest, PacketPingPong, |ctx| {
    packet_ping_pong(ctx, Transport::CudaIpc.into())
});

PERF_TEST!(PortChannelOneToOneTest, PingPongPerf, |ctx| {
    let s = setup(ctx, Transport::CudaIpc.into(), 1 << 10);
    let (warm, iters) = if s.on_gpu() {
        (1000, 10_000)
    } else {
        (100, 1000)
    };
    ping_pong(&s, 1, warm, false, false);
    let (_, secs) = ping_pong(&s, 1, iters, false, false);
    let us = secs * 1e6 / f64::from(iters);
    report_on_rank0(
        ctx,
        "port channel put+signal ping-pong, 4 bytes (one hop)",
        us,
        "us/iter",
    );
    s.finish();
});

/// Put bandwidth from the initiator to its peer; `label` names the transport in the report.
pub(crate) fn bandwidth(ctx: &TestContext, cfg: EndpointConfig, label: &str) {
    // Where the setup will put the device: IB stays on cfg.device, the rest on the GPU if any.
    let on_gpu = if cfg.transport.is_ib() {
        cfg.device.kind == DeviceType::Gpu
    } else {
        is_gpu_build()
    };
    let bytes: u64 = if on_gpu { 1 << 30 } else { 64 << 20 };
    // Trigger sizes are < 2^32, so 1 GiB goes as 4 chunks of 256 MiB.
    let chunk = bytes.min(256 << 20);
    let s = setup(ctx, cfg, (bytes / 4) as usize);
    let iters: i32 = if s.on_gpu() { 10 } else { 3 };
    let ch = s.channel.device_handle();
    let role = if s.pair.initiator { 1 } else { 0 };
    let mut secs = 0.0;
    for (it, measured) in [(1, false), (iters, true)] {
        s.pair.sync();
        let t = if s.on_gpu() {
            let k = ok!(
                GpuKernel::load(
                    s.pair.device,
                    "port_channel_tests",
                    "port_channel_put_bandwidth"
                ),
                "loading the kernel"
            );
            let a = BandwidthArgs {
                ch,
                bytes,
                chunk_bytes: chunk,
                iters: it,
                role,
            };
            // SAFETY: BandwidthArgs mirrors the kernel's parameters.
            ok!(
                unsafe { k.run(1, 1, &a, s.pair.timeout) },
                "running port_channel_put_bandwidth"
            ) / 1e3
        } else {
            let start = Instant::now();
            let r = run_block(1, |_, _| {
                let tm = s.pair.timeout;
                // SAFETY: the setup outlives the block; the ranges fit the buffers.
                unsafe {
                    if role == 1 {
                        for _ in 0..it {
                            let mut off = 0;
                            while off < bytes {
                                ch.put(off, off, chunk.min(bytes - off), tm)?;
                                off += chunk;
                            }
                        }
                        ch.signal(tm)?;
                        ch.flush(tm)?;
                    } else {
                        ch.wait(tm)?;
                    }
                }
                Ok(0)
            });
            ok!(r, "host bandwidth");
            start.elapsed().as_secs_f64()
        };
        if measured {
            secs = t;
        }
    }
    let gbps = bytes as f64 * f64::from(iters) / secs / 1e9;
    if s.pair.initiator && ctx.rank() == 0 {
        ctx.report_perf(
            &format!(
                "port channel put bandwidth{label}, {} MiB x {iters}",
                bytes >> 20
            ),
            gbps,
            "GB/s",
        );
    }
    EXPECT_GT!(gbps, 0.0);
    s.finish();
}

PERF_TEST!(PortChannelOneToOneTest, Bandwidth, |ctx| bandwidth(
    ctx,
    Transport::CudaIpc.into(),
    ""
));
