//! Example 1: ranks find each other with `TcpBootstrap` and all-gather their rank numbers.
//!
//! Under MPI (rank and size from `OMPI_COMM_WORLD_RANK` / `OMPI_COMM_WORLD_SIZE`):
//!     mpirun -np 4 --oversubscribe target/debug/examples/01-bootstrap 127.0.0.1:50051
//! By hand, one shell per rank:
//!     cargo run -p mscclpp --example 01-bootstrap -- 127.0.0.1:50051 0 2
//!     cargo run -p mscclpp --example 01-bootstrap -- 127.0.0.1:50051 1 2

use mscclpp::bootstrap::{Bootstrap, TcpBootstrap};
use std::time::Duration;

fn parse(what: &str, s: Option<String>) -> Result<usize, String> {
    let s =
        s.ok_or_else(|| format!("missing {what}: give it as an argument or run under mpirun"))?;
    s.parse()
        .map_err(|_| format!("{what} = {s:?}: expected a non-negative integer"))
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:50051".to_string());
    let rank = parse(
        "rank",
        args.next()
            .or_else(|| std::env::var("OMPI_COMM_WORLD_RANK").ok()),
    )?;
    let nranks = parse(
        "nranks",
        args.next()
            .or_else(|| std::env::var("OMPI_COMM_WORLD_SIZE").ok()),
    )?;

    let mut bootstrap = TcpBootstrap::new(rank, nranks).map_err(|e| e.to_string())?;
    bootstrap
        .initialize_with_addr(&addr, Duration::from_secs(30))
        .map_err(|e| e.to_string())?;

    let all = bootstrap
        .all_gather(&(rank as u32).to_le_bytes())
        .map_err(|e| e.to_string())?;
    let ranks: Vec<u32> = all
        .iter()
        .map(|b| <[u8; 4]>::try_from(b.as_slice()).map(u32::from_le_bytes))
        .collect::<Result<_, _>>()
        .map_err(|_| "a peer sent a rank that is not 4 bytes".to_string())?;
    bootstrap.barrier().map_err(|e| e.to_string())?;
    println!(
        "rank {rank}/{nranks} ({} on this node): gathered ranks {ranks:?}",
        bootstrap.nranks_per_node()
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("01-bootstrap: {e}");
        std::process::exit(1);
    }
}
