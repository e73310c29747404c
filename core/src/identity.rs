//! Process identity: which host and which process a rank, an endpoint or a memory belongs to.
//!
//! [`host_hash`] is the same for every process on one host and network namespace; [`pid_hash`]
//! names one process (pid, start time and host mixed). Both are built on `fnv1a`, a hash
//! that is the same in every process (unlike `std`'s `RandomState`), so they can be compared
//! across processes. This is the bottom layer of core: it depends only on [`crate::env`](mod@crate::env).

use std::sync::OnceLock;

/// 64-bit FNV-1a: a hash that is the same in every process (unlike `std`'s `RandomState`).
pub(crate) fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// This process's host hash: the same for every process on one host and network namespace.
/// Mixes the hostname, `MSCCLPP_HOSTID` (if set) and the inode of `/proc/self/ns/net`, so
/// ranks in different network namespaces count as different hosts.
pub fn host_hash() -> u64 {
    use std::os::unix::fs::MetadataExt;
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mut key = hostname.into_bytes();
    key.push(0);
    if let Some(id) = crate::env::env().hostid() {
        key.extend_from_slice(id.as_bytes());
    }
    key.push(0);
    if let Ok(meta) = std::fs::metadata("/proc/self/ns/net") {
        key.extend_from_slice(&meta.ino().to_le_bytes());
    }
    fnv1a(&key, 0)
}

/// This process's host hash, computed once (see [`host_hash`]).
pub(crate) fn local_host_hash() -> u64 {
    static H: OnceLock<u64> = OnceLock::new();
    *H.get_or_init(host_hash)
}

/// A hash naming this process: its pid mixed with its start time and the host hash, so two
/// processes (even with a reused pid, or in other namespaces) never share it.
pub fn pid_hash() -> u64 {
    static H: OnceLock<u64> = OnceLock::new();
    *H.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut key = Vec::new();
        key.extend_from_slice(&std::process::id().to_le_bytes());
        key.extend_from_slice(&nanos.to_le_bytes());
        key.extend_from_slice(&host_hash().to_le_bytes());
        fnv1a(&key, 0x5eed)
    })
}

/// A fresh 64-bit id: unique within the process (a counter), unpredictable across processes
/// (mixed with [`pid_hash`]).
pub(crate) fn fresh_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    fnv1a(&n.to_le_bytes(), pid_hash())
}
