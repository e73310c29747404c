//! Standalone two-process GPU IPC check: `cargo run --release -p mscclpp-hal --features cuda
//! --example hal_ipc_check`. Prints a result table; exit code 0 only if every element matched
//! (2 = skipped: no GPU or no GPU backend).

#[path = "../tests/common/gpu_ipc.rs"]
mod common;

use std::process::Command;

fn main() {
    if std::env::var(common::ROLE).is_ok() {
        if let Err(e) = common::child() {
            eprintln!("hal_ipc_check child: {e}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(reason) = common::skip_reason() {
        println!("hal_ipc_check SKIPPED: {reason}");
        std::process::exit(2);
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("hal_ipc_check: cannot find own binary: {e}");
            std::process::exit(1);
        }
    };
    let spawn = || Command::new(&exe);
    match common::parent(&spawn) {
        Ok(rows) => {
            common::print_table(&rows);
            let bad = rows.iter().any(|r| r.mismatches != 0);
            println!("hal_ipc_check: {}", if bad { "FAILED" } else { "PASSED" });
            std::process::exit(i32::from(bad));
        }
        Err(e) => {
            eprintln!("hal_ipc_check FAILED: {e}");
            std::process::exit(1);
        }
    }
}
