//! NVLS (NVLink multicast) capability query, with the environment switches checked first.
//!
//! Nothing in this crate ever creates a multicast object; this only reports capability.

use crate::prelude::*;
use crate::Gpu;

/// True when `MSCCLPP_FORCE_DISABLE_NVLS` is `1`/`true`/`yes` or `NCCL_NVLS_ENABLE` is `0`.
pub fn nvls_disabled_by_env() -> bool {
    disabled_by(|name| std::env::var(name).ok())
}

fn disabled_by(lookup: impl Fn(&str) -> Option<String>) -> bool {
    let force = lookup("MSCCLPP_FORCE_DISABLE_NVLS")
        .map(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
        .unwrap_or(false);
    let nccl_off = lookup("NCCL_NVLS_ENABLE")
        .map(|v| v.trim() == "0")
        .unwrap_or(false);
    force || nccl_off
}

/// Whether NVLS may be used: false when disabled by the environment (checked before any driver
/// call), else the multicast attribute of device 0 of the build's GPU backend (false on any
/// error, and always on the host backend).
pub fn nvls_supported() -> bool {
    if nvls_disabled_by_env() {
        return false;
    }
    match Gpu::device_count() {
        Ok(n) if n > 0 => {}
        _ => return false,
    }
    Gpu::open_device(0)
        .and_then(|d| Gpu::multicast_supported(&d))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::disabled_by;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn env_switches() {
        assert!(!disabled_by(env(&[])));
        assert!(disabled_by(env(&[("MSCCLPP_FORCE_DISABLE_NVLS", "1")])));
        assert!(disabled_by(env(&[("MSCCLPP_FORCE_DISABLE_NVLS", "TRUE")])));
        assert!(!disabled_by(env(&[("MSCCLPP_FORCE_DISABLE_NVLS", "0")])));
        assert!(disabled_by(env(&[("NCCL_NVLS_ENABLE", "0")])));
        assert!(!disabled_by(env(&[("NCCL_NVLS_ENABLE", "1")])));
        assert!(disabled_by(env(&[
            ("NCCL_NVLS_ENABLE", "1"),
            ("MSCCLPP_FORCE_DISABLE_NVLS", "1")
        ])));
    }

    #[test]
    fn host_build_never_reports_nvls() {
        if cfg!(hal_gpu_host) {
            assert!(!super::nvls_supported());
        }
    }
}
