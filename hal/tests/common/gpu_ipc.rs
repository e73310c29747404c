//! Two-process GPU IPC check shared by `tests/gpu_ipc.rs` and `examples/hal_ipc_check.rs`.
//!
//! Process A allocates on GPU 0 (round 1: Physical exported as a POSIX fd; round 2: Device
//! exported as a legacy IPC handle), poisons the memory, exports it and starts process B.
//! B opens GPU 1 (GPU 0 when there is one GPU), imports the descriptor, launches the embedded
//! `hal_fill_u32` kernel through the imported pointer with a fresh random seed and exits.
//! A then verifies every element.

#![allow(dead_code)] // each test binary that includes it uses a different subset

use mscclpp_hal::{prelude::*, Buffer, Gpu, IpcDescriptor, IpcKind, LaunchConfig, MemoryKind};
use std::process::Command;
use std::time::{Duration, Instant};

pub const ROLE: &str = "MSCCLPP_HAL_IPC_ROLE";
const DESC: &str = "MSCCLPP_HAL_IPC_DESC";
const SEED: &str = "MSCCLPP_HAL_IPC_SEED";
const DEV: &str = "MSCCLPP_HAL_IPC_DEV";
const WORDS: usize = (64 << 20) / 4 + 123;
const POISON: u8 = 0xab;

/// The argument block of the embedded `hal_fill_u32` kernel.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FillArgs {
    pub dst: u64,
    pub n: u64,
    pub seed: u32,
}

pub struct Row {
    pub round: &'static str,
    pub kind: IpcKind,
    pub importer_gpu: usize,
    pub elements: usize,
    pub mismatches: usize,
    pub seconds: f64,
}

pub fn pattern(i: usize, seed: u32) -> u32 {
    seed ^ (i as u64).wrapping_mul(2_654_435_761) as u32
}

pub fn random_seed() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0) as u64;
    let x =
        t ^ (u64::from(std::process::id()) << 40) ^ (Box::into_raw(Box::new(0u8)) as usize as u64);
    let x = (x ^ (x >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (x ^ (x >> 29)) as u32
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("odd hex length {}", s.len()));
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string()))
        .collect()
}

/// Why the check cannot run here, if it cannot.
pub fn skip_reason() -> Option<String> {
    if <Gpu as Api>::NAME == "host" {
        return Some("built without a GPU backend (use --features cuda or rocm)".into());
    }
    if mscclpp_test_kernels::object("hal_test").is_none() {
        return Some("no embedded hal_test code object".into());
    }
    match Gpu::device_count() {
        Ok(0) => Some("no GPU".into()),
        Ok(_) => None,
        Err(e) => Some(format!("no GPU: {e}")),
    }
}

/// GPU 0 and kernel `kernel` of the embedded hal_test code object for test `test`; `None`
/// (after printing why) where the test cannot run.
pub fn gpu_and_kernel(
    test: &str,
    kernel: &str,
) -> Option<(<Gpu as Api>::Device, <Gpu as Api>::Kernel)> {
    if let Some(reason) = skip_reason() {
        println!("SKIPPED {test}: {reason}");
        return None;
    }
    let dev = Gpu::open_device(0).expect("open GPU 0");
    let code = mscclpp_test_kernels::object("hal_test").expect("hal_test code object");
    let module = Gpu::load_module(&dev, code).expect("load hal_test");
    let k = Gpu::get_kernel(&module, kernel).unwrap_or_else(|e| panic!("{kernel}: {e}"));
    Some((dev, k))
}

/// Process B: import, fill through the imported pointer, synchronize.
pub fn child() -> Result<(), String> {
    let get = |k: &str| std::env::var(k).map_err(|_| format!("child: {k} not set"));
    let desc = IpcDescriptor::from_bytes(&unhex(&get(DESC)?)?).map_err(|e| e.to_string())?;
    let seed: u32 = get(SEED)?.parse().map_err(|e| format!("seed: {e}"))?;
    let ordinal: usize = get(DEV)?.parse().map_err(|e| format!("device: {e}"))?;
    let dev = Gpu::open_device(ordinal).map_err(|e| e.to_string())?;
    let imported = Gpu::import(&dev, &desc).map_err(|e| format!("import {:?}: {e}", desc.kind))?;
    let code = mscclpp_test_kernels::object("hal_test").ok_or("no hal_test code object")?;
    let module = Gpu::load_module(&dev, code).map_err(|e| e.to_string())?;
    let fill = Gpu::get_kernel(&module, "hal_fill_u32").map_err(|e| e.to_string())?;
    let stream = Gpu::create_stream(&dev).map_err(|e| e.to_string())?;
    let n = imported.size() / 4;
    let args = FillArgs {
        dst: imported.device_ptr(),
        n: n as u64,
        seed,
    };
    let blocks = n.div_ceil(256).min(4096) as u32;
    // SAFETY: FillArgs matches hal_fill_u32(uint32_t*, uint64_t, uint32_t); the imported memory
    // outlives the kernel (we synchronize before dropping it).
    unsafe { Gpu::launch(&fill, &LaunchConfig::linear(blocks, 256), &stream, &args) }
        .map_err(|e| e.to_string())?;
    Gpu::stream_synchronize(&stream, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    Ok(())
}

/// Process A: both rounds. `spawn` builds the command that runs [`child`] in a new process.
pub fn parent(spawn: &dyn Fn() -> Command) -> Result<Vec<Row>, String> {
    let count = Gpu::device_count().map_err(|e| e.to_string())?;
    let importer_gpu = if count > 1 { 1 } else { 0 };
    let dev = Gpu::open_device(0).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for (round, kind, mem_kind) in [
        (
            "physical/posix-fd",
            IpcKind::PosixFd,
            MemoryKind::Physical { granularity: 0 },
        ),
        ("device/legacy", IpcKind::Legacy, MemoryKind::Device),
    ] {
        let start = Instant::now();
        let mem =
            Gpu::alloc(&dev, WORDS * 4, mem_kind).map_err(|e| format!("{round}: alloc: {e}"))?;
        Gpu::memset(&dev, &mem, 0, POISON, WORDS * 4)
            .map_err(|e| format!("{round}: poison: {e}"))?;
        let desc = Gpu::export(&mem, kind).map_err(|e| format!("{round}: export: {e}"))?;
        let seed = random_seed();
        let status = spawn()
            .env(ROLE, "child")
            .env(DESC, hex(&desc.to_bytes()))
            .env(SEED, seed.to_string())
            .env(DEV, importer_gpu.to_string())
            .status()
            .map_err(|e| format!("{round}: spawn child: {e}"))?;
        if !status.success() {
            return Err(format!("{round}: child failed: {status}"));
        }
        let mut bytes = vec![0u8; WORDS * 4];
        Gpu::read(&dev, &mem, 0, &mut bytes).map_err(|e| format!("{round}: read back: {e}"))?;
        let mismatches = bytes
            .chunks_exact(4)
            .enumerate()
            .filter(|(i, w)| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) != pattern(*i, seed))
            .count();
        rows.push(Row {
            round,
            kind,
            importer_gpu,
            elements: WORDS,
            mismatches,
            seconds: start.elapsed().as_secs_f64(),
        });
    }
    Ok(rows)
}

pub fn print_table(rows: &[Row]) {
    println!(
        "| round | ipc kind | exporter gpu | importer gpu | elements | mismatches | seconds |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {:?} | 0 | {} | {} | {} | {:.3} |",
            r.round, r.kind, r.importer_gpu, r.elements, r.mismatches, r.seconds
        );
    }
}
