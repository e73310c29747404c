//! Shared by the crate's integration tests: compiling C programs against include/nccl.h with
//! the `cc` crate, and running commands with a time limit.

// Each test binary includes this module and uses only part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The crate's folder.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where cargo put libmscclpp_nccl.so for this test build (the test binary's folder).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .expect("the test binary's folder")
        .to_path_buf()
}

/// A scratch folder for built C programs.
pub fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mscclpp_nccl_c");
    std::fs::create_dir_all(&d).expect("create the C build folder");
    d
}

/// Compiles `sources` (under tests/c) against include/nccl.h without CUDA headers into
/// `out`: an executable linked to libmscclpp_nccl.so, or (`shared`) a shared library linked
/// to nothing of ours. Panics with the compiler's output on failure.
pub fn compile_c(sources: &[&str], out: &Path, shared: bool) {
    let tool = cc::Build::new()
        .target(env!("MSCCLPP_NCCL_TARGET"))
        .host(env!("MSCCLPP_NCCL_HOST"))
        .opt_level(1)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .get_compiler();
    let mut cmd = tool.to_command();
    let c = crate_dir().join("tests").join("c");
    cmd.arg("-std=c11")
        .arg("-D_GNU_SOURCE")
        .arg("-DMSCCLPP_NCCL_NO_CUDA")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-Wno-deprecated-declarations")
        .arg("-Wno-unused-function")
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg("-I")
        .arg(&c);
    for s in sources {
        cmd.arg(c.join(s));
    }
    if shared {
        cmd.args(["-shared", "-fPIC"]);
    } else {
        let lib = lib_dir();
        assert!(
            lib.join("libmscclpp_nccl.so").exists(),
            "{} has no libmscclpp_nccl.so",
            lib.display()
        );
        cmd.arg("-L").arg(&lib).arg("-lmscclpp_nccl");
        // DT_RPATH (not RUNPATH) so it wins over LD_LIBRARY_PATH, which cargo points at
        // target/debug too, where an older uplifted copy of the library may lie.
        cmd.arg("-Wl,--disable-new-dtags")
            .arg(format!("-Wl,-rpath,{}", lib.display()));
    }
    cmd.arg("-lm").arg("-o").arg(out);
    let o = cmd.output().expect("run the C compiler");
    assert!(
        o.status.success(),
        "compiling {sources:?} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Runs `cmd`, killing it after `limit`; returns its output and whether it timed out.
pub fn run_with_limit(mut cmd: Command, limit: Duration) -> (Output, bool) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the command");
    let start = Instant::now();
    let mut timed_out = false;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() >= limit => {
                let _ = child.kill();
                timed_out = true;
                break;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("waiting for the command: {e}"),
        }
    }
    (
        child.wait_with_output().expect("collect the output"),
        timed_out,
    )
}

/// `n` communicators of one clique, created by this thread inside one group (one unique id,
/// `ncclCommInitRank` per rank, `ncclGroupEnd`); panics naming the call that failed.
pub fn comms_in_group(n: usize) -> Vec<*mut std::ffi::c_void> {
    use mscclpp_nccl::abi::{NcclUniqueId, SUCCESS};
    use mscclpp_nccl::exports::{ncclCommInitRank, ncclGetUniqueId, ncclGroupEnd, ncclGroupStart};
    let ok = |r: std::ffi::c_int, what: &str| assert_eq!(r, SUCCESS, "{what} -> {r}");
    let mut id = NcclUniqueId { internal: [0; 128] };
    let mut comms = vec![std::ptr::null_mut::<std::ffi::c_void>(); n];
    // SAFETY: valid pointers to locals.
    unsafe {
        ok(ncclGetUniqueId(&mut id), "ncclGetUniqueId");
        ok(ncclGroupStart(), "ncclGroupStart");
        for (r, c) in comms.iter_mut().enumerate() {
            let rc = ncclCommInitRank(c as *mut _ as *mut _, n as _, id, r as _);
            ok(rc, "ncclCommInitRank");
        }
        ok(ncclGroupEnd(), "ncclGroupEnd of the inits");
    }
    comms
}

/// The calling thread's last NCCL error message.
pub fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string owned by the library.
    unsafe {
        std::ffi::CStr::from_ptr(mscclpp_nccl::exports::ncclGetLastError(std::ptr::null_mut()))
    }
    .to_string_lossy()
    .into_owned()
}

/// One NCCL call per rank (`call(rank, comm, buffer)`), each on its own thread; returns every
/// rank's (result, time taken, last error).
pub fn per_rank(
    comms: &[*mut std::ffi::c_void],
    call: impl Fn(usize, *mut std::ffi::c_void, *mut std::ffi::c_void) -> std::ffi::c_int + Sync,
) -> Vec<(std::ffi::c_int, Duration, String)> {
    let call = &call;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, &c)| {
                let c = c as usize;
                s.spawn(move || {
                    let mut buf = vec![1f32; 4096];
                    let t = Instant::now();
                    let rc = call(r, c as *mut std::ffi::c_void, buf.as_mut_ptr().cast());
                    let took = t.elapsed();
                    let msg = if rc == mscclpp_nccl::abi::SUCCESS {
                        String::new()
                    } else {
                        last_error()
                    };
                    (rc, took, msg)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank's thread"))
            .collect()
    })
}
