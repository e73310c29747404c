//! The process-global "current test" state that assertions record into, the registry the
//! `TEST!` macros fill before `main`, the `TestContext`, fixtures, and the private helpers the
//! macros expand to.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

/// One registered test, as the `TEST!`/`PERF_TEST!` macros describe it.
#[derive(Clone, Copy)]
pub struct TestCase {
    /// The suite name (first argument of `TEST!`).
    pub suite: &'static str,
    /// The test name.
    pub name: &'static str,
    /// The source file that defines it.
    pub file: &'static str,
    /// Its line there.
    pub line: u32,
    /// Whether it is a `PERF_TEST!`.
    pub is_perf: bool,
    /// The test body (for fixture tests: setup, body, teardown).
    pub body: fn(&TestContext),
}

impl TestCase {
    /// `Suite.Name`.
    pub fn full_name(&self) -> String {
        format!("{}.{}", self.suite, self.name)
    }
}

impl std::fmt::Debug for TestCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCase")
            .field("suite", &self.suite)
            .field("name", &self.name)
            .field("file", &self.file)
            .field("line", &self.line)
            .field("is_perf", &self.is_perf)
            .finish()
    }
}

static REGISTRY: Mutex<Vec<TestCase>> = Mutex::new(Vec::new());

/// Locks a mutex, ignoring poison: every critical section here only pushes/takes plain data,
/// so a panic elsewhere cannot leave it half-written.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// All registered tests in run order: sorted by (file, line), then name. The order depends
/// only on the binary, so it is the same on every rank.
pub fn registered_tests() -> Vec<TestCase> {
    let mut tests = lock(&REGISTRY).clone();
    tests.sort_by(|a, b| (a.file, a.line, a.suite, a.name).cmp(&(b.file, b.line, b.suite, b.name)));
    tests
}

/// A perf result reported through [`TestContext::report_perf`].
#[derive(Debug, Clone, PartialEq)]
pub struct PerfRecord {
    /// The test's `Suite.Name`.
    pub test: String,
    /// What was measured.
    pub label: String,
    /// The figure.
    pub value: f64,
    /// Its unit (e.g. `GB/s`, `us`).
    pub unit: String,
}

/// What the running test has recorded so far.
#[derive(Debug, Default)]
pub(crate) struct TestRecord {
    pub failures: usize,
    pub skip_reason: Option<String>,
    pub perf: Vec<PerfRecord>,
}

/// The test being run right now (tests run one at a time), shared by all threads.
static CURRENT: Mutex<Option<TestRecord>> = Mutex::new(None);
/// This process's rank, for deciding where failure text goes.
static RANK: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn set_rank(rank: usize) {
    RANK.store(rank, Ordering::Relaxed);
}

pub(crate) fn begin_test() {
    *lock(&CURRENT) = Some(TestRecord::default());
}

pub(crate) fn finish_test() -> TestRecord {
    lock(&CURRENT).take().unwrap_or_default()
}

/// Writes `text` line by line: rank 0 to stdout, other ranks to stderr prefixed `[rank R]`.
/// Write errors (a closed pipe) are ignored: reporting must never end the run.
pub(crate) fn emit(text: &str) {
    let rank = RANK.load(Ordering::Relaxed);
    if rank == 0 {
        let mut out = std::io::stdout().lock();
        for line in text.lines() {
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
    } else {
        let mut err = std::io::stderr().lock();
        for line in text.lines() {
            let _ = writeln!(err, "[rank {rank}] {line}");
        }
        let _ = err.flush();
    }
}

/// The per-test handle passed to every test body.
#[derive(Debug)]
pub struct TestContext {
    rank: usize,
    size: usize,
    full_name: String,
    file: &'static str,
    line: u32,
}

impl TestContext {
    pub(crate) fn new(rank: usize, size: usize, case: &TestCase) -> Self {
        TestContext {
            rank,
            size,
            full_name: case.full_name(),
            file: case.file,
            line: case.line,
        }
    }
    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }
    /// `Suite.Name`.
    pub fn full_name(&self) -> &str {
        &self.full_name
    }
    /// Records a perf result; rank 0 prints all of them in the `[   PERF   ]` block after the
    /// last test (results reported on other ranks are not printed).
    pub fn report_perf(&self, label: &str, value: f64, unit: &str) {
        if let Some(rec) = lock(&CURRENT).as_mut() {
            rec.perf.push(PerfRecord {
                test: self.full_name.clone(),
                label: label.to_owned(),
                value,
                unit: unit.to_owned(),
            });
        }
    }
}

/// A suite type with per-test setup and teardown. Setup failure fails the test (teardown is
/// not run); teardown runs iff setup succeeded, also when the body failed, panicked or skipped.
pub trait Fixture: Sized {
    /// Builds the fixture before the body; an error fails the test.
    fn setup(ctx: &TestContext) -> Result<Self, String>;
    /// Runs after the body when setup succeeded.
    fn teardown(&mut self, _ctx: &TestContext) {}
}

/// The private unwind payload that ends a test (ASSERT_*, FAIL!, SKIP!).
pub(crate) struct EndOfTest;

thread_local! {
    /// True on the runner thread while it runs a test body: panics there are reported by the
    /// runner, so the hook stays silent and only remembers where it happened.
    static IN_TEST_BODY: Cell<bool> = const { Cell::new(false) };
    /// (file, line, message) of the last panic on this thread while IN_TEST_BODY.
    static LAST_PANIC: RefCell<Option<(String, u32, String)>> = const { RefCell::new(None) };
}

pub(crate) fn set_in_test_body(on: bool) {
    IN_TEST_BODY.with(|c| c.set(on));
}

fn payload_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic payload>".to_owned()
    }
}

/// Installs (once) the panic hook: silent for panics in a test body on the runner thread
/// (their location is kept for the report), the previous hook for everything else.
pub(crate) fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if IN_TEST_BODY.with(|c| c.get()) {
                let (file, line) = info
                    .location()
                    .map(|l| (l.file().to_owned(), l.line()))
                    .unwrap_or_else(|| ("<unknown>".to_owned(), 0));
                let msg = payload_message(info.payload());
                LAST_PANIC.with(|p| *p.borrow_mut() = Some((file, line, msg)));
            } else {
                previous(info);
            }
        }));
    });
}

/// Turns a caught unwind into the test's record: our own end-of-test payload is already
/// recorded; anything else is a panic, reported as a failure with message and location.
pub(crate) fn absorb_unwind(payload: Box<dyn Any + Send>, ctx: &TestContext) {
    if payload.is::<EndOfTest>() {
        return;
    }
    let msg = payload_message(&*payload);
    let (file, line) = LAST_PANIC
        .with(|p| p.borrow_mut().take())
        .filter(|(_, _, m)| *m == msg)
        .map(|(f, l, _)| (f, l))
        .unwrap_or_else(|| (ctx.file.to_owned(), ctx.line));
    __private::record_failure(&file, line, format!("Unexpected panic: {msg}"), None);
}

/// Helpers the exported macros expand to; not part of the API.
#[doc(hidden)]
pub mod __private {
    use super::*;

    pub fn register(case: TestCase) {
        lock(&REGISTRY).push(case);
    }

    /// Records one failure of the current test and prints its text (gtest layout).
    pub fn record_failure(file: &str, line: u32, text: String, message: Option<String>) {
        let mut full = format!("{file}:{line}: Failure\n{text}");
        if let Some(m) = message {
            full.push('\n');
            full.push_str(&m);
        }
        emit(&full);
        match lock(&CURRENT).as_mut() {
            Some(rec) => rec.failures += 1,
            None => emit("(the failure above happened outside of any test)"),
        }
    }

    /// Ends the current test; the runner catches the payload silently.
    pub fn end_test() -> ! {
        panic::resume_unwind(Box::new(EndOfTest))
    }

    /// Marks the current test skipped with `reason` and ends it.
    pub fn skip(reason: String) -> ! {
        if let Some(rec) = lock(&CURRENT).as_mut() {
            if rec.skip_reason.is_none() {
                rec.skip_reason = Some(reason);
            }
        }
        end_test()
    }

    /// Runs a fixture test: setup, body, teardown (iff setup succeeded, whatever the body did).
    pub fn run_with_fixture<F: Fixture>(ctx: &TestContext, body: fn(&TestContext, &mut F)) {
        let mut fixture = match F::setup(ctx) {
            Ok(f) => f,
            Err(e) => {
                record_failure(
                    ctx.file,
                    ctx.line,
                    format!("Fixture setup failed: {e}"),
                    None,
                );
                end_test();
            }
        };
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| body(ctx, &mut fixture)));
        let body_ended = match outcome {
            Ok(()) => false,
            Err(payload) => {
                absorb_unwind(payload, ctx);
                true
            }
        };
        if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| fixture.teardown(ctx))) {
            absorb_unwind(payload, ctx);
        }
        if body_ended {
            end_test();
        }
    }
}
