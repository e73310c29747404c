//! Run-time compilation with NVRTC ([`crate::ModuleApi::compile_source`] on CUDA): cudarc's
//! NVRTC bindings (dynamic loading), the library found first.
//!
//! Finding libnvrtc: `MSCCLPP_NVRTC_SO` (a path) when set; else the loader's own search for
//! `libnvrtc.so.13` / `libnvrtc.so`; else `lib64/` and `lib/` of `$CUDA_HOME`, `$CUDA_PATH` and
//! `/usr/local/cuda`. The library found is opened by its path and kept open, so cudarc's own
//! open by name (`libnvrtc.so.13`) finds it loaded; libnvrtc-builtins beside it is opened the
//! same way (libnvrtc opens it by name, and toolkits installed outside the loader's paths have no
//! entry for it). cudarc panics where a library or symbol is missing: the library is checked
//! first and every NVRTC call runs inside `catch_unwind`, so a missing piece is an error.
//!
//! Compiled code is kept on disk (`MSCCLPP_RTC_CACHE`, a folder; default
//! `$XDG_CACHE_HOME/mscclpp/rtc` or `~/.cache/mscclpp/rtc`; `0` or `off`: none), named by a
//! 128-bit hash of everything that decides it (source, headers, options, include folder, NVRTC
//! version): the ranks of one machine and later runs load it instead of compiling (about a
//! second per plan). Written to a temporary name and renamed, so a reader never sees a partial
//! file. Bounded by `MSCCLPP_RTC_CACHE_MAX_MB` (default 256): after each new entry the entries
//! used longest ago are removed until the rest fit (rtc_cache.rs).
//!
//! The toolkit headers the sources include (cuda_fp16.h, libcu++ under `cccl/`) come from
//! `MSCCLPP_CUDA_INCLUDE` (a folder) when set, else the first of `$CUDA_HOME/include`,
//! `$CUDA_PATH/include`, `/usr/local/cuda/include` and the `include/` beside libnvrtc's folder
//! that has cuda_fp16.h.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::sys;

use crate::{Error, Result};

/// The open libnvrtc (its folder), or why none was found.
fn nvrtc() -> Result<&'static Path> {
    static LIB: OnceLock<std::result::Result<(libloading::Library, PathBuf), Vec<String>>> =
        OnceLock::new();
    let r = LIB.get_or_init(|| {
        let mut tried = Vec::new();
        let mut candidates: Vec<PathBuf> = Vec::new();
        match crate::env::nvrtc_so() {
            Some(p) => candidates.push(p),
            None => {
                candidates.push("libnvrtc.so.13".into());
                candidates.push("libnvrtc.so".into());
                for base in crate::env::cuda_roots() {
                    for lib in ["lib64", "lib"] {
                        candidates.push(base.join(lib).join("libnvrtc.so.13"));
                        candidates.push(base.join(lib).join("libnvrtc.so"));
                    }
                }
            }
        }
        for c in candidates {
            tried.push(c.display().to_string());
            // SAFETY: opening libnvrtc runs its initialisers only.
            if let Ok(lib) = unsafe { libloading::Library::new(&c) } {
                let dir = loaded_dir(&lib, &c);
                preload_builtins(&dir);
                return Ok((lib, dir));
            }
        }
        Err(tried)
    });
    match r {
        Ok((_, dir)) => Ok(dir.as_path()),
        Err(tried) => Err(Error::NoDriver {
            backend: "nvrtc",
            tried: tried.clone(),
            detail: "the CUDA run-time compiler (libnvrtc) is needed to compile execution plans; set MSCCLPP_NVRTC_SO to its path".into(),
        }),
    }
}

/// The folder of an opened library: the candidate's own when it is a path, else the folder the
/// loader found it in (from `dladdr` of one of its symbols), else empty.
fn loaded_dir(lib: &libloading::Library, asked: &Path) -> PathBuf {
    if asked.is_absolute() {
        return asked.parent().map(Path::to_path_buf).unwrap_or_default();
    }
    // SAFETY: looks a symbol up in the open library; only its address is used.
    let sym = unsafe { lib.get::<*const std::ffi::c_void>(b"nvrtcVersion\0") };
    let Ok(sym) = sym else {
        return PathBuf::new();
    };
    let mut info = std::mem::MaybeUninit::<libc_dl::DlInfo>::zeroed();
    // SAFETY: dladdr fills `info` for an address inside a loaded object.
    let ok = unsafe { libc_dl::dladdr(*sym, info.as_mut_ptr()) };
    if ok == 0 {
        return PathBuf::new();
    }
    // SAFETY: dladdr succeeded, so `info` is filled; dli_fname is a NUL-terminated path.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return PathBuf::new();
    }
    // SAFETY: see above.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Path::new(&*name.to_string_lossy())
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// `dladdr` (glibc), for the folder of a library the loader found by name. Hand-written: the
/// `libc` crate is not a dependency of this crate, and this one call is all it would add.
mod libc_dl {
    use std::ffi::{c_char, c_int, c_void};

    #[repr(C)]
    pub(super) struct DlInfo {
        pub dli_fname: *const c_char,
        pub dli_fbase: *mut c_void,
        pub dli_sname: *const c_char,
        pub dli_saddr: *mut c_void,
    }

    extern "C" {
        pub(super) fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
    }
}

/// Opens (and keeps open) every libnvrtc-builtins in `dir`, so libnvrtc's open by name finds it.
fn preload_builtins(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("libnvrtc-builtins.so") && !name.contains(".alt.") {
            // SAFETY: opening the builtins library runs its initialisers only.
            if let Ok(lib) = unsafe { libloading::Library::new(e.path()) } {
                // Kept for the process's life, like libnvrtc itself.
                std::mem::forget(lib);
            }
        }
    }
}

/// The toolkit include folder (see the module doc), or an error listing where it looked.
fn include_dir(nvrtc_dir: &Path) -> Result<PathBuf> {
    if let Some(p) = crate::env::cuda_include() {
        if p.join("cuda_fp16.h").is_file() {
            return Ok(p);
        }
        return Err(Error::invalid(
            "compile_source(cuda)",
            "MSCCLPP_CUDA_INCLUDE naming a CUDA include folder (with cuda_fp16.h)",
            p.display().to_string(),
        ));
    }
    let mut tried = Vec::new();
    let mut dirs: Vec<PathBuf> = crate::env::cuda_roots()
        .iter()
        .map(|r| r.join("include"))
        .collect();
    if let Some(up) = nvrtc_dir.parent() {
        dirs.push(up.join("include"));
    }
    for d in dirs {
        if d.join("cuda_fp16.h").is_file() {
            return Ok(d);
        }
        tried.push(d.display().to_string());
    }
    Err(Error::invalid(
        "compile_source(cuda)",
        "a CUDA include folder with cuda_fp16.h (set MSCCLPP_CUDA_INCLUDE)",
        format!("none in [{}]", tried.join(", ")),
    ))
}

fn check(op: &'static str, r: sys::nvrtcResult) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Driver {
            op,
            code: r as i64,
            name: format!("{r:?}"),
        })
    }
}

fn cstring(op: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(op, "text without NUL bytes", "a NUL byte"))
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

/// The program's compile log (empty when there is none).
fn log(p: &Program) -> String {
    let mut n = 0usize;
    // SAFETY: `p` is a live program; `n` receives the size.
    if unsafe { sys::nvrtcGetProgramLogSize(p.0, &mut n) } != sys::nvrtcResult::NVRTC_SUCCESS
        || n == 0
    {
        return String::new();
    }
    let mut buf = vec![0u8; n];
    // SAFETY: `buf` has the size NVRTC asked for.
    let _ = unsafe { sys::nvrtcGetProgramLog(p.0, buf.as_mut_ptr().cast::<c_char>()) };
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .trim()
        .to_string()
}

/// Compiles `source` for compute capability `cc` into a cubin (see the module doc), the code
/// kept in the folder `cache` ([`cache_dir`]; `None`: not kept).
pub(super) fn compile(
    cache: Option<PathBuf>,
    cc: (u32, u32),
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
) -> Result<Vec<u8>> {
    let dir = nvrtc()?.to_path_buf();
    let inc = include_dir(&dir)?;
    let op = "nvrtcCompileProgram";
    let src = cstring(op, source)?;
    let cname = cstring(op, name)?;
    let texts = headers
        .iter()
        .map(|(_, t)| cstring(op, t))
        .collect::<Result<Vec<_>>>()?;
    let names = headers
        .iter()
        .map(|(n, _)| cstring(op, n))
        .collect::<Result<Vec<_>>>()?;
    let mut opts = vec![
        format!("--gpu-architecture=sm_{}{}", cc.0, cc.1),
        "-std=c++17".to_string(),
        format!("-I{}", inc.display()),
    ];
    if inc.join("cccl").is_dir() {
        opts.push(format!("-I{}", inc.join("cccl").display()));
    }
    opts.extend(options.iter().cloned());
    let copts = opts
        .iter()
        .map(|o| cstring(op, o))
        .collect::<Result<Vec<_>>>()?;
    let cached = cache.and_then(|dir| cache_file(&dir, &opts, source, headers));
    if let Some(code) = cached.as_deref().and_then(read_cached) {
        return Ok(code);
    }
    // Another process of this machine compiling the same source (the ranks of a job mostly
    // have the same plan kernels): wait for its file instead of compiling it again.
    let _turn = match cached.as_deref().map(|p| CompileTurn::take(p, LOCK_WAIT)) {
        Some(Turn::Done(code)) => return Ok(code),
        Some(Turn::Mine(t)) => Some(t),
        Some(Turn::Anyway) | None => None,
    };
    let run = || -> Result<Vec<u8>> {
        let tp: Vec<*const c_char> = texts.iter().map(|t| t.as_ptr()).collect();
        let np: Vec<*const c_char> = names.iter().map(|t| t.as_ptr()).collect();
        let op_ptrs: Vec<*const c_char> = copts.iter().map(|t| t.as_ptr()).collect();
        let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer is a live NUL-terminated string for the call; the counts match.
        check("nvrtcCreateProgram", unsafe {
            sys::nvrtcCreateProgram(
                &mut raw,
                src.as_ptr(),
                cname.as_ptr(),
                tp.len() as i32,
                tp.as_ptr(),
                np.as_ptr(),
            )
        })?;
        let prog = Program(raw);
        // SAFETY: live program; the options are live NUL-terminated strings.
        let r = unsafe { sys::nvrtcCompileProgram(prog.0, op_ptrs.len() as i32, op_ptrs.as_ptr()) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(Error::Driver {
                op: "nvrtcCompileProgram",
                code: r as i64,
                name: format!("{r:?} compiling {name}: {}", log(&prog)),
            });
        }
        let mut n = 0usize;
        // SAFETY: live, compiled program.
        check("nvrtcGetCUBINSize", unsafe {
            sys::nvrtcGetCUBINSize(prog.0, &mut n)
        })?;
        let mut code = vec![0u8; n];
        // SAFETY: `code` has the size NVRTC reported.
        check("nvrtcGetCUBIN", unsafe {
            sys::nvrtcGetCUBIN(prog.0, code.as_mut_ptr().cast::<c_char>())
        })?;
        Ok(code)
    };
    // cudarc panics on a missing symbol: an error here, never a panic out of the HAL.
    let code =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|_| {
            Err(Error::NoDriver {
                backend: "nvrtc",
                tried: vec![dir.display().to_string()],
                detail: "libnvrtc lacks a function this build calls".into(),
            })
        })?;
    if let Some(p) = cached {
        store(&p, &code);
        // The folder's bound (MSCCLPP_RTC_CACHE_MAX_MB): the entries used longest ago go.
        if let Some(dir) = p.parent() {
            crate::rtc_cache::prune(dir, crate::env::rtc_cache_max_bytes(), &p, LOCK_STALE);
        }
    }
    Ok(code)
}

/// A cached code object at `path` when there is a whole one (marked as used now, so the
/// folder's bound removes it last).
fn read_cached(path: &Path) -> Option<Vec<u8>> {
    let code = std::fs::read(path)
        .ok()
        .filter(|code| code.starts_with(b"\x7fELF"))?;
    crate::rtc_cache::touch(path);
    Some(code)
}

/// How long a process waits for another one's compile of the same source before it compiles
/// it itself (one plan kernel takes about a second; a stale lock of a killed process costs a
/// caller this much once).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A lock file older than this is taken to be left by a process that died while compiling.
const LOCK_STALE: std::time::Duration = std::time::Duration::from_secs(300);

/// Whose compile of one cache entry this is ([`CompileTurn::take`]).
enum Turn {
    /// Another process compiled it meanwhile: its code.
    Done(Vec<u8>),
    /// This process compiles it, holding the entry's lock file until the turn drops.
    Mine(CompileTurn),
    /// No lock could be made (a read-only folder) or the wait ran out: compile without one.
    Anyway,
}

/// The lock file `<entry>.lock` of a cache entry, made with `create_new` (atomic on local file
/// systems), removed on drop. Hand-written: std's `File::lock` needs Rust 1.89 (the workspace
/// supports 1.85) and a lock file also tells a waiter when the holder is gone.
struct CompileTurn(PathBuf);

impl CompileTurn {
    /// Takes the turn to compile the entry `path`, or waits (up to `wait`) while another
    /// process holds it, returning its code when it wrote the entry.
    fn take(path: &Path, wait: std::time::Duration) -> Turn {
        let lock = path.with_extension("lock");
        if let Some(dir) = lock.parent() {
            if std::fs::create_dir_all(dir).is_err() {
                return Turn::Anyway;
            }
        }
        let t0 = std::time::Instant::now();
        loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock)
            {
                Ok(_) => {
                    // The holder may have finished between the caller's read and this create.
                    if let Some(code) = read_cached(path) {
                        let _ = std::fs::remove_file(&lock);
                        return Turn::Done(code);
                    }
                    return Turn::Mine(CompileTurn(lock));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(_) => return Turn::Anyway,
            }
            if let Some(code) = read_cached(path) {
                return Turn::Done(code);
            }
            let stale = std::fs::metadata(&lock)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > LOCK_STALE);
            if stale {
                let _ = std::fs::remove_file(&lock);
                continue;
            }
            if t0.elapsed() >= wait {
                return Turn::Anyway;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for CompileTurn {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The cache folder (see the module doc), or `None` when caching is off.
pub(super) fn cache_dir() -> Option<PathBuf> {
    crate::env::rtc_cache()
}

/// The cache file of one compilation: a 128-bit hash (two SipHash passes, std's) of its
/// options (arch, include folders), the NVRTC version, the headers and the source.
fn cache_file(
    dir: &Path,
    opts: &[String],
    source: &str,
    headers: &[(&str, &str)],
) -> Option<PathBuf> {
    use std::hash::{Hash, Hasher};
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: nvrtc() opened the library; nvrtcVersion writes two ints. A panic (missing
    // symbol) means no caching.
    let v = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
        sys::nvrtcVersion(&mut major, &mut minor)
    }));
    if !matches!(v, Ok(sys::nvrtcResult::NVRTC_SUCCESS)) {
        return None;
    }
    let digest = |seed: u64| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        seed.hash(&mut h);
        (major, minor).hash(&mut h);
        opts.hash(&mut h);
        headers.hash(&mut h);
        source.hash(&mut h);
        h.finish()
    };
    Some(dir.join(format!("{:016x}{:016x}.cubin", digest(1), digest(2))))
}

/// Writes `code` to `path` through a temporary file and a rename; failures only mean no cache.
fn store(path: &Path, code: &[u8]) {
    let Some(dir) = path.parent() else {
        return;
    };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    if std::fs::write(&tmp, code).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles a kernel with an in-memory header into an sm_90 cubin (an ELF image), and a
    /// broken one into an error carrying the compiler's message. Needs libnvrtc and a CUDA
    /// include folder (MSCCLPP_NVRTC_SO / MSCCLPP_CUDA_INCLUDE where they are not in the
    /// default places); skipped, saying so, without them.
    #[test]
    fn compiles_to_a_cubin_and_reports_errors() {
        let dir = match nvrtc() {
            Ok(d) => d.to_path_buf(),
            Err(e) => {
                eprintln!("skipped: no libnvrtc ({e})");
                return;
            }
        };
        if let Err(e) = include_dir(&dir) {
            eprintln!("skipped: no CUDA include folder ({e})");
            return;
        }
        let src =
            "#include \"answer.h\"\nextern \"C\" __global__ void k(int* p) { *p = ANSWER; }\n";
        let code = compile(
            None,
            (9, 0),
            "t.cu",
            src,
            &[("answer.h", "#define ANSWER 42\n")],
            &[],
        )
        .expect("compile");
        assert_eq!(&code[..4], b"\x7fELF");
        let e = compile(
            None,
            (9, 0),
            "bad.cu",
            "__global__ void k() { undefined_thing(); }",
            &[],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("undefined_thing") && e.contains("bad.cu"), "{e}");
    }

    /// A second compile of the same source is read from the cache folder; another source is
    /// another file.
    #[test]
    fn compiled_code_is_cached_by_its_inputs() {
        let Ok(dir) = nvrtc().map(Path::to_path_buf) else {
            eprintln!("skipped: no libnvrtc");
            return;
        };
        if include_dir(&dir).is_err() {
            eprintln!("skipped: no CUDA include folder");
            return;
        }
        let cache = std::env::temp_dir().join(format!("mscclpp-rtc-test-{}", std::process::id()));
        let src = "extern \"C\" __global__ void k(int* p) { *p = 7; }\n";
        let a = compile(Some(cache.clone()), (9, 0), "c.cu", src, &[], &[]).expect("compile");
        let files = || std::fs::read_dir(&cache).map(|d| d.count()).unwrap_or(0);
        assert_eq!(files(), 1);
        let b = compile(Some(cache.clone()), (9, 0), "c.cu", src, &[], &[]).expect("cached");
        assert_eq!(a, b);
        assert_eq!(files(), 1);
        let other = src.replace('7', "8");
        compile(Some(cache.clone()), (9, 0), "c.cu", &other, &[], &[]).expect("compile");
        assert_eq!(files(), 2, "no lock file left behind");
        let _ = std::fs::remove_dir_all(&cache);
    }

    /// Of several callers wanting one entry at once, one compiles (holds the lock) and the
    /// others get its code once written; a lock whose holder never writes makes a waiter
    /// compile itself after the wait; the lock file goes when the turn ends. Needs no NVRTC.
    #[test]
    fn one_compile_per_entry_at_a_time() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::time::Duration;
        let dir = std::env::temp_dir().join(format!("mscclpp-rtc-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let entry = dir.join("k.cubin");
        let compiles = AtomicUsize::new(0);
        let got: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(
                        || match CompileTurn::take(&entry, Duration::from_secs(30)) {
                            Turn::Done(code) => code,
                            Turn::Mine(_turn) => {
                                compiles.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(200));
                                let code = b"\x7fELF-code".to_vec();
                                store(&entry, &code);
                                code
                            }
                            Turn::Anyway => panic!("no lock taken within the wait"),
                        },
                    )
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("caller")).collect()
        });
        assert_eq!(compiles.load(Ordering::SeqCst), 1);
        assert!(got.iter().all(|c| c == b"\x7fELF-code"), "{got:?}");
        assert!(!entry.with_extension("lock").exists());
        // A holder that never writes: the waiter gives up after its wait and compiles.
        let other = dir.join("m.cubin");
        let held = match CompileTurn::take(&other, Duration::from_secs(1)) {
            Turn::Mine(t) => t,
            _ => panic!("the first caller takes the turn"),
        };
        let t0 = std::time::Instant::now();
        assert!(matches!(
            CompileTurn::take(&other, Duration::from_millis(300)),
            Turn::Anyway
        ));
        assert!(t0.elapsed() >= Duration::from_millis(300));
        drop(held);
        assert!(!other.with_extension("lock").exists());
        assert!(matches!(
            CompileTurn::take(&other, Duration::from_millis(300)),
            Turn::Mine(_)
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
