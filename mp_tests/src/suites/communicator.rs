//! CommunicatorTest: ranks exchange registered memory, connect over CudaIpc or Ethernet,
//! write random data into each other's buffers and signal with semaphores.

use std::time::Duration;

use mscclpp::{
    Communicator, Connection, Context, Device, Host2DeviceSemaphore, Host2HostSemaphore,
    LocalMemory, MemoryDevice2DeviceSemaphore, RegisteredMemory, Transport,
};
use mscclpp_framework::*;
use mscclpp_hal::{prelude::*, Gpu};

use super::bootstrap::{random_bytes, shared_seed};
use crate::world::mp_env;

macro_rules! ok {
    ($e:expr, $($what:tt)+) => {
        match $e {
            Ok(v) => v,
            Err(e) => FAIL!("{}: {}", format!($($what)+), e),
        }
    };
}

/// Bytes each rank writes to each peer per round: 256 KiB + 8 (an unaligned tail) up to 8
/// ranks; the all-to-all traffic on one host grows as N^2, so larger worlds (16 ranks on a
/// CI machine's two cores) use 64 KiB + 8 and keep the suite within about 15 s.
fn chunk() -> usize {
    if mp_env().bootstrap.nranks() <= 8 {
        256 * 1024 + 8
    } else {
        64 * 1024 + 8
    }
}

/// Everything one test needs: a communicator, a local buffer of one chunk per rank, the
/// peers' buffers and a connection to each peer.
struct Mesh {
    comm: Communicator,
    buffer: LocalMemory,
    local: RegisteredMemory,
    remote: Vec<Option<RegisteredMemory>>,
    conns: Vec<Option<Connection>>,
}

fn peers() -> impl Iterator<Item = usize> {
    let b = &mp_env().bootstrap;
    let (rank, n) = (b.rank(), b.nranks());
    (0..n).filter(move |&p| p != rank)
}

fn build_mesh(transport: Transport, device: Device, tag: u64) -> Mesh {
    let env = mp_env();
    let n = env.bootstrap.nranks();
    let ctx = ok!(Context::new(), "Context::new");
    let comm = Communicator::new(env.bootstrap.clone(), ctx);
    let buffer = ok!(LocalMemory::alloc(device, chunk() * n), "alloc");
    let local = ok!(
        comm.register_memory(buffer.ptr(), buffer.size(), transport.into()),
        "register_memory"
    );
    let mut conn_futures = Vec::new();
    let mut mem_futures = Vec::new();
    for p in peers() {
        let cfg = mscclpp::EndpointConfig::new(transport, device);
        conn_futures.push((p, comm.connect(cfg, p, tag)));
        ok!(comm.send_memory(&local, p, tag), "send_memory to {}", p);
        mem_futures.push((p, comm.recv_memory(p, tag)));
    }
    let mut conns = vec![None; n];
    let mut remote = vec![None; n];
    for (p, f) in conn_futures {
        let c = ok!(f.get(), "connect to rank {} over {}", p, transport);
        EXPECT_EQ!(ok!(comm.remote_rank_of(&c), "remote_rank_of"), p);
        EXPECT_EQ!(ok!(comm.tag_of(&c), "tag_of"), tag);
        EXPECT_EQ!(c.transport(), transport);
        conns[p] = Some(c);
    }
    for (p, f) in mem_futures {
        let m = ok!(f.get(), "recv_memory from rank {}", p);
        EXPECT_EQ!(m.size(), chunk() * n);
        remote[p] = Some(m);
    }
    Mesh {
        comm,
        buffer,
        local,
        remote,
        conns,
    }
}

fn payload(seed: u64, from: usize, to: usize, round: u64) -> Vec<u8> {
    random_bytes(
        chunk(),
        seed ^ ((from as u64) << 40) ^ ((to as u64) << 20) ^ round,
    )
}

/// This rank's staging buffer, one chunk per peer, registered for the mesh's transport.
struct Staging {
    mem: LocalMemory,
    reg: RegisteredMemory,
}

impl Staging {
    /// A staging buffer on `device` as large as the mesh's buffer, registered for `transport`.
    fn new(m: &Mesh, device: Device, transport: Transport) -> Staging {
        let mem = ok!(LocalMemory::alloc(device, m.buffer.size()), "alloc staging");
        let reg = ok!(
            m.comm
                .register_memory(mem.ptr(), mem.size(), transport.into()),
            "register staging"
        );
        Staging { mem, reg }
    }

    /// Fills peer `p`'s chunk with this rank's payload of `round` and writes it through `c`
    /// into the peer's slot `rank` of `dst`.
    fn send(&self, c: &Connection, dst: &RegisteredMemory, p: usize, seed: u64, round: u64) {
        let rank = mp_env().bootstrap.rank();
        ok!(
            self.mem.write(p * chunk(), &payload(seed, rank, p, round)),
            "fill staging"
        );
        ok!(
            c.write(
                dst,
                (rank * chunk()) as u64,
                &self.reg,
                (p * chunk()) as u64,
                chunk() as u64
            ),
            "write to rank {}",
            p
        );
    }
}

/// Writes this rank's payload for each peer into the peer's slot `rank` (from a staging
/// buffer), then each rank verifies the slots of every peer byte by byte.
fn write_round(m: &Mesh, staging: &Staging, seed: u64, round: u64) {
    for p in peers() {
        let (Some(c), Some(dst)) = (&m.conns[p], &m.remote[p]) else {
            FAIL!("no connection to {}", p)
        };
        staging.send(c, dst, p, seed, round);
    }
    for p in peers() {
        if let Some(c) = &m.conns[p] {
            ok!(c.flush(Duration::from_secs(30)), "flush to rank {}", p);
        }
    }
}

fn verify_round(m: &Mesh, seed: u64, round: u64) {
    let rank = mp_env().bootstrap.rank();
    for p in peers() {
        let mut got = vec![0u8; chunk()];
        ok!(m.buffer.read(p * chunk(), &mut got), "read slot {}", p);
        let want = payload(seed, p, rank, round);
        let bad = got.iter().zip(&want).position(|(a, b)| a != b);
        EXPECT_EQ!(
            bad,
            None,
            "round {}: first wrong byte in the slot of rank {}",
            round,
            p
        );
    }
}

/// The device for IPC data tests: this rank's GPU on a GPU build (`local_rank % GPUs`, so
/// ranks may share one), else the CPU (host backend, or a GPU build on a machine without GPUs,
/// where the CPU path of the same connection code still runs).
fn data_device() -> Device {
    if Gpu::NAME == "host" {
        return Device::CPU;
    }
    crate::world::rank_gpu().unwrap_or(Device::CPU)
}

TEST!(CommunicatorTest, BasicWrite, |_ctx| {
    let env = mp_env();
    let seed = shared_seed();
    let device = data_device();
    let m = build_mesh(Transport::CudaIpc, device, 100);
    let staging = Staging::new(&m, device, Transport::CudaIpc);
    for round in 0..3 {
        write_round(&m, &staging, seed, round);
        ok!(env.bootstrap.barrier(), "barrier");
        verify_round(&m, seed, round);
        ok!(env.bootstrap.barrier(), "barrier");
    }
    EXPECT_EQ!(m.local.data(), m.buffer.ptr());
});

fn write_with_host_semaphores(transport: Transport, tag: u64) {
    let env = mp_env();
    let seed = shared_seed();
    let m = build_mesh(transport, Device::CPU, tag);
    let staging = Staging::new(&m, Device::CPU, transport);
    let n = env.bootstrap.nranks();
    let mut futures = Vec::new();
    for p in peers() {
        let Some(c) = &m.conns[p] else {
            FAIL!("no connection to {}", p)
        };
        futures.push((p, m.comm.build_semaphore(c, p, tag)));
    }
    let mut sems: Vec<Option<Host2HostSemaphore>> = (0..n).map(|_| None).collect();
    for (p, f) in futures {
        let s = ok!(f.get(), "build_semaphore with rank {}", p);
        sems[p] = Some(ok!(Host2HostSemaphore::new(s), "Host2HostSemaphore"));
    }
    for round in 0..5 {
        for p in peers() {
            let (Some(c), Some(dst), Some(s)) = (&m.conns[p], &m.remote[p], &sems[p]) else {
                FAIL!("missing state for rank {}", p)
            };
            staging.send(c, dst, p, seed, round);
            ok!(s.signal(), "signal rank {}", p);
        }
        for p in peers() {
            let Some(s) = &sems[p] else {
                FAIL!("no semaphore for {}", p)
            };
            ok!(s.wait(env.timeout), "round {}: wait for rank {}", round, p);
        }
        verify_round(&m, seed, round);
        // Nobody overwrites a slot before its owner checked it.
        ok!(env.bootstrap.barrier(), "barrier");
    }
    for p in peers() {
        if let Some(c) = &m.conns[p] {
            ok!(
                c.flush(Duration::from_secs(30)),
                "final flush to rank {}",
                p
            );
        }
    }
    ok!(env.bootstrap.barrier(), "barrier");
}

TEST!(CommunicatorTest, WriteWithHostSemaphoresIpc, |_ctx| {
    write_with_host_semaphores(Transport::CudaIpc, 200);
});

TEST!(CommunicatorTest, WriteWithHostSemaphoresEthernet, |_ctx| {
    write_with_host_semaphores(Transport::Ethernet, 300);
});

TEST!(CommunicatorTest, FutureOrdering, |_ctx| {
    let env = mp_env();
    let (rank, n) = (env.bootstrap.rank(), env.bootstrap.nranks());
    let comm = Communicator::new(env.bootstrap.clone(), ok!(Context::new(), "Context::new"));
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let first = ok!(LocalMemory::alloc(Device::CPU, 4096), "alloc");
    let second = ok!(LocalMemory::alloc(Device::CPU, 8192), "alloc");
    let r1 = ok!(
        comm.register_memory(first.ptr(), 1000, Transport::Ethernet.into()),
        "register"
    );
    let r2 = ok!(
        comm.register_memory(second.ptr(), 2000, Transport::Ethernet.into()),
        "register"
    );
    let f1 = comm.recv_memory(prev, 400);
    let f2 = comm.recv_memory(prev, 400);
    let f3 = comm.recv_memory(prev, 401);
    ok!(comm.send_memory(&r1, next, 400), "send first");
    ok!(comm.send_memory(&r2, next, 400), "send second");
    ok!(comm.send_memory(&r1, next, 401), "send other tag");
    // Waited in reverse order: each still gets what was sent in its call order.
    let m3 = ok!(f3.get(), "third");
    let m2 = ok!(f2.get(), "second");
    let m1 = ok!(f1.get(), "first");
    EXPECT_EQ!(m1.size(), 1000);
    EXPECT_EQ!(m2.size(), 2000);
    EXPECT_EQ!(m3.size(), 1000);
    ok!(env.bootstrap.barrier(), "barrier");
});

TEST!(CommunicatorTest, WriteWithDeviceSemaphores, |_ctx| {
    let env = mp_env();
    // Ranks share GPUs round-robin (`local_rank % GPUs`); every rank decides the same way.
    // The host backend runs it on the CPU "device" (its semaphores are host memory; the host
    // checks the tokens either way), so CI sees this sequence too.
    let gpu = if Gpu::NAME == "host" {
        Ok(mscclpp::Device::CPU)
    } else {
        crate::world::rank_gpu()
    };
    let enough = ok!(
        env.bootstrap.all_gather(&[u8::from(
            gpu.is_ok() && env.bootstrap.nranks_per_node() == env.bootstrap.nranks()
        )]),
        "all_gather"
    );
    if enough.iter().any(|b| b.first() != Some(&1)) {
        let mine = match &gpu {
            Ok(d) => format!("GPU {}", d.id),
            Err(reason) => reason.clone(),
        };
        SKIP!(
            "needs a GPU on every rank and all ranks on one host (this rank: {}, {} of {} ranks on this host)",
            mine,
            env.bootstrap.nranks_per_node(),
            env.bootstrap.nranks()
        );
    }
    let seed = shared_seed();
    let Ok(device) = gpu else {
        FAIL!("rank_gpu changed its answer")
    };
    let m = build_mesh(Transport::CudaIpc, device, 500);
    let staging = Staging::new(&m, device, Transport::CudaIpc);
    let n = env.bootstrap.nranks();
    let mut futures = Vec::new();
    for p in peers() {
        let Some(c) = &m.conns[p] else {
            FAIL!("no connection to {}", p)
        };
        futures.push((
            p,
            m.comm.build_semaphore(c, p, 500),
            m.comm.build_semaphore(c, p, 501),
        ));
    }
    let mut h2d: Vec<Option<Host2DeviceSemaphore>> = (0..n).map(|_| None).collect();
    // Kept to the end: dropping a semaphore frees its token registration, which the peer may
    // still be importing (the test dropped each one at once and failed intermittently with
    // "fd fetch: ... unknown id" on the peer, then a write into the failed peer's freed mesh).
    let mut d2ds = Vec::new();
    for (p, f, g) in futures {
        let s = ok!(f.get(), "build_semaphore with rank {}", p);
        h2d[p] = Some(ok!(Host2DeviceSemaphore::new(s), "Host2DeviceSemaphore"));
        let d2d = ok!(
            MemoryDevice2DeviceSemaphore::new(ok!(g.get(), "second semaphore")),
            "MemoryDevice2DeviceSemaphore"
        );
        let h = d2d.device_handle();
        EXPECT_FALSE!(
            h.inbound_token.is_null()
                || h.remote_inbound_token.is_null()
                || h.expected_inbound_token.is_null()
        );
        d2ds.push(d2d);
    }
    let rank = env.bootstrap.rank();
    for round in 0..3u64 {
        write_round(&m, &staging, seed, round);
        for p in peers() {
            let Some(s) = &h2d[p] else {
                FAIL!("no semaphore for {}", p)
            };
            ok!(s.signal(), "signal rank {}", p);
        }
        ok!(env.bootstrap.barrier(), "barrier");
        // The host checks what a kernel would wait for: every inbound token reached round+1.
        for p in peers() {
            let Some(s) = &h2d[p] else {
                FAIL!("no semaphore for {}", p)
            };
            EXPECT_EQ!(
                ok!(s.semaphore().read_inbound(), "read token"),
                round + 1,
                "token from rank {}",
                p
            );
        }
        verify_round(&m, seed, round);
        ok!(env.bootstrap.barrier(), "barrier");
    }
    let _ = rank;
    // Every rank is done with the peers' tokens before any rank frees its own.
    ok!(env.bootstrap.barrier(), "barrier");
    drop(d2ds);
});
