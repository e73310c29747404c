//! Kernel launching for the collectives and the executor on GPU builds: code objects loaded
//! once per `GpuCtx`, kernels looked up once by their typed name ([`crate::kernels`]),
//! launches on the caller's stream (wrapped non-owningly through [`mscclpp_hal::StreamInterop`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mscclpp_hal::{prelude::*, Gpu, LaunchConfig, StreamInterop};

use super::types::RawStream;
use crate::error::{Error, Result};
use crate::kernels::{self, CodeObject, Kernel};
use crate::memory::hal_err;

/// The GPU side of one `Collectives`: device, modules (by stem), kernels (by stem and name).
pub struct GpuCtx {
    dev: <Gpu as Api>::Device,
    modules: Mutex<HashMap<&'static str, <Gpu as Api>::Module>>,
    /// By the addresses of the kernel's stem and name (the generated `'static` names): a lookup
    /// per launch hashes two words, not two strings. The same text at another address is only
    /// a second entry.
    kernels: Mutex<HashMap<(usize, usize), <Gpu as Api>::Kernel>>,
}

impl std::fmt::Debug for GpuCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCtx")
            .field("dev", &self.dev)
            .finish_non_exhaustive()
    }
}

/// Loads `object` on `dev`: an error when this build embeds no code for it.
fn load(dev: &<Gpu as Api>::Device, object: &CodeObject) -> Result<<Gpu as Api>::Module> {
    let stem = object.stem();
    let code = object.code().ok_or_else(|| {
        Error::invalid(format!(
            "collectives: this build embeds no code object `{stem}` (built without a GPU feature?)"
        ))
    })?;
    Gpu::load_module(dev, code).map_err(|e| hal_err(&format!("load code object {stem}"), e))
}

impl GpuCtx {
    /// The context of GPU `id`, with every collectives code object
    /// ([`kernels::collectives::OBJECTS`]) loaded (all their kernels too, see the CUDA
    /// backend's `load_module`): loading one at a first launch could wait for kernels running
    /// on the GPU, which under MPS include other ranks' kernels waiting for this rank's. Loaded
    /// per `Collectives`, not once per process: the code objects hold module-scope state (the
    /// grid barrier word of mesh.hpp, tagged with the communicator's own flags), so two
    /// communicators sharing a module would pass each other's grid barriers (a process-wide
    /// cache did: wrong `rsag_pipeline` results at 4 ranks on an H200, 2026-12-02). Objects
    /// this build does not embed (host backend, skipped device code) are left out; a launch of
    /// one of their kernels says so.
    pub fn new(id: i32) -> Result<GpuCtx> {
        let dev = crate::memory::gpu_device(id)?;
        let mut modules = HashMap::new();
        for object in kernels::collectives::OBJECTS {
            if object.code().is_some() {
                modules.insert(object.stem(), load(&dev, object)?);
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

    /// The loaded kernel `k` (cached; its code object is loaded here if [`GpuCtx::new`] did
    /// not, as the executor's is).
    pub fn kernel(&self, k: Kernel) -> Result<<Gpu as Api>::Kernel> {
        let (stem, name) = (k.object().stem(), k.name());
        let key = (stem.as_ptr() as usize, name.as_ptr() as usize);
        if let Some(loaded) = self
            .kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(loaded.clone());
        }
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if !modules.contains_key(stem) {
            modules.insert(stem, load(&self.dev, k.object())?);
        }
        let module = modules
            .get(stem)
            .ok_or_else(|| Error::Internal(format!("module {stem} vanished")))?;
        let loaded = Gpu::get_kernel(module, name).map_err(|e| {
            Error::invalid(format!(
                "collectives: code object `{stem}` has no kernel `{name}` (that data type / operation is not built for this GPU backend): {e}"
            ))
        })?;
        self.kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, loaded.clone());
        Ok(loaded)
    }

    /// Launches `k` on `blocks` blocks of `threads` threads with the `#[repr(C)]` argument
    /// block `args` on `stream`: the one launch every collective and the executor make.
    ///
    /// # Safety
    /// `A` matches the kernel's parameters; every address in it stays valid until the kernel
    /// finished; `stream` is 0 or a live stream of this device's context.
    pub unsafe fn launch<A: Copy>(
        &self,
        k: Kernel,
        blocks: u32,
        threads: u32,
        args: &A,
        stream: RawStream,
    ) -> Result<()> {
        let loaded = self.kernel(k)?;
        // SAFETY: forwarded from the caller (stream ownership stays with the caller).
        let s = unsafe { Gpu::borrow_stream(&self.dev, stream) };
        // SAFETY: forwarded from the caller.
        unsafe { Gpu::launch(&loaded, &LaunchConfig::linear(blocks, threads), &s, args) }
            .map_err(|e| hal_err(&format!("launch {}", k.name()), e))
    }

    /// Launches `kernel` (loaded outside this context's code objects: a plan compiled at run
    /// time) on `blocks` blocks of `threads` threads with its parameters packed in `params`.
    ///
    /// # Safety
    /// As [`GpuCtx::launch`]: `params` covers the kernel's parameters, and `kernel` was loaded on
    /// this context's device.
    pub(crate) unsafe fn launch_loaded(
        &self,
        kernel: &<Gpu as Api>::Kernel,
        blocks: u32,
        threads: u32,
        params: &[u8],
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller (stream ownership stays with the caller).
        let s = unsafe { Gpu::borrow_stream(&self.dev, stream) };
        // SAFETY: forwarded from the caller.
        unsafe { Gpu::launch_raw(kernel, &LaunchConfig::linear(blocks, threads), &s, params) }
            .map_err(|e| hal_err("launch a compiled plan", e))
    }

    /// Whether `stream` is being captured into a graph.
    pub fn is_capturing(&self, stream: RawStream) -> Result<bool> {
        // SAFETY: the caller of the collective passed a live stream (or 0).
        let s = unsafe { Gpu::borrow_stream(&self.dev, stream) };
        Gpu::is_capturing(&s).map_err(|e| hal_err("query stream capture", e))
    }
}

/// A per-communicator state built on first use (collectively, by the caller's `build`) and
/// kept: the lazy channel states of the NVLS and port-channel algorithms.
pub(crate) struct LazyState<T> {
    slot: Mutex<Option<Arc<T>>>,
}

impl<T> Default for LazyState<T> {
    fn default() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }
}

impl<T> LazyState<T> {
    /// Whether the state was built.
    pub(crate) fn is_built(&self) -> bool {
        self.slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The state, built by `build` on first use; `None` while `gpu`'s stream is capturing a
    /// graph before it was built (nothing collective may run then). A failed build leaves it
    /// unbuilt.
    pub(crate) fn get_or_build(
        &self,
        gpu: Option<(&GpuCtx, RawStream)>,
        build: impl FnOnce() -> Result<T>,
    ) -> Result<Option<Arc<T>>> {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slot.as_ref() {
            return Ok(Some(s.clone()));
        }
        if let Some((g, stream)) = gpu {
            if g.is_capturing(stream)? {
                return Ok(None);
            }
        }
        let s = Arc::new(build()?);
        *slot = Some(s.clone());
        Ok(Some(s))
    }
}
