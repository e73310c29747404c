//! P2pTest: core's point-to-point (`mscclpp::p2p::PointToPoint`) with exact results: every
//! test is a list of messages (sender, receiver, bytes) of the whole world; each rank runs its
//! sends and receives of them as one batch (odd ranks list their receives first, so no order
//! of posting is assumed), then checks every received byte against the sender's pattern and a
//! poisoned guard zone after each receive buffer. On the host backend the host protocol runs
//! (links over CudaIpc-on-host, Ethernet between emulated nodes); on GPU builds the GPU kernel
//! (device buffers; peers of one node only: a world spanning nodes skips).

use std::sync::OnceLock;

use mscclpp::p2p::{Dir, P2pOp, PointToPoint, Rooted};
use mscclpp::{Device, GpuBuffer};
use mscclpp_framework::*;
use mscclpp_hal::{prelude::*, Gpu, StreamInterop};

use super::coll_common::{
    guard_intact, new_stream, rank_device_and_comm, raw_stream_of, sync_stream,
};
use super::coll_common::{GUARD, POISON};
use super::memory_channel::common::ok;
use crate::world::mp_env;

struct P2pEnv {
    p2p: PointToPoint,
    device: Device,
    stream: Option<<Gpu as Api>::Stream>,
}

// SAFETY: the stream handle is usable from any thread (the HAL's streams are Send + Sync).
unsafe impl Sync for P2pEnv {}

fn new_env() -> Result<P2pEnv, String> {
    let (device, comm) = rank_device_and_comm()?;
    let mut p2p =
        PointToPoint::new(comm, device).map_err(|e| format!("setting up point-to-point: {e}"))?;
    p2p.set_timeout(mp_env().timeout);
    let stream = new_stream(device)?;
    Ok(P2pEnv {
        p2p,
        device,
        stream,
    })
}

/// The process's point-to-point state, set up by the first test (collective); skips where no
/// GPU is visible on a GPU build, or when a peer is out of reach (GPU builds across nodes).
fn env() -> &'static P2pEnv {
    static ENV: OnceLock<Result<P2pEnv, String>> = OnceLock::new();
    let e = match ENV.get_or_init(new_env) {
        Ok(e) => e,
        Err(msg) if msg.starts_with("skip: ") => SKIP!("{}", &msg[6..]),
        Err(msg) => FAIL!("{}", msg),
    };
    if let Some(p) = (0..e.p2p.nranks()).find(|&p| !e.p2p.reaches(p)) {
        SKIP!(
            "rank {p} is on another node: point-to-point between nodes on GPU builds is not \
             supported yet"
        );
    }
    e
}

/// Byte `i` of message `seq` from `src` to `dst`.
fn pattern(src: usize, dst: usize, seq: usize, i: usize) -> u8 {
    (src * 131 + dst * 31 + seq * 7 + i * 13 + i / 251) as u8
}

fn filled(device: Device, bytes: usize, f: impl Fn(usize) -> u8) -> GpuBuffer<u8> {
    let b: GpuBuffer<u8> = ok!(GpuBuffer::new(device, bytes + GUARD), "allocating");
    let mut host: Vec<u8> = (0..bytes).map(f).collect();
    host.extend(std::iter::repeat_n(POISON, GUARD));
    ok!(b.copy_from_host(0, &host), "writing");
    b
}

/// A message of the world: (sender, receiver, bytes).
type Msg = (usize, usize, usize);

/// Runs `batches` (each a list of the world's messages) on this rank and checks every receive.
fn run_batches(batches: &[Vec<Msg>]) {
    let e = env();
    let (me, stream) = (e.p2p.rank(), raw_stream_of(&e.stream));
    for (b, msgs) in batches.iter().enumerate() {
        let mut seq = std::collections::HashMap::new();
        // (op, buffer, expected pattern key)
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for &(src, dst, bytes) in msgs {
            let k = seq.entry((src, dst)).or_insert(0usize);
            let s = *k + 100 * b;
            *k += 1;
            if src == me {
                let buf = filled(e.device, bytes, |i| pattern(src, dst, s, i));
                sends.push((Dir::Send, dst, buf, bytes));
            }
            if dst == me {
                let buf = filled(e.device, bytes, |_| POISON);
                recvs.push((Dir::Recv, src, buf, bytes, s));
            }
        }
        let mut ops: Vec<P2pOp> = Vec::new();
        let send_ops = sends.iter().map(|(d, p, buf, n)| P2pOp {
            dir: *d,
            peer: *p,
            buf: buf.data(),
            bytes: *n,
        });
        let recv_ops = recvs.iter().map(|(d, p, buf, n, _)| P2pOp {
            dir: *d,
            peer: *p,
            buf: buf.data(),
            bytes: *n,
        });
        if me % 2 == 1 {
            ops.extend(recv_ops.chain(send_ops));
        } else {
            ops.extend(send_ops.chain(recv_ops));
        }
        // SAFETY: every buffer outlives the batch (synchronised below).
        ok!(unsafe { e.p2p.run(&ops, stream) }, "batch {b}");
        ok!(sync_stream(&e.stream), "waiting for batch {b}");
        ok!(e.p2p.device_error(), "batch {b} on the device");
        for (_, src, buf, bytes, s) in &recvs {
            let mut got = vec![0u8; *bytes];
            ok!(buf.copy_to_host(0, &mut got), "reading");
            let bad: Vec<usize> = (0..*bytes)
                .filter(|&i| got[i] != pattern(*src, me, *s, i))
                .take(3)
                .collect();
            EXPECT_TRUE!(
                bad.is_empty(),
                "batch {b}: {bytes} bytes from rank {src}: first wrong bytes at {bad:?}"
            );
            EXPECT_TRUE!(
                guard_intact(buf, *bytes),
                "batch {b}: the receive from rank {src} wrote past its {bytes} bytes"
            );
        }
    }
}

fn n() -> usize {
    env().p2p.nranks()
}

fn ring(bytes: usize) -> Vec<Msg> {
    let n = n();
    (0..n).map(|r| (r, (r + 1) % n, bytes)).collect()
}

fn all_pairs(size: impl Fn(usize, usize) -> usize, with_self: bool) -> Vec<Msg> {
    let n = n();
    let mut v = Vec::new();
    for s in 0..n {
        for d in (0..n).filter(|&d| with_self || d != s) {
            v.push((s, d, size(s, d)));
        }
    }
    v
}

TEST!(P2pTest, Ring, |_ctx| run_batches(&[ring(1000)]));

TEST!(P2pTest, PairwiseExchange, |_ctx| {
    let n = n();
    let msgs: Vec<Msg> = (0..n)
        .filter(|r| r ^ 1 < n)
        .map(|r| (r, r ^ 1, (64 << 10) + 5))
        .collect();
    run_batches(&[msgs])
});

TEST!(P2pTest, ManyPeers, |_ctx| run_batches(&[all_pairs(
    |s, d| 3000 + s * 7 + d,
    false
)]));

TEST!(P2pTest, UnequalSizes, |_ctx| run_batches(&[all_pairs(
    |s, d| ((s * 3 + d * 5) % 7) * 1000 + (s + d) % 3,
    true
)]));

TEST!(P2pTest, OneByte, |_ctx| run_batches(&[ring(1)]));

TEST!(P2pTest, OneMiBPlus3, |_ctx| run_batches(&[ring(
    (1 << 20) + 3
)]));

TEST!(P2pTest, MultiChunk, |_ctx| run_batches(&[ring(
    (5 << 20) + 17
)]));

TEST!(P2pTest, SeveralMessagesPerPeerInOrder, |_ctx| {
    let n = n();
    let mut msgs = Vec::new();
    for r in 0..n {
        let d = (r + 1) % n;
        msgs.extend([
            (r, d, 100),
            (r, d, 300_000),
            (r, d, 7),
            (r, d, 0),
            (r, d, 1 << 17),
        ]);
    }
    run_batches(&[msgs])
});

TEST!(P2pTest, SeveralBatches, |_ctx| {
    let batches: Vec<Vec<Msg>> = (0..6)
        .map(|b| match b % 3 {
            0 => ring(17 + b * 1000),
            1 => all_pairs(|s, d| 1 + (s * 5 + d + b) % 4 * 40_000, true),
            _ => ring((256 << 10) + b),
        })
        .collect();
    run_batches(&batches)
});

TEST!(P2pTest, SelfSend, |_ctx| {
    let n = n();
    let msgs: Vec<Msg> = (0..n).flat_map(|r| [(r, r, 4096 + r), (r, r, 3)]).collect();
    run_batches(&[msgs])
});

TEST!(P2pTest, BadPeerIsAnError, |_ctx| {
    let e = env();
    let op = P2pOp {
        dir: Dir::Send,
        peer: e.p2p.nranks(),
        buf: 0,
        bytes: 4,
    };
    // SAFETY: refused before any buffer is touched.
    let r = unsafe { e.p2p.run(&[op], raw_stream_of(&e.stream)) };
    EXPECT_TRUE!(
        r.as_ref().is_err_and(|e| e.to_string().contains("peer")),
        "a peer beyond the world: got {r:?}"
    );
});

/// All-to-all (also "alltoall_in_place": one buffer for both), gather and scatter through the
/// helpers: `per` bytes per block.
fn helper_case(what: &str, per: usize) {
    let e = env();
    let (me, n, stream) = (e.p2p.rank(), e.p2p.nranks(), raw_stream_of(&e.stream));
    let root = n - 1;
    let total = n * per;
    // Block p of rank r's send buffer: pattern(r, p, 0, i).
    let send = filled(e.device, total, |i| {
        pattern(me, i / per.max(1), 0, i % per.max(1))
    });
    let recv = filled(e.device, total, |_| POISON);
    // SAFETY: both buffers outlive the call (synchronised below).
    let r = unsafe {
        match what {
            "alltoall" => e.p2p.all_to_all(send.data(), recv.data(), per, stream),
            "alltoall_in_place" => e.p2p.all_to_all(send.data(), send.data(), per, stream),
            // Gather sends block 0.. of the send buffer: rank r's first `per` bytes.
            "gather" => e.p2p.rooted(
                Rooted::Gather,
                (send.data(), recv.data()),
                per,
                root,
                stream,
            ),
            _ => e.p2p.rooted(
                Rooted::Scatter,
                (send.data(), recv.data()),
                per,
                root,
                stream,
            ),
        }
    };
    ok!(r, "{what}");
    ok!(sync_stream(&e.stream), "waiting for {what}");
    ok!(e.p2p.device_error(), "{what} on the device");
    let out = if what == "alltoall_in_place" {
        &send
    } else {
        &recv
    };
    let mut got = vec![0u8; total];
    ok!(out.copy_to_host(0, &mut got), "reading");
    // Expected block p of the receive buffer (None: untouched).
    let want = |p: usize, i: usize| -> Option<u8> {
        match what {
            "alltoall" | "alltoall_in_place" => Some(pattern(p, me, 0, i)),
            "gather" => (me == root).then(|| pattern(p, 0, 0, i)),
            _ => (p == 0).then(|| pattern(root, me, 0, i)),
        }
    };
    let mut bad = Vec::new();
    for p in 0..n {
        for i in 0..per {
            let w = want(p, i).unwrap_or(POISON);
            if got[p * per + i] != w && bad.len() < 3 {
                bad.push(format!(
                    "block {p} byte {i}: got {}, expected {w}",
                    got[p * per + i]
                ));
            }
        }
    }
    EXPECT_TRUE!(bad.is_empty(), "{what} of {per} bytes per block: {bad:?}");
    EXPECT_TRUE!(
        guard_intact(out, total),
        "{what} wrote past the receive buffer"
    );
}

TEST!(P2pTest, AllToAll, |_ctx| {
    helper_case("alltoall", 1);
    helper_case("alltoall", 4099);
    // 1 MiB + 3 per peer; 64 KiB + 3 above 8 ranks (CI runs 16 ranks on two cores, where the
    // host backend moves every byte with the CPU).
    let big = if n() > 8 { 64 << 10 } else { 1 << 20 };
    helper_case("alltoall", big + 3);
});

// In place: every block is sent before the block from that peer lands on it, also when a
// message spans several chunks (host: 512 KiB; GPU: a sixteenth of the message, 16-128 KiB,
// over 16 channels; LL up to 16 KiB).
TEST!(P2pTest, AllToAllInPlace, |_ctx| {
    helper_case("alltoall_in_place", 1);
    helper_case("alltoall_in_place", 4099);
    let big = if n() > 8 { 64 << 10 } else { 3 << 20 };
    helper_case("alltoall_in_place", big + 3);
});

TEST!(P2pTest, Gather, |_ctx| {
    helper_case("gather", 1);
    helper_case("gather", 70_001);
});

TEST!(P2pTest, Scatter, |_ctx| {
    helper_case("scatter", 1);
    helper_case("scatter", 70_001);
});

// More operations than one GPU launch takes (128): 70 messages to the next rank and 70 from
// the previous one, LL-sized and chunked mixed, plus 10 to and from every other rank; the GPU
// splits the batch by matching index (every message's match in the launch of the same number
// on its peer), the host backend runs it as one. Per-pair order must hold throughout. Then a
// batch of 12 LL-sized messages per ring neighbour (24 ops: the GPU's `p2p_ll_big`, each pair's
// messages in order on one block).
TEST!(P2pTest, MoreOperationsThanOneLaunch, |_ctx| {
    let n = n();
    let mut msgs = Vec::new();
    for r in 0..n {
        let d = (r + 1) % n;
        for i in 0..70 {
            let bytes = if i % 9 == 4 { 20_000 + i } else { 100 + 3 * i };
            msgs.push((r, d, bytes));
        }
        for d in (0..n).filter(|&d| d != r && d != (r + 1) % n) {
            for i in 0..10 {
                msgs.push((r, d, 50 + i));
            }
        }
    }
    let small: Vec<Msg> = (0..n)
        .flat_map(|r| (0..12).map(move |i| (r, (r + 1) % n, 1 + i * 1000)))
        .collect();
    run_batches(&[msgs, small])
});

// A captured batch of LL messages only (the GPU's `p2p_ll` kernel: 1 byte, 1 KiB + 1 and
// 16 KiB to the next rank and from the previous one; then, captured in the same graph, an
// in-place all-to-all of 64 bytes per rank), replayed 5 times with new data: its flags and
// counters move on per replay.
TEST!(P2pTest, GraphReplayLl, |_ctx| {
    let e = env();
    let Some(stream) = e.stream.as_ref() else {
        SKIP!("graph capture needs a GPU stream (the host backend has none)")
    };
    let (me, n) = (e.p2p.rank(), e.p2p.nranks());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let sizes = [1usize, 1025, 16 << 10];
    let sends: Vec<GpuBuffer<u8>> = sizes.iter().map(|&b| filled(e.device, b, |_| 0)).collect();
    let recvs: Vec<GpuBuffer<u8>> = sizes
        .iter()
        .map(|&b| filled(e.device, b, |_| POISON))
        .collect();
    let mut ops = Vec::new();
    for (k, &bytes) in sizes.iter().enumerate() {
        ops.push(P2pOp::new(Dir::Send, next, sends[k].data(), bytes));
        ops.push(P2pOp::new(Dir::Recv, prev, recvs[k].data(), bytes));
    }
    const PER: usize = 64;
    let a2a = filled(e.device, n * PER, |_| 0);
    ok!(Gpu::begin_capture(stream), "beginning the capture");
    // SAFETY: the buffers outlive every replay (synchronised below).
    let r = unsafe { e.p2p.run(&ops, raw_stream_of(&e.stream)) };
    // SAFETY: as above.
    let r2 = unsafe {
        e.p2p
            .all_to_all(a2a.data(), a2a.data(), PER, raw_stream_of(&e.stream))
    };
    let graph = ok!(Gpu::end_capture(stream), "ending the capture");
    ok!(r, "capturing the batch");
    ok!(r2, "capturing the in-place all-to-all");
    for replay in 0..5 {
        for (k, &bytes) in sizes.iter().enumerate() {
            let seq = replay * 3 + k;
            let data: Vec<u8> = (0..bytes).map(|i| pattern(me, next, seq, i)).collect();
            ok!(sends[k].copy_from_host(0, &data), "writing");
        }
        let blocks: Vec<u8> = (0..n * PER)
            .map(|i| pattern(me, i / PER, 100 + replay, i % PER))
            .collect();
        ok!(a2a.copy_from_host(0, &blocks), "writing");
        ok!(mp_env().bootstrap.barrier(), "barrier");
        ok!(Gpu::launch_graph(&graph, stream), "replaying");
        ok!(sync_stream(&e.stream), "waiting for replay {replay}");
        ok!(e.p2p.device_error(), "replay {replay} on the device");
        for (k, &bytes) in sizes.iter().enumerate() {
            let seq = replay * 3 + k;
            let mut got = vec![0u8; bytes];
            ok!(recvs[k].copy_to_host(0, &mut got), "reading");
            let bad = (0..bytes).find(|&i| got[i] != pattern(prev, me, seq, i));
            EXPECT_TRUE!(
                bad.is_none(),
                "replay {replay}, LL message of {bytes} bytes: first wrong byte at {bad:?}"
            );
            EXPECT_TRUE!(
                guard_intact(&recvs[k], bytes),
                "replay {replay}: the receive of {bytes} bytes wrote past its end"
            );
        }
        let mut got = vec![0u8; n * PER];
        ok!(a2a.copy_to_host(0, &mut got), "reading");
        let bad = (0..n * PER).find(|&i| got[i] != pattern(i / PER, me, 100 + replay, i % PER));
        EXPECT_TRUE!(
            bad.is_none(),
            "replay {replay}, in-place all-to-all: first wrong byte at {bad:?}"
        );
        ok!(mp_env().bootstrap.barrier(), "barrier");
    }
});

// A captured out-of-place all-to-all of 300 KiB + 5 per rank (at least the default
// `MSCCLPP_P2P_TUNE` `direct` of 32 KiB: on GPUs each rank registers its receive buffer at
// capture and writes its blocks straight into the peers', `p2p_a2a_direct`; a 5-byte tail
// past the 16-byte units) and one of 1 KiB per rank (below it: LL packets) in the same graph,
// replayed 5 times with new data: every block lands where it belongs, nothing past the end.
TEST!(P2pTest, GraphReplayDirectAllToAll, |_ctx| {
    let e = env();
    let Some(stream) = e.stream.as_ref() else {
        SKIP!("graph capture needs a GPU stream (the host backend has none)")
    };
    let (me, n) = (e.p2p.rank(), e.p2p.nranks());
    let pers = [(300 << 10) + 5, 1 << 10];
    let sends: Vec<GpuBuffer<u8>> = pers
        .iter()
        .map(|&p| filled(e.device, n * p, |_| 0))
        .collect();
    let recvs: Vec<GpuBuffer<u8>> = pers
        .iter()
        .map(|&p| filled(e.device, n * p, |_| POISON))
        .collect();
    ok!(Gpu::begin_capture(stream), "beginning the capture");
    let captured: Vec<_> = pers
        .iter()
        .enumerate()
        // SAFETY: the buffers outlive every replay (synchronised below).
        .map(|(k, &per)| unsafe {
            e.p2p.all_to_all(
                sends[k].data(),
                recvs[k].data(),
                per,
                raw_stream_of(&e.stream),
            )
        })
        .collect();
    let graph = ok!(Gpu::end_capture(stream), "ending the capture");
    for r in captured {
        ok!(r, "capturing the all-to-all");
    }
    for replay in 0..5 {
        for (k, &per) in pers.iter().enumerate() {
            let data: Vec<u8> = (0..n * per)
                .map(|i| pattern(me, i / per, 10 * replay + k, i % per))
                .collect();
            ok!(sends[k].copy_from_host(0, &data), "writing");
            ok!(
                recvs[k].copy_from_host(0, &vec![POISON; n * per]),
                "clearing"
            );
        }
        ok!(mp_env().bootstrap.barrier(), "barrier");
        ok!(Gpu::launch_graph(&graph, stream), "replaying");
        ok!(sync_stream(&e.stream), "waiting for replay {replay}");
        ok!(e.p2p.device_error(), "replay {replay} on the device");
        for (k, &per) in pers.iter().enumerate() {
            let mut got = vec![0u8; n * per];
            ok!(recvs[k].copy_to_host(0, &mut got), "reading");
            let bad =
                (0..n * per).find(|&i| got[i] != pattern(i / per, me, 10 * replay + k, i % per));
            EXPECT_TRUE!(
                bad.is_none(),
                "replay {replay}, all-to-all of {per} bytes per rank: first wrong byte at {bad:?}"
            );
            EXPECT_TRUE!(
                guard_intact(&recvs[k], n * per),
                "replay {replay}: the all-to-all of {per} bytes per rank wrote past its end"
            );
        }
        ok!(mp_env().bootstrap.barrier(), "barrier");
    }
});

// One captured batch of a chunked message (300 KiB + 9) and an LL one (1001 bytes) per
// direction, replayed with new data each time: the device counters and LL flags move on.
TEST!(P2pTest, GraphReplay, |_ctx| {
    let e = env();
    let Some(stream) = e.stream.as_ref() else {
        SKIP!("graph capture needs a GPU stream (the host backend has none)")
    };
    let (me, n) = (e.p2p.rank(), e.p2p.nranks());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let sizes = [(300 << 10) + 9, 1001];
    let sends: Vec<GpuBuffer<u8>> = sizes.iter().map(|&b| filled(e.device, b, |_| 0)).collect();
    let recvs: Vec<GpuBuffer<u8>> = sizes
        .iter()
        .map(|&b| filled(e.device, b, |_| POISON))
        .collect();
    let mut ops = Vec::new();
    for (k, &bytes) in sizes.iter().enumerate() {
        ops.push(P2pOp::new(Dir::Send, next, sends[k].data(), bytes));
        ops.push(P2pOp::new(Dir::Recv, prev, recvs[k].data(), bytes));
    }
    ok!(Gpu::begin_capture(stream), "beginning the capture");
    // SAFETY: the buffers outlive every replay (synchronised below).
    let r = unsafe { e.p2p.run(&ops, raw_stream_of(&e.stream)) };
    let graph = ok!(Gpu::end_capture(stream), "ending the capture");
    ok!(r, "capturing the batch");
    for replay in 0..5 {
        for (k, &bytes) in sizes.iter().enumerate() {
            let seq = replay * 2 + k;
            let data: Vec<u8> = (0..bytes).map(|i| pattern(me, next, seq, i)).collect();
            ok!(sends[k].copy_from_host(0, &data), "writing");
        }
        // Every rank's input is written before any replay reads it.
        ok!(mp_env().bootstrap.barrier(), "barrier");
        ok!(Gpu::launch_graph(&graph, stream), "replaying");
        ok!(sync_stream(&e.stream), "waiting for replay {replay}");
        ok!(e.p2p.device_error(), "replay {replay} on the device");
        for (k, &bytes) in sizes.iter().enumerate() {
            let seq = replay * 2 + k;
            let mut got = vec![0u8; bytes];
            ok!(recvs[k].copy_to_host(0, &mut got), "reading");
            let bad = (0..bytes).find(|&i| got[i] != pattern(prev, me, seq, i));
            EXPECT_TRUE!(
                bad.is_none(),
                "replay {replay}, message of {bytes} bytes: first wrong byte at {bad:?}"
            );
        }
        // Nobody rewrites its input while a peer's replay may still read it.
        ok!(mp_env().bootstrap.barrier(), "barrier");
    }
});
