//! 09: an all-reduce through `mscclpp::collectives`. `Collectives::new` connects every pair of
//! the 4 ranks once and sets up scratch buffers; `all_reduce` then picks an algorithm for each
//! size (`algorithm_for` says which; `MSCCLPP_ALLREDUCE_ALGO` forces one). On a GPU build the
//! buffers are GPU memory and the call is asynchronous on the given stream; on the host backend
//! CPU threads run the same algorithm and the call returns when it is done. Every element of
//! every size is checked.
//!
//! `cargo run -p mscclpp --example 09-allreduce` (add `--release --features cuda` for GPUs).

mod common;

use common::{check, Ctx, Rank, Res, TIMEOUT};
use mscclpp::collectives::{CollectiveKind, Collectives, CollectivesConfig, DataType, ReduceOp};
use mscclpp::{DeviceType, GpuBuffer};
use mscclpp_hal::{prelude::*, Gpu, StreamInterop};

/// Element counts: small ones go through LL packets, larger ones through plain scratch.
const COUNTS: [usize; 3] = [1024, 64 * 1024, 1024 * 1024];

/// Rank `r`'s element `i`: small integers, so the f32 sums are exact.
fn value(r: usize, i: usize) -> f32 {
    ((r * 31 + i) % 1000) as f32
}

fn body(me: &Rank) -> Res {
    let rank = me.rank;
    let cfg = CollectivesConfig {
        ll_half_bytes: 1 << 20,
        plain_bytes: 4 << 20,
        ..CollectivesConfig::default()
    };
    let coll = Collectives::with_config(me.comm.clone(), cfg).ctx("setting up the collectives")?;
    let device = coll.resources().device();
    // A GPU build runs on a stream of this rank's GPU; the host backend needs none (0).
    let stream = match device.kind {
        DeviceType::Gpu => {
            let dev = Gpu::open_device(device.id as usize).ctx("opening the GPU")?;
            Some(Gpu::create_stream(&dev).ctx("creating a stream")?)
        }
        DeviceType::Cpu => None,
    };
    let raw = stream.as_ref().map_or(0, Gpu::raw_stream);
    for count in COUNTS {
        let send = GpuBuffer::<f32>::new(device, count).ctx("allocating")?;
        let recv = GpuBuffer::<f32>::new(device, count).ctx("allocating")?;
        let mine: Vec<f32> = (0..count).map(|i| value(rank, i)).collect();
        send.copy_from_host(0, &mine).ctx("filling")?;
        let algo = coll
            .algorithm_for(CollectiveKind::AllReduce, count * 4)
            .ctx("choosing the algorithm")?;
        // SAFETY: both buffers hold `count` f32 and live until the stream is synchronized.
        unsafe {
            coll.all_reduce(
                send.data(),
                recv.data(),
                count,
                DataType::F32,
                ReduceOp::Sum,
                raw,
            )
        }
        .ctx(&format!("all-reduce of {count} f32"))?;
        if let Some(s) = &stream {
            Gpu::stream_synchronize(s, TIMEOUT).ctx("waiting for the all-reduce")?;
        }
        let want: Vec<f32> = (0..count)
            .map(|i| (0..me.nranks).map(|r| value(r, i)).sum())
            .collect();
        check(
            &format!("all-reduce of {count} f32"),
            &recv.to_vec().ctx("reading")?,
            &want,
        )?;
        if rank == 0 {
            println!(
                "all-reduce of {count} f32 ({algo}) on {} ranks: correct",
                me.nranks
            );
        }
    }
    me.comm.bootstrap().barrier().ctx("barrier")?;
    Ok(())
}

fn main() {
    common::run("09-allreduce", 4, 22009, body)
}
