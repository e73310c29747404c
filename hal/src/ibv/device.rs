//! An opened verbs device (`ibv_context`) and what can be asked of it: device attributes,
//! ports and GIDs.

use std::ptr::NonNull;
use std::sync::Arc;

use ibverbs_sys as sys;

use super::loader::IbvLib;
use super::IbvError;

/// An open device. Closed (`ibv_close_device`) when the last `Arc` goes, which can only happen
/// after every PD, CQ, MR and QP made from it is gone.
pub struct Context {
    lib: Arc<IbvLib>,
    raw: NonNull<sys::ibv_context>,
    name: String,
}

// Thread-safe: verbs contexts are thread-safe per the libibverbs API; the pointer is only used
// through verbs calls.
thread_safe!(Context);

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

/// The device attributes the core looks at (`ibv_query_device`), plus the raw struct.
#[derive(Debug, Clone, Copy)]
pub struct DeviceAttr {
    /// `ibv_device_attr.phys_port_cnt`: number of physical ports (numbered from 1).
    pub phys_port_cnt: u8,
    /// `ibv_device_attr.max_qp`: most queue pairs the device supports.
    pub max_qp: i32,
    /// `ibv_device_attr.max_qp_wr`: most outstanding work requests on one queue.
    pub max_qp_wr: i32,
    /// `ibv_device_attr.max_sge`: most scatter/gather entries per work request.
    pub max_sge: i32,
    /// `ibv_device_attr.max_cqe`: most entries one completion queue may hold.
    pub max_cqe: i32,
    /// `ibv_device_attr.max_mr_size`: largest memory region that can be registered, in bytes.
    pub max_mr_size: u64,
    /// `IBV_ATOMIC_NONE` (0), `IBV_ATOMIC_HCA` (1) or `IBV_ATOMIC_GLOB` (2).
    pub atomic_cap: u32,
    /// The whole `ibv_device_attr` as `ibv_query_device` filled it.
    pub raw: sys::ibv_device_attr,
}

impl DeviceAttr {
    /// Whether RDMA atomics (fetch-and-add) are available.
    pub fn supports_atomics(&self) -> bool {
        self.atomic_cap != sys::IBV_ATOMIC_NONE
    }
}

/// Port attributes (`ibv_query_port`), the fields the core uses plus the raw struct.
#[derive(Debug, Clone, Copy)]
pub struct PortAttr {
    /// `ibv_port_state::IBV_PORT_ACTIVE` (4) when usable.
    pub state: u32,
    /// `IBV_LINK_LAYER_INFINIBAND` (1) or `IBV_LINK_LAYER_ETHERNET` (2).
    pub link_layer: u8,
    /// `IBV_MTU_256` (1) .. `IBV_MTU_4096` (5).
    pub active_mtu: u32,
    /// `ibv_port_attr.max_mtu`: largest MTU the port supports, same encoding as `active_mtu`.
    pub max_mtu: u32,
    /// `ibv_port_attr.lid`: the port's local identifier (InfiniBand only; 0 on RoCE).
    pub lid: u16,
    /// `ibv_port_attr.gid_tbl_len`: number of entries in the port's GID table.
    pub gid_tbl_len: i32,
    /// The whole `ibv_port_attr` as `ibv_query_port` filled it.
    pub raw: sys::ibv_port_attr,
}

impl PortAttr {
    /// ACTIVE and with an InfiniBand or Ethernet link layer.
    pub fn is_usable(&self) -> bool {
        self.state == sys::ibv_port_state::IBV_PORT_ACTIVE
            && (self.link_layer == sys::IBV_LINK_LAYER_INFINIBAND as u8
                || self.link_layer == sys::IBV_LINK_LAYER_ETHERNET as u8)
    }

    /// Whether the link layer is Ethernet (RoCE), which needs a GRH (global routing) in RTR.
    pub fn is_ethernet(&self) -> bool {
        self.link_layer == sys::IBV_LINK_LAYER_ETHERNET as u8
    }
}

/// A 16-byte GID in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// All-zero GIDs are invalid (an unpopulated table entry).
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }

    /// The IPv4 address when this is an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        std::net::Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    /// The IPv4-mapped GID of `addr`.
    pub fn from_ipv4(addr: std::net::Ipv4Addr) -> Gid {
        Gid(addr.to_ipv6_mapped().octets())
    }

    pub(crate) fn to_sys(self) -> sys::ibv_gid {
        sys::ibv_gid { raw: self.0 }
    }
}

impl Context {
    pub(crate) fn from_raw(lib: Arc<IbvLib>, raw: NonNull<sys::ibv_context>, name: String) -> Self {
        Context { lib, raw, name }
    }

    /// The device name this context was opened from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The library this context came from.
    pub fn lib(&self) -> &Arc<IbvLib> {
        &self.lib
    }

    /// The raw `ibv_context` (valid while `self` lives).
    pub fn as_ptr(&self) -> *mut sys::ibv_context {
        self.raw.as_ptr()
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<DeviceAttr, IbvError> {
        let mut raw = sys::ibv_device_attr::default();
        // SAFETY: live context; `raw` is a writable ibv_device_attr.
        let ret = unsafe { (self.lib.query_device)(self.as_ptr(), &mut raw) };
        if ret != 0 {
            return Err(IbvError::from_ret("ibv_query_device", ret));
        }
        Ok(DeviceAttr {
            phys_port_cnt: raw.phys_port_cnt,
            max_qp: raw.max_qp,
            max_qp_wr: raw.max_qp_wr,
            max_sge: raw.max_sge,
            max_cqe: raw.max_cqe,
            max_mr_size: raw.max_mr_size,
            atomic_cap: raw.atomic_cap,
            raw,
        })
    }

    /// `ibv_query_port` (ports are numbered from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr, IbvError> {
        // SAFETY: ibv_port_attr is plain data; all-zero is a valid value (and what verbs.h's
        // inline wrapper passes to the exported compat entry point).
        let mut raw: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `raw` is a full, writable ibv_port_attr (larger than the compat
        // struct the exported symbol is declared with).
        let ret = unsafe { (self.lib.query_port)(self.as_ptr(), port, &mut raw) };
        if ret != 0 {
            return Err(IbvError::from_ret("ibv_query_port", ret));
        }
        Ok(PortAttr {
            state: raw.state,
            link_layer: raw.link_layer,
            active_mtu: raw.active_mtu,
            max_mtu: raw.max_mtu,
            lid: raw.lid,
            gid_tbl_len: raw.gid_tbl_len,
            raw,
        })
    }

    /// `ibv_query_gid`.
    pub fn query_gid(&self, port: u8, index: i32) -> Result<Gid, IbvError> {
        let mut gid = sys::ibv_gid::default();
        // SAFETY: live context; `gid` is writable.
        let ret = unsafe { (self.lib.query_gid)(self.as_ptr(), port, index, &mut gid) };
        if ret != 0 {
            return Err(IbvError::from_ret("ibv_query_gid", ret));
        }
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        Ok(Gid(unsafe { gid.raw }))
    }

    /// The first ACTIVE port (1..=phys_port_cnt) with an IB or Ethernet link layer and a
    /// non-zero GID at `gid_index`.
    pub fn first_active_port(&self, gid_index: i32) -> Result<(u8, PortAttr, Gid), IbvError> {
        let attr = self.query_device()?;
        let mut reasons = Vec::new();
        for port in 1..=attr.phys_port_cnt {
            match self.check_port(port, gid_index) {
                Ok(found) => return Ok(found),
                Err(e) => reasons.push(e.to_string()),
            }
        }
        Err(IbvError::PortNotActive {
            device: self.name.clone(),
            port: 0,
            reason: format!(
                "no usable port among {} (gid index {gid_index}): [{}]",
                attr.phys_port_cnt,
                reasons.join("; ")
            ),
        })
    }

    /// Checks that an explicit `port` is ACTIVE, has an IB/Ethernet link layer and a non-zero
    /// GID at `gid_index`; the error names the port and why.
    pub fn check_port(&self, port: u8, gid_index: i32) -> Result<(u8, PortAttr, Gid), IbvError> {
        let not_usable = |reason: String| IbvError::PortNotActive {
            device: self.name.clone(),
            port,
            reason,
        };
        let pa = self.query_port(port)?;
        if pa.state != sys::ibv_port_state::IBV_PORT_ACTIVE {
            return Err(not_usable(format!(
                "state {} (expected ACTIVE = 4)",
                pa.state
            )));
        }
        if !pa.is_usable() {
            return Err(not_usable(format!(
                "link layer {} (expected InfiniBand = 1 or Ethernet = 2)",
                pa.link_layer
            )));
        }
        let gid = self.query_gid(port, gid_index)?;
        if gid.is_zero() {
            return Err(not_usable(format!("GID at index {gid_index} is zero")));
        }
        Ok((port, pa, gid))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context is live and, by the Arc ownership, no child object remains.
        let ret = unsafe { (self.lib.close_device)(self.as_ptr()) };
        if ret != 0 {
            log::warn!(
                "ibv_close_device({}) failed: {}",
                self.name,
                IbvError::from_ret("ibv_close_device", ret)
            );
        }
    }
}

/// Opening devices: here beside [`Context`], so the loader does not depend on it.
impl IbvLib {
    /// Opens the device called `name`.
    pub fn open_device(self: &Arc<Self>, name: &str) -> Result<Arc<Context>, IbvError> {
        self.with_device_list(|devs| {
            let found = devs.iter().copied().find(|&d| self.device_name(d) == name);
            let Some(dev) = found else {
                return Err(IbvError::DeviceNotFound {
                    name: name.to_string(),
                    available: devs.iter().map(|&d| self.device_name(d)).collect(),
                });
            };
            // SAFETY: `dev` is a live entry of the device list.
            let raw = unsafe { (self.open_device)(dev) };
            let raw = std::ptr::NonNull::new(raw)
                .ok_or_else(|| IbvError::from_errno("ibv_open_device"))?;
            Ok(Arc::new(Context::from_raw(
                self.clone(),
                raw,
                name.to_string(),
            )))
        })
    }

    /// Opens the device at `index` in the device list.
    pub fn open_device_index(self: &Arc<Self>, index: usize) -> Result<Arc<Context>, IbvError> {
        let names = self.device_names()?;
        match names.get(index) {
            Some(name) => self.open_device(name),
            None => Err(IbvError::InvalidArgument {
                op: "open_device_index",
                reason: format!(
                    "device index {index} but only {} devices exist",
                    names.len()
                ),
            }),
        }
    }
}
