//! TcpBootstrap with every rank a thread of this process: setup by id and by address, resume,
//! timeouts, collectives with random payloads, tag demultiplexing, port in use.

use mscclpp::bootstrap::{Bootstrap, InitAddr, TcpBootstrap, UniqueId};
use mscclpp::{Error, ErrorCode};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

#[path = "common/rng.rs"]
mod rng;

use rng::Rng;

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// Runs `body(bootstrap)` on `n` threads after initializing each with `addr`.
fn run_group<T: Send + 'static>(
    n: usize,
    addr: InitAddr,
    body: impl Fn(TcpBootstrap) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let body = Arc::new(body);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let addr = addr.clone();
            let body = body.clone();
            std::thread::spawn(move || {
                let mut b = TcpBootstrap::new(rank, n).expect("new");
                b.initialize(addr, TIMEOUT)
                    .unwrap_or_else(|e| panic!("rank {rank}: initialize failed: {e}"));
                body(b)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread panicked"))
        .collect()
}

/// Runs `body` on `n` ranks of a job at a fresh local port (a failing rank fails the test).
fn on_local_ranks(n: usize, body: impl Fn(TcpBootstrap) + Send + Sync + 'static) {
    let addr = InitAddr::parse(&format!("127.0.0.1:{}", free_port())).expect("addr");
    run_group(n, addr, body);
}

#[test]
fn with_id() {
    for n in [1, 2, 4] {
        let id = TcpBootstrap::create_unique_id().expect("create_unique_id");
        let out = run_group(n, id.into(), |b| {
            b.barrier().expect("barrier");
            (b.rank(), b.nranks(), b.nranks_per_node())
        });
        for (r, (rank, nranks, per_node)) in out.into_iter().enumerate() {
            assert_eq!((rank, nranks, per_node), (r, n, n));
        }
    }
}

#[test]
fn with_ip_port_pair() {
    for n in [2, 4] {
        let addr = InitAddr::parse(&format!("127.0.0.1:{}", free_port())).expect("addr");
        let out = run_group(n, addr, |b| {
            b.all_gather(&[b.rank() as u8]).expect("all_gather")
        });
        let expect: Vec<Vec<u8>> = (0..n).map(|r| vec![r as u8]).collect();
        for got in out {
            assert_eq!(got, expect);
        }
    }
}

#[test]
fn with_ifname_ip_port() {
    let addr = InitAddr::parse(&format!("lo:127.0.0.1:{}", free_port())).expect("addr");
    let out = run_group(3, addr, |b| {
        b.barrier().expect("barrier");
        b.broadcast(b"from-one", 1).expect("broadcast")
    });
    assert!(out.iter().all(|v| v == b"from-one"));
}

#[test]
fn resume_with_id() {
    for round in 0..15 {
        let id = TcpBootstrap::create_unique_id().expect("create_unique_id");
        let out = run_group(2, id.into(), move |b| {
            let v = b
                .all_gather(&[round as u8, b.rank() as u8])
                .expect("all_gather");
            drop(b);
            v
        });
        assert_eq!(out[0], vec![vec![round as u8, 0], vec![round as u8, 1]]);
    }
}

#[test]
fn resume_with_ip_port_pair() {
    let addr = InitAddr::parse(&format!("127.0.0.1:{}", free_port())).expect("addr");
    for round in 0..15u8 {
        let out = run_group(3, addr.clone(), move |b| {
            b.barrier().expect("barrier");
            b.broadcast(&[round], 0).expect("broadcast")
        });
        assert!(out.iter().all(|v| v == &[round]), "round {round}: {out:?}");
    }
}

/// Rank `rank` of 2 initializes with `id` and a 1 s timeout, nobody else coming: it must fail
/// with a timeout naming `missing` after 1 to 1.6 s. Returns the bootstrap.
fn join_times_out(rank: usize, id: &UniqueId, missing: &str) -> TcpBootstrap {
    let mut b = TcpBootstrap::new(rank, 2).expect("new");
    let t0 = Instant::now();
    let err = b
        .initialize_with_id(id, Duration::from_secs(1))
        .expect_err("must time out");
    let took = t0.elapsed();
    assert_eq!(err.code(), ErrorCode::Timeout, "{err}");
    assert!(err.to_string().contains(missing), "{err}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_millis(1600),
        "{took:?}"
    );
    b
}

#[test]
fn timeout_with_id_root_alone() {
    // Rank 0 of 2 runs the root; rank 1 never comes.
    let id = TcpBootstrap::create_unique_id().expect("create_unique_id");
    let b = join_times_out(0, &id, "ranks [1]");
    assert!(!b.is_initialized());
}

#[test]
fn timeout_with_id_root_never_comes() {
    // The id's port is reserved in this process but nobody serves it: the connection sits in
    // the backlog and rank 1 times out waiting for the table.
    let id = TcpBootstrap::create_unique_id().expect("create_unique_id");
    let _failed = join_times_out(1, &id, "rank 0");
    assert!(TcpBootstrap::release_unique_id(&id));
    assert!(!TcpBootstrap::release_unique_id(&id));

    // Now nothing listens at all: connection refused until the timeout, naming the address.
    let mut b = TcpBootstrap::new(1, 2).expect("new");
    let t0 = Instant::now();
    let err = b
        .initialize_with_id(&id, Duration::from_millis(700))
        .expect_err("refused");
    assert_eq!(err.code(), ErrorCode::Timeout, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&id.root_addr().to_string()) && msg.contains("rank 0"),
        "{msg}"
    );
    assert!(t0.elapsed() < Duration::from_millis(1300));
}

#[test]
fn an_id_whose_root_has_exited_fails_at_the_refused_bound() {
    // The id's rank 0 is gone (its listener closed): every connection is refused. Before, a
    // joiner retried until its whole timeout (300 s in the NCCL library); now it gives up after
    // MSCCLPP_BOOTSTRAP_REFUSED_TIMEOUT (default 5 s), saying the id may be stale.
    let id = TcpBootstrap::create_unique_id().expect("create_unique_id");
    assert!(TcpBootstrap::release_unique_id(&id));
    let mut b = TcpBootstrap::new(1, 2).expect("new");
    let t0 = Instant::now();
    let err = b
        .initialize_with_id(&id, Duration::from_secs(60))
        .expect_err("nothing listens");
    let took = t0.elapsed();
    println!("MEASURE stale_id_s {:.3}", took.as_secs_f64());
    assert_eq!(err.code(), ErrorCode::SystemError, "{err}");
    let msg = err.to_string();
    for want in [
        id.root_addr().to_string().as_str(),
        "refused for 5s",
        "stale",
        "MSCCLPP_BOOTSTRAP_REFUSED_TIMEOUT",
    ] {
        assert!(msg.contains(want), "{want:?} in {msg}");
    }
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(7),
        "{took:?}"
    );
}

#[test]
fn a_refused_rank_of_the_job_stops_every_rank_at_once() {
    // Ranks 0 and 2 of 3 wait for rank 1; rank 1 comes with nranks 4 (same UniqueId, so a rank
    // of this job). It is refused, and the job cannot complete: ranks 0 and 2 are told at once
    // naming rank 1 and why (before: they waited for their whole timeout).
    let id = TcpBootstrap::create_unique_id().expect("create_unique_id");
    let t0 = Instant::now();
    let waiting: Vec<_> = [0usize, 2]
        .into_iter()
        .map(|rank| {
            std::thread::spawn(move || {
                let mut b = TcpBootstrap::new(rank, 3).expect("new");
                let r = b.initialize_with_id(&id, Duration::from_secs(30));
                (rank, r, t0.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut b = TcpBootstrap::new(1, 4).expect("new");
    let refused_at = t0.elapsed();
    let e = b
        .initialize_with_id(&id, Duration::from_secs(30))
        .expect_err("nranks differ");
    assert_eq!(e.code(), ErrorCode::InvalidUsage, "{e}");
    for h in waiting {
        let (rank, r, at) = h.join().expect("rank thread");
        let e = r.expect_err("the job was stopped");
        let after = at.saturating_sub(refused_at);
        println!(
            "MEASURE refused_peer_rank{rank}_s {:.3}",
            after.as_secs_f64()
        );
        assert_eq!(e.code(), ErrorCode::InvalidUsage, "rank {rank}: {e}");
        let msg = e.to_string();
        assert!(
            msg.contains("a rank of this job was refused") && msg.contains("rank 1"),
            "rank {rank}: {msg}"
        );
        assert!(msg.contains("says nranks = 4"), "rank {rank}: {msg}");
        assert!(after < Duration::from_secs(2), "rank {rank}: {after:?}");
    }
}

#[test]
fn mismatched_nranks_is_refused_without_aborting_the_job() {
    // The joiner with the wrong nranks is refused at once; without a job key (ip:port mode, no
    // launcher) it cannot be told from another job's rank, so the root keeps waiting for a real
    // rank 1 and, when none comes, its timeout names what it refused.
    let addr = InitAddr::parse(&format!("127.0.0.1:{}", free_port())).expect("addr");
    let a2 = addr.clone();
    let root = std::thread::spawn(move || {
        let mut b = TcpBootstrap::new(0, 2).expect("new");
        b.initialize(a2, Duration::from_secs(3))
    });
    let t0 = Instant::now();
    let mut b = TcpBootstrap::new(1, 3).expect("new");
    let err = b
        .initialize(addr, Duration::from_secs(5))
        .expect_err("nranks differ");
    assert_eq!(err.code(), ErrorCode::InvalidUsage, "{err}");
    assert!(err.to_string().contains("nranks"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let root_err = root.join().expect("join").expect_err("rank 1 never came");
    assert_eq!(root_err.code(), ErrorCode::Timeout, "{root_err}");
    assert!(
        root_err.to_string().contains("says nranks = 3"),
        "{root_err}"
    );
}

fn collectives(n: usize) {
    let addr = InitAddr::parse(&format!("127.0.0.1:{}", free_port())).expect("addr");
    let out = run_group(n, addr, move |b| {
        let me = b.rank();
        for iter in 0..20u64 {
            // Every rank can compute every rank's payload from (iter, rank).
            let payload = |r: usize| {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (iter << 8) ^ r as u64 | 1);
                let len = (rng.next() % 3000) as usize;
                rng.bytes(len)
            };
            let all = b.all_gather(&payload(me)).expect("all_gather");
            for (r, got) in all.iter().enumerate() {
                assert_eq!(
                    got,
                    &payload(r),
                    "rank {me} iter {iter}: all_gather slot {r}"
                );
            }
            let root = (iter as usize) % n;
            let got = b.broadcast(&payload(root), root).expect("broadcast");
            assert_eq!(
                got,
                payload(root),
                "rank {me} iter {iter}: broadcast from {root}"
            );
            b.barrier().expect("barrier");
            // Ring send/recv with a user tag.
            let next = (me + 1) % n;
            let prev = (me + n - 1) % n;
            b.send(&payload(me), next, iter).expect("send");
            assert_eq!(b.recv(prev, iter).expect("recv"), payload(prev));
        }
        // A large message crosses socket buffers.
        let big: Vec<u8> = Rng(7 + me as u64).bytes(3 << 20);
        let next = (me + 1) % n;
        let prev = (me + n - 1) % n;
        b.send(&big, next, 999).expect("send big");
        assert_eq!(
            b.recv(prev, 999).expect("recv big"),
            Rng(7 + prev as u64).bytes(3 << 20)
        );
        // Self send.
        b.send(b"me", me, 5).expect("self send");
        assert_eq!(b.recv(me, 5).expect("self recv"), b"me");
        b.barrier().expect("final barrier");
        true
    });
    assert!(out.into_iter().all(|ok| ok));
}

#[test]
fn collectives_2_ranks() {
    collectives(2);
}

#[test]
fn collectives_4_ranks() {
    collectives(4);
}

#[test]
fn group_barrier_subset() {
    on_local_ranks(4, |b| {
        let group = [0, 2];
        if group.contains(&b.rank()) {
            b.group_barrier(&group).expect("group_barrier");
            assert_eq!(
                b.group_barrier(&[1, 3])
                    .expect_err("caller not in group")
                    .code(),
                ErrorCode::InvalidUsage
            );
        }
        assert_eq!(
            b.group_barrier(&[b.rank(), 9])
                .expect_err("rank out of range")
                .code(),
            ErrorCode::InvalidUsage
        );
        b.barrier().expect("barrier");
    });
}

#[test]
fn tags_demultiplex_out_of_order() {
    on_local_ranks(2, |b| {
        if b.rank() == 0 {
            // Interleave 3 messages for each of tags 0..10.
            for i in 0..3u8 {
                for tag in 0..10u64 {
                    b.send(&[tag as u8, i], 1, tag).expect("send");
                }
            }
        } else {
            // Receive tags in reverse order; within a tag, in send order.
            for tag in (0..10u64).rev() {
                for i in 0..3u8 {
                    assert_eq!(b.recv(0, tag).expect("recv"), vec![tag as u8, i]);
                }
            }
            // Nothing more is pending: a short receive times out and names the peer and tag.
            let e = b
                .recv_timeout(0, 3, Duration::from_millis(100))
                .expect_err("nothing left");
            assert_eq!(e.code(), ErrorCode::Timeout);
            assert!(e.to_string().contains("tag 3 from rank 0"), "{e}");
        }
        b.barrier().expect("barrier");
    });
}

#[test]
fn user_tags_do_not_collide_with_collectives() {
    on_local_ranks(2, |b| {
        let peer = 1 - b.rank();
        // Tags equal to the internal collective tags and the reserved range.
        for tag in [1u64, 2, 3, u64::MAX] {
            b.send(&[7], peer, tag).expect("send");
        }
        let all = b.all_gather(&[b.rank() as u8]).expect("all_gather");
        assert_eq!(all, vec![vec![0], vec![1]]);
        for tag in [1u64, 2, 3, u64::MAX] {
            assert_eq!(b.recv(peer, tag).expect("recv"), vec![7]);
        }
    });
}

#[test]
fn dropped_peer_fails_recv_promptly() {
    let addr = InitAddr::parse(&format!("127.0.0.1:{}", free_port())).expect("addr");
    let out = run_group(2, addr, |b| {
        b.barrier().expect("barrier");
        if b.rank() == 1 {
            drop(b);
            return None;
        }
        let t0 = Instant::now();
        let e = b.recv(1, 42).expect_err("peer dropped");
        Some((e, t0.elapsed()))
    });
    let (e, took) = out.into_iter().flatten().next().expect("rank 0 result");
    assert!(matches!(e, Error::Remote { peer: 1, .. }), "{e}");
    assert!(e.to_string().contains("closed"), "{e}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// Rank `rank` of 2 initializes at a port this process holds with a listener that accepts but
/// never answers: it must fail with a system error naming the address and this process as the
/// holder. Returns the message and how long it took.
fn init_at_a_held_port(rank: usize, timeout: Duration) -> (String, Duration) {
    let holder = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = holder.local_addr().expect("addr").to_string();
    let mut b = TcpBootstrap::new(rank, 2).expect("new");
    let t0 = Instant::now();
    let err = b
        .initialize_with_addr(&addr, timeout)
        .expect_err("the port is held");
    let took = t0.elapsed();
    assert_eq!(err.code(), ErrorCode::SystemError, "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&addr), "{msg}");
    assert!(
        msg.contains(&format!("pid {}", std::process::id())),
        "names the holder: {msg}"
    );
    drop(holder);
    (msg, took)
}

#[test]
fn port_in_use_is_reported_at_once_naming_its_holder() {
    // Another socket listens on the port: waiting would not free it, so rank 0 fails at once
    // (it retried for about 2.5 s before), naming the port and the process holding it (this
    // test's own process here).
    let (msg, took) = init_at_a_held_port(0, Duration::from_secs(10));
    println!("MEASURE port_in_use_s {:.3}", took.as_secs_f64());
    assert!(msg.contains("is already in use"), "{msg}");
    // No retries (they took 2.5 s); the holder's lookup scans /proc, slow on a loaded machine.
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

#[test]
fn a_joiner_at_a_squatted_port_fails_when_no_root_answers() {
    // The program at the root's port accepts but never answers: a joiner fails after
    // ROOT_ACK_WAIT (5 s; a real root acknowledges every hello at once) naming the holder,
    // instead of waiting for its whole timeout (60 s here).
    let (msg, took) = init_at_a_held_port(1, Duration::from_secs(60));
    println!("MEASURE squatted_port_joiner_s {:.3}", took.as_secs_f64());
    assert!(msg.contains("sent no bootstrap answer"), "{msg}");
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(7),
        "{took:?}"
    );
}

#[test]
fn a_late_rank_0_with_an_id_is_waited_for() {
    // A UniqueId's listener accepts from the moment the id is made, before rank 0 serves it
    // (rank 0 may set up its GPU first): a joiner with an id waits for the root's answer past
    // the 5 s an ip:port joiner gives a silent listener.
    let id = TcpBootstrap::create_unique_id().expect("create_unique_id");
    let joiner = std::thread::spawn(move || {
        let mut b = TcpBootstrap::new(1, 2).expect("new");
        b.initialize_with_id(&id, Duration::from_secs(30))
            .expect("rank 1 waits for a late rank 0");
        b.all_gather(&[1]).expect("all_gather")
    });
    std::thread::sleep(Duration::from_millis(5500));
    let mut b = TcpBootstrap::new(0, 2).expect("new");
    b.initialize_with_id(&id, Duration::from_secs(30))
        .expect("rank 0");
    assert_eq!(
        b.all_gather(&[0]).expect("all_gather"),
        vec![vec![0], vec![1]]
    );
    assert_eq!(joiner.join().expect("rank 1"), vec![vec![0], vec![1]]);
}

#[test]
fn usage_errors() {
    let mut b = TcpBootstrap::new(0, 1).expect("new");
    assert_eq!(
        b.initialize_with_addr("nonsense", TIMEOUT)
            .expect_err("bad addr")
            .code(),
        ErrorCode::InvalidUsage
    );
    assert_eq!(
        b.initialize_with_addr("127.0.0.1:1", Duration::ZERO)
            .expect_err("zero timeout")
            .code(),
        ErrorCode::InvalidUsage
    );
    assert_eq!(
        b.recv(0, 0).expect_err("not initialized").code(),
        ErrorCode::InvalidUsage
    );
    b.initialize_with_addr(&format!("127.0.0.1:{}", free_port()), TIMEOUT)
        .expect("single rank");
    assert_eq!(b.nranks_per_node(), 1);
    assert_eq!(b.all_gather(b"x").expect("all_gather"), vec![b"x".to_vec()]);
    assert_eq!(
        b.send(b"", 1, 0).expect_err("peer out of range").code(),
        ErrorCode::InvalidUsage
    );
    assert_eq!(
        b.broadcast(b"", 3).expect_err("bad root").code(),
        ErrorCode::InvalidUsage
    );
    assert_eq!(
        b.initialize_with_addr("127.0.0.1:1", TIMEOUT)
            .expect_err("twice")
            .code(),
        ErrorCode::InvalidUsage
    );
}

/// The trait's default collectives, over an in-memory transport: what a third-party
/// bootstrapper gets for free by implementing send/recv.
mod third_party {
    use super::*;
    use std::collections::{HashMap, VecDeque};
    use std::sync::{Condvar, Mutex};

    /// Messages by (from, to, tag).
    type Queues = HashMap<(usize, usize, u64), VecDeque<Vec<u8>>>;

    #[derive(Default)]
    struct Hub {
        q: Mutex<Queues>,
        cv: Condvar,
    }

    struct Mem {
        rank: usize,
        n: usize,
        hub: Arc<Hub>,
    }

    impl Bootstrap for Mem {
        fn rank(&self) -> usize {
            self.rank
        }
        fn nranks(&self) -> usize {
            self.n
        }
        fn nranks_per_node(&self) -> usize {
            self.n
        }
        fn send(&self, data: &[u8], peer: usize, tag: u64) -> mscclpp::Result<()> {
            let mut q = self.hub.q.lock().expect("lock");
            q.entry((self.rank, peer, tag))
                .or_default()
                .push_back(data.to_vec());
            self.hub.cv.notify_all();
            Ok(())
        }
        fn recv(&self, peer: usize, tag: u64) -> mscclpp::Result<Vec<u8>> {
            let mut q = self.hub.q.lock().expect("lock");
            loop {
                if let Some(m) = q
                    .get_mut(&(peer, self.rank, tag))
                    .and_then(VecDeque::pop_front)
                {
                    return Ok(m);
                }
                let (g, to) = self.hub.cv.wait_timeout(q, TIMEOUT).expect("wait");
                if to.timed_out() {
                    return Err(Error::timeout("mem recv", TIMEOUT));
                }
                q = g;
            }
        }
    }

    #[test]
    fn default_collectives() {
        let hub = Arc::new(Hub::default());
        let n = 3;
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let hub = hub.clone();
                std::thread::spawn(move || {
                    let b: Box<dyn Bootstrap> = Box::new(Mem { rank, n, hub });
                    let all = b.all_gather(&[rank as u8 * 3]).expect("all_gather");
                    b.barrier().expect("barrier");
                    let bc = b.broadcast(&[rank as u8 + 10], 2).expect("broadcast");
                    b.group_barrier(&[0, 1, 2]).expect("group barrier");
                    (all, bc)
                })
            })
            .collect();
        for h in hs {
            let (all, bc) = h.join().expect("join");
            assert_eq!(all, vec![vec![0], vec![3], vec![6]]);
            assert_eq!(bc, vec![12]);
        }
    }
}

#[test]
fn refused_joiner_is_told_fast_and_the_job_goes_on() {
    // Rank 1 of a wrong size is refused at once, whatever the order of arrival, and the real
    // rank 1 then completes the job.
    for _ in 0..5 {
        let addr = InitAddr::parse(&format!("127.0.0.1:{}", free_port())).expect("addr");
        let (a1, a2) = (addr.clone(), addr.clone());
        let t0 = Instant::now();
        let stray = std::thread::spawn(move || {
            let mut b = TcpBootstrap::new(1, 3).expect("new");
            let r = b.initialize(a1, Duration::from_secs(10));
            (r, t0.elapsed())
        });
        let real = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let mut b = TcpBootstrap::new(1, 2).expect("new");
            b.initialize(a2, Duration::from_secs(10))
                .expect("real rank 1");
            b.all_gather(&[1]).expect("all_gather")
        });
        let mut b = TcpBootstrap::new(0, 2).expect("new");
        b.initialize(addr, Duration::from_secs(10)).expect("rank 0");
        assert_eq!(
            b.all_gather(&[0]).expect("all_gather"),
            vec![vec![0], vec![1]]
        );
        assert_eq!(real.join().expect("join"), vec![vec![0], vec![1]]);
        let (r, took) = stray.join().expect("join");
        let e = r.expect_err("the stray is refused");
        assert_eq!(e.code(), ErrorCode::InvalidUsage, "{e}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
}
