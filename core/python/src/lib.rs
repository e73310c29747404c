//! The `mscclpp` Python package's native module, `mscclpp._mscclpp` (PyO3, built by maturin
//! from `core/python/pyproject.toml`).
//!
//! It wraps the `mscclpp` crate: the TCP bootstrap and its [`UniqueId`](mscclpp::UniqueId),
//! the communicator, the collectives ([`mscclpp::collectives::Collectives`]) on caller
//! buffers, library-allocated buffers and the executor of JSON execution plans. The Python
//! side (`python/mscclpp/`) adds `CommGroup`, the buffer descriptions of torch tensors and
//! CuPy arrays (`_buffers.py`) and the `mscclpp.torch` module.
//!
//! Every error of the library reaches Python as `mscclpp.MscclppError` (a `RuntimeError`)
//! carrying the library's message and its code (`.code`); nothing here unwraps what a caller
//! passed, so no panic crosses into Python.

// No unwrap() on what Python passes.
#![warn(clippy::unwrap_used)]

use pyo3::prelude::*;

mod buffer;
mod channel;
mod coll;
mod comm;
mod dlpack;
mod error;
mod exec;
mod p2p;

/// The backend this module was built for: `"host"` (CPU memory, CPU threads play the GPU),
/// `"cuda"` or `"rocm"`.
#[pyfunction]
fn backend() -> &'static str {
    if cfg!(feature = "cuda") {
        "cuda"
    } else if cfg!(feature = "rocm") {
        "rocm"
    } else {
        "host"
    }
}

/// The number of GPUs this process sees (0 when the driver is missing or on the host
/// backend, whose single emulated device is not counted).
#[pyfunction]
fn device_count() -> usize {
    if backend() == "host" {
        return 0;
    }
    use mscclpp_hal::prelude::*;
    mscclpp_hal::Gpu::device_count().unwrap_or(0)
}

/// GPU builds: an error (`MscclppError`, code `SystemError`) unless the driver loads and shows
/// a GPU, asked before anything touches the driver (whose absence some HAL calls do not
/// report as an error). Nothing to check on the host backend.
pub fn require_gpu(what: &str) -> PyResult<()> {
    if backend() == "host" {
        return Ok(());
    }
    use mscclpp_hal::prelude::*;
    match mscclpp_hal::Gpu::device_count() {
        Ok(0) => Err(error::new_error(
            "SystemError",
            format!(
                "{what}: this mscclpp is a {} build and this machine shows no GPU",
                backend()
            ),
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(error::new_error(
            "SystemError",
            format!(
                "{what}: this mscclpp is a {} build and the GPU driver is not usable: {e}",
                backend()
            ),
        )),
    }
}

/// The native module `mscclpp._mscclpp`.
#[pymodule]
fn _mscclpp(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MscclppError", m.py().get_type::<error::MscclppError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(backend, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_class::<comm::UniqueId>()?;
    m.add_class::<comm::TcpBootstrap>()?;
    m.add_class::<comm::Communicator>()?;
    m.add_class::<buffer::BufferRef>()?;
    m.add_class::<coll::Collectives>()?;
    m.add_class::<exec::RawGpuBuffer>()?;
    m.add_class::<exec::ExecutionPlan>()?;
    m.add_class::<exec::Executor>()?;
    m.add_class::<p2p::PointToPoint>()?;
    m.add_class::<channel::Future>()?;
    m.add_class::<channel::Connection>()?;
    m.add_class::<channel::RegisteredMemory>()?;
    m.add_class::<channel::Semaphore>()?;
    m.add_class::<channel::MemoryDevice2DeviceSemaphore>()?;
    m.add_class::<channel::Host2DeviceSemaphore>()?;
    m.add_class::<channel::Host2HostSemaphore>()?;
    m.add_class::<channel::BaseMemoryChannel>()?;
    m.add_class::<channel::MemoryChannel>()?;
    m.add_class::<channel::ProxyService>()?;
    m.add_class::<channel::BasePortChannel>()?;
    m.add_class::<channel::PortChannel>()?;
    Ok(())
}
