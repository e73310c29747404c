//! `mscclpp.UniqueId`, `mscclpp.TcpBootstrap` and `mscclpp.Communicator`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mscclpp::Bootstrap;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyType};

use crate::error::{invalid, ResultExt};

/// The 128 opaque bytes naming one bootstrap group: where its root listens and a nonce.
/// Rank 0 creates it (`UniqueId.create()` / `TcpBootstrap.create_unique_id()`), the others
/// get it as bytes (`bytes(uid)`, `UniqueId.from_bytes(b)`) through any channel (a
/// torch.distributed broadcast, a file, MPI). Pickles as its bytes.
#[pyclass(module = "mscclpp._mscclpp", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash, Clone)]
pub struct UniqueId(pub mscclpp::UniqueId);

#[pymethods]
impl UniqueId {
    /// A new group id; this process keeps its listening port for rank 0.
    #[classmethod]
    fn create(_cls: &Bound<'_, PyType>) -> PyResult<UniqueId> {
        Ok(UniqueId(mscclpp::TcpBootstrap::create_unique_id().py()?))
    }

    /// The id of `data` (128 bytes from `bytes(uid)`); an error names what is wrong.
    #[classmethod]
    fn from_bytes(_cls: &Bound<'_, PyType>, data: &[u8]) -> PyResult<UniqueId> {
        Ok(UniqueId(mscclpp::UniqueId::from_bytes(data).py()?))
    }

    /// Its 128 bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.0.as_bytes())
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.to_bytes(py)
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let ctor = slf.get_type().getattr("from_bytes")?;
        Ok((ctor, (slf.get().to_bytes(slf.py()),)))
    }

    /// The root's address, `"ip:port"`.
    #[getter]
    fn root_address(&self) -> String {
        self.0.root_addr().to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "UniqueId(root={}, nonce={:#018x})",
            self.0.root_addr(),
            self.0.nonce()
        )
    }
}

enum State {
    New(mscclpp::TcpBootstrap),
    Ready(Arc<mscclpp::TcpBootstrap>),
    /// An initialize is running (or failed: a bootstrap is initialized once).
    Busy,
}

/// The built-in TCP bootstrap of one rank: `TcpBootstrap(rank, nranks)`, then
/// `initialize(unique_id_or_address)` on every rank (`"ip:port"` or `"ifname:ip:port"` of
/// rank 0's listener, or a `UniqueId`). Then: barriers and byte messages between ranks.
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct TcpBootstrap {
    rank: usize,
    nranks: usize,
    state: Mutex<State>,
}

fn secs(s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            invalid(format!(
                "timeout {s}: expected a positive number of seconds"
            ))
        })
}

impl TcpBootstrap {
    /// The initialized bootstrap; an error before `initialize`.
    pub fn ready(&self) -> PyResult<Arc<mscclpp::TcpBootstrap>> {
        match &*self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            State::Ready(b) => Ok(b.clone()),
            _ => Err(invalid(format!(
                "TcpBootstrap of rank {}: not initialized: call initialize(unique_id or \"ip:port\") first",
                self.rank
            ))),
        }
    }
}

#[pymethods]
impl TcpBootstrap {
    /// A bootstrap for `rank` of `nranks`; nothing is connected until `initialize`.
    #[new]
    fn new(rank: usize, nranks: usize) -> PyResult<Self> {
        let b = mscclpp::TcpBootstrap::new(rank, nranks).py()?;
        Ok(TcpBootstrap {
            rank,
            nranks,
            state: Mutex::new(State::New(b)),
        })
    }

    /// `TcpBootstrap(rank, nranks)` (upstream's spelling).
    #[classmethod]
    fn create(_cls: &Bound<'_, PyType>, rank: usize, nranks: usize) -> PyResult<Self> {
        Self::new(rank, nranks)
    }

    /// A new `UniqueId` (rank 0 makes it and passes it to the others).
    #[staticmethod]
    fn create_unique_id() -> PyResult<UniqueId> {
        Ok(UniqueId(mscclpp::TcpBootstrap::create_unique_id().py()?))
    }

    /// Sets the job key for `"ip:port"` mode (every rank the same); before `initialize`.
    fn set_job_key(&self, key: &str) -> PyResult<()> {
        match &mut *self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            State::New(b) => b.set_job_key(key).py(),
            _ => Err(invalid(
                "set_job_key after initialize: expected it before initialize",
            )),
        }
    }

    /// Joins the group at `address` (a `UniqueId`, or `"ip:port"` / `"ifname:ip:port"` where
    /// rank 0 listens); returns once every rank is connected, or raises by `timeout` seconds
    /// naming the ranks that never came. Once per bootstrap.
    #[pyo3(signature = (address, timeout=60.0))]
    fn initialize(&self, py: Python<'_>, address: &Bound<'_, PyAny>, timeout: f64) -> PyResult<()> {
        let timeout = secs(timeout)?;
        let addr = if let Ok(id) = address.cast::<UniqueId>() {
            mscclpp::InitAddr::Id(id.get().0)
        } else if let Ok(s) = address.extract::<String>() {
            mscclpp::InitAddr::parse(&s).py()?
        } else if let Ok(b) = address.extract::<Vec<u8>>() {
            mscclpp::InitAddr::Id(mscclpp::UniqueId::from_bytes(&b).py()?)
        } else {
            return Err(PyTypeError::new_err(format!(
                "initialize: {}: expected a UniqueId, its bytes or an \"ip:port\" string",
                address.get_type().name()?
            )));
        };
        let mut b = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            match std::mem::replace(&mut *st, State::Busy) {
                State::New(b) => b,
                other => {
                    *st = other;
                    return Err(invalid(format!(
                        "TcpBootstrap of rank {}: initialize called twice: expected a new TcpBootstrap per group",
                        self.rank
                    )));
                }
            }
        };
        let b = py
            .detach(move || b.initialize(addr, timeout).map(|()| b))
            .py()?;
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Ready(Arc::new(b));
        Ok(())
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn nranks(&self) -> usize {
        self.nranks
    }

    /// Ranks on this host (after `initialize`).
    #[getter]
    fn nranks_per_node(&self) -> PyResult<usize> {
        Ok(self.ready()?.nranks_per_node())
    }

    /// Waits until every rank called it.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let b = self.ready()?;
        py.detach(move || b.barrier()).py()
    }

    /// Every rank's `data`, in rank order (collective).
    fn all_gather<'py>(
        &self,
        py: Python<'py>,
        data: Vec<u8>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let b = self.ready()?;
        let all = py.detach(move || b.all_gather(&data)).py()?;
        Ok(all.iter().map(|d| PyBytes::new(py, d)).collect())
    }

    /// Sends `data` to `peer` under `tag` (messages of one pair and tag arrive in order).
    #[pyo3(signature = (data, peer, tag=0))]
    fn send(&self, py: Python<'_>, data: Vec<u8>, peer: usize, tag: u64) -> PyResult<()> {
        let b = self.ready()?;
        py.detach(move || b.send(&data, peer, tag)).py()
    }

    /// The next message from `peer` under `tag`.
    #[pyo3(signature = (peer, tag=0))]
    fn recv<'py>(&self, py: Python<'py>, peer: usize, tag: u64) -> PyResult<Bound<'py, PyBytes>> {
        let b = self.ready()?;
        let d = py.detach(move || b.recv(peer, tag)).py()?;
        Ok(PyBytes::new(py, &d))
    }

    fn __repr__(&self) -> String {
        format!("TcpBootstrap(rank={}, nranks={})", self.rank, self.nranks)
    }
}

/// A communicator over an initialized bootstrap (the library's `Communicator`): what the
/// collectives and the executor are built on.
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct Communicator {
    inner: Arc<mscclpp::Communicator>,
    bootstrap: Py<TcpBootstrap>,
}

impl Communicator {
    /// The library's communicator.
    pub fn inner(&self) -> &Arc<mscclpp::Communicator> {
        &self.inner
    }
}

#[pymethods]
impl Communicator {
    /// A communicator over `bootstrap` (initialized).
    #[new]
    fn new(bootstrap: Bound<'_, TcpBootstrap>) -> PyResult<Self> {
        let b = bootstrap.get().ready()?;
        crate::require_gpu("Communicator")?;
        let ctx = mscclpp::Context::new().py_ctx("creating the context")?;
        Ok(Communicator {
            inner: Arc::new(mscclpp::Communicator::new(b, ctx)),
            bootstrap: bootstrap.unbind(),
        })
    }

    /// Its bootstrap.
    #[getter]
    fn bootstrap(&self, py: Python<'_>) -> Py<TcpBootstrap> {
        self.bootstrap.clone_ref(py)
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.bootstrap().rank()
    }

    /// The number of ranks.
    #[getter]
    fn nranks(&self) -> usize {
        self.inner.bootstrap().nranks()
    }

    /// Registers `buffer` (a `RawGpuBuffer`, or a buffer inside memory this library
    /// allocated, e.g. `mscclpp.torch.empty`) for `transports` (a name or a list:
    /// `"cudaipc"`, `"ethernet"`, `"ib0"`..): the registration keeps `buffer` alive.
    #[pyo3(signature = (buffer, transports=None))]
    fn register_memory(
        &self,
        buffer: &Bound<'_, PyAny>,
        transports: Option<Bound<'_, PyAny>>,
    ) -> PyResult<crate::channel::RegisteredMemory> {
        let t = match transports {
            Some(t) => t,
            None => pyo3::types::PyString::new(buffer.py(), "cudaipc").into_any(),
        };
        crate::channel::register(&self.inner, buffer, &t)
    }

    /// Sends `memory`'s registration to `remote_rank` under `tag`.
    #[pyo3(signature = (memory, remote_rank, tag=0))]
    fn send_memory(
        &self,
        memory: &crate::channel::RegisteredMemory,
        remote_rank: usize,
        tag: u64,
    ) -> PyResult<()> {
        self.inner.send_memory(&memory.inner, remote_rank, tag).py()
    }

    /// The next registration `remote_rank` sends under `tag` (a `Future`: `.get()` waits).
    #[pyo3(signature = (remote_rank, tag=0))]
    fn recv_memory(&self, remote_rank: usize, tag: u64) -> crate::channel::Future {
        crate::channel::recv_memory(&self.inner, remote_rank, tag)
    }

    /// Sends this rank's endpoint of `transport` (`"cudaipc"`, `"ethernet"`, `"ib0"`..; on
    /// `device`, default the current GPU) to `remote_rank` under `tag` now; the `Future`'s
    /// `get()` receives the peer's and returns the `Connection`. Both ranks call it.
    #[pyo3(signature = (remote_rank, tag=0, *, transport="cudaipc", device=None))]
    fn connect(
        &self,
        remote_rank: usize,
        tag: u64,
        transport: &str,
        device: Option<i32>,
    ) -> PyResult<crate::channel::Future> {
        crate::channel::connect(&self.inner, remote_rank, tag, transport, device)
    }

    /// Sends a new local token of `connection` to `remote_rank` under `tag` now; the
    /// `Future`'s `get()` joins it with the peer's into a `Semaphore`. Both ranks call it.
    #[pyo3(signature = (connection, remote_rank, tag=0))]
    fn build_semaphore(
        &self,
        connection: &crate::channel::Connection,
        remote_rank: usize,
        tag: u64,
    ) -> crate::channel::Future {
        crate::channel::build_semaphore(&self.inner, connection, remote_rank, tag)
    }

    fn __repr__(&self) -> String {
        format!(
            "Communicator(rank={}, nranks={})",
            self.rank(),
            self.nranks()
        )
    }
}
