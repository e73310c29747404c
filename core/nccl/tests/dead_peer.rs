//! A rank killed at each phase of an all-reduce (before it, in the middle of it, after it) as
//! separate processes (this test binary re-run as the ranks), on one host and across two
//! emulated nodes (`MSCCLPP_HOSTID`): every survivor's all-reduce fails within 2 s of the
//! death, with an error naming the dead rank (host backend; before, the survivors waited
//! the collective's 60 s timeout).

use std::ffi::{c_int, c_void, CStr};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mscclpp_nccl::abi::{self, NcclUniqueId};
use mscclpp_nccl::exports::*;
use mscclpp_nccl::exports_ops::*;

const FLOAT: c_int = 7;
const SUM: c_int = 0;
/// The variable that makes this binary a rank: `rank,nranks,victim,phase,id-file` (rank 0
/// makes the unique id, so its root listener is its own, and writes it there in hex).
const CHILD: &str = "DEAD_PEER_TEST_CHILD";

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_micros()
}

fn all_reduce(comm: *mut c_void, buf: &mut [f32]) -> c_int {
    let p = buf.as_mut_ptr() as *mut c_void;
    // SAFETY: a live handle and this rank's buffer.
    unsafe { ncclAllReduce(p, p, buf.len(), FLOAT, SUM, comm as *mut _, null_mut()) }
}

/// One rank: init, then the phase's schedule; the victim exits without destroying anything
/// (as a killed process: no goodbye), a survivor prints when and how its all-reduce failed.
fn child(spec: &str) -> ! {
    let f: Vec<&str> = spec.split(',').collect();
    let (rank, n, victim) = (
        f[0].parse::<usize>().unwrap(),
        f[1].parse::<usize>().unwrap(),
        f[2].parse::<usize>().unwrap(),
    );
    let phase = f[3];
    let mut id = NcclUniqueId { internal: [0; 128] };
    let file = std::path::Path::new(f[4]);
    if rank == 0 {
        // SAFETY: a valid pointer to a local.
        assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, abi::SUCCESS);
        let hex: String = id
            .internal
            .iter()
            .map(|b| format!("{:02x}", *b as u8))
            .collect();
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, hex).unwrap();
        std::fs::rename(&tmp, file).unwrap();
    } else {
        let start = std::time::Instant::now();
        let hex = loop {
            if let Ok(h) = std::fs::read_to_string(file) {
                break h;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "rank 0 wrote no id"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        for (i, b) in id.internal.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap() as _;
        }
    }
    let mut comm: *mut c_void = null_mut();
    // SAFETY: valid pointers to locals.
    let r =
        unsafe { ncclCommInitRank(&mut comm as *mut _ as *mut _, n as c_int, id, rank as c_int) };
    assert_eq!(r, abi::SUCCESS, "rank {rank}: init");
    let mut small = vec![1f32; 1024];
    let mut big = vec![1f32; 4 << 20];
    let die = move || -> ! {
        println!("VICTIM rank={rank} exits at_us={}", now_us());
        std::process::exit(7)
    };
    match (phase, rank == victim) {
        ("before", true) => die(),
        ("during", true) => {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                die()
            });
            loop {
                all_reduce(comm, &mut big);
            }
        }
        ("after", true) => {
            assert_eq!(all_reduce(comm, &mut small), abi::SUCCESS);
            die()
        }
        ("after", false) => {
            assert_eq!(all_reduce(comm, &mut small), abi::SUCCESS);
            std::thread::sleep(Duration::from_millis(300));
        }
        _ => {}
    }
    let buf = if phase == "during" {
        &mut big
    } else {
        &mut small
    };
    for _ in 0..1000 {
        let rc = all_reduce(comm, buf);
        if rc != abi::SUCCESS {
            // SAFETY: the library's NUL-terminated message.
            let msg = unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
                .to_string_lossy()
                .into_owned();
            println!("SURVIVOR rank={rank} rc={rc} at_us={} msg={msg}", now_us());
            // Stay a while: a survivor that exits at once would be a second death the
            // slower survivors might report first.
            std::thread::sleep(Duration::from_secs(3));
            std::process::exit(0);
        }
    }
    println!(
        "SURVIVOR rank={rank} rc=0 at_us={} msg=1000 all-reduces succeeded",
        now_us()
    );
    std::process::exit(0)
}

/// Runs `n` ranks (`nodes` emulated nodes), rank `victim` dying in `phase`; checks every
/// survivor.
fn run(n: usize, nodes: usize, victim: usize, phase: &str) {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
    }
    // One world at a time: the ranks spin while they wait and the machine may have few cores.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let id_file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "dead-peer-id-{}-{phase}-{n}-{nodes}",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&id_file);
    let exe = std::env::current_exe().unwrap();
    let test = std::thread::current().name().unwrap().to_string();
    let mut kids: Vec<_> = (0..n)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.args(["--exact", &test, "--nocapture", "--test-threads=1"])
                .env(
                    CHILD,
                    format!("{r},{n},{victim},{phase},{}", id_file.display()),
                )
                .env(
                    "MSCCLPP_HOSTID",
                    format!("dead-peer-node-{}", r * nodes / n),
                )
                .env("MSCCLPP_COLL_NET_TRANSPORT", "ethernet")
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            c.spawn().expect("spawn a rank")
        })
        .collect();
    // The victim's exit as seen from here.
    let start = std::time::Instant::now();
    let died_us = loop {
        if kids[victim].try_wait().unwrap().is_some() {
            break now_us();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the victim never exited"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    for (r, k) in kids.iter_mut().enumerate().filter(|(r, _)| *r != victim) {
        let out = k.stdout.take().unwrap();
        let line = BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            // The harness's "test name ... " may precede it on the line.
            .find_map(|l| l.find("SURVIVOR").map(|at| l[at..].to_string()))
            .unwrap_or_else(|| panic!("rank {r} printed no result"));
        let _ = k.wait();
        let field = |name: &str| {
            let at = line.find(&format!("{name}=")).unwrap() + name.len() + 1;
            line[at..].split(' ').next().unwrap().to_string()
        };
        assert_ne!(field("rc"), "0", "rank {r}: {line}");
        let at: u128 = field("at_us").parse().unwrap();
        let after = at.saturating_sub(died_us);
        assert!(
            after < 2_000_000,
            "rank {r} failed {after} us after rank {victim} died: {line}"
        );
        assert!(
            line.contains(&format!("rank {victim}")),
            "rank {r}'s error does not name rank {victim}: {line}"
        );
        eprintln!(
            "{phase}: rank {r} failed {} ms after rank {victim} died",
            after / 1000
        );
    }
    let _ = kids[victim].wait();
    let _ = std::fs::remove_file(&id_file);
}

/// One test per phase and world: `name: (ranks, emulated nodes, victim, phase)`.
macro_rules! kill_tests {
    ($($name:ident: ($n:expr, $nodes:expr, $victim:expr, $phase:expr);)*) => {$(
        #[test]
        fn $name() {
            run($n, $nodes, $victim, $phase);
        }
    )*};
}

kill_tests! {
    killed_before_the_all_reduce_np2: (2, 1, 1, "before");
    killed_during_the_all_reduce_np2: (2, 1, 0, "during");
    killed_after_the_all_reduce_np2: (2, 1, 1, "after");
    killed_before_the_all_reduce_np4: (4, 1, 2, "before");
    killed_during_the_all_reduce_np4: (4, 1, 3, "during");
    killed_after_the_all_reduce_np4: (4, 1, 1, "after");
    killed_before_the_all_reduce_two_emulated_nodes_np4: (4, 2, 3, "before");
    killed_during_the_all_reduce_two_emulated_nodes_np4: (4, 2, 1, "during");
    killed_after_the_all_reduce_two_emulated_nodes_np4: (4, 2, 2, "after");
}
