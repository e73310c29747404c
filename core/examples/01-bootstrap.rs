//! Example 1: ranks find each other with `TcpBootstrap` and all-gather their rank numbers.
//!
//!     cargo run -p mscclpp --example 01-bootstrap           (starts its 2 ranks itself)
//!     mpirun -np 4 target/debug/examples/01-bootstrap       (one rank per process)
//! The ranks meet at `MSCCLPP_EXAMPLE_ADDR` (`ip:port`, default 127.0.0.1:22001).

mod common;

use std::time::Duration;

use common::{Ctx, Res};
use mscclpp::bootstrap::{Bootstrap, TcpBootstrap};

/// One rank: join the bootstrap at `addr`, all-gather the rank numbers, barrier.
fn rank_main(rank: usize, nranks: usize, addr: &str) -> Res {
    let mut bootstrap = TcpBootstrap::new(rank, nranks).ctx("creating the bootstrap")?;
    if let Some(key) = common::job_key() {
        bootstrap.set_job_key(&key).ctx("setting the job key")?;
    }
    // Rank 0 listens at `addr`; the others connect to it and learn each other's addresses.
    bootstrap
        .initialize_with_addr(addr, Duration::from_secs(30))
        .ctx(&format!("rank {rank}: joining the bootstrap at {addr}"))?;

    let all = bootstrap
        .all_gather(&(rank as u32).to_le_bytes())
        .ctx("all-gather")?;
    let ranks: Vec<u32> = all
        .iter()
        .map(|b| <[u8; 4]>::try_from(b.as_slice()).map(u32::from_le_bytes))
        .collect::<Result<_, _>>()
        .map_err(|_| "a peer sent a rank that is not 4 bytes".to_string())?;
    let want: Vec<u32> = (0..nranks as u32).collect();
    common::check("gathered ranks", &ranks, &want)?;
    bootstrap.barrier().ctx("barrier")?;
    println!(
        "rank {rank}/{nranks} ({} on this node): joined at {addr}, all-gather gave {ranks:?}",
        bootstrap.nranks_per_node()
    );
    Ok(())
}

fn main() {
    common::launch("01-bootstrap", 2, 22001, rank_main)
}
