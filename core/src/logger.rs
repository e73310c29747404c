//! Logging through the [`log`] facade, with a default logger that honours the `MSCCLPP_*`
//! variables.
//!
//! Core logs with the `log_warn!`, `log_info!` and `log_trace!` macros, which take a subsystem
//! name (`"BOOTSTRAP"`, `"NET"`, `"PROXY"`, ...) and log through the `log` crate with the
//! target `mscclpp::<subsystem in lower case>` (see [`target`]), so an application filters or
//! routes them like any other crate's records.
//!
//! # The default logger
//! The first message core logs installs [`DefaultLogger`] with `log::set_boxed_logger`, but only
//! when the application has not installed a logger of its own: an application that wants its
//! own (env_logger, tracing-log, ...) installs it before its first call into this crate, and
//! then receives every record, filtered by its own rules. The default logger
//! - prints the records of targets that start with `mscclpp` (this crate and the hal);
//! - at the level of `MSCCLPP_LOG_LEVEL`, else `MSCCLPP_DEBUG` (NONE, VERSION, WARN, INFO,
//!   ABORT, TRACE; WARN when unset or malformed, with a warning saying so): NONE is off,
//!   VERSION shows errors only, ABORT adds `log`'s debug level;
//! - only the subsystems listed in `MSCCLPP_LOG_SUBSYS` (comma list, `ALL` = all) when set; the
//!   subsystem of a record is the first path segment of its target after `mscclpp::` (for the
//!   hal's `mscclpp_hal::...` targets, `HAL`);
//! - to `MSCCLPP_LOG_FILE` when set (`%h` = host name, `%p` = pid; appended), else stderr, as
//!   `host:pid MSCCLPP LEVEL [SUBSYS] message` lines.

use std::io::Write;
use std::sync::{Mutex, Once};

use crate::env::{env, LogLevel};

/// The `log` crate, for the exported macros.
#[doc(hidden)]
pub use log as __log;

/// The `log` target of subsystem `subsys`: `mscclpp::<subsys in lower case>` for the known
/// subsystems, `mscclpp` for any other name.
pub fn target(subsys: &str) -> &'static str {
    const KNOWN: &[(&str, &str)] = &[
        ("BOOTSTRAP", "mscclpp::bootstrap"),
        ("INIT", "mscclpp::init"),
        ("NET", "mscclpp::net"),
        ("PROXY", "mscclpp::proxy"),
        ("ENV", "mscclpp::env"),
        ("P2P", "mscclpp::p2p"),
        ("COLL", "mscclpp::coll"),
        ("NVLS", "mscclpp::nvls"),
        ("EXECUTOR", "mscclpp::executor"),
        ("NCCL", "mscclpp::nccl"),
        ("ALLOC", "mscclpp::alloc"),
    ];
    KNOWN
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(subsys))
        .map_or("mscclpp", |(_, t)| t)
}

/// The subsystem of a `log` target (see the module docs); `None` for targets outside this
/// project, which the default logger does not print.
pub fn subsystem_of(target: &str) -> Option<&str> {
    let rest = target.strip_prefix("mscclpp")?;
    if let Some(path) = rest.strip_prefix("::") {
        return Some(path.split("::").next().unwrap_or(path));
    }
    if rest.is_empty() {
        return Some("mscclpp");
    }
    // `mscclpp_hal::...`, `mscclpp_nccl::...`: the crate's suffix.
    let krate = rest.strip_prefix('_').or_else(|| rest.strip_prefix('-'))?;
    Some(krate.split("::").next().unwrap_or(krate))
}

/// The `MSCCLPP_LOG_LEVEL` that lets `level` through.
fn level_of(level: log::Level) -> LogLevel {
    match level {
        log::Level::Error => LogLevel::Version,
        log::Level::Warn => LogLevel::Warn,
        log::Level::Info => LogLevel::Info,
        log::Level::Debug => LogLevel::Abort,
        log::Level::Trace => LogLevel::Trace,
    }
}

/// The `log` filter of an `MSCCLPP_LOG_LEVEL`.
pub fn filter_of(level: LogLevel) -> log::LevelFilter {
    match level {
        LogLevel::None => log::LevelFilter::Off,
        LogLevel::Version => log::LevelFilter::Error,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Abort => log::LevelFilter::Debug,
        LogLevel::Trace => log::LevelFilter::Trace,
    }
}

enum Sink {
    Stderr,
    File(std::fs::File),
}

/// The logger installed when the application has none (see the module docs).
pub struct DefaultLogger {
    host: String,
    pid: u32,
    sink: Mutex<Sink>,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".to_string())
}

impl DefaultLogger {
    /// A logger writing where `MSCCLPP_LOG_FILE` says (stderr when unset), and the problems
    /// met on the way (a file that does not open, a malformed level) to report once installed.
    fn new() -> (DefaultLogger, Vec<String>) {
        let e = env();
        let host = hostname();
        let pid = std::process::id();
        let mut notes = Vec::new();
        let mut sink = Sink::Stderr;
        if let Some(path) = e.log_file() {
            let p = path
                .to_string_lossy()
                .replace("%h", &host)
                .replace("%p", &pid.to_string());
            match std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
            {
                Ok(f) => sink = Sink::File(f),
                Err(err) => notes.push(format!(
                    "MSCCLPP_LOG_FILE={p}: cannot open ({err}); logging to stderr"
                )),
            }
        }
        // Malformed values of any variable (the log level's included) are warned here once,
        // never silently replaced by a default.
        notes.extend(e.problems());
        let logger = DefaultLogger {
            host,
            pid,
            sink: Mutex::new(sink),
        };
        (logger, notes)
    }
}

impl log::Log for DefaultLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        subsystem_of(m.target()).is_some_and(|s| env().log_enabled(level_of(m.level()), s))
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let subsys = subsystem_of(record.target())
            .unwrap_or("mscclpp")
            .to_ascii_uppercase();
        let line = format!(
            "{}:{} MSCCLPP {} [{subsys}] {}\n",
            self.host,
            self.pid,
            record.level(),
            record.args()
        );
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        // Logging is best effort: a failed write must not fail the operation being logged.
        let _ = match &mut *sink {
            Sink::Stderr => std::io::stderr().write_all(line.as_bytes()),
            Sink::File(f) => f.write_all(line.as_bytes()),
        };
    }

    fn flush(&self) {
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        let _ = match &mut *sink {
            Sink::Stderr => std::io::stderr().flush(),
            Sink::File(f) => f.flush(),
        };
    }
}

static INIT: Once = Once::new();
static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Installs [`DefaultLogger`] unless a logger is installed already (the application's); runs
/// once per process, on the first message core logs. Returns whether the default logger is
/// the one installed.
pub fn init() -> bool {
    INIT.call_once(|| {
        let (logger, notes) = DefaultLogger::new();
        if log::set_boxed_logger(Box::new(logger)).is_ok() {
            let level = env().log_level().unwrap_or(LogLevel::Warn);
            log::set_max_level(filter_of(level));
            INSTALLED.store(true, std::sync::atomic::Ordering::Release);
        }
        for n in notes {
            log::warn!(target: "mscclpp::env", "{n}");
        }
    });
    INSTALLED.load(std::sync::atomic::Ordering::Acquire)
}

/// Logs a warning: `log_warn!("NET", "retrying {addr}")` (target `mscclpp::net`).
#[macro_export]
macro_rules! log_warn {
    ($subsys:expr, $($arg:tt)*) => {{
        $crate::logger::init();
        $crate::logger::__log::warn!(target: $crate::logger::target($subsys), $($arg)*)
    }};
}

/// Logs an informational message: `log_info!("INIT", "rank {r} ready")`.
#[macro_export]
macro_rules! log_info {
    ($subsys:expr, $($arg:tt)*) => {{
        $crate::logger::init();
        $crate::logger::__log::info!(target: $crate::logger::target($subsys), $($arg)*)
    }};
}

/// Logs a trace message.
#[macro_export]
macro_rules! log_trace {
    ($subsys:expr, $($arg:tt)*) => {{
        $crate::logger::init();
        $crate::logger::__log::trace!(target: $crate::logger::target($subsys), $($arg)*)
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_env_list_of_subsystems_is_the_loggers() {
        for name in crate::env::LOG_SUBSYSTEMS {
            assert_ne!(target(name), "mscclpp", "{name} has no target");
        }
        assert_eq!(target("bogus"), "mscclpp");
    }

    #[test]
    fn targets_and_subsystems_round_trip() {
        for s in ["BOOTSTRAP", "INIT", "NET", "PROXY", "ENV", "COLL"] {
            let t = target(s);
            assert_eq!(t, format!("mscclpp::{}", s.to_ascii_lowercase()));
            assert!(
                subsystem_of(t).is_some_and(|x| x.eq_ignore_ascii_case(s)),
                "{t}"
            );
        }
        assert_eq!(target("net"), "mscclpp::net");
        assert_eq!(target("SOMETHING"), "mscclpp");
        assert_eq!(subsystem_of("mscclpp"), Some("mscclpp"));
        assert_eq!(subsystem_of("mscclpp_hal::cuda::memory"), Some("hal"));
        assert_eq!(subsystem_of("mscclpp::bootstrap::tcp"), Some("bootstrap"));
        assert_eq!(subsystem_of("hyper::client"), None);
        assert_eq!(subsystem_of("mscclppx"), None);
    }

    #[test]
    fn levels_map_in_order() {
        use log::Level::*;
        let order = [
            LogLevel::None,
            LogLevel::Version,
            LogLevel::Warn,
            LogLevel::Info,
            LogLevel::Abort,
            LogLevel::Trace,
        ];
        for (i, &l) in order.iter().enumerate() {
            let f = filter_of(l);
            for lv in [Error, Warn, Info, Debug, Trace] {
                // A record passes the filter exactly when its MSCCLPP level is at most `l`.
                let want = order.iter().position(|&x| x == level_of(lv)).unwrap() <= i
                    && l != LogLevel::None;
                assert_eq!(lv <= f, want, "{l:?} {lv:?}");
            }
        }
    }
}
