//! 04: semaphores. Two ranks play ping-pong over an Ethernet connection: in each round one rank
//! writes a fresh value into the other's buffer and signals a `Host2HostSemaphore`; the other
//! waits for the signal (a signal is ordered after the writes before it on its connection), checks
//! the value and answers in the next round.
//!
//! `cargo run -p mscclpp --example 04-semaphores`.

mod common;

use common::{check, exchange_buffer, semaphore_with, Ctx, Rank, Res, TIMEOUT};
use mscclpp::{Device, EndpointConfig, GpuBuffer, Host2HostSemaphore, Transport};

const ROUNDS: u32 = 10;
const N: usize = 1024;

fn body(me: &Rank) -> Res {
    let (rank, comm) = (me.rank, &me.comm);
    let peer = 1 - rank;
    let cfg = EndpointConfig::new(Transport::Ethernet, Device::CPU);
    let conn = comm.connect(cfg, peer, 0).get().ctx("connecting")?;
    let buf = GpuBuffer::<u32>::new(Device::CPU, N).ctx("allocating")?;
    let staging = GpuBuffer::<u32>::new(Device::CPU, N).ctx("allocating")?;
    let flags = Transport::Ethernet.into();
    let staging_reg = comm
        .register_memory(staging.data(), staging.bytes(), flags)
        .ctx("registering")?;
    let (_buf_reg, remote) = exchange_buffer(comm, peer, &buf, flags)?;
    // One semaphore per pair of ranks: each side signals the other's token and waits on its own.
    let sem = semaphore_with(comm, &conn, peer)?;
    let sem = Host2HostSemaphore::new(sem).ctx("host-to-host semaphore")?;

    for round in 0..ROUNDS {
        let data: Vec<u32> = (0..N as u32).map(|i| round * 100_000 + i).collect();
        if round % 2 == rank as u32 {
            staging.copy_from_host(0, &data).ctx("filling")?;
            conn.write(&remote, 0, &staging_reg, 0, (N * 4) as u64)
                .ctx("writing")?;
            sem.signal().ctx("signalling")?;
        } else {
            sem.wait(TIMEOUT)
                .ctx(&format!("waiting for round {round}"))?;
            check(
                &format!("round {round}"),
                &buf.to_vec().ctx("reading")?,
                &data,
            )?;
        }
    }
    conn.flush(TIMEOUT).ctx("flushing")?;
    // Nobody tears its connection down while the other still uses it.
    comm.bootstrap().barrier().ctx("barrier")?;
    println!("rank {rank}: {ROUNDS} rounds, every value checked");
    Ok(())
}

fn main() {
    common::run("04-semaphores", 2, 22004, body)
}
