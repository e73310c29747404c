//! What the numbered examples share: starting their ranks, the bootstrap and communicator, and
//! turning errors into a message and a non-zero exit status.
//!
//! An example runs `nranks` ranks. Started by hand (`cargo run --example ...`), it starts them
//! itself: it runs its own binary once per rank with `MSCCLPP_EXAMPLE_RANK` set, waits for all
//! of them (killing the rest when one fails or the time is up) and exits non-zero if any failed.
//! Under a launcher (`mpirun -np N`, Slurm's `srun`) every process is one rank already. The ranks
//! meet at `MSCCLPP_EXAMPLE_ADDR` (`ip:port`), by default 127.0.0.1 and the example's own port.

#![allow(dead_code)] // each example uses a part of it

use std::fmt::Display;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::{
    Communicator, Connection, Context, GpuBuffer, MemoryChannel, MemoryChannelDeviceHandle,
    RegisteredMemory, Semaphore, TcpBootstrap, TransportFlags,
};
use mscclpp_hal::{prelude::*, Gpu, LaunchConfig};

/// How long any one blocking step of an example may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// What a rank's body gets.
pub struct Rank {
    /// This rank, `0..nranks`.
    pub rank: usize,
    /// The number of ranks.
    pub nranks: usize,
    /// The communicator over the example's bootstrap.
    pub comm: Arc<Communicator>,
}

/// An example's result: the error is the message printed before exiting with status 1.
pub type Res<T = ()> = Result<T, String>;

/// Adds what was being done to an error.
pub trait Ctx<T> {
    /// The error as "`what`: error".
    fn ctx(self, what: &str) -> Res<T>;
}

impl<T, E: Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Res<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// Registers `buf` for `transports`, sends the registration to `peer` and receives the peer's
/// (tag 1): the exchange example 03 goes through step by step. Returns this rank's
/// registration (keep it while the peer may write) and the peer's.
pub fn exchange_buffer<T: Copy>(
    comm: &Communicator,
    peer: usize,
    buf: &GpuBuffer<T>,
    transports: TransportFlags,
) -> Res<(RegisteredMemory, RegisteredMemory)> {
    let mine = comm
        .register_memory(buf.data(), buf.bytes(), transports)
        .ctx("registering")?;
    comm.send_memory(&mine, peer, 1).ctx("sending memory")?;
    let theirs = comm.recv_memory(peer, 1).get().ctx("receiving memory")?;
    Ok((mine, theirs))
}

/// The semaphore between this rank and `peer` over `conn` (tag 2), as example 04 builds it.
pub fn semaphore_with(comm: &Communicator, conn: &Connection, peer: usize) -> Res<Semaphore> {
    comm.build_semaphore(conn, peer, 2)
        .get()
        .ctx("building the semaphore")
}

/// The parameters of `own_put_signal_wait` (examples/kernels/own_kernel.cu), in the order of
/// its C signature.
#[repr(C)]
#[derive(Clone, Copy)]
struct PutSignalWaitArgs {
    ch: MemoryChannelDeviceHandle,
    bytes: u64,
}

/// Runs `own_put_signal_wait` of the embedded code objects `objects` (one block of 512
/// threads) with `channel`: it puts `bytes` from the channel's source into the peer's
/// destination, signals the peer and waits for its signal. Returns when the kernel finished.
pub fn put_signal_wait(
    dev: &<Gpu as Api>::Device,
    objects: &[(&str, &[u8])],
    channel: &MemoryChannel,
    bytes: u64,
) -> Res {
    let (_, code) = objects
        .iter()
        .find(|(stem, _)| *stem == "own_kernel")
        .ok_or("build.rs embedded no own_kernel code object")?;
    let module = Gpu::load_module(dev, code).ctx("loading the module")?;
    let kernel = Gpu::get_kernel(&module, "own_put_signal_wait").ctx("finding the kernel")?;
    let stream = Gpu::create_stream(dev).ctx("creating a stream")?;
    let args = PutSignalWaitArgs {
        ch: channel.device_handle(),
        bytes,
    };
    // SAFETY: the struct matches the kernel's parameter list; `channel` (and the memory and
    // semaphore it holds) lives until the stream is synchronized below.
    unsafe { Gpu::launch(&kernel, &LaunchConfig::linear(1, 512), &stream, &args) }
        .ctx("launching the kernel")?;
    Gpu::stream_synchronize(&stream, TIMEOUT).ctx("waiting for the kernel")
}

/// The GPU of `rank` when the ranks share the GPUs there are (rank r on GPU r % count), and
/// its HAL device.
pub fn gpu_of(rank: usize) -> Res<(mscclpp::Device, <Gpu as Api>::Device)> {
    let count = Gpu::device_count().ctx("counting GPUs")?;
    let device = mscclpp::Device::gpu((rank % count) as i32);
    let dev = Gpu::open_device(device.id as usize).ctx("opening the GPU")?;
    Ok((device, dev))
}

/// [`run`] for an example that needs a GPU: on the host backend (it runs no kernels), or
/// without a usable GPU, says why it skips and exits 0.
pub fn run_on_gpu(name: &str, nranks: usize, port: u16, body: fn(&Rank) -> Res) {
    if Gpu::NAME == "host" {
        println!(
            "{name}: skipped: built for the host backend, which runs no kernels; build with --features cuda (or rocm) on a machine with a GPU"
        );
        return;
    }
    match Gpu::device_count() {
        Ok(0) => println!("{name}: skipped: no GPU found"),
        Err(e) => println!("{name}: skipped: no usable GPU: {e}"),
        Ok(_) => run(name, nranks, port, body),
    }
}

/// Checks that `buf` holds `want(i)` at every index `i`: what the peer sent in round `round`.
pub fn check_round(round: u32, buf: &GpuBuffer<u32>, want: impl Fn(usize) -> u32) -> Res {
    let want: Vec<u32> = (0..buf.len()).map(want).collect();
    check(
        &format!("round {round}"),
        &buf.to_vec().ctx("reading")?,
        &want,
    )
}

/// Compares what arrived with what was sent; names the first differing element.
pub fn check<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> Res {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: got {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: element {i} is {:?}, expected {:?}",
            got[i], want[i]
        )),
    }
}

/// Runs `body` as every rank of the example `name` (see the module docs) and exits: status 0
/// when every rank succeeded, 1 otherwise.
pub fn run(name: &str, nranks: usize, port: u16, body: fn(&Rank) -> Res) -> ! {
    launch(name, nranks, port, |rank, n, addr| {
        run_rank(rank, n, addr, body)
    })
}

/// As [`run`], for an example that builds its own bootstrap: `rank_main(rank, nranks, addr)`
/// runs as every rank (join the bootstrap at `addr`, with [`job_key`] when there is one).
pub fn launch(
    name: &str,
    nranks: usize,
    port: u16,
    rank_main: impl FnOnce(usize, usize, &str) -> Res,
) -> ! {
    let addr =
        std::env::var("MSCCLPP_EXAMPLE_ADDR").unwrap_or_else(|_| format!("127.0.0.1:{port}"));
    let result = match rank_from_env() {
        Some(r) => r.and_then(|(rank, n)| rank_main(rank, n, &addr)),
        None => spawn_ranks(nranks, &addr),
    };
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::exit(1)
        }
    }
}

/// This process's (rank, nranks) when it is one rank already: self-spawned or under a launcher.
fn rank_from_env() -> Option<Res<(usize, usize)>> {
    const VARS: [(&str, &str); 3] = [
        ("MSCCLPP_EXAMPLE_RANK", "MSCCLPP_EXAMPLE_NRANKS"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ];
    let (rv, nv) = VARS.iter().find(|(r, _)| std::env::var_os(r).is_some())?;
    let num = |v: &str| -> Res<usize> {
        let s = std::env::var(v).ctx(v)?;
        s.parse()
            .map_err(|_| format!("{v}={s:?}: expected a non-negative integer"))
    };
    Some(num(rv).and_then(|r| Ok((r, num(nv)?))))
}

/// One rank: bootstrap, communicator, then the example's body.
fn run_rank(rank: usize, nranks: usize, addr: &str, body: fn(&Rank) -> Res) -> Res {
    let mut bootstrap = TcpBootstrap::new(rank, nranks).ctx("creating the bootstrap")?;
    if let Some(key) = job_key() {
        bootstrap.set_job_key(&key).ctx("setting the job key")?;
    }
    bootstrap
        .initialize_with_addr(addr, TIMEOUT)
        .ctx(&format!("rank {rank}: joining the bootstrap at {addr}"))?;
    let context = Context::new().ctx("creating a context")?;
    let comm = Arc::new(Communicator::new(Arc::new(bootstrap), context));
    body(&Rank { rank, nranks, comm }).map_err(|e| format!("rank {rank}: {e}"))
}

/// The job key of self-spawned ranks: the parent's key keeps other jobs on the same port out.
pub fn job_key() -> Option<String> {
    std::env::var("MSCCLPP_EXAMPLE_KEY").ok()
}

/// Starts this binary once per rank and waits for them all.
fn spawn_ranks(nranks: usize, addr: &str) -> Res {
    let exe = std::env::current_exe().ctx("finding this example's binary")?;
    let key = format!("example-{}", std::process::id());
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..nranks {
        let child = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .env("MSCCLPP_EXAMPLE_RANK", rank.to_string())
            .env("MSCCLPP_EXAMPLE_NRANKS", nranks.to_string())
            .env("MSCCLPP_EXAMPLE_ADDR", addr)
            .env("MSCCLPP_EXAMPLE_KEY", &key)
            .spawn();
        match child {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                kill_all(&mut children);
                return Err(format!("starting rank {rank}: {e}"));
            }
        }
    }
    // Every rank's steps are bounded by TIMEOUT; a rank still running well after is stuck.
    let deadline = Instant::now() + TIMEOUT * 2;
    let mut failed = Vec::new();
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait() {
                Ok(None) => i += 1,
                Ok(Some(status)) => {
                    let (rank, _) = children.swap_remove(i);
                    if !status.success() {
                        failed.push(format!("rank {rank} exited with {status}"));
                    }
                }
                Err(e) => {
                    let (rank, _) = children.swap_remove(i);
                    failed.push(format!("waiting for rank {rank}: {e}"));
                }
            }
        }
        if !failed.is_empty() || Instant::now() > deadline {
            if failed.is_empty() {
                let ranks: Vec<_> = children.iter().map(|(r, _)| *r).collect();
                failed.push(format!(
                    "ranks {ranks:?} still running after {:?}",
                    TIMEOUT * 2
                ));
            }
            kill_all(&mut children);
            return Err(failed.join("; "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("all {nranks} ranks passed");
    Ok(())
}

/// Kills and reaps the ranks this process started.
fn kill_all(children: &mut Vec<(usize, Child)>) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    children.clear();
}
