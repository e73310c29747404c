//! The Ethernet connection's wire format (version 2, little endian): the hello and the
//! confirmation of the handshake, write/signal frames and acks. Pure encoders and decoders, so
//! every byte a peer sends is checked in one place (and fuzzed); a decoder never panics and
//! its error names the field and what was expected.
//!
//! - hello (22 bytes): `"METH" | version u16 | target endpoint id u64 | source endpoint id u64`,
//!   the first bytes of each outbound socket.
//! - confirm (14 bytes): `"METC" | version u16 | endpoint id u64 (the sender's)`, sent on the
//!   outbound socket once the sender also accepted the peer's socket; each side returns from
//!   `connect` only after it received the peer's.
//! - frame (33 bytes): `kind u8 (1 write, 2 signal) | seq u64 | registration id u64 | address
//!   u64 | length (write) or value (signal) u64`; a write is followed by `length` payload bytes.
//! - ack (9 bytes): `seq u64 | status u8` ([`AckStatus`]).

use crate::error::{Error, Result};
use crate::registered_memory::Rejection;

const HELLO_MAGIC: &[u8; 4] = b"METH";
const CONFIRM_MAGIC: &[u8; 4] = b"METC";
/// The wire version (1 had no registration ids and no confirmation).
pub(crate) const VERSION: u16 = 2;
pub(crate) const HELLO_LEN: usize = 4 + 2 + 8 + 8;
pub(crate) const CONFIRM_LEN: usize = 4 + 2 + 8;
pub(crate) const FRAME_LEN: usize = 1 + 8 + 8 + 8 + 8;
pub(crate) const ACK_LEN: usize = 9;
const KIND_WRITE: u8 = 1;
const KIND_SIGNAL: u8 = 2;
/// The longest write a frame may announce: every registration fits in a 48-bit address space,
/// so a longer one is a protocol error, never a drain of 2^64 bytes.
pub(crate) const MAX_WRITE_LEN: u64 = 1 << 48;

fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn exact<'a>(what: &str, b: &'a [u8], n: usize) -> Result<&'a [u8]> {
    if b.len() != n {
        return Err(Error::invalid(format!(
            "Ethernet {what}: expected {n} bytes, got {}",
            b.len()
        )));
    }
    Ok(b)
}

fn magic_version(what: &str, b: &[u8], magic: &[u8; 4]) -> Result<()> {
    if &b[..4] != magic {
        return Err(Error::invalid(format!(
            "Ethernet {what}: expected magic {:?}, got {:02x?}",
            String::from_utf8_lossy(magic),
            &b[..4]
        )));
    }
    let v = u16::from_le_bytes([b[4], b[5]]);
    if v != VERSION {
        return Err(Error::invalid(format!(
            "Ethernet {what}: expected wire version {VERSION}, got {v}"
        )));
    }
    Ok(())
}

/// The hello naming the endpoint ids `target` (the listener's) and `source` (the sender's).
pub(crate) fn hello(target: u64, source: u64) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[..4].copy_from_slice(HELLO_MAGIC);
    b[4..6].copy_from_slice(&VERSION.to_le_bytes());
    b[6..14].copy_from_slice(&target.to_le_bytes());
    b[14..22].copy_from_slice(&source.to_le_bytes());
    b
}

/// Decodes a hello into `(target, source)`.
pub(crate) fn decode_hello(b: &[u8]) -> Result<(u64, u64)> {
    let b = exact("hello", b, HELLO_LEN)?;
    magic_version("hello", b, HELLO_MAGIC)?;
    Ok((word(b, 6), word(b, 14)))
}

/// The confirmation sent by endpoint `id`.
pub(crate) fn confirm(id: u64) -> [u8; CONFIRM_LEN] {
    let mut b = [0u8; CONFIRM_LEN];
    b[..4].copy_from_slice(CONFIRM_MAGIC);
    b[4..6].copy_from_slice(&VERSION.to_le_bytes());
    b[6..14].copy_from_slice(&id.to_le_bytes());
    b
}

/// Decodes a confirmation into the sender's endpoint id.
pub(crate) fn decode_confirm(b: &[u8]) -> Result<u64> {
    let b = exact("confirmation", b, CONFIRM_LEN)?;
    magic_version("confirmation", b, CONFIRM_MAGIC)?;
    Ok(word(b, 6))
}

/// What a frame asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Store the `len` payload bytes that follow at the address.
    Write { len: u64 },
    /// Store `value` (an aligned u64 token) at the address with release semantics.
    Signal { value: u64 },
}

/// One frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) seq: u64,
    /// The destination registration's id (see `registered_memory`, "Identity").
    pub(crate) registration: u64,
    pub(crate) addr: u64,
    pub(crate) op: Op,
}

impl Frame {
    pub(crate) fn encode(&self) -> [u8; FRAME_LEN] {
        let mut h = [0u8; FRAME_LEN];
        let (kind, arg) = match self.op {
            Op::Write { len } => (KIND_WRITE, len),
            Op::Signal { value } => (KIND_SIGNAL, value),
        };
        h[0] = kind;
        h[1..9].copy_from_slice(&self.seq.to_le_bytes());
        h[9..17].copy_from_slice(&self.registration.to_le_bytes());
        h[17..25].copy_from_slice(&self.addr.to_le_bytes());
        h[25..33].copy_from_slice(&arg.to_le_bytes());
        h
    }

    /// Decodes a frame header; an unknown kind or an oversized write is an error.
    pub(crate) fn decode(b: &[u8]) -> Result<Frame> {
        let b = exact("frame", b, FRAME_LEN)?;
        let (seq, registration, addr, arg) = (word(b, 1), word(b, 9), word(b, 17), word(b, 25));
        let op = match b[0] {
            KIND_WRITE if arg > MAX_WRITE_LEN => {
                return Err(Error::invalid(format!(
                    "Ethernet frame #{seq}: write length: expected at most {MAX_WRITE_LEN} \
                     bytes, got {arg}"
                )))
            }
            KIND_WRITE => Op::Write { len: arg },
            KIND_SIGNAL => Op::Signal { value: arg },
            k => {
                return Err(Error::invalid(format!(
                    "Ethernet frame #{seq}: expected kind {KIND_WRITE} (write) or {KIND_SIGNAL} \
                     (signal), got {k}"
                )))
            }
        };
        Ok(Frame {
            seq,
            registration,
            addr,
            op,
        })
    }
}

/// The receiver's verdict on one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckStatus {
    Applied,
    Rejected(Rejection),
    /// A signal to an unaligned address.
    Misaligned,
}

impl AckStatus {
    fn to_u8(self) -> u8 {
        match self {
            AckStatus::Applied => 0,
            AckStatus::Rejected(Rejection::Stale) => 1,
            AckStatus::Rejected(Rejection::OutOfRange) => 2,
            AckStatus::Rejected(Rejection::WrongTransport) => 3,
            AckStatus::Misaligned => 4,
        }
    }
    fn from_u8(v: u8) -> Option<AckStatus> {
        Some(match v {
            0 => AckStatus::Applied,
            1 => AckStatus::Rejected(Rejection::Stale),
            2 => AckStatus::Rejected(Rejection::OutOfRange),
            3 => AckStatus::Rejected(Rejection::WrongTransport),
            4 => AckStatus::Misaligned,
            _ => return None,
        })
    }
    /// Why the frame was not applied (None when it was).
    pub(crate) fn reason(self) -> Option<&'static str> {
        match self {
            AckStatus::Applied => None,
            AckStatus::Rejected(r) => Some(r.describe()),
            AckStatus::Misaligned => Some("a signal needs an 8-byte aligned destination"),
        }
    }
}

pub(crate) fn ack(seq: u64, status: AckStatus) -> [u8; ACK_LEN] {
    let mut a = [0u8; ACK_LEN];
    a[..8].copy_from_slice(&seq.to_le_bytes());
    a[8] = status.to_u8();
    a
}

pub(crate) fn decode_ack(b: &[u8]) -> Result<(u64, AckStatus)> {
    let b = exact("ack", b, ACK_LEN)?;
    let seq = word(b, 0);
    let status = AckStatus::from_u8(b[8]).ok_or_else(|| {
        Error::invalid(format!(
            "Ethernet ack #{seq}: status: expected 0..=4, got {}",
            b[8]
        ))
    })?;
    Ok((seq, status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        assert_eq!(decode_hello(&hello(1, 2)).unwrap(), (1, 2));
        assert_eq!(decode_confirm(&confirm(9)).unwrap(), 9);
        for op in [Op::Write { len: 5 }, Op::Signal { value: u64::MAX }] {
            let f = Frame {
                seq: 3,
                registration: 0xdead,
                addr: 0x1000,
                op,
            };
            assert_eq!(Frame::decode(&f.encode()).unwrap(), f);
        }
        for s in 0..=4u8 {
            let st = AckStatus::from_u8(s).unwrap();
            assert_eq!(decode_ack(&ack(7, st)).unwrap(), (7, st));
        }
    }

    #[test]
    fn rejects_what_a_peer_cannot_send() {
        let mut h = hello(1, 2);
        h[4] = 1; // version 1
        assert!(decode_hello(&h)
            .unwrap_err()
            .to_string()
            .contains("version"));
        assert!(decode_hello(&h[..5]).is_err());
        let mut f = Frame {
            seq: 1,
            registration: 1,
            addr: 0,
            op: Op::Write {
                len: MAX_WRITE_LEN + 1,
            },
        }
        .encode();
        assert!(Frame::decode(&f)
            .unwrap_err()
            .to_string()
            .contains("at most"));
        f[0] = 9;
        assert!(Frame::decode(&f).unwrap_err().to_string().contains("kind"));
        let mut a = ack(1, AckStatus::Applied);
        a[8] = 5;
        assert!(decode_ack(&a)
            .unwrap_err()
            .to_string()
            .contains("expected 0..=4"));
    }
}
