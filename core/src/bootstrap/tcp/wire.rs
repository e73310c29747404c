//! The bootstrap's wire, as pure codecs (no sockets, so they are fuzzed on their own): a
//! rank's hello to the root, the root's reply (the address table or an abort), the peer
//! handshake, and the frames peers exchange afterwards, decoded incrementally with memory
//! committed only as bytes arrive. Everything is little endian.
//!
//! | message | layout |
//! |---|---|
//! | hello (53 bytes) | magic `MSBH` u32, version u16, rank u32, nranks u32, nonce u64, host hash u64, listen address (23) |
//! | acknowledgement (1 byte) | 2 u8: the root took the hello (sent at once; the table or an abort follows) |
//! | table | 0 u8, session u64, nranks u32, nranks x (address (23), host hash u64) |
//! | abort | 1 u8, code u8, length u32 (at most 64 KiB), UTF-8 message |
//! | peer handshake (18 bytes) | magic `MSBP` u32, version u16, session u64, rank u32 |
//! | frame | kind u8 (0 user, 1 collective), tag u64, length u64 (at most [`MAX_MESSAGE_BYTES`]), payload |
//!
//! An address is family u8 (4 or 6), IP (16), port u16, IPv6 scope id u32. Version 3 (this
//! one) acknowledges each accepted hello at once; version 2 added the job key's hash as the
//! nonce in `ip:port` mode (version 1 carried 0). Abort codes: 0 timeout, 1 this rank refused,
//! 2 rank 0 failed, 3 another rank of the job was refused.

use std::net::SocketAddr;
use std::time::Duration;

use crate::bootstrap::socket::Deadline;
use crate::bootstrap::unique_id::{decode_addr, encode_addr, ADDR_BYTES};

pub(super) const HELLO_MAGIC: u32 = 0x4d53_4248; // "MSBH"
pub(super) const PEER_MAGIC: u32 = 0x4d53_4250; // "MSBP"
/// 3: the root acknowledges each accepted hello at once ([`REPLY_ACK`]).
pub(super) const WIRE_VERSION: u16 = 3;
pub(super) const HELLO_BYTES: usize = 4 + 2 + 4 + 4 + 8 + 8 + ADDR_BYTES;
pub(super) const PEER_HELLO_BYTES: usize = 4 + 2 + 8 + 4;
pub(super) const REPLY_OK: u8 = 0;
pub(super) const REPLY_ABORT: u8 = 1;
/// One byte the root sends as soon as it accepted a hello, before the table (which comes once
/// every rank is in): an `ip:port` joiner that gets no such byte within [`ROOT_ACK_WAIT`] is
/// not talking to a bootstrap root (another program took the port).
pub(super) const REPLY_ACK: u8 = 2;
/// How long a joiner waits for [`REPLY_ACK`] after its hello.
pub(super) const ROOT_ACK_WAIT: Duration = Duration::from_secs(5);
/// Abort codes: some rank never came; this joiner was refused; rank 0 failed on its own.
pub(super) const ABORT_TIMEOUT: u8 = 0;
pub(super) const ABORT_INVALID: u8 = 1;
pub(super) const ABORT_ROOT_FAILED: u8 = 2;
/// The root refused a rank of this job (right nonce, wrong nranks, rank or a second copy): the
/// job cannot complete, so every rank is told at once.
pub(super) const ABORT_PEER_REFUSED: u8 = 3;
pub(super) const MAX_ABORT_MSG: usize = 64 * 1024;
const TABLE_HEAD: usize = 1 + 8 + 4;
const ABORT_HEAD: usize = 1 + 1 + 4;
const TABLE_ENTRY: usize = ADDR_BYTES + 8;
pub(super) const FRAME_HEADER: usize = 1 + 8 + 8;
pub(super) const KIND_USER: u8 = 0;
pub(super) const KIND_COLLECTIVE: u8 = 1;
/// The tag of the empty collective-kind frame a rank sends every peer when it closes its
/// bootstrap on purpose: its closed connection then does not count as a failure.
pub(super) const TAG_GOODBYE: u64 = u64::MAX;

/// The largest message [`TcpBootstrap`](super::TcpBootstrap) sends or accepts: 2 GiB - 1
/// bytes (upstream's `int` size). A receiver commits memory for a message only as its bytes
/// arrive (at most twice what arrived, plus 64 KiB), so a header announcing the maximum costs
/// nothing until the data comes.
pub const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;

/// The first allocation for a message's payload; it then doubles as bytes arrive.
pub(super) const FIRST_CHUNK: usize = 64 * 1024;

/// How long past the deadline a rank waits for the root's answer (the root sends its abort
/// at the deadline).
pub(super) const ROOT_REPLY_GRACE: Duration = Duration::from_millis(100);

/// How long an accepted connection may take to send its first message: a real rank sends it
/// at once. Connections are served concurrently, so this only bounds what a silent one holds.
pub(super) fn first_bytes_deadline(deadline: &Deadline) -> Deadline {
    deadline.capped(Duration::from_secs(5))
}

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

fn check_len(b: &[u8], want: usize, what: &str) -> Result<(), String> {
    if b.len() < want {
        return Err(format!("{what}: expected {want} bytes, got {}", b.len()));
    }
    Ok(())
}

/// A rank's hello to the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) rank: u32,
    pub(super) nranks: u32,
    pub(super) nonce: u64,
    pub(super) host_hash: u64,
    pub(super) listen: SocketAddr,
}

/// Why a hello was not decoded: not a bootstrap client at all (close silently), or one that
/// deserves an answer (another wire version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum HelloError {
    NotBootstrap(String),
    Version(String),
}

impl std::fmt::Display for HelloError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HelloError::NotBootstrap(m) | HelloError::Version(m) => f.write_str(m),
        }
    }
}

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HELLO_BYTES);
        v.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
        v.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        v.extend_from_slice(&self.rank.to_le_bytes());
        v.extend_from_slice(&self.nranks.to_le_bytes());
        v.extend_from_slice(&self.nonce.to_le_bytes());
        v.extend_from_slice(&self.host_hash.to_le_bytes());
        encode_addr(&self.listen, &mut v);
        v
    }

    /// Decodes the first [`HELLO_BYTES`] of `b`.
    pub(super) fn decode(b: &[u8]) -> Result<Hello, HelloError> {
        check_len(b, HELLO_BYTES, "hello").map_err(HelloError::NotBootstrap)?;
        let magic = rd_u32(b, 0);
        if magic != HELLO_MAGIC {
            return Err(HelloError::NotBootstrap(format!(
                "expected hello magic {HELLO_MAGIC:#x}, got {magic:#x} (not a bootstrap client?)"
            )));
        }
        let version = rd_u16(b, 4);
        if version != WIRE_VERSION {
            return Err(HelloError::Version(format!(
                "expected bootstrap wire version {WIRE_VERSION}, got {version} (mixed mscclpp versions?)"
            )));
        }
        let listen = decode_addr(&b[30..])
            .map_err(|e| HelloError::NotBootstrap(format!("hello listen address: {e}")))?;
        if listen.port() == 0 || listen.ip().is_unspecified() {
            return Err(HelloError::NotBootstrap(format!(
                "hello listen address {listen}: expected a concrete IP and a non-zero port"
            )));
        }
        Ok(Hello {
            rank: rd_u32(b, 6),
            nranks: rd_u32(b, 10),
            nonce: rd_u64(b, 14),
            host_hash: rd_u64(b, 22),
            listen,
        })
    }
}

/// The handshake a rank sends to each lower rank it connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PeerHello {
    pub(super) session: u64,
    pub(super) rank: u32,
}

impl PeerHello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(PEER_HELLO_BYTES);
        v.extend_from_slice(&PEER_MAGIC.to_le_bytes());
        v.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        v.extend_from_slice(&self.session.to_le_bytes());
        v.extend_from_slice(&self.rank.to_le_bytes());
        v
    }

    pub(super) fn decode(b: &[u8]) -> Result<PeerHello, String> {
        check_len(b, PEER_HELLO_BYTES, "peer handshake")?;
        let (magic, version) = (rd_u32(b, 0), rd_u16(b, 4));
        if magic != PEER_MAGIC || version != WIRE_VERSION {
            return Err(format!(
                "expected peer handshake magic {PEER_MAGIC:#x} version {WIRE_VERSION}, got \
                 {magic:#x} version {version}"
            ));
        }
        Ok(PeerHello {
            session: rd_u64(b, 6),
            rank: rd_u32(b, 14),
        })
    }
}

/// The root's answer to a hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    /// Every rank's listen address and host hash, and the session number of the mesh.
    Table {
        session: u64,
        entries: Vec<(SocketAddr, u64)>,
    },
    /// Setup failed: `code` is one of the `ABORT_*` constants.
    Abort { code: u8, msg: String },
}

pub(super) fn encode_table(session: u64, entries: &[(SocketAddr, u64)]) -> Vec<u8> {
    let mut v = Vec::with_capacity(TABLE_HEAD + entries.len() * TABLE_ENTRY);
    v.push(REPLY_OK);
    v.extend_from_slice(&session.to_le_bytes());
    v.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (addr, hash) in entries {
        encode_addr(addr, &mut v);
        v.extend_from_slice(&hash.to_le_bytes());
    }
    v
}

/// An abort reply; the message is cut to [`MAX_ABORT_MSG`] bytes (at a character boundary).
pub(super) fn encode_abort(code: u8, msg: &str) -> Vec<u8> {
    let mut end = msg.len().min(MAX_ABORT_MSG);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    let msg = &msg.as_bytes()[..end];
    let mut v = vec![REPLY_ABORT, code];
    v.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    v.extend_from_slice(msg);
    v
}

/// The whole length of the reply that starts with `head`, once `head` says it (`Ok(None)`:
/// read more first). `nranks` is what the reader expects the table to hold.
pub(super) fn reply_len(head: &[u8], nranks: usize) -> Result<Option<usize>, String> {
    match head.first() {
        None => Ok(None),
        Some(&REPLY_OK) if head.len() < TABLE_HEAD => Ok(None),
        Some(&REPLY_OK) => {
            let n = rd_u32(head, 9) as usize;
            if n != nranks {
                return Err(format!("a table of {n} ranks: expected {nranks}"));
            }
            Ok(Some(TABLE_HEAD + n * TABLE_ENTRY))
        }
        Some(&REPLY_ABORT) if head.len() < ABORT_HEAD => Ok(None),
        Some(&REPLY_ABORT) => {
            let len = rd_u32(head, 2) as usize;
            if len > MAX_ABORT_MSG {
                return Err(format!(
                    "an abort message of {len} bytes: expected at most {MAX_ABORT_MSG}"
                ));
            }
            Ok(Some(ABORT_HEAD + len))
        }
        Some(s) => Err(format!(
            "reply status {s}: expected {REPLY_OK} (table) or {REPLY_ABORT} (abort)"
        )),
    }
}

/// Decodes a whole reply (exactly `reply_len` bytes) for a group of `nranks`.
pub(super) fn decode_reply(b: &[u8], nranks: usize) -> Result<Reply, String> {
    let Some(len) = reply_len(b, nranks)? else {
        return Err(format!("a reply of {} bytes: expected more", b.len()));
    };
    if b.len() != len {
        return Err(format!("a reply of {} bytes: expected {len}", b.len()));
    }
    if b[0] == REPLY_ABORT {
        return Ok(Reply::Abort {
            code: b[1],
            msg: String::from_utf8_lossy(&b[ABORT_HEAD..]).into_owned(),
        });
    }
    let mut entries = Vec::with_capacity(nranks);
    for (r, e) in b[TABLE_HEAD..].chunks_exact(TABLE_ENTRY).enumerate() {
        let addr = decode_addr(e).map_err(|e| format!("table entry of rank {r}: {e}"))?;
        entries.push((addr, rd_u64(e, ADDR_BYTES)));
    }
    Ok(Reply::Table {
        session: rd_u64(b, 1),
        entries,
    })
}

/// A frame's header.
pub(super) fn encode_frame_header(kind: u8, tag: u64, len: usize) -> [u8; FRAME_HEADER] {
    let mut h = [0u8; FRAME_HEADER];
    h[0] = kind;
    h[1..9].copy_from_slice(&tag.to_le_bytes());
    h[9..].copy_from_slice(&(len as u64).to_le_bytes());
    h
}

/// A complete frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Frame {
    pub(super) kind: u8,
    pub(super) tag: u64,
    pub(super) payload: Vec<u8>,
}

/// Reassembles frames from a byte stream fed in pieces of any size. A header is checked
/// before any payload memory is committed (kind 0 or 1, length at most
/// [`MAX_MESSAGE_BYTES`]); the payload buffer starts at [`FIRST_CHUNK`] and doubles only as
/// bytes arrive, so the memory held is at most twice what arrived plus [`FIRST_CHUNK`].
#[derive(Debug, Default)]
pub(super) struct FrameDecoder {
    header: [u8; FRAME_HEADER],
    have: usize,
    /// The frame being received: kind, tag, announced length, payload so far.
    current: Option<(u8, u64, usize, Vec<u8>)>,
}

impl FrameDecoder {
    /// Consumes `bytes`, calling `done` for every frame they complete. After an error the
    /// stream is corrupt and the decoder must not be fed again.
    pub(super) fn feed(
        &mut self,
        mut bytes: &[u8],
        done: &mut dyn FnMut(Frame),
    ) -> Result<(), String> {
        while !bytes.is_empty() {
            let Some((_, _, len, payload)) = &mut self.current else {
                let take = (FRAME_HEADER - self.have).min(bytes.len());
                self.header[self.have..self.have + take].copy_from_slice(&bytes[..take]);
                self.have += take;
                bytes = &bytes[take..];
                if self.have == FRAME_HEADER {
                    self.have = 0;
                    self.start_frame(done)?;
                }
                continue;
            };
            let take = (*len - payload.len()).min(bytes.len());
            if payload.capacity() - payload.len() < take {
                let want = (payload.capacity() * 2).max(payload.len() + take).min(*len);
                payload
                    .try_reserve_exact(want - payload.len())
                    .map_err(|_| format!("cannot allocate {want} bytes for a message"))?;
            }
            payload.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if payload.len() == *len {
                if let Some((kind, tag, _, payload)) = self.current.take() {
                    done(Frame { kind, tag, payload });
                }
            }
        }
        Ok(())
    }

    fn start_frame(&mut self, done: &mut dyn FnMut(Frame)) -> Result<(), String> {
        let kind = self.header[0];
        let tag = rd_u64(&self.header, 1);
        let len = rd_u64(&self.header, 9);
        if kind > KIND_COLLECTIVE {
            return Err(format!(
                "a frame of kind {kind}: expected {KIND_USER} (user) or {KIND_COLLECTIVE} (collective)"
            ));
        }
        if len > MAX_MESSAGE_BYTES as u64 {
            return Err(format!(
                "a frame announcing {len} bytes: expected a length up to {MAX_MESSAGE_BYTES}"
            ));
        }
        let len = len as usize;
        if len == 0 {
            done(Frame {
                kind,
                tag,
                payload: Vec::new(),
            });
            return Ok(());
        }
        let mut payload = Vec::new();
        payload
            .try_reserve_exact(len.min(FIRST_CHUNK))
            .map_err(|_| {
                format!(
                    "cannot allocate {} bytes for a message",
                    len.min(FIRST_CHUNK)
                )
            })?;
        self.current = Some((kind, tag, len, payload));
        Ok(())
    }

    /// Payload memory held now, in bytes (the fuzz targets check its bound).
    #[cfg(test)]
    pub(super) fn committed(&self) -> usize {
        self.current.as_ref().map_or(0, |(_, _, _, p)| p.capacity())
    }

    /// The frame in flight: (received, announced) bytes, or `None` between frames.
    pub(super) fn partial(&self) -> Option<(usize, usize)> {
        match &self.current {
            Some((_, _, len, p)) => Some((p.len(), *len)),
            None if self.have > 0 => Some((self.have, FRAME_HEADER)),
            None => None,
        }
    }
}
