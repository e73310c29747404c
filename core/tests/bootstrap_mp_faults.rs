//! TcpBootstrap faults that need processes (issue 20): a rank of another job at the same
//! `ip:port`, a rank killed while another is slow, and 64 ranks with O(1) bootstrap threads
//! each. Every test re-runs this binary as its child ranks (see `common`).

mod common;

use common::{child, free_port, report, start, threads, wait_all, Spec};
use mscclpp::bootstrap::{Bootstrap, TcpBootstrap};
use mscclpp::{Error, ErrorCode};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn mp_rank_of_another_job_is_refused_in_ip_port_mode() {
    const NAME: &str = "mp_rank_of_another_job_is_refused_in_ip_port_mode";
    if let Some(c) = child(NAME) {
        let t0 = Instant::now();
        let mut b = TcpBootstrap::new(c.rank, c.nranks).expect("new");
        if c.role == "stray" {
            // Job B's rank 1, pointed at job A's root by mistake: refused at once.
            let e = b
                .initialize_with_addr(&c.addr, Duration::from_secs(10))
                .expect_err("a rank of another job must be refused");
            eprintln!("stray: refused after {:?}: {e}", t0.elapsed());
            assert_eq!(e.code(), ErrorCode::InvalidUsage, "{e}");
            assert!(e.to_string().contains("MSCCLPP_BOOTSTRAP_KEY"), "{e}");
            assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
            return;
        }
        if c.rank == 1 {
            std::thread::sleep(Duration::from_millis(500)); // the stray comes first
        }
        b.initialize_with_addr(&c.addr, TIMEOUT)
            .expect("job A initialize");
        let all = b.all_gather(&[c.rank as u8, 0xA]).expect("all_gather");
        assert_eq!(all, vec![vec![0, 0xA], vec![1, 0xA]], "only job A's ranks");
        b.barrier().expect("barrier");
        return;
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let kids = vec![
        start(
            NAME,
            &addr,
            Spec::rank(1, 2)
                .role("stray")
                .env("MSCCLPP_BOOTSTRAP_KEY", "job-b"),
        ),
        start(
            NAME,
            &addr,
            Spec::rank(0, 2).env("MSCCLPP_BOOTSTRAP_KEY", "job-a"),
        ),
        start(
            NAME,
            &addr,
            Spec::rank(1, 2).env("MSCCLPP_BOOTSTRAP_KEY", "job-a"),
        ),
    ];
    let ended = wait_all(kids, Duration::from_secs(40));
    assert!(
        ended.iter().all(|e| e.status.is_some_and(|s| s.success())),
        "{}",
        report(&ended)
    );
}

#[test]
fn mp_killed_rank_fails_collectives_at_once_while_another_is_slow() {
    const NAME: &str = "mp_killed_rank_fails_collectives_at_once_while_another_is_slow";
    if let Some(c) = child(NAME) {
        let mut b = TcpBootstrap::new(c.rank, c.nranks).expect("new");
        b.initialize_with_addr(&c.addr, TIMEOUT)
            .expect("initialize");
        match c.rank {
            1 => {
                // Dies by SIGKILL: no destructor runs, the kernel closes the sockets.
                let pid = std::process::id().to_string();
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid])
                    .status();
                std::thread::sleep(Duration::from_secs(60));
            }
            2 => {
                std::thread::sleep(Duration::from_secs(8)); // alive, slow to come
                let _ = b.all_gather(&[2]);
            }
            _ => {
                std::thread::sleep(Duration::from_millis(500));
                let t0 = Instant::now();
                let e = b.all_gather(&[0]).expect_err("rank 1 was killed");
                let took = t0.elapsed();
                eprintln!("rank 0: all_gather failed after {took:?}: {e}");
                assert!(matches!(e, Error::Remote { peer: 1, .. }), "{e}");
                assert!(took < Duration::from_secs(1), "{took:?}");
                let t1 = Instant::now();
                let e = b.broadcast(&[], 1).expect_err("root 1 is dead");
                assert!(matches!(e, Error::Remote { peer: 1, .. }), "{e}");
                assert!(t1.elapsed() < Duration::from_secs(1), "{:?}", t1.elapsed());
            }
        }
        return;
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let kids = (0..3)
        .map(|r| start(NAME, &addr, Spec::rank(r, 3)))
        .collect();
    let ended = wait_all(kids, Duration::from_secs(40));
    let ok = |r: usize| ended[r].status.is_some_and(|s| s.success());
    assert!(ok(0) && ok(2), "{}", report(&ended));
}

/// Ranks of the many-ranks test (at least 64, per issue 20; `BOOT_MP_MANY` raises it).
fn many() -> usize {
    std::env::var("BOOT_MP_MANY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

#[test]
fn mp_many_ranks_with_o1_bootstrap_threads_each() {
    const NAME: &str = "mp_many_ranks_with_o1_bootstrap_threads_each";
    if let Some(c) = child(NAME) {
        let before = threads();
        let mut b = TcpBootstrap::new(c.rank, c.nranks).expect("new");
        b.initialize_with_addr(&c.addr, Duration::from_secs(240))
            .unwrap_or_else(|e| panic!("rank {}: initialize: {e}", c.rank));
        let after = threads();
        let all = b
            .all_gather(&(c.rank as u32).to_le_bytes())
            .expect("all_gather");
        for (r, v) in all.iter().enumerate() {
            assert_eq!(v, &(r as u32).to_le_bytes(), "slot {r}");
        }
        b.barrier().expect("barrier");
        println!(
            "rank {} of {}: {} threads before initialize, {} after",
            c.rank, c.nranks, before, after
        );
        assert!(
            after <= before + 2,
            "rank {}: {} bootstrap threads for {} peers",
            c.rank,
            after - before,
            c.nranks - 1
        );
        return;
    }
    let n = many();
    let addr = format!("127.0.0.1:{}", free_port());
    let t0 = Instant::now();
    let kids = (0..n)
        .map(|r| start(NAME, &addr, Spec::rank(r, n)))
        .collect();
    let ended = wait_all(kids, Duration::from_secs(300));
    let took = t0.elapsed();
    let failed: Vec<_> = ended
        .iter()
        .filter(|e| !e.status.is_some_and(|s| s.success()))
        .collect();
    let sample = ended
        .iter()
        .find_map(|e| e.output.lines().find(|l| l.contains("threads before")))
        .unwrap_or("(no thread line)");
    eprintln!("{n} ranks: done in {took:?}; e.g. {sample}");
    // One line per distinct failure (the line after each child's panic location).
    let mut why: Vec<String> = failed
        .iter()
        .filter_map(|e| {
            let mut lines = e.output.lines();
            lines.find(|l| l.contains("panicked at"))?;
            lines.next().map(|l| format!("rank {}: {l}", e.rank))
        })
        .collect();
    why.sort_by_key(|l| l.contains("EOF"));
    assert!(
        failed.is_empty(),
        "{} of {n} ranks failed; first causes:\n{}\n{}",
        failed.len(),
        why.iter().take(8).cloned().collect::<Vec<_>>().join("\n"),
        report(failed.iter().take(2).copied())
    );
}
