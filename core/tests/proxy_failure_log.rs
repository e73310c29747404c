//! 500 failed proxy requests do not log 500 warnings: the first few are logged one by one,
//! the rest as summaries. (Its own test binary: it installs the process's logger.)

use std::sync::Mutex;
use std::time::Duration;

use mscclpp::semaphore::{Semaphore, SemaphoreStub};
use mscclpp::{Context, Endpoint, Transport};

#[path = "common/loopback.rs"]
mod loopback;

static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        if r.level() == log::Level::Warn && r.target() == "mscclpp::proxy" {
            WARNINGS.lock().unwrap().push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

#[test]
fn five_hundred_failures_log_a_bounded_number_of_lines() {
    log::set_logger(&Capture).expect("the first logger of this process");
    log::set_max_level(log::LevelFilter::Warn);
    let t = Duration::from_secs(10);
    let ctx = Context::new().unwrap();
    let a = ctx.create_endpoint(Transport::CudaIpc.into()).unwrap();
    let b = ctx.create_endpoint(Transport::CudaIpc.into()).unwrap();
    let ab = ctx
        .connect(&a, &Endpoint::deserialize(&b.serialize()).unwrap())
        .unwrap();
    let sa = SemaphoreStub::new(&ctx, &ab).unwrap();
    let sb = SemaphoreStub::new(&ctx, &ab).unwrap();
    let sem = Semaphore::new(sa, sb.memory().clone(), ab).unwrap();
    let (mut proxy, ch, m, _mem) = loopback::started_proxy(&ctx, sem);
    let n = 500;
    for _ in 0..n {
        // SAFETY: the proxy outlives the pushes. Memory 7 was never added: each fails.
        unsafe { ch.put(7, 0, m, 0, 8, t) }.unwrap();
    }
    // SAFETY: as above.
    let _ = unsafe { ch.flush(t) };
    let err = proxy.stop_proxy().expect_err("the failures are reported");
    assert!(
        err.to_string()
            .contains(&format!("{n} proxy requests failed")),
        "{err}"
    );
    let lines = WARNINGS.lock().unwrap().clone();
    println!(
        "MEASURE {n} failed requests logged {} WARN lines",
        lines.len()
    );
    assert!(
        lines.len() <= 13,
        "{} warnings for {n} failures, expected the first 10 and summaries: {:#?}",
        lines.len(),
        &lines[..lines.len().min(15)]
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("not logged one by one") && l.contains("500 in all")),
        "a summary counts the rest: {lines:#?}"
    );
}
