//! IB memory registration: the memory region of one IB transport that a registered memory
//! owns, and the `MIBM` blob (address, length, rkey) a peer needs to write to it.

use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock};

use mscclpp_hal::api::Host;
use mscclpp_hal::ibv::{self, AccessFlags};
use mscclpp_hal::{prelude::*, DmaBuf, Gpu};

use super::{ib_ctx, ibv_err, peermem_loaded, IbCtx, RegPath};
use crate::env::IbMrPath;
use crate::error::{Error, Result};
use crate::memory::{hal_err, host_addressable, Allocation, Backing};
use crate::serialize::{Reader, Writer};
use crate::transport::{DeviceType, Transport};

/// A memory region of one IB transport, owned by a registered memory (deregistered on drop,
/// before the dma-buf fd it was registered from is closed).
pub(crate) struct IbMr {
    pub transport: Transport,
    pub mr: ibv::MemoryRegion,
    pub path: RegPath,
    _dmabuf: Option<DmaBuf>,
    _ctx: Arc<IbCtx>,
}

impl std::fmt::Debug for IbMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbMr")
            .field("transport", &self.transport)
            .field("path", &self.path)
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

/// Exports `len` bytes at `offset` of `alloc` as a dma-buf (GPU memory of the build's backend,
/// or the host backend's memfd).
fn export_dmabuf(alloc: &Allocation, offset: u64, len: usize) -> Result<DmaBuf> {
    let off = usize::try_from(offset)
        .map_err(|_| Error::invalid(format!("dma-buf export: offset {offset} too large")))?;
    match alloc.backing() {
        Backing::Gpu(_, mem) => Gpu::export_dmabuf(mem, off, len),
        Backing::Host(_, mem) => Host::export_dmabuf(mem, off, len),
    }
    .map_err(|e| hal_err("dma-buf export for IB registration", e))
}

/// Registers `len` bytes at `offset` of `alloc` with IB transport `t`, choosing the path as the
/// module docs say (`MSCCLPP_IB_MR_PATH` forces one), and logs the path taken at info level.
///
/// # Safety
/// The allocation must stay alive until the returned region is dropped.
pub(crate) unsafe fn register(
    t: Transport,
    alloc: &Allocation,
    offset: u64,
    len: usize,
) -> Result<IbMr> {
    let ctx = ib_ctx(t)?;
    let addr = alloc.ptr() + offset;
    let device = alloc.device();
    let gpu = device.kind == DeviceType::Gpu;
    let want = crate::env::env().ib_mr_path()?;
    let lib = ctx.pd.context().lib().clone();
    // Auto uses dma-buf for GPU memory only (host memory is not a dma-buf on real systems);
    // a forced dma-buf path also takes host-backend CPU memory (its memfd), for tests.
    let try_dmabuf = match want {
        IbMrPath::Auto => gpu && lib.has_dmabuf(),
        IbMrPath::DataDirect | IbMrPath::DmaBuf => true,
        IbMrPath::Plain => false,
    };
    let mut why_not = Vec::new();
    if try_dmabuf {
        match try_register_dmabuf(&ctx, want, alloc, offset, len) {
            Ok((mr, path, buf)) => return Ok(finish(t, &ctx, mr, path, Some(buf), addr, len)),
            Err(e) if want != IbMrPath::Auto => return Err(e),
            Err(e) => why_not.push(e.to_string()),
        }
    } else if gpu && want == IbMrPath::Auto {
        why_not.push(format!("{} lacks ibv_reg_dmabuf_mr", lib.path()));
    }
    if gpu && !host_addressable(device) && !peermem_loaded() {
        return Err(Error::invalid(format!(
            "{t}: registering GPU memory {addr:#x} (+{len} bytes): expected dma-buf registration \
             ({}) or the nvidia-peermem kernel module for ibv_reg_mr, found neither",
            if why_not.is_empty() {
                "not tried: MSCCLPP_IB_MR_PATH=plain".to_string()
            } else {
                why_not.join("; ")
            }
        )));
    }
    // SAFETY: the caller keeps the allocation alive while the region lives.
    let mr = unsafe {
        ctx.pd
            .reg_mr(addr as usize as *mut u8, len, AccessFlags::ALL_REMOTE)
    }
    .map_err(|e| {
        ibv_err(
            &format!(
                "{t}: registering {addr:#x} (+{len} bytes) on `{}`",
                ctx.name()
            ),
            e,
        )
    })?;
    if !why_not.is_empty() {
        crate::log_info!(
            "NET",
            "{t}: dma-buf registration of {addr:#x} not used: {}",
            why_not.join("; ")
        );
    }
    Ok(finish(t, &ctx, mr, RegPath::Plain, None, addr, len))
}

fn finish(
    t: Transport,
    ctx: &Arc<IbCtx>,
    mr: ibv::MemoryRegion,
    path: RegPath,
    dmabuf: Option<DmaBuf>,
    addr: u64,
    len: usize,
) -> IbMr {
    crate::log_info!(
        "NET",
        "{t}: registered {addr:#x} (+{len} bytes) on `{}` through {}",
        ctx.name(),
        path.describe()
    );
    IbMr {
        transport: t,
        mr,
        path,
        _dmabuf: dmabuf,
        _ctx: ctx.clone(),
    }
}

/// The dma-buf paths: Data Direct when allowed, the mlx5dv library has it and the device has a
/// Data Direct function; else `ibv_reg_dmabuf_mr` (unless Data Direct was forced).
fn try_register_dmabuf(
    ctx: &Arc<IbCtx>,
    want: IbMrPath,
    alloc: &Allocation,
    offset: u64,
    len: usize,
) -> Result<(ibv::MemoryRegion, RegPath, DmaBuf)> {
    let t = ctx.transport;
    let addr = alloc.ptr() + offset;
    let buf = export_dmabuf(alloc, offset, len)?;
    let fd = buf.fd.as_raw_fd();
    let access = AccessFlags::ALL_REMOTE;
    let what = |op: &str| format!("{t}: {op} of {addr:#x} (+{len} bytes) on `{}`", ctx.name());
    if want != IbMrPath::DmaBuf {
        match data_direct(ctx) {
            Ok(mlx5) => {
                // SAFETY: the fd's memory is the caller's live allocation; the fd is kept next
                // to the region and closed after it.
                let r = unsafe {
                    ctx.pd
                        .reg_dmabuf_mr_data_direct(&mlx5, buf.offset, len, addr, fd, access)
                };
                match r {
                    Ok(mr) => return Ok((mr, RegPath::DmaBufDataDirect, buf)),
                    Err(e) if want == IbMrPath::DataDirect => {
                        return Err(ibv_err(&what("mlx5dv_reg_dmabuf_mr (Data Direct)"), e))
                    }
                    Err(e) => crate::log_info!(
                        "NET",
                        "{}: {e}; trying ibv_reg_dmabuf_mr",
                        what("Data Direct registration")
                    ),
                }
            }
            Err(e) if want == IbMrPath::DataDirect => {
                return Err(Error::invalid(format!(
                    "{} (MSCCLPP_IB_MR_PATH=data-direct): {e}",
                    what("Data Direct registration")
                )))
            }
            Err(_) => {}
        }
    }
    // SAFETY: as above.
    let mr = unsafe { ctx.pd.reg_dmabuf_mr(buf.offset, len, addr, fd, access) }
        .map_err(|e| ibv_err(&what("ibv_reg_dmabuf_mr"), e))?;
    Ok((mr, RegPath::DmaBuf, buf))
}

/// The mlx5dv library when the device of `ctx` has a Data Direct function, else why not.
fn data_direct(ctx: &IbCtx) -> std::result::Result<Arc<ibv::Mlx5Lib>, String> {
    let mlx5 = mlx5_lib()?.ok_or_else(|| {
        "no mlx5dv library (MSCCLPP_MLX5_SO unset, and no system libmlx5 next to the system \
         libibverbs)"
            .to_string()
    })?;
    if !mlx5.has_data_direct() {
        return Err(format!(
            "{} lacks mlx5dv_get_data_direct_sysfs_path or mlx5dv_reg_dmabuf_mr",
            mlx5.path()
        ));
    }
    let path = mlx5
        .data_direct_sysfs_path(ctx.pd.context())
        .map_err(|e| format!("`{}` has no Data Direct function: {e}", ctx.name()))?;
    crate::log_info!("NET", "{}: Data Direct function at {path}", ctx.name());
    Ok(mlx5)
}

/// The process's mlx5dv library, loaded once (see [`ibv::Mlx5Lib::load`]).
fn mlx5_lib() -> std::result::Result<Option<Arc<ibv::Mlx5Lib>>, String> {
    static LIB: OnceLock<std::result::Result<Option<Arc<ibv::Mlx5Lib>>, String>> = OnceLock::new();
    LIB.get_or_init(|| ibv::Mlx5Lib::load().map_err(|e| format!("loading mlx5dv: {e}")))
        .clone()
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
