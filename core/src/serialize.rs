//! A small explicit wire format shared by [`crate::Endpoint`] and [`crate::RegisteredMemory`],
//! and the codecs of the values they carry (devices, socket addresses).
//!
//! Every message is `magic (4 bytes) | version (u16) | body length (u32) | body`, all little
//! endian. The reader checks the magic, the version and that the body length matches the bytes
//! that came exactly (no truncation, no trailing bytes); every field read afterwards is
//! bounds-checked and an error names the message, the field, what was expected and what came.
//! Nothing here ever panics on any input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::error::{Error, Result};
use crate::transport::Device;

/// Bytes before the body: magic, version, body length.
pub(crate) const HEADER_LEN: usize = 4 + 2 + 4;
/// The largest body any message of this crate may have.
pub(crate) const MAX_BODY_LEN: usize = 64 * 1024;

/// The largest transport payload an endpoint (or a memory's transport info) may carry.
pub const MAX_TRANSPORT_PAYLOAD: usize = 4096;

/// Builds one message.
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// Starts a message with `magic` and `version`; the length is filled in by [`Writer::finish`].
    pub(crate) fn new(magic: &[u8; 4], version: u16) -> Writer {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(magic);
        buf.extend_from_slice(&version.to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes());
        Writer { buf }
    }
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u32` length followed by the bytes.
    pub(crate) fn blob(&mut self, bytes: &[u8]) -> &mut Self {
        self.u32(bytes.len() as u32);
        self.buf.extend_from_slice(bytes);
        self
    }
    /// Writes the body length into the header and returns the message.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let body = (self.buf.len() - HEADER_LEN) as u32;
        self.buf[6..10].copy_from_slice(&body.to_le_bytes());
        self.buf
    }
}

/// Reads one message, checking every length.
pub(crate) struct Reader<'a> {
    what: &'static str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Checks the header of `bytes` (a `what` message: `magic`, `version`) and positions the
    /// reader at the start of the body.
    pub(crate) fn new(
        what: &'static str,
        bytes: &'a [u8],
        magic: &[u8; 4],
        version: u16,
    ) -> Result<Reader<'a>> {
        if bytes.len() < HEADER_LEN {
            return Err(Error::invalid(format!(
                "{what}: expected at least {HEADER_LEN} header bytes, got {}",
                bytes.len()
            )));
        }
        if &bytes[..4] != magic {
            return Err(Error::invalid(format!(
                "{what}: expected magic {:?}, got {:?}",
                String::from_utf8_lossy(magic),
                &bytes[..4]
            )));
        }
        let got_version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if got_version != version {
            return Err(Error::invalid(format!(
                "{what}: expected format version {version}, got {got_version}"
            )));
        }
        let body = u32::from_le_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]) as usize;
        if body > MAX_BODY_LEN {
            return Err(Error::invalid(format!(
                "{what}: body length: expected at most {MAX_BODY_LEN} bytes, got {body}"
            )));
        }
        if bytes.len() - HEADER_LEN != body {
            return Err(Error::invalid(format!(
                "{what}: expected {body} body bytes (as the header says), got {}",
                bytes.len() - HEADER_LEN
            )));
        }
        Ok(Reader {
            what,
            bytes,
            pos: HEADER_LEN,
        })
    }

    fn take(&mut self, field: &str, n: usize) -> Result<&'a [u8]> {
        let left = self.bytes.len() - self.pos;
        if n > left {
            return Err(Error::invalid(format!(
                "{}: field {field}: expected {n} more bytes, got {left}",
                self.what
            )));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }
    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N]> {
        let s = self.take(field, N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }
    pub(crate) fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.array::<1>(field)?[0])
    }
    pub(crate) fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn i32(&mut self, field: &str) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn u64(&mut self, field: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    /// A `u32` length (at most `max`) followed by that many bytes.
    pub(crate) fn blob(&mut self, field: &str, max: usize) -> Result<&'a [u8]> {
        let n = self.u32(field)? as usize;
        if n > max {
            return Err(Error::invalid(format!(
                "{}: field {field}: expected a length of at most {max}, got {n}",
                self.what
            )));
        }
        self.take(field, n)
    }
    /// An error about `field` of this message.
    pub(crate) fn bad(&self, field: &str, expected: &str, got: impl std::fmt::Display) -> Error {
        Error::invalid(format!(
            "{}: field {field}: expected {expected}, got {got}",
            self.what
        ))
    }
    /// Checks that the whole body was consumed.
    pub(crate) fn finish(self) -> Result<()> {
        let left = self.bytes.len() - self.pos;
        if left != 0 {
            return Err(Error::invalid(format!(
                "{}: expected nothing after the last field, got {left} more bytes",
                self.what
            )));
        }
        Ok(())
    }
}

// Codecs of the small values several messages carry (devices, socket addresses).

/// Decodes a device kind and id as written in endpoints and memories.
pub(crate) fn decode_device(r: &Reader<'_>, kind: u8, id: i32) -> Result<Device> {
    match kind {
        0 if id == -1 => Ok(Device::CPU),
        0 => Err(r.bad("device id", "-1 for the CPU", id)),
        1 if id >= 0 => Ok(Device::gpu(id)),
        1 => Err(r.bad("device id", "a GPU ordinal >= 0", id)),
        k => Err(r.bad("device kind", "0 (CPU) or 1 (GPU)", k)),
    }
}

/// `family u8 (4|6) | 16 address bytes | port u16`.
pub(crate) fn encode_socket_addr(addr: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(19);
    let mut ip = [0u8; 16];
    match addr.ip() {
        IpAddr::V4(v4) => {
            out.push(4);
            ip[..4].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.push(6);
            ip.copy_from_slice(&v6.octets());
        }
    }
    out.extend_from_slice(&ip);
    out.extend_from_slice(&addr.port().to_le_bytes());
    out
}

pub(crate) fn decode_socket_addr(b: &[u8]) -> Result<SocketAddr> {
    if b.len() != 19 {
        return Err(Error::invalid(format!(
            "Ethernet endpoint address: expected 19 bytes, got {}",
            b.len()
        )));
    }
    let port = u16::from_le_bytes([b[17], b[18]]);
    if port == 0 {
        return Err(Error::invalid(
            "Ethernet endpoint address: expected a port above 0, got 0".to_string(),
        ));
    }
    let mut ip16 = [0u8; 16];
    ip16.copy_from_slice(&b[1..17]);
    let ip = match b[0] {
        4 => {
            if ip16[4..].iter().any(|&x| x != 0) {
                return Err(Error::invalid(
                    "Ethernet endpoint address: expected zero padding after an IPv4 address"
                        .to_string(),
                ));
            }
            IpAddr::V4(Ipv4Addr::new(ip16[0], ip16[1], ip16[2], ip16[3]))
        }
        6 => IpAddr::V6(Ipv6Addr::from(ip16)),
        f => {
            return Err(Error::invalid(format!(
                "Ethernet endpoint address: expected family 4 or 6, got {f}"
            )))
        }
    };
    Ok(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checks() {
        let mut w = Writer::new(b"TEST", 3);
        w.u8(7).u32(70000).i32(-5).u64(u64::MAX).blob(b"abc");
        let bytes = w.finish();
        let mut r = Reader::new("test", &bytes, b"TEST", 3).unwrap();
        assert_eq!(r.u8("a").unwrap(), 7);
        assert_eq!(r.u32("c").unwrap(), 70000);
        assert_eq!(r.i32("d").unwrap(), -5);
        assert_eq!(r.u64("e").unwrap(), u64::MAX);
        assert_eq!(r.blob("f", 3).unwrap(), b"abc");
        r.finish().unwrap();

        assert!(Reader::new("test", &bytes, b"TEST", 4).is_err());
        assert!(Reader::new("test", &bytes, b"TESS", 3).is_err());
        assert!(Reader::new("test", &bytes[..bytes.len() - 1], b"TEST", 3).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Reader::new("test", &longer, b"TEST", 3).is_err());
        let mut r = Reader::new("test", &bytes, b"TEST", 3).unwrap();
        r.u8("a").unwrap();
        assert!(r
            .finish()
            .unwrap_err()
            .to_string()
            .contains("nothing after the last field"));
        let mut r = Reader::new("test", &bytes, b"TEST", 3).unwrap();
        r.u64("x").unwrap();
        r.u64("y").unwrap();
        r.u8("z").unwrap();
        assert!(r.blob("f", 2).is_err());
    }
}
