//! Helpers shared by the two-process provider tests: loading the provider, one side of a
//! connection (context, PD, MR, CQ, QP) and the child process that plays the peer.

pub use std::io::{BufRead, BufReader, Write};
pub use std::net::{TcpListener, TcpStream};
pub use std::path::PathBuf;
pub use std::process::{Child, Command, Stdio};
pub use std::sync::Arc;
pub use std::time::{Duration, Instant};

pub use mscclpp_hal::ibv::sys::{ibv_wc_opcode as op, ibv_wc_status as st};
pub use mscclpp_hal::ibv::{
    AccessFlags, CompletionQueue, Context, Gid, IbvLib, MemoryRegion, ProtectionDomain, QpCaps,
    QpState, QueuePair, RecvWr, RtrParams, RtsParams, SendOp, SendWr, Sge, WorkCompletion,
};

pub const CHILD_ENV: &str = "TESTPROV_CHILD_CTRL";
pub const ROLE_ENV: &str = "TESTPROV_CHILD_ROLE";
pub const BUF_ENV: &str = "TESTPROV_CHILD_BUF";
pub const IO_TIMEOUT: Duration = Duration::from_secs(60);

pub fn provider_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [
        deps.parent()?.join("libmscclpp_ibv_testprov.so"),
        deps.join("libmscclpp_ibv_testprov.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

pub fn provider() -> Option<Arc<IbvLib>> {
    let Some(path) = provider_path() else {
        eprintln!("SKIP: libmscclpp_ibv_testprov.so not found next to the test binary; run `cargo build -p mscclpp-ibv-testprov`");
        return None;
    };
    Some(IbvLib::load_candidates(&[path]).expect("loading the test provider"))
}

pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Polls `cq` until `n` completions arrived or `timeout` passed (spins briefly, then sleeps).
pub fn poll_n(cq: &CompletionQueue, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut spins = 0u32;
    while out.len() < n && Instant::now() < deadline {
        let want = n - out.len();
        let got = cq.poll(&mut out, want).expect("poll_cq");
        if got == 0 {
            spins += 1;
            if spins > 100 {
                std::thread::sleep(Duration::from_millis(1));
            } else {
                std::thread::yield_now();
            }
        }
    }
    out
}

/// One side's verbs objects: context, PD, CQs, one QP, a registered buffer.
pub struct Side {
    pub ctx: Arc<Context>,
    pub pd: Arc<ProtectionDomain>,
    pub scq: Arc<CompletionQueue>,
    pub rcq: Arc<CompletionQueue>,
    pub qp: QueuePair,
    pub buf: Vec<u64>,
    pub mr: MemoryRegion,
    pub gid: Gid,
}

impl Side {
    pub fn new(lib: &Arc<IbvLib>, buf_bytes: usize) -> Side {
        let ctx = lib.open_device("testprov0").expect("open testprov0");
        let (port, _attr, gid) = ctx.first_active_port(0).expect("an active port");
        assert_eq!(port, 1);
        let pd = ctx.alloc_pd().expect("alloc_pd");
        let scq = ctx.create_cq(4096).expect("send cq");
        let rcq = ctx.create_cq(4096).expect("recv cq");
        let qp = pd
            .create_rc_qp(&scq, &rcq, QpCaps::default())
            .expect("create qp");
        let mut buf = vec![0x5a5a_5a5a_5a5a_5a5au64; buf_bytes / 8];
        // SAFETY: `buf` lives in this struct, and `mr` is declared before... dropped with it;
        // the Vec is never resized.
        let mr = unsafe { pd.reg_mr(buf.as_mut_ptr().cast(), buf_bytes, AccessFlags::ALL_REMOTE) }
            .expect("reg_mr");
        qp.to_init(1, AccessFlags::ALL_REMOTE).expect("to_init");
        Side {
            ctx,
            pd,
            scq,
            rcq,
            qp,
            buf,
            mr,
            gid,
        }
    }

    pub fn info(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.qp.qp_num(),
            hex(&self.gid.0),
            self.mr.addr(),
            self.mr.rkey(),
            self.mr.len()
        )
    }

    pub fn connect(&self, remote_qpn: u32, remote_gid: Gid) {
        let mut p = RtrParams::new(1, remote_qpn, 5);
        p.remote_gid = Some(remote_gid);
        self.qp.to_rtr(&p).expect("to_rtr");
        self.qp.to_rts(&RtsParams::default()).expect("to_rts");
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: viewing the u64 buffer as bytes.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), self.buf.len() * 8) }
    }

    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr() + off,
            length: len,
            lkey: self.mr.lkey(),
        }
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Gid {
    let mut g = [0u8; 16];
    for (i, v) in g.iter_mut().enumerate() {
        *v = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("gid hex");
    }
    Gid(g)
}

/// The remote side's QP info as sent over the control socket.
#[derive(Debug, Clone, Copy)]
pub struct PeerInfo {
    pub qpn: u32,
    pub gid: Gid,
    pub addr: u64,
    pub rkey: u32,
    pub len: u64,
}

pub fn parse_info(line: &str) -> PeerInfo {
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        f.len(),
        6,
        "expected `info qpn gid addr rkey len`, got `{line}`"
    );
    PeerInfo {
        qpn: f[1].parse().expect("qpn"),
        gid: unhex(f[2]),
        addr: f[3].parse().expect("addr"),
        rkey: f[4].parse().expect("rkey"),
        len: f[5].parse().expect("len"),
    }
}

/// The parent's handle on a child process.
pub struct Peer {
    pub child: Child,
    pub reader: BufReader<TcpStream>,
    pub writer: TcpStream,
}

impl Peer {
    pub fn spawn(role: &str, buf_bytes: usize, extra_env: &[(&str, &str)]) -> Peer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("control listener");
        let port = listener.local_addr().expect("addr").port();
        let mut cmd = Command::new(std::env::current_exe().expect("current_exe"));
        cmd.args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, port.to_string())
            .env(ROLE_ENV, role)
            .env(BUF_ENV, buf_bytes.to_string())
            .stdout(Stdio::null());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawning the child");
        listener.set_nonblocking(true).expect("nonblocking");
        let deadline = Instant::now() + Duration::from_secs(30);
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(_) if Instant::now() < deadline => {
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!("child exited before connecting: {status}");
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => {
                    let _ = child.kill();
                    panic!("child did not connect within 30 s: {e}");
                }
            }
        };
        stream.set_nonblocking(false).expect("blocking");
        stream.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
        let writer = stream.try_clone().expect("clone");
        Peer {
            child,
            reader: BufReader::new(stream),
            writer,
        }
    }

    pub fn line(&mut self) -> String {
        let mut s = String::new();
        self.reader
            .read_line(&mut s)
            .expect("reading from the child");
        assert!(!s.is_empty(), "the child closed the control socket");
        s.trim().to_string()
    }

    pub fn send(&mut self, s: &str) {
        writeln!(self.writer, "{s}").expect("writing to the child");
    }

    pub fn cmd(&mut self, s: &str) -> String {
        self.send(s);
        self.line()
    }

    /// Exchanges QP info and connects both sides.
    pub fn handshake(&mut self, me: &Side) -> PeerInfo {
        let info = parse_info(&self.line());
        self.send(&format!("info {}", me.info()));
        me.connect(info.qpn, info.gid);
        assert_eq!(self.line(), "ready");
        info
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = writeln!(self.writer, "exit");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
