//! What the integration tests that run `mp_unit_tests` share.

use std::process::{Command, Output};

/// The `mp_unit_tests` binary of this build.
pub const BIN: &str = env!("CARGO_BIN_EXE_mp_unit_tests");

/// The variables by which a launcher (mpirun, a PMI launcher, srun, torchrun) gives a process
/// its rank and world size.
pub const LAUNCHER_VARS: [&str; 8] = [
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "RANK",
    "WORLD_SIZE",
];

/// Runs `cmd` with `envs` set, after removing `remove` from what it inherits (the test
/// harness itself may run under a launcher); returns its output.
pub fn output_without(mut cmd: Command, remove: &[&str], envs: &[(&str, &str)]) -> Output {
    for v in remove {
        cmd.env_remove(v);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("spawning mp_unit_tests")
}
