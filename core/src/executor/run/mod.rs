//! [`Executor`]: runs [`ExecutionPlan`]s on a communicator's buffers. Resources are set up
//! on the first execution of a (plan, send, recv) and cached (`context`) for every message
//! size: the buffers are registered to the end of their allocations and scratch grows in
//! powers of two (at least 1 MiB; a call needing more sets the context up again, on every
//! rank alike since every rank computes the largest need of all ranks). The lowered op lists
//! are cached per message size. Buffers may be this library's memory or the application's
//! own when the backend can adopt it (`cudaMalloc`, cuMem with a shareable handle, a host
//! memfd mapping). GPU buffers run one kernel launch on the caller's
//! stream (`gpu`); host buffers (the host backend) run on CPU threads and are complete when
//! `execute` returns (`host`). `config` holds the settings both read.

pub(crate) mod config;
mod context;
mod gpu;
mod host;
mod jit;
pub(crate) mod trace;

use std::collections::hash_map::Entry as Slot;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::collectives::gpu::GpuCtx;
use crate::collectives::{DataType, RawStream};
use crate::communicator::Communicator;
use crate::env::LaneSync;
use crate::error::{Error, Result};
use crate::executor::json::Protocol;
use crate::executor::lower::device::{ExecArgs, ExecBlock, TRACE_WORDS};
use crate::executor::lower::layout::Layout;
use crate::executor::lower::lower;
use crate::executor::model;
use crate::executor::plan::ExecutionPlan;
use crate::gpu_buffer::GpuBuffer;
use crate::memory::Allocation;
use crate::transport::{Device, DeviceType};
use config::{ExecutorConfig, PacketType, PortChannels};
use context::{Buffers, ExecContext};
use host::HostLaunch;
use trace::PlanTrace;

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    plan: u64,
    name: String,
    send: u64,
    recv: u64,
    sizes: Option<(u64, u64)>,
}

impl Key {
    /// The context key of `call` with `plan`. Contexts stay per size where a size change may
    /// move one rank's buffer but not another's (every rank must set a context up alike): in
    /// in-place plans of other collectives than all-reduce (all-gather, reduce-scatter: each
    /// rank's part sits at an offset that grows with the size, except rank 0's); and for
    /// switch channels, which bind the message sizes.
    fn new(plan: &ExecutionPlan, call: Buffers) -> Key {
        let sized =
            (plan.is_in_place() && plan.collective() != "allreduce") || plan.uses_switch_channels();
        Key {
            plan: plan.id(),
            name: plan.name().to_string(),
            send: call.send,
            recv: call.recv,
            sizes: sized.then_some((call.send_size as u64, call.recv_size as u64)),
        }
    }
}

struct Lowered {
    blocks: Vec<Box<ExecBlock>>,
    /// GPU copy of `blocks` (GPU contexts only).
    on_device: Option<GpuBuffer<ExecBlock>>,
    reuse_chunk: u64,
    /// Whether launches may take the async lane sync (`MSCCLPP_EXECUTOR_LANE_SYNC=async`):
    /// every memory channel the blocks wait on has a semaphore of its own ([`own_semaphores`]).
    lane_async: bool,
    /// Trace counters of this size's launches while tracing ([`Executor::set_trace`]), and the
    /// lanes of the last traced launch.
    trace: Option<GpuBuffer<u64>>,
    traced_lanes: AtomicU32,
    /// The compiled plan kernel of each (data type code, packet code, thread bound, lane sync
    /// code) this size ran with, and this size's values (jit.rs); `None`: it runs on the
    /// interpreter.
    jit: HashMap<(u32, u32, u32, u32), Option<jit::JitLaunch>>,
}

struct Entry {
    ctx: ExecContext,
    lowered: HashMap<(u64, u64), Lowered>,
}

/// The cached contexts, and the last GPU launch made from one of them.
#[derive(Default)]
struct Entries {
    map: HashMap<Key, Entry>,
    /// Repeated eager calls (the same plan, buffers, sizes, type and stream: a training loop)
    /// launch this again after checking only that the buffers are still the allocations the
    /// context was set up on. Made by the full path after each GPU launch; cleared with the
    /// contexts (its pointers are theirs).
    last: Option<LastLaunch>,
}

/// What a call is, for [`LastLaunch`].
#[derive(Clone, Copy, PartialEq, Eq)]
struct CallId {
    /// The loaded plan (`Arc` address) and its text's hash.
    plan: (usize, u64),
    rank: usize,
    call: Buffers,
    dtype: DataType,
    packet: PacketType,
    stream: RawStream,
}

impl CallId {
    fn new(
        plan: &ExecutionPlan,
        rank: usize,
        call: Buffers,
        dtype: DataType,
        packet: PacketType,
        stream: RawStream,
    ) -> CallId {
        CallId {
            plan: (Arc::as_ptr(&plan.inner) as usize, plan.id()),
            rank,
            call,
            dtype,
            packet,
            stream,
        }
    }
}

/// A GPU launch ready to be made again ([`Entries::last`]).
struct LastLaunch {
    id: CallId,
    /// The allocations of send and recv when it was made.
    allocs: [Arc<Allocation>; 2],
    gpu: Arc<GpuCtx>,
    kernel: Prepared,
    grid: u32,
    threads: u32,
}

/// The kernel of a [`LastLaunch`] with its parameter.
enum Prepared {
    /// A compiled plan and its parameter bytes (jit::params).
    Jit(<mscclpp_hal::Gpu as mscclpp_hal::Api>::Kernel, Vec<u8>),
    /// The interpreter.
    Interpreter(crate::kernels::Kernel, ExecArgs),
}

impl LastLaunch {
    /// Whether `id`'s buffers still lie in the allocations this launch was made for (an
    /// application may free a buffer and allocate another at the same address).
    fn still_holds(&self, id: &CallId) -> bool {
        let same = |ptr: u64, size: usize, a: &Arc<Allocation>| {
            find_or_adopt(ptr, size).is_ok_and(|(b, _)| Arc::ptr_eq(a, &b))
        };
        same(id.call.send, id.call.send_size, &self.allocs[0])
            && same(id.call.recv, id.call.recv_size, &self.allocs[1])
    }

    /// Makes the launch on `stream`.
    ///
    /// # Safety
    /// The context it was made from is alive, and so are the caller's buffers.
    unsafe fn launch(&self, stream: RawStream) -> Result<()> {
        match &self.kernel {
            // SAFETY: forwarded from the caller; the parameter is the one the full path made.
            Prepared::Jit(kernel, params) => unsafe {
                self.gpu
                    .launch_loaded(kernel, self.grid, self.threads, params, stream)
            },
            // SAFETY: as above.
            Prepared::Interpreter(kernel, args) => unsafe {
                self.gpu
                    .launch(*kernel, self.grid, self.threads, args, stream)
            },
        }
    }
}

/// Runs execution plans (upstream MSCCL++'s `Executor`).
pub struct Executor {
    comm: Arc<Communicator>,
    cfg: ExecutorConfig,
    entries: Mutex<Entries>,
    gpus: Mutex<HashMap<i32, GpuState>>,
    /// Per (send, recv): whether every rank agreed to run plans on them (the collectives'
    /// plan choice), with the allocations this rank adopted for them (kept alive).
    agreed: Mutex<HashMap<(u64, u64), Agreement>>,
    /// Whether launches count their time per op ([`Executor::set_trace`]).
    tracing: AtomicBool,
    /// GPU launches made by repeating the last one ([`Executor::repeated_launches`]).
    repeated: AtomicU64,
    /// Per (plan id, rank it was loaded for): the form the plan runs in here when it is not the
    /// loaded one (its port channels as memory channels, [`Executor::runs_as`]); `None`: as
    /// loaded.
    forms: Mutex<HashMap<(u64, usize), Option<ExecutionPlan>>>,
}

/// Whether every rank agreed to run plans on a (send, recv) pair, and the allocations this
/// rank adopted for it (kept alive).
type Agreement = (bool, Vec<Arc<Allocation>>);

/// A GPU's launch context and SM count.
#[derive(Clone)]
struct GpuState {
    ctx: Arc<GpuCtx>,
    sms: u32,
    /// Compute capability (what plans are compiled for).
    arch: (u32, u32),
    /// The plans compiled for this GPU (jit.rs).
    jit: Arc<jit::JitCache>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor").finish_non_exhaustive()
    }
}

fn err(plan: &ExecutionPlan, what: impl std::fmt::Display) -> Error {
    Error::Executor(format!(
        "plan `{}` ({}): {what}",
        plan.name(),
        plan.source()
    ))
}

impl Executor {
    /// An executor on `comm` with the default settings.
    pub fn new(comm: Arc<Communicator>) -> Result<Executor> {
        Self::with_config(comm, ExecutorConfig::default())
    }

    /// An executor with `cfg`.
    pub fn with_config(comm: Arc<Communicator>, cfg: ExecutorConfig) -> Result<Executor> {
        if cfg.host_threads_per_block == 0 || cfg.host_threads_per_block > 64 {
            return Err(Error::invalid(format!(
                "ExecutorConfig::host_threads_per_block: expected 1..=64, got {}",
                cfg.host_threads_per_block
            )));
        }
        Ok(Executor {
            comm,
            cfg,
            entries: Mutex::new(Entries::default()),
            gpus: Mutex::new(HashMap::new()),
            agreed: Mutex::new(HashMap::new()),
            tracing: AtomicBool::new(false),
            repeated: AtomicU64::new(0),
            forms: Mutex::new(HashMap::new()),
        })
    }

    /// Starts (`true`) or stops counting where each execution's time goes, op by op, per
    /// thread block (see [`PlanTrace`]): on, every later launch adds to counters kept per
    /// (plan, buffers, message size) until [`Executor::take_trace`] reads them. A launch whose
    /// counters do not exist yet while its stream is being captured is not counted (they are
    /// made with a synchronous memset). Off by default; on, a GPU launch costs each op of
    /// thread 0 two reads of the SM's clock and two adds to device memory.
    pub fn set_trace(&self, on: bool) {
        self.tracing.store(on, Ordering::Relaxed);
    }

    /// Whether tracing is on ([`Executor::set_trace`]).
    pub fn tracing(&self) -> bool {
        self.tracing.load(Ordering::Relaxed)
    }

    /// The counters of every (plan, buffers, message size) traced since the last call, which
    /// it zeroes (later launches count afresh; sizes with nothing counted are left out). Call
    /// it once the traced executions finished (their streams synchronized) and with nothing
    /// being captured: the counters are read and zeroed with plain copies. They stay where they
    /// are until [`Executor::reset`], so a graph captured while tracing keeps counting on
    /// replay.
    pub fn take_trace(&self) -> Result<Vec<PlanTrace>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for (key, e) in entries.map.iter() {
            for (sizes, low) in e.lowered.iter() {
                let Some(buf) = &low.trace else { continue };
                let lanes = low.traced_lanes.load(Ordering::Relaxed);
                let t = trace::read(&key.name, *sizes, &low.blocks, lanes, buf)?;
                buf.copy_from_host(0, &vec![0u64; buf.len()])?;
                if !t.blocks.is_empty() {
                    out.push(t);
                }
            }
        }
        out.sort_by(|a, b| {
            (&a.plan, a.send_size, a.recv_size).cmp(&(&b.plan, b.send_size, b.recv_size))
        });
        Ok(out)
    }

    /// The CUDA source of the kernel a GPU execution of `plan` (this rank's part) compiles at
    /// load time for a call of `send_size`/`recv_size` bytes of `dtype` with `packet` packets
    /// launched with `threads` threads per GPU block (`MSCCLPP_EXECUTOR_JIT`; docs/executor.md
    /// "Plans compiled at load time"; the GPU path picks the threads per size, at most the
    /// plan's `num_threads_per_block`, and compiles launches of up to
    /// `MSCCLPP_EXECUTOR_JIT_THREADS`, default 1024; `threads` above that: an error, those
    /// launches run on the interpreter). One source
    /// serves every size whose lowered ops have the same structure (the offsets and sizes are
    /// values of the launch). Needs no GPU: for reading what a plan becomes, and for
    /// [`Executor::compile_kernel_source`].
    pub fn kernel_source(
        plan: &ExecutionPlan,
        send_size: usize,
        recv_size: usize,
        dtype: DataType,
        packet: PacketType,
        threads: u32,
    ) -> Result<String> {
        let max = crate::env::env().executor_jit_threads();
        let bound = gpu::jit_bound(threads, max).ok_or_else(|| {
            err(
                plan,
                format!(
                    "launches of {threads} threads per block run on the interpreter: only launches \
                     of up to {max} threads are compiled (MSCCLPP_EXECUTOR_JIT_THREADS)"
                ),
            )
        })?;
        let rp = plan.rank_plan();
        let layout = Layout::new(plan.meta(), rp, send_size as u64, recv_size as u64)
            .map_err(|e| err(plan, e))?;
        // The source holds table indexes, never table contents: empty handles of the plan's
        // table sizes lower alike.
        let len = |f: &dyn Fn(&model::Block) -> &Vec<usize>| {
            rp.blocks
                .iter()
                .flat_map(|b| f(b).iter().copied())
                .max()
                .map_or(0, |m| m + 1)
        };
        let proto = ExecBlock::zeroed();
        // Each memory channel has a semaphore of its own (as in a context), told apart by the
        // address of its expected count: the lane sync the launch takes depends on it.
        let memory_channels: Vec<_> = (0..len(&|b| &b.memory_channels))
            .map(|i| {
                let mut c = proto.memory_channels[0];
                c.semaphore.expected_inbound_token = (8 * (i + 1)) as *mut u64;
                c
            })
            .collect();
        let port_channels = vec![proto.port_channels[0]; len(&|b| &b.port_channels)];
        let nbuf = len(&|b| &b.memory_buffers).max(len(&|b| &b.port_buffers));
        let memory_buffers = vec![0u64; nbuf];
        let port_buffers = vec![0u32; nbuf];
        let halves = vec![0u32; nbuf];
        let tables = crate::executor::lower::Tables {
            memory_channels: &memory_channels,
            port_channels: &port_channels,
            memory_buffers: &memory_buffers,
            port_buffers: &port_buffers,
            halves: &halves,
        };
        let mut blocks = lower(rp, &layout, &tables).map_err(|e| err(plan, e))?;
        keep_split_nops(&mut blocks);
        let lane_sync = lane_sync_code(own_semaphores(&blocks));
        jit::generate(&blocks, dtype, packet == PacketType::LL8, bound, lane_sync)
            .map(|g| g.source)
            .map_err(|why| err(plan, why))
    }

    /// Compiles a source of [`Executor::kernel_source`] for GPUs of compute capability `arch`
    /// (major, minor) into a code object, with the run-time compiler of this build's GPU
    /// backend (CUDA: libnvrtc, see docs/executor.md); needs no GPU. Other backends, or no
    /// libnvrtc: an error saying so.
    pub fn compile_kernel_source(source: &str, arch: (u32, u32)) -> Result<Vec<u8>> {
        jit::compile(arch, source).map_err(|e| crate::memory::hal_err("compile a plan kernel", e))
    }

    /// How many GPU executions so far repeated the launch of the one before (same plan,
    /// buffers, sizes, data type, packet type and stream, the buffers still the allocations it
    /// was set up on, not traced): those skip the checks, lookups and launch shape of the
    /// first (about 1 us of host time per eager call on an H100, docs/perf.md, round 17).
    /// A diagnostic, like [`Executor::cached_contexts`].
    pub fn repeated_launches(&self) -> u64 {
        self.repeated.load(Ordering::Relaxed)
    }

    /// Drops every cached context (connections, channels, scratch). Collective: every rank
    /// resets together, with nothing in flight.
    pub fn reset(&self) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.last = None;
        entries.map.clear();
    }

    /// What the ranks agreed about running plans on (`send`, `recv`), if they did
    /// (`crate::collectives::plan::agree_on_buffers`).
    pub(crate) fn buffers_agreed(&self, send: u64, recv: u64) -> Option<bool> {
        self.agreed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(send, recv))
            .map(|e| e.0)
    }

    /// Records the ranks' agreement about (`send`, `recv`), keeping `adopted` alive.
    pub(crate) fn set_buffers_agreed(
        &self,
        send: u64,
        recv: u64,
        ok: bool,
        adopted: Option<Vec<Arc<Allocation>>>,
    ) {
        self.agreed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((send, recv), (ok, adopted.unwrap_or_default()));
    }

    /// The allocations holding `send..+send_size` and `recv..+recv_size` here (this library's,
    /// or the application's adopted through the backend), or why not.
    pub(crate) fn adopt_buffers(
        &self,
        send: u64,
        send_size: usize,
        recv: u64,
        recv_size: usize,
    ) -> Result<Vec<Arc<Allocation>>> {
        let (s, _) = find_or_adopt(send, send_size)?;
        let (r, _) = find_or_adopt(recv, recv_size)?;
        if s.device() != r.device() {
            return Err(Error::invalid(format!(
                "send buffer {send:#x} on {:?} but recv buffer {recv:#x} on {:?}",
                s.device(),
                r.device()
            )));
        }
        Ok(vec![s, r])
    }

    /// The form `plan` runs in on this executor: with its port channels as memory channels
    /// when every rank of it is on this node and [`ExecutorConfig::port_channels`] is
    /// [`PortChannels::Auto`] (core/src/executor/ports.rs, which also says which plans keep the
    /// proxy); else as loaded. Every rank decides alike: from the whole plan, the node size and
    /// the setting.
    pub fn runs_as(&self, plan: &ExecutionPlan) -> ExecutionPlan {
        if self.cfg.port_channels == PortChannels::Proxy || !plan.uses_port_channels() {
            return plan.clone();
        }
        let mut forms = self.forms.lock().unwrap_or_else(|p| p.into_inner());
        let form = forms.entry((plan.id(), plan.rank())).or_insert_with(|| {
            let per_node = self.comm.bootstrap().nranks_per_node().max(1);
            let why = if plan.world_size() > per_node {
                format!("its {} ranks span nodes of {per_node}", plan.world_size())
            } else {
                match plan.ports_over_memory() {
                    Ok(p) => return Some(p),
                    Err(why) => why,
                }
            };
            log::info!(
                "executor: plan `{}` keeps its port channels on the proxy: {why}",
                plan.name()
            );
            None
        });
        form.clone().unwrap_or_else(|| plan.clone())
    }

    /// Contexts set up so far (one per plan and buffers).
    pub fn cached_contexts(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .len()
    }

    /// Runs `plan` on `send` (`send_size` bytes) and `recv` (`recv_size` bytes) of `dtype`.
    ///
    /// Collective: every rank of the plan calls it with its part. The first call for a
    /// (plan, buffers) pair sets up connections and memories with the peers. GPU buffers: one
    /// kernel launch on `stream`, asynchronous (graph-capturable once the buffers were run
    /// outside capture); host buffers: complete on return.
    ///
    /// # Safety
    /// `send..send+send_size` and `recv..recv+recv_size` are live memory allocated through
    /// this library ([`GpuBuffer`] / [`crate::LocalMemory`]) that stays alive until the
    /// execution finished; `stream` is 0 or a live stream of the buffers' GPU.
    #[allow(clippy::too_many_arguments)] // upstream's Executor::execute, argument for argument
    pub unsafe fn execute(
        &self,
        rank: usize,
        send: u64,
        recv: u64,
        send_size: usize,
        recv_size: usize,
        dtype: DataType,
        plan: &ExecutionPlan,
        stream: RawStream,
        packet_type: PacketType,
    ) -> Result<()> {
        let call = Buffers {
            send,
            recv,
            send_size,
            recv_size,
        };
        let id = CallId::new(plan, rank, call, dtype, packet_type, stream);
        if !self.tracing() {
            let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(last) = entries
                .last
                .as_ref()
                .filter(|l| l.id == id && l.still_holds(&id))
            {
                self.repeated.fetch_add(1, Ordering::Relaxed);
                // SAFETY: the context it was made from is cached (`last` goes with it); the
                // caller keeps the buffers alive.
                return unsafe { last.launch(stream) };
            }
        }
        // Port channels of a plan on one node run as memory channels (the context and the
        // lowered blocks are the form's; `id` stays the loaded plan's).
        let form = self.runs_as(plan);
        let plan = &form;
        // Everything that can be refused is checked before the (collective) setup.
        let (device, extents, allocs) = self.check_call(rank, plan, call, dtype, packet_type)?;
        let gpu = if device.kind == DeviceType::Gpu {
            Some(self.gpu(device.id)?)
        } else {
            None
        };
        let sizes = (send_size as u64, recv_size as u64);
        let key = Key::new(plan, call);
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let Entries { map: entries, last } = &mut *guard;
        // A context this call may replace takes the last launch's pointers with it.
        *last = None;
        // A size met for the first time is laid out (and refused if it must be) before any
        // setup.
        let layout = match entries.get(&key) {
            Some(e) if e.lowered.contains_key(&sizes) => None,
            _ => Some(
                Layout::new(plan.meta(), plan.rank_plan(), sizes.0, sizes.1)
                    .map_err(|e| err(plan, e))?,
            ),
        };
        let entry = self.entry(
            entries,
            key,
            plan,
            device,
            (extents, allocs.clone()),
            call,
            gpu.as_ref(),
            stream,
        )?;
        let ctx = &entry.ctx;
        let trace = self.tracing()
            && match &gpu {
                // The counters are zeroed with a synchronous copy: not under capture.
                Some(g) => {
                    entry.lowered.get(&sizes).is_some_and(|l| l.trace.is_some())
                        || !g.ctx.is_capturing(stream)?
                }
                None => true,
            };
        let low = lowered(
            &mut entry.lowered,
            ctx,
            plan,
            layout,
            sizes,
            gpu.is_some(),
            trace,
        )?;
        if low.blocks.is_empty() {
            return Ok(());
        }
        match gpu {
            // SAFETY: the context owns every resource the blocks point at; the caller keeps
            // the buffers alive.
            None => unsafe {
                if trace {
                    low.traced_lanes.store(1, Ordering::Relaxed);
                }
                self.run_on_host(plan, ctx, low, call, dtype, packet_type, trace)
            },
            // SAFETY: forwarded from the caller.
            Some(g) => unsafe {
                let ports = low.blocks.iter().any(|b| b.n_port_channels > 0);
                let mut args = launch_args(low, ctx, call, dtype, packet_type, trace);
                let env = crate::env::env();
                let shape = gpu::shape(
                    &gpu::ShapeInputs {
                        plan_threads: plan.num_threads_per_block(),
                        packet: plan.is_packet(),
                        ports,
                        max_grid: ctx.max_grid,
                        bytes_per_lane: env.executor_bytes_per_lane(),
                        threads: env.executor_threads(),
                    },
                    args.nblocks,
                    send_size.max(recv_size),
                );
                args.lanes = shape.lanes;
                if trace {
                    low.traced_lanes.store(args.lanes, Ordering::Relaxed);
                }
                let threads = shape.threads;
                // A compiled plan when there is one (or it can be made now: not while the stream
                // is captured, since loading a module there is not allowed); not while tracing
                // (the interpreter counts the ops); launches of up to
                // MSCCLPP_EXECUTOR_JIT_THREADS threads only (gpu::jit_bound).
                let bound = gpu::jit_bound(threads, env.executor_jit_threads())
                    .filter(|_| !trace && env.executor_jit());
                let jit_key = |b| (args.dtype, args.packet, b, args.lane_sync);
                if let Some(bound) = bound {
                    let key = jit_key(bound);
                    if !low.jit.contains_key(&key) && !g.ctx.is_capturing(stream)? {
                        let made = match jit::generate(
                            &low.blocks,
                            dtype,
                            args.packet != 0,
                            bound,
                            args.lane_sync,
                        ) {
                            Ok(gen) => {
                                g.jit
                                    .get(g.ctx.device(), g.arch, &gen.source)
                                    .map(|kernel| jit::JitLaunch {
                                        kernel,
                                        tail: jit::values_tail(&gen.values),
                                    })
                            }
                            Err(why) => {
                                log::info!(
                                    "executor: plan `{}` runs on the interpreter: {why}",
                                    plan.name()
                                );
                                None
                            }
                        };
                        low.jit.insert(key, made);
                    }
                }
                gpu::check_resident(plan, ctx, &args)?;
                // Launches to repeat: not traced ones, nor ones on the interpreter only because
                // the stream was captured before the plan could be compiled.
                let settled = !trace && bound.is_none_or(|b| low.jit.contains_key(&jit_key(b)));
                let kernel = match bound.and_then(|b| low.jit.get(&jit_key(b))) {
                    Some(Some(j)) => Prepared::Jit(j.kernel.clone(), jit::params(&args, &j.tail)),
                    _ => Prepared::Interpreter(gpu::kernel(threads, env.executor_kernel()), args),
                };
                let [send_alloc, recv_alloc] = <[Arc<Allocation>; 2]>::try_from(allocs)
                    .map_err(|_| Error::Internal("executor: expected two allocations".into()))?;
                let launch = LastLaunch {
                    id,
                    allocs: [send_alloc, recv_alloc],
                    gpu: g.ctx.clone(),
                    kernel,
                    grid: args.nblocks * args.lanes.max(1),
                    threads,
                };
                launch.launch(stream)?;
                if settled {
                    *last = Some(launch);
                }
                Ok(())
            },
        }
    }

    /// Refuses a call the plan cannot run (rank, world size, null buffers, alignment and
    /// element size, memory neither ours nor adoptable, or on two devices, switch channels,
    /// fp8 on ROCm); returns the device the plan runs on (the CPU for memory the host
    /// addresses), the buffers with their sizes extended to their allocations' ends, and
    /// those allocations (send's, recv's).
    fn check_call(
        &self,
        rank: usize,
        plan: &ExecutionPlan,
        bufs: Buffers,
        dtype: DataType,
        packet_type: PacketType,
    ) -> Result<(Device, Buffers, Vec<Arc<Allocation>>)> {
        let b = self.comm.bootstrap();
        if rank != b.rank() || rank != plan.rank() {
            return Err(err(
                plan,
                format!(
                    "rank {rank}: expected this process's rank {} (the plan was loaded for rank {})",
                    b.rank(),
                    plan.rank()
                ),
            ));
        }
        if plan.world_size() != b.nranks() {
            return Err(err(
                plan,
                format!(
                    "written for {} ranks, but the communicator has {}",
                    plan.world_size(),
                    b.nranks()
                ),
            ));
        }
        let Buffers {
            send,
            recv,
            send_size,
            recv_size,
        } = bufs;
        if send == 0 || recv == 0 || send_size == 0 || recv_size == 0 {
            return Err(err(
                plan,
                format!("expected non-null buffers of at least one byte, got send {send:#x} ({send_size} bytes), recv {recv:#x} ({recv_size} bytes)"),
            ));
        }
        check_alignment(plan, dtype, packet_type)?;
        let (sd, send_ext, send_alloc) =
            buffer_extent(send, send_size, "send").map_err(|e| err(plan, e))?;
        let (rd, recv_ext, recv_alloc) =
            buffer_extent(recv, recv_size, "recv").map_err(|e| err(plan, e))?;
        let device = (sd, rd);
        if device.0 != device.1 {
            return Err(err(
                plan,
                format!(
                    "send buffer on {:?} but recv buffer on {:?}",
                    device.0, device.1
                ),
            ));
        }
        let device = device.0;
        if plan.uses_switch_channels() {
            check_switch(plan, device, dtype)?;
        }
        if device.kind == DeviceType::Gpu
            && <mscclpp_hal::Gpu as mscclpp_hal::Api>::NAME == "rocm"
            && matches!(dtype, DataType::Fp8E4M3 | DataType::Fp8E5M2)
        {
            return Err(err(
                plan,
                format!("{dtype}: the ROCm executor kernel is built without fp8"),
            ));
        }
        // Memory the host addresses (the CPU's, or every memory of the host backend) runs on
        // the host interpreter.
        let device = if crate::memory::host_addressable(device) {
            Device::CPU
        } else {
            device
        };
        let extents = Buffers {
            send,
            recv,
            send_size: send_ext,
            recv_size: recv_ext,
        };
        Ok((device, extents, vec![send_alloc, recv_alloc]))
    }

    /// The cached context of (`plan`, `ext.send`, `ext.recv`), set up (collectively) on first
    /// use, and again when `sizes` need more scratch than it has or the application replaced
    /// an adopted buffer (every rank alike: see the module doc). `buffers`: the extents and the
    /// allocations the call's buffers lie in ([`Executor::check_call`]).
    #[allow(clippy::too_many_arguments)]
    fn entry<'e>(
        &self,
        entries: &'e mut HashMap<Key, Entry>,
        key: Key,
        plan: &ExecutionPlan,
        device: Device,
        buffers: (Buffers, Vec<Arc<Allocation>>),
        call: Buffers,
        gpu: Option<&GpuState>,
        stream: RawStream,
    ) -> Result<&'e mut Entry> {
        let (ext, allocs) = buffers;
        let sizes = (call.send_size as u64, call.recv_size as u64);
        let need = context::scratch_capacity(plan, sizes.0, sizes.1);
        let fits = entries
            .get(&key)
            .is_some_and(|e| e.ctx.scratch.bytes() as u64 >= need && e.ctx.holds(&allocs));
        if !fits {
            if let Some(g) = gpu {
                if g.ctx.is_capturing(stream)? {
                    return Err(err(plan, "first execution of these buffers (or of a size needing more scratch) while the stream is being captured: run it once outside capture (setup talks to the peers)"));
                }
            }
            // Drop an outgrown context first (its scratch and registrations).
            entries.remove(&key);
            let ctx = ExecContext::new(
                &self.comm,
                plan,
                device,
                ext,
                call,
                need,
                gpu.map(|g| g.sms),
                allocs,
            )?;
            entries.insert(
                key.clone(),
                Entry {
                    ctx,
                    lowered: HashMap::new(),
                },
            );
        }
        entries
            .get_mut(&key)
            .ok_or_else(|| Error::Internal("executor context vanished".into()))
    }

    /// Runs the lowered blocks on CPU threads (counting into `low`'s trace when `trace`).
    ///
    /// # Safety
    /// As [`Executor::execute`]; `ctx` is the context `low` was lowered against.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_on_host(
        &self,
        plan: &ExecutionPlan,
        ctx: &ExecContext,
        low: &Lowered,
        bufs: Buffers,
        dtype: DataType,
        packet: PacketType,
        trace: bool,
    ) -> Result<()> {
        let switch: Vec<Vec<_>> = plan
            .rank_plan()
            .blocks
            .iter()
            .map(|b| {
                b.switch_channels
                    .iter()
                    .map(|&c| ctx.switch_handles[c])
                    .collect()
            })
            .collect();
        let l = HostLaunch {
            blocks: &low.blocks,
            switch: &switch,
            args: launch_args(low, ctx, bufs, dtype, packet, trace),
            dtype,
            packet,
            threads: self.cfg.host_threads_per_block,
            timeout: self.cfg.timeout,
        };
        // SAFETY: forwarded from the caller.
        unsafe { host::run(&l) }.map_err(|e| err(plan, e))
    }

    /// The GPU context of device `id` and its SM count (queried once).
    fn gpu(&self, id: i32) -> Result<GpuState> {
        let mut m = self.gpus.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(g) = m.get(&id) {
            return Ok(g.clone());
        }
        let ctx = Arc::new(GpuCtx::new(id)?);
        let (sms, arch) = gpu::sms_and_arch(&ctx)?;
        let g = GpuState {
            sms,
            arch,
            ctx,
            jit: Arc::new(jit::JitCache::default()),
        };
        m.insert(id, g.clone());
        Ok(g)
    }
}

/// The blocks lowered against `ctx` for `sizes` (cached in `cache`), lowered with `layout`
/// (laid out here when `None`; copied to the GPU when `on_gpu`) on first use, with zeroed
/// trace counters when `trace` asks for them and there are none.
#[allow(clippy::too_many_arguments)]
fn lowered<'e>(
    cache: &'e mut HashMap<(u64, u64), Lowered>,
    ctx: &ExecContext,
    plan: &ExecutionPlan,
    layout: Option<Layout>,
    sizes: (u64, u64),
    on_gpu: bool,
    trace: bool,
) -> Result<&'e mut Lowered> {
    let low = match cache.entry(sizes) {
        Slot::Occupied(o) => o.into_mut(),
        Slot::Vacant(v) => v.insert(lower_size(ctx, plan, layout, sizes, on_gpu)?),
    };
    if trace && low.trace.is_none() {
        // Every GPU block a launch of these blocks may have (lanes vary with nothing but the
        // size, but the most is cheap: 1 KiB per block and lane).
        let words = low.blocks.len().max(1) * gpu::MAX_LANES * TRACE_WORDS;
        low.trace = Some(GpuBuffer::new(ctx.device, words)?);
    }
    Ok(low)
}

/// The blocks of `plan` lowered against `ctx` for `sizes` (see [`lowered`]).
fn lower_size(
    ctx: &ExecContext,
    plan: &ExecutionPlan,
    layout: Option<Layout>,
    sizes: (u64, u64),
    on_gpu: bool,
) -> Result<Lowered> {
    let layout = match layout {
        Some(l) => l,
        None => Layout::new(plan.meta(), plan.rank_plan(), sizes.0, sizes.1)
            .map_err(|e| err(plan, e))?,
    };
    let layout = &layout;
    let mut blocks = lower(plan.rank_plan(), layout, &ctx.tables()).map_err(|e| err(plan, e))?;
    keep_split_nops(&mut blocks);
    let on_device = if on_gpu && !blocks.is_empty() {
        let buf: GpuBuffer<ExecBlock> = GpuBuffer::new(ctx.device, blocks.len())?;
        let flat: Vec<ExecBlock> = blocks.iter().map(|b| **b).collect();
        buf.copy_from_host(0, &flat)?;
        Some(buf)
    } else {
        None
    };
    Ok(Lowered {
        lane_async: own_semaphores(&blocks),
        blocks,
        on_device,
        reuse_chunk: layout.reuse_scratch_chunk(),
        trace: None,
        traced_lanes: AtomicU32::new(0),
        jit: HashMap::new(),
    })
}

/// Clears the lowering's split-nop marks that `MSCCLPP_EXECUTOR_SPLIT_NOPS` leaves out (all of
/// them when off, those not of the input/output kind with `io`): those nops keep their lane
/// barriers.
fn keep_split_nops(blocks: &mut [Box<ExecBlock>]) {
    filter_split_nops(blocks, crate::env::env().executor_split_nops())
}

fn filter_split_nops(blocks: &mut [Box<ExecBlock>], keep: crate::env::SplitNops) {
    use crate::env::SplitNops;
    use crate::executor::lower::device::{OP_LANE_SPLIT, OP_LANE_SPLIT_IO};
    for b in blocks.iter_mut() {
        let n = (b.n_ops as usize).min(b.ops.len());
        for o in &mut b.ops[..n] {
            let io = o.flags & OP_LANE_SPLIT_IO != 0;
            if keep == SplitNops::Off || (keep == SplitNops::Io && !io) {
                o.flags &= !(OP_LANE_SPLIT | OP_LANE_SPLIT_IO);
            }
        }
    }
}

/// Whether every memory channel a block of `blocks` waits on has a semaphore no other channel
/// waited on (in that block or another) shares. The async lane sync keeps each such channel's
/// expected signal count in the GPU block's shared memory during a launch and writes it back at
/// the end; two channels of one semaphore would lose counts.
fn own_semaphores(blocks: &[Box<ExecBlock>]) -> bool {
    use crate::executor::lower::device::{op, CHANNEL_MEMORY};
    let mut owner = HashMap::new();
    for (bi, b) in blocks.iter().enumerate() {
        let n = (b.n_ops as usize).min(b.ops.len());
        for o in &b.ops[..n] {
            let wait = o.op_type == op::WAIT || o.op_type == op::RELAXED_WAIT;
            if !wait || o.channel_type != CHANNEL_MEMORY {
                continue;
            }
            for &c in &o.channels[..usize::from(o.n_channels).min(o.channels.len())] {
                let Some(ch) = b.memory_channels.get(usize::from(c)) else {
                    return false;
                };
                let sem = ch.semaphore.expected_inbound_token as usize;
                if *owner.entry(sem).or_insert((bi, c)) != (bi, c) {
                    return false;
                }
            }
        }
    }
    true
}

/// `ExecArgs.lane_sync` of launches of blocks whose waited-on channels `own` their semaphores
/// ([`own_semaphores`]): `MSCCLPP_EXECUTOR_LANE_SYNC`, with the lane barriers instead of the
/// async sync where they do not.
fn lane_sync_code(own: bool) -> u32 {
    match crate::env::env().executor_lane_sync() {
        LaneSync::Async if !own => LaneSync::Barrier.code(),
        s => s.code(),
    }
}

/// The kernel's argument for a lowered plan on `ctx` (the host interpreter reads the same),
/// with `low`'s trace counters when `trace`.
fn launch_args(
    low: &Lowered,
    ctx: &ExecContext,
    bufs: Buffers,
    dtype: DataType,
    packet: PacketType,
    trace: bool,
) -> ExecArgs {
    ExecArgs {
        blocks: low.on_device.as_ref().map_or(0, |b| b.data()),
        input: bufs.send,
        output: bufs.recv,
        scratch: ctx.scratch.data(),
        scratch_half: ctx.scratch_half,
        reuse_chunk: low.reuse_chunk,
        flags: ctx.flags.data(),
        barriers: ctx.barriers.data(),
        semaphores: ctx.semaphores.data(),
        dtype: gpu::dtype_code(dtype),
        packet: match packet {
            PacketType::LL16 => 0,
            PacketType::LL8 => 1,
        },
        nblocks: low.blocks.len() as u32,
        lanes: 1,
        trace: match (&low.trace, trace) {
            (Some(t), true) => t.data(),
            _ => 0,
        },
        lane_sync: lane_sync_code(low.lane_async),
        io_apart: u32::from(
            bufs.send.saturating_add(bufs.send_size as u64) <= bufs.recv
                || bufs.recv.saturating_add(bufs.recv_size as u64) <= bufs.send,
        ),
    }
}

/// The plan's `buffer_alignment` holds whole elements of `dtype` and, for LL plans, whole
/// payloads of `packet_type` (which hold whole elements).
fn check_alignment(plan: &ExecutionPlan, dtype: DataType, packet_type: PacketType) -> Result<()> {
    let meta = plan.meta();
    let es = dtype.size_in_bytes() as u32;
    let pay = packet_type.payload_bytes() as u32;
    let ll = meta.protocol == Protocol::Ll;
    if ll && !meta.buffer_alignment.is_multiple_of(pay) {
        return Err(err(
            plan,
            format!("buffer_alignment {} is not a multiple of the {packet_type:?} payload ({pay} bytes)", meta.buffer_alignment),
        ));
    }
    if !meta.buffer_alignment.is_multiple_of(es) || (ll && !pay.is_multiple_of(es)) {
        return Err(err(
            plan,
            format!("{dtype} elements ({es} bytes) do not fit the plan's buffer_alignment {} / {packet_type:?} payload {pay}", meta.buffer_alignment),
        ));
    }
    Ok(())
}

/// Whether a plan with switch channels can run on `device` with `dtype`: NVLS must be usable
/// there ([`crate::nvls_usable`]'s reason otherwise), the GPU kernel has no switch operations
/// (only the host interpreter runs them), and NVLS sums f32, f16 and bf16 only.
fn check_switch(plan: &ExecutionPlan, device: Device, dtype: DataType) -> Result<()> {
    crate::nvls::nvls_usable(device).map_err(|e| {
        err(
            plan,
            format!("it uses switch channels (NVLS multicast: glre/glres/gstore): {e}"),
        )
    })?;
    if device.kind == DeviceType::Gpu {
        return Err(err(plan, "it uses switch channels (NVLS multicast: glre/glres/gstore): the GPU executor kernel has no switch-channel operations yet (they run on the host backend's multicast emulation)"));
    }
    if !matches!(dtype, DataType::F32 | DataType::F16 | DataType::Bf16) {
        return Err(err(
            plan,
            format!("{dtype}: switch channels (NVLS) reduce f32, f16 and bf16 only"),
        ));
    }
    Ok(())
}

/// The allocation holding `ptr..ptr+size` and the offset of `ptr` in it: this library's, or
/// the application's adopted through the backend (a live adoption of the same identity is
/// reused), or why neither.
fn find_or_adopt(ptr: u64, size: usize) -> Result<(Arc<Allocation>, u64)> {
    match crate::memory::find_allocation(ptr, size) {
        Some(f) => Ok(f),
        None => crate::memory::adopt_allocation(ptr, size),
    }
}

/// The device of the allocation holding `ptr..ptr+size` (this library's, or the
/// application's adopted through the backend), the bytes from `ptr` to its end, and the
/// allocation.
fn buffer_extent(
    ptr: u64,
    size: usize,
    what: &str,
) -> std::result::Result<(Device, usize, Arc<Allocation>), String> {
    let (a, off) = find_or_adopt(ptr, size).map_err(|e| {
        format!("{what} buffer {ptr:#x} (+{size} bytes): expected memory allocated through mscclpp (GpuBuffer / LocalMemory) or memory the backend can adopt (cudaMalloc, cuMem with a shareable handle, a host memfd mapping): {e}")
    })?;
    Ok((
        a.device(),
        a.size().saturating_sub(off as usize).max(size),
        a,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::lower::device::{op, ExecOp, CHANNEL_MEMORY, CHANNEL_PORT};

    /// A block whose memory channel i has semaphore `sems[i]` (its expected-count address) and
    /// whose ops wait on `waits` (channel indexes), one wait op each, and signal on channel 0.
    fn block(sems: &[usize], waits: &[u8], channel_type: u8) -> Box<ExecBlock> {
        let mut b = ExecBlock::zeroed();
        b.n_memory_channels = sems.len() as u32;
        for (i, &s) in sems.iter().enumerate() {
            b.memory_channels[i].semaphore.expected_inbound_token = s as *mut u64;
        }
        let mut signal = ExecOp::zeroed();
        signal.op_type = op::SIGNAL;
        signal.channel_type = CHANNEL_MEMORY;
        signal.n_channels = 1;
        b.ops[0] = signal;
        for (i, &c) in waits.iter().enumerate() {
            let mut w = ExecOp::zeroed();
            w.op_type = if i % 2 == 0 {
                op::WAIT
            } else {
                op::RELAXED_WAIT
            };
            w.channel_type = channel_type;
            w.n_channels = 1;
            w.channels[0] = c;
            b.ops[1 + i] = w;
        }
        b.n_ops = 1 + waits.len() as u32;
        b
    }

    /// The async lane sync needs every waited-on channel's semaphore to itself: a block waiting
    /// twice on one channel is fine, two blocks (or two channels of one block) waiting on one
    /// semaphore are not; channels nobody waits on, and port-channel waits, do not count.
    #[test]
    fn async_lane_sync_needs_a_semaphore_per_waited_channel() {
        let m = CHANNEL_MEMORY;
        assert!(own_semaphores(&[block(&[8, 16], &[0, 1, 0], m)]));
        assert!(own_semaphores(&[
            block(&[8], &[0], m),
            block(&[16, 8], &[0], m)
        ]));
        assert!(!own_semaphores(&[
            block(&[8], &[0], m),
            block(&[16, 8], &[1], m)
        ]));
        assert!(!own_semaphores(&[block(&[8, 8], &[0, 1], m)]));
        assert!(own_semaphores(&[
            block(&[8], &[0], m),
            block(&[8], &[0], CHANNEL_PORT)
        ]));
        // A wait naming a channel the block does not have: refused.
        assert!(!own_semaphores(&[block(&[8], &[20], m)]));
    }

    /// `MSCCLPP_EXECUTOR_SPLIT_NOPS`: off clears every split mark, `io` keeps only the
    /// input/output kind (with both its flags), all keeps every mark; other flags stay.
    #[test]
    fn split_nops_setting_filters_the_marks() {
        use crate::env::SplitNops;
        use crate::executor::lower::device::{OP_LANE_SPLIT, OP_LANE_SPLIT_IO};
        const OTHER: u8 = 1;
        let marks = [
            OTHER,
            OTHER | OP_LANE_SPLIT,
            OP_LANE_SPLIT | OP_LANE_SPLIT_IO,
        ];
        let kept = |keep| {
            let mut b = ExecBlock::zeroed();
            for (i, &f) in marks.iter().enumerate() {
                b.ops[i].op_type = op::NOP;
                b.ops[i].flags = f;
            }
            b.n_ops = marks.len() as u32;
            let mut blocks = [b];
            filter_split_nops(&mut blocks, keep);
            blocks[0].ops[..marks.len()]
                .iter()
                .map(|o| o.flags)
                .collect::<Vec<_>>()
        };
        assert_eq!(kept(SplitNops::All), marks.to_vec());
        assert_eq!(
            kept(SplitNops::Io),
            vec![OTHER, OTHER, OP_LANE_SPLIT | OP_LANE_SPLIT_IO]
        );
        assert_eq!(kept(SplitNops::Off), vec![OTHER, OTHER, 0]);
    }
}
