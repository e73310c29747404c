//! `coll_perf`: nccl-tests-style benchmark of the collectives (`all_reduce_perf` & co. in one
//! binary): same flags, columns and bus-bandwidth factors, under any launcher or `--np N`.

#[path = "../coll_data.rs"]
#[allow(dead_code)] // shared with mp_unit_tests; coll_perf uses a part
mod coll_data;
#[path = "../launcher.rs"]
#[allow(dead_code)] // shared with mp_unit_tests; coll_perf uses a part
mod launcher;
#[path = "../plan_bench.rs"]
mod plan_bench;
#[path = "../spawn.rs"]
#[allow(dead_code)] // shared with mp_unit_tests; coll_perf uses a part
mod spawn;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::bootstrap::{Bootstrap, TcpBootstrap};
use mscclpp::collectives::{CollectiveKind, Collectives, CollectivesConfig, DataType, ReduceOp};
use mscclpp::p2p::{Dir, P2pOp, PointToPoint};
use mscclpp::{Communicator, Context, Device, GpuBuffer};
use mscclpp_hal::{prelude::*, Gpu, StreamInterop};

const USAGE: &str = "coll_perf [options]  (nccl-tests flags)
  -b, --minbytes SIZE     smallest size (default 32M; K/M/G suffixes)
  -e, --maxbytes SIZE     largest size (default 32M)
  -f, --stepfactor F      multiply the size by F each step (default 2)
  -d, --datatype TYPE     int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2 (default float)
  -o, --op OP             sum prod min max avg (default sum)
  -r, --root R            broadcast root (default 0)
  -n, --iters N           timed iterations (default 20)
  -w, --warmup_iters N    warm-up iterations (default 5)
  -c, --check 0|1         check results (default 1)
  -G, --cudagraph N       capture the iterations in a CUDA graph and launch it N times (GPU only)
      --op-kind / --coll  allreduce | allgather | reducescatter | broadcast | sendrecv | alltoall
                          (default allreduce; sendrecv: each rank sends SIZE bytes to rank+1 and
                          receives from rank-1, busbw = algbw; alltoall: SIZE = the whole send
                          buffer, busbw = algbw * (n-1)/n; both run core's point-to-point and
                          have no in-place form: the in-place columns repeat the out-of-place
                          measurement)
      --algo NAME         force the algorithm
      --json FILE         also write the rows as JSON
      --plan FILE         run an execution plan (its collective and in/out-of-place) through the
                          executor, each size next to the native algorithm of the same call
      --plan FILE --check only parse and validate the plan (every rank's part); no ranks needed
      --np N / --ip_port=IP:PORT / --timeout=S   launcher options (as mp_unit_tests)
Sizes are total bytes as in nccl-tests (all-gather: the gathered buffer; reduce-scatter: the
send buffer). Exit code 1 when any value is wrong.";

#[derive(Clone, Debug)]
struct Opts {
    minb: usize,
    maxb: usize,
    factor: f64,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
    iters: usize,
    warmup: usize,
    check: bool,
    graph: usize,
    kind: CollectiveKind,
    /// `--coll sendrecv | alltoall`: point-to-point instead of `kind`.
    p2p: Option<P2pKind>,
    algo: Option<String>,
    json: Option<String>,
    plan: Option<String>,
    plan_check_only: bool,
}

/// The point-to-point benchmarks (nccl-tests' sendrecv_perf and alltoall_perf).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum P2pKind {
    SendRecv,
    AllToAll,
}

impl P2pKind {
    fn name(self) -> &'static str {
        match self {
            P2pKind::SendRecv => "sendrecv",
            P2pKind::AllToAll => "alltoall",
        }
    }
}

fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mul) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("size `{s}`: expected a number with an optional K, M or G suffix"))
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        minb: 32 << 20,
        maxb: 32 << 20,
        factor: 2.0,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        root: 0,
        iters: 20,
        warmup: 5,
        check: true,
        graph: 0,
        kind: CollectiveKind::AllReduce,
        p2p: None,
        algo: None,
        json: None,
        plan: None,
        plan_check_only: false,
    };
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let next_is_flag_value = matches!(args.get(i + 1).map(String::as_str), Some("0" | "1"));
        let mut value = || -> Result<String, String> {
            if let Some(v) = &inline {
                return Ok(v.clone());
            }
            i += 1;
            args.get(i)
                .cloned()
                .ok_or_else(|| format!("{flag}: expected a value"))
        };
        let num = |v: String, what: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{what} `{v}`: expected a non-negative integer"))
        };
        match flag.as_str() {
            "-b" | "--minbytes" => o.minb = parse_size(&value()?)?,
            "-e" | "--maxbytes" => o.maxb = parse_size(&value()?)?,
            "-f" | "--stepfactor" => {
                let v = value()?;
                o.factor = v
                    .parse::<f64>()
                    .ok()
                    .filter(|f| *f > 1.0)
                    .ok_or_else(|| format!("-f `{v}`: expected a factor above 1"))?
            }
            "-d" | "--datatype" => {
                o.dtype = value()?
                    .parse()
                    .map_err(|e: mscclpp::Error| e.to_string())?
            }
            "-o" | "--op" => {
                let v = value()?;
                // `--op allreduce` names the collective (as the brief's alternative spelling).
                match v.parse::<CollectiveKind>() {
                    Ok(k) => o.kind = k,
                    Err(_) => o.op = v.parse().map_err(|e: mscclpp::Error| e.to_string())?,
                }
            }
            "-r" | "--root" => o.root = num(value()?, "-r")?,
            "-n" | "--iters" => o.iters = num(value()?, "-n")?.max(1),
            "-w" | "--warmup_iters" => o.warmup = num(value()?, "-w")?,
            // `--check` with no 0/1 after it: validate the plan only (`-c 0|1` checks results).
            "--check" if inline.is_none() && !next_is_flag_value => o.plan_check_only = true,
            "-c" | "--check" => o.check = num(value()?, "-c")? != 0,
            "-G" | "--cudagraph" => o.graph = num(value()?, "-G")?,
            "--op-kind" | "--coll" | "--collective" => match value()?.as_str() {
                "sendrecv" => o.p2p = Some(P2pKind::SendRecv),
                "alltoall" => o.p2p = Some(P2pKind::AllToAll),
                v => {
                    o.p2p = None;
                    o.kind = v.parse().map_err(|e: mscclpp::Error| e.to_string())?
                }
            },
            "--algo" => o.algo = Some(value()?),
            "--json" => o.json = Some(value()?),
            "--plan" => o.plan = Some(value()?),
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown option `{a}`")),
        }
        i += 1;
    }
    if o.minb > o.maxb {
        return Err(format!("-b {} is above -e {}", o.minb, o.maxb));
    }
    if o.p2p.is_some() && (o.plan.is_some() || o.algo.is_some()) {
        return Err("--coll sendrecv/alltoall take no --plan or --algo".into());
    }
    Ok(o)
}

/// nccl-tests' bus-bandwidth factor.
fn bus_factor(kind: CollectiveKind, n: usize) -> f64 {
    let n = n as f64;
    match kind {
        CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter => (n - 1.0) / n,
        CollectiveKind::Broadcast => 1.0,
    }
}

impl Opts {
    /// The benchmark's name.
    fn kind_name(&self) -> String {
        self.p2p
            .map_or_else(|| self.kind.to_string(), |p| p.name().into())
    }

    /// nccl-tests' bus-bandwidth factor of this benchmark on `n` ranks.
    fn bus_factor(&self, n: usize) -> f64 {
        match self.p2p {
            Some(P2pKind::SendRecv) => 1.0,
            Some(P2pKind::AllToAll) => (n as f64 - 1.0) / n as f64,
            None => bus_factor(self.kind, n),
        }
    }

    /// The report's `#wrong` cell of `m`: its count, or N/A when results are not checked.
    fn wrong_cell(&self, m: &Measure) -> String {
        if self.check {
            m.wrong.to_string()
        } else {
            "N/A".into()
        }
    }

    /// The sweep's next message size after `size`: `size` times the factor (at least one
    /// byte more, at most the largest size); `None` once `size` is the largest.
    fn next_size(&self, size: usize) -> Option<usize> {
        if size >= self.maxb {
            return None;
        }
        Some(
            ((size as f64 * self.factor) as usize)
                .max(size + 1)
                .min(self.maxb),
        )
    }
}

/// The report's line of how many values were wrong, as nccl-tests prints it.
fn print_out_of_bounds(wrong: u64) {
    println!(
        "# Out of bounds values : {wrong} {}",
        if wrong == 0 { "OK" } else { "FAILED" }
    );
}

/// Writes `rows` to `path` as pretty-printed JSON.
fn write_json(path: &str, rows: &impl serde::Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(rows).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("writing {path}: {e}"))
}

struct Bench {
    coll: Collectives,
    boot: Arc<dyn Bootstrap>,
    device: Device,
    stream: Option<<Gpu as Api>::Stream>,
    events: Option<(<Gpu as Api>::Event, <Gpu as Api>::Event)>,
    a: GpuBuffer<u8>,
    b: GpuBuffer<u8>,
    timeout: Duration,
    /// `--plan`: the executor and plan, used while `use_plan` is set.
    plan: Option<plan_bench::PlanRun>,
    use_plan: std::cell::Cell<bool>,
    /// `--coll sendrecv | alltoall`.
    p2p: Option<PointToPoint>,
}

#[derive(serde::Serialize, Clone, Copy, Default)]
struct Measure {
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: u64,
}

#[derive(serde::Serialize)]
struct Row {
    collective: String,
    size: usize,
    count: usize,
    dtype: String,
    redop: String,
    root: i64,
    algorithm: String,
    nranks: usize,
    out_of_place: Measure,
    in_place: Measure,
}

impl Bench {
    fn raw(&self) -> u64 {
        self.stream.as_ref().map_or(0, Gpu::raw_stream)
    }
    fn sync(&self) -> Result<(), String> {
        match &self.stream {
            Some(s) => Gpu::stream_synchronize(s, self.timeout).map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// (send, recv, per-call count) of a call on `elems` total elements.
    fn addrs(&self, o: &Opts, elems: usize, in_place: bool) -> (u64, u64, usize) {
        let (rank, n) = (self.coll.rank(), self.coll.nranks());
        let size = o.dtype.size_in_bytes() as u64;
        let (a, b) = (self.a.data(), self.b.data());
        match o.p2p {
            Some(P2pKind::SendRecv) => return (a, b, elems),
            Some(P2pKind::AllToAll) => return (a, b, elems / n),
            None => {}
        }
        match o.kind {
            CollectiveKind::AllReduce | CollectiveKind::Broadcast => {
                (a, if in_place { a } else { b }, elems)
            }
            CollectiveKind::AllGather => {
                let per = elems / n;
                if in_place {
                    (a + rank as u64 * per as u64 * size, a, per)
                } else {
                    (b, a, per)
                }
            }
            CollectiveKind::ReduceScatter => {
                let per = elems / n;
                if in_place {
                    (a, a + rank as u64 * per as u64 * size, per)
                } else {
                    (a, b, per)
                }
            }
        }
    }

    fn call(&self, o: &Opts, send: u64, recv: u64, count: usize) -> Result<(), String> {
        let s = self.raw();
        if let (Some(p), true) = (&self.plan, self.use_plan.get()) {
            return p.call(o, self.coll.nranks(), send, recv, count, s);
        }
        if let (Some(p2p), Some(kind)) = (&self.p2p, o.p2p) {
            let (rank, n) = (p2p.rank(), p2p.nranks());
            let bytes = count * o.dtype.size_in_bytes();
            // SAFETY: as below.
            return unsafe {
                match kind {
                    P2pKind::SendRecv => p2p.run(
                        &[
                            P2pOp {
                                dir: Dir::Send,
                                peer: (rank + 1) % n,
                                buf: send,
                                bytes,
                            },
                            P2pOp {
                                dir: Dir::Recv,
                                peer: (rank + n - 1) % n,
                                buf: recv,
                                bytes,
                            },
                        ],
                        s,
                    ),
                    P2pKind::AllToAll => p2p.all_to_all(send, recv, bytes, s),
                }
            }
            .map_err(|e| e.to_string());
        }
        // SAFETY: the addresses lie inside `a` and `b` (sized for the largest call), alive for
        // the benchmark; every launch is synchronised before the buffers are reused.
        unsafe {
            match o.kind {
                CollectiveKind::AllReduce => {
                    self.coll.all_reduce(send, recv, count, o.dtype, o.op, s)
                }
                CollectiveKind::AllGather => self.coll.all_gather(send, recv, count, o.dtype, s),
                CollectiveKind::ReduceScatter => self
                    .coll
                    .reduce_scatter(send, recv, count, o.dtype, o.op, s),
                CollectiveKind::Broadcast => {
                    self.coll.broadcast(send, recv, count, o.dtype, o.root, s)
                }
            }
        }
        .map_err(|e| e.to_string())
    }

    /// Seconds per call (this rank).
    fn time(&self, o: &Opts, send: u64, recv: u64, count: usize) -> Result<f64, String> {
        let e = |x: mscclpp_hal::Error| x.to_string();
        for _ in 0..o.warmup {
            self.call(o, send, recv, count)?;
        }
        self.sync()?;
        self.boot.barrier().map_err(|x| x.to_string())?;
        match (&self.stream, &self.events) {
            (Some(s), Some((start, end))) => {
                if o.graph > 0 {
                    Gpu::begin_capture(s).map_err(e)?;
                    let mut r = Ok(());
                    for _ in 0..o.iters {
                        r = r.and_then(|_| self.call(o, send, recv, count));
                    }
                    let g = Gpu::end_capture(s).map_err(e);
                    r?;
                    let g = g?;
                    Gpu::launch_graph(&g, s).map_err(e)?;
                    self.sync()?;
                    self.boot.barrier().map_err(|x| x.to_string())?;
                    Gpu::record_event(start, s).map_err(e)?;
                    for _ in 0..o.graph {
                        Gpu::launch_graph(&g, s).map_err(e)?;
                    }
                    Gpu::record_event(end, s).map_err(e)?;
                    self.sync()?;
                    let ms = Gpu::event_elapsed_ms(start, end).map_err(e)?;
                    Ok(f64::from(ms) / 1e3 / (o.iters * o.graph) as f64)
                } else {
                    Gpu::record_event(start, s).map_err(e)?;
                    for _ in 0..o.iters {
                        self.call(o, send, recv, count)?;
                    }
                    Gpu::record_event(end, s).map_err(e)?;
                    self.sync()?;
                    let ms = Gpu::event_elapsed_ms(start, end).map_err(e)?;
                    Ok(f64::from(ms) / 1e3 / o.iters as f64)
                }
            }
            _ => {
                let t = Instant::now();
                for _ in 0..o.iters {
                    self.call(o, send, recv, count)?;
                }
                Ok(t.elapsed().as_secs_f64() / o.iters as f64)
            }
        }
    }

    /// One checked call with fresh data; wrong elements on this rank.
    fn check(&self, o: &Opts, elems: usize, in_place: bool, call: u32) -> Result<u64, String> {
        use coll_data::*;
        let (rank, n) = (self.coll.rank(), self.coll.nranks());
        let (send, recv, count) = self.addrs(o, elems, in_place);
        let size = o.dtype.size_in_bytes();
        let ins = match (o.p2p, o.kind) {
            (Some(P2pKind::AllToAll), _) | (None, CollectiveKind::ReduceScatter) => count * n,
            _ => count,
        };
        let vals = all_values(o.dtype, o.op, 0x5eed, call, n, ins);
        let poison = vec![0xA5u8; self.a.len()];
        self.a
            .copy_from_host(0, &poison)
            .map_err(|e| e.to_string())?;
        self.b
            .copy_from_host(0, &poison)
            .map_err(|e| e.to_string())?;
        let write = |addr: u64, v: &[f64]| -> Result<(), String> {
            let (buf, off) = if addr >= self.b.data() && addr < self.b.data() + self.b.len() as u64
            {
                (&self.b, addr - self.b.data())
            } else {
                (&self.a, addr - self.a.data())
            };
            buf.copy_from_host(off as usize, &encode_all(o.dtype, v))
                .map_err(|e| e.to_string())
        };
        write(send, &vals[rank])?;
        self.call(o, send, recv, count)?;
        self.sync()?;
        let outs = match (o.p2p, o.kind) {
            (Some(P2pKind::AllToAll), _) | (None, CollectiveKind::AllGather) => count * n,
            _ => count,
        };
        let (buf, off) = if recv >= self.b.data() && recv < self.b.data() + self.b.len() as u64 {
            (&self.b, (recv - self.b.data()) as usize)
        } else {
            (&self.a, (recv - self.a.data()) as usize)
        };
        let mut got = vec![0u8; outs * size];
        buf.copy_to_host(off, &mut got).map_err(|e| e.to_string())?;
        let mut column = vec![0.0; n];
        let mut wrong = 0;
        for (i, e) in got.chunks_exact(size).enumerate() {
            let want = match o.p2p {
                Some(P2pKind::SendRecv) => Some(vals[(rank + n - 1) % n][i]),
                // Block p of the result: block `rank` of rank p's send buffer.
                Some(P2pKind::AllToAll) => Some(vals[i / count][rank * count + i % count]),
                None => None,
            };
            let want = match want {
                Some(w) => w,
                None => match o.kind {
                    CollectiveKind::AllReduce | CollectiveKind::ReduceScatter => {
                        let at = if o.kind == CollectiveKind::ReduceScatter {
                            rank * count + i
                        } else {
                            i
                        };
                        for (r, c) in column.iter_mut().enumerate() {
                            *c = vals[r][at];
                        }
                        reference(o.dtype, o.op, &column)
                    }
                    CollectiveKind::AllGather => vals[i / count][i % count],
                    CollectiveKind::Broadcast => vals[o.root][i],
                },
            };
            if !close(o.dtype, decode(o.dtype, e), want) {
                wrong += 1;
            }
        }
        Ok(wrong)
    }

    fn measure(
        &self,
        o: &Opts,
        elems: usize,
        in_place: bool,
        call: u32,
    ) -> Result<Measure, String> {
        let (send, recv, count) = self.addrs(o, elems, in_place);
        let secs = self.time(o, send, recv, count)?;
        let wrong = if o.check {
            self.check(o, elems, in_place, call)?
        } else {
            0
        };
        let mut blob = secs.to_le_bytes().to_vec();
        blob.extend(wrong.to_le_bytes());
        let all = self.boot.all_gather(&blob).map_err(|e| e.to_string())?;
        let (mut t, mut w) = (0.0, 0u64);
        for x in &all {
            let arr =
                |r: std::ops::Range<usize>| x.get(r).and_then(|s| <[u8; 8]>::try_from(s).ok());
            let (Some(tb), Some(wb)) = (arr(0..8), arr(8..16)) else {
                return Err("a rank sent a malformed timing".into());
            };
            t += f64::from_le_bytes(tb);
            w += u64::from_le_bytes(wb);
        }
        let secs = t / all.len() as f64;
        let bytes = (elems * o.dtype.size_in_bytes()) as f64;
        let algbw = bytes / secs / 1e9;
        Ok(Measure {
            time_us: secs * 1e6,
            algbw,
            busbw: algbw * o.bus_factor(self.coll.nranks()),
            wrong: w,
        })
    }
}

fn run(
    o: &Opts,
    placement: &launcher::Placement,
    boot: Arc<dyn Bootstrap>,
    timeout: Duration,
) -> Result<bool, String> {
    let gpu = Gpu::NAME != "host";
    let device = if gpu {
        let n = Gpu::device_count().map_err(|e| format!("counting GPUs: {e}"))?;
        if n == 0 {
            return Err("no GPU visible".into());
        }
        Device::gpu((placement.local_rank % n) as i32)
    } else {
        Device::CPU
    };
    let comm = Arc::new(Communicator::new(
        boot.clone(),
        Context::new().map_err(|e| e.to_string())?,
    ));
    let cfg = CollectivesConfig {
        device: Some(device),
        host_timeout: timeout,
        ..Default::default()
    };
    let plan = match &o.plan {
        Some(path) => Some(plan_bench::PlanRun::new(
            path,
            comm.clone(),
            placement.rank,
            timeout,
        )?),
        None => None,
    };
    let comm_p2p = comm.clone();
    let coll = Collectives::with_config(comm, cfg).map_err(|e| e.to_string())?;
    if let Some(a) = &o.algo {
        coll.force_algorithm(o.kind, Some(a))
            .map_err(|e| e.to_string())?;
    }
    let (n, rank) = (coll.nranks(), coll.rank());
    if o.root >= n {
        return Err(format!("-r {}: expected a root below {n}", o.root));
    }
    let p2p = match o.p2p {
        Some(_) => Some(PointToPoint::new(comm_p2p, device).map_err(|e| e.to_string())?),
        None => None,
    };
    let (stream, events) = if gpu {
        let dev = Gpu::open_device(device.id as usize).map_err(|e| e.to_string())?;
        let s = Gpu::create_stream(&dev).map_err(|e| e.to_string())?;
        let ev = (
            Gpu::create_event(&dev).map_err(|e| e.to_string())?,
            Gpu::create_event(&dev).map_err(|e| e.to_string())?,
        );
        (Some(s), Some(ev))
    } else {
        if o.graph > 0 {
            return Err("-G needs a GPU build: the host backend has no graphs".into());
        }
        (None, None)
    };
    let cap = o.maxb.max(o.dtype.size_in_bytes() * n).max(64);
    let alloc = || GpuBuffer::<u8>::new(device, cap).map_err(|e| e.to_string());
    let bench = Bench {
        coll,
        boot,
        device,
        stream,
        events,
        a: alloc()?,
        b: alloc()?,
        timeout,
        plan,
        use_plan: std::cell::Cell::new(false),
        p2p,
    };
    let _ = bench.device;
    if bench.plan.is_some() {
        return plan_bench::report(o, &bench);
    }
    let redop = match o.kind {
        CollectiveKind::AllReduce | CollectiveKind::ReduceScatter if o.p2p.is_none() => o.op.name(),
        _ => "none",
    };
    let root: i64 = if o.kind == CollectiveKind::Broadcast && o.p2p.is_none() {
        o.root as i64
    } else {
        -1
    };
    if rank == 0 {
        println!("# coll_perf: {} nranks {n} ({} backend) dtype {} op {redop} iters {} warmup {} graph {} check {}", o.kind_name(), Gpu::NAME, o.dtype, o.iters, o.warmup, o.graph, o.check as u8);
        println!("#{:>75}{:>34}", "out-of-place", "in-place");
        println!(
            "#{:>11} {:>12} {:>9} {:>7} {:>7} {:>8} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7} {:>6}  algorithm",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong",
        );
        println!(
            "#{:>11} {:>12} {:>9} {:>7} {:>7} {:>8} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7} {:>6}",
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            ""
        );
    }
    let mut rows = Vec::new();
    let mut size = o.minb;
    let mut call = 0u32;
    let unit = match (o.p2p, o.kind) {
        (Some(P2pKind::AllToAll), _)
        | (None, CollectiveKind::AllGather | CollectiveKind::ReduceScatter) => {
            o.dtype.size_in_bytes() * n
        }
        _ => o.dtype.size_in_bytes(),
    };
    let (mut wrong_total, mut bus_sum) = (0u64, 0.0);
    loop {
        let bytes = size / unit * unit;
        if bytes > 0 {
            let elems = bytes / o.dtype.size_in_bytes();
            call += 1;
            let oop = bench.measure(o, elems, false, call)?;
            // Point-to-point has no in-place form: the in-place columns measure it again.
            let ip = bench.measure(o, elems, o.p2p.is_none(), call)?;
            let per = if matches!(
                o.kind,
                CollectiveKind::AllGather | CollectiveKind::ReduceScatter
            ) {
                bytes / n
            } else {
                bytes
            };
            let algo = match o.p2p {
                Some(_) => "p2p",
                None => bench
                    .coll
                    .algorithm_for(o.kind, per)
                    .map_err(|e| e.to_string())?,
            };
            wrong_total += oop.wrong + ip.wrong;
            bus_sum += (oop.busbw + ip.busbw) / 2.0;
            if rank == 0 {
                let w = |m: &Measure| o.wrong_cell(m);
                println!(
                    "{:>12} {:>12} {:>9} {:>7} {:>7} {:>8.2} {:>7.2} {:>7.2} {:>6} {:>8.2} {:>7.2} {:>7.2} {:>6}  {algo}",
                    bytes, elems, o.dtype.nccl_name(), redop, root, oop.time_us, oop.algbw, oop.busbw, w(&oop), ip.time_us, ip.algbw, ip.busbw, w(&ip)
                );
            }
            rows.push(Row {
                collective: o.kind_name(),
                size: bytes,
                count: elems,
                dtype: o.dtype.nccl_name().into(),
                redop: redop.into(),
                root,
                algorithm: algo.into(),
                nranks: n,
                out_of_place: oop,
                in_place: ip,
            });
        }
        match o.next_size(size) {
            Some(next) => size = next,
            None => break,
        }
    }
    if rank == 0 {
        print_out_of_bounds(wrong_total);
        println!(
            "# Avg bus bandwidth    : {:.4}",
            if rows.is_empty() {
                0.0
            } else {
                bus_sum / rows.len() as f64
            }
        );
        if let Some(path) = &o.json {
            write_json(path, &rows)?;
        }
    }
    Ok(wrong_total == 0)
}

fn real_main() -> i32 {
    let mp = match launcher::options_of_this_process("coll_perf", USAGE) {
        Ok(m) => m,
        Err(status) => return status,
    };
    let o = match parse(&mp.rest) {
        Ok(o) => o,
        Err(e) => {
            if e.is_empty() {
                println!("{USAGE}");
                return 0;
            }
            eprintln!("coll_perf: {e}\n{USAGE}");
            return 2;
        }
    };
    if let (Some(path), true) = (&o.plan, o.plan_check_only) {
        return plan_bench::check_only(path);
    }
    let placement = match launcher::placement_of_this_process("coll_perf") {
        Ok(p) => p,
        Err(status) => return status,
    };
    let placement = match (placement, mp.np) {
        (None, Some(np)) => {
            return match spawn::self_launch(np, &mp, Duration::from_secs(10)) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("coll_perf: {e}");
                    1
                }
            }
        }
        (Some(p), _) => p,
        (None, None) => launcher::Placement::single_process(),
    };
    let ip_port = match &mp.ip_port {
        Some(given) => given.clone(),
        None if placement.size > 1 => launcher::default_ip_port(),
        None => match launcher::free_loopback_port() {
            Ok(p) => format!("127.0.0.1:{p}"),
            Err(e) => {
                eprintln!("coll_perf: {e}");
                return 1;
            }
        },
    };
    let boot = match TcpBootstrap::new(placement.rank, placement.size).and_then(|mut b| {
        b.initialize_with_addr(&ip_port, mp.timeout)?;
        Ok(b)
    }) {
        Ok(b) => Arc::new(b),
        Err(e) => {
            eprintln!(
                "coll_perf: rank {}: bootstrap at {ip_port} failed: {e}",
                placement.rank
            );
            return 1;
        }
    };
    let code = match run(&o, &placement, boot.clone(), mp.timeout) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("coll_perf: rank {}: {e}", placement.rank);
            1
        }
    };
    if let Err(e) = boot.barrier() {
        eprintln!("coll_perf: final barrier: {e}");
        return code.max(1);
    }
    code
}

fn main() {
    std::process::exit(real_main());
}
