//! ProxyService and port channels on the host backend, in one process: CPU threads act as the
//! devices of two endpoints of one context, connected over CudaIpc (host memfd IPC) or Ethernet.

use std::time::Duration;

use mscclpp::device_emu::memory_channel::MemorySemaphoreOps;
use mscclpp::semaphore::{
    Host2DeviceSemaphore, MemoryDevice2DeviceSemaphore, Semaphore, SemaphoreStub,
};
use mscclpp::{
    Connection, Context, Device, EndpointConfig, GpuBuffer, MemoryChannel, ProxyService, Transport,
    TransportFlags,
};

const T: Duration = Duration::from_secs(20);

fn connect_pair(ctx: &Context, transport: Transport) -> (Connection, Connection) {
    let cfg = EndpointConfig::new(transport, Device::CPU);
    let ea = ctx.create_endpoint(cfg).expect("endpoint a");
    let eb = ctx.create_endpoint(cfg).expect("endpoint b");
    std::thread::scope(|s| {
        let ab = s.spawn(|| ctx.connect(&ea, &eb));
        let ba = ctx.connect(&eb, &ea).expect("connect b->a");
        (
            ab.join().expect("connect thread").expect("connect a->b"),
            ba,
        )
    })
}

fn semaphores(ctx: &Context, ab: &Connection, ba: &Connection) -> (Semaphore, Semaphore) {
    let sa = SemaphoreStub::new(ctx, ab).expect("stub a");
    let sb = SemaphoreStub::new(ctx, ba).expect("stub b");
    let (ma, mb) = (sa.memory().clone(), sb.memory().clone());
    (
        Semaphore::new(sa, mb, ab.clone()).expect("semaphore a"),
        Semaphore::new(sb, ma, ba.clone()).expect("semaphore b"),
    )
}

fn pattern(round: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(0x9E37_79B9) ^ round.wrapping_mul(0x85EB_CA6B) ^ 0x5555)
        .collect()
}

fn port_channel_ping_pong(transport: Transport) {
    let ctx = Context::new().expect("context");
    let (ab, ba) = connect_pair(&ctx, transport);
    let (sa, sb) = semaphores(&ctx, &ab, &ba);
    let n = 1024;
    let buf_a: GpuBuffer<u32> = GpuBuffer::new(Device::CPU, n).expect("buffer a");
    let buf_b: GpuBuffer<u32> = GpuBuffer::new(Device::CPU, n).expect("buffer b");
    let flags = TransportFlags::from(transport);
    let reg_a = ctx
        .register_memory(buf_a.data(), buf_a.bytes(), flags)
        .expect("register a");
    let reg_b = ctx
        .register_memory(buf_b.data(), buf_b.bytes(), flags)
        .expect("register b");

    let mut proxy = ProxyService::new_host().expect("proxy");
    let id_a = proxy
        .add_semaphore(Host2DeviceSemaphore::new(sa).expect("h2d a"))
        .expect("add a");
    let id_b = proxy
        .add_semaphore(Host2DeviceSemaphore::new(sb).expect("h2d b"))
        .expect("add b");
    let (ma, mb) = (
        proxy.add_memory(reg_a).expect("mem a"),
        proxy.add_memory(reg_b).expect("mem b"),
    );
    let ch_a = proxy
        .port_channel(id_a, mb, ma)
        .expect("channel a")
        .device_handle();
    let ch_b = proxy
        .port_channel(id_b, ma, mb)
        .expect("channel b")
        .device_handle();
    assert!(
        proxy.port_channel(id_a, 7, ma).is_err(),
        "unknown memory id"
    );
    proxy.start_proxy().expect("start");

    let rounds = 20u32;
    std::thread::scope(|s| {
        let (ba_ref, bb_ref) = (&buf_a, &buf_b);
        // "Device" of B: receives even rounds, sends odd rounds back.
        s.spawn(move || {
            for r in 0..rounds {
                // SAFETY: proxy, buffers and semaphores outlive the scope.
                unsafe {
                    if r % 2 == 0 {
                        ch_b.wait(T).expect("b waits");
                        assert_eq!(
                            bb_ref.to_vec().expect("read b"),
                            pattern(r, n),
                            "round {r} at b"
                        );
                    } else {
                        bb_ref.copy_from_host(0, &pattern(r, n)).expect("fill b");
                        ch_b.put_with_signal(0, 0, (n * 4) as u64, T)
                            .expect("b sends");
                    }
                }
            }
            // SAFETY: as above.
            unsafe { ch_b.flush(T) }.expect("b flush");
        });
        for r in 0..rounds {
            // SAFETY: as above.
            unsafe {
                if r % 2 == 0 {
                    ba_ref.copy_from_host(0, &pattern(r, n)).expect("fill a");
                    if r == 0 {
                        ch_a.put(0, 0, (n * 4) as u64, T).expect("a put");
                        ch_a.signal(T).expect("a signal");
                    } else {
                        ch_a.put_with_signal_and_flush(0, 0, (n * 4) as u64, T)
                            .expect("a sends");
                    }
                } else {
                    let start = std::time::Instant::now();
                    while !ch_a.poll() {
                        assert!(start.elapsed() < T, "a never saw round {r}");
                        std::thread::yield_now();
                    }
                    assert_eq!(
                        ba_ref.to_vec().expect("read a"),
                        pattern(r, n),
                        "round {r} at a"
                    );
                }
            }
        }
        // SAFETY: as above.
        unsafe { ch_a.flush(T) }.expect("a flush");
    });
    assert!(
        proxy.handled() >= u64::from(rounds),
        "the proxy handled the requests"
    );
    assert_eq!(proxy.last_error(), None);
    proxy.stop_proxy().expect("no request failed");
}

#[test]
fn port_channel_ping_pong_cuda_ipc() {
    port_channel_ping_pong(Transport::CudaIpc);
}

#[test]
fn port_channel_ping_pong_ethernet() {
    port_channel_ping_pong(Transport::Ethernet);
}

#[test]
fn proxy_records_bad_requests_and_still_pops() {
    let ctx = Context::new().expect("context");
    let (ab, ba) = connect_pair(&ctx, Transport::CudaIpc);
    let (sa, _sb) = semaphores(&ctx, &ab, &ba);
    let buf: GpuBuffer<u32> = GpuBuffer::new(Device::CPU, 16).expect("buffer");
    let reg = ctx
        .register_memory(buf.data(), buf.bytes(), Transport::CudaIpc.into())
        .expect("register");
    let mut proxy = ProxyService::new_host().expect("proxy");
    let id = proxy
        .add_semaphore(Host2DeviceSemaphore::new(sa).expect("h2d"))
        .expect("add");
    let m = proxy.add_memory(reg).expect("mem");
    let ch = proxy
        .base_port_channel(id)
        .expect("base channel")
        .device_handle();
    proxy.start_proxy().expect("start");
    // SAFETY: the proxy outlives the calls.
    unsafe {
        let before = ch.fifo.failed_triggers();
        // Memory id 3 was never added; the size runs past the buffer on the second request.
        ch.put(3, 0, m, 0, 4, T).expect("push");
        ch.put(m, 0, m, 32, 64, T).expect("push");
        // The flush completes (never hangs on failed requests); whether it reports them
        // depends on whether they failed before or after it started.
        if let Err(e) = ch.flush(T) {
            assert!(e.to_string().contains("failed"), "{e}");
        }
        assert_eq!(
            ch.fifo.failed_triggers() - before,
            2,
            "the device sees both failures"
        );
    }
    assert_eq!(proxy.failed_requests(), 2);
    assert!(proxy.last_error().is_some());
    let err = proxy.stop_proxy().expect_err("the failures are surfaced");
    assert!(err.to_string().contains("2 proxy requests failed"), "{err}");
    proxy.stop_proxy().expect("errors are reported once");
}

#[test]
fn memory_channel_put_and_packets_in_process() {
    let ctx = Context::new().expect("context");
    let (ab, ba) = connect_pair(&ctx, Transport::CudaIpc);
    let (sa, sb) = semaphores(&ctx, &ab, &ba);
    let n = 256;
    let bufs: Vec<GpuBuffer<u32>> = (0..4)
        .map(|_| GpuBuffer::new(Device::CPU, n * 2).expect("buffer"))
        .collect();
    let regs: Vec<_> = bufs
        .iter()
        .map(|b| {
            ctx.register_memory(b.data(), b.bytes(), Transport::CudaIpc.into())
                .expect("register")
        })
        .collect();
    // a: data bufs[0], packets bufs[1]; b: data bufs[2], packets bufs[3]. Packet channels target the peer's packet buffer.
    let channel = |sem, dst: usize, data: usize| {
        let sem = MemoryDevice2DeviceSemaphore::new(sem).expect("d2d");
        let packets = Some(bufs[data + 1].data());
        MemoryChannel::new(sem, regs[dst].clone(), bufs[data].data(), packets).expect("channel")
    };
    let (ch_a, ch_b) = (channel(sa, 3, 0), channel(sb, 1, 2));
    let (ha, hb) = (ch_a.device_handle(), ch_b.device_handle());
    let data = pattern(1, n);
    bufs[0].copy_from_host(0, &data).expect("fill");
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: channels and buffers outlive the scope; offsets inside the buffers.
            unsafe {
                hb.unpack_packets::<mscclpp::LL16Packet>(0, 0, (n * 4) as u64, 0, 1, 1, T)
                    .expect("b unpacks");
                hb.signal();
            }
        });
        // SAFETY: as above.
        unsafe {
            for t in 0..4 {
                ha.put_packets::<mscclpp::LL16Packet>(0, 0, (n * 4) as u64, t, 4, 1)
                    .expect("a packs");
            }
            ha.wait(T).expect("b acknowledged");
        }
    });
    assert_eq!(bufs[2].to_vec().expect("read b")[..n], data[..]);
}
