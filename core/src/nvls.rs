//! NVLS connections: one NVLink multicast object shared by a group of ranks, to which each rank
//! binds buffers at offsets ([`NvlsConnection::bind_allocated_memory`] gives a
//! [`SwitchChannel`] per buffer; many buffers share one connection at different offsets).
//!
//! # Setup ([`NvlsConnection::connect_collective`], called by every rank of the group)
//! The lowest rank creates the object (size rounded up to the recommended granularity, one
//! device per rank), exports it and sends the descriptors to the others over the bootstrap;
//! every rank, the creator too, imports a descriptor and adds its device, then tells the creator
//! how that went. The creator answers everyone with one verdict (the first failure, naming the
//! rank) and drops its export: the object lives on in the imports. A rank whose environment
//! refuses NVLS still takes part in the messages, so nobody waits for it in vain.
//!
//! # Binding
//! Each rank allocates offsets in the object locally (first fit over a free list), so every
//! rank must bind the same sizes in the same order to get the same offsets (as upstream). The
//! host emulation reports a mismatch when a device operation finds a device with nothing bound
//! at an offset.
//!
//! `Device::CPU` uses the host backend's emulation (memfd mappings, CPU threads: it runs
//! wherever the host backend does, whatever the NVLS switches say); a GPU uses the build's GPU
//! backend, which refuses before any driver call while `MSCCLPP_FORCE_DISABLE_NVLS=1` or
//! `NCCL_NVLS_ENABLE=0` is set ([`nvls_usable`] says so up front).

use std::sync::{Arc, Mutex};

use mscclpp_hal::api::Host;
use mscclpp_hal::{prelude::*, Gpu, IpcDescriptor, MulticastInfo};

use crate::bootstrap::Bootstrap;
use crate::communicator::{wire_tag, Communicator, KIND_NVLS};
use crate::error::{Error, Result};
use crate::memory::{find_allocation, gpu_device, hal_err, host_device, Allocation, Backing};
use crate::serialize::{Reader, Writer};
use crate::switch_channel::SwitchChannel;
use crate::transport::{Device, DeviceType};

const DESC_MAGIC: &[u8; 4] = b"MNVD";
const STATUS_MAGIC: &[u8; 4] = b"MNVS";
const VERSION: u16 = 1;
const MAX_DESCS: u32 = 4;

/// Whether NVLS connections can be made on `device`: always on the CPU (host emulation) and on
/// a host-backend build; on a GPU build only while the environment allows NVLS and the GPU
/// supports multicast. The error says why not (for a test's skip reason).
pub fn nvls_usable(device: Device) -> Result<()> {
    if device.kind == DeviceType::Cpu || <Gpu as Api>::HOST_ADDRESSABLE {
        return Ok(());
    }
    if mscclpp_hal::nvls_disabled_by_env() {
        return Err(hal_err(
            "NVLS connection",
            mscclpp_hal::Error::NvlsDisabled {
                op: "NvlsConnection",
            },
        ));
    }
    if !mscclpp_hal::nvls_supported() {
        return Err(Error::invalid(format!(
            "NVLS connection on {device:?}: expected a GPU with multicast (NVLS) support, this \
             {} build's GPU has none",
            Gpu::NAME
        )));
    }
    Ok(())
}

enum McBackend {
    Host(<Host as Api>::Device, <Host as Api>::Multicast),
    Gpu(<Gpu as Api>::Device, <Gpu as Api>::Multicast),
}

struct Inner {
    device: Device,
    mc: McBackend,
    info: MulticastInfo,
    /// Free ranges `(offset, len)` of the object, sorted by offset, never adjacent.
    free: Mutex<Vec<(usize, usize)>>,
}

/// A multicast object shared by a group of ranks (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct NvlsConnection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for NvlsConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvlsConnection")
            .field("device", &self.inner.device)
            .field("info", &self.inner.info)
            .finish()
    }
}

/// Upstream's name for [`NvlsConnection::connect_collective`].
pub fn connect_nvls_collective(
    comm: &Communicator,
    ranks: &[usize],
    device: Device,
    buffer_size: usize,
) -> Result<NvlsConnection> {
    NvlsConnection::connect_collective(comm, ranks, device, buffer_size)
}

impl NvlsConnection {
    /// Creates (lowest rank) or imports (the others) a multicast object of at least
    /// `buffer_size` bytes for the ranks in `ranks`, on `device`. Every rank in `ranks` calls
    /// it, in the same order as its other NVLS connections.
    pub fn connect_collective(
        comm: &Communicator,
        ranks: &[usize],
        device: Device,
        buffer_size: usize,
    ) -> Result<NvlsConnection> {
        let b = comm.bootstrap().as_ref();
        crate::bootstrap::check_group(ranks, b.rank(), b.nranks())?;
        if buffer_size == 0 {
            return Err(Error::invalid(
                "NvlsConnection: expected a buffer size above 0, got 0",
            ));
        }
        let local = nvls_usable(device);
        let (mc, info) = match device.kind {
            DeviceType::Cpu => {
                let dev = host_device()?;
                let mc = connect_with::<Host>(b, ranks, Some(&dev), buffer_size, local)?;
                let info = Host::multicast_info(&mc);
                (McBackend::Host(dev, mc), info)
            }
            DeviceType::Gpu => {
                // Open the GPU only where NVLS may be used; a refusing rank still answers.
                let (dev, local) = match local {
                    Ok(()) => match gpu_device(device.id) {
                        Ok(d) => (Some(d), Ok(())),
                        Err(e) => (None, Err(e)),
                    },
                    Err(e) => (None, Err(e)),
                };
                let mc = connect_with::<Gpu>(b, ranks, dev.as_ref(), buffer_size, local)?;
                let info = Gpu::multicast_info(&mc);
                let dev =
                    dev.ok_or_else(|| Error::Internal("NVLS set up without a device".into()))?;
                (McBackend::Gpu(dev, mc), info)
            }
        };
        Ok(NvlsConnection {
            inner: Arc::new(Inner {
                device,
                mc,
                info,
                free: Mutex::new(vec![(0, info.size)]),
            }),
        })
    }

    /// The device the connection's buffers live on.
    pub fn device(&self) -> Device {
        self.inner.device
    }
    /// Bytes of the multicast object.
    pub fn size(&self) -> usize {
        self.inner.info.size
    }
    /// Bindings are rounded up to (and buffers must be aligned to) this many bytes.
    pub fn granularity(&self) -> usize {
        self.inner.info.granularity
    }
    /// Ranks (devices) in the group.
    pub fn ndevices(&self) -> usize {
        self.inner.info.ndevices
    }
    /// Bytes still free in the object.
    pub fn free_bytes(&self) -> usize {
        self.lock_free().iter().map(|(_, l)| l).sum()
    }

    fn lock_free(&self) -> std::sync::MutexGuard<'_, Vec<(usize, usize)>> {
        self.inner.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Binds `size` bytes at `ptr` (memory allocated by this library on the connection's
    /// device, e.g. a [`crate::GpuBuffer`], starting at a multiple of the granularity) at the
    /// next free offset of the object and maps it: the returned channel's `mc_ptr` is the
    /// buffer's multicast address. The binding is `size` rounded up to the granularity.
    pub fn bind_allocated_memory(&self, ptr: u64, size: usize) -> Result<SwitchChannel> {
        let g = self.granularity();
        let rounded = size
            .checked_next_multiple_of(g)
            .filter(|r| *r > 0)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "bind_allocated_memory: expected a size above 0 that fits when rounded up \
                     to {g}, got {size}"
                ))
            })?;
        let (alloc, mem_offset) = find_allocation(ptr, size).ok_or_else(|| {
            Error::invalid(format!(
                "bind_allocated_memory: expected {size} bytes at {ptr:#x} inside one live \
                 allocation of this library (GpuBuffer or LocalMemory), found none"
            ))
        })?;
        if alloc.device() != self.inner.device {
            return Err(Error::invalid(format!(
                "bind_allocated_memory: memory at {ptr:#x} lives on {:?}, the connection on {:?}",
                alloc.device(),
                self.inner.device
            )));
        }
        let offset = self.take_range(rounded)?;
        let guard = RangeGuard {
            conn: Arc::clone(&self.inner),
            offset,
            len: rounded,
        };
        let mem_offset = mem_offset as usize;
        let (resources, mc_ptr) = match (&self.inner.mc, alloc.backing()) {
            (McBackend::Host(dev, mc), Backing::Host(_, mem)) => {
                // SAFETY: `Bound` keeps the allocation alive until the binding is dropped.
                let (b, m) =
                    unsafe { bind_with::<Host>(mc, dev, offset, mem, mem_offset, rounded) }?;
                let p = m.device_ptr();
                (BoundResources::Host(m, b), p)
            }
            (McBackend::Gpu(dev, mc), Backing::Gpu(_, mem)) => {
                // SAFETY: as above.
                let (b, m) =
                    unsafe { bind_with::<Gpu>(mc, dev, offset, mem, mem_offset, rounded) }?;
                let p = m.device_ptr();
                (BoundResources::Gpu(m, b), p)
            }
            _ => {
                return Err(Error::invalid(format!(
                    "bind_allocated_memory: memory at {ptr:#x} belongs to another backend than \
                     the connection's ({:?})",
                    self.inner.device
                )))
            }
        };
        let keep = Arc::new(Bound {
            _resources: resources,
            _range: guard,
            _alloc: alloc,
        });
        Ok(SwitchChannel::new(ptr, mc_ptr, size, offset, keep))
    }

    fn take_range(&self, len: usize) -> Result<usize> {
        let mut free = self.lock_free();
        let at = free.iter().position(|(_, l)| *l >= len).ok_or_else(|| {
            Error::invalid(format!(
                "bind_allocated_memory: expected {len} free bytes in the {}-byte multicast \
                 object, the largest free range is {}",
                self.size(),
                free.iter().map(|(_, l)| *l).max().unwrap_or(0)
            ))
        })?;
        let (off, l) = free[at];
        if l == len {
            free.remove(at);
        } else {
            free[at] = (off + len, l - len);
        }
        Ok(off)
    }
}

/// Returns a bound range to the connection's free list (merging with its neighbours).
struct RangeGuard {
    conn: Arc<Inner>,
    offset: usize,
    len: usize,
}

impl Drop for RangeGuard {
    fn drop(&mut self) {
        let mut free = self.conn.free.lock().unwrap_or_else(|p| p.into_inner());
        give_back(&mut free, self.offset, self.len);
    }
}

fn give_back(free: &mut Vec<(usize, usize)>, offset: usize, len: usize) {
    let at = free.partition_point(|(o, _)| *o < offset);
    free.insert(at, (offset, len));
    if at + 1 < free.len() && free[at].0 + free[at].1 == free[at + 1].0 {
        free[at].1 += free[at + 1].1;
        free.remove(at + 1);
    }
    if at > 0 && free[at - 1].0 + free[at - 1].1 == free[at].0 {
        free[at - 1].1 += free[at].1;
        free.remove(at);
    }
}

/// The mapping before the binding in each variant: fields drop in order, so the range is
/// unmapped, then unbound.
#[allow(dead_code)] // held for their Drop only
enum BoundResources {
    Host(
        <Host as Api>::MulticastMapping,
        <Host as Api>::MulticastBinding,
    ),
    Gpu(
        <Gpu as Api>::MulticastMapping,
        <Gpu as Api>::MulticastBinding,
    ),
}

/// What a [`SwitchChannel`] keeps alive, dropped in field order: unmap and unbind, return the
/// range, release the memory.
struct Bound {
    _resources: BoundResources,
    _range: RangeGuard,
    _alloc: Arc<Allocation>,
}

/// # Safety
/// `mem` stays allocated until the returned binding is dropped.
unsafe fn bind_with<A: Api>(
    mc: &A::Multicast,
    dev: &A::Device,
    offset: usize,
    mem: &A::Memory,
    mem_offset: usize,
    len: usize,
) -> Result<(A::MulticastBinding, A::MulticastMapping)> {
    // SAFETY: forwarded from the caller.
    let binding = unsafe { A::multicast_bind(mc, dev, offset, mem, mem_offset, len) }
        .map_err(|e| hal_err(&format!("bind {len} bytes at multicast offset {offset}"), e))?;
    let mapping = A::multicast_map(mc, dev, offset, len)
        .map_err(|e| hal_err(&format!("map multicast range [0, {})", offset + len), e))?;
    Ok((binding, mapping))
}

fn tag(step: u64) -> Result<u64> {
    wire_tag(KIND_NVLS, step)
}

/// The setup protocol of the module docs on backend `A`. `dev` is `None` exactly when `local`
/// is an error (this rank cannot take part): it still answers every message, with the error,
/// so that every rank returns the same failure instead of waiting.
fn connect_with<A: Api>(
    b: &dyn Bootstrap,
    ranks: &[usize],
    dev: Option<&A::Device>,
    size: usize,
    local: Result<()>,
) -> Result<A::Multicast> {
    let me = b.rank();
    let root = ranks.iter().copied().min().unwrap_or(me);
    let peers: Vec<usize> = ranks.iter().copied().filter(|&p| p != me).collect();
    let usable: Remote<&A::Device> = match (local, dev) {
        (Ok(()), Some(d)) => Ok(d),
        (Err(e), _) => Err(format!("rank {me}: {e}")),
        (Ok(()), None) => Err(format!("rank {me}: no device opened")),
    };
    let import_add = |descs: &[IpcDescriptor]| -> Remote<A::Multicast> {
        let dev = usable.clone()?;
        let mut last = String::from("no descriptor");
        for d in descs {
            match A::import_multicast(dev, d) {
                Ok(mc) => {
                    return A::multicast_add_device(&mc, dev)
                        .map(|()| mc)
                        .map_err(|e| format!("rank {me}: add device: {e}"));
                }
                Err(e) => last = format!("rank {me}: import {:?}: {e}", d.kind),
            }
        }
        Err(last)
    };
    let failed = |e: String| Error::invalid(format!("NVLS connection setup failed: {e}"));
    if me == root {
        let created = usable.clone().and_then(|dev| {
            A::create_multicast(dev, size, ranks.len())
                .and_then(A::export_multicast)
                .map_err(|e| format!("rank {me}: create and export: {e}"))
        });
        let descs = created
            .as_ref()
            .map(A::multicast_descriptors)
            .map_err(Clone::clone);
        for &p in &peers {
            b.send(&encode_descs(&descs), p, tag(0)?)?;
        }
        let mine = descs.and_then(|d| import_add(&d));
        let mut verdict: Remote<()> = mine.as_ref().map(|_| ()).map_err(Clone::clone);
        for &p in &peers {
            let st = decode_status(&b.recv(p, tag(1)?)?)
                .map_err(|e| Error::remote(p, format!("NVLS setup status: {e}")))?;
            if let (Ok(()), Err(e)) = (&verdict, st) {
                verdict = Err(e);
            }
        }
        for &p in &peers {
            b.send(&encode_status(&verdict), p, tag(2)?)?;
        }
        // Every importer holds the object now (or the setup failed): drop the export.
        drop(created);
        verdict.map_err(failed)?;
        mine.map_err(failed)
    } else {
        let descs = decode_descs(&b.recv(root, tag(0)?)?)
            .map_err(|e| Error::remote(root, format!("NVLS descriptors: {e}")))?;
        let mine = descs.and_then(|d| import_add(&d));
        let st: Remote<()> = mine.as_ref().map(|_| ()).map_err(Clone::clone);
        b.send(&encode_status(&st), root, tag(1)?)?;
        let verdict = decode_status(&b.recv(root, tag(2)?)?)
            .map_err(|e| Error::remote(root, format!("NVLS verdict: {e}")))?;
        verdict.map_err(failed)?;
        mine.map_err(failed)
    }
}

fn encode_descs(descs: &std::result::Result<Vec<IpcDescriptor>, String>) -> Vec<u8> {
    let mut w = Writer::new(DESC_MAGIC, VERSION);
    match descs {
        Ok(d) => {
            w.u8(0).u32(d.len() as u32);
            for x in d {
                w.blob(&x.to_bytes());
            }
        }
        Err(e) => {
            w.u8(1).blob(e.as_bytes());
        }
    }
    w.finish()
}

type Remote<T> = std::result::Result<T, String>;

fn decode_descs(bytes: &[u8]) -> Result<Remote<Vec<IpcDescriptor>>> {
    let mut r = Reader::new("NVLS descriptors", bytes, DESC_MAGIC, VERSION)?;
    let out = match r.u8("status")? {
        0 => {
            let n = r.u32("count")?;
            if n == 0 || n > MAX_DESCS {
                return Err(r.bad("count", &format!("1..={MAX_DESCS}"), n));
            }
            let mut v = Vec::new();
            for _ in 0..n {
                let blob = r.blob("descriptor", 1024)?;
                v.push(IpcDescriptor::from_bytes(blob).map_err(|e| hal_err("NVLS descriptor", e))?);
            }
            Ok(v)
        }
        1 => Err(String::from_utf8_lossy(r.blob("error", 4096)?).into_owned()),
        s => return Err(r.bad("status", "0 or 1", s)),
    };
    r.finish()?;
    Ok(out)
}

fn encode_status(st: &Remote<()>) -> Vec<u8> {
    let mut w = Writer::new(STATUS_MAGIC, VERSION);
    match st {
        Ok(()) => w.u8(0),
        Err(e) => w.u8(1).blob(&e.as_bytes()[..e.len().min(4096)]),
    };
    w.finish()
}

fn decode_status(bytes: &[u8]) -> Result<Remote<()>> {
    let mut r = Reader::new("NVLS status", bytes, STATUS_MAGIC, VERSION)?;
    let out = match r.u8("status")? {
        0 => Ok(()),
        1 => Err(String::from_utf8_lossy(r.blob("error", 4096)?).into_owned()),
        s => return Err(r.bad("status", "0 or 1", s)),
    };
    r.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_list_merges() {
        let mut v: Vec<(usize, usize)> = Vec::new();
        give_back(&mut v, 30, 30);
        give_back(&mut v, 70, 30);
        assert_eq!(v, vec![(30, 30), (70, 30)]);
        give_back(&mut v, 60, 10);
        assert_eq!(v, vec![(30, 70)]);
        give_back(&mut v, 0, 30);
        assert_eq!(v, vec![(0, 100)]);
    }

    #[test]
    fn messages_round_trip_and_reject_garbage() {
        let d = IpcDescriptor {
            kind: mscclpp_hal::IpcKind::HostMemfd,
            size: 4096,
            offset: 0,
            pid: 1,
            host_id: 2,
            fd_id: 3,
            handle: vec![1, 2, 3],
        };
        let ok = encode_descs(&Ok(vec![d.clone()]));
        assert_eq!(decode_descs(&ok).expect("valid"), Ok(vec![d]));
        let err = encode_descs(&Err("boom".into()));
        assert_eq!(decode_descs(&err).expect("valid"), Err("boom".into()));
        assert!(decode_descs(&ok[..ok.len() - 1]).is_err());
        assert!(
            decode_descs(&encode_descs(&Ok(vec![]))).is_err(),
            "no descriptor"
        );
        assert_eq!(decode_status(&encode_status(&Ok(()))).expect("ok"), Ok(()));
        assert_eq!(
            decode_status(&encode_status(&Err("x".into()))).expect("ok"),
            Err("x".into())
        );
        assert!(decode_status(b"MNVS").is_err());
    }
}
