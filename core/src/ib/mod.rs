//! InfiniBand resources shared by endpoints, connections and registered memory: one opened
//! device (context + protection domain) per transport `IB0..IB7`, port and GID selection, and
//! memory registration.
//!
//! # Devices
//! `IBn` opens the n-th name of `MSCCLPP_HCA_DEVICES` (comma separated) when that variable is
//! set, else the n-th device of the verbs library (`MSCCLPP_IBV_SO` when set, else the system
//! `libibverbs`). A device stays open while any endpoint, connection or registration of it lives
//! (a process-wide cache of weak references), and closes after the last one is gone.
//!
//! # Ports and GIDs
//! [`IbConfig::port`] -1 picks the first ACTIVE port with an InfiniBand or Ethernet link layer
//! and a non-zero GID at the chosen index; an explicit port that is not usable is an error naming
//! it and why. The GID index is [`IbConfig::gid_index`] when >= 0, else `MSCCLPP_IB_GID_INDEX`,
//! else 0.
//!
//! # Memory registration
//! Every IB transport of a registration gets its own memory region (LOCAL_WRITE | REMOTE_WRITE |
//! REMOTE_READ | REMOTE_ATOMIC). Host memory (and the host backend's "GPU" memory) is registered
//! with `ibv_reg_mr`. Real GPU memory prefers dma-buf (`ibv_reg_dmabuf_mr`) when the verbs
//! library exports it and the GPU layer can export a dma-buf fd; the GPU layer of this build
//! cannot yet ([`gpu_dmabuf_supported`]), so GPU memory goes through `ibv_reg_mr`, which needs
//! the `nvidia-peermem` kernel module (checked in `/sys/module` and `/proc/modules`; without it
//! registration is an error saying so). The [`mr::IbMr`] is owned by the registered memory and
//! deregistered when it drops.
//!
//! The memory's transport info blob for an IB transport (what a peer needs to write to it):
//! `MIBM` envelope version 1 with `address u64 | length u64 | rkey u32` ([`mr`]).
//!
//! # Files
//! This file opens devices; [`mr`] registers memory; [`qp`] creates the queue pairs of IB
//! endpoints (used by [`crate::endpoint`] and [`crate::connection`]'s IB transport).

pub(crate) mod mr;
pub(crate) mod qp;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use mscclpp_hal::ibv::{Gid, IbvError, IbvLib, PortAttr, ProtectionDomain};

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::transport::{IbConfig, Transport};

/// How IB waits poll their completion queues: 63 spins, 192 yields, then sleeps of 20 us
/// doubling to 1 ms.
pub(crate) const CQ_BACKOFF: Backoff = Backoff::new(
    63,
    192,
    std::time::Duration::from_micros(20),
    std::time::Duration::from_millis(1),
);

/// Converts a verbs error into this crate's error, naming the operation.
pub(crate) fn ibv_err(op: &str, e: IbvError) -> Error {
    match e {
        IbvError::Call { source, .. } => Error::io(op.to_string(), source),
        other => Error::invalid(format!("{op}: {other}")),
    }
}

/// The verbs library of this process, loaded once (`MSCCLPP_IBV_SO`, else the system one).
fn lib() -> Result<Arc<IbvLib>> {
    static LIB: OnceLock<std::result::Result<Arc<IbvLib>, String>> = OnceLock::new();
    LIB.get_or_init(|| IbvLib::load().map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| Error::invalid(format!("IB transport unavailable: {e}")))
}

/// The IB device names this process can use, in `IB0..` order: `MSCCLPP_HCA_DEVICES` when set,
/// else the verbs library's device list (empty when the library has none).
pub fn ib_device_names() -> Result<Vec<String>> {
    let hca = crate::env::env().hca_devices();
    if !hca.is_empty() {
        return Ok(hca.to_vec());
    }
    lib()?
        .device_names()
        .map_err(|e| ibv_err("listing IB devices", e))
}

/// Why IB cannot be used in this process (`None` when at least one device is found): the
/// library does not load, or it lists no devices. Tests skip with this reason.
pub fn ib_unavailable_reason() -> Option<String> {
    match lib().and_then(|l| {
        l.device_names()
            .map_err(|e| ibv_err("listing IB devices", e))
    }) {
        Err(e) => Some(e.to_string()),
        Ok(names) if names.is_empty() => Some(format!(
            "no IB device found (MSCCLPP_IBV_SO {}; the verbs library lists no devices)",
            match crate::env::env().ibv_so() {
                Some(p) => format!("= {}", p.display()),
                None => "unset".to_string(),
            }
        )),
        Ok(_) => None,
    }
}

/// The number of IB transports usable here (devices, capped at 8).
pub fn ib_device_count() -> usize {
    ib_device_names().map(|n| n.len().min(8)).unwrap_or(0)
}

/// One opened IB device: its verbs context and the protection domain every MR and QP of this
/// process on it shares.
pub(crate) struct IbCtx {
    pub transport: Transport,
    pub pd: Arc<ProtectionDomain>,
    pub atomics: bool,
    pub max_qp_wr: u32,
}

impl std::fmt::Debug for IbCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbCtx")
            .field("transport", &self.transport)
            .field("device", &self.name())
            .finish()
    }
}

impl IbCtx {
    /// The device name.
    pub fn name(&self) -> &str {
        self.pd.context().name()
    }

    /// Picks the port and GID for `cfg` (see the module docs).
    pub fn select_port(&self, cfg: &IbConfig) -> Result<(u8, PortAttr, Gid, u8)> {
        let gid_index = resolve_gid_index(cfg)?;
        let ctx = self.pd.context();
        let found = match cfg.port {
            -1 => ctx
                .first_active_port(i32::from(gid_index))
                .map_err(|e| ibv_err(&format!("{}: choosing a port", self.transport), e))?,
            p if (1..=255).contains(&p) => {
                ctx.check_port(p as u8, i32::from(gid_index)).map_err(|e| {
                    ibv_err(
                        &format!(
                            "{}: IbConfig.port = {p} on `{}`",
                            self.transport,
                            self.name()
                        ),
                        e,
                    )
                })?
            }
            p => {
                return Err(Error::invalid(format!(
                    "{}: IbConfig.port: expected -1 (first active) or a port number 1..=255, \
                     got {p}",
                    self.transport
                )))
            }
        };
        Ok((found.0, found.1, found.2, gid_index))
    }
}

/// The GID index: the config's when >= 0, else `MSCCLPP_IB_GID_INDEX` (default 0).
pub(crate) fn resolve_gid_index(cfg: &IbConfig) -> Result<u8> {
    let raw = if cfg.gid_index >= 0 {
        cfg.gid_index as i64
    } else {
        i64::from(crate::env::env().ib_gid_index()?)
    };
    u8::try_from(raw).map_err(|_| {
        Error::invalid(format!(
            "IB gid index: expected 0..=255, got {raw} (IbConfig.gid_index or MSCCLPP_IB_GID_INDEX)"
        ))
    })
}

/// The opened device of IB transport `t` (opened on first use, shared while referenced).
pub(crate) fn ib_ctx(t: Transport) -> Result<Arc<IbCtx>> {
    let index = t
        .ib_index()
        .ok_or_else(|| Error::invalid(format!("expected an IB transport, got {t}")))?;
    static CACHE: OnceLock<Mutex<HashMap<Transport, Weak<IbCtx>>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(c) = cache.get(&t).and_then(Weak::upgrade) {
        return Ok(c);
    }
    let names = ib_device_names()?;
    let name = names.get(index).ok_or_else(|| {
        Error::invalid(format!(
            "{t}: expected at least {} IB devices (MSCCLPP_HCA_DEVICES or the verbs library's \
             list), found {}: {names:?}",
            index + 1,
            names.len()
        ))
    })?;
    let lib = lib()?;
    let ctx = lib
        .open_device(name)
        .map_err(|e| ibv_err(&format!("{t}: opening IB device `{name}`"), e))?;
    let attr = ctx
        .query_device()
        .map_err(|e| ibv_err(&format!("{t}: querying `{name}`"), e))?;
    let pd = ctx
        .alloc_pd()
        .map_err(|e| ibv_err(&format!("{t}: allocating a PD on `{name}`"), e))?;
    let c = Arc::new(IbCtx {
        transport: t,
        pd,
        atomics: attr.supports_atomics(),
        max_qp_wr: u32::try_from(attr.max_qp_wr).unwrap_or(0),
    });
    cache.insert(t, Arc::downgrade(&c));
    Ok(c)
}

/// Whether the GPU layer can export GPU memory as a dma-buf fd for `ibv_reg_dmabuf_mr`. The
/// HAL of this build has no dma-buf export yet, so this is `false`; GPU memory then needs
/// `nvidia-peermem`.
pub fn gpu_dmabuf_supported() -> bool {
    false
}

/// Whether the `nvidia-peermem` (or legacy `nv_peer_mem`) kernel module is loaded.
pub fn peermem_loaded() -> bool {
    if std::path::Path::new("/sys/module/nvidia_peermem").exists()
        || std::path::Path::new("/sys/module/nv_peer_mem").exists()
    {
        return true;
    }
    std::fs::read_to_string("/proc/modules")
        .map(|m| {
            m.lines().any(|l| {
                let name = l.split_whitespace().next().unwrap_or("");
                name == "nvidia_peermem" || name == "nv_peer_mem"
            })
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_index_comes_from_config_first() {
        let cfg = IbConfig {
            gid_index: 3,
            ..IbConfig::default()
        };
        assert_eq!(resolve_gid_index(&cfg).unwrap(), 3);
        let cfg = IbConfig {
            gid_index: 300,
            ..IbConfig::default()
        };
        assert!(resolve_gid_index(&cfg).is_err());
    }
}
