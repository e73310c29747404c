//! Emits the backend cfg aliases once and compiles the device code objects.
//!
//! cfgs: `hal_cuda` / `hal_rocm` (backend built), `hal_gpu_cuda` / `hal_gpu_rocm` /
//! `hal_gpu_host` (which backend `Gpu` names). With `cuda` every `kernels/cuda/src/*.cu` is
//! compiled by nvcc into a fatbin; with `rocm` (and not `cuda`) the same sources by hipcc into
//! code objects. `OUT_DIR/kernels.rs` embeds them as `KERNEL_OBJECTS`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    for cfg in [
        "hal_cuda",
        "hal_rocm",
        "hal_gpu_cuda",
        "hal_gpu_rocm",
        "hal_gpu_host",
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    let cuda = std::env::var_os("CARGO_FEATURE_CUDA").is_some();
    let rocm = std::env::var_os("CARGO_FEATURE_ROCM").is_some();
    if cuda {
        println!("cargo::rustc-cfg=hal_cuda");
    }
    if rocm {
        println!("cargo::rustc-cfg=hal_rocm");
    }
    let gpu = if cuda {
        "hal_gpu_cuda"
    } else if rocm {
        "hal_gpu_rocm"
    } else {
        "hal_gpu_host"
    };
    println!("cargo::rustc-cfg={gpu}");

    let manifest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kernels = manifest.join("..").join("kernels");
    let cuda_src = kernels.join("cuda").join("src");
    let cuda_inc = kernels.join("cuda").join("include");
    let hip_inc = kernels.join("hip").join("include");
    println!("cargo::rerun-if-changed=build.rs");
    for dir in [&cuda_src, &cuda_inc, &hip_inc] {
        println!("cargo::rerun-if-changed={}", dir.display());
    }
    for var in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "HIPCC",
        "ROCM_PATH",
        "PATH",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }

    let sources = list_sources(&cuda_src);
    let mut objects: Vec<(String, PathBuf)> = Vec::new();
    if cuda {
        if rocm {
            println!("cargo::warning=both `cuda` and `rocm` are on: Gpu = Cuda and only CUDA kernels are embedded");
        }
        let nvcc = find_nvcc().unwrap_or_else(|tried| {
            fail(&format!(
                "feature `cuda` needs nvcc; tried {tried}. Install it (see TOOLCHAIN.md: pinned PyPI nvidia-cuda-nvcc) and set NVCC or PATH"
            ))
        });
        let gencode = nvcc_gencode(&nvcc);
        for src in &sources {
            let stem = stem_of(src, &cuda_src);
            let dst = out.join(format!("{}.fatbin", stem.replace('/', "__")));
            let mut cmd = Command::new(&nvcc);
            cmd.arg("-I")
                .arg(&cuda_inc)
                .arg("-fatbin")
                .args(&gencode)
                .args(["-O3", "-std=c++17", "-o"])
                .arg(&dst)
                .arg(src);
            run(cmd, &format!("nvcc {}", src.display()));
            objects.push((stem, dst));
        }
    } else if rocm {
        let hipcc = find_tool("HIPCC", &["ROCM_PATH"], "hipcc", &["/opt/rocm/bin/hipcc"]).unwrap_or_else(|tried| {
            fail(&format!("feature `rocm` needs hipcc; tried {tried}. Install it (apt-get install hipcc) or set HIPCC"))
        });
        let archs = hip_archs(&hipcc, &out);
        for src in &sources {
            let stem = stem_of(src, &cuda_src);
            let dst = out.join(format!("{}.hsaco", stem.replace('/', "__")));
            let mut cmd = Command::new(&hipcc);
            // hipcc picks the NVIDIA platform when it finds nvcc (PATH, /usr/local/cuda); we
            // always want AMD code objects here.
            cmd.env("HIP_PLATFORM", "amd");
            cmd.args(["-x", "hip"])
                .args(&archs)
                .args(["--genco", "-O3", "-std=c++17", "-I"])
                .arg(&hip_inc)
                .arg("-I")
                .arg(&cuda_inc);
            cmd.arg("-o").arg(&dst).arg(src);
            run(cmd, &format!("hipcc {}", src.display()));
            objects.push((stem, dst));
        }
    }

    let mut gen = String::from("/// (file stem, code object bytes) of every compiled kernel source.\npub static KERNEL_OBJECTS: &[(&str, &[u8])] = &[\n");
    for (stem, path) in &objects {
        gen.push_str(&format!(
            "    ({stem:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
    }
    gen.push_str("];\n");
    if let Err(e) = std::fs::write(out.join("kernels.rs"), gen) {
        fail(&format!(
            "writing {}: {e}",
            out.join("kernels.rs").display()
        ));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    panic!("{msg}");
}

/// Every `.cu` file under `dir`, subfolders included (`collectives/allreduce.cu`), sorted.
fn list_sources(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for p in rd.filter_map(|e| e.ok().map(|e| e.path())) {
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "cu") {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

/// The embedded name of a source: its path under kernels/cuda/src without `.cu`, folders
/// joined by `/` (`collectives/allreduce`).
fn stem_of(p: &Path, root: &Path) -> String {
    let rel = p.strip_prefix(root).unwrap_or(p).with_extension("");
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

fn run(mut cmd: Command, what: &str) {
    match cmd.output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => fail(&format!(
            "{what} failed ({}):\n{:?}\n{}{}",
            o.status,
            cmd,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => fail(&format!("{what}: cannot run {:?}: {e}", cmd.get_program())),
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
    let wanted = [
        ("compute_80", "sm_80"),
        ("compute_90", "sm_90"),
        ("compute_100", "sm_100"),
        ("compute_90", "compute_90"),
    ];
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

/// `--offload-arch` flags: gfx90a always, gfx942 when this hipcc accepts it.
fn hip_archs(hipcc: &Path, out: &Path) -> Vec<String> {
    let mut archs = vec!["--offload-arch=gfx90a".to_string()];
    let probe = out.join("hal_probe_gfx942.hip");
    let ok = std::fs::write(&probe, "extern \"C\" __global__ void hal_probe() {}\n").is_ok()
        && Command::new(hipcc)
            .env("HIP_PLATFORM", "amd")
            .args(["-x", "hip", "--offload-arch=gfx942", "--genco", "-o"])
            .arg(out.join("hal_probe_gfx942.hsaco"))
            .arg(&probe)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
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
