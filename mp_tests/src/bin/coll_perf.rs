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
  -d, --datatype TYPE     int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2
                          (default float; also fp16/f16/float16, bf16, fp32/f32, fp64/f64, int/i32,
                          i8/u8/i64/u64, fp8_e4m3/e4m3, fp8_e5m2/e5m2)
  -o, --op OP             sum prod min max avg (default sum)
  -r, --root R            broadcast root (default 0)
  -n, --iters N           timed iterations, at least 1 (default 20)
  -w, --warmup_iters N    warm-up iterations (default 5)
  -c, --check 0|1         check results (default 1)
  -G, --cudagraph N       capture the iterations in a CUDA graph and launch it N times (GPU builds
                          only; the host backend refuses -G above 0); with --plan: after at
                          least one warm-up call (-w 1+, the plan's setup), without --trace
      --op-kind / --coll  allreduce | allgather | reducescatter | broadcast | sendrecv | alltoall
                          (default allreduce; sendrecv: each rank sends SIZE bytes to rank+1 and
                          receives from rank-1, busbw = algbw; alltoall: SIZE = the whole send
                          buffer, busbw = algbw * (n-1)/n; both run core's point-to-point and
                          have no in-place form: the in-place columns repeat the out-of-place
                          measurement)
      --algo NAME         force the algorithm
      --json FILE         also write the rows as JSON (perf_plot draws them)
      --plan FILE         run an execution plan (its collective and in/out-of-place) through the
                          executor, each size next to the native algorithm of the same call
      --plan FILE --check only parse and validate the plan (every rank's part); no ranks needed
      --plan FILE --trace also run each size once more traced and print rank 0's time per op
                          (us per launch, per thread block; mscclpp::executor::PlanTrace)
      --np N / --ip_port=IP:PORT / --timeout=S   launcher options (as mp_unit_tests)
Sizes are total bytes as in nccl-tests (all-gather: the gathered buffer; reduce-scatter: the
send buffer); every size of the sweep must hold at least one element per rank. On the host
backend CPU threads play the GPU: times are wall-clock per call (memory copies between
processes on this machine), not a GPU's or a link's bandwidth. Exit code 1 when any value is
wrong, 2 on bad arguments.";

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
    /// `--trace`: a traced run of each plan size after the timed ones.
    trace: bool,
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
        trace: false,
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
            "-n" | "--iters" => {
                o.iters = num(value()?, "-n")?;
                if o.iters == 0 {
                    return Err("-n 0: expected at least 1 timed iteration".into());
                }
            }
            "-w" | "--warmup_iters" => o.warmup = num(value()?, "-w")?,
            // `--check` with no 0/1 after it: validate the plan only (`-c 0|1` checks results).
            "--check" if inline.is_none() && !next_is_flag_value => o.plan_check_only = true,
            "-c" | "--check" => {
                o.check = match value()?.as_str() {
                    "0" => false,
                    "1" => true,
                    v => return Err(format!("-c `{v}`: expected 0 (no check) or 1 (check)")),
                }
            }
            "-G" | "--cudagraph" => {
                o.graph = num(value()?, "-G")?;
                if o.graph > 0 && Gpu::NAME == "host" {
                    return Err(format!(
                        "-G {}: CUDA graphs need a GPU build (--features cuda); this coll_perf is the host backend's: leave -G out",
                        o.graph
                    ));
                }
            }
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
            "--trace" => o.trace = true,
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown option `{a}`")),
        }
        i += 1;
    }
    if o.minb > o.maxb {
        return Err(format!(
            "-b {} is above -e {}: the smallest size must not exceed the largest",
            o.minb, o.maxb
        ));
    }
    let elem = o.dtype.size_in_bytes();
    if o.minb < elem {
        return Err(format!(
            "-b {}: below one {} element ({elem} bytes), so the size measures nothing; give -b {elem} or more",
            o.minb,
            o.dtype.nccl_name()
        ));
    }
    if o.trace && o.plan.is_none() {
        return Err("--trace: traces an execution plan; give --plan FILE".into());
    }
    if o.graph > 0 && o.plan.is_some() {
        // Only launches can be captured: a plan's setup and a traced launch's counter reset
        // must run outside the graph.
        if o.trace {
            return Err(format!(
                "-G {} with --trace: a traced launch zeroes its counts with a synchronous copy, which a CUDA graph capture cannot hold; trace without -G",
                o.graph
            ));
        }
        if o.warmup == 0 {
            return Err(format!(
                "-G {} --plan with -w 0: a plan's first call sets up its context (a collective setup), which a CUDA graph capture cannot hold; give -w 1 or more",
                o.graph
            ));
        }
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

/// A GB/s cell: two decimals as nccl-tests prints them, more below 10 GB/s so that a slow
/// (host backend) figure keeps three significant digits instead of reading `0.00`.
fn bw_cell(v: f64) -> String {
    let decimals = if v >= 10.0 || v <= 0.0 || !v.is_finite() {
        2
    } else {
        // 3 significant digits: 1.23, 0.123, 0.0123, ... (at most 6 decimals).
        (2 - v.log10().floor() as i64).clamp(2, 6) as usize
    };
    format!("{v:.decimals$}")
}

/// Pushes what was printed so far out now (the rows of a long sweep appear as measured).
fn flush_stdout() {
    use std::io::Write;
    // Nothing to do about a closed stdout here: the next println! reports it.
    let _ = std::io::stdout().flush();
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
    /// Seconds the last eager GPU timing spent issuing its calls (0 for other timings).
    host_secs: std::cell::Cell<f64>,
}

#[derive(serde::Serialize, Clone, Copy, Default)]
struct Measure {
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: u64,
    /// Eager GPU timings: the host's time to issue one call (us, mean over the ranks), which
    /// bounds the eager time from below when it exceeds the kernel's; 0 otherwise.
    #[serde(skip)]
    host_us: f64,
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
        self.host_secs.set(0.0);
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
                    let issue = Instant::now();
                    for _ in 0..o.iters {
                        self.call(o, send, recv, count)?;
                    }
                    self.host_secs
                        .set(issue.elapsed().as_secs_f64() / o.iters as f64);
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
        blob.extend(self.host_secs.get().to_le_bytes());
        let all = self.boot.all_gather(&blob).map_err(|e| e.to_string())?;
        let (mut t, mut w, mut h) = (0.0, 0u64, 0.0);
        for x in &all {
            let arr =
                |r: std::ops::Range<usize>| x.get(r).and_then(|s| <[u8; 8]>::try_from(s).ok());
            let (Some(tb), Some(wb), Some(hb)) = (arr(0..8), arr(8..16), arr(16..24)) else {
                return Err("a rank sent a malformed timing".into());
            };
            t += f64::from_le_bytes(tb);
            w += u64::from_le_bytes(wb);
            h += f64::from_le_bytes(hb);
        }
        let secs = t / all.len() as f64;
        let bytes = (elems * o.dtype.size_in_bytes()) as f64;
        let algbw = bytes / secs / 1e9;
        Ok(Measure {
            time_us: secs * 1e6,
            algbw,
            busbw: algbw * o.bus_factor(self.coll.nranks()),
            wrong: w,
            host_us: h / all.len() as f64 * 1e6,
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
        host_secs: std::cell::Cell::new(0.0),
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
        if !gpu {
            println!("# host backend: CPU threads play the GPU; time is wall-clock per call (memory copies between processes on this machine), GB/s with 3 significant digits");
        }
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
    if o.minb < unit {
        return Err(format!(
            "-b {}: below one {} element per rank ({unit} bytes at {n} ranks), so the size measures nothing; give -b {unit} or more",
            o.minb,
            o.dtype.nccl_name()
        ));
    }
    if rank == 0 {
        flush_stdout();
    }
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
                    "{:>12} {:>12} {:>9} {:>7} {:>7} {:>8.2} {:>7} {:>7} {:>6} {:>8.2} {:>7} {:>7} {:>6}  {algo}",
                    bytes, elems, o.dtype.nccl_name(), redop, root, oop.time_us, bw_cell(oop.algbw), bw_cell(oop.busbw), w(&oop), ip.time_us, bw_cell(ip.algbw), bw_cell(ip.busbw), w(&ip)
                );
                // Each row as it is measured, also when stdout is a pipe or a file.
                flush_stdout();
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
    let outcome = run(&o, &placement, boot.clone(), mp.timeout);
    finish(placement.rank, boot.as_ref(), outcome)
}

/// A rank's outcome as sent to the others at the end: `0` passed, `1` wrong values, `2` and
/// the error message.
fn encode_outcome(outcome: &Result<bool, String>) -> Vec<u8> {
    match outcome {
        Ok(true) => vec![0],
        Ok(false) => vec![1],
        Err(e) => [&[2u8][..], e.as_bytes()].concat(),
    }
}

/// The error report of a job from every rank's [`encode_outcome`]: one line per distinct
/// message naming its ranks ("all N ranks" when every rank failed alike); `None` when no rank
/// failed with an error.
fn job_errors(all: &[Vec<u8>]) -> Option<String> {
    let mut distinct: Vec<(String, Vec<usize>)> = Vec::new();
    for (rank, b) in all.iter().enumerate() {
        let msg = match b.split_first() {
            Some((2, m)) => String::from_utf8_lossy(m).into_owned(),
            Some((0 | 1, _)) => continue,
            _ => "sent a malformed outcome".to_string(),
        };
        match distinct.iter_mut().find(|(m, _)| *m == msg) {
            Some((_, ranks)) => ranks.push(rank),
            None => distinct.push((msg, vec![rank])),
        }
    }
    let lines: Vec<String> = distinct
        .into_iter()
        .map(|(msg, ranks)| {
            let who = match ranks.len() {
                n if n == all.len() && n > 1 => format!("all {n} ranks"),
                1 => format!("rank {}", ranks[0]),
                _ => {
                    let r: Vec<String> = ranks.iter().map(usize::to_string).collect();
                    format!("ranks {}", r.join(","))
                }
            };
            format!("coll_perf: {who}: {msg}")
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// Ends the job: every rank's outcome is gathered (this is also the final barrier) and rank 0
/// prints each distinct error once, naming the ranks it came from; a rank that cannot reach
/// the others prints its own. Exit status 1 on every rank when any rank failed.
fn finish(rank: usize, boot: &dyn Bootstrap, outcome: Result<bool, String>) -> i32 {
    let own = match &outcome {
        Ok(true) => 0,
        _ => 1,
    };
    match boot.all_gather(&encode_outcome(&outcome)) {
        Ok(all) => {
            let errors = job_errors(&all);
            if let (0, Some(report)) = (rank, &errors) {
                eprintln!("{report}");
            }
            let any_failed = all.iter().any(|b| b.first() != Some(&0));
            i32::from(any_failed).max(own)
        }
        Err(e) => {
            if let Err(mine) = &outcome {
                eprintln!("coll_perf: rank {rank}: {mine}");
            }
            eprintln!("coll_perf: rank {rank}: collecting the ranks' outcomes: {e}");
            1
        }
    }
}

fn main() {
    std::process::exit(real_main());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn bw_cell_keeps_three_significant_digits_below_ten() {
        assert_eq!(bw_cell(123.456), "123.46");
        assert_eq!(bw_cell(12.345), "12.35");
        assert_eq!(bw_cell(1.2345), "1.23");
        assert_eq!(bw_cell(0.12345), "0.123");
        assert_eq!(bw_cell(0.012345), "0.0123");
        assert_eq!(bw_cell(0.0000012345), "0.000001");
        assert_eq!(bw_cell(0.0), "0.00");
    }

    #[test]
    fn runs_that_measure_nothing_are_refused() {
        for (a, want) in [
            ("-b 3 -e 3 -d float", "below one float element (4 bytes)"),
            ("-b 0 -e 1K", "-b 0: below one float element"),
            ("-n 0", "-n 0: expected at least 1"),
            ("-c 2", "-c `2`: expected 0"),
            (
                "-b 1M -e 1K",
                "the smallest size must not exceed the largest",
            ),
            ("-d fp4", "data type `fp4`"),
        ] {
            let e = parse(&args(a)).expect_err(a);
            assert!(e.contains(want), "{a}: {e:?} must say {want:?}");
        }
    }

    #[test]
    fn accepted_aliases_parse() {
        let o = parse(&args("-b 2 -e 2 -d fp16 -c 0 -n 1")).expect("fp16");
        assert_eq!(o.dtype, DataType::F16);
        assert!(!o.check);
        assert_eq!(o.iters, 1);
    }

    #[test]
    fn errors_are_reported_once_with_their_ranks() {
        let err = |m: &str| encode_outcome(&Err(m.to_string()));
        let ok = encode_outcome(&Ok(true));
        assert_eq!(job_errors(&[ok.clone(), encode_outcome(&Ok(false))]), None);
        assert_eq!(
            job_errors(&[err("bad algo"), err("bad algo"), err("bad algo")]).as_deref(),
            Some("coll_perf: all 3 ranks: bad algo")
        );
        assert_eq!(
            job_errors(&[err("x"), ok.clone(), err("x"), err("y")]).as_deref(),
            Some("coll_perf: ranks 0,2: x\ncoll_perf: rank 3: y")
        );
        assert_eq!(
            job_errors(&[err("x")]).as_deref(),
            Some("coll_perf: rank 0: x")
        );
        assert_eq!(
            job_errors(&[ok, vec![]]).as_deref(),
            Some("coll_perf: rank 1: sent a malformed outcome")
        );
    }

    #[test]
    fn graphs_are_refused_on_the_host_backend() {
        let r = parse(&args("-G 10"));
        if Gpu::NAME == "host" {
            assert!(r
                .expect_err("-G")
                .contains("-G 10: CUDA graphs need a GPU build"));
        } else {
            assert_eq!(r.expect("-G on a GPU build").graph, 10);
        }
    }

    #[test]
    fn plans_in_graph_mode_need_a_warm_up_and_no_trace() {
        let cold = parse(&args("-G 10 -w 0 --plan p.json"));
        let traced = parse(&args("-G 10 -w 5 --plan p.json --trace"));
        let fine = parse(&args("-G 10 -w 5 --plan p.json"));
        if Gpu::NAME == "host" {
            for r in [cold, traced, fine] {
                assert!(r.expect_err("-G").contains("CUDA graphs need a GPU build"));
            }
        } else {
            assert!(cold.expect_err("-w 0").contains("give -w 1 or more"));
            assert!(traced.expect_err("--trace").contains("trace without -G"));
            let o = fine.expect("-G with a plan and a warm-up");
            assert_eq!((o.graph, o.warmup), (10, 5));
        }
    }
}
