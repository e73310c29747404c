//! Semaphores, host side: monotonic u64 tokens in memory, signalled over a connection.
//!
//! A [`SemaphoreStub`] is the local token (on the connection's local device: host memfd memory
//! for `Device::CPU`, GPU memory otherwise; host-mapped GPU memory for Ethernet, whose
//! receive thread stores signals with the CPU) registered for the connection's transport; the
//! peer's stub memory arrives through the communicator and together they make a
//! [`Semaphore`]. The typed semaphores add the counters and device handles. Tokens only grow.
//!
//! Host-side waits watch their connection's health: a peer the connection already knows is
//! gone (closed, died, broken) ends the wait at once with an error naming the rank, instead of
//! running the whole timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::connection::Connection;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::memory::{host_addressable, LocalMemory};
use crate::registered_memory::RegisteredMemory;
use crate::transport::{Device, DeviceType, Transport};
use mscclpp_hal::MemoryKind;

/// A local semaphore token: 8 zeroed bytes on the connection's local device, registered for
/// the connection's transport.
#[derive(Clone, Debug)]
pub struct SemaphoreStub {
    token: LocalMemory,
    registered: RegisteredMemory,
}

impl SemaphoreStub {
    /// Allocates and registers a token for `connection`.
    pub fn new(context: &Context, connection: &Connection) -> Result<SemaphoreStub> {
        let device = connection.local_device();
        // Ethernet stores incoming signals with the receive thread's CPU: into pinned host
        // memory the kernels poll, never through a GPU copy (connection/ethernet, module doc).
        let kind = if connection.transport() == Transport::Ethernet && !host_addressable(device) {
            MemoryKind::HostMapped
        } else {
            MemoryKind::Device
        };
        let token = LocalMemory::alloc_kind(device, 8, kind)?;
        let registered = context.register_buffer(&token, connection.transport().into())?;
        Ok(SemaphoreStub { token, registered })
    }
    /// The registered token (what is sent to the peer).
    pub fn memory(&self) -> &RegisteredMemory {
        &self.registered
    }
    /// The device address of the token.
    pub fn token_ptr(&self) -> u64 {
        self.token.ptr()
    }
}

/// A pair of tokens over one connection: the local inbound token the peer signals, and the
/// peer's token this side signals.
#[derive(Clone, Debug)]
pub struct Semaphore {
    local: SemaphoreStub,
    remote: RegisteredMemory,
    connection: Connection,
}

impl Semaphore {
    /// Joins a local stub with the peer's token memory.
    pub fn new(
        local: SemaphoreStub,
        remote: RegisteredMemory,
        connection: Connection,
    ) -> Result<Semaphore> {
        if remote.size() < 8 {
            return Err(Error::invalid(format!(
                "Semaphore: expected a remote token of at least 8 bytes, got {}",
                remote.size()
            )));
        }
        Ok(Semaphore {
            local,
            remote,
            connection,
        })
    }
    /// The connection signals travel over.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }
    /// The local token.
    pub fn local(&self) -> &SemaphoreStub {
        &self.local
    }
    /// The peer's token.
    pub fn remote_memory(&self) -> &RegisteredMemory {
        &self.remote
    }
    /// Reads the local inbound token (acquire).
    pub fn read_inbound(&self) -> Result<u64> {
        let t = &self.local.token;
        if let Some(host) = t.allocation().host_address(t.ptr()) {
            // SAFETY: the token is 8 aligned bytes of the live allocation `t`; every access to
            // it (local or from peers) is atomic.
            let atom = unsafe { AtomicU64::from_ptr(host.cast::<u64>()) };
            Ok(atom.load(Ordering::Acquire))
        } else {
            t.read_u64(0)
        }
    }
}

/// `#[repr(C)]` handle of a [`Host2DeviceSemaphore`] for kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Host2DeviceSemaphoreDeviceHandle {
    /// The token the host signals (increments).
    pub inbound_token: *mut u64,
    /// The value the next `wait` expects (device memory, advanced by `wait`/`poll`).
    pub expected_inbound_token: *mut u64,
}

/// `#[repr(C)]` handle of a [`MemoryDevice2DeviceSemaphore`] for kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryDevice2DeviceSemaphoreDeviceHandle {
    /// This side's inbound token: the peer's `signal` increments it.
    pub inbound_token: *mut u64,
    /// The peer's inbound token (mapped here): this side's `signal` increments it.
    pub remote_inbound_token: *mut u64,
    /// The value this side's next `wait` expects.
    pub expected_inbound_token: *mut u64,
}

device_handle_thread_safe!(
    Host2DeviceSemaphoreDeviceHandle,
    MemoryDevice2DeviceSemaphoreDeviceHandle
);

/// Allocates the expected-token counter of a device-waited semaphore on `device`.
fn expected_token(device: Device) -> Result<LocalMemory> {
    LocalMemory::alloc(device, 8)
}

/// The outbound token of a semaphore the host signals, and the lock that orders its signals.
#[derive(Debug, Default)]
struct HostSignaller {
    token: AtomicU64,
    lock: Mutex<()>,
}

impl HostSignaller {
    /// Increments the peer's token of `semaphore` (after every earlier write of its
    /// connection).
    fn signal(&self, semaphore: &Semaphore) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let next = self.token.load(Ordering::Acquire) + 1;
        semaphore
            .connection
            .update_and_sync(&semaphore.remote, 0, &self.token, next)
    }
}

/// The host signals, a GPU waits.
#[derive(Debug)]
pub struct Host2DeviceSemaphore {
    semaphore: Semaphore,
    outbound: HostSignaller,
    expected: LocalMemory,
}

impl Host2DeviceSemaphore {
    /// Wraps `semaphore`; allocates the expected-token counter on the local device.
    pub fn new(semaphore: Semaphore) -> Result<Host2DeviceSemaphore> {
        let expected = expected_token(semaphore.connection.local_device())?;
        Ok(Host2DeviceSemaphore {
            semaphore,
            outbound: HostSignaller::default(),
            expected,
        })
    }
    /// Increments the peer's token (after every earlier write of the connection).
    pub fn signal(&self) -> Result<()> {
        self.outbound.signal(&self.semaphore)
    }
    /// The connection.
    pub fn connection(&self) -> &Connection {
        &self.semaphore.connection
    }
    /// The underlying semaphore.
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }
    /// The handle kernels wait on. The semaphore must outlive every kernel using it.
    pub fn device_handle(&self) -> Host2DeviceSemaphoreDeviceHandle {
        Host2DeviceSemaphoreDeviceHandle {
            inbound_token: self.semaphore.local.token_ptr() as usize as *mut u64,
            expected_inbound_token: self.expected.ptr() as usize as *mut u64,
        }
    }
}

/// The host signals and the host waits (CPU endpoints).
#[derive(Debug)]
pub struct Host2HostSemaphore {
    semaphore: Semaphore,
    outbound: HostSignaller,
    expected: AtomicU64,
}

impl Host2HostSemaphore {
    /// Wraps `semaphore`, whose connection's local device must be the CPU.
    pub fn new(semaphore: Semaphore) -> Result<Host2HostSemaphore> {
        let d = semaphore.connection.local_device();
        if d.kind != DeviceType::Cpu {
            return Err(Error::invalid(format!(
                "Host2HostSemaphore: expected a connection whose local device is the CPU, got \
                 {d:?}"
            )));
        }
        Ok(Host2HostSemaphore {
            semaphore,
            outbound: HostSignaller::default(),
            expected: AtomicU64::new(0),
        })
    }
    /// Increments the peer's token (after every earlier write of the connection).
    pub fn signal(&self) -> Result<()> {
        self.outbound.signal(&self.semaphore)
    }
    /// Consumes one signal if it arrived; never blocks.
    pub fn poll(&self) -> bool {
        let want = self.expected.load(Ordering::Relaxed) + 1;
        match self.semaphore.read_inbound() {
            Ok(v) if v >= want => {
                self.expected.store(want, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }
    /// Waits (at most `timeout`) for the next signal. Ends early with the connection's error
    /// (naming the peer's rank) once the connection knows the peer is gone.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut backoff = Backoff::new(
            63,
            192,
            Duration::from_micros(50),
            Duration::from_micros(50),
        );
        let mut last_health = start;
        loop {
            if self.poll() {
                return Ok(());
            }
            let conn = &self.semaphore.connection;
            if backoff.is_sleeping() && last_health.elapsed() >= HEALTH_INTERVAL {
                last_health = Instant::now();
                if let Err(e) = conn.health().and_then(|()| crate::backoff::check_watches()) {
                    // A signal may have landed just before the peer went: take it first.
                    if self.poll() {
                        return Ok(());
                    }
                    return Err(e);
                }
            }
            if start.elapsed() >= timeout {
                let got = self.semaphore.read_inbound().unwrap_or(0);
                return Err(Error::timeout(
                    format!(
                        "Host2HostSemaphore over {} from {}: waiting for token {}, got {got}",
                        conn.transport(),
                        peer_name(conn),
                        self.expected.load(Ordering::Relaxed) + 1
                    ),
                    timeout,
                ));
            }
            backoff.snooze();
        }
    }
    /// The connection.
    pub fn connection(&self) -> &Connection {
        &self.semaphore.connection
    }
    /// The underlying semaphore.
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }
}

/// How often a host wait asks its connection whether the peer is still there.
const HEALTH_INTERVAL: Duration = Duration::from_millis(1);

/// "rank N" when the connection knows its peer's rank, else "an unknown rank".
fn peer_name(c: &Connection) -> String {
    match c.remote_rank() {
        Some(r) => format!("rank {r}"),
        None => "a peer of unknown rank".to_string(),
    }
}

/// A GPU signals a GPU through mapped memory (CudaIpc connections only).
#[derive(Debug)]
pub struct MemoryDevice2DeviceSemaphore {
    semaphore: Semaphore,
    expected: LocalMemory,
}

impl MemoryDevice2DeviceSemaphore {
    /// Wraps `semaphore`, whose connection must be CudaIpc (the peer token is mapped here).
    pub fn new(semaphore: Semaphore) -> Result<MemoryDevice2DeviceSemaphore> {
        let t = semaphore.connection.transport();
        if t != Transport::CudaIpc {
            return Err(Error::invalid(format!(
                "MemoryDevice2DeviceSemaphore: expected a CudaIpc connection, got {t}"
            )));
        }
        if semaphore.remote.data() == 0 {
            return Err(Error::invalid(
                "MemoryDevice2DeviceSemaphore: the peer token is not mapped in this process"
                    .to_string(),
            ));
        }
        let expected = expected_token(semaphore.connection.local_device())?;
        Ok(MemoryDevice2DeviceSemaphore {
            semaphore,
            expected,
        })
    }
    /// The underlying semaphore.
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }
    /// The handle kernels signal and wait on. The semaphore must outlive every kernel using it.
    pub fn device_handle(&self) -> MemoryDevice2DeviceSemaphoreDeviceHandle {
        MemoryDevice2DeviceSemaphoreDeviceHandle {
            inbound_token: self.semaphore.local.token_ptr() as usize as *mut u64,
            remote_inbound_token: self.semaphore.remote.data() as usize as *mut u64,
            expected_inbound_token: self.expected.ptr() as usize as *mut u64,
        }
    }
}
