//! NVLS (NVLink multicast) capability query, with the environment switches checked first.
//!
//! Nothing in this crate ever creates a multicast object; this only reports capability.

use crate::prelude::*;
use crate::Gpu;

/// The one parser of the NVLS switches (core's `Env` uses it too): `Ok(true)` when
/// `MSCCLPP_FORCE_DISABLE_NVLS` is `1`/`true`/`yes`/`on` or `NCCL_NVLS_ENABLE` is `0`,
/// `Ok(false)` when neither disables it (unset, empty, `0`/`false`/`no`/`off`, another
/// integer for `NCCL_NVLS_ENABLE`), and `Err` naming the variable, the value and what was
/// expected for anything else. A malformed switch is a safety switch nobody can read:
/// every caller treats `Err` as disabled (fail closed).
pub fn parse_nvls_switches(lookup: impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    let mut errors = Vec::new();
    let force = match lookup("MSCCLPP_FORCE_DISABLE_NVLS") {
        None => false,
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "" | "0" | "false" | "no" | "off" => false,
            "1" | "true" | "yes" | "on" => true,
            _ => {
                errors.push(format!(
                    "MSCCLPP_FORCE_DISABLE_NVLS={v}: expected a boolean (1, 0, true, false, yes, \
                     no, on, off)"
                ));
                true
            }
        },
    };
    let nccl_off = match lookup("NCCL_NVLS_ENABLE") {
        None => false,
        Some(v) if v.trim().is_empty() => false,
        Some(v) => match v.trim().parse::<i64>() {
            Ok(n) => n == 0,
            Err(_) => {
                errors.push(format!(
                    "NCCL_NVLS_ENABLE={v}: expected an integer (0 disables NVLS)"
                ));
                true
            }
        },
    };
    if errors.is_empty() {
        Ok(force || nccl_off)
    } else {
        Err(format!("{}; NVLS stays disabled", errors.join("; ")))
    }
}

/// True when the environment disables NVLS ([`parse_nvls_switches`]), also when a switch is
/// malformed: then the reason is printed once and NVLS stays off.
pub fn nvls_disabled_by_env() -> bool {
    disabled_by(|name| std::env::var(name).ok())
}

fn disabled_by(lookup: impl Fn(&str) -> Option<String>) -> bool {
    match parse_nvls_switches(lookup) {
        Ok(disabled) => disabled,
        Err(msg) => {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| eprintln!("mscclpp-hal: {msg}"));
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
            let e = super::parse_nvls_switches(env(&[(var, value)])).unwrap_err();
            assert!(e.starts_with(&format!("{var}={value}: expected")), "{e}");
            assert!(e.ends_with("NVLS stays disabled"), "{e}");
        }
        // A malformed value is an error even when the other switch disables NVLS anyway.
        assert!(super::parse_nvls_switches(env(&[
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
