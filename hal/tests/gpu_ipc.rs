//! Two-process GPU IPC (issue 3, last "Must show"): skipped with a reason where there is no GPU.

#[path = "common/gpu_ipc.rs"]
mod common;

use std::process::Command;

#[test]
fn gpu_ipc_written_by_another_process() {
    if std::env::var(common::ROLE).is_ok() {
        return;
    }
    if let Some(reason) = common::skip_reason() {
        println!("SKIPPED gpu_ipc_written_by_another_process: {reason}");
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let spawn = || {
        let mut c = Command::new(&exe);
        c.args([
            "gpu_ipc_child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ]);
        c
    };
    let rows = common::parent(&spawn).expect("GPU IPC check");
    common::print_table(&rows);
    for r in &rows {
        assert_eq!(
            r.mismatches, 0,
            "{}: {} of {} elements wrong",
            r.round, r.mismatches, r.elements
        );
    }
}

#[test]
fn gpu_ipc_child_entry() {
    if std::env::var(common::ROLE).is_ok() {
        if let Err(e) = common::child() {
            panic!("child: {e}");
        }
    }
}
