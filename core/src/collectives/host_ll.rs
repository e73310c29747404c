//! Host-backend helpers shared by the LL-packet algorithms: packet slots in the shared
//! buffers, payload units with zero-padded tails, and the per-unit reduction.

use crate::device_emu::packet::HostPacket;
use crate::device_emu::spin_until;
use crate::error::Result;
use crate::packet::{LL16Packet, LL8Packet, Packet};

use super::host_math::{reduce_into, HostElem};
use super::types::ReduceOp;

/// A payload unit of up to 8 bytes (LL8: 4, LL16: 8).
pub(crate) type Unit = [u8; 8];

/// Loads unit `idx` (of `unit` bytes) of a `total`-byte buffer at `base`, zero-padding bytes
/// past the end.
///
/// # Safety
/// `base` is readable for `total` bytes.
pub(crate) unsafe fn load_unit(base: u64, idx: usize, unit: usize, total: usize) -> Unit {
    let mut u = [0u8; 8];
    let off = idx * unit;
    let n = unit.min(total.saturating_sub(off));
    // SAFETY: off + n <= total by construction.
    unsafe { std::ptr::copy_nonoverlapping((base as usize + off) as *const u8, u.as_mut_ptr(), n) };
    u
}

/// Stores the bytes of unit `idx` that lie inside the `total`-byte buffer at `base`.
///
/// # Safety
/// `base` is writable for `total` bytes.
pub(crate) unsafe fn store_unit(base: u64, idx: usize, unit: usize, total: usize, u: &Unit) {
    let off = idx * unit;
    let n = unit.min(total.saturating_sub(off));
    // SAFETY: off + n <= total by construction.
    unsafe { std::ptr::copy_nonoverlapping(u.as_ptr(), (base as usize + off) as *mut u8, n) };
}

/// Writes `u` as the packet at `addr` (LL8 when `unit == 4`, else LL16) with `flag`.
///
/// # Safety
/// `addr` is a live packet slot of the chosen format (aligned).
pub(crate) unsafe fn put_packet(addr: u64, unit: usize, u: &Unit, flag: u32) {
    let data = u.as_ptr().cast::<u32>();
    // SAFETY: forwarded from the caller; `u` holds 8 bytes.
    unsafe {
        if unit == 4 {
            LL8Packet::write(addr as usize as *mut LL8Packet, data, flag)
        } else {
            LL16Packet::write(addr as usize as *mut LL16Packet, data, flag)
        }
    }
}

/// Waits (at most `timeout`) for the packet at `addr` to carry `flag`; returns its payload.
///
/// # Safety
/// As [`put_packet`].
pub(crate) unsafe fn get_packet(
    addr: u64,
    unit: usize,
    flag: u32,
    timeout: std::time::Duration,
) -> Result<Unit> {
    let mut u = [0u8; 8];
    let out = u.as_mut_ptr().cast::<u32>();
    // SAFETY: forwarded from the caller; `u` has room for 8 bytes.
    let once = || unsafe {
        if unit == 4 {
            LL8Packet::read_once(addr as usize as *const LL8Packet, flag, out)
        } else {
            LL16Packet::read_once(addr as usize as *const LL16Packet, flag, out)
        }
    };
    if !once() {
        let what = if unit == 4 { "LL8" } else { "LL16" };
        spin_until(
            &format!("collectives: {what} packet at {addr:#x} with flag {flag}"),
            timeout,
            once,
        )?;
    }
    Ok(u)
}

/// Bytes of one packet carrying `unit` payload bytes.
pub(crate) fn packet_bytes(unit: usize) -> usize {
    if unit == 4 {
        std::mem::size_of::<LL8Packet>()
    } else {
        debug_assert_eq!(LL16Packet::PAYLOAD_BYTES, 8);
        std::mem::size_of::<LL16Packet>()
    }
}

/// Reduces the units of every rank (in rank order) into one unit.
pub(crate) fn reduce_units<T: HostElem>(op: ReduceOp, nranks: usize, units: &[Unit]) -> Unit {
    let mut out = [0u8; 8];
    let elems = 8 / std::mem::size_of::<T>();
    let ptrs: Vec<*const T> = units.iter().map(|u| u.as_ptr().cast::<T>()).collect();
    // SAFETY: every unit and `out` hold 8 bytes = `elems` elements of T (read unaligned).
    unsafe { reduce_into::<T>(op, nranks, out.as_mut_ptr().cast::<T>(), &ptrs, elems) };
    out
}
