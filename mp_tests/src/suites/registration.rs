//! RegistrationTest: registering memory this library did not allocate (issue 28).
//! * The application's own memory (host backend: a MAP_SHARED memfd mapping made with plain
//!   system calls; GPU builds: a cuMemAlloc / cuMem-VMM allocation made through the HAL, which
//!   the core library does not know) is registered for CudaIpc at a sub-range, sent to every
//!   peer, and read there byte for byte.
//! * Memory no peer can map (private `malloc` memory) is an error naming the pointer.
//! * Memory freed and allocated again at the same address is registered afresh (identity, not
//!   address, decides), and peers then see the new memory.
//! * All-reduce on registered buffers takes the zero-copy algorithm by default
//!   (`Collectives::choose_registered`) with exact results, also after the application replaced
//!   the memory at the same addresses; unexportable (private) buffers fall back alike on every
//!   rank.

use mscclpp::collectives::{Call, DataType, ReduceOp};
use mscclpp::executor::{ExecutionPlan, PacketType};
use mscclpp::{Communicator, RegisteredMemory, Transport};
use mscclpp_framework::*;
use mscclpp_hal::{prelude::*, Buffer, Gpu, MemoryKind};

use super::coll_common::*;
use super::memory_channel::common::{is_gpu_build, ok};
use crate::world::mp_env;

/// Memory the application made: a memfd mapped MAP_SHARED (host backend) or a HAL
/// allocation outside `mscclpp::LocalMemory` (GPU builds). Unmapped / freed on drop.
enum AppMemory {
    Host {
        ptr: *mut u8,
        len: usize,
        _fd: std::os::fd::OwnedFd,
    },
    Gpu(<Gpu as Api>::Memory),
}

// SAFETY: plain memory; tests synchronise through the bootstrap.
unsafe impl Send for AppMemory {}

fn device() -> <Gpu as Api>::Device {
    let ordinal = if is_gpu_build() {
        coll_env().device.id as usize
    } else {
        0
    };
    ok!(Gpu::open_device(ordinal), "opening the device")
}

impl AppMemory {
    /// `len` bytes of `kind` (GPU builds), or a memfd mapping (host backend), at `at` when
    /// given (host backend: MAP_FIXED over a mapping this test owns).
    fn new(len: usize, kind: MemoryKind, at: Option<*mut u8>) -> AppMemory {
        if is_gpu_build() {
            return AppMemory::Gpu(ok!(
                Gpu::alloc(&device(), len, kind),
                "allocating {len} bytes"
            ));
        }
        use rustix::mm::{MapFlags, ProtFlags};
        let fd = ok!(
            rustix::fs::memfd_create(c"app-memory", rustix::fs::MemfdFlags::CLOEXEC),
            "memfd_create"
        );
        ok!(rustix::fs::ftruncate(&fd, len as u64), "ftruncate");
        let (hint, flags) = match at {
            Some(p) => (p.cast(), MapFlags::SHARED | MapFlags::FIXED),
            None => (std::ptr::null_mut(), MapFlags::SHARED),
        };
        // SAFETY: a fresh shared mapping of our memfd; with MAP_FIXED only over a mapping of
        // this test's own (the caller passes the address of one it is replacing).
        let p = ok!(
            unsafe {
                rustix::mm::mmap(hint, len, ProtFlags::READ | ProtFlags::WRITE, flags, &fd, 0)
            },
            "mmap"
        );
        // The application keeps its fd open (registration finds the file through it).
        AppMemory::Host {
            ptr: p.cast(),
            len,
            _fd: fd,
        }
    }
    fn ptr(&self) -> u64 {
        match self {
            AppMemory::Host { ptr, .. } => *ptr as u64,
            AppMemory::Gpu(m) => m.device_ptr(),
        }
    }
    fn write(&self, at: usize, bytes: &[u8]) {
        ok!(
            Gpu::write(
                &device(),
                &Range(self.ptr() + at as u64, bytes.len()),
                0,
                bytes
            ),
            "writing"
        );
    }
    /// Unmaps without freeing the address for reuse by others: the caller maps over it.
    fn release_host(self) -> Option<*mut u8> {
        match &self {
            AppMemory::Host { ptr, .. } => {
                let p = *ptr;
                // Unmapped on drop; the caller maps over the same address right after.
                drop(self);
                Some(p)
            }
            AppMemory::Gpu(_) => None,
        }
    }
}

impl Drop for AppMemory {
    fn drop(&mut self) {
        if let AppMemory::Host { ptr, len, .. } = *self {
            // SAFETY: our own mapping, unmapped once.
            let _ = unsafe { rustix::mm::munmap(ptr.cast(), len) };
        }
    }
}

/// A device range named by address (memory mapped in this process).
struct Range(u64, usize);

impl Buffer for Range {
    fn device_ptr(&self) -> u64 {
        self.0
    }
    fn size(&self) -> usize {
        self.1
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        (!is_gpu_build()).then_some(self.0 as usize as *mut u8)
    }
}

fn read(ptr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    ok!(
        Gpu::read(&device(), &Range(ptr, len), 0, &mut out),
        "reading"
    );
    out
}

fn pattern(rank: usize, salt: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (rank as u8).wrapping_mul(7) ^ salt)
        .collect()
}

fn comm() -> &'static Communicator {
    coll_env().coll.resources().comm()
}

/// Registers `len` bytes at `ptr` for CudaIpc, sends the registration to every rank and
/// returns every rank's registration as mapped here.
fn exchange(ptr: u64, len: usize) -> (RegisteredMemory, Vec<RegisteredMemory>) {
    let mine = ok!(
        comm().register_memory(ptr, len, Transport::CudaIpc.into()),
        "registering {ptr:#x} (+{len} bytes)"
    );
    let all = ok!(
        mp_env().bootstrap.all_gather(&mine.serialize()),
        "exchanging"
    );
    let peers = all
        .iter()
        .map(|b| {
            ok!(
                RegisteredMemory::deserialize(b),
                "importing a peer's registration"
            )
        })
        .collect();
    (mine, peers)
}

/// Every rank's `len` bytes as read through the import here equal its `salt` pattern.
fn check_peers(peers: &[RegisteredMemory], salt: u8, len: usize, what: &str) {
    for (r, m) in peers.iter().enumerate() {
        EXPECT_NE!(m.data(), 0, "{what}: rank {r}'s memory is mapped here");
        if m.data() == 0 {
            continue;
        }
        EXPECT_TRUE!(
            read(m.data(), len) == pattern(r, salt, len),
            "{what}: rank {r}'s bytes read through the import"
        );
    }
}

/// The sub-range every test registers: 1000 bytes at 4 KiB + 128 of a 64 KiB allocation.
const ALLOC: usize = 64 << 10;
const AT: usize = 4096 + 128;
const LEN: usize = 1000;

fn round_trip(kind: MemoryKind, what: &str) {
    let rank = mp_env().placement.rank;
    let m = AppMemory::new(ALLOC, kind, None);
    m.write(AT, &pattern(rank, 1, LEN));
    let (mine, peers) = exchange(m.ptr() + AT as u64, LEN);
    EXPECT_EQ!(
        mine.data(),
        m.ptr() + AT as u64,
        "{what}: the registration's address"
    );
    check_peers(&peers, 1, LEN, what);
    ok!(
        mp_env().bootstrap.barrier(),
        "waiting for every rank's reads"
    );
}

TEST!(RegistrationTest, AppMemorySubRange, |_ctx| {
    round_trip(
        MemoryKind::Device,
        if is_gpu_build() {
            "cuMemAlloc memory"
        } else {
            "a memfd mapping"
        },
    );
});

TEST!(RegistrationTest, VmmMemorySubRange, |_ctx| {
    if !is_gpu_build() {
        SKIP!("cuMem/VMM memory needs a GPU build (AppMemorySubRange covers the host backend)");
    }
    round_trip(
        MemoryKind::Physical { granularity: 0 },
        "cuMem memory with a POSIX-fd handle type",
    );
});

TEST!(RegistrationTest, PrivateMemoryIsRefused, |_ctx| {
    let v = vec![0u8; 1 << 16];
    let p = v.as_ptr() as u64 + 64;
    match comm().register_memory(p, 128, Transport::CudaIpc.into()) {
        Ok(_) => FAIL!("private malloc memory {p:#x} was registered for CudaIpc"),
        Err(e) => {
            let msg = e.to_string();
            EXPECT_TRUE!(
                msg.contains(&format!("{p:#x}")),
                "the error names the pointer: {msg}"
            );
            let why = if is_gpu_build() {
                "not memory CUDA knows"
            } else {
                "private"
            };
            EXPECT_TRUE!(msg.contains(why), "the error says why ({why}): {msg}");
        }
    }
});

TEST!(
    RegistrationTest,
    FreeAndReallocateAtTheSameAddress,
    |_ctx| {
        let rank = mp_env().placement.rank;
        let first = AppMemory::new(ALLOC, MemoryKind::Device, None);
        first.write(AT, &pattern(rank, 2, LEN));
        let addr = first.ptr();
        let (old, peers) = exchange(addr + AT as u64, LEN);
        check_peers(&peers, 2, LEN, "the first memory");
        EXPECT_TRUE!(
            old.is_current(),
            "the first registration names the memory there"
        );
        drop(peers);
        ok!(
            mp_env().bootstrap.barrier(),
            "waiting for every rank's reads"
        );
        // Free and allocate again; the host backend maps a new memfd at exactly the old address.
        let second = match first.release_host() {
            Some(p) => AppMemory::new(ALLOC, MemoryKind::Device, Some(p)),
            None => AppMemory::new(ALLOC, MemoryKind::Device, None),
        };
        if second.ptr() != addr {
            SKIP!(
            "the driver placed the new allocation at {:#x}, not {addr:#x}: nothing to tell apart",
            second.ptr()
        );
        }
        EXPECT_FALSE!(
            old.is_current(),
            "the old registration no longer names the memory at {addr:#x}"
        );
        second.write(AT, &pattern(rank, 3, LEN));
        let (new, peers) = exchange(addr + AT as u64, LEN);
        EXPECT_NE!(
            new.registration_id(),
            old.registration_id(),
            "a new registration"
        );
        EXPECT_TRUE!(
            new.is_current(),
            "the new registration names the new memory"
        );
        check_peers(
            &peers,
            3,
            LEN,
            "the memory allocated again at the same address",
        );
        ok!(
            mp_env().bootstrap.barrier(),
            "waiting for every rank's reads"
        );
    }
);

/// An in-place-free all-reduce of `count` i32 on `send`/`recv` with the registered choice;
/// returns the algorithm's name and the wrong elements.
fn registered_all_reduce(
    send: u64,
    recv: u64,
    count: usize,
    call_no: u32,
    seed: u64,
) -> (String, usize, Vec<String>) {
    let env = coll_env();
    let (dtype, op) = (DataType::I32, ReduceOp::Sum);
    let vals = all_values(dtype, op, seed, call_no, env.coll.nranks(), count);
    let bytes = encode_all(dtype, &vals[env.coll.rank()]);
    ok!(
        Gpu::write(&device(), &Range(send, bytes.len()), 0, &bytes),
        "writing the input"
    );
    let call = Call::all_reduce(send, recv, count, dtype, op);
    let choice = ok!(env.coll.choose_registered(&call), "choosing");
    // SAFETY: both buffers hold count i32 and live until after the sync.
    let r = unsafe { env.coll.run_choice(&choice, env.raw_stream()) };
    ok!(r, "all-reduce");
    ok!(env.sync(), "waiting");
    let got = read(recv, bytes.len());
    let mut errors = Vec::new();
    let bad = compare_all_reduce(dtype, op, &got, &vals, &mut errors);
    (choice.name().to_string(), bad, errors)
}

/// i32 elements of the zero-copy calls: 4 MiB, at scale (coll_common::at_scale) just above
/// the 1 MiB where registered buffers start taking the zero-copy algorithm.
fn zero_copy_count(n: usize) -> usize {
    let bytes = if super::coll_common::at_scale(n) {
        (1 << 20) + 4096
    } else {
        4 << 20
    };
    bytes / 4 + 1000
}

TEST!(RegistrationTest, ZeroCopyAllReduceOnAppMemory, |_ctx| {
    let env = coll_env();
    if env.coll.nranks() == 1 {
        SKIP!("world size 1 always copies");
    }
    let count = zero_copy_count(env.coll.nranks());
    let len = count * 4;
    let seed = agreed_seed();
    let send = AppMemory::new(len, MemoryKind::Device, None);
    let recv = AppMemory::new(len, MemoryKind::Device, None);
    let before = env.coll.resources().user_buffers().len();
    let (name, bad, errors) = registered_all_reduce(send.ptr(), recv.ptr(), count, 0, seed);
    EXPECT_EQ!(
        name,
        "rsag_zero_copy",
        "registered buffers of {len} bytes take the zero-copy algorithm"
    );
    EXPECT_EQ!(bad, 0, "first call: {}", errors.join("; "));
    EXPECT_EQ!(
        env.coll.resources().user_buffers().len(),
        before + 2,
        "both buffers are registered at their first use"
    );
    let res = env.coll.resources();
    let cached = ok!(
        res.user_buffers()
            .get_or_register(res.comm(), res.device(), send.ptr(), len, true),
        "querying the cache"
    );
    EXPECT_TRUE!(
        cached.is_some(),
        "the input is mapped on every rank (zero-copy ran)"
    );
    // The application frees both buffers and maps new memory at the same addresses (host
    // backend; GPU builds allocate again wherever the driver puts it).
    let (s_at, r_at) = (send.release_host(), recv.release_host());
    let send = AppMemory::new(len, MemoryKind::Device, s_at);
    let recv = AppMemory::new(len, MemoryKind::Device, r_at);
    let calls = if super::coll_common::at_scale(env.coll.nranks()) {
        2
    } else {
        3
    };
    for call_no in 1..calls {
        let (name, bad, errors) =
            registered_all_reduce(send.ptr(), recv.ptr(), count, call_no, seed);
        EXPECT_EQ!(name, "rsag_zero_copy", "call {call_no}");
        EXPECT_EQ!(
            bad,
            0,
            "call {call_no} on the memory allocated again: {}",
            errors.join("; ")
        );
    }
    // Deregistration forgets the mappings (every rank alike).
    res.user_buffers().forget(send.ptr(), len);
    res.user_buffers().forget(recv.ptr(), len);
});

TEST!(RegistrationTest, UnexportableBuffersFallBackAlike, |_ctx| {
    let env = coll_env();
    if env.coll.nranks() == 1 {
        SKIP!("world size 1 always copies");
    }
    if is_gpu_build() {
        SKIP!("private host memory is no device memory: the host backend's case");
    }
    let count = zero_copy_count(env.coll.nranks());
    let send = vec![0i32; count];
    let mut recv = vec![0i32; count];
    let seed = agreed_seed();
    let (name, bad, errors) = registered_all_reduce(
        send.as_ptr() as u64,
        recv.as_mut_ptr() as u64,
        count,
        0,
        seed,
    );
    EXPECT_EQ!(name, "rsag_zero_copy", "chosen, then falling back inside");
    EXPECT_EQ!(bad, 0, "fallback results: {}", errors.join("; "));
    let res = env.coll.resources();
    let cached = ok!(
        res.user_buffers().get_or_register(
            res.comm(),
            res.device(),
            send.as_ptr() as u64,
            count * 4,
            true
        ),
        "querying the cache"
    );
    EXPECT_TRUE!(cached.is_none(), "cached as not registrable on every rank");
});

/// Shipped plan `plan` (an all-reduce) run by the executor on the application's buffers
/// `send` and `recv` of `count` i32: the mismatches and their descriptions.
fn plan_all_reduce(
    plan: &ExecutionPlan,
    send: u64,
    recv: u64,
    count: usize,
    call_no: u32,
    seed: u64,
) -> (usize, Vec<String>) {
    let env = super::executor::exec_env();
    let (dtype, op) = (DataType::I32, ReduceOp::Sum);
    let vals = all_values(dtype, op, seed, call_no, env.nranks, count);
    let bytes = encode_all(dtype, &vals[env.rank]);
    ok!(
        Gpu::write(&device(), &Range(send, bytes.len()), 0, &bytes),
        "writing the input"
    );
    // SAFETY: both buffers hold `count` i32 and live until after the sync.
    let r = unsafe {
        env.exec.execute(
            env.rank,
            send,
            recv,
            bytes.len(),
            bytes.len(),
            dtype,
            plan,
            env.raw_stream(),
            PacketType::LL16,
        )
    };
    ok!(r, "executing {} on the application's memory", plan.name());
    ok!(env.sync(), "waiting");
    let got = read(recv, bytes.len());
    let mut errors = Vec::new();
    let bad = compare_all_reduce(dtype, op, &got, &vals, &mut errors);
    (bad, errors)
}

// The executor on the application's memory: a plan runs on adopted buffers; after the
// application frees them and maps new memory at the same addresses (host backend; GPU builds
// allocate again wherever the driver puts it), the next execution sets the plan up again for
// the new memory (a context kept for the old one would have the peers write into the freed
// memory) and replaces the old context instead of keeping it beside.
TEST!(RegistrationTest, PlanOnAppMemoryAllocatedAgain, |ctx| {
    let env = super::executor::exec_env();
    let json = match super::executor::shipped_json("allreduce_oop", env.nranks) {
        Ok(j) => j,
        Err(reason) => SKIP!("{}", reason),
    };
    let plan = ok!(ExecutionPlan::from_json(json, ctx.rank()), "parsing");
    let len = super::executor::sizes(&plan)[1] / 4 * 4;
    let count = len / 4;
    let seed = agreed_seed();
    let before = env.exec.cached_contexts();
    let send = AppMemory::new(len, MemoryKind::Device, None);
    let recv = AppMemory::new(len, MemoryKind::Device, None);
    let (bad, errors) = plan_all_reduce(&plan, send.ptr(), recv.ptr(), count, 0, seed);
    EXPECT_EQ!(bad, 0, "first call: {}", errors.join("; "));
    EXPECT_EQ!(env.exec.cached_contexts(), before + 1);
    let (s_at, r_at) = (send.release_host(), recv.release_host());
    let send = AppMemory::new(len, MemoryKind::Device, s_at);
    let recv = AppMemory::new(len, MemoryKind::Device, r_at);
    for call_no in 1..3 {
        let (bad, errors) = plan_all_reduce(&plan, send.ptr(), recv.ptr(), count, call_no, seed);
        EXPECT_EQ!(
            bad,
            0,
            "call {call_no} on the memory allocated again: {}",
            errors.join("; ")
        );
    }
    let same_place = s_at.is_some_and(|p| p as u64 == send.ptr());
    if same_place {
        EXPECT_EQ!(
            env.exec.cached_contexts(),
            before + 1,
            "the context of the freed memory was replaced"
        );
    }
    env.exec.reset();
});
