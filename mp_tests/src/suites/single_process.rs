//! The single-process suites: NumaTest, ErrorsTest, SocketTest, GpuIpcMemTest and UtilsTest.
//! Every rank runs them on its own (the framework runs each test on every rank); only
//! GpuIpcMemTest's cross-rank part talks to a peer, through the shared bootstrap.

use std::time::{Duration, Instant};

use mscclpp::bootstrap::{Bootstrap, InitAddr, TcpBootstrap};
use mscclpp::fifo::Fifo;
use mscclpp::{
    Context, Device, Error, ErrorCode, LocalMemory, ProxyService, RegisteredMemory, Transport,
};
use mscclpp_framework::*;
use mscclpp_hal::api::Host;
use mscclpp_hal::{auxil::numa, prelude::*, Gpu};

use super::memory_channel::common::ok;
use crate::world::mp_env;

/// Bootstrap tag of this file's point-to-point messages.
const SINGLE_PROCESS_TAG: u64 = 0x0D60_0000;

/// The GPU this rank would use (`local_rank % count`), or `None` when the build's backend has
/// no driver or no device here.
fn this_rank_gpu() -> Option<<Gpu as Api>::Device> {
    let n = match Gpu::device_count() {
        Ok(n) => n,
        Err(mscclpp_hal::Error::NoDriver { .. }) => return None,
        Err(e) => FAIL!("counting {} devices: {}", Gpu::NAME, e),
    };
    if n == 0 {
        return None;
    }
    let ordinal = mp_env().placement.local_rank % n;
    Some(ok!(
        Gpu::open_device(ordinal),
        "opening {} device {ordinal}",
        Gpu::NAME
    ))
}

/// Binds a fresh thread to `node` and returns what the bind said and the thread's affinity
/// afterwards; the calling thread is left alone.
fn bind_on_a_thread(node: i32) -> Result<(bool, Vec<usize>), String> {
    std::thread::spawn(move || {
        let bound = numa::bind_current_thread_to_node(node).map_err(|e| e.to_string())?;
        let cpus = numa::current_thread_cpus().map_err(|e| e.to_string())?;
        Ok((bound, cpus))
    })
    .join()
    .map_err(|_| format!("the thread binding to NUMA node {node} panicked"))?
}

TEST!(NumaTest, Basic, |_ctx| {
    EXPECT_GE!(
        numa::node_count(),
        1usize,
        "Linux has at least one NUMA node"
    );
    let before = ok!(
        numa::current_thread_cpus(),
        "reading this thread's affinity"
    );
    ASSERT_FALSE!(before.is_empty(), "this thread may run on no CPU?");

    // Unknown node: no-op, reported as "not bound", affinity untouched.
    let bound = ok!(numa::bind_current_thread_to_node(-1), "binding to node -1");
    EXPECT_FALSE!(bound, "node -1 means \"don't bind\"");
    let after = ok!(numa::current_thread_cpus(), "reading the affinity again");
    EXPECT_EQ!(after, before, "binding to node -1 changed the affinity");

    // Node 0: the thread's affinity becomes (a non-empty subset of) node 0's CPUs.
    let node0 = ok!(numa::cpus_of_node(0), "CPUs of NUMA node 0");
    ASSERT_FALSE!(node0.is_empty(), "NUMA node 0 has no CPUs");
    let (bound0, cpus0) = ok!(bind_on_a_thread(0), "binding a thread to node 0");
    EXPECT_TRUE!(bound0, "binding to node 0 returned false");
    EXPECT_FALSE!(cpus0.is_empty());
    for c in &cpus0 {
        EXPECT_TRUE!(
            node0.contains(c),
            "CPU {} is not on node 0 ({:?})",
            c,
            node0
        );
    }
    let mine = ok!(numa::current_thread_cpus(), "reading the affinity");
    EXPECT_EQ!(mine, before, "binding another thread changed this one");

    // A node that does not exist is an error naming it.
    match numa::bind_current_thread_to_node(1 << 20) {
        Ok(b) => FAIL!("binding to node 2^20 succeeded ({b})"),
        Err(e) => EXPECT_TRUE!(e.to_string().contains("NUMA node 1048576"), "{}", e),
    }

    // The GPU's node: -1 (unknown, e.g. on a VM) is allowed and means "don't bind".
    let Some(dev) = this_rank_gpu() else {
        return; // no device of this build's backend here: nothing more to check
    };
    let props = ok!(Gpu::properties(&dev), "{} device properties", Gpu::NAME);
    let node = props.numa_node;
    EXPECT_GE!(node, -1, "NUMA node of {}", props.name);
    if Gpu::NAME == Host::NAME {
        EXPECT_EQ!(node, -1, "the host backend's device has no NUMA node");
    }
    let (bound, cpus) = ok!(bind_on_a_thread(node), "binding to the GPU's node {node}");
    EXPECT_EQ!(bound, node >= 0, "bind result for the GPU's node {}", node);
    if node >= 0 {
        let want = ok!(numa::cpus_of_node(node), "CPUs of the GPU's node {node}");
        EXPECT_TRUE!(
            cpus.iter().all(|c| want.contains(c)),
            "{:?} vs {:?}",
            cpus,
            want
        );
    } else {
        EXPECT_EQ!(
            cpus,
            before,
            "an unbound thread keeps the inherited affinity"
        );
    }
    // The proxy binds to the same node (or not at all) and must start and stop either way.
    let fifo = ok!(Fifo::new_on::<Gpu>(&dev, 64), "creating a FIFO on the GPU");
    EXPECT_EQ!(fifo.numa_node(), node);
    let mut proxy = ok!(ProxyService::with_fifo(fifo), "creating a proxy service");
    ok!(proxy.start_proxy(), "starting the proxy");
    ok!(proxy.stop_proxy(), "stopping the proxy");
});

/// Expects `e` to carry `code` and a message containing every one of `needles`.
fn expect_error(e: &Error, code: ErrorCode, needles: &[&str]) {
    EXPECT_EQ!(e.code(), code, "code of \"{}\"", e);
    let msg = e.to_string();
    for n in needles {
        EXPECT_TRUE!(msg.contains(n), "message \"{}\" lacks \"{}\"", msg, n);
    }
}

/// The error of `r`, or a test failure naming `what` when it succeeded.
fn must_fail<T>(r: mscclpp::Result<T>, what: &str) -> Error {
    match r {
        Ok(_) => FAIL!("{what}: expected an error, got success"),
        Err(e) => e,
    }
}

TEST!(ErrorsTest, Codes, |_ctx| {
    // Errors the library really produces.
    let e = must_fail(TcpBootstrap::new(3, 2), "TcpBootstrap::new(3, 2)");
    expect_error(&e, ErrorCode::InvalidUsage, &["rank 3", "expected"]);
    let e = must_fail(InitAddr::parse("no-port-here"), "InitAddr::parse");
    expect_error(
        &e,
        ErrorCode::InvalidUsage,
        &["no-port-here", "expected \"ip:port\""],
    );
    let e = must_fail(LocalMemory::alloc(Device::CPU, 0), "a 0-byte allocation");
    expect_error(
        &e,
        ErrorCode::InvalidUsage,
        &["expected a size above 0, got 0"],
    );
    let e = must_fail(Fifo::new_host(3), "a FIFO of 3 slots");
    expect_error(&e, ErrorCode::InvalidUsage, &["power of two", "got 3"]);
    let e = must_fail(RegisteredMemory::deserialize(b"junk"), "decoding 4 bytes");
    expect_error(&e, ErrorCode::InvalidUsage, &["expected at least", "got 4"]);
    let mem = ok!(LocalMemory::alloc(Device::CPU, 256), "allocating 256 bytes");
    let context = ok!(Context::new(), "creating a context");
    let reg = ok!(
        context.register_buffer(&mem, Transport::CudaIpc.into()),
        "registering for CudaIpc"
    );
    let mut wire = reg.serialize();
    wire.pop();
    let e = must_fail(RegisteredMemory::deserialize(&wire), "a truncated memory");
    expect_error(&e, ErrorCode::InvalidUsage, &["registered memory", "got"]);

    // Every variant's code, and messages that say what was expected.
    let e = Error::timeout(
        "connecting to rank 1 at 127.0.0.1:9",
        Duration::from_secs(2),
    );
    expect_error(&e, ErrorCode::Timeout, &["timed out after 2s", "rank 1"]);
    let e = Error::remote(3, "expected a hello, got end of stream");
    expect_error(
        &e,
        ErrorCode::RemoteError,
        &["remote rank 3", "expected a hello"],
    );
    let e = Error::io(
        "bind 127.0.0.1:9",
        std::io::Error::from(std::io::ErrorKind::AddrInUse),
    );
    expect_error(&e, ErrorCode::SystemError, &["bind 127.0.0.1:9"]);
    expect_error(
        &Error::invalid("x"),
        ErrorCode::InvalidUsage,
        &["invalid usage: x"],
    );
    let e = Error::Internal("broken".into());
    expect_error(&e, ErrorCode::InternalError, &["internal error: broken"]);
    let e = Error::Aborted("stop".into());
    expect_error(&e, ErrorCode::Aborted, &["aborted: stop"]);
    let e = Error::Executor("plan".into());
    expect_error(&e, ErrorCode::ExecutorError, &["executor error: plan"]);

    // HAL errors keep their code through the conversion, and their message.
    let hal_cases: Vec<(mscclpp_hal::Error, ErrorCode, &str)> = vec![
        (
            mscclpp_hal::Error::Timeout {
                op: "stream sync",
                waited: Duration::from_secs(1),
            },
            ErrorCode::Timeout,
            "stream sync: timed out after 1s",
        ),
        (
            mscclpp_hal::Error::InvalidArgument {
                op: "memcpy",
                expected: "a range inside 8 bytes".into(),
                got: "offset 9".into(),
            },
            ErrorCode::InvalidUsage,
            "expected a range inside 8 bytes, got offset 9",
        ),
        (
            mscclpp_hal::Error::BadDescriptor("short".into()),
            ErrorCode::InvalidUsage,
            "bad IPC descriptor: short",
        ),
        (
            mscclpp_hal::Error::PeerGone {
                op: "import",
                pid: 7,
                reason: "gone".into(),
            },
            ErrorCode::RemoteError,
            "exporter pid 7",
        ),
        (
            mscclpp_hal::Error::Os {
                op: "memfd_create",
                source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
            },
            ErrorCode::SystemError,
            "memfd_create",
        ),
        (
            mscclpp_hal::Error::Driver {
                op: "cuMemAlloc",
                code: 2,
                name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            },
            ErrorCode::SystemError,
            "CUDA_ERROR_OUT_OF_MEMORY",
        ),
    ];
    for (hal, code, text) in hal_cases {
        let e: Error = hal.into();
        expect_error(&e, code, &[text]);
        EXPECT_TRUE!(
            std::error::Error::source(&e).is_some(),
            "\"{}\" lost its HAL source",
            e
        );
    }
    // A real HAL error, converted.
    let e: Error = match numa::cpus_of_node(-1) {
        Ok(v) => FAIL!("cpus_of_node(-1) gave {v:?}"),
        Err(e) => e.into(),
    };
    expect_error(
        &e,
        ErrorCode::InvalidUsage,
        &["expected a NUMA node >= 0, got -1"],
    );
});

TEST!(SocketTest, PortInUse, |_ctx| {
    // A foreign listener that never accepts or answers.
    let foreign = ok!(
        std::net::TcpListener::bind("127.0.0.1:0"),
        "binding a foreign listener"
    );
    let addr = ok!(foreign.local_addr(), "the foreign listener's address");
    let addr_text = addr.to_string();
    let timeout = Duration::from_secs(5);

    // Rank 0 must run the root there: the bind fails at once (no retries: waiting would not
    // free the port) with a system error naming the address and the process holding it.
    let mut root = ok!(TcpBootstrap::new(0, 2), "TcpBootstrap::new(0, 2)");
    let start = Instant::now();
    let e = must_fail(
        root.initialize_with_addr(&addr_text, timeout),
        "root on a used port",
    );
    let took = start.elapsed();
    let holder = format!("pid {}", std::process::id());
    expect_error(
        &e,
        ErrorCode::SystemError,
        &[addr_text.as_str(), "already in use", holder.as_str()],
    );
    // Before, the root retried for 2.5 s; finding the holder scans /proc, which takes up to
    // ~0.9 s with 16 ranks on 2 cores (CI), so the bound is 2 s.
    EXPECT_LT!(
        took,
        Duration::from_secs(2),
        "the root gave up only after {:?}",
        took
    );
    EXPECT_FALSE!(root.is_initialized());

    // A non-root rank joins the "root", gets no answer, and times out instead of hanging.
    let join_timeout = Duration::from_secs(1);
    let mut member = ok!(TcpBootstrap::new(1, 2), "TcpBootstrap::new(1, 2)");
    let start = Instant::now();
    let e = must_fail(
        member.initialize_with_addr(&addr_text, join_timeout),
        "joining a root that never answers",
    );
    let took = start.elapsed();
    expect_error(
        &e,
        ErrorCode::Timeout,
        &[addr_text.as_str(), "timed out after 1s"],
    );
    EXPECT_GE!(took, join_timeout, "gave up before the timeout: {:?}", took);
    EXPECT_LT!(
        took,
        join_timeout + Duration::from_secs(3),
        "took {:?} for a {:?} timeout",
        took,
        join_timeout
    );
    drop(foreign);
});

/// The pattern rank `rank` writes into its exported memory.
fn pattern(rank: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 31 + rank as u64 * 7 + 1) as u8)
        .collect()
}

TEST!(GpuIpcMemTest, HostExportImport, |ctx| {
    const LEN: usize = 8192;
    let (rank, size) = (ctx.rank(), ctx.size());
    let mem = ok!(
        LocalMemory::alloc(Device::CPU, LEN),
        "allocating {LEN} host bytes"
    );
    // First half: this rank's pattern; the second half stays zero for the peer to write.
    let half = LEN / 2;
    ok!(mem.write(0, &pattern(rank, half)), "writing the pattern");
    let context = ok!(Context::new(), "creating a context");
    let reg = ok!(
        context.register_buffer(&mem, Transport::CudaIpc.into()),
        "registering {LEN} host bytes for CudaIpc"
    );
    EXPECT_TRUE!(reg.transports().has(Transport::CudaIpc));
    EXPECT_TRUE!(reg.transport_info(Transport::CudaIpc).is_some());
    EXPECT_EQ!(reg.data(), mem.ptr());
    EXPECT_EQ!(reg.size(), LEN);
    EXPECT_TRUE!(reg.is_local());

    // In this process: the pointer is reused, no mapping is made.
    let wire = reg.serialize();
    let same = ok!(RegisteredMemory::deserialize(&wire), "deserializing here");
    EXPECT_EQ!(
        same.data(),
        mem.ptr(),
        "in-process deserialize reuses the pointer"
    );
    EXPECT_EQ!(same.original_data_ptr(), mem.ptr());
    EXPECT_EQ!(same.size(), LEN);
    EXPECT_TRUE!(same.is_local());
    // A sub-range keeps its offset.
    let part = ok!(
        context.register_memory(mem.ptr() + 512, 1024, Transport::CudaIpc.into()),
        "registering bytes 512..1536"
    );
    let part2 = ok!(
        RegisteredMemory::deserialize(&part.serialize()),
        "deserializing the sub-range"
    );
    EXPECT_EQ!(part2.data(), mem.ptr() + 512);
    EXPECT_EQ!(part2.size(), 1024);

    if size < 2 {
        SKIP!("the in-process export/import passed; the cross-rank import needs 2 or more ranks");
    }
    // Across ranks (a ring): send ours to the next rank, import the previous rank's.
    let b: &dyn Bootstrap = mp_env().bootstrap.as_ref();
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    ok!(
        b.send(&wire, next, SINGLE_PROCESS_TAG),
        "sending the memory to rank {next}"
    );
    let theirs = ok!(
        b.recv(prev, SINGLE_PROCESS_TAG),
        "receiving the memory of rank {prev}"
    );
    let imported = ok!(
        RegisteredMemory::deserialize(&theirs),
        "importing the memory of rank {prev}"
    );
    if imported.host_hash() != mscclpp::bootstrap::host_hash() {
        ok!(b.barrier(), "barrier");
        ok!(b.barrier(), "barrier");
        SKIP!("rank {prev} runs on another host: its memory cannot be mapped here");
    }
    EXPECT_FALSE!(imported.is_local());
    EXPECT_EQ!(imported.size(), LEN);
    ASSERT_NE!(
        imported.data(),
        0,
        "same-host CudaIpc memory was not mapped"
    );
    // SAFETY: a CPU allocation's CudaIpc export imports as a host mapping of `LEN` bytes at
    // `data()`, kept alive by `imported` until the end of the test.
    let seen =
        unsafe { std::slice::from_raw_parts(imported.data() as usize as *const u8, half) }.to_vec();
    EXPECT_TRUE!(
        seen == pattern(prev, half),
        "rank {}'s pattern is wrong through the mapping",
        prev
    );
    // Write back through the mapping; the owner checks it sees our bytes.
    let reply = pattern(rank + 1000, half);
    // SAFETY: as above; the second half of the mapping is written by this rank only, and the
    // owner reads it only after the barrier below.
    unsafe {
        std::ptr::copy_nonoverlapping(
            reply.as_ptr(),
            (imported.data() as usize as *mut u8).add(half),
            half,
        )
    };
    ok!(b.barrier(), "barrier after writing through the mappings");
    let mut back = vec![0u8; half];
    ok!(mem.read(half, &mut back), "reading our second half");
    EXPECT_TRUE!(
        back == pattern(next + 1000, half),
        "rank {}'s writes through its mapping did not reach our memory",
        next
    );
    // The importer unmaps before the owner frees (not required by memfd, but the order
    // applications use).
    drop(imported);
    ok!(b.barrier(), "barrier before freeing");
});

TEST!(UtilsTest, HostHashStable, |ctx| {
    let h = mscclpp::bootstrap::host_hash();
    EXPECT_NE!(h, 0u64);
    for _ in 0..3 {
        EXPECT_EQ!(mscclpp::bootstrap::host_hash(), h, "the host hash changed");
    }
    // What this process stamps into registered memory is the same hash.
    let mem = ok!(LocalMemory::alloc(Device::CPU, 64), "allocating 64 bytes");
    let context = ok!(Context::new(), "creating a context");
    let reg = ok!(
        context.register_buffer(&mem, Transport::CudaIpc.into()),
        "registering"
    );
    EXPECT_EQ!(reg.host_hash(), h);
    // The pid hash is stable here and different in every rank.
    let p = mscclpp::endpoint::pid_hash();
    EXPECT_EQ!(mscclpp::endpoint::pid_hash(), p);
    EXPECT_EQ!(reg.pid_hash(), p);
    let all = ok!(
        mp_env().bootstrap.all_gather(&p.to_le_bytes()),
        "all_gather of pid hashes"
    );
    ASSERT_EQ!(all.len(), ctx.size());
    for i in 0..all.len() {
        for j in i + 1..all.len() {
            EXPECT_NE!(all[i], all[j], "ranks {} and {} share a pid hash", i, j);
        }
    }
});

TEST!(UtilsTest, Timers, |_ctx| {
    // The host backend's events are wall-clock timers.
    let dev = ok!(Host::open_device(0), "opening the host device");
    let stream = ok!(Host::create_stream(&dev), "creating a host stream");
    let start = ok!(Host::create_event(&dev), "creating an event");
    let end = ok!(Host::create_event(&dev), "creating an event");
    match Host::event_elapsed_ms(&start, &end) {
        Ok(ms) => FAIL!("elapsed time between unrecorded events: {ms} ms"),
        Err(e) => EXPECT_TRUE!(e.to_string().contains("never recorded"), "{}", e),
    }
    ok!(Host::record_event(&start, &stream), "recording");
    let wall = Instant::now();
    std::thread::sleep(Duration::from_millis(20));
    ok!(Host::record_event(&end, &stream), "recording");
    let wall_ms = wall.elapsed().as_secs_f32() * 1000.0;
    ok!(
        Host::event_synchronize(&end, Duration::from_secs(1)),
        "waiting for the event"
    );
    let ms = ok!(Host::event_elapsed_ms(&start, &end), "elapsed time");
    EXPECT_GE!(ms, 20.0f32, "slept 20 ms");
    EXPECT_LE!(
        ms,
        wall_ms + 1.0,
        "more than the wall clock ({} ms)",
        wall_ms
    );
});
