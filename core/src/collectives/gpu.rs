//! Kernel launching for the collectives on GPU builds: code objects loaded once per
//! `Collectives`, kernels looked up once by name, launches on the caller's stream (wrapped
//! non-owningly through [`mscclpp_hal::StreamInterop`]).

use std::collections::HashMap;
use std::sync::Mutex;

use mscclpp_hal::{prelude::*, Gpu, LaunchConfig, StreamInterop};

use super::types::RawStream;
use crate::error::{Error, Result};
use crate::memory::hal_err;

/// The GPU side of one `Collectives`: device, modules, kernels.
pub struct GpuCtx {
    dev: <Gpu as Api>::Device,
    modules: Mutex<HashMap<&'static str, <Gpu as Api>::Module>>,
    kernels: Mutex<HashMap<String, <Gpu as Api>::Kernel>>,
}

impl std::fmt::Debug for GpuCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCtx")
            .field("dev", &self.dev)
            .finish_non_exhaustive()
    }
}

impl GpuCtx {
    /// The context of GPU `id`, with every collectives code object loaded (all their kernels
    /// too, see the CUDA backend's `load_module`): loading one at a first launch could wait
    /// for kernels running on the GPU, which under MPS include other ranks' kernels waiting for
    /// this rank's. Loaded per `Collectives`, not once per process: the code objects hold
    /// module-scope state (the grid barrier word of mesh.hpp, tagged with the communicator's
    /// own flags), so two communicators sharing a module would pass each other's grid
    /// barriers (a process-wide cache did: wrong `rsag_pipeline` results at 4 ranks on an H200,
    /// 2026-12-02).
    pub fn new(id: i32) -> Result<GpuCtx> {
        let dev = crate::memory::gpu_device(id)?;
        let mut modules = HashMap::new();
        for stem in mscclpp_hal::kernels::stems().filter(|s| s.starts_with("collectives/")) {
            if let Some(code) = mscclpp_hal::kernels::object(stem) {
                let m = Gpu::load_module(&dev, code)
                    .map_err(|e| hal_err(&format!("load code object {stem}"), e))?;
                modules.insert(stem, m);
            }
        }
        Ok(GpuCtx {
            dev,
            modules: Mutex::new(modules),
            kernels: Mutex::new(HashMap::new()),
        })
    }

    /// The opened device.
    pub fn device(&self) -> &<Gpu as Api>::Device {
        &self.dev
    }

    /// Kernel `name` of code object `stem` (cached).
    pub fn kernel(&self, stem: &'static str, name: &str) -> Result<<Gpu as Api>::Kernel> {
        if let Some(k) = self
            .kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Ok(k.clone());
        }
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if !modules.contains_key(stem) {
            let code = mscclpp_hal::kernels::object(stem).ok_or_else(|| {
                Error::invalid(format!(
                    "collectives: this build embeds no code object `{stem}` (built without a GPU feature?)"
                ))
            })?;
            let m = Gpu::load_module(&self.dev, code)
                .map_err(|e| hal_err(&format!("load code object {stem}"), e))?;
            modules.insert(stem, m);
        }
        let module = modules
            .get(stem)
            .ok_or_else(|| Error::Internal(format!("module {stem} vanished")))?;
        let k = Gpu::get_kernel(module, name).map_err(|e| {
            Error::invalid(format!(
                "collectives: code object `{stem}` has no kernel `{name}` (that data type / operation is not built for this GPU backend): {e}"
            ))
        })?;
        self.kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), k.clone());
        Ok(k)
    }

    /// Launches `name` of `stem` with the `#[repr(C)]` argument block `args` on `stream`.
    ///
    /// # Safety
    /// `A` matches the kernel's parameters; every address in it stays valid until the kernel
    /// finished; `stream` is 0 or a live stream of this device's context.
    pub unsafe fn launch<A: Copy>(
        &self,
        stem: &'static str,
        name: &str,
        blocks: u32,
        threads: u32,
        args: &A,
        stream: RawStream,
    ) -> Result<()> {
        let k = self.kernel(stem, name)?;
        // SAFETY: forwarded from the caller (stream ownership stays with the caller).
        let s = unsafe { Gpu::borrow_stream(&self.dev, stream) };
        // SAFETY: forwarded from the caller.
        unsafe { Gpu::launch(&k, &LaunchConfig::linear(blocks, threads), &s, args) }
            .map_err(|e| hal_err(&format!("launch {name}"), e))
    }

    /// Whether `stream` is being captured into a graph.
    pub fn is_capturing(&self, stream: RawStream) -> Result<bool> {
        // SAFETY: the caller of the collective passed a live stream (or 0).
        let s = unsafe { Gpu::borrow_stream(&self.dev, stream) };
        Gpu::is_capturing(&s).map_err(|e| hal_err("query stream capture", e))
    }
}
