//! The job key of `ip:port` mode: what tells the ranks of one job from those of another job
//! pointed at the same address (a `UniqueId` carries a random nonce instead).
//!
//! The first of these that is set is the key, and its hash travels in every hello:
//! 1. [`TcpBootstrap::set_job_key`](super::TcpBootstrap::set_job_key) (the application's own);
//! 2. `MSCCLPP_BOOTSTRAP_KEY` (any string, the same on every rank);
//! 3. the launcher's job id: `PMIX_NAMESPACE` (Open MPI 4/5, PMIx launchers),
//!    `OMPI_MCA_ess_base_jobid` (Open MPI 4), `SLURM_JOB_ID` with `SLURM_STEP_ID` (srun),
//!    `TORCHELASTIC_RUN_ID` (torchrun).
//!
//! With none of them, the key is empty (hash 0): every such rank at the address is accepted,
//! as before keys existed. Ranks whose keys differ are refused by the root with an error
//! naming `MSCCLPP_BOOTSTRAP_KEY`; set it to one value on every rank to join ranks that come
//! from different launchers. The key guards against mistakes (two jobs, one port), not against
//! an attacker who can read the job's environment.

use crate::identity::fnv1a;

/// A job key's hash (never 0 for a set key) and where it came from (a variable's name, never
/// its value: the root quotes it to ranks it refuses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct JobKey {
    pub(super) hash: u64,
    pub(super) source: String,
}

const SEED: u64 = 0x6a6f_625f_6b65_7921; // "job_key!"

fn hash_of(value: &str) -> u64 {
    match fnv1a(value.as_bytes(), SEED) {
        0 => 1,
        h => h,
    }
}

impl JobKey {
    fn from(source: String, value: &str) -> JobKey {
        JobKey {
            hash: hash_of(value),
            source,
        }
    }

    /// The key for an application's own `key`.
    pub(super) fn explicit(key: &str) -> JobKey {
        JobKey::from("set_job_key".into(), key)
    }

    /// The key from this process's environment (`lookup` reads a variable; the
    /// `MSCCLPP_BOOTSTRAP_KEY` value comes in as `mscclpp_key`, read once by `crate::env`).
    pub(super) fn from_env(
        mscclpp_key: Option<&str>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> JobKey {
        if let Some(k) = mscclpp_key {
            return JobKey::from("MSCCLPP_BOOTSTRAP_KEY".into(), k);
        }
        let get = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        for var in ["PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"] {
            if let Some(v) = get(var) {
                return JobKey::from(var.into(), &format!("{var}={v}"));
            }
        }
        if let Some(job) = get("SLURM_JOB_ID") {
            let step = get("SLURM_STEP_ID").unwrap_or_default();
            let v = format!("SLURM_JOB_ID={job}.{step}");
            return JobKey::from("SLURM_JOB_ID and SLURM_STEP_ID".into(), &v);
        }
        if let Some(v) = get("TORCHELASTIC_RUN_ID") {
            let v = format!("TORCHELASTIC_RUN_ID={v}");
            return JobKey::from("TORCHELASTIC_RUN_ID".into(), &v);
        }
        JobKey {
            hash: 0,
            source: "none (no MSCCLPP_BOOTSTRAP_KEY, no launcher job id)".into(),
        }
    }

    /// This process's key.
    pub(super) fn of_process() -> JobKey {
        let env = crate::env::env();
        JobKey::from_env(env.bootstrap_key(), |k| {
            env.launcher_var(k).map(str::to_string)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn key_sources_in_order() {
        let none = JobKey::from_env(None, env(&[]));
        assert_eq!(none.hash, 0);
        let ompi = JobKey::from_env(None, env(&[("PMIX_NAMESPACE", "583663617")]));
        assert_ne!(ompi.hash, 0);
        assert!(ompi.source.contains("PMIX_NAMESPACE"), "{}", ompi.source);
        let other_job = JobKey::from_env(None, env(&[("PMIX_NAMESPACE", "583663618")]));
        assert_ne!(ompi.hash, other_job.hash);
        let slurm = env(&[("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "0")]);
        let step1 = env(&[("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "1")]);
        assert_ne!(
            JobKey::from_env(None, slurm).hash,
            JobKey::from_env(None, step1).hash
        );
        // The explicit variable wins over the launcher, and equals the same explicit key.
        let mine = JobKey::from_env(Some("k"), env(&[("PMIX_NAMESPACE", "1")]));
        assert_eq!(mine.source, "MSCCLPP_BOOTSTRAP_KEY");
        assert_eq!(mine.hash, JobKey::explicit("k").hash);
        assert_ne!(mine.hash, JobKey::explicit("j").hash);
        let torch = JobKey::from_env(None, env(&[("TORCHELASTIC_RUN_ID", "r")]));
        assert!(torch.source.starts_with("TORCHELASTIC_RUN_ID"));
        assert_eq!(
            JobKey::from_env(None, env(&[("PMIX_NAMESPACE", " ")])).hash,
            0
        );
    }
}
