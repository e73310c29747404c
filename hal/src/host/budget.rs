//! The host backend's bound on allocations: memory is a sparse memfd, committed only as its
//! pages are touched, so nothing stops an allocation larger than the machine until the
//! kernel's OOM killer ends some process when it is filled. [`check`] refuses at once an
//! allocation that could not fit in the memory available now: the system's available memory
//! and free swap (`/proc/meminfo`), capped by the cgroup's remaining limit when one is set.
//! Sizes that fit are not reserved (other processes may take the memory later); the bound
//! turns the obvious mistakes (1 TiB, 100 GB on a 24 GiB machine) into a clear error.

use crate::error::{Error, Result};

/// `Err` when `size` bytes cannot fit in the memory available now (see the module docs);
/// `Ok` when they can or when the system does not say (no `/proc/meminfo`).
pub(crate) fn check(size: usize) -> Result<()> {
    let Some((available, how)) = available() else {
        return Ok(());
    };
    if size as u64 <= available {
        return Ok(());
    }
    Err(Error::Os {
        op: "alloc(host)",
        source: std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!(
                "{size} bytes requested, but only {available} bytes are available ({how}): \
                 expected a size the machine can hold"
            ),
        ),
    })
}

/// The bytes available now and how they were counted.
fn available() -> Option<(u64, String)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let (avail, swap) = parse_meminfo(&meminfo)?;
    let mut total = avail.saturating_add(swap);
    let mut how = format!("MemAvailable {avail} + SwapFree {swap}");
    if let Some(left) = cgroup_left() {
        if left < total {
            total = left;
            how = format!("the cgroup's memory.max minus memory.current: {left}");
        }
    }
    Some((total, how))
}

/// `MemAvailable` and `SwapFree` of `/proc/meminfo` text, in bytes.
fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kib.saturating_mul(1024))
        })
    };
    Some((field("MemAvailable")?, field("SwapFree").unwrap_or(0)))
}

/// The cgroup v2 limit left to this process's group, when one is set.
fn cgroup_left() -> Option<u64> {
    let read = |f: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{f}")).ok();
    let max: u64 = read("memory.max")?.trim().parse().ok()?; // "max": no limit
    let current: u64 = read("memory.current")?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_read_in_bytes() {
        let t = "MemTotal:       24000000 kB\nMemAvailable:   1000 kB\nSwapFree:  10 kB\n";
        assert_eq!(parse_meminfo(t), Some((1_024_000, 10_240)));
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn one_tib_is_refused_and_a_page_is_not() {
        check(4096).expect("a page fits");
        let e = check(1 << 40)
            .expect_err("1 TiB does not fit on a test machine")
            .to_string();
        assert!(
            e.contains("alloc(host)") && e.contains("1099511627776 bytes requested"),
            "{e}"
        );
        assert!(e.contains("expected a size the machine can hold"), "{e}");
    }
}
