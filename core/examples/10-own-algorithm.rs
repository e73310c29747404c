//! 10: an all-reduce algorithm of one's own, with one's own selector, run through
//! `mscclpp::collectives` and through `libmscclpp_nccl.so`'s `ncclAllReduce`.
//!
//! What it shows, on each of 2 ranks:
//! 1. `OwnAllReduce` implements `collectives::Algorithm` (f32 sum only): on GPU builds it
//!    launches its own kernel (`examples/kernels/own_allreduce.cu`, compiled and embedded by
//!    `build.rs` as example 08's), which uses the scratch and semaphores every `Collectives`
//!    shares ([`Resources`]); on the host backend its host code does the same on the CPU. Its
//!    builder (a closure given a `BuildContext`) loads the kernel once per communicator.
//! 2. Per communicator: `Collectives::builder(comm).add_algorithm(builder).selector(selector)`;
//!    the selector takes `own_allreduce` for f32 sums up to 256 KiB and leaves every other
//!    call to the default choice. Each size is checked, and `choose` says what ran.
//! 3. The NCCL library: the example `dlopen`s the built `libmscclpp_nccl.so` (`MSCCLPP_NCCL_SO`,
//!    else `target/<profile>/` next to this binary's `examples/` folder) and registers the same
//!    algorithm through its C extension `mscclppNcclRegisterAlgorithm`
//!    (core/nccl/include/mscclpp_nccl_ext.h): `select_c` applies the selector's rule, `launch_c`
//!    launches the same kernel (host backend: runs the same host code) on the shared resources
//!    the library's communicator hands it. Then `ncclCommInitRank` (communicators created after
//!    the registration get the algorithm) and `ncclAllReduce` of each size through the .so's
//!    symbols, each result checked exactly and each call checked to have run `launch_c` or not
//!    (its counter). The COLL INFO lines (on unless `MSCCLPP_LOG_LEVEL` is set) show
//!    `allreduce of 4096 bytes runs own_allreduce (mscclppNcclRegisterAlgorithm)`.
//!    The .so carries its own copy of mscclpp: `collectives::register_global` in this program
//!    would not reach its communicators, the C extension does.
//!
//! `cargo build -p mscclpp-nccl && cargo run -p mscclpp --example 10-own-algorithm` (add
//! `--release --features cuda` to both for GPUs; ranks share the GPUs there are, rank r on GPU
//! r % count).

mod common;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::{check, Ctx, Rank, Res, TIMEOUT};
use mscclpp::collectives::algorithm::host_barrier;
use mscclpp::collectives::gpu::GpuCtx;
use mscclpp::collectives::{
    Algorithm, BuildContext, Call, CollectiveKind, Collectives, DataType, RawStream, ReduceOp,
    Resources, SelectContext, Selector,
};
use mscclpp::{DeviceType, GpuBuffer};
use mscclpp_hal::{prelude::*, Gpu, LaunchConfig, StreamInterop};

// `KERNEL_OBJECTS`: (file stem, code object) of every kernel build.rs compiled.
include!(concat!(env!("OUT_DIR"), "/example_kernels.rs"));

/// The largest call the selector gives to `own_allreduce` (it must fit the plain scratch).
const OWN_MAX_BYTES: usize = 256 << 10;
/// Element counts tried: the first two go to `own_allreduce`, the last to the default choice.
const COUNTS: [usize; 3] = [1024, 64 * 1024, 1024 * 1024];

/// The kernel's parameters, in the order of its C signature.
#[repr(C)]
#[derive(Clone, Copy)]
struct KernelArgs {
    input: u64,
    output: u64,
    count: u64,
    peer_bases: u64,
    sems: u64,
    plain_offset: u64,
    rank: i32,
    nranks: i32,
}

/// What the kernel and the host code use of a communicator: the shared buffers' peer-base
/// table, the semaphore table (block 0), where the plain scratch starts, rank and world size.
/// `Resources` gives it to `OwnAllReduce`, the library's `mscclppNcclContext` to `launch_c`.
#[derive(Clone, Copy)]
struct Shared {
    peer_bases: u64,
    sems: u64,
    plain_offset: u64,
    rank: usize,
    nranks: usize,
}

impl Shared {
    fn of(res: &Resources) -> Shared {
        Shared {
            peer_bases: res.peer_bases_ptr(),
            sems: res.sems_ptr(),
            plain_offset: res.layout().plain_offset as u64,
            rank: res.rank(),
            nranks: res.nranks(),
        }
    }

    fn args(&self, send: u64, recv: u64, count: usize) -> KernelArgs {
        KernelArgs {
            input: send,
            output: recv,
            count: count as u64,
            peer_bases: self.peer_bases,
            sems: self.sems,
            plain_offset: self.plain_offset,
            rank: self.rank as i32,
            nranks: self.nranks as i32,
        }
    }

    /// Host backend: rank `r`'s plain scratch, mapped here (the table is host memory there).
    fn scratch(&self, r: usize) -> *mut f32 {
        // SAFETY: the peer-base table holds `nranks` entries.
        let base = unsafe { *(self.peer_bases as usize as *const u64).add(r) };
        (base + self.plain_offset) as usize as *mut f32
    }
}

/// The opened GPU and the loaded code object and kernel.
type Loaded = (
    <Gpu as Api>::Device,
    <Gpu as Api>::Module,
    <Gpu as Api>::Kernel,
);

/// Loads `own_allreduce_f32` on GPU `id`.
fn load_kernel(id: i32) -> mscclpp::Result<Loaded> {
    let code = KERNEL_OBJECTS
        .iter()
        .find(|(stem, _)| *stem == "own_allreduce")
        .map(|(_, c)| *c)
        .ok_or_else(|| mscclpp::Error::invalid("build.rs embedded no own_allreduce code object"))?;
    let dev = Gpu::open_device(id as usize)?;
    let module = Gpu::load_module(&dev, code)?;
    let kernel = Gpu::get_kernel(&module, "own_allreduce_f32")?;
    Ok((dev, module, kernel))
}

/// Enqueues the kernel on `stream` (one block of 512 threads).
///
/// # Safety
/// `stream` is a live stream (or 0) of `dev`; the buffers of `args` hold `count` f32 until the
/// stream ran the kernel; the tables and the scratch are the communicator's.
unsafe fn launch_kernel(
    dev: &<Gpu as Api>::Device,
    kernel: &<Gpu as Api>::Kernel,
    stream: RawStream,
    args: &KernelArgs,
) -> mscclpp::Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe {
        let s = Gpu::borrow_stream(dev, stream);
        Gpu::launch(kernel, &LaunchConfig::linear(1, 512), &s, args)
    }
    .map_err(mscclpp::Error::from)
}

/// Host backend: the kernel's three barriers and two loops, on this thread (`barrier`
/// synchronises block 0 with every peer).
///
/// # Safety
/// `send` and `recv` hold `count` f32; the plain scratch holds at least as many bytes.
unsafe fn host_all_reduce<E>(
    sh: &Shared,
    mut barrier: impl FnMut() -> Result<(), E>,
    send: u64,
    recv: u64,
    count: usize,
) -> Result<(), E> {
    barrier()?;
    // SAFETY: the input holds `count` f32, the own scratch as many; nobody reads it until the
    // next barrier.
    unsafe { std::ptr::copy(send as usize as *const f32, sh.scratch(sh.rank), count) };
    barrier()?;
    for i in 0..count {
        let sum: f32 = (0..sh.nranks)
            // SAFETY: every rank's scratch is mapped here and holds `count` f32 now.
            .map(|r| unsafe { *sh.scratch(r).add(i) })
            .sum();
        // SAFETY: the output holds `count` f32 (inputs were all copied before).
        unsafe { *(recv as usize as *mut f32).add(i) = sum };
    }
    barrier()
}

/// The algorithm: per-communicator state is its loaded kernel (GPU builds) and a call counter.
struct OwnAllReduce {
    kernel: Mutex<Option<Loaded>>,
    calls: Arc<AtomicUsize>,
}

impl Algorithm for OwnAllReduce {
    fn name(&self) -> &'static str {
        "own_allreduce"
    }
    fn kind(&self) -> CollectiveKind {
        CollectiveKind::AllReduce
    }
    fn check(&self, res: &Resources, call: &Call) -> mscclpp::Result<()> {
        if call.dtype != DataType::F32 || call.op != ReduceOp::Sum {
            return Err(mscclpp::Error::invalid(
                "own_allreduce: expected f32 with sum",
            ));
        }
        if call.bytes() > res.layout().plain_bytes {
            return Err(mscclpp::Error::invalid(format!(
                "own_allreduce: expected at most {} bytes (the plain scratch), got {}",
                res.layout().plain_bytes,
                call.bytes()
            )));
        }
        Ok(())
    }

    fn launch_gpu(
        &self,
        res: &Resources,
        gpu: &GpuCtx,
        call: &Call,
        stream: RawStream,
    ) -> mscclpp::Result<()> {
        let kernel = self
            .kernel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(_, _, k)| k.clone())
            .ok_or_else(|| mscclpp::Error::invalid("own_allreduce: no kernel was embedded"))?;
        self.calls.fetch_add(1, Ordering::Relaxed);
        let args = Shared::of(res).args(call.send, call.recv, call.count);
        // SAFETY: the caller's live stream (or 0) of this device; the buffers are the caller's
        // (valid until the stream ran the call), the tables and scratch live in `res`.
        unsafe { launch_kernel(gpu.device(), &kernel, stream, &args) }
    }

    fn run_host(&self, res: &Resources, call: &Call) -> mscclpp::Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the call's buffers hold `count` f32; `check` capped it at the plain scratch.
        unsafe {
            host_all_reduce(
                &Shared::of(res),
                || host_barrier(res, 0),
                call.send,
                call.recv,
                call.count,
            )
        }
    }
}

/// The builder: loads the kernel on the communicator's GPU (GPU builds), counts into `calls`.
fn builder(
    calls: Arc<AtomicUsize>,
) -> impl Fn(&BuildContext<'_>) -> mscclpp::Result<Arc<dyn Algorithm>> + Send + Sync {
    move |ctx: &BuildContext<'_>| {
        let kernel = match ctx.device().kind {
            DeviceType::Cpu => None,
            DeviceType::Gpu => Some(load_kernel(ctx.device().id)?),
        };
        Ok(Arc::new(OwnAllReduce {
            kernel: Mutex::new(kernel),
            calls: calls.clone(),
        }) as Arc<dyn Algorithm>)
    }
}

/// The selector's rule: all-reduces of f32 with sum up to [`OWN_MAX_BYTES`].
fn mine(kind: CollectiveKind, dtype: DataType, op: ReduceOp, bytes: usize) -> bool {
    kind == CollectiveKind::AllReduce
        && dtype == DataType::F32
        && op == ReduceOp::Sum
        && bytes <= OWN_MAX_BYTES
}

/// The selector: `own_allreduce` for the calls of [`mine`], else the default.
fn selector() -> impl Selector {
    |s: &SelectContext<'_>| -> mscclpp::Result<Option<Arc<dyn Algorithm>>> {
        let c = s.call;
        Ok(if mine(c.kind, c.dtype, c.op, c.bytes()) {
            s.find(CollectiveKind::AllReduce, "own_allreduce")
        } else {
            None
        })
    }
}

// The C types of core/nccl/include/mscclpp_nccl_ext.h (version 1), as a C program gets them
// from the header.

/// `ncclFloat`, `ncclSum`, `mscclppNcclAllReduce`, `MSCCLPP_NCCL_ALGORITHM_VERSION`.
const NCCL_FLOAT: c_int = 7;
const NCCL_SUM: c_int = 0;
const EXT_ALL_REDUCE: c_int = 0;
const EXT_VERSION: c_int = 1;

/// The `ncclResult_t` values used here (`NcclResult::X as c_int`).
#[repr(i32)]
enum NcclResult {
    Success = 0,
    InternalError = 3,
    InvalidUsage = 5,
}
const NCCL_SUCCESS: c_int = NcclResult::Success as c_int;

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [u8; 128],
}

/// `mscclppNcclCallInfo`.
#[repr(C)]
struct CallInfo {
    collective: c_int,
    datatype: c_int,
    op: c_int,
    root: c_int,
    nranks: c_int,
    count: usize,
    bytes: usize,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
}

/// `mscclppNcclContext`.
#[repr(C)]
struct NcclContext {
    rank: c_int,
    nranks: c_int,
    device: c_int,
    host_backend: c_int,
    peer_bases: *const u64,
    semaphores: *mut c_void,
    flags: *mut u32,
    nflags: u32,
    max_sem_blocks: u32,
    max_waiting_blocks: u32,
    reserved: u32,
    ll_offset: u64,
    ll_half_bytes: u64,
    plain_offset: u64,
    plain_bytes: u64,
    host_barrier: Option<unsafe extern "C" fn(*const NcclContext, c_int) -> c_int>,
    host_signal: Option<unsafe extern "C" fn(*const NcclContext, c_int, c_int) -> c_int>,
    host_wait: Option<unsafe extern "C" fn(*const NcclContext, c_int, c_int) -> c_int>,
    internal: *const c_void,
}

type SelectFn = unsafe extern "C" fn(*const CallInfo, *mut c_void) -> c_int;
type LaunchFn =
    unsafe extern "C" fn(*const CallInfo, *const NcclContext, *mut c_void, *mut c_void) -> c_int;

/// `mscclppNcclAlgorithm`.
#[repr(C)]
struct AlgorithmDesc {
    size: usize,
    version: c_int,
    collective: c_int,
    name: *const c_char,
    user: *mut c_void,
    select: Option<SelectFn>,
    launch: Option<LaunchFn>,
}

/// The state of the algorithm registered with the NCCL library (the `user` pointer of its
/// callbacks, alive for the process): the call counter and, on GPUs, the loaded kernel.
struct NcclOwn {
    calls: AtomicUsize,
    kernel: Option<Loaded>,
    /// Whether this program runs on the host backend (the library must too).
    host: bool,
}

/// `select`: the selector's rule on the library's description of the call.
unsafe extern "C" fn select_c(call: *const CallInfo, _user: *mut c_void) -> c_int {
    // SAFETY: the library's call info, valid during the callback.
    let c = unsafe { &*call };
    c_int::from(
        c.collective == EXT_ALL_REDUCE
            && c.datatype == NCCL_FLOAT
            && c.op == NCCL_SUM
            && c.bytes <= OWN_MAX_BYTES,
    )
}

/// `launch`: the same kernel (GPU) or host code (host backend) as `OwnAllReduce`, on the
/// resources of the library's communicator. No panic leaves it (it would abort the process).
unsafe extern "C" fn launch_c(
    call: *const CallInfo,
    ctx: *const NcclContext,
    stream: *mut c_void,
    user: *mut c_void,
) -> c_int {
    let run = || {
        // SAFETY: the library's call info and context (valid during the callback) and the
        // registration's user pointer (a leaked `NcclOwn`).
        let (c, x, own) = unsafe { (&*call, &*ctx, &*(user as *const NcclOwn)) };
        own.calls.fetch_add(1, Ordering::Relaxed);
        let sh = Shared {
            peer_bases: x.peer_bases as u64,
            sems: x.semaphores as u64,
            plain_offset: x.plain_offset,
            rank: x.rank as usize,
            nranks: x.nranks as usize,
        };
        let (send, recv) = (c.sendbuff as u64, c.recvbuff as u64);
        if (x.host_backend != 0) != own.host {
            eprintln!("launch_c: libmscclpp_nccl.so and this program run on different backends: build both with the same features");
            return NcclResult::InvalidUsage as c_int;
        }
        if x.host_backend != 0 {
            let Some(barrier) = x.host_barrier else {
                return NcclResult::InvalidUsage as c_int;
            };
            // SAFETY: the helper gets its own context; select capped the size far below the
            // plain scratch; the buffers hold `count` f32.
            let r = unsafe {
                host_all_reduce(
                    &sh,
                    || match barrier(ctx, 0) {
                        NCCL_SUCCESS => Ok(()),
                        e => Err(e),
                    },
                    send,
                    recv,
                    c.count,
                )
            };
            return r.err().unwrap_or(NCCL_SUCCESS);
        }
        let Some((dev, _, kernel)) = &own.kernel else {
            return NcclResult::InvalidUsage as c_int;
        };
        // SAFETY: the caller's stream of this communicator's GPU; its buffers stay valid until
        // the stream ran the call; the tables and the scratch are the communicator's.
        match unsafe { launch_kernel(dev, kernel, stream as u64, &sh.args(send, recv, c.count)) } {
            Ok(()) => NCCL_SUCCESS,
            Err(e) => {
                eprintln!("launch_c: {e}");
                NcclResult::InternalError as c_int
            }
        }
    };
    std::panic::catch_unwind(run).unwrap_or(NcclResult::InternalError as c_int)
}

/// The functions of `libmscclpp_nccl.so` this example calls, looked up once.
struct Nccl {
    register: unsafe extern "C" fn(*const AlgorithmDesc) -> c_int,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut *mut c_void, c_int, UniqueId, c_int) -> c_int,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        *mut c_void,
        *mut c_void,
    ) -> c_int,
    comm_destroy: unsafe extern "C" fn(*mut c_void) -> c_int,
    last_error: unsafe extern "C" fn(*mut c_void) -> *const c_char,
}

impl Nccl {
    /// Opens the library: `MSCCLPP_NCCL_SO`, else `libmscclpp_nccl.so` of this binary's
    /// profile folder (`target/<profile>/examples/..`). It stays loaded for the process (the
    /// registered callbacks live as long).
    fn open() -> Res<Nccl> {
        let path = match std::env::var_os("MSCCLPP_NCCL_SO") {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()
                .ctx("finding this program")?
                .parent()
                .and_then(|examples| examples.parent())
                .ok_or("finding target/<profile>/")?
                .join("libmscclpp_nccl.so"),
        };
        if !path.exists() {
            return Err(format!(
                "{} does not exist: build it (`cargo build -p mscclpp-nccl` with this example's \
                 profile and features) or set MSCCLPP_NCCL_SO",
                path.display()
            ));
        }
        // SAFETY: our own library; its initialisers have no preconditions.
        let lib = unsafe { libloading::Library::new(&path) }.ctx(&path.display().to_string())?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the declarations of nccl.h / mscclpp_nccl_ext.h for this name.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.ctx($name)?
            };
        }
        Ok(Nccl {
            register: sym!("mscclppNcclRegisterAlgorithm"),
            get_unique_id: sym!("ncclGetUniqueId"),
            comm_init_rank: sym!("ncclCommInitRank"),
            all_reduce: sym!("ncclAllReduce"),
            comm_destroy: sym!("ncclCommDestroy"),
            last_error: sym!("ncclGetLastError"),
        })
    }

    /// `Ok` for `ncclSuccess`, else the code and `ncclGetLastError`'s message.
    fn ok(&self, r: c_int, what: &str) -> Res {
        if r == NCCL_SUCCESS {
            return Ok(());
        }
        // SAFETY: a C string of the library, valid until this thread's next call.
        let msg = unsafe { CStr::from_ptr((self.last_error)(std::ptr::null_mut())) };
        Err(format!("{what}: ncclResult {r}: {}", msg.to_string_lossy()))
    }
}

fn value(r: usize, i: usize) -> f32 {
    ((r * 31 + i) % 1000) as f32
}

/// Fills `send` with this rank's values; after the call, checks `recv` holds the sums.
fn fill(send: &GpuBuffer<f32>, rank: usize, count: usize) -> Res {
    let mine: Vec<f32> = (0..count).map(|i| value(rank, i)).collect();
    send.copy_from_host(0, &mine).ctx("filling")
}

fn verify(what: &str, recv: &GpuBuffer<f32>, nranks: usize, count: usize) -> Res {
    let want: Vec<f32> = (0..count)
        .map(|i| (0..nranks).map(|r| value(r, i)).sum())
        .collect();
    check(what, &recv.to_vec().ctx("reading")?, &want)
}

fn body(me: &Rank) -> Res {
    let (rank, n) = (me.rank, me.nranks);

    // 1-2: per communicator, through `Collectives`.
    let direct_calls = Arc::new(AtomicUsize::new(0));
    let coll = Collectives::builder(me.comm.clone())
        .without_plans()
        .add_algorithm(builder(direct_calls.clone()))
        .selector(selector())
        .build()
        .ctx("setting up the collectives")?;
    let device = coll.resources().device();
    let stream = match device.kind {
        DeviceType::Gpu => {
            let dev = Gpu::open_device(device.id as usize).ctx("opening the GPU")?;
            Gpu::set_current(&dev).ctx("making the GPU current")?;
            Some(Gpu::create_stream(&dev).ctx("creating a stream")?)
        }
        DeviceType::Cpu => None,
    };
    let raw = stream.as_ref().map_or(0, Gpu::raw_stream);
    let sync = || match &stream {
        Some(s) => Gpu::stream_synchronize(s, TIMEOUT).ctx("waiting for the stream"),
        None => Ok(()),
    };
    let mut own_runs = 0;
    for count in COUNTS {
        let send = GpuBuffer::<f32>::new(device, count).ctx("allocating")?;
        let recv = GpuBuffer::<f32>::new(device, count).ctx("allocating")?;
        fill(&send, rank, count)?;
        let call = Call {
            kind: CollectiveKind::AllReduce,
            send: send.data(),
            recv: recv.data(),
            count,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            root: 0,
        };
        let choice = coll.choose(&call).ctx("choosing")?;
        let expect_own = mine(call.kind, call.dtype, call.op, call.bytes());
        if (choice.name() == "own_allreduce") != expect_own {
            return Err(format!("{count} f32: the selector chose {}", choice.name()));
        }
        own_runs += usize::from(expect_own);
        // SAFETY: both buffers hold `count` f32 and live until the stream is synchronized.
        unsafe { coll.run_choice(&choice, raw) }.ctx(&format!("all-reduce of {count} f32"))?;
        sync()?;
        verify(&format!("Collectives, {count} f32"), &recv, n, count)?;
        if rank == 0 {
            println!(
                "Collectives: all-reduce of {count} f32 ran {}: correct",
                choice.name()
            );
        }
    }
    if direct_calls.load(Ordering::Relaxed) != own_runs {
        return Err(format!(
            "own_allreduce ran {} times, expected {own_runs}",
            direct_calls.load(Ordering::Relaxed)
        ));
    }

    // 3: registered with libmscclpp_nccl.so through its C extension, then its ncclAllReduce.
    let nccl = Nccl::open()?;
    let own: &'static NcclOwn = Box::leak(Box::new(NcclOwn {
        calls: AtomicUsize::new(0),
        kernel: match device.kind {
            DeviceType::Gpu => Some(load_kernel(device.id).ctx("loading the kernel")?),
            DeviceType::Cpu => None,
        },
        host: device.kind == DeviceType::Cpu,
    }));
    let desc = AlgorithmDesc {
        size: std::mem::size_of::<AlgorithmDesc>(),
        version: EXT_VERSION,
        collective: EXT_ALL_REDUCE,
        name: c"own_allreduce".as_ptr(),
        user: own as *const NcclOwn as *mut c_void,
        select: Some(select_c),
        launch: Some(launch_c),
    };
    // SAFETY: a valid descriptor; the callbacks and `own` live for the process.
    let r = unsafe { (nccl.register)(&desc) };
    nccl.ok(r, "mscclppNcclRegisterAlgorithm")?;
    nccl_all_reduce(me, &nccl, own, device, raw, &sync)?;
    me.comm.bootstrap().barrier().ctx("barrier")?;
    Ok(())
}

/// `ncclAllReduce` of every size on a communicator of the NCCL library (created after the
/// registration), each checked, each run of `own_allreduce` seen in its launch counter.
fn nccl_all_reduce(
    me: &Rank,
    nccl: &Nccl,
    own: &NcclOwn,
    device: mscclpp::Device,
    raw: RawStream,
    sync: &dyn Fn() -> Res,
) -> Res {
    // Rank 0's unique id, handed to every rank over the example's bootstrap.
    let mut id = UniqueId { internal: [0; 128] };
    if me.rank == 0 {
        // SAFETY: a valid pointer to a local.
        nccl.ok(unsafe { (nccl.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
    }
    let all = me
        .comm
        .bootstrap()
        .all_gather(&id.internal)
        .ctx("sharing the id")?;
    id.internal.copy_from_slice(&all[0]);
    let mut comm = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the id came from rank 0.
    let r = unsafe { (nccl.comm_init_rank)(&mut comm, me.nranks as c_int, id, me.rank as c_int) };
    nccl.ok(r, "ncclCommInitRank")?;
    for count in COUNTS {
        let send = GpuBuffer::<f32>::new(device, count).ctx("allocating")?;
        let recv = GpuBuffer::<f32>::new(device, count).ctx("allocating")?;
        fill(&send, me.rank, count)?;
        let before = own.calls.load(Ordering::Relaxed);
        // SAFETY: both buffers hold `count` f32 and live until the stream is synchronized;
        // `comm` is live.
        let r = unsafe {
            (nccl.all_reduce)(
                send.data() as *const c_void,
                recv.data() as *mut c_void,
                count,
                NCCL_FLOAT,
                NCCL_SUM,
                comm,
                raw as usize as *mut c_void,
            )
        };
        nccl.ok(r, "ncclAllReduce")?;
        sync()?;
        verify(
            &format!("ncclAllReduce, {count} f32"),
            &recv,
            me.nranks,
            count,
        )?;
        let ran_own = own.calls.load(Ordering::Relaxed) - before == 1;
        let expect_own = mine(
            CollectiveKind::AllReduce,
            DataType::F32,
            ReduceOp::Sum,
            count * 4,
        );
        if ran_own != expect_own {
            return Err(format!(
                "ncclAllReduce of {count} f32: own_allreduce's launch callback ran {} times, \
                 expected {}",
                own.calls.load(Ordering::Relaxed) - before,
                usize::from(expect_own)
            ));
        }
        if me.rank == 0 {
            println!(
                "libmscclpp_nccl.so: ncclAllReduce of {count} f32 ran {}: correct",
                if ran_own {
                    "own_allreduce (launch_c)"
                } else {
                    "the library's own choice"
                }
            );
        }
    }
    // SAFETY: the live communicator, no call in flight.
    nccl.ok(unsafe { (nccl.comm_destroy)(comm) }, "ncclCommDestroy")
}

fn main() {
    // The COLL INFO lines name the algorithm of each collective (this program's copy of
    // mscclpp and the library's); set before any thread starts, inherited by the ranks.
    if std::env::var_os("MSCCLPP_LOG_LEVEL").is_none() {
        std::env::set_var("MSCCLPP_LOG_LEVEL", "INFO");
        std::env::set_var("MSCCLPP_LOG_SUBSYS", "COLL");
    }
    common::run("10-own-algorithm", 2, 22010, body)
}
