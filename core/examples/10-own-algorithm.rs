//! 10: an all-reduce algorithm of one's own, with one's own selector, run through
//! `mscclpp::collectives` and through the NCCL library's `ncclAllReduce`.
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
//! 3. Process-wide: `register_global(builder)` and `set_global_selector(selector)` before
//!    `ncclCommInitRank`, so the communicator the NCCL library creates has the algorithm and
//!    the selector too; `ncclAllReduce` then runs it (its call counter proves it) and is checked.
//!    The NCCL library here is the `mscclpp-nccl` crate linked as a Rust library (a
//!    dev-dependency of this crate): `libmscclpp_nccl.so` carries its own copy of mscclpp, so
//!    a registration in a program reaches it only this way (or from code inside that copy).
//!
//! `cargo run -p mscclpp --example 10-own-algorithm` (add `--release --features cuda` for GPUs;
//! ranks share the GPUs there are, rank r on GPU r % count).

mod common;

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::{check, Ctx, Rank, Res, TIMEOUT};
use mscclpp::collectives::algorithm::host_barrier;
use mscclpp::collectives::gpu::GpuCtx;
use mscclpp::collectives::{
    register_global, set_global_selector, Algorithm, BuildContext, Call, CollectiveKind,
    Collectives, DataType, RawStream, ReduceOp, Resources, SelectContext, Selector,
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

/// The loaded code object and its kernel.
type Loaded = (<Gpu as Api>::Module, <Gpu as Api>::Kernel);

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
            .map(|(_, k)| k.clone())
            .ok_or_else(|| mscclpp::Error::invalid("own_allreduce: no kernel was embedded"))?;
        self.calls.fetch_add(1, Ordering::Relaxed);
        let args = KernelArgs {
            input: call.send,
            output: call.recv,
            count: call.count as u64,
            peer_bases: res.peer_bases_ptr(),
            sems: res.sems_ptr(),
            plain_offset: res.layout().plain_offset as u64,
            rank: res.rank() as i32,
            nranks: res.nranks() as i32,
        };
        // SAFETY: the caller's live stream (or 0) of this device.
        let s = unsafe { Gpu::borrow_stream(gpu.device(), stream) };
        // SAFETY: KernelArgs matches the kernel's parameters; the buffers are the caller's
        // (valid until the stream ran the call), the tables and scratch live in `res`.
        unsafe { Gpu::launch(&kernel, &LaunchConfig::linear(1, 512), &s, &args) }
            .map_err(mscclpp::Error::from)
    }

    fn run_host(&self, res: &Resources, call: &Call) -> mscclpp::Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let scratch = |r: usize| (res.peer_bases()[r] + res.layout().plain_offset as u64) as usize;
        // The kernel's three barriers and two loops, on this thread (block 0's semaphores).
        host_barrier(res, 0)?;
        // SAFETY: the input holds `count` f32; the own plain scratch holds at least as many
        // bytes (check); nobody reads it until the next barrier.
        unsafe {
            std::ptr::copy(
                call.send as usize as *const f32,
                scratch(res.rank()) as *mut f32,
                call.count,
            )
        };
        host_barrier(res, 0)?;
        for i in 0..call.count {
            let sum: f32 = (0..res.nranks())
                // SAFETY: every rank's scratch is mapped here and holds `count` f32 now.
                .map(|r| unsafe { *(scratch(r) as *const f32).add(i) })
                .sum();
            // SAFETY: the output holds `count` f32 (inputs were all copied before).
            unsafe { *(call.recv as usize as *mut f32).add(i) = sum };
        }
        host_barrier(res, 0)
    }
}

/// The builder: loads the kernel on the communicator's GPU (GPU builds), counts into `calls`.
fn builder(
    calls: Arc<AtomicUsize>,
) -> impl Fn(&BuildContext<'_>) -> mscclpp::Result<Arc<dyn Algorithm>> + Send + Sync {
    move |ctx: &BuildContext<'_>| {
        let kernel = match ctx.device().kind {
            DeviceType::Cpu => None,
            DeviceType::Gpu => {
                let code = KERNEL_OBJECTS
                    .iter()
                    .find(|(stem, _)| *stem == "own_allreduce")
                    .map(|(_, c)| *c)
                    .ok_or_else(|| {
                        mscclpp::Error::invalid("build.rs embedded no own_allreduce code object")
                    })?;
                let dev = Gpu::open_device(ctx.device().id as usize)?;
                let module = Gpu::load_module(&dev, code)?;
                let kernel = Gpu::get_kernel(&module, "own_allreduce_f32")?;
                Some((module, kernel))
            }
        };
        Ok(Arc::new(OwnAllReduce {
            kernel: Mutex::new(kernel),
            calls: calls.clone(),
        }) as Arc<dyn Algorithm>)
    }
}

/// The selector: `own_allreduce` for f32 sums up to [`OWN_MAX_BYTES`], else the default.
fn selector() -> impl Selector {
    |s: &SelectContext<'_>| -> mscclpp::Result<Option<Arc<dyn Algorithm>>> {
        let c = s.call;
        let mine = c.kind == CollectiveKind::AllReduce
            && c.dtype == DataType::F32
            && c.op == ReduceOp::Sum
            && c.bytes() <= OWN_MAX_BYTES;
        Ok(if mine {
            s.find(CollectiveKind::AllReduce, "own_allreduce")
        } else {
            None
        })
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
        let expect_own = count * 4 <= OWN_MAX_BYTES;
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

    // 3: process-wide, then through the NCCL library.
    let nccl_calls = Arc::new(AtomicUsize::new(0));
    register_global(builder(nccl_calls.clone()));
    set_global_selector(Some(Arc::new(selector())));
    let nccl = nccl_all_reduce(me, device, raw, &sync)?;
    if nccl_calls.load(Ordering::Relaxed) != nccl {
        return Err(format!(
            "ncclAllReduce ran own_allreduce {} times, expected {nccl}",
            nccl_calls.load(Ordering::Relaxed)
        ));
    }
    me.comm.bootstrap().barrier().ctx("barrier")?;
    Ok(())
}

/// `ncclAllReduce` of every size on a communicator of the NCCL library; returns how many calls
/// the selector gives to `own_allreduce`.
fn nccl_all_reduce(
    me: &Rank,
    device: mscclpp::Device,
    raw: RawStream,
    sync: &dyn Fn() -> Res,
) -> Res<usize> {
    use mscclpp_nccl::abi::{NcclUniqueId, SUCCESS};
    use mscclpp_nccl::exports::{ncclCommDestroy, ncclCommInitRank, ncclGetUniqueId};
    use mscclpp_nccl::exports_ops::ncclAllReduce;
    let nccl_ok = |r: c_int, what: &str| -> Res {
        if r == SUCCESS {
            Ok(())
        } else {
            Err(format!("{what}: ncclResult {r}"))
        }
    };
    // Rank 0's unique id, handed to every rank over the example's bootstrap.
    let mut id = NcclUniqueId {
        internal: [0; mscclpp_nccl::abi::UNIQUE_ID_BYTES],
    };
    if me.rank == 0 {
        // SAFETY: a valid pointer to a local.
        nccl_ok(unsafe { ncclGetUniqueId(&mut id) }, "ncclGetUniqueId")?;
    }
    let mine: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
    let all = me
        .comm
        .bootstrap()
        .all_gather(&mine)
        .ctx("sharing the id")?;
    for (d, s) in id.internal.iter_mut().zip(&all[0]) {
        *d = *s as _;
    }
    let mut comm = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the id came from rank 0.
    let r = unsafe { ncclCommInitRank(&mut comm, me.nranks as c_int, id, me.rank as c_int) };
    nccl_ok(r, "ncclCommInitRank")?;
    let mut own = 0;
    for count in COUNTS {
        let send = GpuBuffer::<f32>::new(device, count).ctx("allocating")?;
        let recv = GpuBuffer::<f32>::new(device, count).ctx("allocating")?;
        fill(&send, me.rank, count)?;
        // SAFETY: both buffers hold `count` f32 (ncclFloat = 7, ncclSum = 0) and live until
        // the stream is synchronized; `comm` is live.
        let r = unsafe {
            ncclAllReduce(
                send.data() as *const c_void,
                recv.data() as *mut c_void,
                count,
                7,
                0,
                comm,
                raw as usize as *mut _,
            )
        };
        nccl_ok(r, "ncclAllReduce")?;
        sync()?;
        verify(
            &format!("ncclAllReduce, {count} f32"),
            &recv,
            me.nranks,
            count,
        )?;
        own += usize::from(count * 4 <= OWN_MAX_BYTES);
        if me.rank == 0 {
            println!("ncclAllReduce of {count} f32: correct");
        }
    }
    // SAFETY: the live communicator, no call in flight.
    nccl_ok(unsafe { ncclCommDestroy(comm) }, "ncclCommDestroy")?;
    Ok(own)
}

fn main() {
    common::run("10-own-algorithm", 2, 22010, body)
}
