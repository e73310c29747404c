//! The environment variables the HAL reads: one parser each, listed in [`VARS`] with its
//! default and documentation.
//!
//! Each variable has a pure parser (`parse_*`, given the value or `None` when unset; core's
//! `Env` calls the same parsers for the variables it reports) and a reader that applies it to
//! this process's environment at the moment of the call, as the HAL always read them: the
//! loaders read their library paths per load, the NVLS switches are checked per gate, the host
//! id is read once by [`crate::auxil::fdpass::host_id`]. Nothing else in the crate calls
//! `std::env`.

use std::ffi::OsString;
use std::path::PathBuf;

/// `MSCCLPP_IBV_SO`: the libibverbs to load instead of the system one.
pub const IBV_SO: &str = "MSCCLPP_IBV_SO";
/// `MSCCLPP_MLX5_SO`: the libmlx5 (mlx5dv) to load.
pub const MLX5_SO: &str = "MSCCLPP_MLX5_SO";
/// `MSCCLPP_GDRCOPY_SO`: the GDRCopy library to load.
pub const GDRCOPY_SO: &str = "MSCCLPP_GDRCOPY_SO";
/// `MSCCLPP_FORCE_DISABLE_GDR`: turns GDRCopy off.
pub const FORCE_DISABLE_GDR: &str = "MSCCLPP_FORCE_DISABLE_GDR";
/// `MSCCLPP_HOSTID`: mixed into the host id.
pub const HOSTID: &str = "MSCCLPP_HOSTID";
/// `MSCCLPP_FORCE_DISABLE_NVLS`: turns NVLS (multicast) off.
pub const FORCE_DISABLE_NVLS: &str = "MSCCLPP_FORCE_DISABLE_NVLS";
/// `NCCL_NVLS_ENABLE`: NCCL's switch, honoured too (`0` turns NVLS off).
pub const NCCL_NVLS_ENABLE: &str = "NCCL_NVLS_ENABLE";
/// `MSCCLPP_NVRTC_SO`: the libnvrtc to load (run-time compilation, CUDA).
pub const NVRTC_SO: &str = "MSCCLPP_NVRTC_SO";
/// `MSCCLPP_CUDA_INCLUDE`: the CUDA include folder run-time compilation uses.
pub const CUDA_INCLUDE: &str = "MSCCLPP_CUDA_INCLUDE";
/// `MSCCLPP_RTC_CACHE`: where run-time compiled code is kept.
pub const RTC_CACHE: &str = "MSCCLPP_RTC_CACHE";
/// Most MiB of compiled code `MSCCLPP_RTC_CACHE`'s folder keeps.
pub const RTC_CACHE_MAX_MB: &str = "MSCCLPP_RTC_CACHE_MAX_MB";
/// [`RTC_CACHE_MAX_MB`]'s default: a few hundred plan kernels of 100-500 KiB each.
pub const RTC_CACHE_MAX_MB_DEFAULT: u64 = 256;

/// One environment variable: its name, its default and what it does.
#[derive(Debug, Clone, Copy)]
pub struct Var {
    /// The variable's name.
    pub name: &'static str,
    /// What holds when it is unset.
    pub default: &'static str,
    /// What it does and which values it takes.
    pub doc: &'static str,
}

/// Every variable the HAL reads.
pub const VARS: &[Var] = &[
    Var {
        name: IBV_SO,
        default: "libibverbs.so, then libibverbs.so.1",
        doc: "path of the libibverbs to load (and only it); also where mlx5dv is looked for \
              when MSCCLPP_MLX5_SO is unset",
    },
    Var {
        name: MLX5_SO,
        default:
            "libmlx5.so.1, then libmlx5.so, only beside the system verbs (MSCCLPP_IBV_SO unset)",
        doc: "path of the libmlx5 (mlx5dv: Data Direct registration) to load",
    },
    Var {
        name: GDRCOPY_SO,
        default: "libgdrapi.so, then libgdrapi.so.2",
        doc: "path of the GDRCopy library to load (and only it)",
    },
    Var {
        name: FORCE_DISABLE_GDR,
        default: "0",
        doc: "boolean (1, 0, true, false, yes, no, on, off): turns GDRCopy off; a malformed \
              value keeps it off",
    },
    Var {
        name: HOSTID,
        default: "the hostname and boot id",
        doc: "any string, mixed into the host id to tell apart hosts with one hostname",
    },
    Var {
        name: FORCE_DISABLE_NVLS,
        default: "0",
        doc: "boolean (1, 0, true, false, yes, no, on, off): turns NVLS off before any \
              driver call; a malformed value keeps it off",
    },
    Var {
        name: NCCL_NVLS_ENABLE,
        default: "unset (NVLS allowed)",
        doc: "integer; 0 turns NVLS off like MSCCLPP_FORCE_DISABLE_NVLS",
    },
    Var {
        name: NVRTC_SO,
        default: "libnvrtc.so.13 / libnvrtc.so by the loader, then lib64/ and lib/ of $CUDA_HOME, \
                  $CUDA_PATH, /usr/local/cuda",
        doc: "path of the libnvrtc to load (and only it): CUDA run-time compilation of execution \
              plans (MSCCLPP_EXECUTOR_JIT)",
    },
    Var {
        name: CUDA_INCLUDE,
        default: "include/ of $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, then beside libnvrtc",
        doc: "folder with the CUDA headers (cuda_fp16.h; libcu++ in it or its cccl/) that \
              run-time compiled sources include",
    },
    Var {
        name: RTC_CACHE,
        default: "$XDG_CACHE_HOME/mscclpp/rtc, else ~/.cache/mscclpp/rtc",
        doc: "folder where run-time compiled code is kept by a hash of its inputs; 0 or off: \
              not kept",
    },
    Var {
        name: RTC_CACHE_MAX_MB,
        default: "256",
        doc: "integer, MiB: after each new entry, the code objects of MSCCLPP_RTC_CACHE used \
              longest ago are removed until the rest fit; a malformed value is warned about and \
              the default used",
    },
];

fn read(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

fn read_string(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The one parser of a boolean switch `name` with value `value` (`None`: unset): unset, empty,
/// `0`/`false`/`no`/`off` are false, `1`/`true`/`yes`/`on` true (any case, surrounding spaces
/// ignored); anything else is an error naming the variable, the value and what was expected.
pub fn parse_bool(name: &str, value: Option<&str>) -> Result<bool, String> {
    let Some(v) = value else { return Ok(false) };
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "no" | "off" => Ok(false),
        "1" | "true" | "yes" | "on" => Ok(true),
        _ => Err(format!(
            "{name}={v}: expected a boolean (1, 0, true, false, yes, no, on, off)"
        )),
    }
}

/// The parser of a library path variable: `None` when unset or blank, else the path (spaces
/// around a UTF-8 value removed).
pub fn parse_library_path(value: Option<OsString>) -> Option<PathBuf> {
    let v = value?;
    let v = match v.into_string() {
        Ok(s) => OsString::from(s.trim()),
        Err(raw) => raw,
    };
    (!v.is_empty()).then(|| PathBuf::from(v))
}

/// `MSCCLPP_IBV_SO` now ([`parse_library_path`]).
pub fn ibv_so() -> Option<PathBuf> {
    parse_library_path(read(IBV_SO))
}

/// `MSCCLPP_MLX5_SO` now ([`parse_library_path`]).
pub fn mlx5_so() -> Option<PathBuf> {
    parse_library_path(read(MLX5_SO))
}

/// `MSCCLPP_GDRCOPY_SO` now ([`parse_library_path`]).
pub fn gdrcopy_so() -> Option<PathBuf> {
    parse_library_path(read(GDRCOPY_SO))
}

/// `MSCCLPP_FORCE_DISABLE_GDR` now ([`parse_bool`]).
pub fn force_disable_gdr() -> Result<bool, String> {
    parse_bool(FORCE_DISABLE_GDR, read_string(FORCE_DISABLE_GDR).as_deref())
}

/// `MSCCLPP_NVRTC_SO` now ([`parse_library_path`]).
pub fn nvrtc_so() -> Option<PathBuf> {
    parse_library_path(read(NVRTC_SO))
}

/// `MSCCLPP_CUDA_INCLUDE` now ([`parse_library_path`]: a folder, same rules).
pub fn cuda_include() -> Option<PathBuf> {
    parse_library_path(read(CUDA_INCLUDE))
}

/// The CUDA toolkit folders to look in, in order: `$CUDA_HOME`, `$CUDA_PATH` (those set and not
/// blank), `/usr/local/cuda`.
pub fn cuda_roots() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|k| parse_library_path(read(k)))
        .collect();
    v.push("/usr/local/cuda".into());
    v
}

/// The parser of `MSCCLPP_RTC_CACHE` (`value`), with `XDG_CACHE_HOME` and `HOME` for the
/// default: `None` for `0` or `off` (any case), the value's folder when set, else
/// `$XDG_CACHE_HOME/mscclpp/rtc`, else `$HOME/.cache/mscclpp/rtc`, else `None`.
pub fn parse_rtc_cache(
    value: Option<OsString>,
    xdg_cache_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    match parse_library_path(value) {
        Some(p) if p.as_os_str() == "0" || p.as_os_str().eq_ignore_ascii_case("off") => None,
        Some(p) => Some(p),
        None => parse_library_path(xdg_cache_home)
            .or_else(|| parse_library_path(home).map(|h| h.join(".cache")))
            .map(|c| c.join("mscclpp").join("rtc")),
    }
}

/// The parser of `MSCCLPP_RTC_CACHE_MAX_MB` (`value`): the bound in bytes; unset or blank:
/// [`RTC_CACHE_MAX_MB_DEFAULT`]; anything but a whole number of MiB: an error naming what was
/// expected.
pub fn parse_rtc_cache_max(value: Option<&str>) -> Result<u64, String> {
    let mb = match value.map(str::trim) {
        None | Some("") => RTC_CACHE_MAX_MB_DEFAULT,
        Some(v) => v.parse::<u64>().map_err(|_| {
            format!("{RTC_CACHE_MAX_MB}={v:?}: expected a whole number of MiB (e.g. 256)")
        })?,
    };
    Ok(mb.saturating_mul(1 << 20))
}

/// `MSCCLPP_RTC_CACHE_MAX_MB` now in bytes ([`parse_rtc_cache_max`]); a malformed value is
/// warned about (once) and the default used.
pub fn rtc_cache_max_bytes() -> u64 {
    parse_rtc_cache_max(read_string(RTC_CACHE_MAX_MB).as_deref()).unwrap_or_else(|e| {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| log::warn!("{e}; using {RTC_CACHE_MAX_MB_DEFAULT} MiB"));
        RTC_CACHE_MAX_MB_DEFAULT << 20
    })
}

/// `MSCCLPP_RTC_CACHE` now ([`parse_rtc_cache`]).
pub fn rtc_cache() -> Option<PathBuf> {
    parse_rtc_cache(read(RTC_CACHE), read("XDG_CACHE_HOME"), read("HOME"))
}

/// The parser of `MSCCLPP_HOSTID`: `None` when unset or blank, else the value trimmed.
pub fn parse_hostid(value: Option<String>) -> Option<String> {
    value.and_then(|v| {
        let t = v.trim();
        (!t.is_empty()).then(|| t.to_string())
    })
}

/// `MSCCLPP_HOSTID` now ([`parse_hostid`]).
pub fn hostid() -> Option<String> {
    parse_hostid(read_string(HOSTID))
}

/// The one parser of the NVLS switches (core's `Env` uses it too): `Ok(true)` when
/// `MSCCLPP_FORCE_DISABLE_NVLS` is `1`/`true`/`yes`/`on` or `NCCL_NVLS_ENABLE` is `0`,
/// `Ok(false)` when neither disables it (unset, empty, `0`/`false`/`no`/`off`, another
/// integer for `NCCL_NVLS_ENABLE`), and `Err` naming the variable, the value and what was
/// expected for anything else. A malformed switch is a safety switch nobody can read:
/// every caller treats `Err` as disabled (fail closed).
pub fn parse_nvls_switches(lookup: impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    let mut errors = Vec::new();
    let force = match parse_bool(FORCE_DISABLE_NVLS, lookup(FORCE_DISABLE_NVLS).as_deref()) {
        Ok(b) => b,
        Err(e) => {
            errors.push(e);
            true
        }
    };
    let nccl_off = match lookup(NCCL_NVLS_ENABLE) {
        None => false,
        Some(v) if v.trim().is_empty() => false,
        Some(v) => match v.trim().parse::<i64>() {
            Ok(n) => n == 0,
            Err(_) => {
                errors.push(format!(
                    "{NCCL_NVLS_ENABLE}={v}: expected an integer (0 disables NVLS)"
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

/// The NVLS switches now ([`parse_nvls_switches`]).
pub fn nvls_switches() -> Result<bool, String> {
    parse_nvls_switches(read_string)
}

/// Markers a test sets on a child process it re-executes (the child's role; test-only).
#[cfg(test)]
pub(crate) mod test_child {
    /// The fd-passing test's child: `pid:id` of the parent's registration to fetch.
    pub(crate) const FDPASS_TARGET: &str = "MSCCLPP_FDPASS_TEST_TARGET";
    /// The multicast gate test's child: set when this process is that child.
    #[cfg(hal_cuda)]
    pub(crate) const NVLS_GATE: &str = "MSCCLPP_HAL_NVLS_GATE_CHILD";

    /// The value of marker `name` in this process.
    pub(crate) fn marker(name: &str) -> Option<String> {
        super::read_string(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans() {
        assert_eq!(parse_bool("X", None), Ok(false));
        for v in ["", " 0", "false", "No", "OFF"] {
            assert_eq!(parse_bool("X", Some(v)), Ok(false), "{v}");
        }
        for v in ["1", "true", "YES", " on "] {
            assert_eq!(parse_bool("X", Some(v)), Ok(true), "{v}");
        }
        let e = parse_bool("X", Some("maybe")).unwrap_err();
        assert!(e.starts_with("X=maybe: expected a boolean"), "{e}");
    }

    #[test]
    fn library_paths() {
        assert_eq!(parse_library_path(None), None);
        assert_eq!(parse_library_path(Some(" ".into())), None);
        assert_eq!(
            parse_library_path(Some(" /opt/libibverbs.so ".into())),
            Some(PathBuf::from("/opt/libibverbs.so"))
        );
    }

    #[test]
    fn hostids() {
        assert_eq!(parse_hostid(None), None);
        assert_eq!(parse_hostid(Some("  ".into())), None);
        assert_eq!(parse_hostid(Some(" node7 ".into())), Some("node7".into()));
    }

    #[test]
    fn every_variable_is_listed_once() {
        let mut names: Vec<_> = VARS.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), VARS.len());
        assert!(VARS
            .iter()
            .all(|v| !v.doc.is_empty() && !v.default.is_empty()));
    }

    #[test]
    fn rtc_cache_folder() {
        let os = |s: &str| Some(OsString::from(s));
        assert_eq!(parse_rtc_cache(os("0"), os("/x"), os("/h")), None);
        assert_eq!(parse_rtc_cache(os(" OFF "), None, os("/h")), None);
        assert_eq!(
            parse_rtc_cache(os("/c"), os("/x"), os("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            parse_rtc_cache(None, os("/x"), os("/h")),
            Some(PathBuf::from("/x/mscclpp/rtc"))
        );
        assert_eq!(
            parse_rtc_cache(os(""), os(" "), os("/h")),
            Some(PathBuf::from("/h/.cache/mscclpp/rtc"))
        );
        assert_eq!(parse_rtc_cache(None, None, None), None);
    }

    #[test]
    fn rtc_cache_bound() {
        let mib = 1u64 << 20;
        assert_eq!(
            parse_rtc_cache_max(None),
            Ok(RTC_CACHE_MAX_MB_DEFAULT * mib)
        );
        assert_eq!(
            parse_rtc_cache_max(Some(" ")),
            Ok(RTC_CACHE_MAX_MB_DEFAULT * mib)
        );
        assert_eq!(parse_rtc_cache_max(Some(" 64 ")), Ok(64 * mib));
        assert_eq!(parse_rtc_cache_max(Some("0")), Ok(0));
        for bad in ["-1", "1.5", "64M", "lots"] {
            let e = parse_rtc_cache_max(Some(bad)).unwrap_err();
            assert!(
                e.contains(RTC_CACHE_MAX_MB) && e.contains("whole number of MiB"),
                "{e}"
            );
        }
    }
}
