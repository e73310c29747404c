//! Passing exported file descriptors between processes (SCM_RIGHTS over Unix sockets).
//!
//! Each copy of this crate in a process serves the fds it exported from ONE abstract
//! Unix-domain socket, named from its host id and pid (`\0mscclpp-hal-fd.<hostid>.<pid>`). A
//! process may hold several copies (a program and the `libmscclpp_nccl.so` it loads, each
//! linking its own): the first to start a server takes that name (instance 0), the next ones
//! `...<pid>.<instance>` (1 to 255, the first free one), and the top byte of every fd id names
//! the instance that registered it. The server is a background thread started on the first
//! [`register`]. An importer connects to the exporter's socket, sends a
//! request naming the fd id, and receives the fd as SCM_RIGHTS ancillary data. A registered fd
//! stays available until its [`FdRegistration`] is dropped (the exported allocation is freed).
//!
//! Wire format (little endian): request = magic `MFDQ`, version u16 (2), id u64 (14 bytes);
//! reply = magic `MFDR`, version u16 (2), status u8 (0 = ok and one fd attached, 1 = unknown
//! id, 2 = refused: the client runs as another user) (7 bytes).
//!
//! Access control: an fd is a capability to the exporter's memory, so the server answers only
//! clients whose kernel-reported credentials (`SO_PEERCRED`) show the server's effective uid
//! (or root), and ids are random 64-bit values (not a counter), so a process of the same user
//! that was not given the id cannot guess one (56 random bits below the instance byte). Clients are served by one
//! poll loop (no thread per client, no worker pool), so clients that connect and send nothing
//! delay nobody else, however many they are.

use super::os;
use crate::{Error, Result};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

const REQ_MAGIC: &[u8; 4] = b"MFDQ";
const REP_MAGIC: &[u8; 4] = b"MFDR";
const VERSION: u16 = 2;
const REQ_LEN: usize = 14;
const REP_LEN: usize = 7;
/// How long imports wait for the exporter's fd server.
pub(crate) const FD_FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the server waits for a client's request, and a client for the reply.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Clients the server loop keeps waiting for their request at once (beyond it the oldest is
/// dropped: it reconnects and retries until its own deadline).
const MAX_CLIENTS: usize = 4096;

/// This host's id: FNV-1a of `MSCCLPP_HOSTID` if set ([`crate::env::hostid`]), else of the
/// hostname and boot id.
pub fn host_id() -> u64 {
    static ID: OnceLock<u64> = OnceLock::new();
    *ID.get_or_init(|| {
        let text = match crate::env::hostid() {
            Some(v) => v,
            None => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                let boot =
                    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
                format!("{}|{}", host.trim(), boot.trim())
            }
        };
        fnv1a(text.as_bytes())
    })
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The abstract socket name of fd server `instance` of process `pid` on host `host_id`
/// (instance 0: the first copy of this crate in the process to start one).
pub fn socket_name(host_id: u64, pid: u32, instance: u8) -> String {
    match instance {
        0 => format!("mscclpp-hal-fd.{host_id:016x}.{pid}"),
        i => format!("mscclpp-hal-fd.{host_id:016x}.{pid}.{i}"),
    }
}

/// The server instance that registered fd `id` (its top byte).
fn instance_of(id: u64) -> u8 {
    (id >> 56) as u8
}

/// Binds the first free server name of process `pid` (instance 0, else the next one another
/// copy of this crate in the process has not taken).
fn bind_first_free(host_id: u64, pid: u32) -> Result<(UnixListener, u8)> {
    let mut instance = 0u8;
    loop {
        let name = socket_name(host_id, pid, instance);
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|source| Error::Os {
            op: "fd server address",
            source,
        })?;
        match UnixListener::bind_addr(&addr) {
            Ok(l) => return Ok((l, instance)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && instance < u8::MAX => {
                instance += 1;
            }
            Err(source) => {
                return Err(Error::Os {
                    op: "fd server bind",
                    source,
                })
            }
        }
    }
}

type Table = Mutex<HashMap<u64, Arc<OwnedFd>>>;

struct Server {
    table: Arc<Table>,
    /// Which of the process's servers this is (the top byte of its ids).
    instance: u8,
}

static SERVER: OnceLock<std::result::Result<Server, String>> = OnceLock::new();

fn server() -> Result<&'static Server> {
    let s = SERVER.get_or_init(|| start_server().map_err(|e| e.to_string()));
    s.as_ref().map_err(|reason| Error::Os {
        op: "fd server start",
        source: std::io::Error::other(reason.clone()),
    })
}

fn start_server() -> Result<Server> {
    let (listener, instance) = bind_first_free(host_id(), std::process::id())?;
    let table: Arc<Table> = Arc::new(Mutex::new(HashMap::new()));
    let served = Arc::clone(&table);
    std::thread::Builder::new()
        .name("mscclpp-hal-fd".into())
        .spawn(move || serve(listener, served))
        .map_err(|source| Error::Os {
            op: "fd server thread",
            source,
        })?;
    Ok(Server { table, instance })
}

/// A client of the server loop: its connection, the request bytes so far, and when it must
/// have sent the rest.
struct Client {
    stream: UnixStream,
    req: [u8; REQ_LEN],
    got: usize,
    deadline: Instant,
}

fn serve(listener: UnixListener, table: Arc<Table>) {
    // One thread and one poll loop over the listener and every client (it was a pool of 8
    // workers: 8 silent clients held them all and imports failed): a client is answered as soon
    // as its 14 request bytes are in, whatever the others do; one that stays silent is dropped
    // at its deadline; beyond MAX_CLIENTS the oldest waiting one is dropped.
    if listener.set_nonblocking(true).is_err() {
        return serve_blocking(listener, &table);
    }
    let mut clients: Vec<Client> = Vec::new();
    loop {
        let now = Instant::now();
        clients.retain(|c| c.deadline > now);
        let wait = clients
            .iter()
            .map(|c| c.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        let ready: Vec<bool> = {
            let mut fds = Vec::with_capacity(clients.len() + 1);
            fds.push(PollFd::new(&listener, PollFlags::IN));
            fds.extend(
                clients
                    .iter()
                    .map(|c| PollFd::new(&c.stream, PollFlags::IN)),
            );
            let ts = Timespec {
                tv_sec: wait.as_secs() as _,
                tv_nsec: wait.subsec_nanos() as _,
            };
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(_) => fds.iter().map(|f| !f.revents().is_empty()).collect(),
                Err(_) => {
                    // EINTR or a transient failure: back off instead of spinning.
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
            }
        };
        // Clients first (their indexes are those polled), then new connections.
        let mut i = clients.len();
        while i > 0 {
            i -= 1;
            if ready[i + 1] && !read_request(&mut clients[i]) {
                let c = clients.swap_remove(i);
                if c.got == REQ_LEN {
                    // A misbehaving client must not stop the server; its error is its own.
                    let _ = c.stream.set_nonblocking(false);
                    let _ = answer_request(c.stream, &c.req, &table);
                }
            }
        }
        if ready[0] {
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if stream.set_nonblocking(true).is_err() {
                            continue;
                        }
                        if clients.len() >= MAX_CLIENTS {
                            clients.remove(0);
                        }
                        clients.push(Client {
                            stream,
                            req: [0; REQ_LEN],
                            got: 0,
                            deadline: Instant::now() + IO_TIMEOUT,
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    // Accept failures (e.g. out of fds) are transient: back off.
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(10));
                        break;
                    }
                }
            }
        }
    }
}

/// Reads what `c` sent; `true` while it should stay (its request is incomplete), `false` when
/// it is complete (`c.got == REQ_LEN`) or the client closed or failed.
fn read_request(c: &mut Client) -> bool {
    loop {
        match c.stream.read(&mut c.req[c.got..]) {
            Ok(0) => return false,
            Ok(n) => {
                c.got += n;
                if c.got == REQ_LEN {
                    return false;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// The loop without non-blocking sockets (never expected): one client at a time.
fn serve_blocking(listener: UnixListener, table: &Table) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let _ = answer(stream, table);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn answer(mut stream: UnixStream, table: &Table) -> Result<()> {
    let io = |source| Error::Os {
        op: "fd server io",
        source,
    };
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    let mut req = [0u8; REQ_LEN];
    stream.read_exact(&mut req).map_err(io)?;
    answer_request(stream, &req, table)
}

/// Answers the complete request `req` of `stream` (a blocking socket).
fn answer_request(mut stream: UnixStream, req: &[u8; REQ_LEN], table: &Table) -> Result<()> {
    let io = |source| Error::Os {
        op: "fd server io",
        source,
    };
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    let mut reply = [0u8; REP_LEN];
    reply[..4].copy_from_slice(REP_MAGIC);
    reply[4..6].copy_from_slice(&VERSION.to_le_bytes());
    if !client_allowed(&stream) {
        reply[6] = 2;
        return stream.write_all(&reply).map_err(io);
    }
    let valid = &req[..4] == REQ_MAGIC && req[4..6] == VERSION.to_le_bytes();
    let id = u64::from_le_bytes([
        req[6], req[7], req[8], req[9], req[10], req[11], req[12], req[13],
    ]);
    let fd = if valid {
        table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    } else {
        None
    };
    match fd {
        Some(fd) => {
            reply[6] = 0;
            os::send_with_fd(&stream, &reply, Some(fd.as_fd()))
        }
        None => {
            reply[6] = 1;
            stream.write_all(&reply).map_err(io)
        }
    }
}

/// Whether the connected client runs as this process's effective uid, or as root.
fn client_allowed(stream: &UnixStream) -> bool {
    match rustix::net::sockopt::socket_peercred(stream) {
        Ok(cred) => {
            let uid = cred.uid.as_raw();
            uid == 0 || uid == rustix::process::geteuid().as_raw()
        }
        Err(_) => false,
    }
}

/// A random id not in `table` (the kernel's getrandom: ids must be unguessable): `instance` in
/// the top byte, 56 random bits (not all zero) below it.
fn fresh_id(table: &HashMap<u64, Arc<OwnedFd>>, instance: u8) -> Result<u64> {
    loop {
        let mut b = [0u8; 8];
        let mut filled = 0;
        while filled < b.len() {
            filled +=
                rustix::rand::getrandom(&mut b[filled..], rustix::rand::GetRandomFlags::empty())
                    .map_err(|e| Error::Os {
                        op: "fd id (getrandom)",
                        source: e.into(),
                    })?;
        }
        let random = u64::from_le_bytes(b) & ((1 << 56) - 1);
        let id = (u64::from(instance) << 56) | random;
        if random != 0 && !table.contains_key(&id) {
            return Ok(id);
        }
    }
}

/// Keeps an fd available to importers; dropping it withdraws the fd from the server.
#[derive(Debug)]
pub struct FdRegistration {
    id: u64,
}

impl FdRegistration {
    /// The id importers ask for.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for FdRegistration {
    fn drop(&mut self) {
        if let Some(Ok(server)) = SERVER.get() {
            server
                .table
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&self.id);
        }
    }
}

/// Makes `fd` available to other processes on this host; starts the server on first use.
pub fn register(fd: OwnedFd) -> Result<FdRegistration> {
    let server = server()?;
    let mut table = server.table.lock().unwrap_or_else(|p| p.into_inner());
    let id = fresh_id(&table, server.instance)?;
    table.insert(id, Arc::new(fd));
    Ok(FdRegistration { id })
}

/// Asks process `pid` on host `host_id` for its registered fd `id` (at the server instance
/// the id names), waiting at most `timeout` for the reply.
pub fn fetch(host_id: u64, pid: u32, id: u64, timeout: Duration) -> Result<OwnedFd> {
    const OP: &str = "fd fetch";
    let gone = |reason: String| Error::PeerGone {
        op: OP,
        pid,
        reason,
    };
    let name = socket_name(host_id, pid, instance_of(id));
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|source| Error::Os { op: OP, source })?;
    let mut stream = UnixStream::connect_addr(&addr).map_err(|e| {
        gone(format!(
            "cannot connect to fd server @{name} (has the exporter exited?): {e}"
        ))
    })?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|source| Error::Os { op: OP, source })?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|source| Error::Os { op: OP, source })?;
    let mut req = [0u8; REQ_LEN];
    req[..4].copy_from_slice(REQ_MAGIC);
    req[4..6].copy_from_slice(&VERSION.to_le_bytes());
    req[6..].copy_from_slice(&id.to_le_bytes());
    stream
        .write_all(&req)
        .map_err(|e| gone(format!("sending the request: {e}")))?;
    let mut reply = [0u8; REP_LEN];
    let (n, fd) = os::recv_with_fd(&stream, &mut reply).map_err(|e| match e {
        Error::Os { source, .. }
            if matches!(
                source.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Error::Timeout {
                op: OP,
                waited: timeout,
            }
        }
        other => other,
    })?;
    if n != REP_LEN || &reply[..4] != REP_MAGIC || reply[4..6] != VERSION.to_le_bytes() {
        return Err(gone(format!(
            "expected a {REP_LEN}-byte reply, got {n} bytes {:?}",
            &reply[..n.min(REP_LEN)]
        )));
    }
    match (reply[6], fd) {
        (0, Some(fd)) => Ok(fd),
        (0, None) => Err(gone("reply said ok but carried no fd".into())),
        (1, _) => Err(Error::invalid(
            OP,
            format!("an fd registered under id {id}"),
            "unknown id (memory freed?)",
        )),
        (2, _) => Err(Error::invalid(
            OP,
            "an fd server of a process running as the same user (or root)".to_string(),
            format!("process {pid} refused: this process runs as another user"),
        )),
        (s, _) => Err(gone(format!("unknown reply status {s}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Seek;

    #[test]
    fn fd_round_trip_in_process() {
        let fd = os::memfd(c"fdpass-test", 16).unwrap();
        let mut f = std::fs::File::from(fd.try_clone().unwrap());
        f.write_all(b"hello fd server!").unwrap();
        let reg = register(fd).unwrap();
        let got = fetch(
            host_id(),
            std::process::id(),
            reg.id(),
            Duration::from_secs(5),
        )
        .unwrap();
        let mut g = std::fs::File::from(got);
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello fd server!");
        let id = reg.id();
        drop(reg);
        assert!(fetch(host_id(), std::process::id(), id, Duration::from_secs(5)).is_err());
    }

    #[test]
    fn missing_exporter_is_peer_gone() {
        // pid 0 never runs a server.
        match fetch(host_id(), 0, 1, Duration::from_secs(1)) {
            Err(Error::PeerGone { .. }) => {}
            other => panic!("expected PeerGone, got {other:?}"),
        }
    }

    #[test]
    fn ids_are_random_not_a_counter() {
        let regs: Vec<_> = (0..4)
            .map(|_| register(os::memfd(c"fdpass-id", 8).unwrap()).unwrap())
            .collect();
        let ids: Vec<u64> = regs.iter().map(|r| r.id()).collect();
        // A counter (the old design) gives small consecutive ids; four random 64-bit ids all
        // below 2^32 happen with probability 2^-128.
        assert!(ids.iter().any(|&i| i > u64::from(u32::MAX)), "{ids:?}");
        assert!(ids.iter().all(|&i| i != 0));
        for w in ids.windows(2) {
            assert_ne!(w[0] + 1, w[1], "{ids:?}");
        }
    }

    #[test]
    fn silent_clients_do_not_delay_others() {
        let reg = register(os::memfd(c"fdpass-silent", 8).unwrap()).unwrap();
        let name = socket_name(host_id(), std::process::id(), instance_of(reg.id()));
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        // Clients that connect and never send their request (more than the 8 workers the
        // server had: with them all held, imports failed after 10 s), and one that sends half:
        // a serial or pooled server would wait IO_TIMEOUT (10 s) on them.
        let mut silent: Vec<UnixStream> = (0..16)
            .map(|_| UnixStream::connect_addr(&addr).unwrap())
            .collect();
        silent[0].write_all(&REQ_MAGIC[..]).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let t = std::time::Instant::now();
        let got = fetch(
            host_id(),
            std::process::id(),
            reg.id(),
            Duration::from_secs(3),
        );
        assert!(got.is_ok(), "{got:?}");
        assert!(t.elapsed() < Duration::from_secs(3));
        drop(silent);
    }

    #[test]
    fn another_copy_in_the_process_takes_the_next_free_name() {
        // A pid no process has (above the kernel's pid_max limit of 2^22): only this test
        // binds its names.
        let pid = u32::MAX - 1;
        let (_first, i0) = bind_first_free(host_id(), pid).unwrap();
        let (_second, i1) = bind_first_free(host_id(), pid).unwrap();
        assert_eq!((i0, i1), (0, 1));
        assert_eq!(
            socket_name(7, pid, 1),
            format!("mscclpp-hal-fd.0000000000000007.{pid}.1")
        );
        assert_eq!(instance_of(3 << 56 | 12345), 3);
        // This process's server: its ids carry its instance.
        let reg = register(os::memfd(c"fdpass-instance", 8).unwrap()).unwrap();
        let own = SERVER.get().unwrap().as_ref().unwrap().instance;
        assert_eq!(instance_of(reg.id()), own);
    }

    /// Env of the child in [`another_user_is_refused`]: "pid:id" of the parent's registration.
    const CHILD_ENV: &str = crate::env::test_child::FDPASS_TARGET;

    #[test]
    fn child_fetch_as_another_user() {
        // Runs only as the child of another_user_is_refused (as uid 65534).
        let Some(target) = crate::env::test_child::marker(CHILD_ENV) else {
            return;
        };
        let (pid, id) = target.split_once(':').unwrap();
        match fetch(
            host_id(),
            pid.parse().unwrap(),
            id.parse().unwrap(),
            Duration::from_secs(5),
        ) {
            Err(e) if e.to_string().contains("another user") => println!("REFUSED-OK"),
            other => panic!("expected a refusal naming another user, got {other:?}"),
        }
    }

    #[test]
    fn another_user_is_refused() {
        use std::os::unix::process::CommandExt;
        if rustix::process::geteuid().as_raw() != 0 {
            println!("skipped: needs root to start a client as another uid");
            return;
        }
        let exe = std::env::current_exe().unwrap();
        // The client runs this test binary as uid 65534: every folder above it must let others
        // through (a checkout under a 0700 folder, e.g. from mktemp -d, does not).
        use std::os::unix::fs::PermissionsExt;
        if let Some(dir) = exe
            .ancestors()
            .skip(1)
            .find(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
        {
            println!(
                "skipped: {} is not searchable by other users, so uid 65534 cannot run {}",
                dir.display(),
                exe.display()
            );
            return;
        }
        let reg = register(os::memfd(c"fdpass-user", 8).unwrap()).unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "auxil::fdpass::tests::child_fetch_as_another_user",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{}:{}", std::process::id(), reg.id()))
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("REFUSED-OK"), "{text}");
    }
}
