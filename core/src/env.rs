//! The `MSCCLPP_*` environment, read once per process into one typed [`Env`] (the logging
//! variables are applied by [`crate::logger`]).
//!
//! Reading never fails: a malformed value is kept as its parse error and returned, naming the
//! variable, what came and what was expected, by the typed accessor (`env().ibv_mode()?`).
//! Tests build an `Env` from any lookup function with [`Env::from_lookup`].

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Log verbosity (`MSCCLPP_LOG_LEVEL`, or `MSCCLPP_DEBUG`), in increasing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Nothing.
    None,
    /// The version banner only.
    Version,
    /// Warnings (the default).
    Warn,
    /// Informational messages.
    Info,
    /// Messages printed before aborting.
    Abort,
    /// Everything.
    Trace,
}

impl LogLevel {
    fn parse(s: &str) -> Option<LogLevel> {
        Some(match s.trim().to_ascii_uppercase().as_str() {
            "NONE" => LogLevel::None,
            "VERSION" => LogLevel::Version,
            "WARN" => LogLevel::Warn,
            "INFO" => LogLevel::Info,
            "ABORT" => LogLevel::Abort,
            "TRACE" => LogLevel::Trace,
            _ => return None,
        })
    }

    /// The variable's spelling of the level (`WARN`, ...).
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::None => "NONE",
            LogLevel::Version => "VERSION",
            LogLevel::Warn => "WARN",
            LogLevel::Info => "INFO",
            LogLevel::Abort => "ABORT",
            LogLevel::Trace => "TRACE",
        }
    }
}

/// How IB connections signal semaphores (`MSCCLPP_IBV_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IbvMode {
    /// `host`: RDMA atomics (the default).
    Host,
    /// `host-no-atomic`: RDMA write-with-immediate and a receive thread.
    HostNoAtomic,
}

/// Which IB memory registration paths may be used (`MSCCLPP_IB_MR_PATH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IbMrPath {
    /// `auto` (the default): mlx5 Data Direct, then `ibv_reg_dmabuf_mr`, then `ibv_reg_mr`,
    /// each falling back to the next.
    Auto,
    /// `data-direct`: only `mlx5dv_reg_dmabuf_mr` with Data Direct (an error otherwise).
    DataDirect,
    /// `dmabuf`: only `ibv_reg_dmabuf_mr` (an error otherwise).
    DmaBuf,
    /// `plain`: only `ibv_reg_mr` (with the peermem check for GPU memory).
    Plain,
}

/// Address family for bootstrap sockets (`MSCCLPP_SOCKET_FAMILY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SocketFamily {
    /// `AF_INET`: IPv4.
    Inet,
    /// `AF_INET6`: IPv6.
    Inet6,
}

type Parsed<T> = std::result::Result<T, String>;

/// Every `MSCCLPP_*` variable this crate reads, parsed once.
#[derive(Debug, Clone)]
pub struct Env {
    log_level: Parsed<LogLevel>,
    log_subsys: Option<String>,
    log_file: Option<PathBuf>,
    hca_devices: Vec<String>,
    ibv_so: Option<PathBuf>,
    ibv_mode: Parsed<IbvMode>,
    ib_gid_index: Parsed<u32>,
    ib_mr_path: Parsed<IbMrPath>,
    hostid: Option<String>,
    socket_ifname: Option<String>,
    bootstrap_key: Option<String>,
    socket_family: Parsed<Option<SocketFamily>>,
    force_disable_nvls: Parsed<bool>,
    force_disable_gdr: Parsed<bool>,
    cudaipc_use_default_stream: Parsed<bool>,
    nccl_lib_path: Option<PathBuf>,
    cache_dir: Parsed<PathBuf>,
}

/// The process environment, read on first use and never again.
pub fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| Env::from_lookup(|name| std::env::var(name).ok()))
}

fn parse_bool(name: &str, value: Option<String>) -> Parsed<bool> {
    let Some(v) = value else { return Ok(false) };
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "no" | "off" => Ok(false),
        "1" | "true" | "yes" | "on" => Ok(true),
        _ => Err(format!(
            "{name}={v}: expected a boolean (1, 0, true, false, yes, no, on, off)"
        )),
    }
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.and_then(|v| {
        let t = v.trim();
        (!t.is_empty()).then(|| t.to_string())
    })
}

impl Env {
    /// Builds an `Env` from `lookup(name)`, which returns the value of variable `name` if set.
    /// [`env()`] uses `std::env::var`; tests pass a map.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Env {
        let log_level = match (
            non_empty(lookup("MSCCLPP_LOG_LEVEL")).map(|v| ("MSCCLPP_LOG_LEVEL", v)),
            non_empty(lookup("MSCCLPP_DEBUG")).map(|v| ("MSCCLPP_DEBUG", v)),
        ) {
            (Some((name, v)), _) | (None, Some((name, v))) => {
                LogLevel::parse(&v).ok_or_else(|| {
                    format!("{name}={v}: expected one of NONE, VERSION, WARN, INFO, ABORT, TRACE")
                })
            }
            (None, None) => Ok(LogLevel::Warn),
        };

        let ibv_mode = match non_empty(lookup("MSCCLPP_IBV_MODE")) {
            None => Ok(IbvMode::Host),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "host" => Ok(IbvMode::Host),
                "host-no-atomic" => Ok(IbvMode::HostNoAtomic),
                _ => Err(format!(
                    "MSCCLPP_IBV_MODE={v}: expected one of host, host-no-atomic"
                )),
            },
        };

        let ib_gid_index = match non_empty(lookup("MSCCLPP_IB_GID_INDEX")) {
            None => Ok(0),
            Some(v) => v.parse::<u32>().map_err(|_| {
                format!("MSCCLPP_IB_GID_INDEX={v}: expected an integer >= 0 (a GID table index)")
            }),
        };

        let ib_mr_path = match non_empty(lookup("MSCCLPP_IB_MR_PATH")) {
            None => Ok(IbMrPath::Auto),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "auto" => Ok(IbMrPath::Auto),
                "data-direct" => Ok(IbMrPath::DataDirect),
                "dmabuf" => Ok(IbMrPath::DmaBuf),
                "plain" => Ok(IbMrPath::Plain),
                _ => Err(format!(
                    "MSCCLPP_IB_MR_PATH={v}: expected one of auto, data-direct, dmabuf, plain"
                )),
            },
        };

        let socket_family = match non_empty(lookup("MSCCLPP_SOCKET_FAMILY")) {
            None => Ok(None),
            Some(v) => match v.to_ascii_uppercase().as_str() {
                "AF_INET" => Ok(Some(SocketFamily::Inet)),
                "AF_INET6" => Ok(Some(SocketFamily::Inet6)),
                _ => Err(format!(
                    "MSCCLPP_SOCKET_FAMILY={v}: expected one of AF_INET, AF_INET6"
                )),
            },
        };

        // One parser for the NVLS switches: the HAL's, which also guards multicast creation.
        let force_disable_nvls = mscclpp_hal::parse_nvls_switches(&lookup);

        let cache_dir = match non_empty(lookup("MSCCLPP_CACHE_DIR")) {
            Some(v) => Ok(PathBuf::from(v)),
            None => match non_empty(lookup("HOME")) {
                Some(home) => Ok(Path::new(&home).join(".cache").join("mscclpp")),
                None => Err(
                    "MSCCLPP_CACHE_DIR and HOME are both unset: expected one of them to name \
                     a directory for the cache (default ~/.cache/mscclpp)"
                        .to_string(),
                ),
            },
        };

        Env {
            log_level,
            log_subsys: non_empty(lookup("MSCCLPP_LOG_SUBSYS")),
            log_file: non_empty(lookup("MSCCLPP_LOG_FILE")).map(PathBuf::from),
            hca_devices: lookup("MSCCLPP_HCA_DEVICES")
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            ibv_so: non_empty(lookup("MSCCLPP_IBV_SO")).map(PathBuf::from),
            ibv_mode,
            ib_gid_index,
            ib_mr_path,
            hostid: non_empty(lookup("MSCCLPP_HOSTID")),
            socket_ifname: non_empty(lookup("MSCCLPP_SOCKET_IFNAME")),
            bootstrap_key: non_empty(lookup("MSCCLPP_BOOTSTRAP_KEY")),
            socket_family,
            force_disable_nvls,
            force_disable_gdr: parse_bool(
                "MSCCLPP_FORCE_DISABLE_GDR",
                lookup("MSCCLPP_FORCE_DISABLE_GDR"),
            ),
            cudaipc_use_default_stream: parse_bool(
                "MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM",
                lookup("MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM"),
            ),
            nccl_lib_path: non_empty(lookup("MSCCLPP_NCCL_LIB_PATH")).map(PathBuf::from),
            cache_dir,
        }
    }

    fn typed<T: Clone>(p: &Parsed<T>) -> Result<T> {
        p.clone().map_err(Error::InvalidUsage)
    }

    /// `MSCCLPP_LOG_LEVEL`, else `MSCCLPP_DEBUG` (NONE|VERSION|WARN|INFO|ABORT|TRACE, any
    /// case); WARN when both are unset.
    pub fn log_level(&self) -> Result<LogLevel> {
        Self::typed(&self.log_level)
    }
    /// `MSCCLPP_LOG_SUBSYS`: comma list of subsystems to log (unset or `ALL` = all).
    pub fn log_subsys(&self) -> Option<&str> {
        self.log_subsys.as_deref()
    }
    /// `MSCCLPP_LOG_FILE`: log to this file instead of stderr (`%h` = host, `%p` = pid).
    pub fn log_file(&self) -> Option<&Path> {
        self.log_file.as_deref()
    }
    /// `MSCCLPP_HCA_DEVICES`: comma list of IB device names (empty when unset).
    pub fn hca_devices(&self) -> &[String] {
        &self.hca_devices
    }
    /// `MSCCLPP_IBV_SO`: the libibverbs to load instead of the system one.
    pub fn ibv_so(&self) -> Option<&Path> {
        self.ibv_so.as_deref()
    }
    /// `MSCCLPP_IBV_MODE`: `host` or `host-no-atomic`; unset = `host`.
    pub fn ibv_mode(&self) -> Result<IbvMode> {
        Self::typed(&self.ibv_mode)
    }
    /// `MSCCLPP_IB_GID_INDEX`: integer >= 0, default 0.
    pub fn ib_gid_index(&self) -> Result<u32> {
        Self::typed(&self.ib_gid_index)
    }
    /// `MSCCLPP_HOSTID`: mixed into the host hash, to tell apart hosts with one hostname.
    pub fn hostid(&self) -> Option<&str> {
        self.hostid.as_deref()
    }
    /// `MSCCLPP_SOCKET_IFNAME`: interface selection for bootstrap sockets (NCCL syntax:
    /// comma list of prefixes, `^` excludes, `=` matches exactly).
    pub fn socket_ifname(&self) -> Option<&str> {
        self.socket_ifname.as_deref()
    }
    /// `MSCCLPP_BOOTSTRAP_KEY`: the job key of `ip:port` bootstraps (any string; every rank of
    /// a job sets the same one, so ranks of another job at the same address are refused).
    pub fn bootstrap_key(&self) -> Option<&str> {
        self.bootstrap_key.as_deref()
    }
    /// `MSCCLPP_SOCKET_FAMILY`: `AF_INET` or `AF_INET6`; unset = either (IPv4 preferred).
    pub fn socket_family(&self) -> Result<Option<SocketFamily>> {
        Self::typed(&self.socket_family)
    }
    /// `MSCCLPP_FORCE_DISABLE_NVLS`, also true when `NCCL_NVLS_ENABLE=0`
    /// ([`mscclpp_hal::parse_nvls_switches`]). A malformed value is an error here, and the
    /// library keeps NVLS disabled meanwhile (fail closed).
    pub fn force_disable_nvls(&self) -> Result<bool> {
        Self::typed(&self.force_disable_nvls)
    }
    /// `MSCCLPP_IB_MR_PATH`: auto | data-direct | dmabuf | plain (default auto).
    pub fn ib_mr_path(&self) -> Result<IbMrPath> {
        Self::typed(&self.ib_mr_path)
    }
    /// `MSCCLPP_FORCE_DISABLE_GDR`.
    pub fn force_disable_gdr(&self) -> Result<bool> {
        Self::typed(&self.force_disable_gdr)
    }
    /// `MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM`.
    pub fn cudaipc_use_default_stream(&self) -> Result<bool> {
        Self::typed(&self.cudaipc_use_default_stream)
    }
    /// `MSCCLPP_NCCL_LIB_PATH`: the NCCL library to fall back to.
    pub fn nccl_lib_path(&self) -> Option<&Path> {
        self.nccl_lib_path.as_deref()
    }
    /// `MSCCLPP_CACHE_DIR`, default `$HOME/.cache/mscclpp`.
    pub fn cache_dir(&self) -> Result<PathBuf> {
        Self::typed(&self.cache_dir)
    }

    /// Whether a message of `level` in subsystem `subsys` is logged under this environment.
    /// A malformed log level logs warnings (and the first warning says why).
    pub fn log_enabled(&self, level: LogLevel, subsys: &str) -> bool {
        let max = self.log_level.clone().unwrap_or(LogLevel::Warn);
        if level == LogLevel::None || level > max {
            return false;
        }
        match &self.log_subsys {
            None => true,
            Some(list) => list
                .split(',')
                .map(str::trim)
                .any(|s| s.eq_ignore_ascii_case("ALL") || s.eq_ignore_ascii_case(subsys)),
        }
    }
}
