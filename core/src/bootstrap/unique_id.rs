//! `UniqueId`: the 128 opaque bytes that tell every rank where the bootstrap root listens.
//!
//! Wire format (version 1), little-endian, never a struct dump:
//!
//! | bytes    | field                                              |
//! |----------|----------------------------------------------------|
//! | 0..8     | magic `MSCLPPID`                                   |
//! | 8..10    | format version (1)                                 |
//! | 10       | address family: 4 (IPv4) or 6 (IPv6)               |
//! | 11       | reserved, 0                                        |
//! | 12..14   | root port (non-zero)                               |
//! | 14..30   | root IP (IPv4 in 14..18, the rest 0)               |
//! | 30..34   | IPv6 scope id (0 for IPv4)                         |
//! | 34..42   | random nonce: which bootstrap this id belongs to   |
//! | 42..120  | reserved, 0                                        |
//! | 120..128 | FNV-1a checksum of bytes 0..120                    |

use crate::error::{Error, Result};
use crate::identity::fnv1a;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Size of a [`UniqueId`] in bytes.
pub const UNIQUE_ID_BYTES: usize = 128;

const MAGIC: &[u8; 8] = b"MSCLPPID";
const VERSION: u16 = 1;
const CHECKSUM_AT: usize = 120;

/// Where the bootstrap root of one [`TcpBootstrap`](super::TcpBootstrap) group listens, plus a
/// nonce naming the group. Opaque 128 bytes: pass it to the other ranks (MPI broadcast, a
/// file, a store) with [`UniqueId::to_bytes`] and rebuild it with [`UniqueId::from_bytes`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId([u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UniqueId")
            .field("root", &self.root_addr())
            .field("nonce", &format_args!("{:#018x}", self.nonce()))
            .finish()
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl UniqueId {
    /// An id naming a root at `root` for the group `nonce`.
    pub fn new(root: SocketAddr, nonce: u64) -> Result<UniqueId> {
        if root.port() == 0 {
            return Err(Error::invalid(format!(
                "UniqueId root {root}: expected a non-zero port"
            )));
        }
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[0..8].copy_from_slice(MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[12..14].copy_from_slice(&root.port().to_le_bytes());
        match root {
            SocketAddr::V4(a) => {
                b[10] = 4;
                b[14..18].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                b[10] = 6;
                b[14..30].copy_from_slice(&a.ip().octets());
                b[30..34].copy_from_slice(&a.scope_id().to_le_bytes());
            }
        }
        b[34..42].copy_from_slice(&nonce.to_le_bytes());
        let sum = fnv1a(&b[..CHECKSUM_AT], 0);
        b[CHECKSUM_AT..].copy_from_slice(&sum.to_le_bytes());
        Ok(UniqueId(b))
    }

    /// The 128 bytes to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        self.0
    }

    /// The bytes, borrowed.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }

    /// Parses bytes made by [`UniqueId::to_bytes`]. Rejects, with an error saying what was
    /// expected: a length other than 128, a wrong magic, an unknown version, a bad address
    /// family, a zero port, non-zero reserved bytes and a checksum mismatch.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let bad = |what: String| Error::invalid(format!("UniqueId::from_bytes: {what}"));
        if bytes.len() != UNIQUE_ID_BYTES {
            return Err(bad(format!(
                "expected {UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            )));
        }
        if &bytes[0..8] != MAGIC {
            return Err(bad(format!(
                "expected magic {:?}, got {:02x?}",
                String::from_utf8_lossy(MAGIC),
                &bytes[0..8]
            )));
        }
        let version = le16(bytes, 8);
        if version != VERSION {
            return Err(bad(format!(
                "expected format version {VERSION}, got {version}"
            )));
        }
        let sum = fnv1a(&bytes[..CHECKSUM_AT], 0);
        let stored = le64(bytes, CHECKSUM_AT);
        if sum != stored {
            return Err(bad(format!(
                "checksum mismatch (expected {sum:#018x}, stored {stored:#018x}): the id was corrupted"
            )));
        }
        let family = bytes[10];
        let addr_zero_from = match family {
            4 => 18,
            6 => 30,
            f => return Err(bad(format!("expected address family 4 or 6, got {f}"))),
        };
        let reserved_nonzero = bytes[11] != 0
            || bytes[addr_zero_from..30].iter().any(|&b| b != 0)
            || (family == 4 && le32(bytes, 30) != 0)
            || bytes[42..CHECKSUM_AT].iter().any(|&b| b != 0);
        if reserved_nonzero {
            return Err(bad("expected reserved bytes to be zero".to_string()));
        }
        if le16(bytes, 12) == 0 {
            return Err(bad("expected a non-zero root port, got 0".to_string()));
        }
        let mut id = [0u8; UNIQUE_ID_BYTES];
        id.copy_from_slice(bytes);
        Ok(UniqueId(id))
    }

    /// The root's address.
    pub fn root_addr(&self) -> SocketAddr {
        let b = &self.0;
        let port = le16(b, 12);
        if b[10] == 4 {
            SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::new(b[14], b[15], b[16], b[17]),
                port,
            ))
        } else {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[14..30]);
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, le32(b, 30)))
        }
    }

    /// The group nonce.
    pub fn nonce(&self) -> u64 {
        le64(&self.0, 34)
    }
}

/// Size of an encoded socket address in bootstrap messages.
pub(crate) const ADDR_BYTES: usize = 23;

/// Appends `addr` as family (1 byte: 4|6), IP (16), port (2, LE), scope id (4, LE).
pub(crate) fn encode_addr(addr: &SocketAddr, out: &mut Vec<u8>) {
    let mut ip = [0u8; 16];
    let (family, scope) = match addr {
        SocketAddr::V4(a) => {
            ip[..4].copy_from_slice(&a.ip().octets());
            (4u8, 0u32)
        }
        SocketAddr::V6(a) => {
            ip.copy_from_slice(&a.ip().octets());
            (6u8, a.scope_id())
        }
    };
    out.push(family);
    out.extend_from_slice(&ip);
    out.extend_from_slice(&addr.port().to_le_bytes());
    out.extend_from_slice(&scope.to_le_bytes());
}

/// Decodes [`encode_addr`]'s output from the first [`ADDR_BYTES`] of `b`.
pub(crate) fn decode_addr(b: &[u8]) -> std::result::Result<SocketAddr, String> {
    if b.len() < ADDR_BYTES {
        return Err(format!(
            "expected a {ADDR_BYTES}-byte address, got {} bytes",
            b.len()
        ));
    }
    let port = le16(b, 17);
    let scope = le32(b, 19);
    match b[0] {
        4 => Ok(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(b[1], b[2], b[3], b[4])),
            port,
        )),
        6 => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[1..17]);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                0,
                scope,
            )))
        }
        f => Err(format!("expected address family 4 or 6, got {f}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_v4_v6() {
        let a: SocketAddr = "10.1.2.3:5000".parse().expect("addr");
        let id = UniqueId::new(a, 0x1234).expect("id");
        let back = UniqueId::from_bytes(&id.to_bytes()).expect("parse");
        assert_eq!(back.root_addr(), a);
        assert_eq!(back.nonce(), 0x1234);
        let a6 = SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().expect("ip"), 7, 0, 3));
        let id6 = UniqueId::new(a6, 9).expect("id");
        assert_eq!(
            UniqueId::from_bytes(id6.as_bytes())
                .expect("parse")
                .root_addr(),
            a6
        );
        assert!(UniqueId::new("1.2.3.4:0".parse().expect("addr"), 1).is_err());
    }

    #[test]
    fn addr_codec() {
        for s in ["127.0.0.1:80", "[::1]:65535"] {
            let a: SocketAddr = s.parse().expect("addr");
            let mut v = Vec::new();
            encode_addr(&a, &mut v);
            assert_eq!(v.len(), ADDR_BYTES);
            assert_eq!(decode_addr(&v).expect("decode"), a);
        }
        assert!(decode_addr(&[4u8; 5]).is_err());
        assert!(decode_addr(&[5u8; ADDR_BYTES]).is_err());
    }
}
