//! The proxy service: a host thread that serves a FIFO of device requests.
//!
//! Device code pushes [`ProxyTrigger`]s through port channels; the proxy thread polls the FIFO
//! and, per trigger (type bits combinable, handled in this order):
//! - Data: `connection.write(dst memory, dst offset, src memory, src offset, size)` over the
//!   connection of the trigger's semaphore;
//! - Flag: the semaphore's host-side `signal()` (update-and-sync of the peer's inbound token);
//! - Sync: `connection.flush(timeout)`;
//!
//! then pops the trigger (release-stores tail + 1). The tail is the flush-done position the
//! device's `flush()` waits on. A failed operation is recorded (see [`ProxyService::last_error`]
//! and [`ProxyService::stop_proxy`]) and the trigger is still popped, so the device never hangs
//! on a request the proxy gave up on. The thread spins briefly when idle, then yields, then
//! sleeps in short steps. [`ProxyService::stop_proxy`] (and drop) first handles every trigger
//! already published, then joins the thread. The thread binds itself to the CPUs of the
//! FIFO's GPU's NUMA node when that node is known (not -1); a failed bind only logs a warning.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::fifo::{
    Fifo, ProxyTrigger, DEFAULT_FIFO_SIZE, MAX_MEMORY_ID, MAX_SEMAPHORE_ID, TRIGGER_DATA,
    TRIGGER_FLAG, TRIGGER_SYNC,
};
use crate::port_channel::{BasePortChannel, MemoryId, PortChannel, SemaphoreId};
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::Host2DeviceSemaphore;

/// How long a Sync trigger's flush may take by default.
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct ErrorLog {
    first: Option<Error>,
    last: Option<String>,
    count: u64,
}

/// What the proxy thread and the channels share: the FIFO, semaphores and memories.
pub struct ProxyShared {
    fifo: Fifo,
    semaphores: Mutex<Vec<Arc<Host2DeviceSemaphore>>>,
    memories: Mutex<Vec<RegisteredMemory>>,
    generation: AtomicU64,
    errors: Mutex<ErrorLog>,
    handled: AtomicU64,
}

impl ProxyShared {
    fn record(&self, e: Error) {
        let mut log = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        crate::log_warn!("PROXY", "proxy request failed: {e}");
        log.last = Some(e.to_string());
        log.count += 1;
        if log.first.is_none() {
            log.first = Some(e);
        }
    }
}

/// Serves port channels: owns the FIFO, the semaphores and the memories they name.
pub struct ProxyService {
    shared: Arc<ProxyShared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    flush_timeout: Duration,
    numa_node: i32,
}

impl ProxyService {
    /// A proxy whose FIFO lives on the GPU this process uses (the host backend's "device" on a
    /// host-only build), with [`DEFAULT_FIFO_SIZE`] slots.
    pub fn new() -> Result<Self> {
        Self::with_fifo(Fifo::new(DEFAULT_FIFO_SIZE)?)
    }

    /// A proxy whose "device" is the CPU (CPU threads push with [`crate::device_emu`]), whatever
    /// the build's GPU backend.
    pub fn new_host() -> Result<Self> {
        Self::with_fifo(Fifo::new_host(DEFAULT_FIFO_SIZE)?)
    }

    /// A proxy serving `fifo`.
    pub fn with_fifo(fifo: Fifo) -> Result<Self> {
        let numa_node = fifo.numa_node();
        Ok(ProxyService {
            shared: Arc::new(ProxyShared {
                fifo,
                semaphores: Mutex::new(Vec::new()),
                memories: Mutex::new(Vec::new()),
                generation: AtomicU64::new(0),
                errors: Mutex::new(ErrorLog::default()),
                handled: AtomicU64::new(0),
            }),
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
            flush_timeout: DEFAULT_FLUSH_TIMEOUT,
            numa_node,
        })
    }

    /// Sets how long a Sync trigger's flush may take (before `start_proxy`).
    pub fn set_flush_timeout(&mut self, timeout: Duration) {
        self.flush_timeout = timeout;
    }

    /// Adds a semaphore; its connection carries the Data/Flag/Sync requests of channels on it.
    pub fn add_semaphore(&self, semaphore: Host2DeviceSemaphore) -> Result<SemaphoreId> {
        let mut v = self
            .shared
            .semaphores
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let id = v.len() as u32;
        if id > MAX_SEMAPHORE_ID {
            return Err(Error::invalid(format!(
                "ProxyService::add_semaphore: at most {} semaphores fit in a trigger",
                MAX_SEMAPHORE_ID + 1
            )));
        }
        v.push(Arc::new(semaphore));
        self.shared.generation.fetch_add(1, Ordering::Release);
        Ok(id)
    }

    /// Adds a memory (local source or remote destination of puts).
    pub fn add_memory(&self, memory: RegisteredMemory) -> Result<MemoryId> {
        let mut v = self
            .shared
            .memories
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let id = v.len() as u32;
        if id > MAX_MEMORY_ID {
            return Err(Error::invalid(format!(
                "ProxyService::add_memory: at most {} memories fit in a trigger",
                MAX_MEMORY_ID + 1
            )));
        }
        v.push(memory);
        self.shared.generation.fetch_add(1, Ordering::Release);
        Ok(id)
    }

    /// The semaphore `id`.
    pub fn semaphore(&self, id: SemaphoreId) -> Result<Arc<Host2DeviceSemaphore>> {
        let v = self
            .shared
            .semaphores
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        v.get(id as usize).cloned().ok_or_else(|| {
            Error::invalid(format!(
                "ProxyService: expected a semaphore id below {}, got {id}",
                v.len()
            ))
        })
    }

    /// A channel on semaphore `id` with explicit memory ids per request.
    pub fn base_port_channel(&self, id: SemaphoreId) -> Result<BasePortChannel> {
        let sem = self.semaphore(id)?;
        Ok(BasePortChannel::new(
            id,
            sem.device_handle(),
            self.shared.fifo.device_handle(),
            self.shared.clone(),
        ))
    }

    /// A channel on semaphore `id` putting from memory `src` to memory `dst`.
    pub fn port_channel(
        &self,
        id: SemaphoreId,
        dst: MemoryId,
        src: MemoryId,
    ) -> Result<PortChannel> {
        let n = self
            .shared
            .memories
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len() as u32;
        if dst >= n || src >= n {
            return Err(Error::invalid(format!("ProxyService::port_channel: expected memory ids below {n}, got dst {dst}, src {src}")));
        }
        Ok(PortChannel::new(self.base_port_channel(id)?, dst, src))
    }

    /// The FIFO (for tests and for device code that pushes raw triggers).
    pub fn fifo(&self) -> &Fifo {
        &self.shared.fifo
    }

    /// Triggers handled so far.
    pub fn handled(&self) -> u64 {
        self.shared.handled.load(Ordering::Relaxed)
    }

    /// Starts the proxy thread (no-op if running).
    pub fn start_proxy(&mut self) -> Result<()> {
        if self.thread.is_some() {
            return Ok(());
        }
        self.stop.store(false, Ordering::Release);
        let shared = self.shared.clone();
        let stop = self.stop.clone();
        let timeout = self.flush_timeout;
        let numa_node = self.numa_node;
        let handle = std::thread::Builder::new()
            .name("mscclpp-proxy".into())
            .spawn(move || {
                bind_proxy_thread(numa_node);
                proxy_loop(&shared, &stop, timeout)
            })
            .map_err(|e| Error::io("spawning the proxy thread", e))?;
        self.thread = Some(handle);
        Ok(())
    }

    /// Handles every trigger already published, stops and joins the thread; returns the first
    /// error any request met since the last stop (then forgets it).
    pub fn stop_proxy(&mut self) -> Result<()> {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::Release);
            if t.join().is_err() {
                return Err(Error::Internal("the proxy thread panicked".into()));
            }
        }
        let mut log = self.shared.errors.lock().unwrap_or_else(|p| p.into_inner());
        let n = log.count;
        log.count = 0;
        log.last = None;
        match log.first.take() {
            Some(e) if n > 1 => Err(Error::Internal(format!(
                "{n} proxy requests failed; the first: {e}"
            ))),
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The message of the most recent failed request, if any (cleared by `stop_proxy`).
    pub fn last_error(&self) -> Option<String> {
        self.shared
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last
            .clone()
    }
}

/// Binds the calling (proxy) thread to the GPU's NUMA node when it is known (>= 0). Binding is
/// an optimisation: a failure is logged as a warning and the thread runs unbound.
fn bind_proxy_thread(numa_node: i32) {
    if numa_node < 0 {
        return; // unknown (e.g. a GPU on a VM): don't bind
    }
    match mscclpp_hal::auxil::numa::bind_current_thread_to_node(numa_node) {
        Ok(_) => crate::log_info!("PROXY", "proxy thread bound to NUMA node {numa_node}"),
        Err(e) => crate::log_warn!(
            "PROXY",
            "could not bind the proxy thread to NUMA node {numa_node}, running unbound: {e}"
        ),
    }
}

impl Drop for ProxyService {
    fn drop(&mut self) {
        if let Err(e) = self.stop_proxy() {
            crate::log_warn!("PROXY", "proxy stopped with an error nobody collected: {e}");
        }
    }
}

struct Tables {
    generation: u64,
    semaphores: Vec<Arc<Host2DeviceSemaphore>>,
    memories: Vec<RegisteredMemory>,
}

impl Tables {
    fn refresh(&mut self, shared: &ProxyShared) {
        let g = shared.generation.load(Ordering::Acquire);
        if g != self.generation {
            self.semaphores = shared
                .semaphores
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            self.memories = shared
                .memories
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            self.generation = g;
        }
    }
}

/// Empty polls the proxy spins through before it starts to yield and then sleep.
const SPIN_POLLS: u32 = 2048;

fn proxy_loop(shared: &ProxyShared, stop: &AtomicBool, flush_timeout: Duration) {
    let mut tables = Tables {
        generation: u64::MAX,
        semaphores: Vec::new(),
        memories: Vec::new(),
    };
    // Spin first; read the clock only once spinning is over: a clock read per trigger is
    // measurable on VMs without a fast clock source (the proxy's hot path).
    let mut backoff = Backoff::new(
        SPIN_POLLS - 1,
        0,
        Duration::from_micros(20),
        Duration::from_micros(20),
    )
    .yielding_for(Duration::from_millis(5));
    loop {
        if let Some(trigger) = shared.fifo.poll() {
            tables.refresh(shared);
            if let Err(e) = handle_trigger(&trigger, &tables, flush_timeout) {
                shared.record(e);
            }
            shared.fifo.pop();
            shared.handled.fetch_add(1, Ordering::Relaxed);
            backoff.reset();
            continue;
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        backoff.snooze();
    }
}

fn handle_trigger(t: &ProxyTrigger, tables: &Tables, flush_timeout: Duration) -> Result<()> {
    let ty = t.trigger_type();
    if ty == 0 {
        return Err(Error::invalid(format!(
            "proxy: trigger {t:x?} has no type bits"
        )));
    }
    let sid = t.semaphore_id() as usize;
    let sem = tables.semaphores.get(sid).ok_or_else(|| {
        Error::invalid(format!(
            "proxy: trigger names semaphore {sid}, expected one below {}",
            tables.semaphores.len()
        ))
    })?;
    if ty & TRIGGER_DATA != 0 {
        let mem = |id: u32, what: &str| {
            tables.memories.get(id as usize).ok_or_else(|| {
                Error::invalid(format!(
                    "proxy: trigger names {what} memory {id}, expected one below {}",
                    tables.memories.len()
                ))
            })
        };
        let (dst, src) = (
            mem(t.dst_memory_id(), "destination")?,
            mem(t.src_memory_id(), "source")?,
        );
        sem.connection()
            .write(dst, t.dst_offset(), src, t.src_offset(), t.size())?;
    }
    if ty & TRIGGER_FLAG != 0 {
        sem.signal()?;
    }
    if ty & TRIGGER_SYNC != 0 {
        sem.connection().flush(flush_timeout)?;
    }
    Ok(())
}
