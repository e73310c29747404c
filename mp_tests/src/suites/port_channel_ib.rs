//! PortChannelOneToOneTest, IB variants: the port channel tests over an IB0 connection in Host
//! mode (RDMA atomics signal) and HostNoAtomic mode (write-with-immediate and a forwarding
//! thread), plus several "device" threads sharing one channel with put_with_signal_and_flush.
//!
//! The mode comes from each test's `EndpointConfig.ib.mode`, so one process runs both. Memory is
//! host memory on `Device::CPU` endpoints (the test verbs provider cannot touch GPU memory), and
//! the device side is played by CPU threads with `mscclpp::device_emu` on every build: the proxy's
//! FIFO is a host FIFO (`ProxyService::new_host`) and the semaphore tokens live in host memory.
//! Without an IB device every test skips with the reason, on every rank.

use std::sync::atomic::{AtomicU64, Ordering};

use mscclpp::{EndpointConfig, IbMode};
use mscclpp_framework::*;

use super::ib::{ib_config, require_ib};
use super::memory_channel::common::*;
use super::port_channel::{bandwidth, correctness, packet_ping_pong, setup};

/// The IB0 endpoint configuration in `mode` on the CPU; skips when no IB device is usable.
fn ib(mode: IbMode) -> EndpointConfig {
    require_ib();
    ib_config(mode)
}

TEST!(PortChannelOneToOneTest, PingPongIbHostMode, |ctx| {
    correctness(ctx, ib(IbMode::Host), false)
});
TEST!(PortChannelOneToOneTest, PingPongIbHostNoAtomicMode, |ctx| {
    correctness(ctx, ib(IbMode::HostNoAtomic), false)
});
TEST!(PortChannelOneToOneTest, PacketPingPongIbHostMode, |ctx| {
    packet_ping_pong(ctx, ib(IbMode::Host))
});
TEST!(
    PortChannelOneToOneTest,
    PacketPingPongIbHostNoAtomicMode,
    |ctx| packet_ping_pong(ctx, ib(IbMode::HostNoAtomic))
);

/// Sender threads sharing the channel ("blocks" of the device side).
const FLUSH_THREADS: u32 = 8;
/// put_with_signal_and_flush calls per sender thread.
const FLUSH_ROUNDS: u32 = 16;
/// u32 elements of one put (the chunk of one thread in one round).
const FLUSH_CHUNK: u64 = 1000;

/// The value of element `i` of the chunks sent by the initiator (`from_initiator`) or its peer.
fn flush_pattern(seed: u64, from_initiator: bool, i: u64) -> u32 {
    test_pattern(seed, u32::from(from_initiator), i)
}

/// Both ranks at once: FLUSH_THREADS threads each put FLUSH_ROUNDS chunks of their own with
/// put_with_signal_and_flush on the one channel, while another thread waits for the peer's
/// FLUSH_THREADS * FLUSH_ROUNDS signals. When the last signal is in, every chunk must be there
/// (data never trails its signal), and no extra signal may follow.
fn same_chan_concurrent_flush(ctx: &TestContext, cfg: EndpointConfig) {
    let puts = u64::from(FLUSH_THREADS * FLUSH_ROUNDS);
    // Elements [0, half) are the sources, [half, 2 half) receive the peer's chunks.
    let half = puts * FLUSH_CHUNK;
    let s = setup(ctx, cfg, (2 * half) as usize);
    if s.on_gpu() {
        SKIP!(
            "SameChanConcurrentFlush drives the channel from CPU threads; this setup is on a GPU"
        );
    }
    let ch = s.channel.device_handle();
    let buf_addr = s.data.data() as usize;
    let (seed, t, initiator) = (s.pair.seed, s.pair.timeout, s.pair.initiator);
    s.pair.sync();
    let r = run_block(FLUSH_THREADS + 1, |tid, _| {
        if tid == FLUSH_THREADS {
            for k in 0..puts {
                // SAFETY: the setup outlives the block; only this thread waits on the channel.
                if let Err(e) = unsafe { ch.wait(t) } {
                    return Err(mscclpp::Error::Internal(format!(
                        "signal {} of {puts}: {e}",
                        k + 1
                    )));
                }
            }
            return Ok(0);
        }
        let buf = buf_addr as *mut u32;
        for r in 0..FLUSH_ROUNDS {
            // Interleave the threads' chunks so neighbouring puts come from different threads.
            let off = u64::from(r * FLUSH_THREADS + tid) * FLUSH_CHUNK;
            for i in off..off + FLUSH_CHUNK {
                // SAFETY: i < half <= the buffer's length; this thread alone owns the chunk.
                unsafe {
                    buf.add(i as usize)
                        .write_volatile(flush_pattern(seed, initiator, i))
                };
            }
            // SAFETY: both ranges lie inside the registered buffers.
            unsafe { ch.put_with_signal_and_flush((half + off) * 4, off * 4, FLUSH_CHUNK * 4, t)? };
        }
        Ok(0)
    });
    ok!(r, "concurrent put_with_signal_and_flush");
    // The last signal is in: every chunk of the peer must be here, before any pair sync.
    let got = ok!(s.data.to_vec(), "reading the buffer");
    let bad: Vec<u64> = (half..2 * half)
        .filter(|&i| got[i as usize] != flush_pattern(seed, !initiator, i - half))
        .collect();
    EXPECT_EQ!(
        bad.len(),
        0,
        "elements missing or wrong after all {} signals (first at element {:?} of the receive half)",
        puts,
        bad.first().map(|i| i - half)
    );
    s.pair.sync();
    // The peer's flushes are all done: the token must count exactly one signal per put.
    // SAFETY: the token is a live, aligned host u64 of this setup's semaphore.
    let token =
        unsafe { AtomicU64::from_ptr(ch.base.semaphore.inbound_token) }.load(Ordering::Acquire);
    EXPECT_EQ!(
        token,
        puts,
        "the inbound token after the peer's {} puts",
        puts
    );
    EXPECT_FALSE!(
        // SAFETY: as above; no other thread waits on the channel now.
        unsafe { ch.poll() },
        "a signal beyond the {} expected",
        puts
    );
    EXPECT_GE!(s.proxy.handled(), puts);
    s.finish();
}

TEST!(
    PortChannelOneToOneTest,
    SameChanConcurrentFlushIbHostMode,
    |ctx| same_chan_concurrent_flush(ctx, ib(IbMode::Host))
);

PERF_TEST!(PortChannelOneToOneTest, BandwidthIbHostMode, |ctx| {
    bandwidth(ctx, ib(IbMode::Host), " over IB (Host mode)")
});
PERF_TEST!(
    PortChannelOneToOneTest,
    BandwidthIbHostNoAtomicMode,
    |ctx| bandwidth(
        ctx,
        ib(IbMode::HostNoAtomic),
        " over IB (HostNoAtomic mode)"
    )
);
