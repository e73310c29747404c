//! Connection faults between processes: stale handles, a frozen peer behind the proxy, a peer
//! that dies while the other waits or connects. Each test re-runs this binary as two child
//! ranks (`common`'s `BOOT_MP_*` variables select the role) that meet over a TcpBootstrap on a port of
//! this suite's range (21740-21769), and prints `MEASURE name=value` lines with the times the
//! survivors took (docs/reliability.md records them).
//!
//! Faults are real: a frozen rank stops itself with SIGSTOP, a dead one kills itself with
//! SIGKILL (no destructor runs; the kernel closes its sockets); the parent kills what is left
//! once the ranks that must report have exited.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::bootstrap::{Bootstrap, TcpBootstrap};
use mscclpp::fifo::{TRIGGER_DATA, TRIGGER_SYNC};
use mscclpp::port_channel::{BasePortChannelDeviceHandle, MemoryId};
use mscclpp::semaphore::{Host2DeviceSemaphore, Host2HostSemaphore};
use mscclpp::{
    Communicator, Connection, Context, Device, EndpointConfig, ErrorCode, IbMode, LocalMemory,
    ProxyService, RegisteredMemory, Transport,
};

mod common;
use common::{passed, report, start, wait_for, Spec};

/// The bootstrap's timeout in the children (also the communicator's connect timeout).
const BOOT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the parent lets a test run.
const LIMIT: Duration = Duration::from_secs(120);

struct Rank {
    rank: usize,
    comm: Communicator,
    boot: Arc<TcpBootstrap>,
}

/// `Some` (with the communicator set up) when this process is rank `r` of test `name`.
fn child(name: &str) -> Option<Rank> {
    let c = common::child(name)?;
    let mut b = TcpBootstrap::new(c.rank, 2).expect("bootstrap");
    b.initialize_with_addr(&c.addr, BOOT_TIMEOUT)
        .expect("bootstrap initialize");
    let boot = Arc::new(b);
    let comm = Communicator::new(
        boot.clone() as Arc<dyn Bootstrap>,
        Context::new().expect("context"),
    );
    Some(Rank {
        rank: c.rank,
        comm,
        boot,
    })
}

fn measure(key: &str, value: impl std::fmt::Display) {
    println!("MEASURE {key}={value}");
}

/// Runs `f` and prints how long it took (`{key}_s`) and what it returned (`{key}_result`).
fn timed<T: std::fmt::Debug>(key: &str, f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let res = f();
    let took = start.elapsed();
    measure(&format!("{key}_s"), format!("{:.3}", took.as_secs_f64()));
    measure(&format!("{key}_result"), format!("{res:?}"));
    (res, took)
}

/// Stops (`STOP`) or kills (`KILL`) this process.
fn signal_self(sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &std::process::id().to_string()])
        .status();
    // SIGSTOP returns after SIGCONT; SIGKILL never returns.
}

/// Runs test `name` as two children on `port`; ranks in `must_pass` must exit 0 (the others
/// are killed once those exited). Panics with every child's output otherwise.
fn run_pair(name: &str, port: u16, must_pass: &[usize], env: &[(&str, String)]) -> String {
    let addr = format!("127.0.0.1:{port}");
    let kids = (0..2)
        .map(|rank| {
            let spec = env
                .iter()
                .fold(Spec::rank(rank, 2), |spec, (k, v)| spec.env(k, v));
            start(name, &addr, spec)
        })
        .collect();
    let ended = wait_for(kids, must_pass, LIMIT);
    let report = report(&ended);
    for l in report.lines() {
        if let Some(i) = l.find("MEASURE ") {
            println!("{name}: {}", &l[i..]);
        }
    }
    let ok = ended
        .iter()
        .all(|e| passed(e) || !must_pass.contains(&e.rank));
    assert!(ok, "{name}: a child rank failed\n{report}");
    report
}

fn ethernet_connection(r: &Rank, tag: u64) -> Connection {
    let peer = 1 - r.rank;
    r.comm
        .connect(
            EndpointConfig::new(Transport::Ethernet, Device::CPU),
            peer,
            tag,
        )
        .get()
        .expect("connect")
}

fn fill(mem: &LocalMemory, byte: u8) {
    mem.write(0, &vec![byte; mem.size()]).expect("fill");
}

fn all_are(mem: &LocalMemory, byte: u8) -> bool {
    mem.to_vec().expect("read").iter().all(|&b| b == byte)
}

/// Registers `len` bytes for Ethernet and swaps the handle with the peer; then rank 1
/// freezes (SIGSTOP, and `None` once the parent killed it), and rank 0 gets its buffer, its
/// registration and the peer's.
fn swap_memory_then_freeze(
    r: &Rank,
    len: usize,
) -> Option<(LocalMemory, RegisteredMemory, RegisteredMemory)> {
    let mem = LocalMemory::alloc(Device::CPU, len).expect("alloc");
    let reg = r
        .comm
        .register_memory(mem.ptr(), len, Transport::Ethernet.into())
        .expect("register");
    r.comm
        .send_memory(&reg, 1 - r.rank, 1)
        .expect("send memory");
    let remote = r
        .comm
        .recv_memory(1 - r.rank, 1)
        .get()
        .expect("recv memory");
    r.boot.barrier().expect("barrier");
    if r.rank == 1 {
        signal_self("STOP");
        std::thread::sleep(LIMIT);
        return None;
    }
    Some((mem, reg, remote))
}

/// The proxy tests' flush timeout: `stop_proxy` must return within about this.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Rank 0's host proxy in front of the frozen rank 1, with the channel its puts go through.
struct FrozenPeerProxy {
    proxy: ProxyService,
    ch: BasePortChannelDeviceHandle,
    dst: MemoryId,
    src: MemoryId,
    _mem: LocalMemory,
    _conn: Connection,
}

impl FrozenPeerProxy {
    /// An Ethernet connection and semaphore to the peer, `len` bytes swapped with it (then
    /// rank 1 freezes: `None`), and a host proxy holding both, its flush timeout
    /// [`FLUSH_TIMEOUT`], started once rank 1 had time to stop.
    fn start(r: &Rank, len: usize) -> Option<FrozenPeerProxy> {
        let conn = ethernet_connection(r, 0);
        let sem = r
            .comm
            .build_semaphore(&conn, 1 - r.rank, 0)
            .get()
            .expect("semaphore");
        let (mem, reg, remote) = swap_memory_then_freeze(r, len)?;
        let mut proxy = ProxyService::new_host().expect("proxy");
        proxy.set_flush_timeout(FLUSH_TIMEOUT);
        let sid = proxy
            .add_semaphore(Host2DeviceSemaphore::new(sem).expect("h2d"))
            .expect("add semaphore");
        let dst = proxy.add_memory(remote).expect("dst");
        let src = proxy.add_memory(reg).expect("src");
        let ch = proxy
            .base_port_channel(sid)
            .expect("channel")
            .device_handle();
        std::thread::sleep(Duration::from_millis(300)); // let rank 1 stop
        proxy.start_proxy().expect("start");
        Some(FrozenPeerProxy {
            proxy,
            ch,
            dst,
            src,
            _mem: mem,
            _conn: conn,
        })
    }

    /// Pushes one flushed put of `bytes` to the peer.
    fn put_sync(&self, bytes: u64) {
        // SAFETY: the proxy (and its FIFO) outlives the push: both are fields of `self`.
        unsafe {
            self.ch.push(
                TRIGGER_DATA | TRIGGER_SYNC,
                self.dst,
                0,
                self.src,
                0,
                bytes,
                FLUSH_TIMEOUT,
            )
        }
        .expect("push");
    }

    /// Stops the proxy, measured as `key`; it must fail (`expect` says why) within about one
    /// flush timeout. Returns the error.
    fn stop_fails_in_time(&mut self, key: &str, expect: &str) -> mscclpp::Error {
        let (res, took) = timed(key, || self.proxy.stop_proxy());
        let e = res.expect_err(expect);
        assert!(
            took < FLUSH_TIMEOUT + Duration::from_millis(1500),
            "stop took {took:?}, expected about one flush timeout ({FLUSH_TIMEOUT:?})"
        );
        e
    }
}

const STALE_LEN: usize = 1 << 20;

/// Rank 1 registers a buffer, rank 0 writes it through the handle; rank 1 then drops the
/// registration, registers the same address again and fills it; rank 0 writes through the old
/// handle (Ethernet) and through its import of an old CudaIpc handle, and imports that handle
/// again. None of it may touch rank 1's new data, and each must report an error.
#[test]
fn stale_handles_across_processes() {
    let Some(r) = child("stale_handles_across_processes") else {
        run_pair("stale_handles_across_processes", 21740, &[0, 1], &[]);
        return;
    };
    let conn = ethernet_connection(&r, 0);
    let ipc = r
        .comm
        .connect(
            EndpointConfig::new(Transport::CudaIpc, Device::CPU),
            1 - r.rank,
            2,
        )
        .get()
        .expect("connect CudaIpc");
    let b = &r.boot;
    if r.rank == 1 {
        let mem = LocalMemory::alloc(Device::CPU, STALE_LEN).expect("alloc");
        // One registration per transport, so the Ethernet receiver's own check is reached
        // (a handle that also carries CudaIpc is refused by the writer's liveness check).
        let register = |t: Transport| {
            r.comm
                .register_memory(mem.ptr(), STALE_LEN, t.into())
                .expect("register")
        };
        let reg = (register(Transport::Ethernet), register(Transport::CudaIpc));
        r.comm.send_memory(&reg.0, 0, 1).expect("send memory");
        r.comm.send_memory(&reg.1, 0, 1).expect("send memory");
        b.barrier().expect("barrier 1"); // rank 0 wrote 0x11 over both transports
        b.barrier().expect("barrier 2");
        assert!(all_are(&mem, 0x11), "the live handle's writes landed");
        drop(reg);
        let reg2 = (register(Transport::Ethernet), register(Transport::CudaIpc));
        fill(&mem, 0x22);
        b.barrier().expect("barrier 3"); // rank 0 writes through the stale handles now
        b.barrier().expect("barrier 4");
        let intact = all_are(&mem, 0x22);
        measure("stale_new_buffer_intact", intact);
        assert!(
            intact,
            "a stale handle overwrote the new registration's data"
        );
        drop((reg2, ipc, conn));
        return;
    }
    let remote = r.comm.recv_memory(1, 1).get().expect("recv memory");
    let remote_ipc = r.comm.recv_memory(1, 1).get().expect("recv memory");
    let src_mem = LocalMemory::alloc(Device::CPU, STALE_LEN).expect("alloc src");
    let src = r
        .comm
        .register_memory(
            src_mem.ptr(),
            STALE_LEN,
            Transport::Ethernet | Transport::CudaIpc,
        )
        .expect("register src");
    let t = Duration::from_secs(10);
    fill(&src_mem, 0x11);
    conn.write(&remote, 0, &src, 0, STALE_LEN as u64)
        .expect("write");
    conn.flush(t).expect("flush");
    ipc.write(&remote_ipc, 0, &src, 0, STALE_LEN as u64)
        .expect("ipc write");
    ipc.flush(t).expect("ipc flush");
    let wire = remote_ipc.serialize();
    b.barrier().expect("barrier 1");
    b.barrier().expect("barrier 2");
    b.barrier().expect("barrier 3");
    fill(&src_mem, 0x33);
    let start = Instant::now();
    let eth = conn
        .write(&remote, 0, &src, 0, STALE_LEN as u64)
        .and_then(|()| conn.flush(t));
    measure("stale_ethernet_write_flush", format!("{eth:?}"));
    measure(
        "stale_ethernet_report_s",
        format!("{:.3}", start.elapsed().as_secs_f64()),
    );
    let via_import = ipc
        .write(&remote_ipc, 0, &src, 0, STALE_LEN as u64)
        .and_then(|()| ipc.flush(t));
    measure("stale_ipc_write_through_import", format!("{via_import:?}"));
    let reimport = RegisteredMemory::deserialize(&wire).map(|_| ());
    measure("stale_ipc_import", format!("{reimport:?}"));
    b.barrier().expect("barrier 4");
    let e = eth.expect_err("a write through a stale Ethernet handle must fail");
    assert!(e.to_string().contains("stale"), "{e}");
    let e = via_import.expect_err("a write through a stale CudaIpc import must fail");
    assert!(e.to_string().contains("stale"), "{e}");
    let e = reimport.expect_err("importing a stale CudaIpc handle must fail");
    assert!(e.to_string().contains("stale"), "{e}");
}

/// Rank 1 freezes (SIGSTOP) with ten flushed puts of rank 0 queued in rank 0's proxy; rank 0's
/// `stop_proxy` must return within about one flush timeout (2 s) with the failures.
#[test]
fn proxy_stop_behind_frozen_peer() {
    let Some(r) = child("proxy_stop_behind_frozen_peer") else {
        run_pair("proxy_stop_behind_frozen_peer", 21741, &[0], &[]);
        return;
    };
    let Some(mut p) = FrozenPeerProxy::start(&r, 4096) else {
        return;
    };
    let n = 10;
    for _ in 0..n {
        p.put_sync(64);
    }
    let e = p.stop_fails_in_time("proxy_stop", "the failed requests are reported");
    assert!(
        e.to_string()
            .contains(&format!("{n} proxy requests failed")),
        "{e}"
    );
    // The peer's failure keeps its class (a frozen peer: the flush timed out, then the broken
    // connection names the rank), never an internal error of this library.
    assert!(
        matches!(e.code(), ErrorCode::Timeout | ErrorCode::RemoteError),
        "expected Timeout or RemoteError, got {:?}: {e}",
        e.code()
    );
    assert!(e.to_string().contains("rank 1"), "names the rank: {e}");
}

/// Rank 1 freezes; rank 0's proxy is blocked sending a 64 MiB put into the frozen peer's full
/// socket buffers when `stop_proxy` is called: the stop deadline aborts the connection, so the
/// stop still returns within about one flush timeout.
#[test]
fn proxy_stop_with_a_send_blocked_on_a_frozen_peer() {
    let name = "proxy_stop_with_a_send_blocked_on_a_frozen_peer";
    let Some(r) = child(name) else {
        run_pair(name, 21747, &[0], &[]);
        return;
    };
    let len = 64usize << 20;
    let Some(mut p) = FrozenPeerProxy::start(&r, len) else {
        return;
    };
    p.put_sync(len as u64);
    std::thread::sleep(Duration::from_millis(500)); // the send blocks on full buffers now
    let e = p.stop_fails_in_time("proxy_stop_blocked_send", "the blocked request failed");
    assert!(
        e.to_string().contains("rank 1"),
        "the error names the rank: {e}"
    );
}

/// Rank 1 freezes; rank 0 writes 64 MiB to it directly: the write fills the socket buffers and
/// must fail within the connection's timeout (the bootstrap's 5 s), naming the rank, instead
/// of blocking for a send timeout per partial write.
#[test]
fn ethernet_write_to_a_frozen_peer_is_bounded() {
    let name = "ethernet_write_to_a_frozen_peer_is_bounded";
    let Some(r) = child(name) else {
        run_pair(name, 21748, &[0], &[]);
        return;
    };
    let len = 64usize << 20;
    let conn = ethernet_connection(&r, 0);
    let Some((_mem, reg, remote)) = swap_memory_then_freeze(&r, len) else {
        return;
    };
    std::thread::sleep(Duration::from_millis(300)); // let rank 1 stop
    let (res, took) = timed("frozen_peer_write", || {
        conn.write(&remote, 0, &reg, 0, len as u64)
    });
    let e = res.expect_err("the frozen peer takes no data");
    assert!(
        e.to_string().contains("rank 1"),
        "the error names the rank: {e}"
    );
    assert!(
        took < BOOT_TIMEOUT + Duration::from_secs(2),
        "the write took {took:?}, expected about the connection's {BOOT_TIMEOUT:?}"
    );
    let e = conn.flush(Duration::from_secs(1)).expect_err("broken");
    assert!(e.to_string().contains("broken"), "{e}");
}

/// Rank 1 kills itself right after one ping-pong; rank 0's `Host2HostSemaphore::wait` must end
/// at once with an error, not after its whole timeout.
fn wait_sees_dead_peer(name: &str, port: u16, transport: Transport, env: &[(&str, String)]) {
    let Some(r) = child(name) else {
        run_pair(name, port, &[0], env);
        return;
    };
    let cfg = EndpointConfig::new(transport, Device::CPU);
    let cfg = if transport.is_ib() {
        let mut c = cfg;
        c.ib.mode = match std::env::var("CONN_MP_IB_MODE").as_deref() {
            Ok("host-no-atomic") => IbMode::HostNoAtomic,
            _ => IbMode::Host,
        };
        c
    } else {
        cfg
    };
    let conn = r.comm.connect(cfg, 1 - r.rank, 0).get().expect("connect");
    let sem = r
        .comm
        .build_semaphore(&conn, 1 - r.rank, 0)
        .get()
        .expect("semaphore");
    let h = Host2HostSemaphore::new(sem).expect("h2h");
    let t = Duration::from_secs(20);
    if r.rank == 0 {
        h.signal().expect("signal");
        h.wait(t).expect("pong");
    } else {
        h.wait(t).expect("ping");
        h.signal().expect("signal");
    }
    r.boot.barrier().expect("barrier");
    if r.rank == 1 {
        std::thread::sleep(Duration::from_millis(100));
        signal_self("KILL");
        return;
    }
    let (res, took) = timed(name, || h.wait(t));
    let e = res.expect_err("the peer died: no signal can come");
    assert!(
        took < Duration::from_secs(5),
        "waited {took:?} after the peer died: {e}"
    );
    assert!(
        e.to_string().contains("rank 1"),
        "the error names the rank: {e}"
    );
}

#[test]
fn semaphore_wait_sees_dead_peer_ethernet() {
    wait_sees_dead_peer(
        "semaphore_wait_sees_dead_peer_ethernet",
        21742,
        Transport::Ethernet,
        &[],
    );
}

/// `target/<profile>/libmscclpp_ibv_testprov.so`, next to this binary's `deps` folder.
fn provider() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("libmscclpp_ibv_testprov.so");
    p.exists().then(|| p.to_string_lossy().into_owned())
}

fn wait_sees_dead_peer_ib(name: &str, port: u16, mode: &str) {
    let so = match (std::env::var("CONN_MP_TEST"), provider()) {
        (Ok(_), _) => String::new(), // a child: the parent set the variables
        (Err(_), Some(so)) => so,
        (Err(_), None) => {
            println!(
                "SKIP {name}: libmscclpp_ibv_testprov.so not found next to the test binary \
                 (build it with `cargo build -p mscclpp-ibv-testprov`)"
            );
            return;
        }
    };
    let env = [
        ("MSCCLPP_IBV_SO", so),
        ("CONN_MP_IB_MODE", mode.to_string()),
    ];
    wait_sees_dead_peer(name, port, Transport::Ib0, &env);
}

#[test]
fn semaphore_wait_sees_dead_peer_ib_host() {
    wait_sees_dead_peer_ib("semaphore_wait_sees_dead_peer_ib_host", 21743, "host");
}

#[test]
fn semaphore_wait_sees_dead_peer_ib_host_no_atomic() {
    wait_sees_dead_peer_ib(
        "semaphore_wait_sees_dead_peer_ib_host_no_atomic",
        21744,
        "host-no-atomic",
    );
}

/// Rank 1 sends its Ethernet endpoint, then dies (`dead`) or stays alive without ever
/// connecting; rank 0's connect must fail at once (dead) or after the caller's timeout (the
/// bootstrap's 5 s), never after Ethernet's own 60 s default.
fn connect_to_absent_peer(name: &str, port: u16, dead: bool) {
    let Some(r) = child(name) else {
        run_pair(name, port, &[0], &[]);
        return;
    };
    let cfg = EndpointConfig::new(Transport::Ethernet, Device::CPU);
    let fut = r.comm.connect(cfg, 1 - r.rank, 0);
    r.boot.barrier().expect("barrier: both endpoints sent");
    if r.rank == 1 {
        if dead {
            signal_self("KILL");
        }
        std::thread::sleep(LIMIT);
        drop(fut);
        return;
    }
    let (res, took) = timed(name, || fut.get().map(|_| ()));
    let e = res.expect_err("the peer never pairs");
    assert!(
        e.to_string().contains("rank 1"),
        "the error names the rank: {e}"
    );
    let bound = if dead {
        Duration::from_secs(2)
    } else {
        BOOT_TIMEOUT + Duration::from_secs(2)
    };
    assert!(
        took < bound,
        "connect took {took:?}, expected under {bound:?}: {e}"
    );
}

#[test]
fn ethernet_connect_to_dead_peer() {
    connect_to_absent_peer("ethernet_connect_to_dead_peer", 21745, true);
}

#[test]
fn ethernet_connect_uses_callers_timeout() {
    connect_to_absent_peer("ethernet_connect_uses_callers_timeout", 21746, false);
}
