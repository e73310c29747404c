//! A store of compiled code objects keyed by everything that decides their bytes, shared by
//! every build in one target folder (`<target>/mscclpp-kernel-cache/`).
//!
//! Why: cargo reruns a build script whenever one of its `rerun-if-env-changed` variables
//! changes (PATH among them, as the compilers are found through it), and builds of other
//! profiles or feature sets run it again in their own `OUT_DIR`. The device code is the same
//! each time, and for ROCm it is most of the build (hipcc takes 7-30 s per source on one core;
//! it took ~7 minutes per executor build before the executor's functions stayed out of line).
//! A hit copies the object instead.
//!
//! The key hashes: the compiler's path and its `--version` output, the compiler flags (every
//! argument but the output path), the source's name, the environment variables the compilers
//! read, and the content of every file under the folders the source can include from (the
//! source tree and `kernels/`). Any change there is a miss; a miss compiles as before and
//! stores the result. Entries are written to a temporary name and renamed, so parallel builds
//! never read half an object. Entries unused for 14 days, and the oldest beyond 2 GiB, are
//! removed after each build. `MSCCLPP_KERNEL_CACHE=0` turns the store off.
//!
//! The hash is std's SipHash, taken twice with different prefixes (128 bits): a cache key
//! against accidental collisions, not an adversary, so no hashing crate is needed.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

/// Turns the store off when `0`; `1`, empty or unset keeps it on; anything else stops the
/// build (a typo must not silently change what a build does).
pub const CACHE_VAR: &str = "MSCCLPP_KERNEL_CACHE";

fn cache_on() -> bool {
    match std::env::var(CACHE_VAR) {
        Err(_) => true,
        Ok(v) if v.is_empty() || v == "1" => true,
        Ok(v) if v == "0" => false,
        Ok(v) => crate::fail(&format!("{CACHE_VAR}: expected 0 or 1, got {v:?}")),
    }
}

/// Variables nvcc or hipcc read that change what they produce.
pub const COMPILER_VARS: &[&str] = &[
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "NVCC_CCBIN",
    "HIPCC_COMPILE_FLAGS_APPEND",
    "HIPCC_COMPILE_FLAGS_BEFORE",
    "HIP_CLANG_PATH",
    "HIP_PATH",
    "HIP_DEVICE_LIB_PATH",
    "DEVICE_LIB_PATH",
    "ROCM_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
];

const MAX_AGE: Duration = Duration::from_secs(14 * 24 * 3600);
const MAX_BYTES: u64 = 2 << 30;

/// 128-bit digest of a sequence of hashed parts.
#[derive(Clone)]
pub struct Digest {
    a: DefaultHasher,
    b: DefaultHasher,
}

impl Default for Digest {
    fn default() -> Self {
        let mut a = DefaultHasher::new();
        let mut b = DefaultHasher::new();
        "mscclpp-kernel-cache/a".hash(&mut a);
        "mscclpp-kernel-cache/b".hash(&mut b);
        Digest { a, b }
    }
}

impl Digest {
    /// Adds one part (length-prefixed, so parts never run into each other).
    pub fn add(&mut self, bytes: &[u8]) {
        bytes.hash(&mut self.a);
        bytes.hash(&mut self.b);
    }

    /// 32 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}{:016x}", self.a.finish(), self.b.finish())
    }
}

/// Adds every file under `dir` (relative path and content, in sorted order) to `d`; a folder
/// that does not exist adds only its name.
pub fn add_tree(d: &mut Digest, dir: &Path) {
    d.add(dir.to_string_lossy().as_bytes());
    let files = crate::files_under(dir, |_| true);
    for f in files {
        d.add(
            f.strip_prefix(dir)
                .unwrap_or(&f)
                .to_string_lossy()
                .as_bytes(),
        );
        match std::fs::read(&f) {
            Ok(bytes) => d.add(&bytes),
            // Unreadable: a marker, so the key still differs from a readable file's.
            Err(e) => d.add(format!("unreadable: {e}").as_bytes()),
        }
    }
}

/// The compiler's identity: its path and what `--version` prints (empty when it cannot run;
/// the compile then fails on its own).
pub fn compiler_identity(compiler: &Path) -> Vec<u8> {
    let mut id = compiler.to_string_lossy().into_owned().into_bytes();
    id.push(0);
    if let Ok(o) = Command::new(compiler)
        .env("HIP_PLATFORM", "amd")
        .arg("--version")
        .output()
    {
        id.extend_from_slice(&o.stdout);
        id.extend_from_slice(&o.stderr);
    }
    id
}

/// The store: `None` when turned off or when `out` is not inside a cargo target folder.
pub struct Cache {
    dir: Option<PathBuf>,
}

impl Cache {
    /// The store of the target folder that holds `out` (an `OUT_DIR`,
    /// `<target>/[<triple>/]<profile>/build/<pkg>/out[/sub]`).
    pub fn for_out_dir(out: &Path) -> Cache {
        let on = cache_on();
        let target = out
            .ancestors()
            .find(|p| p.file_name().is_some_and(|n| n == "build"))
            .and_then(Path::parent)
            .and_then(Path::parent);
        Cache {
            dir: target
                .filter(|_| on)
                .map(|t| t.join("mscclpp-kernel-cache")),
        }
    }

    /// A store in `dir` (tests).
    pub fn at(dir: &Path) -> Cache {
        Cache {
            dir: Some(dir.to_path_buf()),
        }
    }

    fn entry(&self, key: &str, ext: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{key}.{ext}")))
    }

    /// Copies the entry `key` to `dst`; false on a miss (or when the copy fails: the caller
    /// compiles then). A hit refreshes the entry's time, which decides what is pruned.
    pub fn fetch(&self, key: &str, dst: &Path) -> bool {
        let Some(src) = self.entry(key, ext_of(dst)) else {
            return false;
        };
        if !src.is_file() || std::fs::copy(&src, dst).is_err() {
            return false;
        }
        if let Ok(f) = std::fs::File::options().append(true).open(&src) {
            let _ = f.set_modified(SystemTime::now());
        }
        true
    }

    /// Stores the compiled `obj` as `key`. Failing to store is not an error: the build has its
    /// object either way.
    pub fn store(&self, key: &str, obj: &Path) {
        let (Some(dir), Some(dst)) = (self.dir.as_ref(), self.entry(key, ext_of(obj))) else {
            return;
        };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let tmp = dir.join(format!(
            ".{key}.{}.{:?}.tmp",
            std::process::id(),
            std::thread::current().id()
        ));
        if std::fs::copy(obj, &tmp).is_ok() && std::fs::rename(&tmp, &dst).is_ok() {
            return;
        }
        let _ = std::fs::remove_file(&tmp);
    }

    /// Removes entries unused for 14 days, then the oldest until the store holds 2 GiB or less.
    pub fn prune(&self) {
        self.prune_to(SystemTime::now(), MAX_AGE, MAX_BYTES);
    }

    /// [`Cache::prune`] with the clock and limits given (tests).
    pub fn prune_to(&self, now: SystemTime, max_age: Duration, max_bytes: u64) {
        let Some(dir) = &self.dir else { return };
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut live: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        for e in rd.filter_map(Result::ok) {
            let (Ok(meta), p) = (e.metadata(), e.path()) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            let at = meta.modified().unwrap_or(now);
            let old = now.duration_since(at).unwrap_or_default() > max_age;
            if old {
                let _ = std::fs::remove_file(&p);
            } else {
                live.push((at, meta.len(), p));
            }
        }
        live.sort();
        let mut total: u64 = live.iter().map(|(_, n, _)| n).sum();
        for (_, n, p) in live {
            if total <= max_bytes {
                break;
            }
            if std::fs::remove_file(&p).is_ok() {
                total -= n;
            }
        }
    }
}

fn ext_of(p: &Path) -> &str {
    p.extension().and_then(|e| e.to_str()).unwrap_or("obj")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mscclpp-kcache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn tree_hex(dir: &Path) -> String {
        let mut d = Digest::default();
        add_tree(&mut d, dir);
        d.hex()
    }

    #[test]
    fn a_header_edit_or_a_new_file_changes_the_key() {
        let dir = scratch("tree");
        std::fs::create_dir_all(dir.join("inc")).unwrap();
        std::fs::write(dir.join("inc/a.hpp"), "int a;").unwrap();
        let k0 = tree_hex(&dir);
        assert_eq!(k0, tree_hex(&dir), "the same tree gives the same key");
        std::fs::write(dir.join("inc/a.hpp"), "int b;").unwrap();
        let k1 = tree_hex(&dir);
        assert_ne!(k0, k1, "an edited header changes the key");
        std::fs::write(dir.join("inc/b.hpp"), "").unwrap();
        assert_ne!(
            k1,
            tree_hex(&dir),
            "a new (even empty) file changes the key"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn parts_are_delimited() {
        let mut a = Digest::default();
        a.add(b"ab");
        a.add(b"c");
        let mut b = Digest::default();
        b.add(b"a");
        b.add(b"bc");
        assert_ne!(a.hex(), b.hex());
        assert_eq!(a.hex().len(), 32);
    }

    #[test]
    fn store_then_fetch_gives_the_same_bytes_and_a_miss_gives_false() {
        let dir = scratch("store");
        let cache = Cache::at(&dir.join("cache"));
        let obj = dir.join("k.hsaco");
        std::fs::write(&obj, b"\x7fELF code").unwrap();
        let got = dir.join("got.hsaco");
        assert!(!cache.fetch("k1", &got), "nothing stored yet");
        cache.store("k1", &obj);
        assert!(cache.fetch("k1", &got));
        assert_eq!(std::fs::read(&got).unwrap(), b"\x7fELF code");
        assert!(!cache.fetch("k2", &got), "another key misses");
        assert!(
            !cache.fetch("k1", &dir.join("got.fatbin")),
            "the extension is part of the entry"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_store_lives_in_the_target_folder_of_an_out_dir() {
        let c = Cache::for_out_dir(Path::new("/x/target/debug/build/mscclpp-0123/out/lib"));
        if std::env::var(CACHE_VAR).as_deref() == Ok("0") {
            assert!(c.dir.is_none());
        } else {
            assert_eq!(
                c.dir.as_deref(),
                Some(Path::new("/x/target/mscclpp-kernel-cache"))
            );
        }
        assert!(Cache::for_out_dir(Path::new("/not/a/cargo/dir"))
            .dir
            .is_none());
    }

    #[test]
    fn prune_drops_old_entries_then_the_oldest_over_the_size_limit() {
        let dir = scratch("prune");
        let cache = Cache::at(&dir);
        let now = SystemTime::now();
        let at = |name: &str, age_s: u64, len: usize| {
            let p = dir.join(name);
            std::fs::write(&p, vec![0u8; len]).unwrap();
            let f = std::fs::File::options().append(true).open(&p).unwrap();
            f.set_modified(now - Duration::from_secs(age_s)).unwrap();
        };
        at("stale.fatbin", 1000, 10);
        at("older.fatbin", 50, 100);
        at("newer.fatbin", 10, 100);
        cache.prune_to(now, Duration::from_secs(500), 150);
        assert!(!dir.join("stale.fatbin").exists(), "past the age limit");
        assert!(
            !dir.join("older.fatbin").exists(),
            "the oldest goes first over the size"
        );
        assert!(dir.join("newer.fatbin").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
