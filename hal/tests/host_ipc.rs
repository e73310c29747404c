//! Host backend IPC across processes: this test exports memfd memory, a child process (this
//! same test binary, role chosen by an env var) imports it, checks the pattern and writes new
//! random data, and the parent verifies it.

use mscclpp_hal::api::Host;
use mscclpp_hal::{prelude::*, Buffer, IpcDescriptor, MemoryKind};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

const ROLE: &str = "MSCCLPP_HAL_TEST_ROLE";
const DESC: &str = "MSCCLPP_HAL_TEST_DESC";
const SEED: &str = "MSCCLPP_HAL_TEST_SEED";
const WORDS: usize = 3 * 4096 / 4 + 7; // not page-aligned on purpose

fn pattern(i: usize, seed: u32) -> u32 {
    seed ^ (i as u32).wrapping_mul(2_654_435_761)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex from parent"))
        .collect()
}

fn random_seed() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mix = (t as u64) ^ (u64::from(std::process::id()) << 32);
    (mix ^ (mix >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15) as u32 | 1
}

fn words_of(buf: &impl Buffer) -> &[u32] {
    let p = buf.host_ptr().expect("host memory is host-accessible");
    // SAFETY: host memory is page-aligned, at least WORDS*4 bytes, alive while `buf` is.
    unsafe { std::slice::from_raw_parts(p.cast::<u32>(), WORDS) }
}

/// Child role: import, check the parent's pattern, write a new one, bump the counter atomically.
fn child() {
    let dev = Host::open_device(0).unwrap();
    let desc = IpcDescriptor::from_bytes(&unhex(&std::env::var(DESC).unwrap())).unwrap();
    let seeds: Vec<u32> = std::env::var(SEED)
        .unwrap()
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let imported = Host::import(&dev, &desc).unwrap();
    assert_eq!(imported.size(), WORDS * 4);
    let writes_data = std::env::var(ROLE).as_deref() == Ok("child-data");
    let w = words_of(&imported);
    for (i, v) in w.iter().enumerate().skip(2).filter(|_| writes_data) {
        assert_eq!(
            *v,
            pattern(i, seeds[0]),
            "child: word {i} of the parent's pattern"
        );
    }
    let mut out = vec![0u8; WORDS * 4];
    for i in 2..WORDS {
        out[4 * i..4 * i + 4].copy_from_slice(&pattern(i, seeds[1]).to_le_bytes());
    }
    if writes_data {
        Host::write(&dev, &imported, 8, &out[8..]).unwrap();
    }
    // Words 0 and 1 are a shared u64 counter: atomics work across the processes.
    // SAFETY: word 0 is 8-byte aligned (page-aligned mapping) and we view two words as a u64.
    let counter = unsafe { &*(imported.host_ptr().unwrap().cast::<AtomicU64>()) };
    for _ in 0..1000 {
        counter.fetch_add(1, Ordering::AcqRel);
    }
}

#[test]
fn host_memory_written_by_another_process() {
    if std::env::var(ROLE).is_ok() {
        return; // a child runs only `child_entry`
    }
    let dev = Host::open_device(0).unwrap();
    let mem = Host::alloc(&dev, WORDS * 4, MemoryKind::Device).unwrap();
    let seed_a = random_seed();
    let seed_b = random_seed().rotate_left(13) ^ 0x5a5a_5a5a;
    assert_ne!(seed_a, seed_b);
    let mut bytes = vec![0u8; WORDS * 4];
    for i in 2..WORDS {
        bytes[4 * i..4 * i + 4].copy_from_slice(&pattern(i, seed_a).to_le_bytes());
    }
    Host::write(&dev, &mem, 0, &bytes).unwrap();
    let desc = Host::export(&mem, Host::ipc_kinds(&mem)[0]).unwrap();

    let exe = std::env::current_exe().unwrap();
    let mut children = Vec::new();
    // One child checks and rewrites the data; both bump the shared counter concurrently.
    for role in ["child-data", "child-count"] {
        children.push(
            Command::new(&exe)
                .args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
                .env(ROLE, role)
                .env(DESC, hex(&desc.to_bytes()))
                .env(SEED, format!("{seed_a},{seed_b}"))
                // Their output is kept, not mixed into this harness's (its `test result:`
                // lines are what CI counts): shown only when a child fails.
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
    }
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child failed: {}\n--- stdout\n{}--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let w = words_of(&mem);
    // Two children, 1000 increments each, on the shared u64 made of words 0 and 1.
    assert_eq!((w[0], w[1]), (2000, 0), "cross-process atomic increments");
    for (i, v) in w.iter().enumerate().skip(2) {
        assert_eq!(
            *v,
            pattern(i, seed_b),
            "parent: word {i} written by the child"
        );
    }
}

#[test]
fn child_entry() {
    if std::env::var(ROLE).is_ok() {
        child();
    }
}

#[test]
fn bad_descriptors_are_errors() {
    let dev = Host::open_device(0).unwrap();
    let mem = Host::alloc(&dev, 4096, MemoryKind::HostMapped).unwrap();
    let bytes = Host::export(&mem, mscclpp_hal::IpcKind::HostMemfd)
        .unwrap()
        .to_bytes();
    for len in 0..bytes.len() {
        assert!(IpcDescriptor::from_bytes(&bytes[..len]).is_err());
    }
    // Every single-byte mutation either fails to decode or fails to import, or imports
    // the same memory; it never panics.
    for pos in 0..bytes.len() {
        let mut m = bytes.clone();
        m[pos] ^= 0xa5;
        if let Ok(d) = IpcDescriptor::from_bytes(&m) {
            let _ = Host::import(&dev, &d);
        }
    }
    // A descriptor naming a dead exporter is a clear error.
    let mut d = IpcDescriptor::from_bytes(&bytes).unwrap();
    d.pid = 0;
    let err = Host::import(&dev, &d).unwrap_err();
    assert!(matches!(err, mscclpp_hal::Error::PeerGone { .. }), "{err}");
    // Size larger than the memfd is refused.
    let mut d = IpcDescriptor::from_bytes(&bytes).unwrap();
    d.size = 1 << 20;
    assert!(Host::import(&dev, &d).is_err());
}
