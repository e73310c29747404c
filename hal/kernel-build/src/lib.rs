//! Compiling device code from build scripts, shared by `core/build.rs` (the kernels the library
//! launches, `kernels/cuda/src/`, and the examples' own) and `mp_tests/test-kernels/build.rs`
//! (the test kernels, `kernels/cuda/test_kernels/`), so the compiler discovery and architecture
//! flags exist once; `hal/build.rs` uses only [`Backend`] (it compiles no device code).
//!
//! [`compile_tree`] compiles every `.cu` file under a folder (subfolders included, embedded
//! as `folder/stem`) with nvcc into fatbins (sm_80, sm_90, sm_100 and compute_90 PTX, dropping
//! what the nvcc at hand does not list) or with hipcc into AMD code objects (gfx90a, and gfx942
//! where hipcc accepts it). [`write_index`] writes a Rust file declaring
//! `KERNEL_OBJECTS: &[(&str, &[u8])]` that `include!`s them; [`write_names`] writes typed names
//! instead: a module per source with its code object and one const per kernel or kernel
//! family, found by scanning the sources ([`scan_source`]), the same on every backend.
//! Failures stop the build with a message naming the tool, the command and its output (build
//! scripts report by panicking).

mod cache;
mod names;

pub use cache::{Cache, CACHE_VAR, COMPILER_VARS};

pub use names::{group, scan_source, write_names, Entry, NameOptions, Vocabulary};

use std::path::{Path, PathBuf};
use std::process::Command;

/// Which compiler a build uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// No device code (host-only build): nothing is compiled.
    Host,
    /// nvcc, fatbins.
    Cuda,
    /// hipcc, AMD code objects.
    Rocm,
}

impl Backend {
    /// The backend of the package whose build script is running, from its `cuda`/`rocm`
    /// features (`cuda` wins when both are on, as in the HAL).
    pub fn from_features() -> Backend {
        let cuda = std::env::var_os("CARGO_FEATURE_CUDA").is_some();
        let rocm = std::env::var_os("CARGO_FEATURE_ROCM").is_some();
        Backend::from_flags(cuda, rocm)
    }

    /// `cuda` wins over `rocm`; neither is [`Backend::Host`].
    pub fn from_flags(cuda: bool, rocm: bool) -> Backend {
        if cuda {
            Backend::Cuda
        } else if rocm {
            Backend::Rocm
        } else {
            Backend::Host
        }
    }

    /// The name the HAL publishes as its `gpu` build metadata (`cuda`, `rocm`, `host`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Host => "host",
            Backend::Cuda => "cuda",
            Backend::Rocm => "rocm",
        }
    }

    /// The backend named by [`Backend::name`]; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Backend> {
        match name {
            "host" => Some(Backend::Host),
            "cuda" => Some(Backend::Cuda),
            "rocm" => Some(Backend::Rocm),
            _ => None,
        }
    }
}

/// The `kernels/` folder of the workspace, from a package directory `levels` folders below
/// the workspace root (`hal` is 1, `mp_tests/test-kernels` is 2).
pub fn kernels_dir(levels: usize) -> PathBuf {
    let mut dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    for _ in 0..levels {
        dir.push("..");
    }
    dir.join("kernels")
}

/// Set to `1` (CI does, for its `cargo clippy --features cuda|rocm` runs), the build scripts
/// compile no device code and embed none: clippy reruns build scripts with a different
/// fingerprint than `cargo build` (so it cannot reuse the kernels) and only needs the Rust
/// side. Any other value is an error, so a typo does not silently ship kernel-less builds.
pub const SKIP_DEVICE_CODE: &str = "MSCCLPP_SKIP_DEVICE_CODE";

fn skip_device_code() -> bool {
    match std::env::var(SKIP_DEVICE_CODE) {
        Err(_) => false,
        Ok(v) if v.is_empty() || v == "0" => false,
        Ok(v) if v == "1" => true,
        Ok(v) => fail(&format!("{SKIP_DEVICE_CODE}: expected 0 or 1, got {v:?}")),
    }
}

/// Tells cargo to rerun the build script when `dirs` or the compiler environment change.
pub fn rerun_if_changed(dirs: &[&Path]) {
    println!("cargo::rerun-if-changed=build.rs");
    for dir in dirs {
        println!("cargo::rerun-if-changed={}", dir.display());
    }
    for var in [
        "NVCC",
        "MSCCLPP_CUDA_ARCHS",
        "MSCCLPP_HIP_ARCHS",
        "HIPCC",
        "PATH",
        SKIP_DEVICE_CODE,
        CACHE_VAR,
    ]
    .iter()
    // CUDA_HOME, CUDA_PATH and ROCM_PATH among them (the compilers are also found through them).
    .chain(COMPILER_VARS)
    {
        println!("cargo::rerun-if-env-changed={var}");
    }
}

/// Compiles every `.cu` under `src_root` for `backend` into `out`; returns (stem, object
/// path) pairs, sorted by stem. The include folders are `kernels/cuda/include` (and
/// `kernels/hip/include` for ROCm) under `kernels`.
pub fn compile_tree(
    backend: Backend,
    kernels: &Path,
    src_root: &Path,
    out: &Path,
) -> Vec<(String, PathBuf)> {
    let sources = list_sources(src_root);
    if sources.is_empty() || backend == Backend::Host {
        return Vec::new();
    }
    if skip_device_code() {
        println!(
            "cargo::warning={SKIP_DEVICE_CODE}=1: no {} device code compiled; this build can only be linted or type-checked, its kernel launches fail with 'embeds no code object'",
            backend.name()
        );
        return Vec::new();
    }
    let cuda_inc = kernels.join("cuda").join("include");
    let hip_inc = kernels.join("hip").join("include");
    let mut objects = Vec::new();
    let mut jobs: Vec<(String, Command)> = Vec::new();
    let mut compiler = Vec::new();
    match backend {
        Backend::Host => {}
        Backend::Cuda => {
            let nvcc = find_nvcc().unwrap_or_else(|tried| {
                fail(&format!(
                    "feature `cuda` needs nvcc; tried {tried}. Install it (`bash .ci/setup --all` installs the pinned PyPI nvidia-cuda-nvcc) and set NVCC or PATH"
                ))
            });
            let gencode = nvcc_gencode(&nvcc);
            compiler = cache::compiler_identity(&nvcc);
            for src in &sources {
                let stem = stem_of(src, src_root);
                let dst = out.join(format!("{}.fatbin", stem.replace('/', "__")));
                let mut cmd = Command::new(&nvcc);
                cmd.arg("-I")
                    .arg(&cuda_inc)
                    .arg("-fatbin")
                    .args(&gencode)
                    .args(["-O3", "-std=c++17", "-o"])
                    .arg(&dst)
                    .arg(src);
                jobs.push((format!("nvcc {}", src.display()), cmd));
                objects.push((stem, dst));
            }
        }
        Backend::Rocm => {
            let hipcc = find_tool("HIPCC", &["ROCM_PATH"], "hipcc", &["/opt/rocm/bin/hipcc"])
                .unwrap_or_else(|tried| {
                    fail(&format!(
                        "feature `rocm` needs hipcc; tried {tried}. Install it (apt-get install hipcc) or set HIPCC"
                    ))
                });
            let archs = hip_archs(&hipcc, out);
            compiler = cache::compiler_identity(&hipcc);
            let tmp = hip_tmp(out);
            let mut call_flags: Option<Vec<String>> = None;
            for src in &sources {
                let stem = stem_of(src, src_root);
                let dst = out.join(format!("{}.hsaco", stem.replace('/', "__")));
                let mut cmd = Command::new(&hipcc);
                // hipcc picks the NVIDIA platform when it finds nvcc (PATH, /usr/local/cuda);
                // we always want AMD code objects here.
                cmd.env("HIP_PLATFORM", "amd").env("TMPDIR", &tmp);
                cmd.args(["-x", "hip"])
                    .args(&archs)
                    .args(["--genco", "-O3", "-std=c++17", "-I"])
                    .arg(&hip_inc)
                    .arg("-I")
                    .arg(&cuda_inc);
                if wants_function_calls(src) {
                    let flags = call_flags.get_or_insert_with(|| hip_call_flags(&hipcc, out));
                    cmd.args(flags.iter());
                }
                cmd.arg("-o").arg(&dst).arg(src);
                jobs.push((format!("hipcc {}", src.display()), cmd));
                objects.push((stem, dst));
            }
        }
    }
    // What every object's key shares: the compiler and every file a source can include.
    let mut base = cache::Digest::default();
    base.add(&compiler);
    for var in COMPILER_VARS {
        base.add(var.as_bytes());
        base.add(std::env::var_os(var).unwrap_or_default().as_encoded_bytes());
    }
    cache::add_tree(&mut base, kernels);
    if !src_root.starts_with(kernels) {
        cache::add_tree(&mut base, src_root);
    }
    let store = Cache::for_out_dir(out);
    let mut misses = Vec::new();
    for ((what, cmd), (stem, dst)) in jobs.into_iter().zip(&objects) {
        let key = object_key(&base, stem, &cmd);
        if !store.fetch(&key, dst) {
            misses.push((what, cmd, key, dst.clone()));
        }
    }
    let (jobs, keys): (Vec<_>, Vec<_>) = misses
        .into_iter()
        .map(|(what, cmd, key, dst)| ((what, cmd), (key, dst)))
        .unzip();
    run_all(jobs);
    for (key, dst) in keys {
        store.store(&key, &dst);
    }
    store.prune();
    objects
}

/// The store key of one compile: `base`, the source's name and the command's flags and
/// variables, without the paths of the output and the source (they differ between target
/// folders and checkouts, the bytes do not).
fn object_key(base: &cache::Digest, stem: &str, cmd: &Command) -> String {
    let mut d = base.clone();
    d.add(stem.as_bytes());
    let args: Vec<_> = cmd.get_args().collect();
    let last = args.len().saturating_sub(1);
    let mut skip_next = false;
    for (i, a) in args.iter().enumerate() {
        if skip_next || i == last {
            skip_next = false;
            continue;
        }
        if *a == "-o" {
            skip_next = true;
            continue;
        }
        d.add(a.as_encoded_bytes());
    }
    for (k, v) in cmd.get_envs() {
        // TMPDIR is a folder of this target folder (hip_tmp): it changes no byte.
        if k == "TMPDIR" {
            continue;
        }
        d.add(k.as_encoded_bytes());
        d.add(v.unwrap_or_default().as_encoded_bytes());
    }
    d.hex()
}

/// Runs the compiler commands on as many threads as cargo gives this build script
/// (`NUM_JOBS`, else the machine's parallelism): each nvcc/hipcc process is single-threaded
/// for one machine code, so one at a time left cores idle. Fails with the first error, in
/// source order.
fn run_all(jobs: Vec<(String, Command)>) {
    let workers = std::env::var("NUM_JOBS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .clamp(1, jobs.len().max(1));
    let queue = std::sync::Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop();
                let Some((i, (what, cmd))) = next else { break };
                if let Err(e) = run(cmd, &what) {
                    errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((i, e));
                }
            });
        }
    });
    let mut errors = errors.into_inner().unwrap_or_else(|p| p.into_inner());
    errors.sort_by_key(|(i, _)| *i);
    if let Some((_, e)) = errors.into_iter().next() {
        fail(&e);
    }
}

/// Writes `file`, a Rust source declaring `pub static KERNEL_OBJECTS: &[(&str, &[u8])]` with
/// one `include_bytes!` per object.
pub fn write_index(file: &Path, objects: &[(String, PathBuf)]) {
    let mut gen = String::from(
        "/// (file stem, code object bytes) of every compiled kernel source.\npub static KERNEL_OBJECTS: &[(&str, &[u8])] = &[\n",
    );
    for (stem, path) in objects {
        gen.push_str(&format!(
            "    ({stem:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
    }
    gen.push_str("];\n");
    if let Err(e) = std::fs::write(file, gen) {
        fail(&format!("writing {}: {e}", file.display()));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    panic!("{msg}");
}

/// Every `.cu` file under `dir`, subfolders included (`collectives/allreduce.cu`), sorted.
pub fn list_sources(dir: &Path) -> Vec<PathBuf> {
    files_under(dir, |p| p.extension().is_some_and(|x| x == "cu"))
}

/// Every file under `dir` (subfolders included) that `keep` accepts, sorted; unreadable
/// folders are left out.
pub(crate) fn files_under(dir: &Path, keep: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for p in rd.filter_map(|e| e.ok().map(|e| e.path())) {
            if p.is_dir() {
                todo.push(p);
            } else if keep(&p) {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

/// The embedded name of a source: its path under `root` without `.cu`, folders joined by `/`
/// (`collectives/allreduce`).
pub fn stem_of(p: &Path, root: &Path) -> String {
    let rel = p.strip_prefix(root).unwrap_or(p).with_extension("");
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

fn run(mut cmd: Command, what: &str) -> Result<(), String> {
    match cmd.output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "{what} failed ({}):\n{:?}\n{}{}",
            o.status,
            cmd,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Err(format!("{what}: cannot run {:?}: {e}", cmd.get_program())),
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `$VAR`, then `$HOME_VAR/bin/name` for each home variable, then PATH, then fixed fallbacks.
fn find_tool(var: &str, homes: &[&str], name: &str, fallbacks: &[&str]) -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    if let Some(v) = std::env::var_os(var) {
        let p = PathBuf::from(v);
        if p.is_file() || on_path(&p.to_string_lossy()).is_some() {
            return Ok(p);
        }
        tried.push(format!("${var}={}", p.display()));
    }
    for home in homes {
        if let Some(h) = std::env::var_os(home) {
            let p = PathBuf::from(h).join("bin").join(name);
            if p.is_file() {
                return Ok(p);
            }
            tried.push(p.display().to_string());
        }
    }
    if let Some(p) = on_path(name) {
        return Ok(p);
    }
    tried.push(format!("{name} on PATH"));
    for f in fallbacks {
        if Path::new(f).is_file() {
            return Ok(PathBuf::from(f));
        }
        tried.push((*f).to_string());
    }
    Err(tried.join(", "))
}

fn find_nvcc() -> Result<PathBuf, String> {
    find_tool(
        "NVCC",
        &["CUDA_HOME", "CUDA_PATH"],
        "nvcc",
        &["/usr/local/cuda/bin/nvcc"],
    )
    .or_else(|tried| {
        // cc's own discovery (it also honours NVCC); accept it only if it resolves to a file.
        let c = cc::Build::new()
            .cuda(true)
            .cargo_metadata(false)
            .get_compiler();
        let p = c.path().to_path_buf();
        if p.is_file() || on_path(&p.to_string_lossy()).is_some() {
            Ok(p)
        } else {
            Err(format!("{tried}, cc's discovery ({})", p.display()))
        }
    })
}

/// The -gencode flags, dropping (with a warning) any arch this nvcc does not list.
fn nvcc_gencode(nvcc: &Path) -> Vec<String> {
    let all = [
        ("compute_80", "sm_80"),
        ("compute_90", "sm_90"),
        ("compute_100", "sm_100"),
        ("compute_90", "compute_90"),
    ];
    // MSCCLPP_CUDA_ARCHS=90 (a comma list of sm numbers) builds only those machine codes, no
    // PTX: a build for one known GPU takes a quarter of the time.
    let only: Option<Vec<String>> = std::env::var("MSCCLPP_CUDA_ARCHS")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .map(|v| v.split(',').map(|a| format!("sm_{}", a.trim())).collect());
    let wanted: Vec<(&str, &str)> = match &only {
        Some(list) => all
            .iter()
            .copied()
            .filter(|(_, code)| list.iter().any(|a| a == code))
            .collect(),
        None => all.to_vec(),
    };
    let listed = Command::new(nvcc)
        .arg("--list-gpu-arch")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let mut flags = Vec::new();
    for (virt, code) in wanted {
        let ok = match &listed {
            Some(text) => text.split_whitespace().any(|a| a == virt),
            None => true,
        };
        if ok {
            flags.push("-gencode".to_string());
            flags.push(format!("arch={virt},code={code}"));
        } else {
            println!(
                "cargo::warning=nvcc {} does not support {virt}; skipping code={code}",
                nvcc.display()
            );
        }
    }
    flags
}

/// The line a source carries when its `__noinline__` functions must stay calls on ROCm.
pub const FUNCTION_CALLS_MARKER: &str = "// mscclpp-kernel-build: amdgpu-function-calls";

/// Whether `src` carries [`FUNCTION_CALLS_MARKER`] on a line of its own.
pub fn wants_function_calls(src: &Path) -> bool {
    std::fs::read_to_string(src)
        .map(|t| t.lines().any(|l| l.trim() == FUNCTION_CALLS_MARKER))
        .unwrap_or(false)
}

/// The flags that keep a marked source's functions as calls on ROCm: hipcc 5.x adds
/// `-mllvm -amdgpu-early-inline-all=true -mllvm -amdgpu-function-calls=false`, which inlines
/// everything into the kernel, `__noinline__` too. For the executor (an interpreter whose ops
/// are out-of-line functions, as in the CUDA build) that made one 7 MB function that took
/// hipcc ~7 minutes per build (2026-12-05, gfx90a, clang 15); with calls, 218 KB in 14 s.
/// Each flag is kept only if this hipcc accepts it (newer LLVM may not know
/// `-amdgpu-function-calls`; newer hipcc no longer inlines everything).
fn hip_call_flags(hipcc: &Path, out: &Path) -> Vec<String> {
    let mut flags = Vec::new();
    for opt in [
        "-amdgpu-early-inline-all=false",
        "-amdgpu-function-calls=true",
    ] {
        if hipcc_accepts(hipcc, out, &["--offload-arch=gfx90a", "-mllvm", opt]) {
            flags.push("-mllvm".to_string());
            flags.push(opt.to_string());
        } else {
            println!(
                "cargo::warning=hipcc {} rejects -mllvm {opt}; leaving it out",
                hipcc.display()
            );
        }
    }
    flags
}

/// The TMPDIR of hipcc's processes: a folder in `out`. hipcc (clang's offload bundling) leaves
/// an empty `/tmp/<source>-<hex>` folder behind per compile; every ROCm build left about 30 of
/// them on the CI machine, now they go with the target folder.
fn hip_tmp(out: &Path) -> PathBuf {
    let tmp = out.join("hip-tmp");
    if let Err(e) = std::fs::create_dir_all(&tmp) {
        fail(&format!("creating {}: {e}", tmp.display()));
    }
    tmp
}

/// Whether `hipcc` compiles an empty kernel with `args` (into `out`).
fn hipcc_accepts(hipcc: &Path, out: &Path, args: &[&str]) -> bool {
    let probe = out.join("hal_probe.hip");
    std::fs::write(&probe, "extern \"C\" __global__ void hal_probe() {}\n").is_ok()
        && Command::new(hipcc)
            .env("HIP_PLATFORM", "amd")
            .env("TMPDIR", hip_tmp(out))
            .args(["-x", "hip", "--genco"])
            .args(args)
            .arg("-o")
            .arg(out.join("hal_probe.hsaco"))
            .arg(&probe)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
}

/// `--offload-arch` flags: gfx90a always, gfx942 when this hipcc accepts it; or exactly the
/// comma list in `MSCCLPP_HIP_ARCHS` (e.g. `gfx90a`: CI builds one arch, each arch of each
/// kernel file is a separate, slow hipcc compile).
fn hip_archs(hipcc: &Path, out: &Path) -> Vec<String> {
    if let Some(list) = std::env::var("MSCCLPP_HIP_ARCHS")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        return list
            .split(',')
            .map(|a| a.trim())
            .filter(|a| !a.is_empty())
            .map(|a| {
                if !a.starts_with("gfx") || !a[3..].chars().all(|c| c.is_ascii_alphanumeric()) {
                    fail(&format!(
                        "MSCCLPP_HIP_ARCHS: expected a comma list of gfx targets such as gfx90a,gfx942, got {list:?}"
                    ));
                }
                format!("--offload-arch={a}")
            })
            .collect();
    }
    let mut archs = vec!["--offload-arch=gfx90a".to_string()];
    let ok = hipcc_accepts(hipcc, out, &["--offload-arch=gfx942"]);
    if ok {
        archs.push("--offload-arch=gfx942".to_string());
    } else {
        println!(
            "cargo::warning=hipcc {} rejects gfx942; building gfx90a only",
            hipcc.display()
        );
    }
    archs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_key_ignores_the_output_source_and_tmpdir_but_not_flags_or_other_variables() {
        let base = cache::Digest::default();
        let cmd = |out: &str, tmp: &str, flag: &str, platform: &str| {
            let mut c = Command::new("hipcc");
            c.env("HIP_PLATFORM", platform)
                .env("TMPDIR", tmp)
                .args(["--genco", flag, "-o", out, "src.hip"]);
            c
        };
        let a = object_key(&base, "k", &cmd("/a/k.hsaco", "/a/hip-tmp", "-O3", "amd"));
        assert_eq!(
            a,
            object_key(&base, "k", &cmd("/b/k.hsaco", "/b/hip-tmp", "-O3", "amd"))
        );
        assert_ne!(
            a,
            object_key(&base, "k", &cmd("/a/k.hsaco", "/a/hip-tmp", "-O2", "amd"))
        );
        assert_ne!(
            a,
            object_key(
                &base,
                "k",
                &cmd("/a/k.hsaco", "/a/hip-tmp", "-O3", "nvidia")
            )
        );
    }

    #[test]
    fn the_function_calls_marker_must_be_a_line_of_its_own() {
        let dir = std::env::temp_dir().join(format!("mscclpp-kmarker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let marked = dir.join("a.cu");
        std::fs::write(
            &marked,
            format!("// x\n  {FUNCTION_CALLS_MARKER}\n#include \"b.cuh\"\n"),
        )
        .unwrap();
        assert!(wants_function_calls(&marked));
        let quoted = dir.join("b.cu");
        std::fs::write(&quoted, format!("// see {FUNCTION_CALLS_MARKER} in a.cu\n")).unwrap();
        assert!(!wants_function_calls(&quoted), "mentioned, not carried");
        assert!(!wants_function_calls(&dir.join("missing.cu")));
        let shipped = kernels_dir(2).join("cuda/src/executor");
        for k in ["executor.cu", "executor_narrow.cu", "executor_prefetch.cu"] {
            assert!(
                wants_function_calls(&shipped.join(k)),
                "{k} carries the marker"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn stems_keep_subfolders_and_sources_are_found_recursively() {
        let root = std::env::temp_dir().join(format!("kernel-build-test-{}", std::process::id()));
        let sub = root.join("collectives");
        std::fs::create_dir_all(&sub).expect("temp dirs");
        for f in [root.join("b.cu"), sub.join("a.cu"), root.join("x.hpp")] {
            std::fs::write(&f, "").expect("temp file");
        }
        let found = list_sources(&root);
        let stems: Vec<String> = found.iter().map(|p| stem_of(p, &root)).collect();
        assert_eq!(stems, vec!["b".to_string(), "collectives/a".to_string()]);
        assert!(list_sources(&root.join("missing")).is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn backend_names_round_trip() {
        for b in [Backend::Host, Backend::Cuda, Backend::Rocm] {
            assert_eq!(Backend::from_name(b.name()), Some(b));
        }
        assert_eq!(Backend::from_name("vulkan"), None);
        assert_eq!(Backend::from_flags(true, true), Backend::Cuda);
        assert_eq!(Backend::from_flags(false, true), Backend::Rocm);
        assert_eq!(Backend::from_flags(false, false), Backend::Host);
    }
}
