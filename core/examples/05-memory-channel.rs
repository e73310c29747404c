//! 05: a memory channel: put, signal, wait. Two ranks on one host map each other's buffer
//! (CudaIpc; on the host backend shared host memory) and build a `MemoryChannel` from their
//! `send` buffer to the peer's `recv` buffer. Its device handle is what a GPU kernel takes; here
//! a "thread block" of CPU threads plays the kernel with `mscclpp::device_emu`, the host
//! backend's version of `kernels/cuda/include/mscclpp/memory_channel_device.hpp`: all threads
//! `put` their share, one thread `signal`s, then `wait`s for the peer's data. Several rounds,
//! checked every time (example 08 runs the same with a real CUDA kernel).
//!
//! `cargo run -p mscclpp --example 05-memory-channel`.

mod common;

use std::sync::Barrier;

use common::{check_round, exchange_buffer, semaphore_with, Ctx, Rank, Res, TIMEOUT};
use mscclpp::device_emu::memory_channel::MemorySemaphoreOps;
use mscclpp::{Device, EndpointConfig, GpuBuffer, MemoryChannel, MemoryDevice2DeviceSemaphore};
use mscclpp::{MemoryChannelDeviceHandle, Transport};

const ROUNDS: u32 = 8;
const N: usize = 1 << 16;
/// CPU threads playing one thread block.
const THREADS: u32 = 4;

fn value(rank: usize, round: u32, i: usize) -> u32 {
    ((rank as u32 + 1) * 1_000_003) ^ (round << 20) ^ i as u32
}

/// The "kernel": every thread copies its share into the peer, thread 0 signals and waits.
fn kernel(ch: &MemoryChannelDeviceHandle, tid: u32, block: &Barrier) -> mscclpp::Result<()> {
    // SAFETY: the channel and both buffers outlive this call (the caller joins the threads
    // first); N u32 fit both buffers.
    unsafe {
        ch.put(0, 0, (N * 4) as u64, tid, THREADS)?;
        block.wait(); // __syncthreads(): every share is written before the signal
        if tid == 0 {
            ch.signal();
            ch.wait(TIMEOUT)?;
        }
    }
    block.wait();
    Ok(())
}

fn body(me: &Rank) -> Res {
    let (rank, comm) = (me.rank, &me.comm);
    let peer = 1 - rank;
    let device = Device::CPU;
    let cfg = EndpointConfig::new(Transport::CudaIpc, device);
    let conn = comm.connect(cfg, peer, 0).get().ctx("connecting")?;
    let send = GpuBuffer::<u32>::new(device, N).ctx("allocating")?;
    let recv = GpuBuffer::<u32>::new(device, N).ctx("allocating")?;
    let (_recv_reg, peer_recv) = exchange_buffer(comm, peer, &recv, Transport::CudaIpc.into())?;
    let sem = semaphore_with(comm, &conn, peer)?;
    let sem = MemoryDevice2DeviceSemaphore::new(sem).ctx("device-to-device semaphore")?;
    let channel = MemoryChannel::new(sem, peer_recv, send.data(), None).ctx("memory channel")?;
    let handle = channel.device_handle();

    for round in 0..ROUNDS {
        let mine: Vec<u32> = (0..N).map(|i| value(rank, round, i)).collect();
        send.copy_from_host(0, &mine).ctx("filling")?;
        let block = Barrier::new(THREADS as usize);
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..THREADS)
                .map(|tid| {
                    s.spawn({
                        let (h, b) = (&handle, &block);
                        move || kernel(h, tid, b)
                    })
                })
                .collect();
            threads.into_iter().try_for_each(|t| match t.join() {
                Ok(r) => r.ctx(&format!("round {round}")),
                Err(_) => Err("a device thread panicked".to_string()),
            })
        })?;
        check_round(round, &recv, |i| value(peer, round, i))?;
        // The peer may overwrite `recv` only once this rank read it: one more signal/wait.
        // SAFETY: as in `kernel`.
        unsafe {
            handle.signal();
            handle.wait(TIMEOUT).ctx("end of round")?;
        }
    }
    comm.bootstrap().barrier().ctx("barrier")?;
    println!("rank {rank}: {ROUNDS} rounds of {N} u32 through the memory channel, all correct");
    Ok(())
}

fn main() {
    common::run("05-memory-channel", 2, 22005, body)
}
