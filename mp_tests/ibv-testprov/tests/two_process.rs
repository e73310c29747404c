//! The test provider driven the way the core drives it: through `mscclpp_hal::ibv` (dlopen of
//! the built cdylib), between this test process and a child process (this same binary started
//! in a child role), exchanging QP information over a TCP control socket.

mod common;

use common::*;

// ------------------------------------------------------------------ child role

/// Entry point of the child role; a no-op when run as an ordinary test.
#[test]
fn child_main() {
    let Ok(port) = std::env::var(CHILD_ENV) else {
        return;
    };
    let role = std::env::var(ROLE_ENV).unwrap_or_default();
    let buf_bytes: usize = std::env::var(BUF_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(65536);
    let stream =
        TcpStream::connect(format!("127.0.0.1:{port}")).expect("child: connecting to the parent");
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let lib = provider().expect("child: provider");
    if role == "atomics" {
        let ctx = lib.open_device("testprov0").expect("open");
        let attr = ctx.query_device().expect("query_device");
        writeln!(writer, "atomic_cap {}", attr.atomic_cap).expect("write");
        return;
    }
    let me = Side::new(&lib, buf_bytes);
    // A second region for fetch-and-add results (one 8-byte slot per request).
    let mut results = vec![0u64; 4096];
    // SAFETY: `results` outlives `res_mr` (dropped at the end of this function in reverse order).
    let res_mr = unsafe {
        me.pd.reg_mr(
            results.as_mut_ptr().cast(),
            results.len() * 8,
            AccessFlags::ALL_REMOTE,
        )
    }
    .expect("reg results");
    writeln!(writer, "info {}", me.info()).expect("write");
    let mut line = String::new();
    reader.read_line(&mut line).expect("read peer info");
    let peer = parse_info(&line);
    me.connect(peer.qpn, peer.gid);
    writeln!(writer, "ready").expect("write");
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let reply = match f.as_slice() {
            ["recv", n] => {
                let n: u64 = n.parse().expect("n");
                let wrs: Vec<RecvWr> = (0..n)
                    .map(|i| RecvWr {
                        wr_id: 1000 + i,
                        local: None,
                    })
                    .collect();
                me.qp.post_recv(&wrs).expect("post_recv");
                "ok".to_string()
            }
            ["poll_recv", n] => {
                let n: usize = n.parse().expect("n");
                let wcs = poll_n(&me.rcq, n, Duration::from_secs(20));
                wcs.iter()
                    .map(|w| {
                        format!(
                            "{} {} {} {} {}",
                            w.status,
                            w.opcode,
                            w.byte_len,
                            w.imm_data.map(|v| format!("{v:x}")).unwrap_or("-".into()),
                            w.wr_id
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(";")
            }
            ["hash", off, len] => {
                let off: usize = off.parse().expect("off");
                let len: usize = len.parse().expect("len");
                format!("hash {}", fnv(&me.bytes()[off..off + len]))
            }
            ["fadd", n, add] => {
                let n: usize = n.parse().expect("n");
                let add: u64 = add.parse().expect("add");
                let mut olds = Vec::new();
                let mut posted = 0;
                let deadline = Instant::now() + Duration::from_secs(60);
                while olds.len() < n && Instant::now() < deadline {
                    // Keep up to 16 in flight.
                    while posted < n && posted - olds.len() < 16 {
                        let slot = res_mr.addr() + 8 * posted as u64;
                        let wr = SendWr {
                            wr_id: posted as u64,
                            op: SendOp::FetchAndAdd {
                                remote_addr: peer.addr,
                                rkey: peer.rkey,
                                add,
                            },
                            local: Some(Sge {
                                addr: slot,
                                length: 8,
                                lkey: res_mr.lkey(),
                            }),
                            signaled: true,
                        };
                        me.qp.post_send(&[wr]).expect("post fadd");
                        posted += 1;
                    }
                    for w in poll_n(&me.scq, 1, Duration::from_secs(10)) {
                        assert!(w.is_success(), "child fadd: {}", w.describe());
                        assert_eq!(w.wr_id as usize, olds.len(), "completions in order");
                        // SAFETY: the provider wrote the slot before completing; read it volatile.
                        olds.push(unsafe {
                            std::ptr::read_volatile(results.as_ptr().add(w.wr_id as usize))
                        });
                    }
                }
                format!(
                    "olds {}",
                    olds.iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            }
            ["exit"] => return,
            other => format!("error unknown command {other:?}"),
        };
        if writeln!(writer, "{reply}").is_err() {
            return;
        }
    }
}

// ------------------------------------------------------------------ tests

#[test]
fn rdma_write_and_write_with_imm_reach_the_other_process() {
    let Some(lib) = provider() else { return };
    let mut me = Side::new(&lib, 65536);
    let mut peer = Peer::spawn("peer", 65536, &[]);
    let info = peer.handshake(&me);
    assert_eq!(info.len, 65536);

    // Fresh random-ish data, different from the child's 0x5a fill.
    let seed = std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    for (i, v) in me.buf.iter_mut().enumerate() {
        *v = seed.wrapping_mul(i as u64 + 1).rotate_left(17);
    }
    let expect = fnv(me.bytes());
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: info.addr,
            rkey: info.rkey,
        },
        local: Some(me.sge(0, 65536)),
        signaled: true,
    };
    me.qp.post_send(&[wr]).expect("post write");
    let wcs = poll_n(&me.scq, 1, Duration::from_secs(20));
    assert_eq!(wcs.len(), 1, "one completion for the signaled write");
    assert!(wcs[0].is_success(), "{}", wcs[0].describe());
    assert_eq!(
        (wcs[0].wr_id, wcs[0].opcode, wcs[0].byte_len),
        (1, op::IBV_WC_RDMA_WRITE, 65536)
    );
    assert_eq!(peer.cmd("hash 0 65536"), format!("hash {expect}"));

    // Write-with-imm: one of 0 bytes (unsignaled), one of 4 KiB (signaled).
    assert_eq!(peer.cmd("recv 2"), "ok");
    for v in me.buf.iter_mut().take(512) {
        *v = 0x1122_3344_5566_7788;
    }
    let wrs = [
        SendWr {
            wr_id: 2,
            op: SendOp::WriteWithImm {
                remote_addr: info.addr,
                rkey: info.rkey,
                imm: 0xdead_beef,
            },
            local: None,
            signaled: false,
        },
        SendWr {
            wr_id: 3,
            op: SendOp::WriteWithImm {
                remote_addr: info.addr + 8192,
                rkey: info.rkey,
                imm: 7,
            },
            local: Some(me.sge(0, 4096)),
            signaled: true,
        },
    ];
    me.qp.post_send(&wrs).expect("post write_with_imm");
    let wcs = poll_n(&me.scq, 2, Duration::from_secs(1));
    assert_eq!(wcs.len(), 1, "only the signaled request completes: {wcs:?}");
    assert_eq!(wcs[0].wr_id, 3);
    assert!(wcs[0].is_success(), "{}", wcs[0].describe());
    let recvs = peer.cmd("poll_recv 2");
    let expect_recv = format!(
        "0 {rc} 0 deadbeef 1000;0 {rc} 4096 7 1001",
        rc = op::IBV_WC_RECV_RDMA_WITH_IMM
    );
    assert_eq!(recvs, expect_recv);
    assert_eq!(
        peer.cmd("hash 8192 4096"),
        format!("hash {}", fnv(&me.bytes()[..4096]))
    );
}

#[test]
fn fetch_and_add_is_atomic_under_concurrency() {
    let Some(lib) = provider() else { return };
    let me = Side::new(&lib, 4096);
    let mut peer = Peer::spawn("peer", 4096, &[]);
    let _info = peer.handshake(&me);
    // The counter is the first word of our buffer.
    let counter_addr = me.mr.addr();
    let rkey = me.mr.rkey();
    // SAFETY: we only touch the counter through the provider from now on.
    unsafe { std::ptr::write_volatile(me.buf.as_ptr() as *mut u64, 0) };

    // A loopback QP pair in this process adds concurrently with the child.
    let qa = me
        .pd
        .create_rc_qp(&me.scq, &me.rcq, QpCaps::default())
        .expect("qa");
    let qb = me
        .pd
        .create_rc_qp(&me.scq, &me.rcq, QpCaps::default())
        .expect("qb");
    for (q, other) in [(&qa, &qb), (&qb, &qa)] {
        q.to_init(1, AccessFlags::ALL_REMOTE).expect("init");
        let mut p = RtrParams::new(1, other.qp_num(), 5);
        p.remote_gid = Some(me.gid);
        q.to_rtr(&p).expect("rtr");
    }
    for q in [&qa, &qb] {
        q.to_rts(&RtsParams::default()).expect("rts");
    }
    let n = 400usize;
    peer.send(&format!("fadd {n} 1"));
    let mut results = vec![0u64; n];
    // SAFETY: `results` outlives `res_mr` (dropped first, declared after).
    let res_mr = unsafe {
        me.pd
            .reg_mr(results.as_mut_ptr().cast(), n * 8, AccessFlags::ALL_REMOTE)
    }
    .expect("reg");
    let mut mine = Vec::new();
    for i in 0..n {
        let wr = SendWr {
            wr_id: 10_000 + i as u64,
            op: SendOp::FetchAndAdd {
                remote_addr: counter_addr,
                rkey,
                add: 1,
            },
            local: Some(Sge {
                addr: res_mr.addr() + 8 * i as u64,
                length: 8,
                lkey: res_mr.lkey(),
            }),
            signaled: true,
        };
        qa.post_send(&[wr]).expect("post fadd");
        let w = poll_n(&me.scq, 1, Duration::from_secs(10));
        assert_eq!(w.len(), 1, "fadd {i} completed");
        assert!(w[0].is_success(), "{}", w[0].describe());
        assert_eq!(
            (w[0].wr_id, w[0].opcode, w[0].byte_len),
            (10_000 + i as u64, op::IBV_WC_FETCH_ADD, 8)
        );
        // SAFETY: the provider wrote the slot before completing.
        mine.push(unsafe { std::ptr::read_volatile(results.as_ptr().add(i)) });
    }
    let line = peer.line();
    let theirs: Vec<u64> = line
        .strip_prefix("olds ")
        .unwrap_or_else(|| panic!("child: {line}"))
        .split_whitespace()
        .map(|v| v.parse().expect("u64"))
        .collect();
    assert_eq!(theirs.len(), n);
    // Each side sees increasing old values; together they are exactly 0..2n.
    assert!(mine.windows(2).all(|w| w[0] < w[1]) && theirs.windows(2).all(|w| w[0] < w[1]));
    let mut all: Vec<u64> = mine.iter().chain(theirs.iter()).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..2 * n as u64).collect::<Vec<_>>());
    assert_eq!(
        // SAFETY: all adds completed.
        unsafe { std::ptr::read_volatile(me.buf.as_ptr()) },
        2 * n as u64
    );
    drop(res_mr);
}

#[test]
fn wrong_rkey_is_a_remote_access_error_and_memory_is_untouched() {
    let Some(lib) = provider() else { return };
    let me = Side::new(&lib, 65536);
    let mut peer = Peer::spawn("peer", 65536, &[]);
    let info = peer.handshake(&me);
    let before = peer.cmd("hash 0 65536");
    let wrs = [
        SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: info.addr,
                rkey: info.rkey ^ 0x8000_0000,
            },
            local: Some(me.sge(0, 4096)),
            signaled: false,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::Write {
                remote_addr: info.addr,
                rkey: info.rkey,
            },
            local: Some(me.sge(0, 4096)),
            signaled: false,
        },
    ];
    me.qp.post_send(&wrs).expect("post");
    let wcs = poll_n(&me.scq, 2, Duration::from_secs(20));
    assert_eq!(
        wcs.len(),
        2,
        "errors complete even when unsignaled: {wcs:?}"
    );
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (1, st::IBV_WC_REM_ACCESS_ERR),
        "{}",
        wcs[0].describe()
    );
    assert_eq!(
        (wcs[1].wr_id, wcs[1].status),
        (2, st::IBV_WC_WR_FLUSH_ERR),
        "{}",
        wcs[1].describe()
    );
    assert_eq!(me.qp.state().expect("query"), QpState::Err);
    assert_eq!(peer.cmd("hash 0 65536"), before, "remote memory changed");
    // Posting to a QP in ERR completes with a flush error.
    let wr = SendWr {
        wr_id: 3,
        op: SendOp::Write {
            remote_addr: info.addr,
            rkey: info.rkey,
        },
        local: Some(me.sge(0, 8)),
        signaled: false,
    };
    me.qp.post_send(&[wr]).expect("post in ERR is accepted");
    let wcs = poll_n(&me.scq, 1, Duration::from_secs(5));
    assert_eq!(
        wcs.first().map(|w| (w.wr_id, w.status)),
        Some((3, st::IBV_WC_WR_FLUSH_ERR))
    );
}

#[test]
fn out_of_bounds_write_is_rejected_and_memory_is_untouched() {
    let Some(lib) = provider() else { return };
    let me = Side::new(&lib, 65536);
    let mut peer = Peer::spawn("peer", 65536, &[]);
    let info = peer.handshake(&me);
    let before = peer.cmd("hash 0 65536");
    // Starts inside the region, ends 100 bytes past it.
    let wr = SendWr {
        wr_id: 9,
        op: SendOp::Write {
            remote_addr: info.addr + info.len - 4096 + 100,
            rkey: info.rkey,
        },
        local: Some(me.sge(0, 4096)),
        signaled: true,
    };
    me.qp.post_send(&[wr]).expect("post");
    let wcs = poll_n(&me.scq, 1, Duration::from_secs(20));
    assert_eq!(
        wcs.first().map(|w| (w.wr_id, w.status)),
        Some((9, st::IBV_WC_REM_ACCESS_ERR)),
        "{wcs:?}"
    );
    assert_eq!(peer.cmd("hash 0 65536"), before, "remote memory changed");
    // A local SGE outside our own region is a local protection error.
    let me2 = Side::new(&lib, 4096);
    let mut peer2 = Peer::spawn("peer", 4096, &[]);
    let info2 = peer2.handshake(&me2);
    let wr = SendWr {
        wr_id: 10,
        op: SendOp::Write {
            remote_addr: info2.addr,
            rkey: info2.rkey,
        },
        local: Some(me2.sge(4000, 200)),
        signaled: true,
    };
    me2.qp.post_send(&[wr]).expect("post");
    let wcs = poll_n(&me2.scq, 1, Duration::from_secs(20));
    assert_eq!(
        wcs.first().map(|w| (w.wr_id, w.status)),
        Some((10, st::IBV_WC_LOC_PROT_ERR)),
        "{wcs:?}"
    );
}

#[test]
fn killed_peer_gives_an_error_completion_not_a_hang() {
    let Some(lib) = provider() else { return };
    let buf = 1 << 20;
    let me = Side::new(&lib, buf);
    let mut peer = Peer::spawn("peer", buf, &[]);
    let info = peer.handshake(&me);
    let start = Instant::now();
    let mut completed = 0u64;
    let mut posted = 0u64;
    let mut killed_at = None;
    let mut error = None;
    while start.elapsed() < Duration::from_secs(60) {
        while posted - completed < 4 && error.is_none() {
            let wr = SendWr {
                wr_id: posted,
                op: SendOp::Write {
                    remote_addr: info.addr,
                    rkey: info.rkey,
                },
                local: Some(me.sge(0, buf as u32)),
                signaled: true,
            };
            me.qp.post_send(&[wr]).expect("post");
            posted += 1;
        }
        for w in poll_n(&me.scq, 1, Duration::from_millis(100)) {
            completed += 1;
            if !w.is_success() {
                error = Some(w);
            }
        }
        if error.is_some() {
            break;
        }
        if killed_at.is_none() && completed >= 8 {
            peer.child.kill().expect("kill the child");
            killed_at = Some(Instant::now());
        }
        if let Some(t) = killed_at {
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "no error completion within 15 s of killing the peer"
            );
        }
    }
    let w = error.expect("an error completion after the peer died");
    assert!(
        killed_at.is_some(),
        "error before the kill: {}",
        w.describe()
    );
    assert!(
        matches!(w.status, st::IBV_WC_RETRY_EXC_ERR | st::IBV_WC_WR_FLUSH_ERR),
        "{}",
        w.describe()
    );
    assert_eq!(me.qp.state().expect("query"), QpState::Err);
    let _ = peer.child.wait();
}

#[test]
fn no_atomics_env_reports_atomic_none() {
    let Some(lib) = provider() else { return };
    let ctx = lib.open_device("testprov0").expect("open");
    assert!(
        ctx.query_device().expect("query").supports_atomics(),
        "default reports atomics"
    );
    drop(ctx);
    let mut peer = Peer::spawn("atomics", 0, &[("IBV_TESTPROV_NO_ATOMICS", "1")]);
    assert_eq!(peer.line(), "atomic_cap 0");
}

#[test]
fn qp_state_machine_rejects_bad_transitions() {
    let Some(lib) = provider() else { return };
    let me = Side::new(&lib, 4096); // already in INIT
    assert_eq!(me.qp.state().expect("query"), QpState::Init);
    // INIT -> RTS skips RTR.
    assert!(
        me.qp.to_rts(&RtsParams::default()).is_err(),
        "INIT -> RTS must fail"
    );
    // Posting before RTS is refused.
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: me.mr.addr(),
            rkey: me.mr.rkey(),
        },
        local: Some(me.sge(0, 8)),
        signaled: true,
    };
    assert!(
        me.qp.post_send(&[wr]).is_err(),
        "post_send in INIT must fail"
    );
    // RoCE needs a GRH.
    assert!(
        me.qp.to_rtr(&RtrParams::new(1, me.qp.qp_num(), 5)).is_err(),
        "RTR without a GID must fail"
    );
    // Loopback to itself works through the real transitions.
    me.connect(me.qp.qp_num(), me.gid);
    assert_eq!(me.qp.state().expect("query"), QpState::Rts);
    me.qp
        .post_recv(&[RecvWr {
            wr_id: 77,
            local: None,
        }])
        .expect("post_recv");
    me.qp
        .post_send(&[SendWr {
            wr_id: 2,
            op: SendOp::WriteWithImm {
                remote_addr: me.mr.addr() + 8,
                rkey: me.mr.rkey(),
                imm: 5,
            },
            local: Some(me.sge(0, 8)),
            signaled: true,
        }])
        .expect("post");
    let s = poll_n(&me.scq, 1, Duration::from_secs(10));
    assert!(
        s.first().is_some_and(|w| w.is_success() && w.wr_id == 2),
        "{s:?}"
    );
    let r = poll_n(&me.rcq, 1, Duration::from_secs(10));
    assert_eq!(
        r.first().map(|w| (w.wr_id, w.imm_data, w.byte_len)),
        Some((77, Some(5), 8))
    );
    // ERR flushes posted receives.
    me.qp
        .post_recv(&[RecvWr {
            wr_id: 78,
            local: None,
        }])
        .expect("post_recv");
    me.qp.set_state(QpState::Err).expect("to ERR");
    let r = poll_n(&me.rcq, 1, Duration::from_secs(5));
    assert_eq!(
        r.first().map(|w| (w.wr_id, w.status)),
        Some((78, st::IBV_WC_WR_FLUSH_ERR))
    );
    // ERR -> RESET -> INIT is allowed again.
    me.qp.set_state(QpState::Reset).expect("to RESET");
    me.qp
        .to_init(1, AccessFlags::ALL_REMOTE)
        .expect("INIT again");
    let _ = (&me.ctx, &me.rcq);
}
