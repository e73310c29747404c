//! IbPeerToPeerTest: the IB transport between rank r and r^1 over host memory: RDMA writes
//! checked byte by byte (and their bandwidth), ordering of data before signals over many rounds,
//! and signal throughput (RDMA atomics in Host mode, write-with-immediate in HostNoAtomic mode;
//! `MSCCLPP_IBV_MODE` picks). Without an IB device (the system libibverbs lists none and
//! `MSCCLPP_IBV_SO` is unset) every test skips with the reason, on every rank.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use mscclpp::{Connection, Device, EndpointConfig, LocalMemory, RegisteredMemory, Transport};
use mscclpp_framework::*;

use super::memory_channel::common::*;
use crate::world::mp_env;

/// Skips the test when no IB device is usable, but fails it when `MSCCLPP_IBV_SO` names a
/// verbs library that gives none (it does not load, or lists no device): asking for a
/// provider that is not there is a misconfiguration, never a skip that reads as success.
pub(crate) fn require_ib() {
    if let Some(reason) = mscclpp::ib::ib_unavailable_reason() {
        match mscclpp::env().ibv_so() {
            Some(so) => FAIL!(
                "MSCCLPP_IBV_SO={} is set, but gives no usable IB device: {reason}",
                so.display()
            ),
            None => SKIP!("IB tests need an IB device: {reason}"),
        }
    }
}

/// The endpoint configuration of the IB tests: IB0 on the CPU, `--ib_gid_index` when given,
/// the mode from `MSCCLPP_IBV_MODE` unless `mode` says otherwise.
pub(crate) fn ib_config(mode: mscclpp::IbMode) -> EndpointConfig {
    let mut cfg = EndpointConfig::new(Transport::Ib0, Device::CPU);
    if let Some(g) = mp_env().ib_gid_index {
        cfg.ib.gid_index = g as i32;
    }
    cfg.ib.mode = mode;
    cfg
}

/// Polls a host token until `pred` holds (or the test's timeout passes).
pub(crate) fn wait_token(
    mem: &LocalMemory,
    pred: impl Fn(u64) -> bool,
    timeout: Duration,
) -> mscclpp::Result<u64> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let v = mem.read_u64(0)?;
        if pred(v) {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            return Err(mscclpp::Error::timeout(
                format!("waiting for an IB signal (token = {v})"),
                timeout,
            ));
        }
        spins += 1;
        if spins < 100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

struct P2p {
    pair: Pair,
    conn: Connection,
    data: LocalMemory,
    data_reg: RegisteredMemory,
    token: LocalMemory,
    _token_reg: RegisteredMemory,
    peer_data: RegisteredMemory,
    peer_token: RegisteredMemory,
    outbound: AtomicU64,
}

fn setup(ctx: &TestContext, bytes: usize) -> P2p {
    require_ib();
    let pair = pair(ctx);
    let conn = ok!(
        pair.comm
            .connect(ib_config(mscclpp::IbMode::Default), pair.peer, 40)
            .get(),
        "connecting to rank {} over IB0",
        pair.peer
    );
    let flags = Transport::Ib0.into();
    let data = ok!(
        LocalMemory::alloc(Device::CPU, bytes),
        "allocating {bytes} bytes"
    );
    let token = ok!(LocalMemory::alloc(Device::CPU, 8), "allocating the token");
    let data_reg = ok!(
        pair.comm.register_memory(data.ptr(), bytes, flags),
        "registering data for IB0"
    );
    let token_reg = ok!(
        pair.comm.register_memory(token.ptr(), 8, flags),
        "registering the token for IB0"
    );
    let peer_data = pair.exchange(&data_reg, 41);
    let peer_token = pair.exchange(&token_reg, 42);
    pair.sync();
    P2p {
        pair,
        conn,
        data,
        data_reg,
        token,
        _token_reg: token_reg,
        peer_data,
        peer_token,
        outbound: AtomicU64::new(0),
    }
}

impl P2p {
    /// Writes the first `size` bytes of the data buffer to the peer's.
    fn write(&self, size: usize) -> mscclpp::Result<()> {
        self.conn
            .write(&self.peer_data, 0, &self.data_reg, 0, size as u64)
    }

    fn signal(&self, value: u64) -> mscclpp::Result<()> {
        self.conn
            .update_and_sync(&self.peer_token, 0, &self.outbound, value)
    }
}

fn byte_pattern(seed: u64, round: u64, i: usize) -> u8 {
    (test_pattern(seed, round as u32, i as u64 / 4) >> ((i % 4) * 8)) as u8
}

TEST!(IbPeerToPeerTest, SimpleSendRecv, |ctx| {
    let max = 4 << 20;
    let s = setup(ctx, max);
    let t = s.pair.timeout;
    let mut round = 0u64;
    for size in [1usize, 7, 4096, 65_536 + 3, 1 << 20, max] {
        for _ in 0..3 {
            round += 1;
            if s.pair.initiator {
                let bytes: Vec<u8> = (0..size)
                    .map(|i| byte_pattern(s.pair.seed, round, i))
                    .collect();
                ok!(s.data.write(0, &bytes), "filling the source");
                ok!(s.write(size), "writing {size} bytes");
                ok!(s.signal(round), "signalling round {round}");
                ok!(s.conn.flush(t), "flushing round {round}");
            } else {
                ok!(wait_token(&s.token, |v| v >= round, t), "round {round}");
                let mut got = vec![0u8; size];
                ok!(s.data.read(0, &mut got), "reading the destination");
                let bad = (0..size)
                    .filter(|&i| got[i] != byte_pattern(s.pair.seed, round, i))
                    .count();
                EXPECT_EQ!(bad, 0, "{} bytes: mismatches in round {}", size, round);
            }
            s.pair.sync();
        }
    }
    ok!(s.conn.flush(t), "final flush");
    s.pair.sync();
});

PERF_TEST!(IbPeerToPeerTest, SimpleSendRecvPerf, |ctx| {
    let size = 4 << 20;
    let s = setup(ctx, size);
    let t = s.pair.timeout;
    let iters = 20u64;
    let mut secs = 0.0;
    for (round, n) in [(1u64, 2u64), (2, iters)] {
        s.pair.sync();
        let start = Instant::now();
        if s.pair.initiator {
            for _ in 0..n {
                ok!(s.write(size), "writing");
            }
            ok!(s.signal(round), "signalling");
            ok!(s.conn.flush(t), "flushing");
        } else {
            ok!(
                wait_token(&s.token, |v| v >= round, t),
                "waiting for the data"
            );
        }
        secs = start.elapsed().as_secs_f64();
    }
    let gbps = (size as u64 * iters) as f64 / secs / 1e9;
    if s.pair.initiator {
        ctx.report_perf(
            &format!("IB write bandwidth, {} MiB x {iters}", size >> 20),
            gbps,
            "GB/s",
        );
    }
    EXPECT_GT!(gbps, 0.0);
    s.pair.sync();
});

TEST!(IbPeerToPeerTest, MemoryConsistency, |ctx| {
    // Each round the writer fills the peer's buffer with the round number (u64 elements) and
    // signals; the reader must see every element equal to the round, then acknowledges with
    // its own signal. Data must never trail its signal.
    let n = 64 << 10;
    let s = setup(ctx, n * 8);
    let t = s.pair.timeout;
    let rounds = 200u64;
    for r in 1..=rounds {
        if s.pair.initiator {
            let bytes: Vec<u8> = (0..n).flat_map(|_| r.to_le_bytes()).collect();
            ok!(s.data.write(0, &bytes), "filling round {r}");
            ok!(
                s.conn
                    .write(&s.peer_data, 0, &s.data_reg, 0, (n * 8) as u64),
                "writing round {r}"
            );
            ok!(s.signal(r), "signalling round {r}");
            ok!(wait_token(&s.token, |v| v >= r, t), "the ack of round {r}");
        } else {
            ok!(wait_token(&s.token, |v| v >= r, t), "round {r}");
            let mut got = vec![0u8; n * 8];
            ok!(s.data.read(0, &mut got), "reading round {r}");
            let bad = got
                .chunks_exact(8)
                .filter(|c| {
                    u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) != r
                })
                .count();
            ASSERT_EQ!(bad, 0, "round {}: elements not equal to the round", r);
            ok!(s.signal(r), "acknowledging round {r}");
        }
    }
    ok!(s.conn.flush(t), "final flush");
    s.pair.sync();
});

fn atomic_add(ctx: &TestContext, n: u64, report: bool) {
    let s = setup(ctx, 8);
    let t = s.pair.timeout;
    let start = Instant::now();
    for k in 1..=n {
        ok!(s.signal(k), "signal {k}");
    }
    ok!(s.conn.flush(t), "flushing the signals");
    let got = ok!(
        wait_token(&s.token, |v| v >= n, t),
        "the peer's {n} signals"
    );
    let secs = start.elapsed().as_secs_f64();
    EXPECT_EQ!(got, n, "the token after {} increments of 1", n);
    s.pair.sync();
    // Large steps too: +2^31 - 1 and then +3 * 2^32 (Host: one fetch-add; HostNoAtomic: split).
    let big = [n + (1 << 31) - 1, n + (1 << 31) - 1 + 3 * (1u64 << 32)];
    for (i, v) in big.into_iter().enumerate() {
        ok!(s.signal(v), "big signal {i}");
        ok!(s.conn.flush(t), "flushing big signal {i}");
        let got = ok!(wait_token(&s.token, |x| x >= v, t), "big signal {i}");
        EXPECT_EQ!(got, v, "the token after big step {}", i);
        s.pair.sync();
    }
    s.pair.sync();
    if report && s.pair.initiator {
        ctx.report_perf(
            "IB signals (update_and_sync) per second",
            n as f64 / secs,
            "ops/s",
        );
    }
}

TEST!(IbPeerToPeerTest, SimpleAtomicAdd, |ctx| atomic_add(
    ctx, 1000, false
));
PERF_TEST!(IbPeerToPeerTest, SimpleAtomicAddPerf, |ctx| atomic_add(
    ctx, 20_000, true
));
