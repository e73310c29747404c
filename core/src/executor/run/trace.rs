//! Where an execution's time goes, op by op ([`Executor::set_trace`](super::Executor::set_trace)):
//! while tracing is on, every launch adds, per GPU block (per thread block on the host), its
//! time from start to end, its prologue (the block's ops copied to shared memory) and each
//! op's time and runs to counters in device memory (`ExecArgs.trace`; the words are laid out
//! in kernels/cuda/include/mscclpp/executor_device.hpp). The counters are per (plan, buffers,
//! message size); [`Executor::take_trace`](super::Executor::take_trace) reads and drops them.
//!
//! On a GPU the times are thread 0's cycles of the SM's clock, turned into microseconds by the
//! block's own ratio of wall-clock nanoseconds (`%globaltimer`, whose resolution may be as
//! coarse as a microsecond: the ratio wants many launches) to cycles over whole launches; on
//! the host backend both are nanoseconds. An op's time is thread 0's: it ends when thread 0
//! leaves the op, so waiting for the block's other threads shows in the next `nop` or lane
//! barrier, and a wait shows how long the peer took to signal.

use std::fmt;

use crate::error::Result;
use crate::executor::json::OpName;
use crate::executor::lower::device::{ExecBlock, TRACE_HEADER_WORDS, TRACE_WORDS};
use crate::executor::lower::plan_op;
use crate::gpu_buffer::GpuBuffer;

/// One op's counters in one GPU block.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTrace {
    /// Its index in the block's lowered op list.
    pub index: usize,
    /// Its plan name (`signal`, `rre`, `ppkt`, ...).
    pub name: &'static str,
    /// Cycles (GPU) or nanoseconds (host) spent in it, over every launch.
    pub cycles: u64,
    /// Times it ran, over every launch (a pipeline's body ops once per step).
    pub runs: u64,
}

/// The counters of one GPU block (lane `lane` of plan thread block `block`).
#[derive(Clone, Debug, PartialEq)]
pub struct BlockTrace {
    /// The plan's thread block.
    pub block: u32,
    /// Which of the block's GPU blocks (0 on the host and for one-lane launches).
    pub lane: u32,
    /// Launches counted.
    pub launches: u64,
    /// Cycles from the block's start to its end, over every launch.
    pub cycles: u64,
    /// Wall-clock nanoseconds of the same (0 where the GPU has no wall clock to read).
    pub ns: u64,
    /// Cycles of the prologue (ops copied to shared memory), over every launch.
    pub prologue_cycles: u64,
    /// Wall-clock nanoseconds from the end of each launch to the start of the next, summed
    /// over the gaps shorter than 1 ms (launches issued back to back: the block idle for the
    /// host's per-call time and the launch latency); 0 without a wall clock.
    pub idle_ns: u64,
    /// How many gaps `idle_ns` sums.
    pub idle_gaps: u64,
    /// The shortest gap between two launches in nanoseconds, if there were two.
    pub min_idle_ns: Option<u64>,
    /// The ops that ran, in list order.
    pub ops: Vec<OpTrace>,
}

impl BlockTrace {
    /// Nanoseconds per counted cycle (1 on the host), if the block has a wall-clock total.
    pub fn ns_per_cycle(&self) -> Option<f64> {
        (self.ns > 0 && self.cycles > 0).then(|| self.ns as f64 / self.cycles as f64)
    }

    /// Microseconds idle between two launches issued back to back, on average (see
    /// `idle_ns`), if there were such and a wall clock.
    pub fn idle_us(&self) -> Option<f64> {
        (self.idle_gaps > 0 && self.ns > 0)
            .then(|| self.idle_ns as f64 / self.idle_gaps as f64 / 1000.0)
    }

    /// Microseconds per launch of `cycles` counted over every launch (cycles per launch where
    /// the block has no wall clock).
    pub fn per_launch_us(&self, cycles: u64) -> f64 {
        let per = cycles as f64 / self.launches.max(1) as f64;
        match self.ns_per_cycle() {
            Some(r) => per * r / 1000.0,
            None => per,
        }
    }
}

/// The counters of one (plan, buffers, message size).
#[derive(Clone, Debug, PartialEq)]
pub struct PlanTrace {
    /// The plan's name.
    pub plan: String,
    /// Send and receive bytes of the executions counted.
    pub send_size: u64,
    /// See `send_size`.
    pub recv_size: u64,
    /// GPU blocks per plan thread block of the last launch (1 on the host).
    pub lanes: u32,
    /// Every GPU block that ran, plan block by plan block, lane by lane.
    pub blocks: Vec<BlockTrace>,
}

/// Reads the counters of `blocks` launched with `lanes` lanes from `buf` (words laid out as
/// the kernel writes them).
pub(super) fn read(
    plan: &str,
    sizes: (u64, u64),
    blocks: &[Box<ExecBlock>],
    lanes: u32,
    buf: &GpuBuffer<u64>,
) -> Result<PlanTrace> {
    let words = buf.to_vec()?;
    let lanes = lanes.max(1);
    let mut out = Vec::new();
    for (b, blk) in blocks.iter().enumerate() {
        for lane in 0..lanes {
            let at = (b * lanes as usize + lane as usize) * TRACE_WORDS;
            let Some(w) = words.get(at..at + TRACE_WORDS) else {
                break;
            };
            if w[0] == 0 {
                continue;
            }
            let n = (blk.n_ops as usize).min((TRACE_WORDS - TRACE_HEADER_WORDS) / 2);
            let ops = (0..n)
                .filter_map(|i| {
                    let (cycles, runs) = (
                        w[TRACE_HEADER_WORDS + 2 * i],
                        w[TRACE_HEADER_WORDS + 2 * i + 1],
                    );
                    (runs > 0).then(|| OpTrace {
                        index: i,
                        name: plan_op(blk.ops[i].op_type).map_or("?", OpName::name),
                        cycles,
                        runs,
                    })
                })
                .collect();
            out.push(BlockTrace {
                block: b as u32,
                lane,
                launches: w[0],
                cycles: w[1],
                ns: w[2],
                prologue_cycles: w[3],
                idle_ns: w[4],
                idle_gaps: w[5],
                min_idle_ns: w[7].checked_sub(1),
                ops,
            });
        }
    }
    Ok(PlanTrace {
        plan: plan.to_string(),
        send_size: sizes.0,
        recv_size: sizes.1,
        lanes,
        blocks: out,
    })
}

impl fmt::Display for PlanTrace {
    /// A table per plan thread block (its lane 0; with several lanes, the slowest lane's time
    /// of each op next to it): us per launch of the whole block, the prologue and each op.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "trace of `{}`, send {} B, recv {} B, {} lane(s) per block:",
            self.plan, self.send_size, self.recv_size, self.lanes
        )?;
        for b in self.blocks.iter().filter(|b| b.lane == 0) {
            let lanes: Vec<&BlockTrace> =
                self.blocks.iter().filter(|o| o.block == b.block).collect();
            let unit = if b.ns_per_cycle().is_some() {
                "us"
            } else {
                "cycles"
            };
            let idle = match (b.idle_us(), b.min_idle_ns) {
                (Some(us), Some(least)) => format!(
                    ", idle between launches {us:.2} us (least {:.2})",
                    least as f64 / 1000.0
                ),
                _ => String::new(),
            };
            writeln!(
                f,
                "  block {}: {} launch(es), {:.2} {unit} per launch, prologue {:.2}{idle}",
                b.block,
                b.launches,
                b.per_launch_us(b.cycles),
                b.per_launch_us(b.prologue_cycles)
            )?;
            writeln!(
                f,
                "  {:>4} {:<12} {:>10} {:>12} {:>14}",
                "op",
                "name",
                "runs/launch",
                format!("{unit}/launch"),
                "slowest lane"
            )?;
            for o in &b.ops {
                let slowest = lanes
                    .iter()
                    .filter_map(|l| {
                        l.ops
                            .iter()
                            .find(|x| x.index == o.index)
                            .map(|x| l.per_launch_us(x.cycles))
                    })
                    .fold(0.0f64, f64::max);
                writeln!(
                    f,
                    "  {:>4} {:<12} {:>10.1} {:>12.2} {:>14.2}",
                    o.index,
                    o.name,
                    o.runs as f64 / b.launches.max(1) as f64,
                    b.per_launch_us(o.cycles),
                    slowest
                )?;
            }
        }
        Ok(())
    }
}
