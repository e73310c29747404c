//! `Api::register_host` on the host backend: the device pointer of a registered `Vec` buffer is
//! its host address, device-side operations through that address reach the `Vec`, dropping the
//! registration leaves the memory alone, and bad arguments are refused with `InvalidArgument`.

use mscclpp_hal::api::Host;
use mscclpp_hal::{prelude::*, Error};

const WORDS: usize = 4096 + 13; // not a page multiple on purpose

fn open() -> <Host as Api>::Device {
    Host::open_device(0).expect("the host backend always has device 0")
}

/// Ends a registration the way any backend's caller does (its `Drop`; nothing on the host).
fn unregister<A: Api>(reg: A::HostRegistration) {
    drop(reg);
}

#[test]
fn device_pointer_is_the_host_address_and_reaches_the_vec() {
    let dev = open();
    let mut words = vec![0u32; WORDS];
    let ptr = words.as_mut_ptr().cast::<u8>();
    let len = WORDS * 4;
    // SAFETY: `words` is not resized or dropped until after the registration is dropped.
    let reg = unsafe { Host::register_host(&dev, ptr, len) }.expect("register a Vec buffer");
    let dptr = Host::host_registration_device_ptr(&reg);
    assert_eq!(
        dptr, ptr as usize as u64,
        "device pointer must be the host address"
    );
    assert_eq!(reg.host_ptr(), ptr);
    assert_eq!(reg.len(), len);
    assert!(!reg.is_empty());

    // Device-side operations on the device pointer land in the Vec.
    let stream = Host::create_stream(&dev).expect("host stream");
    // SAFETY: bytes 4..8 of the registered range are live; nothing else touches them now.
    unsafe { Host::memset_async(&stream, dptr + 4, 0x5a, 4) }.expect("memset through dptr");
    let src: Vec<u32> = (0..16u32)
        .map(|i| i.wrapping_mul(0x0101_0101) ^ 0xdead)
        .collect();
    let tail = (WORDS - 16) as u64 * 4;
    // SAFETY: the last 64 bytes of the registered range are live and distinct from `src`.
    unsafe { Host::memcpy_async(&stream, dptr + tail, src.as_ptr() as usize as u64, 64) }
        .expect("memcpy through dptr");
    // A Vec<u32> is only 4-byte aligned: pick a word index whose address is 8-byte aligned.
    let slot = (0..WORDS / 2)
        .map(|w| 2 * w)
        .find(|w| (ptr as usize + w * 4).is_multiple_of(8) && *w >= 4)
        .expect("an 8-byte aligned u64 slot after word 4");
    // SAFETY: `slot` names an aligned, live u64 inside the registered range.
    unsafe { Host::write_value64_async(&stream, dptr + slot as u64 * 4, 0x1122_3344_5566_7788) }
        .expect("write_value64 through dptr");
    Host::stream_synchronize(&stream, std::time::Duration::from_secs(1)).expect("sync");
    unregister::<Host>(reg);

    assert_eq!(words[0], 0);
    assert_eq!(words[1], 0x5a5a_5a5a);
    assert_eq!(words[2], 0);
    assert_eq!(&words[WORDS - 16..], &src[..]);
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&words[slot].to_ne_bytes());
    b[4..].copy_from_slice(&words[slot + 1].to_ne_bytes());
    assert_eq!(
        u64::from_ne_bytes(b),
        0x1122_3344_5566_7788,
        "u64 at word {slot}"
    );
    let untouched = words
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1 && *i != slot && *i != slot + 1 && *i < WORDS - 16)
        .filter(|(_, w)| **w != 0)
        .count();
    assert_eq!(untouched, 0, "words outside the written ranges changed");
}

#[test]
fn dropping_a_registration_leaves_the_memory_and_records_nothing() {
    let dev = open();
    let mut bytes: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let expected = bytes.clone();
    for _ in 0..3 {
        // SAFETY: `bytes` outlives each registration and is not resized meanwhile.
        let reg = unsafe { Host::register_host(&dev, bytes.as_mut_ptr(), bytes.len()) }
            .expect("register the same range again after the previous drop");
        assert_eq!(
            Host::host_registration_device_ptr(&reg),
            bytes.as_ptr() as usize as u64
        );
        unregister::<Host>(reg);
    }
    assert_eq!(bytes, expected, "drop must not touch the registered memory");
    bytes[9_999] = 7;
    assert_eq!(bytes[9_999], 7, "memory stays writable after unregistering");
    // A drop-time failure would surface as Error::Deferred on the next fallible call.
    Host::device_count().expect("no deferred error from dropping host registrations");
}

fn expect_invalid(r: Result<impl std::fmt::Debug, Error>, wants: &str) {
    match r {
        Err(Error::InvalidArgument { op, expected, got }) => {
            assert_eq!(op, "register_host(host)");
            assert!(
                expected.contains(wants),
                "expected text {expected:?} should mention {wants:?} (got {got:?})"
            );
        }
        other => panic!("wanted InvalidArgument mentioning {wants:?}, got {other:?}"),
    }
}

#[test]
fn bad_arguments_are_refused() {
    let dev = open();
    let mut buf = [0u8; 64];
    // SAFETY: refused before anything dereferences the pointer.
    expect_invalid(
        unsafe { Host::register_host(&dev, std::ptr::null_mut(), 64) },
        "non-null",
    );
    // SAFETY: refused before anything dereferences the pointer.
    expect_invalid(
        unsafe { Host::register_host(&dev, buf.as_mut_ptr(), 0) },
        "non-zero length",
    );
    // SAFETY: refused before anything dereferences the pointer.
    expect_invalid(
        unsafe { Host::register_host(&dev, buf.as_mut_ptr(), usize::MAX) },
        "address space",
    );
    // The buffer is still fine for a valid registration afterwards.
    // SAFETY: `buf` outlives the registration.
    let reg = unsafe { Host::register_host(&dev, buf.as_mut_ptr(), buf.len()) }
        .expect("valid registration");
    assert_eq!(reg.len(), 64);
}
