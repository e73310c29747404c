//! The IB transport end to end between two processes, through the user-space verbs test
//! provider (`libmscclpp_ibv_testprov.so`, loaded with `MSCCLPP_IBV_SO`). Each test re-runs this
//! binary twice as child ranks (`common`'s `BOOT_MP_*` variables select the role). Build the provider
//! first: `cargo build -p mscclpp-ibv-testprov`; without it every test prints why it skips.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::bootstrap::{Bootstrap, TcpBootstrap};
use mscclpp::{
    Communicator, Connection, Context, Device, EndpointConfig, IbMode, LocalMemory,
    RegisteredMemory, Transport,
};

mod common;
use common::{child, free_port, passed, report, start, wait_all, ChildRole as Child, Ended, Spec};

const TIMEOUT: Duration = Duration::from_secs(30);

/// `target/<profile>/libmscclpp_ibv_testprov.so`, next to this binary's `deps` folder.
fn provider() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("libmscclpp_ibv_testprov.so");
    p.exists().then_some(p)
}

/// Runs `name` as two child ranks with `env(rank)` added; returns how they ended (killed after
/// `limit`). `None` (after printing why) when the provider is not built.
fn spawn_pair(
    name: &str,
    limit: Duration,
    env: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Option<Vec<Ended>> {
    let Some(so) = provider() else {
        println!(
            "SKIP {name}: libmscclpp_ibv_testprov.so not found next to the test binary (build it \
             with `cargo build -p mscclpp-ibv-testprov`)"
        );
        return None;
    };
    let addr = format!("127.0.0.1:{}", free_port());
    let kids = (0..2)
        .map(|rank| {
            let mut spec = Spec::rank(rank, 2)
                .env("MSCCLPP_IBV_SO", &so.to_string_lossy())
                .unset("MSCCLPP_IBV_MODE")
                .unset("MSCCLPP_HCA_DEVICES");
            for (k, v) in env(rank) {
                spec = spec.env(k, &v);
            }
            start(name, &addr, spec)
        })
        .collect();
    Some(wait_all(kids, limit))
}

fn assert_all_ok(name: &str, outs: &[Ended]) {
    assert!(
        outs.iter().all(passed),
        "{name}: a child rank failed\n{}",
        report(outs)
    );
}

fn no_env(_: usize) -> Vec<(&'static str, String)> {
    Vec::new()
}

/// A two-rank world of this child: bootstrap and communicator.
fn world(c: &Child) -> (Arc<TcpBootstrap>, Communicator) {
    let mut b = TcpBootstrap::new(c.rank, 2).expect("bootstrap");
    b.initialize_with_addr(&c.addr, TIMEOUT)
        .expect("bootstrap initialize");
    let b = Arc::new(b);
    let ctx = Context::new().expect("context");
    let comm = Communicator::new(b.clone(), ctx);
    (b, comm)
}

fn ib_config(mode: IbMode) -> EndpointConfig {
    let mut cfg = EndpointConfig::new(Transport::Ib0, Device::CPU);
    cfg.ib.mode = mode;
    cfg
}

fn connect(comm: &Communicator, peer: usize, cfg: EndpointConfig) -> Connection {
    comm.connect(cfg, peer, 1).get().expect("connect over IB0")
}

/// Registers `mem` for IB0 and swaps it with the peer.
fn exchange(comm: &Communicator, mem: &LocalMemory, peer: usize, tag: u64) -> RegisteredMemory {
    let reg = comm
        .register_memory(mem.ptr(), mem.size(), Transport::Ib0.into())
        .expect("register for IB0");
    let fut = comm.recv_memory(peer, tag);
    comm.send_memory(&reg, peer, tag).expect("send memory");
    // Keep the local registration alive as long as the process (the test is short).
    std::mem::forget(reg);
    fut.get().expect("recv memory")
}

/// The buffers of a transfer: `n` bytes of data and an 8-byte token, each with the peer's
/// (exchanged with tags 10 and 11), and the data registered as the source of the writes:
/// `(data, token, peer_data, peer_token, src)`.
fn transfer_buffers(
    comm: &Communicator,
    peer: usize,
    n: usize,
) -> (
    LocalMemory,
    LocalMemory,
    RegisteredMemory,
    RegisteredMemory,
    RegisteredMemory,
) {
    let data = LocalMemory::alloc(Device::CPU, n).expect("alloc data");
    let token = LocalMemory::alloc(Device::CPU, 8).expect("alloc token");
    let peer_data = exchange(comm, &data, peer, 10);
    let peer_token = exchange(comm, &token, peer, 11);
    let src = comm
        .register_memory(data.ptr(), n, Transport::Ib0.into())
        .expect("register src");
    (data, token, peer_data, peer_token, src)
}

fn pattern(round: u64, i: usize) -> u8 {
    ((i as u64).wrapping_mul(31) ^ round.wrapping_mul(0x9E37)) as u8
}

fn wait_token(mem: &LocalMemory, pred: impl Fn(u64) -> bool, what: &str) -> u64 {
    let start = Instant::now();
    loop {
        let v = mem.read_u64(0).expect("read token");
        if pred(v) {
            return v;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "timed out waiting for {what}; token = {v}"
        );
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Rank 0 writes rounds of data then signals; rank 1 waits for each signal and checks the data.
fn write_and_signal(c: &Child, mode: IbMode) {
    let (b, comm) = world(c);
    let peer = 1 - c.rank;
    let mut cfg = ib_config(mode);
    // Small queues: many writes must wait for send-queue room and be signaled in batches.
    cfg.ib.max_send_wr = 8;
    cfg.ib.max_wr_per_send = 3;
    let conn = connect(&comm, peer, cfg);
    const N: usize = 256 << 10;
    let (data, token, peer_data, peer_token, src) = transfer_buffers(&comm, peer, N);
    let counter = AtomicU64::new(0);
    for round in 1..=5u64 {
        if c.rank == 0 {
            let bytes: Vec<u8> = (0..N).map(|i| pattern(round, i)).collect();
            data.write(0, &bytes).expect("fill");
            // 64 writes of 4 KiB each, then the signal.
            for k in 0..64u64 {
                conn.write(&peer_data, k * 4096, &src, k * 4096, 4096)
                    .expect("write");
            }
            conn.write(
                &peer_data,
                64 * 4096,
                &src,
                64 * 4096,
                (N - 64 * 4096) as u64,
            )
            .expect("write the rest");
            conn.update_and_sync(&peer_token, 0, &counter, round)
                .expect("update_and_sync");
            conn.flush(TIMEOUT).expect("flush");
            b.recv(peer, 100 + round).expect("ack");
        } else {
            wait_token(&token, |v| v >= round, "the round's signal");
            assert_eq!(token.read_u64(0).expect("token"), round);
            let got = data.to_vec().expect("read data");
            let bad = (0..N).filter(|&i| got[i] != pattern(round, i)).count();
            assert_eq!(bad, 0, "round {round}: {bad} bytes differ");
            b.send(&[1], peer, 100 + round).expect("ack");
        }
    }
    conn.flush(TIMEOUT).expect("final flush");
    b.barrier().expect("barrier");
}

/// Test `name`: [`write_and_signal`] in `mode` on two ranks, both of which must pass.
fn write_and_signal_test(name: &str, mode: IbMode) {
    if let Some(c) = child(name) {
        return write_and_signal(&c, mode);
    }
    if let Some(outs) = spawn_pair(name, Duration::from_secs(120), no_env) {
        assert_all_ok(name, &outs);
    }
}

/// One test per line: `name: run(mode)` calls `run("name", IbMode::mode)` (the name selects the
/// child ranks' role, so it must be the test's).
macro_rules! mode_tests {
    ($($test:ident: $run:ident($mode:ident);)+) => {$(
        #[test]
        fn $test() {
            $run(stringify!($test), IbMode::$mode);
        }
    )+};
}

#[test]
fn ib_host_mode_falls_back_without_atomics() {
    const NAME: &str = "ib_host_mode_falls_back_without_atomics";
    if let Some(c) = child(NAME) {
        return write_and_signal(&c, IbMode::Host);
    }
    let env = |_| vec![("IBV_TESTPROV_NO_ATOMICS", "1".to_string())];
    if let Some(outs) = spawn_pair(NAME, Duration::from_secs(120), env) {
        assert_all_ok(NAME, &outs);
        let err = &outs[0].output;
        assert!(
            err.contains("no RDMA atomics") && err.contains("HostNoAtomic"),
            "expected a fallback warning on rank 0\n{}",
            report(&outs)
        );
    }
}

/// HostNoAtomic: signals jumping by 2^31 - 1 (and one jump above 2^32) cross the 32-bit
/// boundary several times; the receiver must see every exact 64-bit value.
#[test]
fn ib_no_atomic_32bit_wrap() {
    const NAME: &str = "ib_no_atomic_32bit_wrap";
    if let Some(c) = child(NAME) {
        let (b, comm) = world(&c);
        let peer = 1 - c.rank;
        let conn = connect(&comm, peer, ib_config(IbMode::HostNoAtomic));
        let token = LocalMemory::alloc(Device::CPU, 8).expect("alloc token");
        let peer_token = exchange(&comm, &token, peer, 11);
        let step = (1u64 << 31) - 1;
        let mut values: Vec<u64> = (1..=12).map(|k| k * step).collect();
        values.push(values[values.len() - 1] + (5u64 << 32) + 17);
        values.push(values[values.len() - 1] + 1);
        assert!(values[values.len() - 1] > 6 * (1u64 << 32));
        let counter = AtomicU64::new(0);
        for (k, &v) in values.iter().enumerate() {
            if c.rank == 0 {
                conn.update_and_sync(&peer_token, 0, &counter, v)
                    .expect("update_and_sync");
                conn.flush(TIMEOUT).expect("flush");
                b.recv(peer, 200 + k as u64).expect("ack");
            } else {
                let got = wait_token(&token, |x| x >= v, "the signal");
                assert_eq!(got, v, "signal {k}: expected the exact 64-bit value");
                b.send(&[1], peer, 200 + k as u64).expect("ack");
            }
        }
        // A decreasing value cannot be expressed without atomics: an error, nothing sent.
        if c.rank == 0 {
            let e = conn
                .update_and_sync(&peer_token, 0, &counter, 5)
                .expect_err("a decreasing value must fail");
            assert!(e.to_string().contains("expected a value >="), "{e}");
            conn.flush(TIMEOUT).expect("flush after the rejected value");
        }
        b.barrier().expect("barrier");
        if c.rank == 1 {
            assert_eq!(token.read_u64(0).expect("token"), values[values.len() - 1]);
        }
        return;
    }
    if let Some(outs) = spawn_pair(NAME, Duration::from_secs(120), no_env) {
        assert_all_ok(NAME, &outs);
    }
}

/// Replaces the IB info blob's rkey (the last 4 bytes of a memory registered for IB0 only) or
/// grows the memory's size and the blob's length, so the connection layer lets the write
/// through and the remote NIC must refuse it.
fn forge(mem: &RegisteredMemory, bad_rkey: bool, grow: u64) -> RegisteredMemory {
    let mut b = mem.serialize();
    let n = b.len();
    if bad_rkey {
        for x in &mut b[n - 4..] {
            *x ^= 0x5A;
        }
    }
    if grow > 0 {
        // Envelope header 10 bytes, then pointer u64, size u64.
        let size = u64::from_le_bytes(b[18..26].try_into().expect("8 bytes")) + grow;
        b[18..26].copy_from_slice(&size.to_le_bytes());
        let len = u64::from_le_bytes(b[n - 12..n - 4].try_into().expect("8 bytes")) + grow;
        b[n - 12..n - 4].copy_from_slice(&len.to_le_bytes());
    }
    RegisteredMemory::deserialize(&b).expect("deserialize the forged memory")
}

#[test]
fn ib_bad_rkey_and_out_of_bounds_fail_and_corrupt_nothing() {
    const NAME: &str = "ib_bad_rkey_and_out_of_bounds_fail_and_corrupt_nothing";
    if let Some(c) = child(NAME) {
        let (b, comm) = world(&c);
        let peer = 1 - c.rank;
        const N: usize = 4096;
        // Rank 1 exposes the middle 4 KiB of a 12 KiB buffer filled with 0xEE.
        let big = LocalMemory::alloc(Device::CPU, 3 * N).expect("alloc");
        big.write(0, &vec![0xEE; 3 * N]).expect("fill");
        let reg = comm
            .register_memory(big.ptr() + N as u64, N, Transport::Ib0.into())
            .expect("register the middle");
        let fut = comm.recv_memory(peer, 5);
        comm.send_memory(&reg, peer, 5).expect("send memory");
        let peer_mem = fut.get().expect("recv memory");
        let src_mem = LocalMemory::alloc(Device::CPU, 2 * N).expect("alloc src");
        src_mem.write(0, &vec![0x11; 2 * N]).expect("fill src");
        let src = comm
            .register_memory(src_mem.ptr(), 2 * N, Transport::Ib0.into())
            .expect("register src");
        if c.rank == 0 {
            let cases = [("bad rkey", true, 0), ("out of bounds", false, N as u64)];
            let mut keep = Vec::new();
            for (tag, (what, bad_rkey, grow)) in cases.into_iter().enumerate() {
                let conn = comm
                    .connect(ib_config(IbMode::Host), peer, 20 + tag as u64)
                    .get()
                    .expect("connect");
                // The peer's QP must be ready (RTS) before the bad write makes it fail.
                b.recv(peer, 310).expect("peer connected");
                let forged = forge(&peer_mem, bad_rkey, grow);
                let len = if grow > 0 { 2 * N as u64 } else { 64 };
                // The connection layer lets it through (the forged size covers it) ...
                conn.write(&forged, 0, &src, 0, len)
                    .expect("post the write");
                // ... and the completion says the remote refused it.
                let e = conn.flush(TIMEOUT).expect_err(what);
                let msg = e.to_string();
                assert!(
                    msg.contains("remote access error") && msg.contains("QP"),
                    "{what}: expected a remote access error naming the peer, got {msg}"
                );
                // The connection stays broken.
                assert!(conn.write(&peer_mem, 0, &src, 0, 8).is_err());
                keep.push(conn);
                b.send(&[1], peer, 300).expect("done");
            }
        } else {
            // Connections stay open to the end: the provider reuses the QP numbers of destroyed
            // QPs, and a late close of an old QP must not hit a new one.
            let mut keep = Vec::new();
            for tag in 0..2u64 {
                let conn = comm
                    .connect(ib_config(IbMode::Host), peer, 20 + tag)
                    .get()
                    .expect("connect");
                keep.push(conn);
                b.send(&[1], peer, 310).expect("connected");
                b.recv(peer, 300).expect("done");
            }
            let got = big.to_vec().expect("read back");
            assert!(
                got.iter().all(|&x| x == 0xEE),
                "rejected writes must not change a byte"
            );
        }
        drop(reg);
        b.barrier().expect("barrier");
        return;
    }
    if let Some(outs) = spawn_pair(NAME, Duration::from_secs(120), no_env) {
        assert_all_ok(NAME, &outs);
    }
}

fn peer_killed(c: &Child, mode: IbMode) {
    let (b, comm) = world(c);
    let peer = 1 - c.rank;
    let conn = connect(&comm, peer, ib_config(mode));
    const N: usize = 1 << 20;
    let (_data, _token, peer_data, peer_token, src) = transfer_buffers(&comm, peer, N);
    b.barrier().expect("barrier");
    if c.rank == 1 {
        // Die mid-transfer, without closing anything.
        std::thread::sleep(Duration::from_millis(200));
        std::process::abort();
    }
    let counter = AtomicU64::new(0);
    let limit = Duration::from_secs(10);
    let start = Instant::now();
    let mut v = 0;
    let err = loop {
        v += 1;
        let r = conn
            .write(&peer_data, 0, &src, 0, N as u64)
            .and_then(|_| conn.update_and_sync(&peer_token, 0, &counter, v))
            .and_then(|_| conn.flush(limit));
        if let Err(e) = r {
            break e;
        }
        assert!(
            start.elapsed() < 3 * limit,
            "no error after {:?}",
            start.elapsed()
        );
    };
    let took = start.elapsed();
    println!("survivor failed after {took:?} ({v} rounds): {err}");
    assert!(took < 2 * limit, "the survivor took {took:?} to fail");
}

/// Test `name`: rank 1 dies mid-transfer ([`peer_killed`] in `mode`); rank 0 must survive it.
fn peer_killed_test(name: &str, mode: IbMode) {
    if let Some(c) = child(name) {
        return peer_killed(&c, mode);
    }
    if let Some(outs) = spawn_pair(name, Duration::from_secs(90), no_env) {
        assert!(passed(&outs[0]), "the survivor failed\n{}", report(&outs));
        assert!(
            !passed(&outs[1]),
            "rank 1 was meant to die\n{}",
            report(&outs)
        );
    }
}

mode_tests! {
    ib_write_and_signal_host_mode: write_and_signal_test(Host);
    ib_write_and_signal_host_no_atomic_mode: write_and_signal_test(HostNoAtomic);
    ib_peer_killed_mid_transfer_host_mode: peer_killed_test(Host);
    ib_peer_killed_mid_transfer_no_atomic_mode: peer_killed_test(HostNoAtomic);
}

/// Port and device selection errors name what was asked for.
#[test]
fn ib_port_gid_and_device_selection() {
    const NAME: &str = "ib_port_gid_and_device_selection";
    if let Some(c) = child(NAME) {
        let ctx = Context::new().expect("context");
        if c.rank == 0 {
            // Default: the first active port.
            ctx.create_endpoint(ib_config(IbMode::Host))
                .expect("IB0 endpoint on the first active port");
            let mut cfg = ib_config(IbMode::Host);
            cfg.ib.port = 2;
            let e = ctx.create_endpoint(cfg).expect_err("port 2 does not exist");
            assert!(e.to_string().contains("port = 2"), "{e}");
            cfg.ib.port = 1;
            cfg.ib.gid_index = 3;
            let e = ctx.create_endpoint(cfg).expect_err("gid index 3 is empty");
            assert!(e.to_string().contains("IbConfig.port = 1"), "{e}");
            let e = ctx
                .create_endpoint(EndpointConfig::new(Transport::Ib1, Device::CPU))
                .expect_err("only one device");
            assert!(e.to_string().contains("IB1"), "{e}");
        } else {
            // MSCCLPP_HCA_DEVICES maps IB0 to a device that does not exist.
            let e = ctx
                .create_endpoint(ib_config(IbMode::Host))
                .expect_err("no such device");
            assert!(e.to_string().contains("nosuchdev"), "{e}");
            let e = ctx
                .create_endpoint(EndpointConfig::new(Transport::Ib1, Device::CPU))
                .expect("IB1 = testprov0");
            assert_eq!(e.transport(), Transport::Ib1);
        }
        return;
    }
    let env = |rank| {
        if rank == 1 {
            vec![("MSCCLPP_HCA_DEVICES", "nosuchdev,testprov0".to_string())]
        } else {
            Vec::new()
        }
    };
    if let Some(outs) = spawn_pair(NAME, Duration::from_secs(60), env) {
        assert_all_ok(NAME, &outs);
    }
}
