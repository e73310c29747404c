//! 06: a port channel through the proxy. A kernel cannot drive a NIC, so for transports other
//! than peer memory it pushes small requests into a FIFO and a CPU thread, the proxy
//! (`ProxyService`), performs them over the connection: here Ethernet, which reaches other
//! hosts. Each rank registers its buffers with the proxy, gets a `PortChannel` from its
//! `send` buffer to the peer's `recv` buffer, and its "device" (a CPU thread with
//! `mscclpp::device_emu`, as on the host backend) calls `put_with_signal` and `wait`, as a GPU
//! thread would with `port_channel_device.hpp`. Every round is checked.
//!
//! `cargo run -p mscclpp --example 06-port-channel`.

// `pub`: 07-ib includes this file and uses its `common`.
pub mod common;

use common::{check_round, exchange_buffer, semaphore_with, Ctx, Rank, Res, TIMEOUT};
use mscclpp::{Device, EndpointConfig, GpuBuffer, Host2DeviceSemaphore, ProxyService, Transport};

const ROUNDS: u32 = 8;
const N: usize = 1 << 14;

fn value(rank: usize, round: u32, i: usize) -> u32 {
    ((rank as u32 + 1) * 7_654_321) ^ (round << 24) ^ i as u32
}

/// Runs the example's port channel rounds over `cfg` (07 runs it over IB).
pub fn port_channel_rounds(me: &Rank, cfg: EndpointConfig) -> Res {
    let (rank, comm) = (me.rank, &me.comm);
    let peer = 1 - rank;
    let conn = comm.connect(cfg, peer, 0).get().ctx("connecting")?;
    let send = GpuBuffer::<u32>::new(cfg.device, N).ctx("allocating")?;
    let recv = GpuBuffer::<u32>::new(cfg.device, N).ctx("allocating")?;
    let flags = cfg.transport.into();
    let send_reg = comm
        .register_memory(send.data(), send.bytes(), flags)
        .ctx("registering")?;
    let (_recv_reg, peer_recv) = exchange_buffer(comm, peer, &recv, flags)?;
    let sem = semaphore_with(comm, &conn, peer)?;
    let sem = Host2DeviceSemaphore::new(sem).ctx("host-to-device semaphore")?;

    // The proxy: a host FIFO here, since a CPU thread plays the device (ProxyService::new()
    // puts the FIFO where a GPU can push to it).
    let mut proxy = ProxyService::new_host().ctx("creating the proxy")?;
    let sid = proxy.add_semaphore(sem).ctx("adding the semaphore")?;
    let dst = proxy.add_memory(peer_recv).ctx("adding memory")?;
    let src = proxy.add_memory(send_reg).ctx("adding memory")?;
    let channel = proxy.port_channel(sid, dst, src).ctx("port channel")?;
    proxy.start_proxy().ctx("starting the proxy")?;
    let ch = channel.device_handle();

    for round in 0..ROUNDS {
        let mine: Vec<u32> = (0..N).map(|i| value(rank, round, i)).collect();
        send.copy_from_host(0, &mine).ctx("filling")?;
        // SAFETY: the proxy, channel and buffers outlive the handle's use; N u32 fit both.
        unsafe {
            // One FIFO request: "write N*4 bytes from src+0 to dst+0, then signal".
            ch.put_with_signal(0, 0, (N * 4) as u64, TIMEOUT)
                .ctx("put")?;
            ch.wait(TIMEOUT)
                .ctx(&format!("waiting for round {round}"))?;
            // The proxy must be done reading `send` before the next round refills it.
            ch.flush(TIMEOUT).ctx("flush")?;
        }
        check_round(round, &recv, |i| value(peer, round, i))?;
        // The peer may overwrite `recv` only once this rank read it.
        // SAFETY: as above.
        unsafe {
            ch.signal(TIMEOUT).ctx("signal")?;
            ch.wait(TIMEOUT).ctx("end of round")?;
        }
    }
    // SAFETY: as above.
    unsafe { ch.flush(TIMEOUT).ctx("flush")? };
    comm.bootstrap().barrier().ctx("barrier")?;
    proxy.stop_proxy().ctx("the proxy's requests")?;
    println!(
        "rank {rank}: {ROUNDS} rounds of {N} u32 through the proxy over {}, all correct",
        cfg.transport
    );
    Ok(())
}

#[allow(dead_code)] // 07 includes this file for `port_channel_rounds`
fn body(me: &Rank) -> Res {
    port_channel_rounds(me, EndpointConfig::new(Transport::Ethernet, Device::CPU))
}

#[allow(dead_code)] // unused when 07 includes this file
fn main() {
    common::run("06-port-channel", 2, 22006, body)
}
