//! The provider's wire format between two contexts: explicit little-endian fields, a magic and
//! version in the hello, every length checked. Never a memcpy of a struct.

use std::io::{self, Read, Write};

/// First bytes of every connection: "TPV" + version 1.
pub const MAGIC: [u8; 4] = *b"TPV1";
/// Largest RDMA message (the port's `max_msg_sz`).
pub const MAX_MSG: u32 = 1 << 31;

const TAG_WRITE: u8 = 1;
const TAG_FADD: u8 = 2;
const TAG_BYE: u8 = 3;
const TAG_ACK: u8 = 4;

/// The connector's hello: which QP it wants to reach and which QP it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// QP number, on the responder's context, that the connection is for.
    pub dst_qpn: u32,
    /// QP number of the connecting (requester) QP.
    pub src_qpn: u32,
}

/// A request from a requester QP to the responder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Followed by `len` payload bytes.
    Write {
        /// Remote key of the responder's memory region being written.
        rkey: u32,
        /// Destination address inside that region.
        addr: u64,
        /// Payload length in bytes (at most [`MAX_MSG`]).
        len: u32,
        /// Immediate data of a write-with-immediate (host order); `None` for a plain write.
        imm: Option<u32>,
    },
    /// An 8-byte fetch-and-add on the responder's memory; answered with the old value.
    FetchAdd {
        /// Remote key of the responder's memory region.
        rkey: u32,
        /// Address of the 8 aligned bytes to add to.
        addr: u64,
        /// The value added.
        add: u64,
    },
    /// The requester QP is going away cleanly.
    Bye,
}

/// A response from the responder, in request order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response {
    /// `status` is an `ibv_wc_status`; `value` the old value of a fetch-and-add.
    Ack {
        /// `ibv_wc_status` of the request (0 is success).
        status: u32,
        /// Old value of a fetch-and-add (not meaningful for a write).
        value: u64,
    },
    /// The responder QP is going away cleanly.
    Bye,
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Sends the connector's hello: [`MAGIC`], then `dst_qpn` and `src_qpn` (u32 LE each).
pub fn write_hello(w: &mut impl Write, h: Hello) -> io::Result<()> {
    let mut b = Vec::with_capacity(12);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&h.dst_qpn.to_le_bytes());
    b.extend_from_slice(&h.src_qpn.to_le_bytes());
    w.write_all(&b)
}

/// Reads a hello, failing with `InvalidData` when the magic is not [`MAGIC`].
pub fn read_hello(r: &mut impl Read) -> io::Result<Hello> {
    let mut b = [0u8; 12];
    r.read_exact(&mut b)?;
    if b[..4] != MAGIC {
        return Err(bad(format!(
            "expected hello magic {MAGIC:?}, got {:?}",
            &b[..4]
        )));
    }
    Ok(Hello {
        dst_qpn: u32_at(&b, 4),
        src_qpn: u32_at(&b, 8),
    })
}

/// Sends the responder's answer to a hello: 0 when the QP exists, non-zero (2) when not.
pub fn write_hello_ack(w: &mut impl Write, status: u32) -> io::Result<()> {
    w.write_all(&status.to_le_bytes())
}

/// Reads the responder's answer to a hello (0: accepted).
pub fn read_hello_ack(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// Encodes a request header (the payload of a write follows separately).
pub fn encode_request(req: &Request) -> Vec<u8> {
    let mut b = Vec::with_capacity(24);
    match *req {
        Request::Write {
            rkey,
            addr,
            len,
            imm,
        } => {
            b.push(TAG_WRITE);
            b.extend_from_slice(&rkey.to_le_bytes());
            b.extend_from_slice(&addr.to_le_bytes());
            b.extend_from_slice(&len.to_le_bytes());
            b.push(u8::from(imm.is_some()));
            b.extend_from_slice(&imm.unwrap_or(0).to_le_bytes());
        }
        Request::FetchAdd { rkey, addr, add } => {
            b.push(TAG_FADD);
            b.extend_from_slice(&rkey.to_le_bytes());
            b.extend_from_slice(&addr.to_le_bytes());
            b.extend_from_slice(&add.to_le_bytes());
        }
        Request::Bye => b.push(TAG_BYE),
    }
    b
}

/// Reads one request header (not a write's payload), checking tag, length and imm flag.
pub fn read_request(r: &mut impl Read) -> io::Result<Request> {
    let mut tag = [0u8; 1];
    r.read_exact(&mut tag)?;
    match tag[0] {
        TAG_WRITE => {
            let mut b = [0u8; 21];
            r.read_exact(&mut b)?;
            let len = u32_at(&b, 12);
            if len > MAX_MSG {
                return Err(bad(format!(
                    "write of {len} bytes exceeds max message {MAX_MSG}"
                )));
            }
            let imm = match b[16] {
                0 => None,
                1 => Some(u32_at(&b, 17)),
                f => return Err(bad(format!("expected imm flag 0 or 1, got {f}"))),
            };
            Ok(Request::Write {
                rkey: u32_at(&b, 0),
                addr: u64_at(&b, 4),
                len,
                imm,
            })
        }
        TAG_FADD => {
            let mut b = [0u8; 20];
            r.read_exact(&mut b)?;
            Ok(Request::FetchAdd {
                rkey: u32_at(&b, 0),
                addr: u64_at(&b, 4),
                add: u64_at(&b, 12),
            })
        }
        TAG_BYE => Ok(Request::Bye),
        t => Err(bad(format!("expected request tag 1..=3, got {t}"))),
    }
}

/// Encodes a response: tag, then for an ack `status` (u32 LE) and `value` (u64 LE).
pub fn encode_response(resp: &Response) -> Vec<u8> {
    let mut b = Vec::with_capacity(13);
    match *resp {
        Response::Ack { status, value } => {
            b.push(TAG_ACK);
            b.extend_from_slice(&status.to_le_bytes());
            b.extend_from_slice(&value.to_le_bytes());
        }
        Response::Bye => b.push(TAG_BYE),
    }
    b
}

/// Reads one response, failing with `InvalidData` on an unknown tag.
pub fn read_response(r: &mut impl Read) -> io::Result<Response> {
    let mut tag = [0u8; 1];
    r.read_exact(&mut tag)?;
    match tag[0] {
        TAG_ACK => {
            let mut b = [0u8; 12];
            r.read_exact(&mut b)?;
            Ok(Response::Ack {
                status: u32_at(&b, 0),
                value: u64_at(&b, 4),
            })
        }
        TAG_BYE => Ok(Response::Bye),
        t => Err(bad(format!("expected response tag 3 or 4, got {t}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        for req in [
            Request::Write {
                rkey: 7,
                addr: 0x1234_5678_9abc,
                len: 99,
                imm: Some(0xdead_beef),
            },
            Request::Write {
                rkey: 1,
                addr: 8,
                len: 0,
                imm: None,
            },
            Request::FetchAdd {
                rkey: 3,
                addr: 16,
                add: u64::MAX,
            },
            Request::Bye,
        ] {
            let b = encode_request(&req);
            assert_eq!(read_request(&mut &b[..]).unwrap(), req);
        }
        for resp in [
            Response::Ack {
                status: 10,
                value: 42,
            },
            Response::Bye,
        ] {
            let b = encode_response(&resp);
            assert_eq!(read_response(&mut &b[..]).unwrap(), resp);
        }
    }

    #[test]
    fn bad_input_is_rejected() {
        assert!(read_request(&mut &[9u8][..]).is_err());
        assert!(read_hello(&mut &b"XXXX\0\0\0\0\0\0\0\0"[..]).is_err());
        let mut w = encode_request(&Request::Write {
            rkey: 1,
            addr: 0,
            len: 0,
            imm: None,
        });
        w[17] = 2; // imm flag
        assert!(read_request(&mut &w[..]).is_err());
        // Truncated header.
        assert!(read_request(&mut &w[..5]).is_err());
    }
}
