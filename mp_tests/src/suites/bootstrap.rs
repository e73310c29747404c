//! BootstrapTest: TcpBootstrap groups created next to the shared one (fresh ids and ports are
//! exchanged through the shared bootstrap), re-initialization, early exit, timeouts, and the
//! collectives checked with random payloads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::bootstrap::{Bootstrap, InitAddr, TcpBootstrap, UniqueId};
use mscclpp::ErrorCode;
use mscclpp_framework::*;

use crate::world::mp_env;

macro_rules! ok {
    ($e:expr, $($what:tt)+) => {
        match $e {
            Ok(v) => v,
            Err(e) => FAIL!("{}: {}", format!($($what)+), e),
        }
    };
}

/// xorshift64: deterministic random bytes.
pub(crate) fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A seed every rank agrees on (rank 0's clock), so payloads differ between runs.
pub(crate) fn shared_seed() -> u64 {
    let env = mp_env();
    let mine = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(42);
    let got = env.bootstrap.broadcast(&mine.to_le_bytes(), 0);
    match got
        .ok()
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
    {
        Some(b) => u64::from_le_bytes(b),
        None => 42,
    }
}

/// What `make` gives on rank 0, broadcast to every rank through the shared bootstrap (the
/// other ranks do not call it).
fn made_on_rank0(make: impl FnOnce() -> Result<Vec<u8>, String>) -> Result<Vec<u8>, String> {
    let env = mp_env();
    let mine = if env.bootstrap.rank() == 0 {
        make()?
    } else {
        Vec::new()
    };
    env.bootstrap.broadcast(&mine, 0).map_err(|e| e.to_string())
}

/// A fresh UniqueId made on rank 0 and shared through the shared bootstrap.
fn shared_unique_id() -> Result<UniqueId, String> {
    let bytes = made_on_rank0(|| {
        Ok(TcpBootstrap::create_unique_id()
            .map_err(|e| e.to_string())?
            .to_bytes()
            .to_vec())
    })?;
    UniqueId::from_bytes(&bytes).map_err(|e| e.to_string())
}

/// `ip:port` with rank 0's rendezvous IP and a port that was free on rank 0.
fn shared_ip_port() -> Result<String, String> {
    let env = mp_env();
    let ip = match InitAddr::parse(&env.ip_port).map_err(|e| e.to_string())? {
        InitAddr::Addr { addr, .. } => addr.ip(),
        InitAddr::Id(_) => return Err("--ip_port is not an address".into()),
    };
    let bytes = made_on_rank0(|| {
        let l = std::net::TcpListener::bind((ip, 0)).map_err(|e| e.to_string())?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        Ok(port.to_le_bytes().to_vec())
    })?;
    let port = <[u8; 2]>::try_from(bytes.as_slice())
        .map(u16::from_le_bytes)
        .map_err(|_| format!("expected a 2-byte port, got {} bytes", bytes.len()))?;
    Ok(std::net::SocketAddr::new(ip, port).to_string())
}

fn new_group(addr: InitAddr) -> Result<Arc<TcpBootstrap>, String> {
    let env = mp_env();
    let mut b = TcpBootstrap::new(env.bootstrap.rank(), env.bootstrap.nranks())
        .map_err(|e| e.to_string())?;
    b.initialize(addr, env.timeout).map_err(|e| e.to_string())?;
    Ok(Arc::new(b))
}

/// All-gather, barrier, broadcast and send/recv over `b`, checked with random payloads.
fn check_group(b: &dyn Bootstrap, seed: u64) {
    let (rank, n) = (b.rank(), b.nranks());
    EXPECT_EQ!(n, mp_env().bootstrap.nranks());
    EXPECT_EQ!(b.nranks_per_node(), mp_env().bootstrap.nranks_per_node());
    let payload = |r: usize| random_bytes(1000 + 37 * r, seed ^ r as u64);
    let all = ok!(b.all_gather(&payload(rank)), "all_gather");
    ASSERT_EQ!(all.len(), n);
    for (r, got) in all.iter().enumerate() {
        EXPECT_TRUE!(*got == payload(r), "all_gather entry of rank {}", r);
    }
    ok!(b.barrier(), "barrier");
    let mine = random_bytes(4096, seed.wrapping_add(7));
    let got = ok!(b.broadcast(&mine, n - 1), "broadcast");
    EXPECT_TRUE!(got == mine, "broadcast payload from rank {}", n - 1);
    let msg = |from: usize, to: usize| {
        random_bytes(513 + from * 3 + to, seed ^ (from * 1000 + to) as u64)
    };
    for peer in (0..n).filter(|&p| p != rank) {
        ok!(b.send(&msg(rank, peer), peer, 11), "send to {}", peer);
    }
    for peer in (0..n).filter(|&p| p != rank) {
        let got = ok!(b.recv(peer, 11), "recv from {}", peer);
        EXPECT_TRUE!(got == msg(peer, rank), "message from rank {}", peer);
    }
}

TEST!(BootstrapTest, WithId, |_ctx| {
    let id = ok!(shared_unique_id(), "sharing a unique id");
    let b = ok!(new_group(InitAddr::Id(id)), "initialize with id");
    check_group(&*b, shared_seed());
});

TEST!(BootstrapTest, WithIpPortPair, |_ctx| {
    let addr = ok!(shared_ip_port(), "sharing ip:port");
    let b = ok!(
        new_group(ok!(InitAddr::parse(&addr), "parse {}", addr)),
        "initialize at {}",
        addr
    );
    check_group(&*b, shared_seed());
});

TEST!(BootstrapTest, ResumeWithId, |_ctx| {
    for round in 0..3u64 {
        let id = ok!(shared_unique_id(), "round {}: sharing a unique id", round);
        let b = ok!(new_group(InitAddr::Id(id)), "round {}: initialize", round);
        check_group(&*b, shared_seed() ^ round);
        ok!(b.barrier(), "round {}: final barrier", round);
        drop(b);
    }
});

TEST!(BootstrapTest, ResumeWithIpPortPair, |_ctx| {
    // The same ip:port three times in a row: the root's bind must survive TIME_WAIT.
    let addr = ok!(shared_ip_port(), "sharing ip:port");
    for round in 0..3u64 {
        let init = ok!(InitAddr::parse(&addr), "parse {}", addr);
        let b = ok!(new_group(init), "round {}: initialize at {}", round, addr);
        check_group(&*b, shared_seed() ^ round);
        ok!(b.barrier(), "round {}: final barrier", round);
        drop(b);
        ok!(mp_env().bootstrap.barrier(), "shared barrier");
    }
});

TEST!(BootstrapTest, ExitBeforeConnect, |_ctx| {
    let env = mp_env();
    // An id that is created and dropped without anyone connecting: no hang, port released.
    let lone = ok!(TcpBootstrap::create_unique_id(), "create_unique_id");
    EXPECT_TRUE!(TcpBootstrap::release_unique_id(&lone));
    // A group whose last rank goes away before connecting: the others fail within the timeout.
    let id = ok!(shared_unique_id(), "sharing a unique id");
    let (rank, n) = (env.bootstrap.rank(), env.bootstrap.nranks());
    let timeout = Duration::from_secs(2);
    if rank == n - 1 {
        // This rank "exits": it never joins (and releases the id if it holds it).
        TcpBootstrap::release_unique_id(&id);
    } else {
        let start = Instant::now();
        let mut b = ok!(TcpBootstrap::new(rank, n), "new");
        let r = b.initialize(InitAddr::Id(id), timeout);
        let waited = start.elapsed();
        ASSERT_TRUE!(r.is_err(), "initialize without rank {} succeeded", n - 1);
        EXPECT_LT!(
            waited,
            timeout + Duration::from_secs(5),
            "error came too late: {:?}",
            r
        );
    }
    ok!(env.bootstrap.barrier(), "shared barrier");
});

TEST!(BootstrapTest, TimeoutWithId, |_ctx| {
    let env = mp_env();
    // Every rank uses its own id for a group one larger than the world: nobody meets anybody
    // and no group can ever be complete, so every rank times out, also in a world of one
    // (where a group of `n` would be rank 0 alone, complete at once).
    let id = ok!(TcpBootstrap::create_unique_id(), "create_unique_id");
    let (rank, n) = (env.bootstrap.rank(), env.bootstrap.nranks());
    let timeout = Duration::from_secs(1);
    let start = Instant::now();
    let mut b = ok!(TcpBootstrap::new(rank, n + 1), "new");
    let r = b.initialize(InitAddr::Id(id), timeout);
    let waited = start.elapsed();
    TcpBootstrap::release_unique_id(&id);
    match r {
        Ok(()) => FAIL!("initialize of a group nobody joins succeeded"),
        Err(e) => {
            EXPECT_EQ!(e.code(), ErrorCode::Timeout, "{}", e);
            EXPECT_GE!(waited, Duration::from_millis(900));
            EXPECT_LT!(waited, timeout + Duration::from_secs(4));
        }
    }
    ok!(env.bootstrap.barrier(), "shared barrier");
});

TEST!(BootstrapTest, AllGather, |_ctx| {
    let env = mp_env();
    let seed = shared_seed();
    let (rank, n) = (env.bootstrap.rank(), env.bootstrap.nranks());
    for round in 0..5u64 {
        let payload = |r: usize| {
            random_bytes(
                1 + (seed as usize + r * 7919 + round as usize) % 70000,
                seed ^ round ^ r as u64,
            )
        };
        let all = ok!(env.bootstrap.all_gather(&payload(rank)), "all_gather");
        ASSERT_EQ!(all.len(), n);
        for (r, got) in all.iter().enumerate() {
            EXPECT_TRUE!(*got == payload(r), "round {} entry of rank {}", round, r);
        }
    }
});

TEST!(BootstrapTest, Barrier, |_ctx| {
    let env = mp_env();
    for _ in 0..20 {
        ok!(env.bootstrap.barrier(), "barrier");
    }
    // After a barrier every rank has entered it: everyone's counter is visible as 20.
    let all = ok!(env.bootstrap.all_gather(&20u32.to_le_bytes()), "all_gather");
    for b in all {
        EXPECT_EQ!(b, 20u32.to_le_bytes().to_vec());
    }
});

TEST!(BootstrapTest, Broadcast, |_ctx| {
    let env = mp_env();
    let seed = shared_seed();
    let n = env.bootstrap.nranks();
    for root in 0..n {
        let data = random_bytes(10_000 + root, seed ^ root as u64);
        let mine = if env.bootstrap.rank() == root {
            data.clone()
        } else {
            Vec::new()
        };
        let got = ok!(
            env.bootstrap.broadcast(&mine, root),
            "broadcast from {}",
            root
        );
        EXPECT_TRUE!(got == data, "payload from root {}", root);
    }
});

TEST!(BootstrapTest, SendRecv, |_ctx| {
    let env = mp_env();
    let seed = shared_seed();
    let (rank, n) = (env.bootstrap.rank(), env.bootstrap.nranks());
    let msg = |from: usize, to: usize, i: usize| {
        random_bytes(
            100 + i * 1000,
            seed ^ ((from << 20) + (to << 10) + i) as u64,
        )
    };
    for peer in (0..n).filter(|&p| p != rank) {
        for i in 0..4 {
            ok!(
                env.bootstrap.send(&msg(rank, peer, i), peer, 77),
                "send to {}",
                peer
            );
        }
    }
    for peer in (0..n).filter(|&p| p != rank) {
        for i in 0..4 {
            let got = ok!(env.bootstrap.recv(peer, 77), "recv from {}", peer);
            EXPECT_TRUE!(
                got == msg(peer, rank, i),
                "message {} from rank {} (in order)",
                i,
                peer
            );
        }
    }
});

TEST!(BootstrapTest, NranksPerNode, |_ctx| {
    let env = mp_env();
    // The launcher knows how many ranks share this node; the bootstrap must agree.
    EXPECT_EQ!(env.bootstrap.nranks_per_node(), env.placement.local_size);
});

TEST!(BootstrapTest, RefusesRankOfAnotherJob, |_ctx| {
    // ip:port groups are told apart by their job key: the last rank first knocks with another
    // job's key (refused at once, naming the key), then joins with the right one.
    let env = mp_env();
    let (rank, n) = (env.bootstrap.rank(), env.bootstrap.nranks());
    let addr = ok!(shared_ip_port(), "sharing ip:port");
    let init = ok!(InitAddr::parse(&addr), "parse {}", addr);
    if rank == n - 1 && n > 1 {
        let mut stray = ok!(TcpBootstrap::new(rank, n), "new");
        ok!(stray.set_job_key("another-job"), "set_job_key");
        let start = Instant::now();
        match stray.initialize(init.clone(), env.timeout) {
            Ok(()) => FAIL!("a rank with another job key joined the group at {}", addr),
            Err(e) => {
                EXPECT_EQ!(e.code(), ErrorCode::InvalidUsage, "{}", e);
                EXPECT_TRUE!(e.to_string().contains("job key"), "{}", e);
                EXPECT_LT!(start.elapsed(), Duration::from_secs(5), "{}", e);
            }
        }
    }
    let mut b = ok!(TcpBootstrap::new(rank, n), "new");
    ok!(b.set_job_key("this-job"), "set_job_key");
    ok!(b.initialize(init, env.timeout), "initialize at {}", addr);
    let all = ok!(b.all_gather(&[rank as u8]), "all_gather");
    EXPECT_EQ!(all, (0..n).map(|r| vec![r as u8]).collect::<Vec<_>>());
    ok!(env.bootstrap.barrier(), "shared barrier");
});

TEST!(BootstrapTest, DeadPeerFailsCollectivesAtOnce, |_ctx| {
    let env = mp_env();
    let (rank, n) = (env.bootstrap.rank(), env.bootstrap.nranks());
    if n < 2 {
        SKIP!("needs 2 ranks (one leaves the group while the others wait)");
    }
    let id = ok!(shared_unique_id(), "sharing a unique id");
    let b = ok!(new_group(InitAddr::Id(id)), "initialize with id");
    ok!(b.barrier(), "barrier");
    let leaver = n - 1;
    if rank == leaver {
        drop(b); // leaves: its sockets close
    } else {
        // Rank 0 also waits for rank 1 (alive, but 1 s late) when there are 3 ranks or more:
        // the dead rank must still be reported at once.
        if rank == 1 && n > 2 {
            std::thread::sleep(Duration::from_secs(1));
        }
        let start = Instant::now();
        match b.all_gather(&[rank as u8]) {
            Ok(_) => FAIL!("all_gather succeeded without rank {}", leaver),
            Err(e) => {
                EXPECT_EQ!(e.code(), ErrorCode::RemoteError, "{}", e);
                EXPECT_TRUE!(e.to_string().contains(&format!("rank {leaver}")), "{}", e);
                EXPECT_LT!(start.elapsed(), Duration::from_millis(900), "{}", e);
            }
        }
    }
    ok!(env.bootstrap.barrier(), "shared barrier");
});
