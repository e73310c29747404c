//! LL packet operations on the host backend (see [`crate::packet`] and `packet_device.hpp`).
//!
//! A packet half (data | flag << 32) is written with one relaxed `AtomicU64` store and read with
//! one relaxed load, so a reader never sees data without its flag. LL16's two halves carry their
//! own flags, so 8-byte atomicity is all that is assumed, as on the GPU.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::backoff::spin_until_device as spin_until;
use crate::error::{Error, Result};
use crate::packet::{LL16Packet, LL8Packet, Packet};

/// Packet formats the host device API can write and read.
pub trait HostPacket: Packet {
    /// Writes the payload at `data` (PAYLOAD_BYTES, 4-byte aligned) into packet `pkt` with `flag`.
    ///
    /// # Safety
    /// `pkt` is a live packet slot, `data` readable for PAYLOAD_BYTES.
    unsafe fn write(pkt: *mut Self, data: *const u32, flag: u32);
    /// One attempt to read packet `pkt` carrying `flag` into `out`; true on success.
    ///
    /// # Safety
    /// `pkt` is a live packet slot, `out` writable for PAYLOAD_BYTES.
    unsafe fn read_once(pkt: *const Self, flag: u32, out: *mut u32) -> bool;
}

fn word(data: u32, flag: u32) -> u64 {
    (u64::from(flag) << 32) | u64::from(data)
}

impl HostPacket for LL16Packet {
    unsafe fn write(pkt: *mut Self, data: *const u32, flag: u32) {
        // SAFETY: the caller's contract; a 16-byte aligned packet holds two aligned u64 halves.
        unsafe {
            let halves = pkt.cast::<u64>();
            let (d1, d2) = (data.read_unaligned(), data.add(1).read_unaligned());
            AtomicU64::from_ptr(halves).store(word(d1, flag), Ordering::Relaxed);
            AtomicU64::from_ptr(halves.add(1)).store(word(d2, flag), Ordering::Relaxed);
        }
    }
    unsafe fn read_once(pkt: *const Self, flag: u32, out: *mut u32) -> bool {
        // SAFETY: the caller's contract, as in `write`.
        unsafe {
            let halves = pkt.cast::<u64>().cast_mut();
            let lo = AtomicU64::from_ptr(halves).load(Ordering::Relaxed);
            let hi = AtomicU64::from_ptr(halves.add(1)).load(Ordering::Relaxed);
            if (lo >> 32) as u32 != flag || (hi >> 32) as u32 != flag {
                return false;
            }
            out.write_unaligned(lo as u32);
            out.add(1).write_unaligned(hi as u32);
            true
        }
    }
}

impl HostPacket for LL8Packet {
    unsafe fn write(pkt: *mut Self, data: *const u32, flag: u32) {
        // SAFETY: the caller's contract; an LL8 packet is one aligned u64.
        unsafe {
            AtomicU64::from_ptr(pkt.cast::<u64>())
                .store(word(data.read_unaligned(), flag), Ordering::Relaxed)
        };
    }
    unsafe fn read_once(pkt: *const Self, flag: u32, out: *mut u32) -> bool {
        // SAFETY: the caller's contract.
        unsafe {
            let w = AtomicU64::from_ptr(pkt.cast::<u64>().cast_mut()).load(Ordering::Relaxed);
            if (w >> 32) as u32 != flag {
                return false;
            }
            out.write_unaligned(w as u32);
            true
        }
    }
}

/// Checks the arguments of a cooperative packet copy and returns the packet indices thread
/// `thread_id` handles: `thread_id, +num_threads, ...` below `bytes / PAYLOAD_BYTES`.
fn thread_packets<P: Packet>(
    op: &str,
    data: usize,
    bytes: u64,
    thread_id: u32,
    num_threads: u32,
) -> Result<std::iter::StepBy<std::ops::Range<usize>>> {
    if !bytes.is_multiple_of(P::PAYLOAD_BYTES as u64)
        || !data.is_multiple_of(4)
        || num_threads == 0
        || thread_id >= num_threads
    {
        return Err(Error::invalid(format!(
            "{op}<{}>: expected bytes a multiple of {}, 4-byte aligned data and thread_id < num_threads; got bytes {bytes}, data {data:#x}, thread {thread_id}/{num_threads}",
            P::NAME,
            P::PAYLOAD_BYTES
        )));
    }
    let n = (bytes / P::PAYLOAD_BYTES as u64) as usize;
    Ok((thread_id as usize..n).step_by(num_threads as usize))
}

/// Packs `bytes` of `data` into packets carrying `flag`. All `num_threads` cooperating threads
/// call it with the same arguments; thread `thread_id` writes packets `thread_id, +num_threads, ...`.
///
/// # Safety
/// `packets` holds `bytes / PAYLOAD_BYTES` live packet slots; `data` is readable for `bytes`.
pub unsafe fn copy_to_packets<P: HostPacket>(
    packets: *mut P,
    data: *const u8,
    bytes: u64,
    thread_id: u32,
    num_threads: u32,
    flag: u32,
) -> Result<()> {
    for i in thread_packets::<P>(
        "copy_to_packets",
        data as usize,
        bytes,
        thread_id,
        num_threads,
    )? {
        // SAFETY: i < bytes / PAYLOAD_BYTES, inside both ranges by the caller's contract.
        unsafe {
            P::write(
                packets.add(i),
                data.add(i * P::PAYLOAD_BYTES).cast::<u32>(),
                flag,
            )
        };
    }
    Ok(())
}

/// Unpacks `bytes` of data from packets, waiting (at most `timeout` per packet) for each to
/// carry `flag`.
///
/// # Safety
/// `packets` holds `bytes / PAYLOAD_BYTES` live packet slots; `data` is writable for `bytes`.
pub unsafe fn copy_from_packets<P: HostPacket>(
    data: *mut u8,
    packets: *const P,
    bytes: u64,
    thread_id: u32,
    num_threads: u32,
    flag: u32,
    timeout: Duration,
) -> Result<()> {
    for i in thread_packets::<P>(
        "copy_from_packets",
        data as usize,
        bytes,
        thread_id,
        num_threads,
    )? {
        // SAFETY: i < bytes / PAYLOAD_BYTES, inside both ranges by the caller's contract.
        let (pkt, out) = unsafe { (packets.add(i), data.add(i * P::PAYLOAD_BYTES).cast::<u32>()) };
        spin_until(
            &format!("{} packet {i} flag {flag}", P::NAME),
            timeout,
            // SAFETY: as above.
            || unsafe { P::read_once(pkt, flag, out) },
        )?;
    }
    Ok(())
}

/// Reads packet `index` of `packets` carrying `flag` (waiting at most `timeout`); returns its
/// payload as u32 words (2 for LL16, 1 for LL8).
///
/// # Safety
/// `packets.add(index)` is a live packet slot.
pub unsafe fn read_packet<P: HostPacket>(
    packets: *const P,
    index: usize,
    flag: u32,
    timeout: Duration,
) -> Result<[u32; 2]> {
    let mut out = [0u32; 2];
    // SAFETY: forwarded from the caller; out has room for 2 words >= PAYLOAD_BYTES.
    let pkt = unsafe { packets.add(index) };
    let o = out.as_mut_ptr();
    spin_until(
        &format!("{} packet {index} flag {flag}", P::NAME),
        timeout,
        // SAFETY: as above.
        || unsafe { P::read_once(pkt, flag, o) },
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip<P: HostPacket + Default>() {
        let data: Vec<u32> = (0..64).map(|i| 0xdead_0000 + i).collect();
        let n = data.len() * 4 / P::PAYLOAD_BYTES;
        let mut pkts = vec![P::default(); n];
        let mut out = vec![0u32; data.len()];
        let bytes = (data.len() * 4) as u64;
        // Thread `t` of `threads` unpacks its share of the packets into `out`, waiting for `flag`.
        let unpack = |out: &mut [u32], pkts: &[P], t, threads, flag, timeout| {
            // SAFETY: vectors sized for `bytes` of data and `n` packets.
            unsafe {
                copy_from_packets(
                    out.as_mut_ptr().cast(),
                    pkts.as_ptr(),
                    bytes,
                    t,
                    threads,
                    flag,
                    timeout,
                )
            }
        };
        let short = Duration::from_millis(5);
        assert!(
            unpack(&mut out, &pkts, 0, 1, 1, short).is_err(),
            "zeroed packets never carry flag 1"
        );
        // SAFETY: vectors sized for `bytes` of data and `n` packets.
        unsafe {
            for t in 0..3 {
                copy_to_packets(pkts.as_mut_ptr(), data.as_ptr().cast(), bytes, t, 3, 7)
                    .expect("valid args");
            }
        }
        assert!(
            unpack(&mut out, &pkts, 0, 1, 8, short).is_err(),
            "wrong flag"
        );
        for t in 0..2 {
            unpack(&mut out, &pkts, t, 2, 7, Duration::from_secs(1)).expect("all packets carry 7");
        }
        // SAFETY: as above.
        unsafe {
            let first = read_packet(pkts.as_ptr(), 0, 7, Duration::from_secs(1)).expect("packet 0");
            assert_eq!(first[0], data[0]);
            assert!(
                copy_to_packets(pkts.as_mut_ptr(), data.as_ptr().cast(), 2, 0, 1, 7).is_err(),
                "not a payload multiple"
            );
        }
        assert_eq!(out, data);
    }

    #[test]
    fn ll16_roundtrip() {
        roundtrip::<LL16Packet>();
    }

    #[test]
    fn ll8_roundtrip() {
        roundtrip::<LL8Packet>();
    }
}
