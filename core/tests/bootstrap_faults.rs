//! TcpBootstrap under faults and hostile input (issue 20), every rank a thread of this
//! process: raw TCP clients that speak the bootstrap wire by hand (silent connections, stray
//! and malformed hellos, frame headers announcing gigabytes), a peer that dies while another is
//! slow, local setup failures, and the one deadline of a collective.
//!
//! The raw client follows the layout documented in `core/src/bootstrap/tcp/wire.rs`.

use mscclpp::bootstrap::{Bootstrap, InitAddr, TcpBootstrap, UniqueId};
use mscclpp::{Error, ErrorCode};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);
const WIRE_VERSION: u16 = 3;
/// The byte a root sends at once when it accepted a hello (wire version 3).
const REPLY_ACK: u8 = 2;
const HELLO_MAGIC: u32 = 0x4d53_4248;
const PEER_MAGIC: u32 = 0x4d53_4250;
const ADDR_BYTES: usize = 23;

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

fn encode_addr(a: &SocketAddr, v: &mut Vec<u8>) {
    let mut ip = [0u8; 16];
    let SocketAddr::V4(a4) = a else {
        panic!("the raw client speaks IPv4 only")
    };
    ip[..4].copy_from_slice(&a4.ip().octets());
    v.push(4);
    v.extend_from_slice(&ip);
    v.extend_from_slice(&a.port().to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
}

fn decode_addr(b: &[u8]) -> SocketAddr {
    assert_eq!(b[0], 4, "IPv4 table entry");
    let port = u16::from_le_bytes([b[17], b[18]]);
    SocketAddr::from(([b[1], b[2], b[3], b[4]], port))
}

fn hello(rank: u32, nranks: u32, nonce: u64, listen: &SocketAddr) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
    v.extend_from_slice(&WIRE_VERSION.to_le_bytes());
    v.extend_from_slice(&rank.to_le_bytes());
    v.extend_from_slice(&nranks.to_le_bytes());
    v.extend_from_slice(&nonce.to_le_bytes());
    v.extend_from_slice(&0x5eed_u64.to_le_bytes());
    encode_addr(listen, &mut v);
    v
}

/// Reads the root's acknowledgement of a hello, then the head of its table (status 0,
/// session, nranks).
fn table_head(s: &mut TcpStream) -> [u8; 13] {
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).expect("the root's acknowledgement");
    assert_eq!(
        ack[0], REPLY_ACK,
        "the root answered the hello with an abort"
    );
    let mut head = [0u8; 13];
    s.read_exact(&mut head).expect("table head");
    assert_eq!(head[0], 0, "the root answered with an abort");
    head
}

fn connect(addr: SocketAddr) -> TcpStream {
    let t0 = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(10)))
                    .expect("read timeout");
                return s;
            }
            Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("connect {addr}: {e}"),
        }
    }
}

/// A rank played by hand: it joins the root, reads the table and shakes hands with every
/// lower rank (it must be the highest rank, so it never has to accept).
struct RawRank {
    peers: Vec<TcpStream>,
}

impl RawRank {
    fn join(root: SocketAddr, rank: u32, nranks: u32, nonce: u64) -> RawRank {
        let listener = TcpListener::bind("127.0.0.1:0").expect("raw listener");
        let mut s = connect(root);
        s.write_all(&hello(
            rank,
            nranks,
            nonce,
            &listener.local_addr().expect("addr"),
        ))
        .expect("send hello");
        let head = table_head(&mut s);
        let session = u64::from_le_bytes(head[1..9].try_into().expect("8 bytes"));
        let n = u32::from_le_bytes(head[9..13].try_into().expect("4 bytes")) as usize;
        let mut body = vec![0u8; n * (ADDR_BYTES + 8)];
        s.read_exact(&mut body).expect("table body");
        let addrs: Vec<SocketAddr> = body.chunks(ADDR_BYTES + 8).map(decode_addr).collect();
        let peers = addrs[..rank as usize]
            .iter()
            .map(|a| {
                let mut p = connect(*a);
                let mut hs = Vec::new();
                hs.extend_from_slice(&PEER_MAGIC.to_le_bytes());
                hs.extend_from_slice(&WIRE_VERSION.to_le_bytes());
                hs.extend_from_slice(&session.to_le_bytes());
                hs.extend_from_slice(&rank.to_le_bytes());
                p.write_all(&hs).expect("handshake");
                p
            })
            .collect();
        RawRank { peers }
    }
}

fn frame_header(kind: u8, tag: u64, len: u64) -> Vec<u8> {
    let mut v = vec![kind];
    v.extend_from_slice(&tag.to_le_bytes());
    v.extend_from_slice(&len.to_le_bytes());
    v
}

/// This process's resident memory (VmRSS), in bytes.
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS line");
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmRSS value");
    kb * 1024
}

/// Rank 0 of `n` on a thread: initialize with `id`, then `body`.
fn rank0<T: Send + 'static>(
    id: UniqueId,
    n: usize,
    body: impl FnOnce(TcpBootstrap) -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(move || {
        let mut b = TcpBootstrap::new(0, n).expect("new");
        b.initialize_with_id(&id, TIMEOUT)
            .unwrap_or_else(|e| panic!("rank 0: initialize: {e}"));
        body(b)
    })
}

/// Rank 1 of a two-rank job with `id` (`what` says why it must get in): initializes, then both
/// ranks' all_gather (rank 0's in `root`) sees [[0], [1]].
fn join_as_rank1(id: &UniqueId, root: std::thread::JoinHandle<Vec<Vec<u8>>>, what: &str) {
    let mut b = TcpBootstrap::new(1, 2).expect("new");
    b.initialize_with_id(id, TIMEOUT).expect(what);
    assert_eq!(
        b.all_gather(&[1]).expect("all_gather"),
        vec![vec![0], vec![1]]
    );
    assert_eq!(root.join().expect("rank 0"), vec![vec![0], vec![1]]);
}

#[test]
fn frame_header_announcing_2_gib_commits_memory_only_as_bytes_arrive() {
    let id = TcpBootstrap::create_unique_id().expect("id");
    let before = rss();
    let root = rank0(id, 2, |b| {
        let t0 = Instant::now();
        let r = b.recv(1, 5);
        (r, t0.elapsed())
    });
    let mut raw = RawRank::join(id.root_addr(), 1, 2, id.nonce());
    let p = &mut raw.peers[0];
    p.write_all(&frame_header(0, 5, (1 << 31) - 1))
        .expect("header");
    p.write_all(&[7u8; 1000]).expect("1000 bytes of payload");
    let mut grown = 0;
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(100));
        grown = grown.max(rss().saturating_sub(before));
    }
    let closed = Instant::now();
    drop(raw);
    let (r, _) = root.join().expect("rank 0");
    let noticed = closed.elapsed();
    eprintln!(
        "RSS grew by {} MiB while 1000 of 2 GiB had arrived; the close was noticed after {noticed:?}",
        grown >> 20
    );
    assert!(grown < 64 << 20, "RSS grew by {grown} bytes");
    let e = r.expect_err("the sender closed mid-message");
    assert!(matches!(e, Error::Remote { peer: 1, .. }), "{e}");
    assert!(noticed < Duration::from_secs(2), "{noticed:?}");
}

#[test]
fn frame_header_over_the_maximum_fails_the_peer_at_once() {
    for (kind, len) in [(0u8, 8u64 << 30), (1, u64::MAX), (9, 10)] {
        let id = TcpBootstrap::create_unique_id().expect("id");
        let root = rank0(id, 2, |b| {
            let t0 = Instant::now();
            let r = b.recv(1, 5);
            (r, t0.elapsed())
        });
        let mut raw = RawRank::join(id.root_addr(), 1, 2, id.nonce());
        raw.peers[0]
            .write_all(&frame_header(kind, 5, len))
            .expect("header");
        let (r, took) = root.join().expect("rank 0");
        let e = r.expect_err("a hostile header");
        assert!(matches!(e, Error::Remote { peer: 1, .. }), "{e}");
        assert!(e.to_string().contains("expected"), "{e}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        drop(raw);
    }
}

#[test]
fn silent_connections_do_not_stall_the_root() {
    let id = TcpBootstrap::create_unique_id().expect("id");
    // Reserved by create_unique_id: connections queue at once, before rank 0 even starts.
    let silent: Vec<TcpStream> = (0..12).map(|_| connect(id.root_addr())).collect();
    let t0 = Instant::now();
    let root = rank0(id, 2, |b| b.all_gather(&[0]).expect("all_gather"));
    join_as_rank1(&id, root, "rank 1 initialize despite 12 silent connections");
    let took = t0.elapsed();
    eprintln!("2 ranks initialized past 12 silent connections in {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    drop(silent);
}

#[test]
fn stray_hellos_are_refused_without_aborting_the_job() {
    let id = TcpBootstrap::create_unique_id().expect("id");
    let t0 = Instant::now();
    let root = rank0(id, 2, |b| b.all_gather(&[0]).expect("all_gather"));
    let strays = std::thread::spawn(move || {
        let listen: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let mut answers = Vec::new();
        // A hello with the job's nonce but a wrong nranks or rank is a rank of this job that
        // cannot join: that stops the job (bootstrap.rs,
        // a_refused_rank_of_the_job_stops_every_rank_at_once). Strangers do not.
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("wrong nonce", hello(1, 2, id.nonce() ^ 1, &listen)),
            (
                "another wire version",
                [
                    &hello(1, 2, id.nonce(), &listen)[..4],
                    &[9, 0],
                    &hello(1, 2, 0, &listen)[6..],
                ]
                .concat(),
            ),
            ("garbage", vec![0xAB; 64]),
            (
                "half a hello",
                hello(1, 2, id.nonce(), &listen)[..20].to_vec(),
            ),
        ];
        for (what, bytes) in cases {
            let mut s = connect(id.root_addr());
            s.write_all(&bytes).expect("stray send");
            if what == "half a hello" {
                continue; // closes mid-hello
            }
            let mut status = [0u8; 1];
            let t0 = Instant::now();
            let got = s.read_exact(&mut status).map(|_| status[0]);
            answers.push((what, got.ok(), t0.elapsed()));
        }
        answers
    });
    let answers = strays.join().expect("strays");
    join_as_rank1(&id, root, "the job survives stray hellos");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    for (what, status, took) in answers {
        // A bootstrap client is told why it was refused (status 1 = abort); garbage is closed.
        match what {
            "garbage" => assert_ne!(status, Some(0), "{what}"),
            _ => assert_eq!(status, Some(1), "{what}: expected an abort reply"),
        }
        assert!(took < Duration::from_secs(6), "{what}: {took:?}");
    }
}

#[test]
fn silent_connections_to_a_peer_listener_do_not_stall_the_mesh() {
    let id = TcpBootstrap::create_unique_id().expect("id");
    let t0 = Instant::now();
    let r0 = rank0(id, 3, |b| b.barrier().map(|_| Instant::now()));
    let r1 = std::thread::spawn(move || {
        let mut b = TcpBootstrap::new(1, 3).expect("new");
        b.initialize_with_id(&id, TIMEOUT)
            .expect("rank 1 initialize");
        b.barrier().map(|_| Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    // Rank 2 by hand: it learns the listeners from the table and opens silent connections to
    // them before its own handshakes.
    let listener = TcpListener::bind("127.0.0.1:0").expect("raw listener");
    let mut s = connect(id.root_addr());
    s.write_all(&hello(
        2,
        3,
        id.nonce(),
        &listener.local_addr().expect("addr"),
    ))
    .expect("hello");
    let head = table_head(&mut s);
    let session = u64::from_le_bytes(head[1..9].try_into().expect("8"));
    let mut body = vec![0u8; 3 * (ADDR_BYTES + 8)];
    s.read_exact(&mut body).expect("table");
    let addrs: Vec<SocketAddr> = body.chunks(ADDR_BYTES + 8).map(decode_addr).collect();
    let silent: Vec<TcpStream> = (0..3)
        .flat_map(|_| [connect(addrs[0]), connect(addrs[1])])
        .collect();
    let mut peers = Vec::new();
    for a in &addrs[..2] {
        let mut p = connect(*a);
        let mut hs = Vec::new();
        hs.extend_from_slice(&PEER_MAGIC.to_le_bytes());
        hs.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        hs.extend_from_slice(&session.to_le_bytes());
        hs.extend_from_slice(&2u32.to_le_bytes());
        p.write_all(&hs).expect("handshake");
        // The raw rank's barrier contribution: an empty collective all-gather frame.
        p.write_all(&frame_header(1, 1, 0)).expect("barrier frame");
        peers.push(p);
    }
    let done0 = r0.join().expect("rank 0");
    let done1 = r1.join().expect("rank 1");
    for (r, d) in [done0, done1].into_iter().enumerate() {
        let d = d.unwrap_or_else(|e| panic!("rank {r}: barrier: {e}"));
        let took = d - t0;
        eprintln!("rank {r}: initialized and passed the barrier after {took:?}");
        assert!(took < Duration::from_secs(3), "rank {r}: {took:?}");
    }
    drop((silent, peers));
}

#[test]
fn dead_peer_fails_collectives_at_once_while_another_is_slow() {
    let id = TcpBootstrap::create_unique_id().expect("id");
    let r0 = rank0(id, 3, |b| {
        std::thread::sleep(Duration::from_millis(300)); // rank 1 is gone by now
        let t0 = Instant::now();
        let e = b.all_gather(&[0]).expect_err("rank 1 is dead");
        let took = t0.elapsed();
        let t1 = Instant::now();
        let e2 = b.barrier().expect_err("still dead");
        (e, took, e2, t1.elapsed())
    });
    let slow = std::thread::spawn(move || {
        let mut b = TcpBootstrap::new(2, 3).expect("new");
        b.initialize_with_id(&id, TIMEOUT)
            .expect("rank 2 initialize");
        std::thread::sleep(Duration::from_secs(6)); // live, but slow to reach the collective
        let _ = b.all_gather(&[2]);
    });
    let mut b = TcpBootstrap::new(1, 3).expect("new");
    b.initialize_with_id(&id, TIMEOUT)
        .expect("rank 1 initialize");
    drop(b); // rank 1 dies
    let (e, took, e2, took2) = r0.join().expect("rank 0");
    eprintln!("rank 0: all_gather failed after {took:?}: {e}");
    assert!(matches!(e, Error::Remote { peer: 1, .. }), "{e}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(e2.to_string().contains("rank 1"), "{e2}");
    assert!(took2 < Duration::from_secs(1), "{took2:?}");
    slow.join().expect("rank 2");
}

#[test]
fn local_failure_of_rank_0_is_returned_at_once_with_its_cause() {
    let timeout = Duration::from_secs(8);
    let addr = format!("no-such-if0:127.0.0.1:{}", free_port());
    let t0 = Instant::now();
    let mut b = TcpBootstrap::new(0, 1).expect("new");
    let e = b
        .initialize_with_addr(&addr, timeout)
        .expect_err("the interface does not exist");
    let took = t0.elapsed();
    eprintln!("rank 0 of 1: {e} after {took:?}");
    assert!(e.to_string().contains("no-such-if0"), "{e}");
    assert_ne!(e.code(), ErrorCode::Timeout, "{e}");
    assert!(took < Duration::from_secs(1), "{took:?}");

    // Rank 0 of 2 while rank 1 is trying to join: rank 0 still returns at once with its
    // cause; rank 1 (no root ever listened) fails by its one deadline, naming rank 0.
    let port = free_port();
    let good = InitAddr::parse(&format!("127.0.0.1:{port}")).expect("addr");
    let r1 = std::thread::spawn(move || {
        let mut b = TcpBootstrap::new(1, 2).expect("new");
        let t0 = Instant::now();
        let r = b.initialize(good, Duration::from_secs(2));
        (r, t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let mut b = TcpBootstrap::new(0, 2).expect("new");
    let e0 = b
        .initialize_with_addr(&format!("no-such-if0:127.0.0.1:{port}"), timeout)
        .expect_err("bad interface");
    assert!(e0.to_string().contains("no-such-if0"), "{e0}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let (r, took) = r1.join().expect("rank 1");
    let e1 = r.expect_err("rank 0 never served");
    eprintln!("rank 1 of 2: {e1} after {took:?}");
    assert!(e1.to_string().contains("rank 0"), "{e1}");
    assert!(took < Duration::from_millis(2300), "{took:?}");
}

#[test]
fn a_collective_has_one_deadline_and_names_the_late_rank() {
    let id = TcpBootstrap::create_unique_id().expect("id");
    let timeout = Duration::from_secs(2);
    let start = |rank: usize, delay: Duration| {
        std::thread::spawn(move || {
            let mut b = TcpBootstrap::new(rank, 3).expect("new");
            b.initialize_with_id(&id, timeout)
                .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            std::thread::sleep(delay);
            let t0 = Instant::now();
            let r = b.all_gather(&[rank as u8]);
            let took = t0.elapsed();
            std::thread::sleep(Duration::from_secs(3)); // stay alive past the others' deadline
            (r, took)
        })
    };
    let r0 = start(0, Duration::ZERO);
    // Rank 0 hears from rank 2 first, then rank 1: each within its own 2 s, both not in 2 s.
    let r1 = start(1, Duration::from_millis(3000));
    let r2 = start(2, Duration::from_millis(1500));
    let (r, took) = r0.join().expect("rank 0");
    let _ = (r1.join(), r2.join());
    eprintln!("rank 0: all_gather returned after {took:?}: {r:?}");
    assert!(took < timeout + Duration::from_millis(300), "{took:?}");
    let e = r.expect_err("rank 1 came after the deadline");
    assert_eq!(e.code(), ErrorCode::Timeout, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("all_gather") && msg.contains("rank 1"),
        "{msg}"
    );
}
