//! The receiving side of an Ethernet connection: decodes the peer's frames, applies each only
//! inside the live local registration it names (see `registered_memory`, "Identity"), and
//! acks it. Generic over the byte streams, so the fuzz targets drive it from memory.
//!
//! Bounded whatever the peer sends: a frame header is decoded from a fixed 33-byte buffer, a
//! write's payload moves through one buffer of at most [`CHUNK`] bytes (drained, not stored,
//! when the write is refused), and a write longer than `wire::MAX_WRITE_LEN` is a protocol
//! error before any payload is read.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use super::wire::{self, AckStatus, Frame, Op, FRAME_LEN};
use crate::error::{Error, Result};
use crate::memory::write_to;
use crate::registered_memory::{find_registration, Rejection};
use crate::transport::Transport;

/// Payload bytes moved per chunk (bounds the receiver's buffer whatever a peer claims).
pub(crate) const CHUNK: usize = 1 << 20;

/// Serves frames from `r`, acking on `w`, until the stream ends or breaks; refused frames are
/// passed to `report`. Returns why it stopped (the connection is broken from then on).
pub(crate) fn serve<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    buf: &mut Vec<u8>,
    report: &mut dyn FnMut(String),
) -> String {
    let mut h = [0u8; FRAME_LEN];
    loop {
        if let Err(e) = r.read_exact(&mut h) {
            return format!("the peer closed the connection ({e})");
        }
        let f = match Frame::decode(&h) {
            Ok(f) => f,
            Err(e) => return format!("protocol error: {e}"),
        };
        let status = match f.op {
            Op::Write { len } => match apply_write(r, buf, &f, len) {
                Ok(st) => st,
                Err(e) => return format!("receiving write #{}: {e}", f.seq),
            },
            Op::Signal { value } => apply_signal(&f, value),
        };
        crate::log_trace!(
            "NET",
            "Ethernet: applied frame #{} {:?} at {:#x}: {status:?}",
            f.seq,
            f.op,
            f.addr
        );
        if let Some(why) = status.reason() {
            let (what, len) = match f.op {
                Op::Write { len } => ("write", len),
                Op::Signal { .. } => ("signal", 8),
            };
            report(format!(
                "rejected incoming {what} #{} to {:#x} (+{len} bytes, registration {:#x}): {why}",
                f.seq, f.addr, f.registration
            ));
        }
        if let Err(e) = w.write_all(&wire::ack(f.seq, status)) {
            return format!("acknowledging frame #{}: {e}", f.seq);
        }
    }
}

/// Reads `len` payload bytes and stores them at the frame's address if the live registration
/// it names covers the range (else drains them). Returns the verdict.
fn apply_write<R: Read>(sock: &mut R, buf: &mut Vec<u8>, f: &Frame, len: u64) -> Result<AckStatus> {
    let target = find_registration(f.registration, f.addr, len, Transport::Ethernet);
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        if buf.len() < n {
            buf.resize(n, 0);
        }
        sock.read_exact(&mut buf[..n])
            .map_err(|e| Error::io("reading write payload", e))?;
        if let Ok(mem) = &target {
            let at = f.addr + done;
            if let Some(host) = mem.host_address(at) {
                // SAFETY: `at..at+n` lies inside the live registration `mem` (checked by
                // find_registration), which keeps the allocation alive during the copy.
                unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), host, n) };
            } else {
                // SAFETY: as above, through the GPU backend.
                unsafe { write_to(mem.device(), at, &buf[..n]) }?;
            }
        }
        done += n as u64;
    }
    Ok(match target {
        Ok(_) => AckStatus::Applied,
        Err(r) => AckStatus::Rejected(r),
    })
}

/// Stores `value` at the frame's address with release semantics if the live registration it
/// names covers the aligned u64 there.
fn apply_signal(f: &Frame, value: u64) -> AckStatus {
    let addr = f.addr;
    if addr & 7 != 0 {
        return AckStatus::Misaligned;
    }
    let mem = match find_registration(f.registration, addr, 8, Transport::Ethernet) {
        Ok(m) => m,
        Err(r) => return AckStatus::Rejected(r),
    };
    if let Some(host) = mem.host_address(addr) {
        // SAFETY: aligned (host mappings are page-aligned, so device and host addresses share
        // their low bits) and inside the live registration `mem`; shared u64 tokens are only
        // accessed atomically.
        let atom = unsafe { AtomicU64::from_ptr(host.cast::<u64>()) };
        atom.store(value, Ordering::Release);
        AckStatus::Applied
    } else {
        // SAFETY: inside the live registration `mem`.
        match unsafe { write_to(mem.device(), addr, &value.to_le_bytes()) } {
            Ok(()) => AckStatus::Applied,
            // The destination exists but could not be written: as good as out of reach (the
            // sender hears that; the cause is only known here).
            Err(e) => {
                crate::log_warn!(
                    "NET",
                    "Ethernet: signal #{} to {addr:#x} could not be stored: {e}",
                    f.seq
                );
                AckStatus::Rejected(Rejection::OutOfRange)
            }
        }
    }
}
