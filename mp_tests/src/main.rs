//! `mp_unit_tests`: the multi-process test binary. Run it under mpirun, srun or torchrun,
//! or let it start its own ranks with `--np N`.

pub mod coll_data;
mod launcher;
mod liveness;
mod spawn;
mod suites;
mod world;

use std::sync::Arc;

use mscclpp::bootstrap::{Bootstrap, TcpBootstrap};

const USAGE: &str = "mp_unit_tests options (besides the framework's):
  --ip_port=IP:PORT     rendezvous address of rank 0 (default 127.0.0.1:29053, below the
                        ephemeral port range);
                        IFNAME:IP:PORT picks the interface
  --np=N                start N local ranks of this binary (no mpirun needed)
  --ib_gid_index=N      GID index for the IB tests
  --timeout=SECONDS     timeout of setup and of each blocking test step, 1 to 86400
                        (default 60); a rank silent that long is reported lost
Ranks come from Open MPI, MPICH/Hydra (PMI_*), Slurm or torchrun variables.";

fn real_main() -> i32 {
    let opts = match launcher::options_of_this_process("mp_unit_tests", USAGE) {
        Ok(o) => o,
        Err(status) => return status,
    };
    // The framework's arguments and the test selection are checked before anything starts
    // (ranks, a bootstrap): a typo is exit 2 at once, never a run that reads as success.
    if let Err(e) = mscclpp_framework::checked_selection(&opts.rest) {
        eprintln!("mp_unit_tests: {e}\n{USAGE}\n{}", mscclpp_framework::USAGE);
        return 2;
    }
    let info_only = opts.rest.iter().any(|a| a == "--list" || a == "--help");
    let placement = match launcher::placement_of_this_process("mp_unit_tests") {
        Ok(p) => p,
        Err(status) => return status,
    };
    if opts.rest.iter().any(|a| a == "--help") && placement.as_ref().is_none_or(|p| p.rank == 0) {
        println!("{USAGE}\n");
    }
    if info_only {
        // Listing needs no bootstrap; under a launcher only rank 0 answers.
        if placement.as_ref().is_some_and(|p| p.rank != 0) {
            return 0;
        }
        return mscclpp_framework::run(&opts.rest, &mscclpp_framework::SingleProcessWorld, vec![]);
    }
    let placement = match (placement, opts.np) {
        (None, Some(np)) => {
            let grace = std::time::Duration::from_secs(10);
            return match spawn::self_launch(np, &opts, grace) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("mp_unit_tests: {e}");
                    1
                }
            };
        }
        (Some(p), Some(np)) if p.size != np => {
            eprintln!(
                "mp_unit_tests: --np={np} disagrees with the {} world size {}",
                p.source, p.size
            );
            return 2;
        }
        (Some(p), _) => p,
        (None, None) => launcher::Placement::single_process(),
    };
    let ip_port = match (&opts.ip_port, placement.size) {
        (Some(a), _) => a.clone(),
        // A lone rank needs no well-known port; don't collide with a concurrent run.
        (None, 1) => match launcher::free_loopback_port() {
            Ok(p) => format!("127.0.0.1:{p}"),
            Err(e) => {
                eprintln!("mp_unit_tests: {e}");
                return 1;
            }
        },
        (None, _) => launcher::default_ip_port(),
    };
    let bootstrap = match TcpBootstrap::new(placement.rank, placement.size).and_then(|mut b| {
        b.initialize_with_addr(&ip_port, opts.timeout)?;
        Ok(b)
    }) {
        Ok(b) => Arc::new(b),
        Err(e) => {
            eprintln!(
                "mp_unit_tests: rank {} of {}: bootstrap at {} failed: {e}",
                placement.rank, placement.size, ip_port
            );
            return 1;
        }
    };
    let liveness = match liveness::Liveness::start(bootstrap.clone(), opts.timeout) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mp_unit_tests: rank {}: {e}", placement.rank);
            return 1;
        }
    };
    let env = world::MpEnv {
        placement,
        bootstrap: bootstrap.clone() as Arc<dyn Bootstrap>,
        ip_port,
        ib_gid_index: opts.ib_gid_index,
        timeout: opts.timeout,
        liveness,
    };
    if let Err(e) = world::install(env) {
        eprintln!("mp_unit_tests: {e}");
        return 1;
    }
    let code = mscclpp_framework::run(&opts.rest, &world::BootstrapWorld, vec![]);
    // Leave together so no rank tears its sockets down under a peer still finishing.
    if let Err(e) = world::leave_together() {
        eprintln!("mp_unit_tests: rank {}: leaving: {e}", bootstrap.rank());
        return code.max(1);
    }
    code
}

fn main() {
    std::process::exit(real_main());
}
