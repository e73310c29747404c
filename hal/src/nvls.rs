//! NVLS (NVLink multicast) capability query, with the environment switches ([`crate::env`])
//! checked first.
//!
//! Nothing in this crate ever creates a multicast object; this only reports capability.

use crate::prelude::*;
use crate::Gpu;

/// True when the environment disables NVLS ([`crate::env::parse_nvls_switches`]), also when a
/// switch is malformed: then the reason is logged once (warning) and NVLS stays off.
pub fn nvls_disabled_by_env() -> bool {
    fail_closed(crate::env::nvls_switches())
}

fn fail_closed(switches: Result<bool, String>) -> bool {
    match switches {
        Ok(disabled) => disabled,
        Err(msg) => {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| log::warn!("{msg}"));
            true
        }
    }
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
    use crate::env::parse_nvls_switches;

    fn disabled_by(lookup: impl Fn(&str) -> Option<String>) -> bool {
        super::fail_closed(parse_nvls_switches(lookup))
    }

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
        assert!(!disabled_by(env(&[(
            "MSCCLPP_FORCE_DISABLE_NVLS",
            " off "
        )])));
        assert!(!disabled_by(env(&[("MSCCLPP_FORCE_DISABLE_NVLS", "")])));
    }

    #[test]
    fn malformed_switches_fail_closed() {
        // The safety switch must never read an unknown value as "not disabled".
        for (var, value) in [
            ("MSCCLPP_FORCE_DISABLE_NVLS", "maybe"),
            ("MSCCLPP_FORCE_DISABLE_NVLS", "2"),
            ("MSCCLPP_FORCE_DISABLE_NVLS", "disable"),
            ("NCCL_NVLS_ENABLE", "off"),
        ] {
            assert!(disabled_by(env(&[(var, value)])), "{var}={value}");
            let e = parse_nvls_switches(env(&[(var, value)])).unwrap_err();
            assert!(e.starts_with(&format!("{var}={value}: expected")), "{e}");
            assert!(e.ends_with("NVLS stays disabled"), "{e}");
        }
        // A malformed value is an error even when the other switch disables NVLS anyway.
        assert!(parse_nvls_switches(env(&[
            ("MSCCLPP_FORCE_DISABLE_NVLS", "maybe"),
            ("NCCL_NVLS_ENABLE", "0")
        ]))
        .is_err());
    }

    #[test]
    fn host_build_never_reports_nvls() {
        if cfg!(hal_gpu_host) {
            assert!(!super::nvls_supported());
        }
    }
}
