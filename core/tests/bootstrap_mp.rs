//! TcpBootstrap across processes: each test re-runs this test binary N times as child ranks
//! (`BOOT_MP_RANK` etc. select the role) and checks that every child exits cleanly.

mod common;

use common::{child, free_port, ChildRole, Spec};
use mscclpp::bootstrap::{Bootstrap, TcpBootstrap, UniqueId};
use mscclpp::{Error, ErrorCode};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

/// This rank's bootstrap, initialized at the parent's address within `timeout`.
fn joined(c: &ChildRole, timeout: Duration) -> TcpBootstrap {
    let mut b = TcpBootstrap::new(c.rank, c.nranks).expect("new");
    b.initialize_with_addr(&c.addr, timeout)
        .expect("initialize");
    b
}

/// Spawns `nranks` children running test `name`; `extra_env(rank)` adds variables. Panics
/// with every child's output unless all exit with status 0 within `limit`.
fn spawn_ranks(
    name: &str,
    nranks: usize,
    addr: &str,
    limit: Duration,
    extra_env: impl Fn(usize) -> Vec<(String, String)>,
) {
    let kids = (0..nranks)
        .map(|rank| {
            let spec = extra_env(rank)
                .into_iter()
                .fold(Spec::rank(rank, nranks), |s, (k, v)| s.env(&k, &v));
            common::start(name, addr, spec)
        })
        .collect();
    let ended = common::wait_all(kids, limit);
    let ok = ended.iter().all(|e| e.status.is_some_and(|s| s.success()));
    assert!(
        ok,
        "{name}: a child rank failed\n{}",
        common::report(&ended)
    );
}

/// [`spawn_ranks`] with the root at `127.0.0.1` on a free port.
fn spawn_on_free_port(
    name: &str,
    nranks: usize,
    limit: Duration,
    extra_env: impl Fn(usize) -> Vec<(String, String)>,
) {
    spawn_ranks(
        name,
        nranks,
        &format!("127.0.0.1:{}", free_port()),
        limit,
        extra_env,
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

fn none(_: usize) -> Vec<(String, String)> {
    Vec::new()
}

/// xorshift64* payloads that every rank can recompute.
fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u8
        })
        .collect()
}

fn exercise(b: &TcpBootstrap) {
    let (me, n) = (b.rank(), b.nranks());
    for iter in 0..10u64 {
        let p = |r: usize| payload(iter * 1000 + r as u64, 100 + (iter as usize * 37 + r) % 900);
        let all = b.all_gather(&p(me)).expect("all_gather");
        for (r, got) in all.iter().enumerate() {
            assert_eq!(got, &p(r), "all_gather slot {r} iter {iter}");
        }
        let root = iter as usize % n;
        assert_eq!(b.broadcast(&p(root), root).expect("broadcast"), p(root));
        b.send(&p(me), (me + 1) % n, iter).expect("send");
        assert_eq!(
            b.recv((me + n - 1) % n, iter).expect("recv"),
            p((me + n - 1) % n)
        );
        b.barrier().expect("barrier");
    }
}

#[test]
fn mp_with_id() {
    const NAME: &str = "mp_with_id";
    if let Some(c) = child(NAME) {
        let id = UniqueId::from_bytes(&unhex(&c.addr)).expect("id from parent");
        let mut b = TcpBootstrap::new(c.rank, c.nranks).expect("new");
        b.initialize_with_id(&id, TIMEOUT).expect("initialize");
        assert_eq!(b.nranks_per_node(), c.nranks);
        exercise(&b);
        return;
    }
    for n in [2, 4] {
        // The id is made here and its port released, as when an id is made off rank 0.
        let id = TcpBootstrap::create_unique_id().expect("create_unique_id");
        assert!(TcpBootstrap::release_unique_id(&id));
        spawn_ranks(NAME, n, &hex(id.as_bytes()), Duration::from_secs(60), none);
    }
}

#[test]
fn mp_with_ip_port_pair() {
    const NAME: &str = "mp_with_ip_port_pair";
    if let Some(c) = child(NAME) {
        let b = joined(&c, TIMEOUT);
        exercise(&b);
        return;
    }
    for n in [2, 4] {
        spawn_on_free_port(NAME, n, Duration::from_secs(60), none);
    }
}

#[test]
fn mp_resume_with_ip_port_pair() {
    const NAME: &str = "mp_resume_with_ip_port_pair";
    if let Some(c) = child(NAME) {
        for round in 0..20u8 {
            let mut b = TcpBootstrap::new(c.rank, c.nranks).expect("new");
            b.initialize_with_addr(&c.addr, TIMEOUT)
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            let all = b.all_gather(&[round]).expect("all_gather");
            assert!(all.iter().all(|v| v == &[round]));
        }
        return;
    }
    spawn_on_free_port(NAME, 2, Duration::from_secs(60), none);
}

#[test]
fn mp_resume_with_id() {
    const NAME: &str = "mp_resume_with_id";
    if let Some(c) = child(NAME) {
        let mut id = UniqueId::from_bytes(&unhex(&c.addr)).expect("id");
        for round in 0..20u8 {
            let mut b = TcpBootstrap::new(c.rank, c.nranks).expect("new");
            b.initialize_with_id(&id, TIMEOUT)
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            // Rank 0 makes the next round's id (its port reserved in rank 0's process) and
            // broadcasts it over this round's bootstrap, as one would with MPI_Bcast.
            let next = if c.rank == 0 {
                TcpBootstrap::create_unique_id()
                    .expect("create_unique_id")
                    .to_bytes()
                    .to_vec()
            } else {
                Vec::new()
            };
            let next = b.broadcast(&next, 0).expect("broadcast id");
            id = UniqueId::from_bytes(&next).expect("broadcast id parses");
        }
        if c.rank == 0 {
            assert!(TcpBootstrap::release_unique_id(&id));
        }
        return;
    }
    let id = TcpBootstrap::create_unique_id().expect("create_unique_id");
    assert!(TcpBootstrap::release_unique_id(&id));
    spawn_ranks(NAME, 2, &hex(id.as_bytes()), Duration::from_secs(60), none);
}

#[test]
fn mp_exit_before_connect() {
    const NAME: &str = "mp_exit_before_connect";
    if let Some(c) = child(NAME) {
        if c.rank == 2 {
            return; // exits without ever connecting
        }
        let timeout = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut b = TcpBootstrap::new(c.rank, c.nranks).expect("new");
        let e = b
            .initialize_with_addr(&c.addr, timeout)
            .expect_err("rank 2 never came");
        let took = t0.elapsed();
        eprintln!("rank {}: {e} after {took:?}", c.rank);
        assert_eq!(e.code(), ErrorCode::Timeout, "{e}");
        assert!(e.to_string().contains("ranks [2]"), "rank {}: {e}", c.rank);
        assert!(took < timeout + Duration::from_secs(1), "{took:?}");
        return;
    }
    spawn_on_free_port(NAME, 3, Duration::from_secs(30), none);
}

#[test]
fn mp_peer_exit_fails_recv() {
    const NAME: &str = "mp_peer_exit_fails_recv";
    if let Some(c) = child(NAME) {
        let b = joined(&c, Duration::from_secs(30));
        b.barrier().expect("barrier");
        if c.rank == 1 {
            std::process::exit(0); // dies without dropping anything
        }
        let t0 = Instant::now();
        let e = b.recv(1, 77).expect_err("peer exited");
        assert!(matches!(e, Error::Remote { peer: 1, .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        // Sends to the dead peer fail too, once the kernel has seen its reset.
        let failed = (0..100).find_map(|_| {
            std::thread::sleep(Duration::from_millis(10));
            b.send(&[1; 100], 1, 1).err()
        });
        let e = failed.expect("a send to an exited peer must fail");
        assert!(matches!(e, Error::Remote { peer: 1, .. }), "{e}");
        return;
    }
    spawn_on_free_port(NAME, 2, Duration::from_secs(30), none);
}

#[test]
fn mp_nranks_per_node_from_hostid() {
    const NAME: &str = "mp_nranks_per_node_from_hostid";
    if let Some(c) = child(NAME) {
        let b = joined(&c, TIMEOUT);
        // Ranks 0,1 say host "a", ranks 2,3 host "b" (see the parent below).
        assert_eq!(b.nranks_per_node(), 2);
        let h = b.host_hashes().expect("hashes");
        assert_eq!(h[0], h[1]);
        assert_eq!(h[2], h[3]);
        assert_ne!(h[0], h[2]);
        b.barrier().expect("barrier");
        return;
    }
    spawn_on_free_port(NAME, 4, Duration::from_secs(60), |r| {
        vec![(
            "MSCCLPP_HOSTID".into(),
            if r < 2 { "a" } else { "b" }.into(),
        )]
    });
}
