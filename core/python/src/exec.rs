//! `mscclpp.RawGpuBuffer` (communication memory this library allocates), and the executor of
//! JSON execution plans (`mscclpp.ExecutionPlan`, `mscclpp.Executor`).

use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mscclpp::executor::{
    ExecutionPlan as Plan, Executor as Exec, ExecutorConfig, PacketType, PortChannels,
};
use mscclpp::{Device, DeviceType, LocalMemory};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::buffer::{extract, parse_dtype};
use crate::comm::Communicator;
use crate::error::{invalid, ResultExt};

/// `nbytes` of communication memory allocated by this library (zeroed): GPU memory that
/// peers can map on GPU builds, memfd host memory on the host backend. The executor needs
/// its buffers to be such memory; the collectives run zero-copy algorithms on it. On the
/// host backend it has the buffer protocol (`numpy.frombuffer(buf, dtype)` views it); on GPU
/// builds `__cuda_array_interface__` (`torch.as_tensor(buf, device="cuda")`,
/// `cupy.asarray(buf)` view it as bytes).
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct RawGpuBuffer {
    mem: LocalMemory,
}

impl RawGpuBuffer {
    /// Its address.
    pub fn ptr(&self) -> u64 {
        self.mem.ptr()
    }
    /// Its bytes.
    pub fn nbytes(&self) -> usize {
        self.mem.size()
    }
    /// Its GPU ordinal, -1 for host memory.
    pub fn device_ordinal(&self) -> i32 {
        match self.mem.device().kind {
            DeviceType::Cpu => -1,
            DeviceType::Gpu => self.mem.device().id,
        }
    }
}

/// The GPU a new buffer goes to when none is named: the calling thread's current one.
pub(crate) fn default_device() -> Device {
    if crate::backend() == "host" {
        return Device::CPU;
    }
    use mscclpp_hal::prelude::*;
    let id = mscclpp_hal::Gpu::current_ordinal()
        .ok()
        .flatten()
        .unwrap_or(0);
    Device::gpu(i32::try_from(id).unwrap_or(0))
}

#[pymethods]
impl RawGpuBuffer {
    /// Allocates `nbytes` (> 0) on `device` (default: the current GPU; the CPU on the host
    /// backend).
    #[new]
    #[pyo3(signature = (nbytes, device=None))]
    fn new(nbytes: usize, device: Option<i32>) -> PyResult<Self> {
        crate::require_gpu("RawGpuBuffer")?;
        let dev = match device {
            Some(d) if d < 0 => {
                return Err(invalid(format!("device {d}: expected a GPU ordinal >= 0")))
            }
            Some(d) if crate::backend() != "host" => Device::gpu(d),
            _ => default_device(),
        };
        let mem = LocalMemory::alloc(dev, nbytes).py_ctx(&format!("RawGpuBuffer({nbytes})"))?;
        Ok(RawGpuBuffer { mem })
    }

    /// Its address (a device address on GPU builds).
    #[getter(ptr)]
    fn py_ptr(&self) -> u64 {
        self.ptr()
    }

    /// Its size in bytes.
    #[getter(nbytes)]
    fn py_nbytes(&self) -> usize {
        self.nbytes()
    }

    /// The GPU it lives on, -1 on the host backend.
    #[getter]
    fn device(&self) -> i32 {
        self.device_ordinal()
    }

    /// Its address (upstream's spelling).
    fn data(&self) -> u64 {
        self.ptr()
    }

    /// Its size in bytes (upstream's spelling).
    fn bytes(&self) -> usize {
        self.nbytes()
    }

    /// Copies `data` (bytes-like) into the buffer at byte `offset`.
    #[pyo3(signature = (data, offset=0))]
    fn write(&self, data: &[u8], offset: usize) -> PyResult<()> {
        self.mem.write(offset, data).py()
    }

    /// Copies `nbytes` (default: all from `offset`) out of the buffer at byte `offset`.
    #[pyo3(signature = (offset=0, nbytes=None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: usize,
        nbytes: Option<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let n = nbytes.unwrap_or(self.nbytes().saturating_sub(offset));
        let mut v = vec![0u8; n];
        self.mem.read(offset, &mut v).py()?;
        Ok(PyBytes::new(py, &v))
    }

    fn __len__(&self) -> usize {
        self.nbytes()
    }

    /// GPU builds: the CUDA array interface (version 3) of its bytes (`|u1`, one dimension).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.device_ordinal() < 0 {
            return Err(pyo3::exceptions::PyAttributeError::new_err(
                "__cuda_array_interface__: host memory (host backend): use the buffer protocol \
                 (numpy.frombuffer(buf, dtype))",
            ));
        }
        let d = PyDict::new(py);
        d.set_item("shape", (self.nbytes(),))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.ptr(), false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        d.set_item("stream", py.None())?;
        Ok(d)
    }

    /// `(device_type, device_id)` of DLPack: `(1, 0)` (CPU) on the host backend, `(2, gpu)`
    /// (CUDA) or `(10, gpu)` (ROCm) on GPU builds.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = crate::dlpack::device_of(self.device_ordinal());
        (d.device_type.0 as i32, d.device_id)
    }

    /// A DLPack capsule of its bytes (a 1-D `uint8` tensor, zero-copy; the consumer keeps the
    /// allocation alive): `torch.from_dlpack(buf)`, `cupy.from_dlpack(buf)`,
    /// `numpy.from_dlpack(buf)` (host backend) view it. Standard arguments: `stream` (nothing
    /// to order: the buffer has no stream of its own), `max_version` (a versioned capsule
    /// for 1.x), `dl_device` (must be its own), `copy` (only False/None).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        crate::dlpack::export(
            py,
            &self.mem,
            self.device_ordinal(),
            stream,
            max_version,
            dl_device,
            copy,
        )
    }

    /// A (legacy, unversioned) DLPack capsule of its bytes, for consumers that take capsules
    /// (`torch.utils.dlpack.from_dlpack(buf.to_dlpack())`).
    fn to_dlpack(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        crate::dlpack::export(py, &self.mem, self.device_ordinal(), None, None, None, None)
    }

    /// Host memory: its bytes through the buffer protocol (writable, format `B`).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let py = slf.py();
        let me = slf.get();
        let Some(host) = me.mem.host_ptr() else {
            return Err(PyBufferError::new_err(
                "RawGpuBuffer: GPU memory has no buffer protocol: use __cuda_array_interface__ \
                 (torch.as_tensor(buf, device=\"cuda\"), cupy.asarray(buf))",
            ));
        };
        let len = ffi::Py_ssize_t::try_from(me.nbytes())
            .map_err(|_| PyBufferError::new_err("RawGpuBuffer: too large for a buffer view"))?;
        let owner = slf.into_any().into_ptr();
        // SAFETY: `view` is CPython's to fill; `host` is `len` bytes the allocation keeps alive
        // while `owner` (a new reference the view takes over) lives.
        let rc = unsafe { ffi::PyBuffer_FillInfo(view, owner, host.cast(), len, 0, flags) };
        // SAFETY: the view holds its own reference on success (FillInfo increfs `owner`);
        // ours, from `into_ptr`, is released either way.
        unsafe { ffi::Py_DECREF(owner) };
        if rc != 0 {
            return Err(PyErr::take(py).unwrap_or_else(|| {
                PyBufferError::new_err("RawGpuBuffer: PyBuffer_FillInfo failed")
            }));
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "RawGpuBuffer(nbytes={}, device={}, ptr={:#x})",
            self.nbytes(),
            self.device_ordinal(),
            self.ptr()
        )
    }
}

/// A JSON execution plan (upstream MSCCL++'s format) loaded for one rank and validated.
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct ExecutionPlan {
    inner: Arc<Plan>,
}

#[pymethods]
impl ExecutionPlan {
    /// Loads the plan at `path` for `rank`; an error names the JSON path at fault.
    #[new]
    fn new(path: PathBuf, rank: usize) -> PyResult<Self> {
        let p = Plan::from_file(&path, rank).py()?;
        Ok(ExecutionPlan { inner: Arc::new(p) })
    }

    /// The plan's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Its collective (`"allreduce"`, `"allgather"`, ...).
    #[getter]
    fn collective(&self) -> &str {
        self.inner.collective()
    }

    /// The number of ranks it is written for.
    #[getter]
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    /// The rank it was loaded for.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// Whether it runs in place.
    #[getter]
    fn is_in_place(&self) -> bool {
        self.inner.is_in_place()
    }

    /// Its protocol (`"LL"` or `"Simple"`).
    #[getter]
    fn protocol(&self) -> &'static str {
        self.inner.protocol()
    }

    /// The smallest message (bytes) it is meant for.
    #[getter]
    fn min_message_size(&self) -> u64 {
        self.inner.min_message_size()
    }

    /// The largest message (bytes) it is meant for.
    #[getter]
    fn max_message_size(&self) -> u64 {
        self.inner.max_message_size()
    }

    fn __repr__(&self) -> String {
        format!(
            "ExecutionPlan(name={:?}, collective={:?}, world_size={}, rank={})",
            self.inner.name(),
            self.inner.collective(),
            self.inner.world_size(),
            self.inner.rank()
        )
    }
}

/// Runs execution plans on a communicator (upstream's `Executor`); caches the connections
/// and channels of each (plan, buffers) pair after its first run.
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct Executor {
    inner: Arc<Exec>,
    rank: usize,
}

#[pymethods]
impl Executor {
    /// An executor on `comm`. Host backend: `timeout` seconds a CPU thread block waits for a
    /// peer (default 60), `host_threads_per_block` (1..=64, default 1). `port_channels`:
    /// `"auto"` runs the port channels of a plan whose ranks share one node as memory channels,
    /// `"proxy"` keeps them on the host proxy (default: `MSCCLPP_EXECUTOR_PORT_CHANNELS`, else
    /// `"auto"`).
    #[new]
    #[pyo3(signature = (comm, *, timeout=None, host_threads_per_block=None, port_channels=None))]
    fn new(
        comm: &Communicator,
        timeout: Option<f64>,
        host_threads_per_block: Option<u32>,
        port_channels: Option<&str>,
    ) -> PyResult<Self> {
        crate::require_gpu("Executor")?;
        let mut cfg = ExecutorConfig::default();
        if let Some(t) = timeout {
            cfg.timeout = Duration::try_from_secs_f64(t)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    invalid(format!(
                        "timeout {t}: expected a positive number of seconds"
                    ))
                })?;
        }
        if let Some(n) = host_threads_per_block {
            cfg.host_threads_per_block = n;
        }
        if let Some(name) = port_channels {
            cfg.port_channels = PortChannels::from_name(name).ok_or_else(|| {
                invalid(format!(
                    "port_channels {name:?}: expected \"auto\" or \"proxy\""
                ))
            })?;
        }
        let rank = comm.inner().bootstrap().rank();
        Ok(Executor {
            inner: Arc::new(Exec::with_config(comm.inner().clone(), cfg).py()?),
            rank,
        })
    }

    /// Runs `plan` on `send` and `recv` (collective: every rank with its part): buffers this
    /// library allocated (`RawGpuBuffer`, or NumPy views of one); in-place plans take the same
    /// buffer twice. `dtype` defaults to the buffers' element type; `packet_type` is `"LL16"`
    /// (default) or `"LL8"`. GPU builds: asynchronous on `stream`; host: done on return.
    #[pyo3(signature = (plan, send, recv, *, dtype=None, stream=None, packet_type="LL16"))]
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        py: Python<'_>,
        plan: &ExecutionPlan,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        dtype: Option<&str>,
        stream: Option<u64>,
        packet_type: &str,
    ) -> PyResult<()> {
        let pt = match packet_type.to_ascii_uppercase().as_str() {
            "LL16" => PacketType::LL16,
            "LL8" => PacketType::LL8,
            _ => {
                return Err(invalid(format!(
                    "packet_type {packet_type:?}: expected \"LL16\" or \"LL8\""
                )))
            }
        };
        let s = extract(send, "send", false)?;
        let r = extract(recv, "recv", true)?;
        let dt = match dtype {
            Some(d) => parse_dtype(d)?,
            None => s.dtype.or(r.dtype).ok_or_else(|| {
                invalid(format!(
                    "execute: send ({}) has no element type: pass dtype= (e.g. dtype=\"float32\")",
                    s.kind
                ))
            })?,
        };
        let stream = stream.or(s.stream).or(r.stream).unwrap_or(0);
        let (exec, plan, rank) = (self.inner.clone(), plan.inner.clone(), self.rank);
        let (sp, rp, sn, rn) = (s.ptr, r.ptr, s.nbytes, r.nbytes);
        // SAFETY: the executor refuses memory it did not allocate; `s`/`r` keep the Python
        // objects' exports alive until this returns (host: complete then; GPU: keeping them
        // alive until the stream ran it is the caller's contract).
        py.detach(move || unsafe { exec.execute(rank, sp, rp, sn, rn, dt, &plan, stream, pt) })
            .py()?;
        drop((s, r));
        Ok(())
    }

    /// Drops every cached context (collective: every rank together, nothing in flight).
    fn reset(&self) {
        self.inner.reset();
    }

    /// Starts (`True`) or stops counting where each execution's time goes, op by op, per
    /// thread block (`take_trace` reads the counts).
    fn set_trace(&self, on: bool) {
        self.inner.set_trace(on);
    }

    /// Whether tracing is on.
    #[getter]
    fn tracing(&self) -> bool {
        self.inner.tracing()
    }

    /// The counts since the last call (zeroed by reading them), one dict per (plan, buffers,
    /// message size): `plan`, `send_size`, `recv_size`, `lanes`, `text` (the table `print`
    /// shows) and `blocks`, one dict per GPU block that ran (per thread block on the host
    /// backend): `block`, `lane`, `launches`, `us` (per launch; cycles where the GPU has no
    /// wall clock), `prologue_us`, `idle_us` (between back-to-back launches, or `None`) and
    /// `ops`: dicts of `index`, `name`, `runs`, `us` (per launch). Call it once the traced
    /// executions finished (GPU builds: their streams synchronized).
    fn take_trace<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let traces = py.detach(|| self.inner.take_trace()).py()?;
        traces
            .into_iter()
            .map(|t| {
                let d = PyDict::new(py);
                d.set_item("plan", &t.plan)?;
                d.set_item("send_size", t.send_size)?;
                d.set_item("recv_size", t.recv_size)?;
                d.set_item("lanes", t.lanes)?;
                d.set_item("text", t.to_string())?;
                let blocks = t
                    .blocks
                    .iter()
                    .map(|b| {
                        let bd = PyDict::new(py);
                        bd.set_item("block", b.block)?;
                        bd.set_item("lane", b.lane)?;
                        bd.set_item("launches", b.launches)?;
                        bd.set_item("us", b.per_launch_us(b.cycles))?;
                        bd.set_item("prologue_us", b.per_launch_us(b.prologue_cycles))?;
                        bd.set_item("idle_us", b.idle_us())?;
                        let ops = b
                            .ops
                            .iter()
                            .map(|o| {
                                let od = PyDict::new(py);
                                od.set_item("index", o.index)?;
                                od.set_item("name", o.name)?;
                                od.set_item("runs", o.runs)?;
                                od.set_item("us", b.per_launch_us(o.cycles))?;
                                Ok(od)
                            })
                            .collect::<PyResult<Vec<_>>>()?;
                        bd.set_item("ops", ops)?;
                        Ok(bd)
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                d.set_item("blocks", blocks)?;
                Ok(d)
            })
            .collect()
    }
}
