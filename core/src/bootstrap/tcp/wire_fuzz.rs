//! Property-based fuzzing of the bootstrap wire (`wire.rs`): hello, peer handshake, the root's
//! reply (table / abort) and the frame decoder, on random and mutated input. Properties: no
//! panic, an `Err` that says what was expected, round trips of valid messages, and memory
//! committed by the frame decoder bounded by what arrived.
//!
//! Budget: `MSCCLPP_FUZZ_CASES` cases per target (default 256, what CI runs). Long mode:
//! `MSCCLPP_FUZZ_CASES=1000000 cargo test --release -p mscclpp --lib bootstrap::tcp::wire_fuzz`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use proptest::prelude::*;

use super::wire::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: mscclpp_framework::fuzz_cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), 1u16..)
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port)),
        (any::<[u8; 16]>(), 1u16.., any::<u32>()).prop_map(|(ip, port, scope)| {
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, scope))
        }),
    ]
}

fn hello() -> impl Strategy<Value = Hello> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        addr(),
    )
        .prop_filter("a concrete listen address", |h| !h.4.ip().is_unspecified())
        .prop_map(|(rank, nranks, nonce, host_hash, listen)| Hello {
            rank,
            nranks,
            nonce,
            host_hash,
            listen,
        })
}

/// A frame decoder fed `stream` cut at `cuts`: the frames, the error, and whether the memory
/// bound held after every piece.
fn feed_in_pieces(stream: &[u8], cuts: &[usize]) -> (Vec<Frame>, Option<String>, bool) {
    let mut dec = FrameDecoder::default();
    let mut frames = Vec::new();
    let mut bounded = true;
    let mut at = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    points.push(stream.len());
    points.sort_unstable();
    for p in points {
        if p < at {
            continue;
        }
        let r = dec.feed(&stream[at..p], &mut |f| frames.push(f));
        at = p;
        bounded &= dec.committed() <= 2 * at + FIRST_CHUNK;
        if let Err(e) = r {
            return (frames, Some(e), bounded);
        }
    }
    (frames, None, bounded)
}

fn encode_frames(frames: &[Frame]) -> Vec<u8> {
    let mut v = Vec::new();
    for f in frames {
        v.extend_from_slice(&encode_frame_header(f.kind, f.tag, f.payload.len()));
        v.extend_from_slice(&f.payload);
    }
    v
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn hello_decodes_any_bytes_without_panic(b in proptest::collection::vec(any::<u8>(), 0..80)) {
        if let Err(e) = Hello::decode(&b) {
            prop_assert!(e.to_string().contains("expected"), "{}", e);
        }
    }

    #[test]
    fn hello_round_trips_and_survives_mutation(h in hello(), at in any::<usize>(), byte in any::<u8>()) {
        let mut b = h.encode();
        let original = b.clone();
        prop_assert_eq!(b.len(), HELLO_BYTES);
        prop_assert_eq!(Hello::decode(&b).expect("valid hello"), h);
        let i = at % b.len();
        b[i] = byte;
        match Hello::decode(&b) {
            Ok(_) => prop_assert!(i >= 6 || b == original, "magic or version byte {} mutated yet accepted", i),
            Err(e) => prop_assert!(e.to_string().contains("expected"), "{}", e),
        }
        prop_assert!(Hello::decode(&b[..i.min(HELLO_BYTES - 1)]).is_err());
    }

    #[test]
    fn peer_hello_decodes_any_bytes(b in proptest::collection::vec(any::<u8>(), 0..30),
                                    session in any::<u64>(), rank in any::<u32>()) {
        if let Err(e) = PeerHello::decode(&b) {
            prop_assert!(e.contains("expected"), "{}", e);
        }
        let h = PeerHello { session, rank };
        prop_assert_eq!(PeerHello::decode(&h.encode()).expect("valid"), h);
    }

    #[test]
    fn reply_decodes_any_bytes_with_bounded_length(
        b in proptest::collection::vec(any::<u8>(), 0..200), nranks in 1usize..64
    ) {
        match reply_len(&b, nranks) {
            Ok(Some(total)) => {
                prop_assert!(total <= (13 + nranks * 31).max(6 + MAX_ABORT_MSG), "{}", total);
            }
            Ok(None) => prop_assert!(b.len() < 13),
            Err(e) => prop_assert!(e.contains("expected"), "{}", e),
        }
        if let Err(e) = decode_reply(&b, nranks) {
            prop_assert!(e.contains("expected"), "{}", e);
        }
    }

    #[test]
    fn reply_round_trips(
        session in any::<u64>(),
        entries in proptest::collection::vec((addr(), any::<u64>()), 1..20),
        code in 0u8..4,
        msg in "\\PC{0,100}",
    ) {
        let n = entries.len();
        let t = encode_table(session, &entries);
        prop_assert_eq!(reply_len(&t[..13], n).expect("len"), Some(t.len()));
        prop_assert_eq!(decode_reply(&t, n).expect("table"), Reply::Table { session, entries });
        prop_assert!(decode_reply(&t, n + 1).is_err());
        prop_assert!(decode_reply(&t[..t.len() - 1], n).is_err());
        let a = encode_abort(code, &msg);
        prop_assert_eq!(decode_reply(&a, n).expect("abort"), Reply::Abort { code, msg });
    }

    #[test]
    fn frames_reassemble_from_any_cuts(
        frames in proptest::collection::vec(
            (0u8..2, any::<u64>(), proptest::collection::vec(any::<u8>(), 0..3000))
                .prop_map(|(kind, tag, payload)| Frame { kind, tag, payload }),
            0..8),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let stream = encode_frames(&frames);
        let (got, err, bounded) = feed_in_pieces(&stream, &cuts);
        prop_assert!(err.is_none(), "{:?}", err);
        prop_assert!(bounded);
        prop_assert_eq!(got, frames);
    }

    #[test]
    fn hostile_streams_commit_memory_only_as_bytes_arrive(
        kind in 0u8..3,
        tag in any::<u64>(),
        len in prop_oneof![any::<u64>(), Just(MAX_MESSAGE_BYTES as u64), Just(1u64 << 31), Just(8u64 << 30)],
        tail in proptest::collection::vec(any::<u8>(), 0..5000),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        // At most the announced payload follows: one frame, complete or not.
        let tail = &tail[..tail.len().min(usize::try_from(len).unwrap_or(usize::MAX))];
        let mut stream = encode_frame_header(kind, tag, 0).to_vec();
        stream[9..17].copy_from_slice(&len.to_le_bytes());
        stream.extend_from_slice(tail);
        let (got, err, bounded) = feed_in_pieces(&stream, &cuts);
        prop_assert!(bounded, "more memory committed than 2 x arrived + {}", FIRST_CHUNK);
        match err {
            Some(e) => {
                prop_assert!(e.contains("expected"), "{}", e);
                prop_assert!(kind > 1 || len > MAX_MESSAGE_BYTES as u64, "{}", e);
            }
            None => {
                prop_assert!(kind <= 1 && len <= MAX_MESSAGE_BYTES as u64);
                // Complete only when the whole announced payload came.
                prop_assert_eq!(got.is_empty(), len as usize > tail.len());
            }
        }
    }

    #[test]
    fn random_streams_never_panic(
        stream in proptest::collection::vec(any::<u8>(), 0..400),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let (_, err, bounded) = feed_in_pieces(&stream, &cuts);
        prop_assert!(bounded);
        if let Some(e) = err {
            prop_assert!(e.contains("expected"), "{}", e);
        }
    }
}
