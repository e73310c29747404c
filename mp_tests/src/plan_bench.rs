//! `coll_perf --plan FILE`: runs an execution plan through the executor (LL16 packets), each
//! size timed and checked like the native collectives and printed next to the native algorithm
//! of the same call (same collective, in/out-of-place and size); `--plan FILE --check` only
//! validates the plan. A child module of coll_perf (it reuses its `Bench`).

use super::*;
use mscclpp::executor::{ExecutionPlan, Executor, ExecutorConfig, PacketType};

/// The executor and plan of a `--plan` run.
pub(crate) struct PlanRun {
    exec: Executor,
    plan: ExecutionPlan,
    rank: usize,
}

impl PlanRun {
    pub(crate) fn new(
        path: &str,
        comm: Arc<Communicator>,
        rank: usize,
        timeout: Duration,
    ) -> Result<PlanRun, String> {
        let plan = ExecutionPlan::from_file(path, rank).map_err(|e| e.to_string())?;
        let cfg = ExecutorConfig {
            timeout,
            ..Default::default()
        };
        let exec = Executor::with_config(comm, cfg).map_err(|e| e.to_string())?;
        Ok(PlanRun { exec, plan, rank })
    }

    /// One execution on `count` elements per rank (all-gather: the per-rank part).
    pub(crate) fn call(
        &self,
        o: &Opts,
        n: usize,
        send: u64,
        recv: u64,
        count: usize,
        stream: u64,
    ) -> Result<(), String> {
        let es = o.dtype.size_in_bytes();
        let send_size = count * es;
        let recv_size = match o.kind {
            CollectiveKind::AllGather => count * n * es,
            _ => count * es,
        };
        // SAFETY: the addresses lie inside coll_perf's buffers (sized for the largest call),
        // alive for the benchmark; every launch is synchronised before the buffers are reused.
        unsafe {
            self.exec.execute(
                self.rank,
                send,
                recv,
                send_size,
                recv_size,
                o.dtype,
                &self.plan,
                stream,
                PacketType::LL16,
            )
        }
        .map_err(|e| e.to_string())
    }
}

/// `--plan FILE --check`: parses and validates every rank's part; prints a summary.
pub(crate) fn check_only(path: &str) -> i32 {
    let first = match ExecutionPlan::from_file(path, 0) {
        Ok(p) => p,
        Err(e) => {
            println!("FAIL {path}: {e}");
            return 1;
        }
    };
    let mut blocks = Vec::new();
    for r in 0..first.world_size() {
        match ExecutionPlan::from_file(path, r) {
            Ok(p) => blocks.push(p.num_threadblocks()),
            Err(e) => {
                println!("FAIL {path}: {e}");
                return 1;
            }
        }
    }
    println!(
        "ok   {path}: {} `{}` {} for {} ranks ({}), thread blocks per rank {blocks:?}, {} threads per block, message sizes {}..={} bytes in multiples of {} (send buffer)",
        first.collective(),
        first.name(),
        first.protocol(),
        first.world_size(),
        if first.is_in_place() { "in place" } else { "out of place" },
        first.num_threads_per_block(),
        first.min_message_size(),
        first.max_message_size(),
        first.input_granularity(),
    );
    0
}

#[derive(serde::Serialize)]
struct PlanRow {
    collective: String,
    size: usize,
    count: usize,
    dtype: String,
    plan: String,
    in_place: bool,
    nranks: usize,
    executor: Measure,
    native: Option<Measure>,
    native_algorithm: String,
}

/// `--trace`: one more measurement of the plan at `elems` with tracing on; this rank's trace
/// as text (every rank reads its own: the read is local). Tracing is on only here, and the
/// read zeroes the counts, so nothing counted earlier is in it.
fn trace_size(
    pr: &PlanRun,
    bench: &Bench,
    o: &Opts,
    elems: usize,
    in_place: bool,
    call: u32,
) -> Result<String, String> {
    pr.exec.set_trace(true);
    let m = bench.measure(o, elems, in_place, call);
    pr.exec.set_trace(false);
    m?;
    let traces = pr.exec.take_trace().map_err(|e| e.to_string())?;
    Ok(traces.iter().map(|t| t.to_string()).collect())
}

/// Runs the sizes of `o` with the plan and with the native algorithm; true if all values were
/// right.
pub(crate) fn report(o: &Opts, bench: &Bench) -> Result<bool, String> {
    let Some(pr) = &bench.plan else {
        return Err("report without a plan".into());
    };
    let plan = &pr.plan;
    let kind = match plan.collective() {
        "allreduce" => CollectiveKind::AllReduce,
        "allgather" => CollectiveKind::AllGather,
        other => {
            return Err(format!(
                "plan `{}` is a {other}: coll_perf runs allreduce and allgather plans",
                plan.name()
            ))
        }
    };
    let (n, rank) = (bench.coll.nranks(), bench.coll.rank());
    if plan.world_size() != n {
        return Err(format!(
            "plan `{}` is for {} ranks, this run has {n}",
            plan.name(),
            plan.world_size()
        ));
    }
    let mut oo = o.clone();
    oo.kind = kind;
    let in_place = plan.is_in_place();
    let unit = plan.input_granularity() as usize;
    let es = o.dtype.size_in_bytes();
    if rank == 0 {
        println!(
            "# coll_perf --plan {} ({} {}, {}): nranks {n} ({} backend) dtype {} iters {} warmup {} check {}",
            plan.path().map_or(plan.name().into(), |p| p.display().to_string()),
            plan.collective(),
            plan.protocol(),
            if in_place { "in place" } else { "out of place" },
            Gpu::NAME,
            o.dtype,
            o.iters,
            o.warmup,
            o.check as u8
        );
        println!("#{:>48}{:>34}{:>34}", "executor (plan)", "native", "");
        println!(
            "#{:>11} {:>12} {:>9} {:>8} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7} {:>6}  native algorithm",
            "size", "count", "type", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
        );
        println!(
            "#{:>11} {:>12} {:>9} {:>8} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7} {:>6}",
            "(B)", "(elements)", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
    }
    let mut rows = Vec::new();
    let (mut size, mut call, mut wrong) = (o.minb, 0u32, 0u64);
    loop {
        // Sizes are nccl-tests' totals: the send buffer (all-reduce) or the gathered buffer.
        let per = if kind == CollectiveKind::AllGather {
            size / n
        } else {
            size
        } / unit
            * unit;
        let bytes = if kind == CollectiveKind::AllGather {
            per * n
        } else {
            per
        };
        // The plan's range is over the send size (all-gather: the gathered size), as upstream.
        let ranged = if kind == CollectiveKind::AllGather {
            bytes
        } else {
            per
        } as u64;
        let in_range = (plan.min_message_size()..=plan.max_message_size()).contains(&ranged);
        if per > 0 && per.is_multiple_of(es) && in_range {
            let elems = bytes / es;
            call += 1;
            bench.use_plan.set(true);
            let ex = bench.measure(&oo, elems, in_place, call);
            // The traced run is one more measurement, kept out of the timed one's figures.
            let traced = match (&ex, o.trace) {
                (Ok(_), true) => Some(trace_size(pr, bench, &oo, elems, in_place, call)),
                _ => None,
            };
            bench.use_plan.set(false);
            pr.exec.reset();
            let ex = ex?;
            if let (Some(t), 0) = (traced.transpose()?, rank) {
                for l in t.lines() {
                    println!("#   {l}");
                }
            }
            // The native side only when the collectives have an algorithm for this call (the
            // selector answers the same on every rank, so all skip together).
            let (nat, algo) = match bench.coll.algorithm_for(kind, per) {
                Ok(a) => (
                    Some(bench.measure(&oo, elems, in_place, call)?),
                    a.to_string(),
                ),
                Err(e) => (None, format!("none ({e})")),
            };
            let nat_m = nat.unwrap_or_default();
            wrong += ex.wrong + nat_m.wrong;
            if rank == 0 {
                let w = |m: &Measure| o.wrong_cell(m);
                let native = match &nat {
                    Some(m) => format!(
                        "{:>8.2} {:>7.2} {:>7.2} {:>6}",
                        m.time_us,
                        m.algbw,
                        m.busbw,
                        w(m)
                    ),
                    None => format!("{:>8} {:>7} {:>7} {:>6}", "N/A", "N/A", "N/A", "N/A"),
                };
                println!(
                    "{:>12} {:>12} {:>9} {:>8.2} {:>7.2} {:>7.2} {:>6} {native}  {algo}",
                    bytes,
                    elems,
                    o.dtype.nccl_name(),
                    ex.time_us,
                    ex.algbw,
                    ex.busbw,
                    w(&ex)
                );
                // Eager GPU timings: how long the host took to issue a call, plan and native
                // (an eager time near it is the host's, not the kernel's).
                if ex.host_us > 0.0 {
                    println!(
                        "#   host issue us per call: plan {:.2} native {}",
                        ex.host_us,
                        nat.map_or("N/A".into(), |m| format!("{:.2}", m.host_us))
                    );
                }
            }
            rows.push(PlanRow {
                collective: kind.name().into(),
                size: bytes,
                count: elems,
                dtype: o.dtype.nccl_name().into(),
                plan: plan.name().into(),
                in_place,
                nranks: n,
                executor: ex,
                native: nat,
                native_algorithm: algo,
            });
        } else if rank == 0 {
            println!("# {size} bytes: skipped (the plan takes multiples of {unit} send bytes within {}..={})", plan.min_message_size(), plan.max_message_size());
        }
        match o.next_size(size) {
            Some(next) => size = next,
            None => break,
        }
    }
    if rank == 0 {
        print_out_of_bounds(wrong);
        if let Some(path) = &o.json {
            write_json(path, &rows)?;
        }
    }
    Ok(wrong == 0)
}
