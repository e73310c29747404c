//! `mscclpp.Collectives`: all-reduce, all-gather, reduce-scatter and broadcast of one
//! communicator on caller buffers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mscclpp::collectives::{
    Call, CollectiveKind, Collectives as Coll, CollectivesConfig, DataType, ReduceOp,
};
use mscclpp::Device;
use pyo3::prelude::*;

use crate::buffer::{dtype_name, extract, parse_dtype, Buf};
use crate::comm::Communicator;
use crate::error::{invalid, ResultExt};

/// The collectives of one communicator (the library's `Collectives`), the native base of
/// `mscclpp.Collectives` (whose `all_reduce`, `all_gather`, `reduce_scatter` and `broadcast`
/// call `collective`): every rank creates it and then makes the same calls in the same
/// order. Buffers are NumPy arrays (host backend),
/// torch tensors, CuPy arrays, `RawGpuBuffer`s or `BufferRef`s; on GPU builds the calls are
/// asynchronous on `stream` (default: the tensor's current torch/CuPy stream, else 0).
#[pyclass(module = "mscclpp._mscclpp", frozen, subclass)]
pub struct Collectives {
    inner: Arc<Coll>,
    device: Device,
}

fn kind_of(name: &str) -> PyResult<CollectiveKind> {
    name.parse::<CollectiveKind>().py()
}

fn op_of(name: &str) -> PyResult<ReduceOp> {
    name.parse::<ReduceOp>().py()
}

pub(crate) fn secs(name: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| invalid(format!("{name} {s}: expected a positive number of seconds")))
}

/// The element type of a call: `dtype` when given, else the send buffer's (which must match
/// the receive buffer's when both are known).
fn call_dtype(
    what: &str,
    dtype: Option<&str>,
    send: &Buf,
    recv: Option<&Buf>,
) -> PyResult<DataType> {
    if let Some(d) = dtype {
        return parse_dtype(d);
    }
    let s = send.dtype.ok_or_else(|| {
        invalid(format!(
            "{what}: send ({}) has no element type: pass dtype= (e.g. dtype=\"float32\")",
            send.kind
        ))
    })?;
    if let Some(r) = recv {
        match r.dtype {
            Some(t) if t != s => {
                return Err(invalid(format!(
                    "{what}: send is {} but recv is {}: expected the same element type",
                    dtype_name(s),
                    dtype_name(t)
                )))
            }
            _ => {}
        }
    }
    Ok(s)
}

/// The Python name of a collective's method, for messages.
fn call_name(kind: CollectiveKind) -> &'static str {
    match kind {
        CollectiveKind::AllReduce => "all_reduce",
        CollectiveKind::AllGather => "all_gather",
        CollectiveKind::ReduceScatter => "reduce_scatter",
        CollectiveKind::Broadcast => "broadcast",
    }
}

/// `total / n`, refusing a `total` that is not a multiple of `n` (the ranks' blocks).
fn whole_blocks(
    what: &str,
    role: &str,
    b: &Buf,
    total: usize,
    n: usize,
    dt: DataType,
) -> PyResult<usize> {
    if !total.is_multiple_of(n) {
        return Err(invalid(format!(
            "{what}: {role} ({}) holds {total} {} elements: expected a multiple of nranks ({n})",
            b.kind,
            dtype_name(dt)
        )));
    }
    Ok(total / n)
}

impl Collectives {
    /// Checks that `b` lives where this communicator's collectives run.
    fn check_device(&self, what: &str, role: &str, b: &Buf) -> PyResult<()> {
        crate::buffer::check_device(self.device, what, role, b)
    }

    /// Chooses (by `algorithm` when given) and runs `call` with the GIL released.
    fn run(
        &self,
        py: Python<'_>,
        call: Call,
        algorithm: Option<&str>,
        stream: Option<u64>,
        bufs: &[&Buf],
    ) -> PyResult<()> {
        let what = call_name(call.kind);
        // Every buffer inside one of `register_buffer`'s: the zero-copy algorithms are
        // preferred (as for NCCL's registered buffers).
        let registered = bufs
            .iter()
            .all(|b| self.inner.is_registered_buffer(b.ptr, b.nbytes));
        let choice = match algorithm {
            Some(name) => self.inner.choose_named(&call, name),
            None if registered => self.inner.choose_registered(&call),
            None => self.inner.choose(&call),
        }
        .py_ctx(what)?;
        let stream = stream
            .or_else(|| bufs.iter().find_map(|b| b.stream))
            .unwrap_or(0);
        let coll = self.inner.clone();
        // SAFETY: the buffers were checked for the call's sizes and device; `bufs` (and the
        // Python objects behind them) stay alive until this returns; on the host backend the
        // call is complete when it returns, on GPUs keeping them alive until the stream ran
        // the call is the caller's contract (as with NCCL).
        py.detach(move || unsafe { coll.run_choice(&choice, stream) })
            .py_ctx(what)
    }

    fn buffers<'py>(
        &self,
        what: &str,
        send: &Bound<'py, PyAny>,
        recv: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Buf, Option<Buf>)> {
        let in_place = recv.is_none();
        let s = extract(send, "send", in_place)?;
        self.check_device(what, "send", &s)?;
        let r = recv.map(|r| extract(r, "recv", true)).transpose()?;
        if let Some(r) = &r {
            self.check_device(what, "recv", r)?;
        }
        Ok((s, r))
    }
}

#[pymethods]
impl Collectives {
    /// Sets up the collectives of `comm` (collective: every rank calls it). `device`: the GPU
    /// (default: `(rank % nranks_per_node) % device_count`; ignored on the host backend);
    /// `ll_half_bytes`/`plain_bytes`: the scratch sizes (default 8 MiB / 32 MiB);
    /// `host_timeout`: seconds a host-backend rank waits for its peers (default 60);
    /// `plan_dir`: where execution plans are looked up (default `MSCCLPP_CACHE_DIR`, else
    /// `~/.cache/mscclpp`); `plans=False` reads none.
    #[new]
    #[pyo3(signature = (comm, *, device=None, ll_half_bytes=None, plain_bytes=None, host_timeout=None, host_blocks=None, plan_dir=None, plans=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        comm: &Communicator,
        device: Option<i32>,
        ll_half_bytes: Option<usize>,
        plain_bytes: Option<usize>,
        host_timeout: Option<f64>,
        host_blocks: Option<usize>,
        plan_dir: Option<PathBuf>,
        plans: bool,
    ) -> PyResult<Self> {
        crate::require_gpu("Collectives")?;
        let mut cfg = CollectivesConfig::default();
        if let Some(d) = device {
            if d < 0 {
                return Err(invalid(format!("device {d}: expected a GPU ordinal >= 0")));
            }
            if crate::backend() != "host" {
                cfg.device = Some(Device::gpu(d));
            }
        }
        if let Some(b) = ll_half_bytes {
            cfg.ll_half_bytes = b;
        }
        if let Some(b) = plain_bytes {
            cfg.plain_bytes = b;
        }
        if let Some(t) = host_timeout {
            cfg.host_timeout = secs("host_timeout", t)?;
        }
        if let Some(b) = host_blocks {
            cfg.host_blocks = b;
        }
        let mut builder = Coll::builder(comm.inner().clone()).config(cfg);
        if let Some(dir) = plan_dir {
            builder = builder.plan_dir(dir);
        }
        if !plans {
            builder = builder.without_plans();
        }
        let inner = py
            .detach(move || builder.build())
            .py_ctx("setting up the collectives")?;
        let device = inner.resources().device();
        Ok(Collectives {
            inner: Arc::new(inner),
            device,
        })
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// The number of ranks.
    #[getter]
    fn nranks(&self) -> usize {
        self.inner.nranks()
    }

    /// The GPU the collectives run on, -1 on the host backend.
    #[getter]
    fn device(&self) -> i32 {
        crate::buffer::ordinal(self.device)
    }

    /// The names of the algorithms of `collective` (`"allreduce"`, `"allgather"`,
    /// `"reducescatter"`, `"broadcast"`), plans included.
    fn algorithm_names(&self, collective: &str) -> PyResult<Vec<&'static str>> {
        Ok(self.inner.algorithm_names(kind_of(collective)?))
    }

    /// The algorithm the default choice (or a forced one) takes for `nbytes` of `collective`.
    fn algorithm_for(&self, collective: &str, nbytes: usize) -> PyResult<&'static str> {
        self.inner.algorithm_for(kind_of(collective)?, nbytes).py()
    }

    /// The last calls of this communicator (at most 64), oldest first, as dicts: `seq`,
    /// `collective`, `count`, `dtype`, `op`, `root`, `algorithm`, `state` (`"running"`,
    /// `"done"`, `"failed"`): the flight recorder (core/src/collectives/recorder.rs).
    fn recent_calls<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, pyo3::types::PyDict>>> {
        self.inner
            .recent_calls()
            .into_iter()
            .map(|c| {
                let d = pyo3::types::PyDict::new(py);
                d.set_item("seq", c.call.seq)?;
                d.set_item("collective", c.call.kind.to_string())?;
                d.set_item("count", c.call.count)?;
                d.set_item("dtype", c.call.dtype.to_string())?;
                d.set_item("op", c.call.op.to_string())?;
                d.set_item("root", c.call.root)?;
                d.set_item("algorithm", c.algorithm)?;
                d.set_item("state", c.state.name())?;
                Ok(d)
            })
            .collect()
    }

    /// Forces `name` for every later call of `collective` on this rank (`None` un-forces);
    /// every rank must do the same.
    #[pyo3(signature = (collective, name))]
    fn force_algorithm(&self, collective: &str, name: Option<&str>) -> PyResult<()> {
        self.inner.force_algorithm(kind_of(collective)?, name).py()
    }

    /// Runs one collective (`"allreduce"`, `"allgather"`, `"reducescatter"`,
    /// `"broadcast"`); `mscclpp.Collectives.all_reduce` and its siblings call it. `recv`
    /// None is in place. Sizes, by `n` elements of `send`:
    /// all-reduce and broadcast: `recv` holds at least n; all-gather: `recv` at least
    /// nranks x n (in place: `send` is the whole buffer, this rank's block at rank x n / nranks);
    /// reduce-scatter: n is a multiple of nranks, `recv` holds at least n / nranks (in place:
    /// the result lands in this rank's block of `send`). `op`: sum, prod, min, max, avg;
    /// `root`: broadcast's; `dtype` overrides the buffers' element type; `algorithm` names the
    /// algorithm for this call; `stream`: the GPU stream (default: the tensor's current one,
    /// else 0).
    /// Registers `buffer` (a `RawGpuBuffer`, a torch tensor, a CuPy or NumPy array) for the
    /// zero-copy algorithms, as `ncclCommRegister` does: later calls whose buffers all lie
    /// inside registered ones prefer them (all-reduce above 1 MiB, all-gather, reduce-scatter
    /// and broadcast above 256 KiB per rank). Local (no traffic): every rank registers its
    /// corresponding buffers alike, in the same order. The memory is mapped by the peers at
    /// the next such call; memory they cannot map (e.g. NumPy's own on the host backend) makes
    /// every rank copy instead, alike. Call `deregister_buffer` before freeing it.
    fn register_buffer(&self, buffer: &Bound<'_, PyAny>) -> PyResult<()> {
        let b = extract(buffer, "buffer", false)?;
        self.check_device("register_buffer", "buffer", &b)?;
        self.inner.register_buffer(b.ptr, b.nbytes);
        Ok(())
    }

    /// Takes back `register_buffer(buffer)` and unmaps the peers' copies of it (every rank
    /// alike, before the memory is freed).
    fn deregister_buffer(&self, buffer: &Bound<'_, PyAny>) -> PyResult<()> {
        let b = extract(buffer, "buffer", false)?;
        self.inner.deregister_buffer(b.ptr, b.nbytes);
        Ok(())
    }

    #[pyo3(signature = (collective, send, recv=None, *, op="sum", root=0, dtype=None, algorithm=None, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        py: Python<'_>,
        collective: &str,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        op: &str,
        root: usize,
        dtype: Option<&str>,
        algorithm: Option<&str>,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let kind = kind_of(collective)?;
        let w = call_name(kind);
        let op = op_of(op)?;
        let (n, rank) = (self.inner.nranks(), self.inner.rank());
        if kind == CollectiveKind::Broadcast && root >= n {
            return Err(invalid(format!(
                "{w}: root {root}: expected a rank below nranks ({n})"
            )));
        }
        let (s, r) = self.buffers(w, send, recv)?;
        let dt = call_dtype(w, dtype, &s, r.as_ref())?;
        let out = r.as_ref().unwrap_or(&s);
        let total = s.count("send", dt)?;
        let block = |count: usize| rank as u64 * count as u64 * dt.size_in_bytes() as u64;
        // (count of the call, send address, recv address, elements recv must hold)
        let (count, send_ptr, recv_ptr, need) = match (kind, r.is_some()) {
            (CollectiveKind::AllGather, true) => (total, s.ptr, out.ptr, total.saturating_mul(n)),
            (CollectiveKind::AllGather, false) => {
                let count = whole_blocks(w, "send", &s, total, n, dt)?;
                (count, s.ptr + block(count), s.ptr, total)
            }
            (CollectiveKind::ReduceScatter, has_recv) => {
                let count = whole_blocks(w, "send", &s, total, n, dt)?;
                let recv_ptr = if has_recv {
                    out.ptr
                } else {
                    s.ptr + block(count)
                };
                (count, s.ptr, recv_ptr, if has_recv { count } else { total })
            }
            _ => (total, s.ptr, out.ptr, total),
        };
        let have = out.count("recv", dt)?;
        if have < need {
            return Err(invalid(format!(
                "{w}: recv ({}) holds {have} {} elements: expected at least {need} ({})",
                out.kind,
                dtype_name(dt),
                match kind {
                    CollectiveKind::AllGather => "nranks x send's elements",
                    CollectiveKind::ReduceScatter => "send's elements / nranks",
                    _ => "send's elements",
                }
            )));
        }
        let call = Call {
            kind,
            send: send_ptr,
            recv: recv_ptr,
            count,
            dtype: dt,
            op,
            root,
        };
        self.run(py, call, algorithm, stream, &[&s, out])
    }

    fn __repr__(&self) -> String {
        format!(
            "Collectives(rank={}, nranks={}, device={})",
            self.inner.rank(),
            self.inner.nranks(),
            self.device()
        )
    }
}
