//! The low-level API: connections, registered memory, semaphores, memory and port channels
//! (upstream MSCCL++'s Python names), with their device handles as `bytes` in the C layout of
//! kernels/cuda/include/mscclpp/*_device.hpp (`mscclpp.get_include()`), for kernels compiled
//! at run time. On the host backend the channels also run their device operations on the
//! calling thread (`put`, `signal`, `wait`: the CPU plays the GPU), which the tests use.

use std::sync::Mutex;
use std::time::Duration;

use mscclpp::{
    BaseMemoryChannel as CoreBaseMemoryChannel, Device, EndpointConfig,
    Host2DeviceSemaphore as CoreH2D, Host2HostSemaphore as CoreH2H,
    MemoryChannel as CoreMemoryChannel, MemoryDevice2DeviceSemaphore as CoreD2D, Transport,
    TransportFlags,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyType};

use crate::buffer::extract;
use crate::error::{invalid, ResultExt};

/// The bytes of a device handle (a `#[repr(C)]` struct of the C header).
///
/// # Safety
/// `T` has no padding bytes (every handle here is pointers and 32/64-bit integers laid out
/// without gaps; the `const` asserts below pin their sizes to the header's).
unsafe fn handle_bytes<'py, T: Copy>(py: Python<'py>, h: &T) -> Bound<'py, PyBytes> {
    // SAFETY: `h` is a live `T` of `size_of::<T>()` initialized bytes (no padding: caller).
    let b = unsafe {
        std::slice::from_raw_parts((h as *const T).cast::<u8>(), std::mem::size_of::<T>())
    };
    PyBytes::new(py, b)
}

const _: () =
    assert!(std::mem::size_of::<mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle>() == 24);
const _: () = assert!(std::mem::size_of::<mscclpp::Host2DeviceSemaphoreDeviceHandle>() == 16);
const _: () = assert!(std::mem::size_of::<mscclpp::BaseMemoryChannelDeviceHandle>() == 24);
const _: () = assert!(std::mem::size_of::<mscclpp::MemoryChannelDeviceHandle>() == 48);
const _: () = assert!(std::mem::size_of::<mscclpp::BasePortChannelDeviceHandle>() == 64);
const _: () = assert!(std::mem::size_of::<mscclpp::PortChannelDeviceHandle>() == 72);

/// A transport by name: `"cudaipc"` (same host: peer-mapped memory), `"ethernet"`, `"ib0"`
/// ... `"ib7"` (case-insensitive).
pub fn parse_transport(name: &str) -> PyResult<Transport> {
    Transport::ALL[1..]
        .iter()
        .copied()
        .find(|t| t.to_string().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            invalid(format!(
                "transport {name:?}: expected one of \"cudaipc\", \"ethernet\", \"ib0\"..\"ib7\""
            ))
        })
}

/// A set of transports: one name or a list of names.
pub fn parse_transports(obj: &Bound<'_, PyAny>) -> PyResult<TransportFlags> {
    let names: Vec<String> = match obj.extract::<String>() {
        Ok(s) => vec![s],
        Err(_) => obj.extract().map_err(|_| {
            invalid("transports: expected a transport name or a list of names (\"cudaipc\", ...)")
        })?,
    };
    let mut flags = TransportFlags::default();
    for n in names {
        flags = flags | TransportFlags::from(parse_transport(&n)?);
    }
    Ok(flags)
}

/// The device a new endpoint or proxy works for: `device`, else the current GPU (the CPU on
/// the host backend).
pub fn endpoint_device(device: Option<i32>) -> PyResult<Device> {
    match device {
        Some(d) if d < 0 => Err(invalid(format!("device {d}: expected a GPU ordinal >= 0"))),
        Some(d) if crate::backend() != "host" => Ok(Device::gpu(d)),
        _ => Ok(crate::exec::default_device()),
    }
}

/// Seconds as a positive `Duration`.
fn secs(s: f64) -> PyResult<Duration> {
    crate::coll::secs("timeout", s)
}

/// The host backend's device operations run on this thread; GPU builds refuse them.
fn host_only(what: &str) -> PyResult<()> {
    if crate::backend() == "host" {
        Ok(())
    } else {
        Err(invalid(format!(
            "{what}: the device operations run on the host only on the host backend: on GPUs \
             pass device_handle() to a kernel"
        )))
    }
}

enum Pending {
    Connection(mscclpp::Future<mscclpp::Connection>),
    Memory(mscclpp::Future<mscclpp::RegisteredMemory>),
    Semaphore(mscclpp::Future<mscclpp::Semaphore>),
}

/// The result of `Communicator.connect`, `recv_memory` or `build_semaphore`: what the peer
/// sends arrives on `get()` (this rank's part went out already), so a rank can start every
/// exchange first and then wait for all of them.
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct Future {
    pending: Mutex<Option<Pending>>,
    done: Mutex<Option<Py<PyAny>>>,
}

impl Future {
    fn new(p: Pending) -> Future {
        Future {
            pending: Mutex::new(Some(p)),
            done: Mutex::new(None),
        }
    }
}

#[pymethods]
impl Future {
    /// Waits for the peer's part and returns the `Connection`, `RegisteredMemory` or
    /// `Semaphore` (the same object on every later call).
    fn get(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(d) = &*self.done.lock().unwrap_or_else(|p| p.into_inner()) {
            return Ok(d.clone_ref(py));
        }
        let Some(p) = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return Err(invalid(
                "Future.get: an earlier get failed or is running: a future is waited once",
            ));
        };
        let obj: Py<PyAny> = match p {
            Pending::Connection(f) => {
                let c = py.detach(move || f.get()).py_ctx("connect")?;
                Py::new(py, Connection { inner: c })?.into_any()
            }
            Pending::Memory(f) => {
                let m = py.detach(move || f.get()).py_ctx("recv_memory")?;
                Py::new(
                    py,
                    RegisteredMemory {
                        inner: m,
                        _owner: None,
                    },
                )?
                .into_any()
            }
            Pending::Semaphore(f) => {
                let s = py.detach(move || f.get()).py_ctx("build_semaphore")?;
                Py::new(py, Semaphore { inner: s })?.into_any()
            }
        };
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = Some(obj.clone_ref(py));
        Ok(obj)
    }

    /// Whether `get` returned already.
    fn ready(&self) -> bool {
        self.done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

/// A connection to one peer (made by `Communicator.connect`).
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct Connection {
    pub(crate) inner: mscclpp::Connection,
}

#[pymethods]
impl Connection {
    /// Its transport (`"CudaIpc"`, `"Ethernet"`, `"IB0"`, ...).
    #[getter]
    fn transport(&self) -> String {
        self.inner.transport().to_string()
    }

    /// The peer's rank, when known.
    #[getter]
    fn remote_rank(&self) -> Option<usize> {
        self.inner.remote_rank()
    }

    /// Copies `size` bytes from `src` + `src_offset` (memory registered here) to `dst` +
    /// `dst_offset` (the peer's registered memory); ranges are checked.
    fn write(
        &self,
        py: Python<'_>,
        dst: &RegisteredMemory,
        dst_offset: u64,
        src: &RegisteredMemory,
        src_offset: u64,
        size: u64,
    ) -> PyResult<()> {
        let (c, d, s) = (&self.inner, &dst.inner, &src.inner);
        py.detach(|| c.write(d, dst_offset, s, src_offset, size))
            .py_ctx("Connection.write")
    }

    /// Waits (at most `timeout` seconds) until every earlier write is done.
    #[pyo3(signature = (timeout=60.0))]
    fn flush(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = secs(timeout)?;
        let c = &self.inner;
        py.detach(|| c.flush(t)).py_ctx("Connection.flush")
    }

    fn __repr__(&self) -> String {
        format!(
            "Connection(transport={}, remote_rank={:?})",
            self.inner.transport(),
            self.inner.remote_rank()
        )
    }
}

/// Memory registered for transports (`Communicator.register_memory`), or a peer's received
/// with `Communicator.recv_memory` (then `data` is its address mapped in this process, 0 when
/// it is reachable only through a connection).
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct RegisteredMemory {
    pub(crate) inner: mscclpp::RegisteredMemory,
    /// The Python object that owns the memory (kept alive by the registration).
    _owner: Option<Py<PyAny>>,
}

#[pymethods]
impl RegisteredMemory {
    /// Its address in this process (a peer's memory mapped here; 0 when not mapped).
    #[getter]
    fn data(&self) -> u64 {
        self.inner.data()
    }

    /// Its address in the process that registered it.
    #[getter]
    fn original_data_ptr(&self) -> u64 {
        self.inner.original_data_ptr()
    }

    /// Its size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// The transports it was registered for.
    #[getter]
    fn transports(&self) -> Vec<String> {
        self.inner
            .transports()
            .iter()
            .map(|t| t.to_string())
            .collect()
    }

    /// Its wire form (what `Communicator.send_memory` sends).
    fn serialize<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.serialize())
    }

    /// A registration received as bytes (from `serialize()` of a peer).
    #[classmethod]
    fn deserialize(_cls: &Bound<'_, PyType>, data: &[u8]) -> PyResult<RegisteredMemory> {
        Ok(RegisteredMemory {
            inner: mscclpp::RegisteredMemory::deserialize(data).py()?,
            _owner: None,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "RegisteredMemory(data={:#x}, size={}, transports={:?})",
            self.inner.data(),
            self.inner.size(),
            self.transports()
        )
    }
}

/// A pair of tokens over a connection (`Communicator.build_semaphore`): what the semaphores
/// and channels below are made of.
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct Semaphore {
    pub(crate) inner: mscclpp::Semaphore,
}

#[pymethods]
impl Semaphore {
    /// The connection it signals over.
    #[getter]
    fn connection(&self) -> Connection {
        Connection {
            inner: self.inner.connection().clone(),
        }
    }
}

/// A GPU signals a GPU through peer-mapped memory (CudaIpc connections).
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct MemoryDevice2DeviceSemaphore {
    inner: CoreD2D,
}

#[pymethods]
impl MemoryDevice2DeviceSemaphore {
    /// Wraps `semaphore` (its connection must be CudaIpc).
    #[new]
    fn new(semaphore: &Semaphore) -> PyResult<Self> {
        Ok(MemoryDevice2DeviceSemaphore {
            inner: CoreD2D::new(semaphore.inner.clone()).py()?,
        })
    }

    /// `MemoryDevice2DeviceSemaphoreDeviceHandle` (24 bytes: inboundToken,
    /// remoteInboundToken, expectedInboundToken).
    fn device_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        // SAFETY: three pointers, no padding.
        unsafe { handle_bytes(py, &self.inner.device_handle()) }
    }
}

/// The host signals, a GPU waits (the port channels' semaphore).
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct Host2DeviceSemaphore {
    inner: CoreH2D,
}

#[pymethods]
impl Host2DeviceSemaphore {
    /// Wraps `semaphore`.
    #[new]
    fn new(semaphore: &Semaphore) -> PyResult<Self> {
        Ok(Host2DeviceSemaphore {
            inner: CoreH2D::new(semaphore.inner.clone()).py()?,
        })
    }

    /// Increments the peer's token (after every earlier write of the connection).
    fn signal(&self) -> PyResult<()> {
        self.inner.signal().py()
    }

    /// `Host2DeviceSemaphoreDeviceHandle` (16 bytes: inboundToken, expectedInboundToken).
    fn device_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        // SAFETY: two pointers, no padding.
        unsafe { handle_bytes(py, &self.inner.device_handle()) }
    }
}

/// The host signals and the host waits (connections whose local device is the CPU).
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct Host2HostSemaphore {
    inner: CoreH2H,
}

#[pymethods]
impl Host2HostSemaphore {
    /// Wraps `semaphore`.
    #[new]
    fn new(semaphore: &Semaphore) -> PyResult<Self> {
        Ok(Host2HostSemaphore {
            inner: CoreH2H::new(semaphore.inner.clone()).py()?,
        })
    }

    /// Increments the peer's token (after every earlier write of the connection).
    fn signal(&self) -> PyResult<()> {
        self.inner.signal().py()
    }

    /// Whether the peer signalled (consumes one signal when it did).
    fn poll(&self) -> bool {
        self.inner.poll()
    }

    /// Waits for the peer's next signal, at most `timeout` seconds.
    #[pyo3(signature = (timeout=60.0))]
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = secs(timeout)?;
        let s = &self.inner;
        py.detach(|| s.wait(t)).py_ctx("Host2HostSemaphore.wait")
    }
}

/// A memory channel with only a semaphore (signal/wait between two devices).
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct BaseMemoryChannel {
    inner: CoreBaseMemoryChannel,
}

#[pymethods]
impl BaseMemoryChannel {
    /// A channel over `semaphore` (its connection must be CudaIpc).
    #[new]
    fn new(semaphore: &Semaphore) -> PyResult<Self> {
        Ok(BaseMemoryChannel {
            inner: CoreBaseMemoryChannel::new(CoreD2D::new(semaphore.inner.clone()).py()?),
        })
    }

    /// `BaseMemoryChannelDeviceHandle` (24 bytes: the semaphore's handle).
    fn device_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        // SAFETY: the semaphore handle, no padding.
        unsafe { handle_bytes(py, &self.inner.device_handle()) }
    }
}

/// A local range a channel reads from or where packets land: its address and size, and the
/// object that keeps it alive.
struct Local {
    ptr: u64,
    size: usize,
    _owner: Py<PyAny>,
}

fn local(obj: &Bound<'_, PyAny>, role: &str) -> PyResult<Local> {
    if let Ok(m) = obj.cast::<RegisteredMemory>() {
        let m = m.get();
        return Ok(Local {
            ptr: m.inner.data(),
            size: m.inner.size(),
            _owner: obj.clone().unbind(),
        });
    }
    let b = extract(obj, role, true)?;
    Ok(Local {
        ptr: b.ptr,
        size: b.nbytes,
        _owner: obj.clone().unbind(),
    })
}

/// A semaphore plus the peer's memory `dst` (mapped here), a local source `src` and an
/// optional local packet buffer: device threads put into `dst` directly.
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct MemoryChannel {
    inner: CoreMemoryChannel,
    src: Local,
    _packets: Option<Local>,
    /// Serializes `wait` (the device protocol has one waiter per handle; Python threads
    /// could call it together with the GIL released).
    waiter: Mutex<()>,
}

impl MemoryChannel {
    fn check_range(&self, what: &str, dst_offset: u64, src_offset: u64, n: u64) -> PyResult<()> {
        let dst = self.inner.dst().size() as u64;
        let src = self.src.size as u64;
        if dst_offset.checked_add(n).is_none_or(|e| e > dst)
            || src_offset.checked_add(n).is_none_or(|e| e > src)
        {
            return Err(invalid(format!(
                "MemoryChannel.{what}: {n} bytes at dst offset {dst_offset} / src offset \
                 {src_offset}: expected ranges inside dst ({dst} bytes) and src ({src} bytes)"
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl MemoryChannel {
    /// A channel over `semaphore` (CudaIpc) writing into `dst` (a peer's `RegisteredMemory`,
    /// mapped here) from `src` (a `RegisteredMemory` or a buffer of this rank);
    /// `packet_buffer`: where the peer's packets land here.
    #[new]
    #[pyo3(signature = (semaphore, dst, src, packet_buffer=None))]
    fn new(
        semaphore: &Semaphore,
        dst: &RegisteredMemory,
        src: &Bound<'_, PyAny>,
        packet_buffer: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let src = local(src, "src")?;
        let packets = packet_buffer
            .map(|p| local(p, "packet_buffer"))
            .transpose()?;
        let sem = CoreD2D::new(semaphore.inner.clone()).py()?;
        let inner = CoreMemoryChannel::new(
            sem,
            dst.inner.clone(),
            src.ptr,
            packets.as_ref().map(|p| p.ptr),
        )
        .py()?;
        Ok(MemoryChannel {
            inner,
            src,
            _packets: packets,
            waiter: Mutex::new(()),
        })
    }

    /// `MemoryChannelDeviceHandle` (48 bytes: the semaphore's 24, then dst, src and
    /// packetBuffer addresses).
    fn device_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        // SAFETY: six pointers, no padding.
        unsafe { handle_bytes(py, &self.inner.device_handle()) }
    }

    /// Host backend: copies `nbytes` from src + `src_offset` into the peer's dst +
    /// `dst_offset` on this thread (the device's `put`); ranges are checked.
    fn put(&self, py: Python<'_>, dst_offset: u64, src_offset: u64, nbytes: u64) -> PyResult<()> {
        host_only("MemoryChannel.put")?;
        self.check_range("put", dst_offset, src_offset, nbytes)?;
        let h = self.inner.device_handle();
        // SAFETY: host backend: the handle's memory is this process's (the peer's mapped
        // here), alive while `self` lives; both ranges were checked above.
        py.detach(|| unsafe { h.put(dst_offset, src_offset, nbytes, 0, 1) })
            .py_ctx("MemoryChannel.put")
    }

    /// Host backend: signals the peer (after the puts before it).
    fn signal(&self) -> PyResult<()> {
        host_only("MemoryChannel.signal")?;
        use mscclpp::device_emu::memory_channel::MemorySemaphoreOps;
        // SAFETY: the semaphore's tokens are alive while `self` lives.
        unsafe { self.inner.device_handle().signal() };
        Ok(())
    }

    /// Host backend: waits for the peer's next signal, at most `timeout` seconds.
    #[pyo3(signature = (timeout=60.0))]
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        host_only("MemoryChannel.wait")?;
        let t = secs(timeout)?;
        let h = self.inner.device_handle();
        use mscclpp::device_emu::memory_channel::MemorySemaphoreOps;
        py.detach(|| {
            let _one = self.waiter.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: the semaphore's tokens are alive while `self` lives; `waiter` keeps to
            // one waiter at a time.
            unsafe { h.wait(t) }
        })
        .py_ctx("MemoryChannel.wait")
    }
}

/// The proxy service of port channels: a host thread that performs the transfers device
/// threads request through its FIFO.
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct ProxyService {
    inner: Mutex<mscclpp::ProxyService>,
}

impl ProxyService {
    fn lock(&self) -> std::sync::MutexGuard<'_, mscclpp::ProxyService> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl ProxyService {
    /// A proxy whose FIFO lives on this process's GPU (the CPU on the host backend).
    #[new]
    fn new() -> PyResult<Self> {
        crate::require_gpu("ProxyService")?;
        Ok(ProxyService {
            inner: Mutex::new(mscclpp::ProxyService::new().py()?),
        })
    }

    /// Adds a semaphore (a `Host2DeviceSemaphore` is made of it); returns its id.
    fn add_semaphore(&self, semaphore: &Semaphore) -> PyResult<u32> {
        let s = CoreH2D::new(semaphore.inner.clone()).py()?;
        self.lock().add_semaphore(s).py()
    }

    /// Adds a memory (this rank's or a peer's registration); returns its id.
    fn add_memory(&self, memory: &RegisteredMemory) -> PyResult<u32> {
        self.lock().add_memory(memory.inner.clone()).py()
    }

    /// A channel with only semaphore `semaphore_id`.
    fn base_port_channel(&self, semaphore_id: u32) -> PyResult<BasePortChannel> {
        Ok(BasePortChannel {
            inner: self.lock().base_port_channel(semaphore_id).py()?,
        })
    }

    /// A channel on semaphore `semaphore_id` putting from memory id `src` to memory id `dst`.
    fn port_channel(&self, semaphore_id: u32, dst: u32, src: u32) -> PyResult<PortChannel> {
        Ok(PortChannel {
            inner: self.lock().port_channel(semaphore_id, dst, src).py()?,
            waiter: Mutex::new(()),
        })
    }

    /// Starts the proxy thread.
    fn start_proxy(&self) -> PyResult<()> {
        self.lock().start_proxy().py()
    }

    /// Stops the proxy thread (after the requests in flight).
    fn stop_proxy(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.lock().stop_proxy()).py()
    }

    /// Requests handled so far.
    #[getter]
    fn handled(&self) -> u64 {
        self.lock().handled()
    }
}

/// A port channel with only its semaphore and the proxy's FIFO.
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct BasePortChannel {
    inner: mscclpp::BasePortChannel,
}

#[pymethods]
impl BasePortChannel {
    /// `BasePortChannelDeviceHandle` (64 bytes: semaphoreId u32, pad u32, the semaphore's
    /// 16, the FIFO's 40).
    fn device_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        // SAFETY: u32 id + u32 pad, then pointers and u32 size + u32 pad: no padding.
        unsafe { handle_bytes(py, &self.inner.device_handle()) }
    }

    /// The proxy's id of its semaphore.
    #[getter]
    fn semaphore_id(&self) -> u32 {
        self.inner.semaphore_id()
    }
}

/// A port channel: put/signal/flush requests that the proxy performs from memory `src` to
/// memory `dst` (ids of the proxy).
#[pyclass(module = "mscclpp._mscclpp", frozen)]
pub struct PortChannel {
    inner: mscclpp::PortChannel,
    /// Serializes `wait` (one waiter per handle, as for [`MemoryChannel`]).
    waiter: Mutex<()>,
}

#[pymethods]
impl PortChannel {
    /// `PortChannelDeviceHandle` (72 bytes: the base's 64, then dst and src memory ids).
    fn device_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        // SAFETY: the base handle then two u32: no padding.
        unsafe { handle_bytes(py, &self.inner.device_handle()) }
    }

    /// The destination's memory id.
    #[getter]
    fn dst(&self) -> u32 {
        self.inner.dst()
    }

    /// The source's memory id.
    #[getter]
    fn src(&self) -> u32 {
        self.inner.src()
    }

    /// The semaphore's id.
    #[getter]
    fn semaphore_id(&self) -> u32 {
        self.inner.base().semaphore_id()
    }

    /// Host backend: asks the proxy to copy `nbytes` from src + `src_offset` to dst +
    /// `dst_offset`, then signal the peer; returns when the request is queued (the proxy
    /// checks the ranges; `flush` waits for it).
    #[pyo3(signature = (dst_offset, src_offset, nbytes, timeout=60.0))]
    fn put_with_signal(
        &self,
        py: Python<'_>,
        dst_offset: u64,
        src_offset: u64,
        nbytes: u64,
        timeout: f64,
    ) -> PyResult<()> {
        host_only("PortChannel.put_with_signal")?;
        let t = secs(timeout)?;
        let h = self.inner.device_handle();
        // SAFETY: host backend: the FIFO and semaphore are this process's, alive while the
        // channel (which holds the proxy's state) lives.
        py.detach(|| unsafe { h.put_with_signal(dst_offset, src_offset, nbytes, t) })
            .py_ctx("PortChannel.put_with_signal")
    }

    /// Host backend: waits until the proxy has done every request before it.
    #[pyo3(signature = (timeout=60.0))]
    fn flush(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        host_only("PortChannel.flush")?;
        let t = secs(timeout)?;
        let h = self.inner.device_handle();
        // SAFETY: as put_with_signal.
        py.detach(|| unsafe { h.flush(t) })
            .py_ctx("PortChannel.flush")
    }

    /// Host backend: waits for the peer's signal, at most `timeout` seconds.
    #[pyo3(signature = (timeout=60.0))]
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        host_only("PortChannel.wait")?;
        let t = secs(timeout)?;
        let h = self.inner.device_handle();
        py.detach(|| {
            let _one = self.waiter.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: as put_with_signal; `waiter` keeps to one waiter at a time.
            unsafe { h.wait(t) }
        })
        .py_ctx("PortChannel.wait")
    }
}

/// `Communicator.register_memory`: `buf` (a `RawGpuBuffer`, or a buffer inside memory this
/// library allocated) for `transports`.
pub fn register(
    comm: &mscclpp::Communicator,
    buf: &Bound<'_, PyAny>,
    transports: &Bound<'_, PyAny>,
) -> PyResult<RegisteredMemory> {
    let flags = parse_transports(transports)?;
    let b = extract(buf, "buffer", false)?;
    let inner = comm
        .register_memory(b.ptr, b.nbytes, flags)
        .py_ctx("register_memory")?;
    Ok(RegisteredMemory {
        inner,
        _owner: Some(buf.clone().unbind()),
    })
}

/// `Communicator.recv_memory`.
pub fn recv_memory(comm: &mscclpp::Communicator, remote_rank: usize, tag: u64) -> Future {
    Future::new(Pending::Memory(comm.recv_memory(remote_rank, tag)))
}

/// `Communicator.connect`.
pub fn connect(
    comm: &mscclpp::Communicator,
    remote_rank: usize,
    tag: u64,
    transport: &str,
    device: Option<i32>,
) -> PyResult<Future> {
    let cfg = EndpointConfig::new(parse_transport(transport)?, endpoint_device(device)?);
    Ok(Future::new(Pending::Connection(comm.connect(
        cfg,
        remote_rank,
        tag,
    ))))
}

/// `Communicator.build_semaphore`.
pub fn build_semaphore(
    comm: &mscclpp::Communicator,
    connection: &Connection,
    remote_rank: usize,
    tag: u64,
) -> Future {
    Future::new(Pending::Semaphore(comm.build_semaphore(
        &connection.inner,
        remote_rank,
        tag,
    )))
}
