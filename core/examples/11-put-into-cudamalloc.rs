//! 11: a kernel of one's own puts into a peer's buffer that the application allocated itself
//! (`cuMemAlloc`, what `cudaMalloc` returns; here through the HAL, so the mscclpp library does
//! not know the buffer). `Communicator::register_memory` takes the plain device pointer of a
//! sub-range of it: the library finds the allocation behind the pointer, exports it (legacy CUDA
//! IPC of its base) and the peer maps it at base + offset. Each of 2 ranks builds a memory
//! channel from its `send` buffer into the peer's sub-range, launches the kernel of example 08
//! (`examples/kernels/own_kernel.cu`) and checks what arrived, and that the bytes around the
//! sub-range are untouched. Ranks share the GPUs there are (rank r on GPU r % count; on one GPU
//! run it under MPS).
//!
//! `cargo run --release --features cuda -p mscclpp --example 11-put-into-cudamalloc`. On the
//! host backend (no `cuda`/`rocm` feature), or without a usable GPU, it says why it skips and
//! exits 0.

mod common;

use common::{check, put_signal_wait, semaphore_with, Ctx, Rank, Res};
use mscclpp::{EndpointConfig, GpuBuffer, MemoryChannel, RegisteredMemory};
use mscclpp::{MemoryDevice2DeviceSemaphore, Transport};
use mscclpp_hal::{prelude::*, Buffer, Gpu, MemoryKind};

// `KERNEL_OBJECTS`: (file stem, code object) of every kernel build.rs compiled.
include!(concat!(env!("OUT_DIR"), "/example_kernels.rs"));

/// u32 the kernel puts.
const N: usize = 1 << 20;
/// Where the registered sub-range starts in the application's allocation (bytes), and the
/// allocation's size: room on both sides.
const AT: usize = 64 << 10;
const ALLOC: usize = AT + N * 4 + (64 << 10);
/// What the application's buffer holds before the peer's put.
const FILL: u8 = 0x5a;

fn value(rank: usize, i: usize) -> u32 {
    ((rank as u32 + 1) << 24) ^ (i as u32).wrapping_mul(2_654_435_761)
}

fn body(me: &Rank) -> Res {
    let (rank, comm) = (me.rank, &me.comm);
    let peer = 1 - rank;
    let (device, dev) = common::gpu_of(rank)?;

    // The application's own allocation, filled, and a sub-range of it registered by pointer.
    let app = Gpu::alloc(&dev, ALLOC, MemoryKind::Device).ctx("cuMemAlloc")?;
    Gpu::memset(&dev, &app, 0, FILL, ALLOC).ctx("filling")?;
    let target = app.device_ptr() + AT as u64;
    let mine = comm
        .register_memory(target, N * 4, Transport::CudaIpc.into())
        .ctx("registering the cuMemAlloc sub-range")?;
    comm.send_memory(&mine, peer, 0)
        .ctx("sending the registration")?;
    let peer_target: RegisteredMemory = comm
        .recv_memory(peer, 0)
        .get()
        .ctx("receiving the peer's registration")?;

    let conn = comm
        .connect(EndpointConfig::new(Transport::CudaIpc, device), peer, 0)
        .get()
        .ctx("connecting")?;
    let send = GpuBuffer::<u32>::new(device, N).ctx("allocating")?;
    let data: Vec<u32> = (0..N).map(|i| value(rank, i)).collect();
    send.copy_from_host(0, &data).ctx("filling")?;
    let sem = semaphore_with(comm, &conn, peer)?;
    let sem = MemoryDevice2DeviceSemaphore::new(sem).ctx("device-to-device semaphore")?;
    let channel = MemoryChannel::new(sem, peer_target, send.data(), None).ctx("memory channel")?;
    put_signal_wait(&dev, KERNEL_OBJECTS, &channel, (N * 4) as u64)?;

    let mut all = vec![0u8; ALLOC];
    Gpu::read(&dev, &app, 0, &mut all).ctx("reading the application's buffer")?;
    let got: Vec<u32> = all[AT..AT + N * 4]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let want: Vec<u32> = (0..N).map(|i| value(peer, i)).collect();
    check("the peer's data in the cuMemAlloc buffer", &got, &want)?;
    let around: Vec<u8> = all[..AT]
        .iter()
        .chain(&all[AT + N * 4..])
        .copied()
        .collect();
    check(
        "the bytes around the registered sub-range",
        &around,
        &vec![FILL; around.len()],
    )?;
    comm.bootstrap().barrier().ctx("barrier")?;
    drop(mine);
    println!(
        "rank {rank} (GPU {}): {N} u32 from rank {peer} landed in this rank's cuMemAlloc buffer at offset {AT}",
        device.id
    );
    Ok(())
}

fn main() {
    common::run_on_gpu("11-put-into-cudamalloc", 2, 22011, body);
}
