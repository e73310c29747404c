//! The bootstrap's wire: the setup messages (a rank's hello to the root, the root's table or
//! abort, the peer handshake) and the constants of the frames peers exchange afterwards
//! (`kind u8 | tag u64 | length u64 | payload`), all little endian.

use std::net::SocketAddr;
use std::time::Duration;

use crate::bootstrap::socket::Deadline;
use crate::bootstrap::unique_id::{decode_addr, encode_addr, ADDR_BYTES};

pub(super) const HELLO_MAGIC: u32 = 0x4d53_4248; // "MSBH"
pub(super) const PEER_MAGIC: u32 = 0x4d53_4250; // "MSBP"
pub(super) const WIRE_VERSION: u16 = 1;
pub(super) const HELLO_BYTES: usize = 4 + 2 + 4 + 4 + 8 + 8 + ADDR_BYTES;
pub(super) const PEER_HELLO_BYTES: usize = 4 + 2 + 8 + 4;
pub(super) const REPLY_OK: u8 = 0;
pub(super) const REPLY_ABORT: u8 = 1;
pub(super) const ABORT_TIMEOUT: u8 = 0;
pub(super) const ABORT_INVALID: u8 = 1;
pub(super) const MAX_ABORT_MSG: usize = 64 * 1024;
pub(super) const FRAME_HEADER: usize = 1 + 8 + 8;
pub(super) const KIND_USER: u8 = 0;
pub(super) const KIND_COLLECTIVE: u8 = 1;
/// Largest frame payload a peer may announce (16 GiB); more means a corrupt stream.
pub(super) const MAX_FRAME: u64 = 1 << 34;

/// How long past the deadline a rank waits for the root's answer (the root sends its abort
/// at the deadline).
pub(super) const ROOT_REPLY_GRACE: Duration = Duration::from_millis(100);

pub(super) fn rd_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub(super) fn rd_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
pub(super) fn rd_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

pub(super) struct Hello {
    pub(super) rank: usize,
    pub(super) nranks: usize,
    pub(super) nonce: u64,
    pub(super) host_hash: u64,
    pub(super) listen: SocketAddr,
}

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HELLO_BYTES);
        v.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
        v.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        v.extend_from_slice(&(self.rank as u32).to_le_bytes());
        v.extend_from_slice(&(self.nranks as u32).to_le_bytes());
        v.extend_from_slice(&self.nonce.to_le_bytes());
        v.extend_from_slice(&self.host_hash.to_le_bytes());
        encode_addr(&self.listen, &mut v);
        v
    }

    pub(super) fn decode(b: &[u8; HELLO_BYTES]) -> std::result::Result<Hello, String> {
        let magic = rd_u32(b, 0);
        if magic != HELLO_MAGIC {
            return Err(format!(
                "expected hello magic {HELLO_MAGIC:#x}, got {magic:#x} (not a bootstrap client?)"
            ));
        }
        let version = rd_u16(b, 4);
        if version != WIRE_VERSION {
            return Err(format!(
                "expected bootstrap wire version {WIRE_VERSION}, got {version}"
            ));
        }
        Ok(Hello {
            rank: rd_u32(b, 6) as usize,
            nranks: rd_u32(b, 10) as usize,
            nonce: rd_u64(b, 14),
            host_hash: rd_u64(b, 22),
            listen: decode_addr(&b[30..])?,
        })
    }
}

pub(super) fn encode_abort(code: u8, msg: &str) -> Vec<u8> {
    let msg = &msg.as_bytes()[..msg.len().min(MAX_ABORT_MSG)];
    let mut v = vec![REPLY_ABORT, code];
    v.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    v.extend_from_slice(msg);
    v
}

/// Deadline for the first bytes of an accepted connection: a real rank sends them at once, so
/// a silent stranger holds up the accept loop for at most 5 s (or what is left of `deadline`).
pub(super) fn first_bytes_deadline(deadline: &Deadline) -> Deadline {
    deadline.capped(Duration::from_secs(5))
}
