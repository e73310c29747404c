//! 08: one's own CUDA kernel with a channel handle. `examples/kernels/own_kernel.cu` includes
//! `<mscclpp/device_api.hpp>` and takes a `MemoryChannelDeviceHandle` by value; `build.rs`
//! compiles it with `mscclpp-kernel-build` and embeds the code object (as a crate using
//! mscclpp would). Each of 2 ranks builds a memory channel from its `send` buffer to the peer's
//! `recv` buffer (GPU memory, CudaIpc), loads the module through the HAL, launches the kernel
//! with the channel's device handle and checks what arrived. Ranks share the GPUs there are
//! (rank r on GPU r % count; on one GPU run it under MPS).
//!
//! `cargo run --release --features cuda -p mscclpp --example 08-own-kernel`. On the host
//! backend (no `cuda`/`rocm` feature), or without a usable GPU, it says why it skips and exits 0.

mod common;

use common::{check, exchange_buffer, put_signal_wait, semaphore_with, Ctx, Rank, Res};
use mscclpp::{EndpointConfig, GpuBuffer, MemoryChannel};
use mscclpp::{MemoryDevice2DeviceSemaphore, Transport};

// `KERNEL_OBJECTS`: (file stem, code object) of every kernel build.rs compiled.
include!(concat!(env!("OUT_DIR"), "/example_kernels.rs"));

const N: usize = 1 << 20;

fn value(rank: usize, i: usize) -> u32 {
    ((rank as u32 + 1) << 24) ^ i as u32
}

fn body(me: &Rank) -> Res {
    let (rank, comm) = (me.rank, &me.comm);
    let peer = 1 - rank;
    let (device, dev) = common::gpu_of(rank)?;

    let conn = comm
        .connect(EndpointConfig::new(Transport::CudaIpc, device), peer, 0)
        .get()
        .ctx("connecting")?;
    let send = GpuBuffer::<u32>::new(device, N).ctx("allocating")?;
    let recv = GpuBuffer::<u32>::new(device, N).ctx("allocating")?;
    let mine: Vec<u32> = (0..N).map(|i| value(rank, i)).collect();
    send.copy_from_host(0, &mine).ctx("filling")?;
    let (_recv_reg, peer_recv) = exchange_buffer(comm, peer, &recv, Transport::CudaIpc.into())?;
    let sem = semaphore_with(comm, &conn, peer)?;
    let sem = MemoryDevice2DeviceSemaphore::new(sem).ctx("device-to-device semaphore")?;
    let channel = MemoryChannel::new(sem, peer_recv, send.data(), None).ctx("memory channel")?;

    put_signal_wait(&dev, KERNEL_OBJECTS, &channel, (N * 4) as u64)?;

    let want: Vec<u32> = (0..N).map(|i| value(peer, i)).collect();
    check("the peer's data", &recv.to_vec().ctx("reading")?, &want)?;
    comm.bootstrap().barrier().ctx("barrier")?;
    println!(
        "rank {rank} (GPU {}): {N} u32 from rank {peer} correct",
        device.id
    );
    Ok(())
}

fn main() {
    common::run_on_gpu("08-own-kernel", 2, 22008, body);
}
