//! `mscclpp._mscclpp.PointToPoint`: sends and receives between ranks in batches (one batch =
//! one NCCL group: its operations progress together, one kernel launch on GPUs), over the
//! library's [`mscclpp::p2p::PointToPoint`]. The Python side (`CommGroup.send`/`recv`,
//! `CommGroup.group()`) batches the calls.

use mscclpp::p2p::{Dir, P2pOp, PointToPoint as P2p};
use mscclpp::Device;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::buffer::{check_device, extract, ordinal, Buf};
use crate::comm::Communicator;
use crate::error::{invalid, ResultExt};

/// The point-to-point links of one rank (collective to create: every rank of `comm` does, each
/// with its own device). `run` takes a batch of `(kind, peer, buffer)` operations, `kind`
/// `"send"` or `"recv"`: a send's whole buffer goes to `peer`, whose matching receive
/// (messages of one pair and direction match in call order) must be the same size. Buffers
/// as for the collectives (NumPy arrays on the host backend; torch tensors, CuPy arrays,
/// `RawGpuBuffer`s, DLPack objects on GPUs), any element type.
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct PointToPoint {
    inner: P2p,
}

#[pymethods]
impl PointToPoint {
    /// Sets up the links of `comm` on `device` (GPU builds: default the current GPU; ignored
    /// on the host backend). `timeout`: seconds a batch may make no progress before it fails
    /// (default 120).
    #[new]
    #[pyo3(signature = (comm, *, device=None, timeout=None))]
    fn new(
        py: Python<'_>,
        comm: &Communicator,
        device: Option<i32>,
        timeout: Option<f64>,
    ) -> PyResult<Self> {
        crate::require_gpu("PointToPoint")?;
        let dev = match device {
            Some(d) if d < 0 => {
                return Err(invalid(format!("device {d}: expected a GPU ordinal >= 0")))
            }
            Some(d) if crate::backend() != "host" => Device::gpu(d),
            _ => crate::exec::default_device(),
        };
        let timeout = timeout
            .map(|t| crate::coll::secs("timeout", t))
            .transpose()?;
        let comm = comm.inner().clone();
        let mut inner = py
            .detach(move || P2p::new(comm, dev))
            .py_ctx("setting up point-to-point")?;
        if let Some(t) = timeout {
            inner.set_timeout(t);
        }
        Ok(PointToPoint { inner })
    }

    /// The GPU the batches run on, -1 on the host backend.
    #[getter]
    fn device(&self) -> i32 {
        ordinal(self.inner.device())
    }

    /// Whether batches may name `peer` (GPU builds: ranks of this node; host: every rank).
    fn reaches(&self, peer: usize) -> bool {
        self.inner.reaches(peer)
    }

    /// GPU builds: raises the error a batch's kernel recorded (a stall past the timeout, a
    /// size mismatch), without waiting for the GPU; nothing on the host backend, whose
    /// batches raise their errors themselves.
    fn check(&self) -> PyResult<()> {
        self.inner.device_error().py()
    }

    /// Runs one batch of `(kind, peer, buffer)` operations (`kind`: `"send"` or `"recv"`):
    /// they progress together, so matched sends and receives complete in any order. GPU
    /// builds: one launch on `stream` (default: the first buffer's current torch/CuPy stream,
    /// else 0), asynchronous, safe under CUDA graph capture; host backend: done on return.
    #[pyo3(signature = (ops, *, stream=None))]
    fn run(&self, py: Python<'_>, ops: Vec<Bound<'_, PyAny>>, stream: Option<u64>) -> PyResult<()> {
        let n = self.inner.nranks();
        let mut bufs: Vec<Buf> = Vec::with_capacity(ops.len());
        let mut p2p_ops = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let (kind, peer, obj): (String, i64, Bound<'_, PyAny>) =
                op.extract().map_err(|_| {
                    PyTypeError::new_err(format!(
                        "point-to-point op {i}: {}: expected a (\"send\" or \"recv\", peer, buffer) tuple",
                        op.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                    ))
                })?;
            let dir = match kind.as_str() {
                "send" => Dir::Send,
                "recv" => Dir::Recv,
                _ => {
                    return Err(invalid(format!(
                        "point-to-point op {i}: kind {kind:?}: expected \"send\" or \"recv\""
                    )))
                }
            };
            let peer = usize::try_from(peer)
                .ok()
                .filter(|p| *p < n)
                .ok_or_else(|| {
                    invalid(format!(
                        "{kind} op {i}: peer {peer}: expected a rank in 0..{n}"
                    ))
                })?;
            if !self.inner.reaches(peer) {
                return Err(invalid(format!(
                    "{kind} op {i}: peer {peer} is on another node: point-to-point on GPU builds \
                     reaches only the ranks of this node"
                )));
            }
            let role = if dir == Dir::Send { "send" } else { "recv" };
            let b = extract(&obj, role, dir == Dir::Recv)?;
            check_device(self.inner.device(), kind.as_str(), role, &b)?;
            p2p_ops.push(P2pOp::new(dir, peer, b.ptr, b.nbytes));
            bufs.push(b);
        }
        let stream = stream
            .or_else(|| bufs.iter().find_map(|b| b.stream))
            .unwrap_or(0);
        let inner = &self.inner;
        // SAFETY: every buffer was checked for its device and holds `nbytes` (readable; the
        // receives writable); `bufs` keeps their exports alive until this returns (host: the
        // batch is done then; GPU: keeping them alive until the stream ran it is the caller's
        // contract, as with NCCL).
        let r = py.detach(|| unsafe { inner.run(&p2p_ops, stream as _) });
        drop(bufs);
        r.py_ctx("point-to-point")
    }

    fn __repr__(&self) -> String {
        format!(
            "PointToPoint(rank={}, nranks={}, device={})",
            self.inner.rank(),
            self.inner.nranks(),
            self.device()
        )
    }
}
