//! UniqueId wire format: round trips, and a fuzz over thousands of mutated, truncated and
//! extended ids that must all be rejected with errors, never a panic.

use mscclpp::bootstrap::{TcpBootstrap, UniqueId, UNIQUE_ID_BYTES};
use mscclpp::ErrorCode;

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn valid() -> UniqueId {
    UniqueId::new(
        "10.20.30.40:51234".parse().expect("addr"),
        0xdead_beef_0bad_f00d,
    )
    .expect("id")
}

#[test]
fn round_trip_and_fields() {
    let id = valid();
    let bytes = id.to_bytes();
    assert_eq!(bytes.len(), UNIQUE_ID_BYTES);
    let back = UniqueId::from_bytes(&bytes).expect("valid id parses");
    assert_eq!(back, id);
    assert_eq!(back.root_addr().to_string(), "10.20.30.40:51234");
    assert_eq!(back.nonce(), 0xdead_beef_0bad_f00d);
}

#[test]
fn created_id_round_trips() {
    let id = TcpBootstrap::create_unique_id().expect("create_unique_id");
    assert_ne!(id.root_addr().port(), 0);
    assert_eq!(UniqueId::from_bytes(id.as_bytes()).expect("parse"), id);
    let other = TcpBootstrap::create_unique_id().expect("create_unique_id");
    assert_ne!(id.nonce(), other.nonce());
    assert!(TcpBootstrap::release_unique_id(&id));
    assert!(TcpBootstrap::release_unique_id(&other));
}

#[test]
fn specific_rejections_name_the_problem() {
    let bytes = valid().to_bytes();
    let check = |b: &[u8], needle: &str| {
        let e = UniqueId::from_bytes(b).expect_err("must reject");
        assert_eq!(e.code(), ErrorCode::InvalidUsage);
        assert!(e.to_string().contains(needle), "{e} (wanted {needle:?})");
    };
    check(&bytes[..127], "expected 128 bytes, got 127");
    check(&[], "expected 128 bytes, got 0");
    let mut long = bytes.to_vec();
    long.push(0);
    check(&long, "expected 128 bytes, got 129");
    let mut m = bytes;
    m[0] ^= 1;
    check(&m, "magic");
    let mut m = bytes;
    m[8] = 2;
    check(&m, "version");
    let mut m = bytes;
    m[50] = 1;
    check(&m, "checksum");
}

#[test]
fn fuzz_mutations_never_panic_and_are_rejected() {
    let good = valid().to_bytes();
    let mut rng = XorShift(0x1234_5678_9abc_def1);
    let mut rejected = 0;
    for i in 0..20_000 {
        let mut b = good.to_vec();
        match i % 4 {
            0 => {
                // Flip 1..4 random bits.
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(b.len());
                    b[at] ^= 1 << rng.below(8);
                }
            }
            1 => {
                // Overwrite a random run with random bytes.
                let at = rng.below(b.len());
                let len = 1 + rng.below(b.len() - at);
                for x in &mut b[at..at + len] {
                    *x = rng.next() as u8;
                }
            }
            2 => b.truncate(rng.below(b.len())),
            _ => {
                for _ in 0..1 + rng.below(64) {
                    b.push(rng.next() as u8);
                }
            }
        }
        if b == good {
            continue; // two flips of one bit, or a run rewritten with its own bytes
        }
        let r = std::panic::catch_unwind(|| UniqueId::from_bytes(&b));
        let parsed = r.unwrap_or_else(|_| panic!("from_bytes panicked on case {i}: {b:02x?}"));
        match parsed {
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::InvalidUsage);
                rejected += 1;
            }
            Ok(id) => panic!("case {i}: malformed id accepted: {id:?}"),
        }
    }
    assert!(rejected > 19_000, "{rejected}");
}

#[test]
fn fuzz_random_bytes_rejected() {
    let mut rng = XorShift(42);
    for _ in 0..5_000 {
        let len = rng.below(300);
        let b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        assert!(UniqueId::from_bytes(&b).is_err());
    }
}
