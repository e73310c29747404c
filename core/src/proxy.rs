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
//! device's `flush()` waits on. The thread spins briefly when idle, then yields, then sleeps in
//! short steps. The thread binds itself to the CPUs of the FIFO's GPU's NUMA node when that
//! node is known (not -1); a failed bind only logs a warning.
//!
//! # Failures
//! A failed request is still popped (the device never hangs on a request the proxy gave up
//! on), and it is made visible: the FIFO's failed-trigger count (read by the device, see
//! [`crate::fifo`]) is raised before the pop, and the host API keeps the first and last error
//! and the count ([`ProxyService::last_error`], [`ProxyService::failed_requests`], the result
//! of [`ProxyService::stop_proxy`]). The first [`LOGGED_FAILURES`] failures are logged one by
//! one, later ones as one summary line at most every [`SUMMARY_INTERVAL`] and at stop.
//!
//! A connection whose operation failed fatally (a flush timed out behind a frozen peer, the
//! peer died) is broken (see [`crate::connection`]): its later requests fail at once, so a
//! frozen peer costs one flush timeout, not one per queued request.
//!
//! # Stopping
//! [`ProxyService::stop_proxy`] (and drop) handles every trigger already published, then joins
//! the thread, all within one flush timeout: flushes started after the stop wait only until
//! that deadline, requests still queued past it fail at once, and an operation still blocked on
//! a peer at the deadline has its connection aborted (broken for good: the peer did not answer
//! for a whole flush timeout).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::connection::Connection;
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

/// Failures logged one by one before the proxy only logs summaries.
pub const LOGGED_FAILURES: u64 = 10;
/// The least time between two summary lines of failures not logged one by one.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);
/// How long `stop_proxy` waits, after the stop deadline, for an aborted operation to return.
const ABORT_GRACE: Duration = Duration::from_millis(500);

#[derive(Default)]
struct ErrorLog {
    first: Option<Error>,
    last: Option<String>,
    /// Failures since the last stop.
    count: u64,
    /// Failures since start (not reset by stop).
    total: u64,
    /// Failures neither logged one by one nor in a summary yet.
    unlogged: u64,
    last_summary: Option<Instant>,
}

impl ErrorLog {
    /// Logs the summary of unlogged failures, if any.
    fn summarize(&mut self) {
        if self.unlogged > 0 {
            crate::log_warn!(
                "PROXY",
                "{} more proxy request failures not logged one by one ({} in all); the latest: {}",
                self.unlogged,
                self.total,
                self.last.as_deref().unwrap_or("?")
            );
            self.unlogged = 0;
        }
        self.last_summary = Some(Instant::now());
    }
}

/// What the proxy thread and the channels share: the FIFO, semaphores and memories.
pub struct ProxyShared {
    fifo: Fifo,
    semaphores: Mutex<Vec<Arc<Host2DeviceSemaphore>>>,
    memories: Mutex<Vec<RegisteredMemory>>,
    generation: AtomicU64,
    errors: Mutex<ErrorLog>,
    handled: AtomicU64,
    /// Set by `stop_proxy`: flushes wait no longer than this, later requests fail.
    stop_deadline: Mutex<Option<Instant>>,
    /// The semaphore whose connection the thread is operating on (`usize::MAX`: none); its
    /// connection is aborted if it blocks past the stop deadline.
    current: AtomicUsize,
}

impl ProxyShared {
    fn record(&self, e: Error) {
        let mut log = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        log.total += 1;
        log.count += 1;
        log.last = Some(e.to_string());
        if log.total <= LOGGED_FAILURES {
            crate::log_warn!("PROXY", "proxy request failed: {e}");
            if log.total == LOGGED_FAILURES {
                crate::log_warn!(
                    "PROXY",
                    "{LOGGED_FAILURES} proxy request failures logged; further ones are summarized \
                     at most every {SUMMARY_INTERVAL:?}"
                );
                log.last_summary = Some(Instant::now());
            }
        } else {
            log.unlogged += 1;
            if log
                .last_summary
                .is_none_or(|t| t.elapsed() >= SUMMARY_INTERVAL)
            {
                log.summarize();
            }
        }
        if log.first.is_none() {
            log.first = Some(e);
        }
    }

    fn deadline(&self) -> Option<Instant> {
        *self.stop_deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection of the semaphore the thread is operating on, if any.
    fn current_connection(&self) -> Option<Connection> {
        let i = self.current.load(Ordering::Acquire);
        self.semaphores
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(i)
            .map(|s| s.connection().clone())
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
                stop_deadline: Mutex::new(None),
                current: AtomicUsize::new(usize::MAX),
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
        self.add_entry(
            &self.shared.semaphores,
            Arc::new(semaphore),
            MAX_SEMAPHORE_ID,
            "add_semaphore",
            "semaphores",
        )
    }

    /// Adds a memory (local source or remote destination of puts).
    pub fn add_memory(&self, memory: RegisteredMemory) -> Result<MemoryId> {
        self.add_entry(
            &self.shared.memories,
            memory,
            MAX_MEMORY_ID,
            "add_memory",
            "memories",
        )
    }

    /// Appends `item` to `table` and returns its id, which must fit in a trigger (at most
    /// `max_id`); a new entry bumps the generation the proxy thread's caches compare against.
    fn add_entry<T>(
        &self,
        table: &Mutex<Vec<T>>,
        item: T,
        max_id: u32,
        call: &str,
        what: &str,
    ) -> Result<u32> {
        let mut v = table.lock().unwrap_or_else(|p| p.into_inner());
        let id = v.len() as u32;
        if id > max_id {
            return Err(Error::invalid(format!(
                "ProxyService::{call}: at most {} {what} fit in a trigger",
                max_id + 1
            )));
        }
        v.push(item);
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

    /// Requests that failed since the proxy was created (the device reads the same count from
    /// the FIFO).
    pub fn failed_requests(&self) -> u64 {
        self.shared.fifo.failed()
    }

    /// Starts the proxy thread (no-op if running).
    pub fn start_proxy(&mut self) -> Result<()> {
        if let Some(t) = &self.thread {
            if !self.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            if !t.is_finished() {
                return Err(Error::invalid(
                    "ProxyService::start_proxy: the previous proxy thread is still blocked on a \
                     peer after stop_proxy; expected it to have finished"
                        .to_string(),
                ));
            }
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
        self.stop.store(false, Ordering::Release);
        *self
            .shared
            .stop_deadline
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
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

    /// Handles every trigger already published, stops and joins the thread, within one flush
    /// timeout (see "Stopping" in the module docs); returns the first error any request met
    /// since the last stop (then forgets it).
    pub fn stop_proxy(&mut self) -> Result<()> {
        if let Some(t) = self.thread.take() {
            // A second stop (after an overrun) keeps the first deadline.
            let deadline = *self
                .shared
                .stop_deadline
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| Instant::now() + self.flush_timeout);
            self.stop.store(true, Ordering::Release);
            let mut backoff =
                Backoff::sleeping(Duration::from_micros(50), Duration::from_millis(5));
            let mut aborted = false;
            while !t.is_finished() {
                if !aborted && Instant::now() >= deadline {
                    // Blocked on a peer for a whole flush timeout: break that connection.
                    if let Some(c) = self.shared.current_connection() {
                        c.abort(
                            "the proxy's stop deadline passed while a request waited on the peer",
                        );
                    }
                    aborted = true;
                }
                if aborted && Instant::now() >= deadline + ABORT_GRACE {
                    // Still blocked (a transport without abort): leave the thread detached; it
                    // owns only shared state and ends when its operation returns.
                    crate::log_warn!(
                        "PROXY",
                        "the proxy thread did not stop within its flush timeout \
                         ({:?}); left to finish on its own",
                        self.flush_timeout
                    );
                    self.record_stop_overrun();
                    self.thread = Some(t);
                    return self.take_errors();
                }
                backoff.snooze();
            }
            if t.join().is_err() {
                return Err(Error::Internal("the proxy thread panicked".into()));
            }
        }
        self.take_errors()
    }

    fn record_stop_overrun(&self) {
        self.shared.record(Error::timeout(
            "stopping the proxy: a request was still blocked on its peer at the deadline",
            self.flush_timeout,
        ));
    }

    /// The first error since the last stop (with the count), then forgets them.
    fn take_errors(&self) -> Result<()> {
        let mut log = self.shared.errors.lock().unwrap_or_else(|p| p.into_inner());
        log.summarize();
        let n = log.count;
        log.count = 0;
        log.last = None;
        match log.first.take() {
            // The first failure's class (a dead peer's RemoteError, a frozen one's Timeout)
            // and its rank are kept: the count is context, not a new internal error.
            Some(e) if n > 1 => Err(e.context(format!("{n} proxy requests failed; the first"))),
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
            // The deadline is stored before the stop flag is raised.
            let deadline = if stop.load(Ordering::Acquire) {
                shared.deadline()
            } else {
                None
            };
            let r = match deadline {
                None => handle_trigger(&trigger, &tables, flush_timeout, shared),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        Err(Error::Aborted(format!(
                            "proxy request {trigger:x?} not carried out: the proxy was stopping \
                             and its deadline ({flush_timeout:?} after the stop) had passed"
                        )))
                    } else {
                        handle_trigger(&trigger, &tables, flush_timeout.min(left), shared)
                    }
                }
            };
            shared.current.store(usize::MAX, Ordering::Release);
            if let Err(e) = r {
                shared.record(e);
                shared.fifo.record_failure();
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

/// A failed request's error, naming the peer: a transport error of a connection that knows
/// its rank (an EOF, a reset, a broken connection) is [`Error::Remote`] for that rank; a
/// timeout stays a timeout and a bad request stays invalid usage, both with the rank in front.
fn name_the_peer(e: Error, t: &ProxyTrigger, peer: Option<usize>) -> Error {
    let Some(rank) = peer else {
        return e;
    };
    match e {
        Error::Remote { .. } => e,
        Error::Io { .. } | Error::Hal { .. } | Error::Internal(_) => Error::remote(
            rank,
            format!("proxy request {t:x?} to rank {rank} failed: {e}"),
        ),
        e => e.context(format!("proxy request to rank {rank}")),
    }
}

fn handle_trigger(
    t: &ProxyTrigger,
    tables: &Tables,
    flush_timeout: Duration,
    shared: &ProxyShared,
) -> Result<()> {
    let peer = tables
        .semaphores
        .get(t.semaphore_id() as usize)
        .and_then(|s| s.connection().remote_rank());
    carry_out(t, tables, flush_timeout, shared).map_err(|e| name_the_peer(e, t, peer))
}

fn carry_out(
    t: &ProxyTrigger,
    tables: &Tables,
    flush_timeout: Duration,
    shared: &ProxyShared,
) -> Result<()> {
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
    shared.current.store(sid, Ordering::Release);
    crate::log_trace!(
        "PROXY",
        "trigger type {ty:#x} semaphore {sid} memories {}<-{} offsets {}<-{} size {}",
        t.dst_memory_id(),
        t.src_memory_id(),
        t.dst_offset(),
        t.src_offset(),
        t.size()
    );
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
