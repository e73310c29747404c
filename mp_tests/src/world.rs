//! The multi-rank world of `mp_unit_tests`: the bootstrap every test shares, and the
//! framework's `World` seam implemented over it (verdicts are exchanged after each test, with
//! the peers' liveness deciding how long to wait), and where each rank's GPU is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use mscclpp::bootstrap::Bootstrap;
use mscclpp_framework::{combine_verdicts, Verdict, World};

use crate::launcher::Placement;
use crate::liveness::Liveness;

/// What every test of this binary can reach.
pub struct MpEnv {
    pub placement: Placement,
    pub bootstrap: Arc<dyn Bootstrap>,
    /// The rendezvous address the ranks met at (`--ip_port`).
    pub ip_port: String,
    pub ib_gid_index: Option<u32>,
    /// Default timeout for blocking operations in tests.
    pub timeout: Duration,
    /// Which peers are alive, for the framework's own waits.
    pub liveness: Liveness,
}

/// Tags of the framework's exchanges (offset by the liveness module).
const EXCHANGE_VERDICT: u64 = 1;
const EXCHANGE_DONE: u64 = 2;

/// Set once a verdict exchange failed: the world is lost and nobody waits for it again.
static WORLD_LOST: AtomicBool = AtomicBool::new(false);

/// The last wait of a run: every rank says it is done and waits for the others' word while
/// they are alive, so no rank tears its sockets down under a peer still finishing. Skipped
/// (an error at once) when a verdict exchange already lost the world.
pub fn leave_together() -> Result<(), String> {
    let env = mp_env();
    if WORLD_LOST.load(Ordering::Relaxed) {
        env.liveness.stop();
        return Err("not waiting for the other ranks: contact was lost during the run".into());
    }
    let r = env.liveness.exchange(EXCHANGE_DONE, &[]).map(|_| ());
    env.liveness.stop();
    r
}

static MP_ENV: OnceLock<MpEnv> = OnceLock::new();

/// Installs the environment; called once by `main` before the tests run.
pub fn install(env: MpEnv) -> Result<(), String> {
    MP_ENV
        .set(env)
        .map_err(|_| "the multi-process environment was installed twice".to_string())
}

/// The environment of this rank. Tests run only after `install`.
pub fn mp_env() -> &'static MpEnv {
    MP_ENV
        .get()
        .expect("mp_env() called before main installed the environment")
}

/// The framework's world: verdicts travel through the shared bootstrap.
pub struct BootstrapWorld;

impl World for BootstrapWorld {
    fn rank(&self) -> usize {
        mp_env().placement.rank
    }
    fn size(&self) -> usize {
        mp_env().placement.size
    }
    fn combine(&self, local: &Verdict) -> Result<Verdict, String> {
        let all = mp_env()
            .liveness
            .exchange(EXCHANGE_VERDICT, &local.to_bytes())
            .map_err(|e| {
                WORLD_LOST.store(true, Ordering::Relaxed);
                format!("exchanging test verdicts: {e}")
            })?;
        let verdicts = all
            .iter()
            .enumerate()
            .map(|(r, b)| Verdict::from_bytes(b).map_err(|e| format!("verdict from rank {r}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(combine_verdicts(&verdicts))
    }
}

/// The GPU ordinal of the rank with `local_rank` on a host with `gpus` visible GPUs:
/// `local_rank % gpus`, so several ranks share a GPU when there are fewer GPUs than local
/// ranks (two processes on one GPU is how one-GPU users try the library). `None` without GPUs.
pub fn gpu_ordinal(local_rank: usize, gpus: usize) -> Option<usize> {
    (gpus > 0).then(|| local_rank % gpus)
}

/// This rank's GPU on a GPU build (`local_rank % visible GPUs`), or why there is none.
pub fn rank_gpu() -> Result<mscclpp::Device, String> {
    let n = visible_gpus()?;
    let ordinal = gpu_ordinal(mp_env().placement.local_rank, n)
        .ok_or_else(|| "no GPU visible".to_string())?;
    i32::try_from(ordinal)
        .map(mscclpp::Device::gpu)
        .map_err(|_| format!("GPU ordinal {ordinal} does not fit an i32"))
}

/// GPUs this rank can use on a GPU build, or why a GPU test must skip: none visible, or no
/// driver at all (a CUDA/ROCm binary on a machine without GPUs).
pub fn visible_gpus() -> Result<usize, String> {
    use mscclpp_hal::prelude::*;
    match mscclpp_hal::Gpu::device_count() {
        Ok(0) => Err("no GPU visible".to_string()),
        Ok(n) => Ok(n),
        Err(e @ mscclpp_hal::Error::NoDriver { .. }) => Err(format!("no GPU driver: {e}")),
        Err(e) => Err(format!("counting GPUs failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::gpu_ordinal;

    #[test]
    fn ranks_share_gpus_round_robin() {
        // Two ranks on one GPU both get GPU 0 (rank 1 used to get the CPU).
        assert_eq!(gpu_ordinal(0, 1), Some(0));
        assert_eq!(gpu_ordinal(1, 1), Some(0));
        // Four ranks on two GPUs: 0, 1, 0, 1.
        let on_two: Vec<_> = (0..4).map(|r| gpu_ordinal(r, 2)).collect();
        assert_eq!(on_two, vec![Some(0), Some(1), Some(0), Some(1)]);
        // One GPU per rank: the identity.
        assert_eq!(gpu_ordinal(7, 8), Some(7));
        assert_eq!(gpu_ordinal(3, 0), None);
    }
}
