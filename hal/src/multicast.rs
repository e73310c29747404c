//! NVLink multicast (NVLS) objects behind the HAL: the [`MulticastApi`] contract, the
//! environment gate every GPU entry point passes first, the descriptor format and the
//! process-wide counts of live multicast resources.
//!
//! # The lifecycle (the same on every backend)
//!
//! 1. One process creates the object ([`MulticastApi::create_multicast`]: the size is rounded up
//!    to the recommended granularity) and exports it ([`MulticastApi::export_multicast`]). The
//!    export **consumes the local handle and releases it** right after exporting (the seed's leak
//!    fix: a handle kept after export held the object alive forever); what stays is the
//!    shareable form (a POSIX fd registered with [`crate::auxil::fdpass`], a fabric handle),
//!    owned by the returned export until it is dropped.
//! 2. Every process, the creator included, imports a descriptor
//!    ([`MulticastApi::import_multicast`]), adds its device ([`MulticastApi::multicast_add_device`]),
//!    binds physical memory at an offset ([`MulticastApi::multicast_bind`]; it waits until every
//!    device was added, as the driver does) and maps the object ([`MulticastApi::multicast_map`]:
//!    the whole range `[0, offset + size)` is mapped, because `cuMemMap` of a multicast handle
//!    needs offset 0, and the returned pointer is offset by `offset`; only virtual address space
//!    is spent on `[0, offset)`).
//! 3. Dropping a mapping unmaps it, dropping a binding unbinds it, dropping the last clone of an
//!    imported handle releases it. The object is gone once the export and every import are.
//!
//! # The gate
//!
//! While `MSCCLPP_FORCE_DISABLE_NVLS=1` or `NCCL_NVLS_ENABLE=0` is set
//! ([`crate::nvls_disabled_by_env`]), every fallible entry point of the GPU backends returns
//! [`Error::NvlsDisabled`] before any driver call. The CUDA result layer's multicast wrappers take
//! an [`NvlsPermit`], which only [`NvlsPermit::check`] makes and only while the environment allows
//! NVLS, so no code path can reach `cuMulticastCreate` under the switches. The host backend's
//! emulation (memfd mappings and CPU threads, no hardware object) is not gated: it is how the NVLS
//! stack runs in CI, where the switches are always set.

use crate::{Api, Error, IpcDescriptor, Result};
use std::sync::atomic::{AtomicI64, Ordering};

/// The multicast granularities of a device for an object of a given size and device count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MulticastGranularity {
    /// Offsets and sizes of bindings and mappings must be multiples of this.
    pub minimum: usize,
    /// Object sizes are rounded up to a multiple of this.
    pub recommended: usize,
}

/// What a multicast handle describes (no driver call needed to ask).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MulticastInfo {
    /// Bytes of the object (rounded to the recommended granularity at creation).
    pub size: usize,
    /// Devices that take part.
    pub ndevices: usize,
    /// The minimum granularity of bindings and mappings.
    pub granularity: usize,
}

/// Multicast objects: create, export/import, add a device, bind memory, map (each backend's
/// `multicast.rs`). See the module docs for the lifecycle and the environment gate.
pub trait MulticastApi {
    /// Minimum and recommended granularity of a multicast object of `size` bytes over
    /// `ndevices` devices (CUDA: `cuMulticastGetGranularity`).
    fn multicast_granularity(
        dev: &<Self as Api>::Device,
        size: usize,
        ndevices: usize,
    ) -> Result<MulticastGranularity>
    where
        Self: Api;
    /// Creates a multicast object of at least `size` bytes for `ndevices` devices.
    fn create_multicast(
        dev: &<Self as Api>::Device,
        size: usize,
        ndevices: usize,
    ) -> Result<<Self as Api>::Multicast>
    where
        Self: Api;
    /// Exports `mc` for import by other processes (and this one) and releases the local handle
    /// (it is consumed). The export keeps the shareable handles alive until dropped: keep it
    /// until every participant has imported.
    fn export_multicast(mc: <Self as Api>::Multicast) -> Result<<Self as Api>::MulticastExport>
    where
        Self: Api;
    /// The descriptors of an export, preferred first (fabric before POSIX fd on CUDA).
    fn multicast_descriptors(export: &<Self as Api>::MulticastExport) -> Vec<IpcDescriptor>
    where
        Self: Api;
    /// Imports an exported multicast object on `dev`.
    fn import_multicast(
        dev: &<Self as Api>::Device,
        desc: &IpcDescriptor,
    ) -> Result<<Self as Api>::Multicast>
    where
        Self: Api;
    /// Size, device count and granularity of `mc`.
    fn multicast_info(mc: &<Self as Api>::Multicast) -> MulticastInfo
    where
        Self: Api;
    /// Adds `dev` to the object (once per handle; a second call for the same device is a no-op).
    fn multicast_add_device(
        mc: &<Self as Api>::Multicast,
        dev: &<Self as Api>::Device,
    ) -> Result<()>
    where
        Self: Api;
    /// Binds `size` bytes of `mem` at `mem_offset` to the object at `mc_offset` for `dev` (which
    /// must have been added through this handle); waits until every device was added. Offsets
    /// and size must be multiples of the minimum granularity. Dropping the binding unbinds it.
    ///
    /// # Safety
    /// `mem` must stay allocated until the returned binding is dropped (the binding does not
    /// own it), and no device may use the bound range through the multicast address after that.
    unsafe fn multicast_bind(
        mc: &<Self as Api>::Multicast,
        dev: &<Self as Api>::Device,
        mc_offset: usize,
        mem: &<Self as Api>::Memory,
        mem_offset: usize,
        size: usize,
    ) -> Result<<Self as Api>::MulticastBinding>
    where
        Self: Api;
    /// Maps the object for `dev`: `[0, offset + size)` is mapped (offset 0, as `cuMemMap` of a
    /// multicast handle requires) and the mapping's device pointer is `base + offset`.
    fn multicast_map(
        mc: &<Self as Api>::Multicast,
        dev: &<Self as Api>::Device,
        offset: usize,
        size: usize,
    ) -> Result<<Self as Api>::MulticastMapping>
    where
        Self: Api;
}

/// Proof that the environment allowed NVLS when it was made: the CUDA result layer's multicast
/// wrappers take one, so nothing reaches `cuMulticast*` while a switch disables NVLS.
#[derive(Clone, Copy, Debug)]
pub struct NvlsPermit {
    _private: (),
}

impl NvlsPermit {
    /// A permit for `op`, or [`Error::NvlsDisabled`] while the environment disables NVLS (read
    /// anew on every call; no driver call is made either way).
    pub fn check(op: &'static str) -> Result<NvlsPermit> {
        if crate::nvls_disabled_by_env() {
            Err(Error::NvlsDisabled { op })
        } else {
            Ok(NvlsPermit { _private: () })
        }
    }

    /// A permit regardless of the environment, for stand-in objects in the gate test (which
    /// never reach the driver with it).
    #[cfg(all(test, hal_cuda))]
    pub(crate) fn forged_for_tests() -> NvlsPermit {
        NvlsPermit { _private: () }
    }
}

/// Multicast resources alive in this process, per kind: handles (created or imported, not yet
/// released), exports, bindings and mappings. Every backend keeps these counts, so a leak test
/// can check that a create/bind/destroy cycle returns them to where they were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MulticastCounts {
    /// Live multicast handles (a created handle until its export releases it; imports).
    pub handles: i64,
    /// Live exports (each holds a shareable fd or handle).
    pub exports: i64,
    /// Live bindings of memory to an object.
    pub bindings: i64,
    /// Live mappings of an object.
    pub mappings: i64,
}

static COUNTS: [AtomicI64; 4] = [
    AtomicI64::new(0),
    AtomicI64::new(0),
    AtomicI64::new(0),
    AtomicI64::new(0),
];

/// The multicast resources alive in this process now.
pub fn multicast_counts() -> MulticastCounts {
    let c = |k: Kind| COUNTS[k as usize].load(Ordering::SeqCst);
    MulticastCounts {
        handles: c(Kind::Handle),
        exports: c(Kind::Export),
        bindings: c(Kind::Binding),
        mappings: c(Kind::Mapping),
    }
}

/// Which count a [`Live`] guard holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code)] // every kind is used by the host backend; GPU backends use all four too
pub(crate) enum Kind {
    Handle = 0,
    Export = 1,
    Binding = 2,
    Mapping = 3,
}

/// One unit of a [`MulticastCounts`] count, held by the resource it counts.
#[derive(Debug)]
pub(crate) struct Live(Kind);

impl Live {
    pub(crate) fn new(kind: Kind) -> Live {
        COUNTS[kind as usize].fetch_add(1, Ordering::SeqCst);
        Live(kind)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        COUNTS[self.0 as usize].fetch_sub(1, Ordering::SeqCst);
    }
}

/// Magic of the multicast parameters in a descriptor's handle bytes.
/// How long a bind waits for every device to be added (the driver waits without a limit; the
/// host emulation waits for the same).
pub(crate) const BIND_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

const MC_MAGIC: &[u8; 4] = b"MCST";
/// Bytes of the parameters before the backend's own handle bytes.
const MC_HEADER: usize = 4 + 4 + 8;

/// Handle bytes of a multicast descriptor: magic `MCST`, device count (u32 LE), minimum
/// granularity (u64 LE), then the backend's handle (empty for fd kinds; CUDA fabric: the
/// 64-byte `CUmemFabricHandle`). The descriptor's `size` is the object's size.
pub(crate) fn encode_params(info: &MulticastInfo, extra: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(MC_HEADER + extra.len());
    v.extend_from_slice(MC_MAGIC);
    v.extend_from_slice(&(info.ndevices as u32).to_le_bytes());
    v.extend_from_slice(&(info.granularity as u64).to_le_bytes());
    v.extend_from_slice(extra);
    v
}

/// The [`MulticastInfo`] and the backend's handle bytes of a multicast descriptor, checked:
/// magic, a device count and granularity above 0, a size that is a positive multiple of the
/// granularity, and exactly `extra_len` trailing bytes.
pub(crate) fn decode_params(
    desc: &IpcDescriptor,
    extra_len: usize,
) -> Result<(MulticastInfo, &[u8])> {
    let h = &desc.handle;
    if h.len() != MC_HEADER + extra_len || &h[..4] != MC_MAGIC {
        return Err(Error::BadDescriptor(format!(
            "multicast {:?}: expected {} handle bytes starting with {MC_MAGIC:?}, got {} bytes",
            desc.kind,
            MC_HEADER + extra_len,
            h.len()
        )));
    }
    let ndevices = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
    let mut g = [0u8; 8];
    g.copy_from_slice(&h[8..16]);
    let granularity = usize::try_from(u64::from_le_bytes(g)).unwrap_or(0);
    let size = usize::try_from(desc.size).unwrap_or(0);
    if ndevices == 0 || granularity == 0 || size == 0 || !size.is_multiple_of(granularity) {
        return Err(Error::BadDescriptor(format!(
            "multicast: expected devices > 0 and a size that is a positive multiple of the \
             granularity, got {ndevices} devices, size {}, granularity {granularity}",
            desc.size
        )));
    }
    let info = MulticastInfo {
        size,
        ndevices,
        granularity,
    };
    Ok((info, &h[MC_HEADER..]))
}

/// Checks a binding's offsets and size against the object and the memory: multiples of the
/// granularity, a positive size, inside both.
pub(crate) fn check_bind(
    op: &'static str,
    info: &MulticastInfo,
    mc_offset: usize,
    mem_len: usize,
    mem_offset: usize,
    size: usize,
) -> Result<()> {
    let g = info.granularity;
    if size == 0
        || !size.is_multiple_of(g)
        || !mc_offset.is_multiple_of(g)
        || !mem_offset.is_multiple_of(g)
    {
        return Err(Error::invalid(
            op,
            format!("offsets and a positive size that are multiples of the granularity {g}"),
            format!("multicast offset {mc_offset}, memory offset {mem_offset}, size {size}"),
        ));
    }
    if mc_offset.checked_add(size).is_none_or(|e| e > info.size) {
        return Err(Error::invalid(
            op,
            format!("a range inside the {}-byte multicast object", info.size),
            format!("offset {mc_offset} + size {size}"),
        ));
    }
    if mem_offset.checked_add(size).is_none_or(|e| e > mem_len) {
        return Err(Error::invalid(
            op,
            format!("a range inside the {mem_len}-byte memory"),
            format!("offset {mem_offset} + size {size}"),
        ));
    }
    Ok(())
}

/// Checks a mapping request: a positive size, `offset + size` inside the object, offset a
/// multiple of the granularity. Returns the mapped length `offset + size` rounded up to the
/// granularity.
pub(crate) fn check_map(
    op: &'static str,
    info: &MulticastInfo,
    offset: usize,
    size: usize,
) -> Result<usize> {
    let g = info.granularity;
    let end = offset.checked_add(size).filter(|e| *e <= info.size);
    match end {
        Some(end) if size > 0 && offset.is_multiple_of(g) => Ok(end.div_ceil(g) * g),
        _ => Err(Error::invalid(
            op,
            format!(
                "offset a multiple of {g} and 0 < size with offset + size <= {}",
                info.size
            ),
            format!("offset {offset}, size {size}"),
        )),
    }
}

/// Checks the arguments of a create: a positive size and device count.
pub(crate) fn check_create(op: &'static str, size: usize, ndevices: usize) -> Result<()> {
    if size == 0 || ndevices == 0 || ndevices > u32::MAX as usize {
        return Err(Error::invalid(
            op,
            "a positive size and device count",
            format!("size {size}, {ndevices} devices"),
        ));
    }
    Ok(())
}

/// `size` rounded up to a multiple of `g`, or an error naming `op` when that overflows.
pub(crate) fn round_up(op: &'static str, size: usize, g: usize) -> Result<usize> {
    size.div_ceil(g)
        .checked_mul(g)
        .ok_or_else(|| Error::invalid(op, "a size that fits when rounded up", size.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IpcKind;

    fn desc(size: u64, handle: Vec<u8>) -> IpcDescriptor {
        IpcDescriptor {
            kind: IpcKind::PosixFd,
            size,
            offset: 0,
            pid: 1,
            host_id: 2,
            fd_id: 3,
            handle,
        }
    }

    #[test]
    fn params_round_trip_and_reject_garbage() {
        let info = MulticastInfo {
            size: 8192,
            ndevices: 4,
            granularity: 4096,
        };
        let d = desc(8192, encode_params(&info, b"xy"));
        let (got, extra) = decode_params(&d, 2).expect("valid");
        assert_eq!(got, info);
        assert_eq!(extra, b"xy");
        assert!(decode_params(&d, 0).is_err(), "wrong trailing length");
        assert!(
            decode_params(&desc(8000, d.handle.clone()), 2).is_err(),
            "size not granular"
        );
        let mut bad = d.handle.clone();
        bad[0] = b'X';
        assert!(decode_params(&desc(8192, bad), 2).is_err(), "bad magic");
        let zero = encode_params(
            &MulticastInfo {
                ndevices: 0,
                ..info
            },
            b"",
        );
        assert!(decode_params(&desc(8192, zero), 0).is_err(), "zero devices");
    }

    #[test]
    fn bind_and_map_checks() {
        let info = MulticastInfo {
            size: 4 * 4096,
            ndevices: 2,
            granularity: 4096,
        };
        assert!(check_bind("b", &info, 4096, 8192, 0, 4096).is_ok());
        assert!(check_bind("b", &info, 100, 8192, 0, 4096).is_err());
        assert!(check_bind("b", &info, 0, 8192, 0, 0).is_err());
        assert!(check_bind("b", &info, 3 * 4096, 8192, 0, 8192).is_err());
        assert!(check_bind("b", &info, 0, 4096, 4096, 4096).is_err());
        assert_eq!(check_map("m", &info, 4096, 100).expect("ok"), 8192);
        assert!(check_map("m", &info, 4096, 4 * 4096).is_err());
        assert!(check_map("m", &info, 1, 1).is_err());
        assert!(check_create("c", 0, 1).is_err());
        assert!(check_create("c", 1, 0).is_err());
        assert!(round_up("r", usize::MAX, 4096).is_err());
    }
}
