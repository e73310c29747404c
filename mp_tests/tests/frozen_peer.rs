//! A rank frozen inside a test (SIGSTOP): the survivors must report within about one
//! `--timeout` (their own wait in the test), naming the frozen rank, instead of waiting a
//! fresh `--timeout` in the verdict exchange and again in the final barrier (3 x before).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mp_unit_tests");
const NP: usize = 4;
const FROZEN: usize = 2;
const TIMEOUT_S: u64 = 5;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("reserving a port")
}

#[test]
fn survivors_of_a_frozen_rank_report_after_one_timeout() {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("mscclpp-frozen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let start = Instant::now();
    let mut ranks: Vec<Child> = (0..NP)
        .map(|r| {
            let out = std::fs::File::create(dir.join(format!("rank{r}.log"))).expect("log file");
            let err = out.try_clone().expect("log file");
            let mut cmd = Command::new(BIN);
            cmd.args([
                "--filter=MultiProcessTest.FrozenRank",
                &format!("--ip_port=127.0.0.1:{port}"),
                &format!("--timeout={TIMEOUT_S}"),
            ])
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", NP.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("LOCAL_WORLD_SIZE", NP.to_string())
            .env("MSCCLPP_TEST_FREEZE_RANK", FROZEN.to_string())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
            for v in [
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "PMI_RANK",
                "PMI_SIZE",
            ] {
                cmd.env_remove(v);
            }
            cmd.spawn().expect("spawning a rank")
        })
        .collect();
    // Generous for a loaded machine, well below the old 3 x --timeout.
    let limit = Duration::from_secs(2 * TIMEOUT_S + 3);
    let mut took: [Option<Duration>; NP] = [None; NP];
    let mut codes: [Option<i32>; NP] = [None; NP];
    while start.elapsed() < Duration::from_secs(4 * TIMEOUT_S) {
        for r in 0..NP {
            if r == FROZEN || took[r].is_some() {
                continue;
            }
            if let Ok(Some(st)) = ranks[r].try_wait() {
                took[r] = Some(start.elapsed());
                codes[r] = st.code();
            }
        }
        if (0..NP).all(|r| r == FROZEN || took[r].is_some()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for r in ranks.iter_mut() {
        let _ = r.kill();
        let _ = r.wait();
    }
    let logs: Vec<String> = (0..NP)
        .map(|r| std::fs::read_to_string(dir.join(format!("rank{r}.log"))).unwrap_or_default())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    for r in (0..NP).filter(|&r| r != FROZEN) {
        let t = took[r].unwrap_or_else(|| panic!("rank {r} never exited:\n{}", logs[r]));
        eprintln!(
            "rank {r} exited {:?} after the start (--timeout={TIMEOUT_S})",
            t
        );
        assert!(
            t < limit,
            "rank {r} took {t:?} (limit {limit:?}):\n{}",
            logs[r]
        );
        assert_eq!(codes[r], Some(1), "rank {r}:\n{}", logs[r]);
        assert!(
            logs[r].contains(&format!("rank {FROZEN} sent nothing")),
            "rank {r} must name the frozen rank:\n{}",
            logs[r]
        );
    }
}
