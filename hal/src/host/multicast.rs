//! Host-backend emulation of NVLink multicast objects ([`crate::MulticastApi`] for [`Host`]),
//! with the semantics of the CUDA backend, so the whole NVLS stack runs on CPUs in CI.
//!
//! The object is a shared control memfd (`multicast/table.rs`): a header (size, device count,
//! granularity, devices added) and a table of bindings. Exporting registers that memfd with the
//! fd server and releases the creator's handle; importing maps it. Binding records "device d's
//! memfd range at multicast offset o" in the table (the memory is exported through the fd
//! server as for IPC). Mapping reserves an inaccessible address range of `offset + size` bytes
//! (offset 0, as on CUDA) whose pointer is offset by `offset`; the device operations
//! (`core::device_emu::switch_channel`: load-reduce, store) resolve an address of it into every
//! member's memory with [`multicast_members`] and read, reduce and write each member's copy
//! with CPU loads and stores: real cross-process shared memory, real reductions.
//!
//! Not gated by the NVLS environment switches: nothing here creates a hardware object.
//! Granularity: minimum = the page size, recommended = 16 pages.

mod members;
mod table;

pub use members::{multicast_members, MulticastMembers};

use self::members::{fetch_memfd, MappedObject};
use self::table::{Binding, McObject, MAGIC, TABLE_BYTES};
use super::{Host, HostDevice, HostMemory};
use crate::auxil::fdpass::{self, host_id, FdRegistration};
use crate::auxil::os;
use crate::auxil::poll_until;
use crate::multicast::{
    check_bind, check_create, check_map, decode_params, encode_params, round_up, Kind, Live,
    BIND_WAIT,
};
use crate::{
    Buffer, Error, IpcApi, IpcDescriptor, IpcKind, MulticastApi, MulticastGranularity,
    MulticastInfo, Result,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Recommended granularity in pages.
const RECOMMENDED_PAGES: usize = 16;

/// A process's handle of an emulated multicast object. Clones share it.
#[derive(Clone, Debug)]
pub struct HostMulticast {
    obj: Arc<McObject>,
}

/// An exported emulated object: the control memfd registered with the fd server.
#[derive(Debug)]
pub struct HostMulticastExport {
    desc: IpcDescriptor,
    _reg: FdRegistration,
    _live: Live,
}

/// Memory bound to an emulated object; dropping it clears its table slot.
#[derive(Debug)]
pub struct HostMulticastBinding {
    obj: Arc<McObject>,
    slot: usize,
    _live: Live,
}

impl Drop for HostMulticastBinding {
    fn drop(&mut self) {
        self.obj.table().remove(self.slot);
    }
}

/// A mapping of an emulated object: an inaccessible reserved range; [`multicast_members`]
/// resolves its addresses for the device operations.
#[derive(Debug)]
pub struct HostMulticastMapping {
    inner: Arc<MappedObject>,
    offset: usize,
    size: usize,
    _live: Live,
}

impl Buffer for HostMulticastMapping {
    fn device_ptr(&self) -> u64 {
        self.inner.base() + self.offset as u64
    }
    fn size(&self) -> usize {
        self.size
    }
    /// None: a multicast address is no host memory (only the device operations reach it).
    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }
}

fn granularity() -> MulticastGranularity {
    let page = os::page_size();
    MulticastGranularity {
        minimum: page,
        recommended: page * RECOMMENDED_PAGES,
    }
}

fn create(size: usize, ndevices: usize) -> Result<HostMulticast> {
    const OP: &str = "create_multicast(host)";
    check_create(OP, size, ndevices)?;
    let g = granularity();
    let info = MulticastInfo {
        size: round_up(OP, size, g.recommended)?,
        ndevices,
        granularity: g.minimum,
    };
    let fd = os::memfd(c"mscclpp-hal-multicast", TABLE_BYTES)?;
    let obj = McObject::map(fd, true, info)?;
    let h = obj.table();
    let hdr = h.header();
    hdr.size.store(info.size as u64, Ordering::Relaxed);
    hdr.ndevices.store(ndevices as u64, Ordering::Relaxed);
    hdr.granularity
        .store(info.granularity as u64, Ordering::Relaxed);
    hdr.magic.store(MAGIC, Ordering::Release);
    Ok(HostMulticast { obj: Arc::new(obj) })
}

fn export(mc: HostMulticast) -> Result<HostMulticastExport> {
    let fd = mc
        .obj
        .fd
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .ok_or_else(|| {
            Error::invalid(
                "export_multicast(host)",
                "the handle create_multicast returned (exported once)",
                "an imported or already exported handle",
            )
        })?;
    let info = mc.obj.info;
    let reg = fdpass::register(fd)?;
    let desc = IpcDescriptor {
        kind: IpcKind::HostMemfd,
        size: info.size as u64,
        offset: 0,
        pid: std::process::id(),
        host_id: host_id(),
        fd_id: reg.id(),
        handle: encode_params(&info, &[]),
    };
    // The local handle goes now; the registered memfd keeps the object for importers.
    drop(mc);
    Ok(HostMulticastExport {
        desc,
        _reg: reg,
        _live: Live::new(Kind::Export),
    })
}

fn import(desc: &IpcDescriptor) -> Result<HostMulticast> {
    const OP: &str = "import_multicast(host)";
    if desc.kind != IpcKind::HostMemfd {
        return Err(Error::Unsupported {
            op: OP,
            backend: "host",
            reason: format!(
                "{:?} (host multicast objects export as HostMemfd)",
                desc.kind
            ),
        });
    }
    if desc.host_id != host_id() {
        return Err(Error::invalid(
            OP,
            format!("a descriptor from this host ({:016x})", host_id()),
            format!("host {:016x}", desc.host_id),
        ));
    }
    let (info, _) = decode_params(desc, 0)?;
    let (fd, len) = fetch_memfd(desc.host_id, desc.pid, desc.fd_id, "fstat(multicast memfd)")?;
    if len != TABLE_BYTES as u64 {
        return Err(Error::BadDescriptor(format!(
            "multicast object of pid {}: expected a {TABLE_BYTES}-byte control memfd, got {len}",
            desc.pid
        )));
    }
    let obj = McObject::map(fd, false, info)?;
    let t = obj.table();
    let hdr = t.header();
    let matches = hdr.magic.load(Ordering::Acquire) == MAGIC
        && hdr.size.load(Ordering::Relaxed) == info.size as u64
        && hdr.ndevices.load(Ordering::Relaxed) == info.ndevices as u64
        && hdr.granularity.load(Ordering::Relaxed) == info.granularity as u64;
    if !matches {
        return Err(Error::BadDescriptor(format!(
            "multicast object of pid {}: its header does not match the descriptor (size {}, {} \
             devices, granularity {})",
            desc.pid, info.size, info.ndevices, info.granularity
        )));
    }
    Ok(HostMulticast { obj: Arc::new(obj) })
}

fn add_device(mc: &HostMulticast) -> Result<()> {
    let mut dev = mc.obj.device.lock().unwrap_or_else(|p| p.into_inner());
    if dev.is_some() {
        return Ok(());
    }
    let n = mc.obj.info.ndevices as u64;
    let table = mc.obj.table();
    let added = &table.header().added;
    let prev = added.fetch_add(1, Ordering::AcqRel);
    if prev >= n {
        added.fetch_sub(1, Ordering::AcqRel);
        return Err(Error::invalid(
            "multicast_add_device(host)",
            format!("at most {n} devices (the object's device count)"),
            format!("device {} added", prev + 1),
        ));
    }
    *dev = Some(prev as u32);
    Ok(())
}

fn bind(
    mc: &HostMulticast,
    mc_offset: usize,
    mem: &HostMemory,
    mem_offset: usize,
    size: usize,
) -> Result<HostMulticastBinding> {
    const OP: &str = "multicast_bind(host)";
    let obj = &mc.obj;
    let device = (*obj.device.lock().unwrap_or_else(|p| p.into_inner())).ok_or_else(|| {
        Error::invalid(
            OP,
            "a handle whose device was added (multicast_add_device first)",
            "no device added through this handle",
        )
    })?;
    check_bind(OP, &obj.info, mc_offset, mem.mapped_len(), mem_offset, size)?;
    let table = obj.table();
    let n = obj.info.ndevices as u64;
    // As cuMulticastBindMem: binding waits until every device was added.
    poll_until(
        "multicast_bind(host): waiting for every device to be added",
        BIND_WAIT,
        || Ok(table.header().added.load(Ordering::Acquire) >= n),
    )?;
    let _serial = obj.bind_lock.lock().unwrap_or_else(|p| p.into_inner());
    let (mco, len) = (mc_offset as u64, size as u64);
    if let Some((_, b)) = table
        .bindings()?
        .into_iter()
        .find(|(_, b)| b.device == device && b.overlaps(mco, len))
    {
        return Err(Error::invalid(
            OP,
            format!("a range device {device} has not bound yet"),
            format!(
                "[{mco}, {}) overlaps its binding [{}, {})",
                mco + len,
                b.mc_offset,
                b.mc_offset + b.size
            ),
        ));
    }
    let exported = Host::export(mem, IpcKind::HostMemfd)?;
    let slot = table.insert(&Binding {
        device,
        pid: std::process::id(),
        host_id: host_id(),
        fd_id: exported.fd_id,
        mem_offset: mem_offset as u64,
        mc_offset: mco,
        size: len,
    })?;
    Ok(HostMulticastBinding {
        obj: Arc::clone(obj),
        slot,
        _live: Live::new(Kind::Binding),
    })
}

impl MulticastApi for Host {
    fn multicast_granularity(
        _dev: &HostDevice,
        size: usize,
        ndevices: usize,
    ) -> Result<MulticastGranularity> {
        HostDevice::enter()?;
        check_create("multicast_granularity(host)", size, ndevices)?;
        Ok(granularity())
    }
    fn create_multicast(_dev: &HostDevice, size: usize, ndevices: usize) -> Result<HostMulticast> {
        HostDevice::enter()?;
        create(size, ndevices)
    }
    fn export_multicast(mc: HostMulticast) -> Result<HostMulticastExport> {
        HostDevice::enter()?;
        export(mc)
    }
    fn multicast_descriptors(export: &HostMulticastExport) -> Vec<IpcDescriptor> {
        vec![export.desc.clone()]
    }
    fn import_multicast(_dev: &HostDevice, desc: &IpcDescriptor) -> Result<HostMulticast> {
        HostDevice::enter()?;
        import(desc)
    }
    fn multicast_info(mc: &HostMulticast) -> MulticastInfo {
        mc.obj.info
    }
    fn multicast_add_device(mc: &HostMulticast, _dev: &HostDevice) -> Result<()> {
        HostDevice::enter()?;
        add_device(mc)
    }
    unsafe fn multicast_bind(
        mc: &HostMulticast,
        _dev: &HostDevice,
        mc_offset: usize,
        mem: &HostMemory,
        mem_offset: usize,
        size: usize,
    ) -> Result<HostMulticastBinding> {
        HostDevice::enter()?;
        bind(mc, mc_offset, mem, mem_offset, size)
    }
    fn multicast_map(
        mc: &HostMulticast,
        _dev: &HostDevice,
        offset: usize,
        size: usize,
    ) -> Result<HostMulticastMapping> {
        HostDevice::enter()?;
        let len = check_map("multicast_map(host)", &mc.obj.info, offset, size)?;
        let inner = MappedObject::new(Arc::clone(&mc.obj), len)?;
        Ok(HostMulticastMapping {
            inner,
            offset,
            size,
            _live: Live::new(Kind::Mapping),
        })
    }
}
