//! IB memory registration: the memory region of one IB transport that a registered memory
//! owns, and the `MIBM` blob (address, length, rkey) a peer needs to write to it.

use std::sync::Arc;

use mscclpp_hal::ibv::{self, AccessFlags};

use super::{gpu_dmabuf_supported, ib_ctx, ibv_err, peermem_loaded, IbCtx};
use crate::error::{Error, Result};
use crate::memory::host_addressable;
use crate::serialize::{Reader, Writer};
use crate::transport::{Device, DeviceType, Transport};

/// A memory region of one IB transport, owned by a registered memory (deregistered on drop).
pub(crate) struct IbMr {
    pub transport: Transport,
    pub mr: ibv::MemoryRegion,
    _ctx: Arc<IbCtx>,
}

impl std::fmt::Debug for IbMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbMr")
            .field("transport", &self.transport)
            .field("mr", &self.mr)
            .finish()
    }
}

const MR_MAGIC: &[u8; 4] = b"MIBM";
const MR_VERSION: u16 = 1;

/// What a peer needs to address a registered memory over IB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RemoteMr {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

impl RemoteMr {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(MR_MAGIC, MR_VERSION);
        w.u64(self.addr).u64(self.len).u32(self.rkey);
        w.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<RemoteMr> {
        let mut r = Reader::new("IB memory info", bytes, MR_MAGIC, MR_VERSION)?;
        let addr = r.u64("address")?;
        let len = r.u64("length")?;
        let rkey = r.u32("rkey")?;
        r.finish()?;
        if addr.checked_add(len).is_none() {
            return Err(r_bad_overflow(addr, len));
        }
        Ok(RemoteMr { addr, len, rkey })
    }
}

fn r_bad_overflow(addr: u64, len: u64) -> Error {
    Error::invalid(format!(
        "IB memory info: expected address + length without overflow, got {addr:#x} + {len}"
    ))
}

/// Registers `addr..addr+len` (memory of `device`) with IB transport `t`.
///
/// # Safety
/// The range must stay allocated until the returned region is dropped.
pub(crate) unsafe fn register(t: Transport, addr: u64, len: usize, device: Device) -> Result<IbMr> {
    let ctx = ib_ctx(t)?;
    let access = AccessFlags::ALL_REMOTE;
    if device.kind == DeviceType::Gpu && !host_addressable(device) {
        let lib = ctx.pd.context().lib();
        if lib.has_dmabuf() && gpu_dmabuf_supported() {
            // Unreachable until the GPU layer exports dma-bufs (see gpu_dmabuf_supported).
            return Err(Error::invalid(format!(
                "{t}: dma-buf registration of GPU memory {addr:#x} is not wired to the GPU layer"
            )));
        }
        if !peermem_loaded() {
            return Err(Error::invalid(format!(
                "{t}: registering GPU memory {addr:#x} (+{len} bytes): expected dma-buf support \
                 (verbs library {} ibv_reg_dmabuf_mr; GPU dma-buf export: {}) or the \
                 nvidia-peermem kernel module, found neither",
                if lib.has_dmabuf() { "exports" } else { "lacks" },
                gpu_dmabuf_supported()
            )));
        }
    }
    // SAFETY: the caller keeps the range allocated while the region lives.
    let mr = unsafe { ctx.pd.reg_mr(addr as usize as *mut u8, len, access) }.map_err(|e| {
        ibv_err(
            &format!(
                "{t}: registering {addr:#x} (+{len} bytes) on `{}`",
                ctx.name()
            ),
            e,
        )
    })?;
    Ok(IbMr {
        transport: t,
        mr,
        _ctx: ctx,
    })
}

impl IbMr {
    /// The info blob a peer needs (address, length, rkey).
    pub fn info(&self) -> Vec<u8> {
        RemoteMr {
            addr: self.mr.addr(),
            len: self.mr.len() as u64,
            rkey: self.mr.rkey(),
        }
        .encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_mr_round_trips_and_rejects_malformed() {
        let m = RemoteMr {
            addr: 0x1000,
            len: 64,
            rkey: 7,
        };
        let b = m.encode();
        assert_eq!(RemoteMr::decode(&b).unwrap(), m);
        assert!(RemoteMr::decode(&b[..b.len() - 1]).is_err());
        let mut extra = b.clone();
        extra.push(0);
        assert!(RemoteMr::decode(&extra).is_err());
        let bad = RemoteMr {
            addr: u64::MAX,
            len: 2,
            rkey: 1,
        }
        .encode();
        assert!(RemoteMr::decode(&bad).is_err());
    }
}
