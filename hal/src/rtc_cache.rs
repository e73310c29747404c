//! The size bound of the run-time compile cache (cuda/rtc.rs keeps compiled code in a folder,
//! `MSCCLPP_RTC_CACHE`). Every change of the sources or headers a kernel is made from makes new
//! entries (their names are hashes of those inputs) and leaves the old ones unused, so without a
//! bound the folder only grows. Plain file handling, in a module of its own so that its tests run
//! on every build. Its twin is the build scripts' kernel object cache
//! (`mscclpp_kernel_build::Cache::prune_to`, hal/kernel-build/src/cache.rs: touch on a hit,
//! oldest first over a size bound); this one differs in keeping the entry just written, counting
//! only code objects and removing only stale temporary and lock files by age. Sharing one
//! function would make the build helper a run-time dependency of the HAL: not done yet.

use std::path::Path;
use std::time::{Duration, SystemTime};

/// Marks the entry at `path` as used now (its modification time): pruning removes the entries
/// used longest ago first. Failures (a read-only folder) only weaken that order.
pub(crate) fn touch(path: &Path) {
    if let Ok(f) = std::fs::File::options().write(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Bounds the folder `dir` after an entry was added: removes temporary files (`*.tmp`) and lock
/// files (`*.lock`) older than `stale` (left by processes that died), then the code objects
/// (`*.cubin`) used longest ago until those left hold at most `max` bytes (`keep`, the entry
/// just written, is never removed). Returns how many files it removed. Errors (a file another
/// process removed meanwhile, no permission) skip that file: several processes may prune one
/// folder at once, and a reader that loses an entry compiles it again.
pub(crate) fn prune(dir: &Path, max: u64, keep: &Path, stale: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let now = SystemTime::now();
    let mut removed = 0;
    let mut code: Vec<(SystemTime, u64, std::path::PathBuf)> = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        let Ok(meta) = e.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let used = meta.modified().unwrap_or(now);
        let ext = path.extension().and_then(|x| x.to_str()).unwrap_or("");
        match ext {
            "tmp" | "lock" => {
                let age = now.duration_since(used).unwrap_or_default();
                if age > stale && std::fs::remove_file(&path).is_ok() {
                    removed += 1;
                }
            }
            "cubin" => code.push((used, meta.len(), path)),
            _ => {}
        }
    }
    let mut total: u64 = code.iter().map(|c| c.1).sum();
    code.sort();
    for (_, len, path) in code {
        if total <= max {
            break;
        }
        if path == keep {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, len: usize, age_s: u64) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, vec![7u8; len]).unwrap();
        let f = std::fs::File::options().write(true).open(&p).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(age_s))
            .unwrap();
        p
    }

    /// The entries used longest ago go first until the rest fit; the one just written stays
    /// even when it is the oldest; a touched entry counts as used now; stale temporary and lock
    /// files go, fresh ones (a compile in progress) and other files stay.
    #[test]
    fn removes_the_least_recently_used_until_it_fits() {
        let dir = std::env::temp_dir().join(format!("mscclpp-rtc-prune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let oldest = file(&dir, "a.cubin", 100, 500);
        let old = file(&dir, "b.cubin", 100, 400);
        let used = file(&dir, "c.cubin", 100, 300);
        let new = file(&dir, "d.cubin", 100, 10);
        let stale_tmp = file(&dir, "e.cubin.123.tmp", 50, 1000);
        let fresh_lock = file(&dir, "d.cubin.lock", 0, 1);
        let stale_lock = file(&dir, "f.cubin.lock", 0, 1000);
        let other = file(&dir, "notes.txt", 500, 1000);
        touch(&used);
        // 400 bytes of code, at most 250 kept: by last use a (kept), b, d, c: b and d go.
        let removed = prune(&dir, 250, &oldest, Duration::from_secs(300));
        assert!(oldest.exists(), "the entry just written stays");
        assert!(!old.exists(), "the next oldest goes");
        assert!(used.exists(), "a touched entry counts as new");
        assert!(!new.exists(), "then the next (c was touched after it)");
        assert!(
            !stale_tmp.exists() && !stale_lock.exists(),
            "stale leftovers go"
        );
        assert!(fresh_lock.exists(), "a lock of a compile in progress stays");
        assert!(other.exists(), "files of other kinds stay");
        let left: u64 = ["a.cubin", "b.cubin", "c.cubin", "d.cubin"]
            .iter()
            .filter_map(|n| std::fs::metadata(dir.join(n)).ok())
            .map(|m| m.len())
            .sum();
        assert!(left <= 250, "{left} bytes of code left");
        assert_eq!(removed, 4, "two code objects and two stale leftovers");
        // Under the bound nothing more goes.
        assert_eq!(prune(&dir, 1 << 20, &oldest, Duration::from_secs(300)), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A folder that does not exist is nothing to prune.
    #[test]
    fn a_missing_folder_is_left_alone() {
        let dir = std::env::temp_dir().join("mscclpp-rtc-prune-none-such");
        assert_eq!(prune(&dir, 0, &dir.join("x.cubin"), Duration::ZERO), 0);
    }
}
