//! An application's own logger, installed first, receives core's records (and the default
//! logger stays out of the way).

use std::sync::Mutex;

static SEEN: Mutex<Vec<(log::Level, String, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        SEEN.lock()
            .unwrap()
            .push((r.level(), r.target().to_string(), r.args().to_string()));
    }
    fn flush(&self) {}
}

#[test]
fn application_logger_receives_core_records() {
    log::set_logger(&Capture).expect("the first logger of this process");
    log::set_max_level(log::LevelFilter::Trace);
    mscclpp::log_warn!("NET", "peer {} is slow", 3);
    mscclpp::log_trace!("BOOTSTRAP", "a trace");
    assert!(
        !mscclpp::logger::init(),
        "the default logger must not replace the application's"
    );
    let seen = SEEN.lock().unwrap().clone();
    let logged = |level, target: &str, message: &str| {
        seen.contains(&(level, target.to_string(), message.to_string()))
    };
    assert!(
        logged(log::Level::Warn, "mscclpp::net", "peer 3 is slow"),
        "{seen:?}"
    );
    assert!(
        logged(log::Level::Trace, "mscclpp::bootstrap", "a trace"),
        "the application's filter, not MSCCLPP_LOG_LEVEL, decides: {seen:?}"
    );
}
