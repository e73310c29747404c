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

use common::{check, exchange_buffer, semaphore_with, Ctx, Rank, Res, TIMEOUT};
use mscclpp::{Device, EndpointConfig, GpuBuffer, MemoryChannel, MemoryChannelDeviceHandle};
use mscclpp::{MemoryDevice2DeviceSemaphore, Transport};
use mscclpp_hal::{prelude::*, Gpu, LaunchConfig};

// `KERNEL_OBJECTS`: (file stem, code object) of every kernel build.rs compiled.
include!(concat!(env!("OUT_DIR"), "/example_kernels.rs"));

const N: usize = 1 << 20;

/// The kernel's parameters, in the order of its C signature.
#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    ch: MemoryChannelDeviceHandle,
    bytes: u64,
}

fn value(rank: usize, i: usize) -> u32 {
    ((rank as u32 + 1) << 24) ^ i as u32
}

fn body(me: &Rank) -> Res {
    let (rank, comm) = (me.rank, &me.comm);
    let peer = 1 - rank;
    let count = Gpu::device_count().ctx("counting GPUs")?;
    let device = Device::gpu((rank % count) as i32);
    let dev = Gpu::open_device(device.id as usize).ctx("opening the GPU")?;

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

    let (_, code) = KERNEL_OBJECTS
        .iter()
        .find(|(stem, _)| *stem == "own_kernel")
        .ok_or("build.rs embedded no own_kernel code object")?;
    let module = Gpu::load_module(&dev, code).ctx("loading the module")?;
    let kernel = Gpu::get_kernel(&module, "own_put_signal_wait").ctx("finding the kernel")?;
    let stream = Gpu::create_stream(&dev).ctx("creating a stream")?;
    let args = Args {
        ch: channel.device_handle(),
        bytes: (N * 4) as u64,
    };
    // SAFETY: `Args` matches the kernel's parameter list; `channel` (and the memory and
    // semaphore it holds) and both buffers live until the stream is synchronized below.
    unsafe { Gpu::launch(&kernel, &LaunchConfig::linear(1, 512), &stream, &args) }
        .ctx("launching the kernel")?;
    Gpu::stream_synchronize(&stream, TIMEOUT).ctx("waiting for the kernel")?;

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
    if Gpu::NAME == "host" {
        println!(
            "08-own-kernel: skipped: built for the host backend, which runs no kernels; build with --features cuda (or rocm) on a machine with a GPU"
        );
        return;
    }
    match Gpu::device_count() {
        Ok(0) => println!("08-own-kernel: skipped: no GPU found"),
        Err(e) => println!("08-own-kernel: skipped: no usable GPU: {e}"),
        Ok(_) => common::run("08-own-kernel", 2, 22008, body),
    }
}
