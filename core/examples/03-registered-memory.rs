//! 03: registered memory over a communicator. Each of 3 ranks registers a receive buffer with
//! one slot per rank, sends it to every peer, connects to every peer over Ethernet and writes
//! its own data into its slot of every peer's buffer (`Connection::write`, then `flush`: done
//! at the peer). After a barrier every rank checks all slots.
//!
//! `cargo run -p mscclpp --example 03-registered-memory` (starts its 3 ranks itself), or
//! `mpirun -np 3 target/debug/examples/03-registered-memory`.

mod common;

use common::{check, Ctx, Rank, Res, TIMEOUT};
use mscclpp::{Device, EndpointConfig, GpuBuffer, Transport};

/// u32 elements each rank contributes.
const N: usize = 4096;

/// Element `i` of rank `r`'s data.
fn value(r: usize, i: usize) -> u32 {
    ((r as u32) << 24) | i as u32
}

fn body(me: &Rank) -> Res {
    let (rank, n, comm) = (me.rank, me.nranks, &me.comm);
    let peers: Vec<usize> = (0..n).filter(|&p| p != rank).collect();
    // Ethernet reaches peers on any host; the memory is host memory (Device::CPU).
    let cfg = EndpointConfig::new(Transport::Ethernet, Device::CPU);
    let connections: Vec<_> = peers
        .iter()
        .map(|&p| (p, comm.connect(cfg, p, 0)))
        .collect();

    let send = GpuBuffer::<u32>::new(Device::CPU, N).ctx("allocating")?;
    let recv = GpuBuffer::<u32>::new(Device::CPU, N * n).ctx("allocating")?;
    let mine: Vec<u32> = (0..N).map(|i| value(rank, i)).collect();
    send.copy_from_host(0, &mine).ctx("filling")?;
    recv.copy_from_host(rank * N, &mine).ctx("filling")?;
    let flags = Transport::Ethernet.into();
    let send_reg = comm
        .register_memory(send.data(), send.bytes(), flags)
        .ctx("registering")?;
    let recv_reg = comm
        .register_memory(recv.data(), recv.bytes(), flags)
        .ctx("registering")?;
    // A registered memory serializes into a few bytes a peer can write through.
    for &p in &peers {
        comm.send_memory(&recv_reg, p, 1)
            .ctx(&format!("sending memory to rank {p}"))?;
    }
    // Futures resolve in rank order on every rank, so no two ranks wait on each other.
    let mut connections_ready = Vec::new();
    for (p, fut) in connections {
        connections_ready.push((p, fut.get().ctx(&format!("connecting to rank {p}"))?));
    }
    for (p, conn) in &connections_ready {
        let remote = comm
            .recv_memory(*p, 1)
            .get()
            .ctx(&format!("memory of rank {p}"))?;
        let bytes = (N * 4) as u64;
        conn.write(&remote, (rank * N * 4) as u64, &send_reg, 0, bytes)
            .ctx(&format!("writing to rank {p}"))?;
        conn.flush(TIMEOUT).ctx(&format!("flushing to rank {p}"))?;
    }
    // Every rank flushed its writes: all slots are in.
    comm.bootstrap().barrier().ctx("barrier")?;
    let got = recv.to_vec().ctx("reading")?;
    let want: Vec<u32> = (0..N * n).map(|i| value(i / N, i % N)).collect();
    check("the gathered buffer", &got, &want)?;
    // Nobody closes its connections while a peer still checks.
    comm.bootstrap().barrier().ctx("barrier")?;
    println!("rank {rank}: all {n} slots correct");
    Ok(())
}

fn main() {
    common::run("03-registered-memory", 3, 22003, body)
}
