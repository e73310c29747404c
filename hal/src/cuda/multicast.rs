//! CUDA multicast objects (NVLS): `cuMulticastCreate`, POSIX-fd (over the fd server) and fabric
//! export/import, `cuMulticastAddDevice`, `cuMulticastBindMem`, and a mapping of the whole
//! range `[0, offset + size)` (`cuMemMap` of a multicast handle needs offset 0) whose pointer is
//! offset by `offset` ([`crate::MulticastApi`] for [`Cuda`]).
//!
//! Every entry point first takes an [`NvlsPermit`]: while `MSCCLPP_FORCE_DISABLE_NVLS=1` or
//! `NCCL_NVLS_ENABLE=0` is set it returns [`Error::NvlsDisabled`] before any driver call, and the
//! result layer's `cuMulticast*` wrappers cannot be called without a permit.
//!
//! Export releases the local handle right after exporting when the object went out as a POSIX
//! fd (the fd references the object); a fabric handle references nothing, so an object that
//! also went out as fabric keeps its local handle inside the export until the export is
//! dropped. <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MULTICAST.html>

use super::conv::multicast_prop;
use super::device::CudaDevice;
use super::memory::{handle_types, map_handle, Backing, CudaMemory};
use super::result::{multicast as mcr, vmm};
use super::Cuda;
use crate::auxil::deferred;
use crate::auxil::fdpass::{self, host_id, FdRegistration, FD_FETCH_TIMEOUT};
use crate::multicast::{
    check_bind, check_create, check_map, decode_params, encode_params, round_up, Kind, Live,
    BIND_WAIT,
};
use crate::{
    Buffer, Error, IpcDescriptor, IpcKind, MulticastApi, MulticastGranularity, MulticastInfo,
    NvlsPermit, Result,
};
use cudarc::driver::sys;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

const FABRIC_HANDLE_BYTES: usize = 64;

/// A process's handle of a multicast object. Clones share it; the last releases it.
#[derive(Clone, Debug)]
pub struct CudaMulticast {
    inner: Arc<McHandle>,
}

#[derive(Debug)]
struct McHandle {
    dev: CudaDevice,
    handle: sys::CUmemGenericAllocationHandle,
    info: MulticastInfo,
    /// Handle types it was created with (creator only; 0 for imports).
    handle_types: u32,
    /// The ordinal this handle added, if any.
    added: Mutex<Option<usize>>,
    permit: NvlsPermit,
    _live: Live,
}

impl Drop for McHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuMulticastCreate or an import and is released once.
        deferred::release(self.dev.bind(), || unsafe { vmm::release(self.handle) });
    }
}

/// An exported multicast object: the POSIX fd registered with the fd server and, when it went
/// out as fabric too, the local handle (see the module docs).
#[derive(Debug)]
pub struct CudaMulticastExport {
    descs: Vec<IpcDescriptor>,
    _fd: Option<FdRegistration>,
    _fabric_keep: Option<CudaMulticast>,
    _live: Live,
}

/// Memory bound to a multicast object; dropping it unbinds (`cuMulticastUnbind`).
#[derive(Debug)]
pub struct CudaMulticastBinding {
    mc: CudaMulticast,
    dev: CudaDevice,
    mc_offset: usize,
    size: usize,
    _live: Live,
}

impl Drop for CudaMulticastBinding {
    fn drop(&mut self) {
        let m = &self.mc.inner;
        // SAFETY: this range was bound for this device by `bind` and is unbound once.
        deferred::release(self.dev.bind(), || unsafe {
            mcr::unbind(
                m.permit,
                m.handle,
                self.dev.cu_device(),
                self.mc_offset,
                self.size,
            )
        });
    }
}

/// A mapping of a multicast object: `[base, base + len)` maps `[0, len)` of the object; the
/// device pointer is `base + offset`.
#[derive(Debug)]
pub struct CudaMulticastMapping {
    mc: CudaMulticast,
    base: u64,
    len: usize,
    offset: usize,
    size: usize,
    _live: Live,
}

// Thread-safe: device addresses may be used from any thread; immutable after creation.
thread_safe!(CudaMulticastMapping);

impl Buffer for CudaMulticastMapping {
    fn device_ptr(&self) -> u64 {
        self.base + self.offset as u64
    }
    fn size(&self) -> usize {
        self.size
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }
}

impl Drop for CudaMulticastMapping {
    fn drop(&mut self) {
        // SAFETY: base/len was reserved and mapped by `map` and is released once.
        deferred::release(self.mc.inner.dev.bind(), || unsafe {
            let a = vmm::unmap(self.base, self.len);
            let b = vmm::address_free(self.base, self.len);
            a.and(b)
        });
    }
}

fn granularity(
    permit: NvlsPermit,
    size: usize,
    ndevices: usize,
    types: u32,
) -> Result<MulticastGranularity> {
    let prop = multicast_prop(size, ndevices, types);
    Ok(MulticastGranularity {
        minimum: mcr::granularity(permit, &prop, false)?.max(1),
        recommended: mcr::granularity(permit, &prop, true)?.max(1),
    })
}

fn create(
    permit: NvlsPermit,
    dev: &CudaDevice,
    size: usize,
    ndevices: usize,
) -> Result<CudaMulticast> {
    const OP: &str = "create_multicast(cuda)";
    check_create(OP, size, ndevices)?;
    let (posix, preferred) = handle_types(dev);
    // Ask for fabric + POSIX fd where fabric is reported; without IMEX that can fail, so fall
    // back to POSIX fd alone.
    let attempt = |types: u32| -> Result<(sys::CUmemGenericAllocationHandle, MulticastInfo)> {
        let g = granularity(permit, size, ndevices, types)?;
        let rounded = round_up(OP, size, g.recommended.max(g.minimum))?;
        let h = mcr::create(permit, &multicast_prop(rounded, ndevices, types))?;
        let info = MulticastInfo {
            size: rounded,
            ndevices,
            granularity: g.minimum,
        };
        Ok((h, info))
    };
    let (handle, info, types) = match (preferred != posix).then(|| attempt(preferred)) {
        Some(Ok((h, i))) => (h, i, preferred),
        _ => {
            let (h, i) = attempt(posix)?;
            (h, i, posix)
        }
    };
    Ok(CudaMulticast {
        inner: Arc::new(McHandle {
            dev: dev.clone(),
            handle,
            info,
            handle_types: types,
            added: Mutex::new(None),
            permit,
            _live: Live::new(Kind::Handle),
        }),
    })
}

fn descriptor(info: &MulticastInfo, kind: IpcKind, fd_id: u64, extra: &[u8]) -> IpcDescriptor {
    IpcDescriptor {
        kind,
        size: info.size as u64,
        offset: 0,
        pid: std::process::id(),
        host_id: host_id(),
        fd_id,
        handle: encode_params(info, extra),
    }
}

fn export(mc: CudaMulticast) -> Result<CudaMulticastExport> {
    let m = &mc.inner;
    if m.handle_types == 0 {
        return Err(Error::invalid(
            "export_multicast(cuda)",
            "the handle create_multicast returned",
            "an imported handle",
        ));
    }
    let mut descs = Vec::new();
    let fabric_type = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC.0;
    let mut fabric = false;
    if m.handle_types & fabric_type != 0 {
        if let Ok(fh) = vmm::export_fabric(m.handle) {
            descs.push(descriptor(&m.info, IpcKind::Fabric, 0, &fh.data));
            fabric = true;
        }
    }
    let fd = vmm::export_posix_fd(m.handle)?;
    // SAFETY: the driver gave us a new fd that nobody else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let reg = fdpass::register(owned)?;
    descs.push(descriptor(&m.info, IpcKind::PosixFd, reg.id(), &[]));
    Ok(CudaMulticastExport {
        descs,
        _fd: Some(reg),
        // POSIX fd only: the handle is released here (the seed's leak fix); fabric: kept.
        _fabric_keep: fabric.then_some(mc),
        _live: Live::new(Kind::Export),
    })
}

fn import(permit: NvlsPermit, dev: &CudaDevice, desc: &IpcDescriptor) -> Result<CudaMulticast> {
    let extra_len = match desc.kind {
        IpcKind::PosixFd => 0,
        IpcKind::Fabric => FABRIC_HANDLE_BYTES,
        other => {
            return Err(Error::Unsupported {
                op: "import_multicast(cuda)",
                backend: "cuda",
                reason: format!("{other:?} (multicast objects export as PosixFd or Fabric)"),
            })
        }
    };
    let (info, extra) = decode_params(desc, extra_len)?;
    let handle = if desc.kind == IpcKind::Fabric {
        // SAFETY: plain C struct.
        let mut fh: sys::CUmemFabricHandle = unsafe { std::mem::zeroed() };
        fh.data.copy_from_slice(extra);
        vmm::import_fabric(&fh)?
    } else {
        let fd = fdpass::fetch(desc.host_id, desc.pid, desc.fd_id, FD_FETCH_TIMEOUT)?;
        // SAFETY: a live fd exported by cuMemExportToShareableHandle in the creator; the driver
        // does not take it over, and it is closed (dropped) once the handle exists.
        unsafe { vmm::import_posix_fd(fd.as_raw_fd()) }?
    };
    Ok(CudaMulticast {
        inner: Arc::new(McHandle {
            dev: dev.clone(),
            handle,
            info,
            handle_types: 0,
            added: Mutex::new(None),
            permit,
            _live: Live::new(Kind::Handle),
        }),
    })
}

fn add_device(permit: NvlsPermit, mc: &CudaMulticast, dev: &CudaDevice) -> Result<()> {
    let mut added = mc.inner.added.lock().unwrap_or_else(|p| p.into_inner());
    match *added {
        Some(o) if o == dev.ordinal() => return Ok(()),
        Some(o) => {
            return Err(Error::invalid(
                "multicast_add_device(cuda)",
                format!("device {o}, the one this handle already added"),
                format!("device {}", dev.ordinal()),
            ))
        }
        None => {}
    }
    // SAFETY: the handle is live (held by `mc`).
    unsafe { mcr::add_device(permit, mc.inner.handle, dev.cu_device()) }?;
    *added = Some(dev.ordinal());
    Ok(())
}

fn map(
    mc: &CudaMulticast,
    dev: &CudaDevice,
    offset: usize,
    size: usize,
) -> Result<CudaMulticastMapping> {
    let info = &mc.inner.info;
    let len = check_map("multicast_map(cuda)", info, offset, size)?;
    let base = map_handle(
        mc.inner.handle,
        len,
        info.granularity,
        &[dev.ordinal() as i32],
    )?;
    Ok(CudaMulticastMapping {
        mc: mc.clone(),
        base,
        len,
        offset,
        size,
        _live: Live::new(Kind::Mapping),
    })
}

impl MulticastApi for Cuda {
    fn multicast_granularity(
        dev: &CudaDevice,
        size: usize,
        ndevices: usize,
    ) -> Result<MulticastGranularity> {
        let permit = NvlsPermit::check("multicast_granularity(cuda)")?;
        check_create("multicast_granularity(cuda)", size, ndevices)?;
        dev.enter()?;
        granularity(permit, size, ndevices, handle_types(dev).1)
    }
    fn create_multicast(dev: &CudaDevice, size: usize, ndevices: usize) -> Result<CudaMulticast> {
        let permit = NvlsPermit::check("create_multicast(cuda)")?;
        dev.enter()?;
        create(permit, dev, size, ndevices)
    }
    fn export_multicast(mc: CudaMulticast) -> Result<CudaMulticastExport> {
        NvlsPermit::check("export_multicast(cuda)")?;
        mc.inner.dev.enter()?;
        export(mc)
    }
    fn multicast_descriptors(export: &CudaMulticastExport) -> Vec<IpcDescriptor> {
        export.descs.clone()
    }
    fn import_multicast(dev: &CudaDevice, desc: &IpcDescriptor) -> Result<CudaMulticast> {
        let permit = NvlsPermit::check("import_multicast(cuda)")?;
        dev.enter()?;
        import(permit, dev, desc)
    }
    fn multicast_info(mc: &CudaMulticast) -> MulticastInfo {
        mc.inner.info
    }
    fn multicast_add_device(mc: &CudaMulticast, dev: &CudaDevice) -> Result<()> {
        let permit = NvlsPermit::check("multicast_add_device(cuda)")?;
        dev.enter()?;
        add_device(permit, mc, dev)
    }
    unsafe fn multicast_bind(
        mc: &CudaMulticast,
        dev: &CudaDevice,
        mc_offset: usize,
        mem: &CudaMemory,
        mem_offset: usize,
        size: usize,
    ) -> Result<CudaMulticastBinding> {
        const OP: &str = "multicast_bind(cuda)";
        let permit = NvlsPermit::check(OP)?;
        dev.enter()?;
        let m = &mc.inner;
        if *m.added.lock().unwrap_or_else(|p| p.into_inner()) != Some(dev.ordinal()) {
            return Err(Error::invalid(
                OP,
                format!("device {} added through this handle first", dev.ordinal()),
                "a device this handle did not add",
            ));
        }
        let Backing::Physical {
            handle: mem_handle,
            mapped_len,
            ..
        } = mem.backing
        else {
            return Err(Error::invalid(
                OP,
                "memory allocated as MemoryKind::Physical (cuMem)",
                format!("{:?} memory", mem.kind()),
            ));
        };
        check_bind(OP, &m.info, mc_offset, mapped_len, mem_offset, size)?;
        // The driver blocks until every device was added: run it on a helper thread so a peer that
        // never adds its device becomes a timeout. A bind that completes after the timeout is undone
        // by the helper itself.
        let (tx, rx) = std::sync::mpsc::channel();
        let (keep, d, mc_handle) = (mc.clone(), dev.clone(), m.handle);
        std::thread::Builder::new()
            .name("mscclpp-hal-mcbind".into())
            .spawn(move || {
                // SAFETY: both handles are live (`keep` holds the object; the caller keeps `mem`
                // allocated while bound, per the trait's contract).
                let r = d.bind().and_then(|()| unsafe {
                    mcr::bind_mem(permit, mc_handle, mc_offset, mem_handle, mem_offset, size)
                });
                if let Err(std::sync::mpsc::SendError(Ok(()))) = tx.send(r) {
                    // SAFETY: bound just above; nobody else knows of this binding.
                    let _ =
                        unsafe { mcr::unbind(permit, mc_handle, d.cu_device(), mc_offset, size) };
                }
                drop(keep);
            })
            .map_err(|source| Error::Os {
                op: "spawn multicast bind thread",
                source,
            })?;
        match rx.recv_timeout(BIND_WAIT) {
            Ok(r) => r?,
            Err(_) => {
                return Err(Error::Timeout {
                    op: "cuMulticastBindMem (waiting for every device to be added)",
                    waited: BIND_WAIT,
                })
            }
        }
        Ok(CudaMulticastBinding {
            mc: mc.clone(),
            dev: dev.clone(),
            mc_offset,
            size,
            _live: Live::new(Kind::Binding),
        })
    }
    fn multicast_map(
        mc: &CudaMulticast,
        dev: &CudaDevice,
        offset: usize,
        size: usize,
    ) -> Result<CudaMulticastMapping> {
        NvlsPermit::check("multicast_map(cuda)")?;
        dev.enter()?;
        map(mc, dev, offset, size)
    }
}

#[cfg(test)]
mod tests {
    //! The gate: every entry point refuses while a switch disables NVLS, with no driver call.
    //! Runs anywhere (no GPU or driver needed): the parent test re-runs itself in child
    //! processes under each switch, whatever its own environment is; the child calls every entry
    //! point on never-opened stand-in objects (never dropped, so their `Drop` never reaches the
    //! driver either) and counts the driver calls of its thread.

    use super::*;
    use crate::auxil::driver_calls_on_this_thread;
    use crate::cuda::device::DeviceInner;
    use crate::MemoryKind;
    use std::process::Command;

    const CHILD: &str = crate::env::test_child::NVLS_GATE;
    const NAME: &str = "cuda::multicast::tests::entry_points_refuse_before_any_driver_call";
    const DONE: &str = "gate: 7 entry points refused with 0 driver calls";

    #[test]
    fn entry_points_refuse_before_any_driver_call() {
        if crate::env::test_child::marker(CHILD).is_some() {
            check_in_child();
            return;
        }
        let exe = std::env::current_exe().expect("test binary path");
        for (force, nccl) in [
            (Some("1"), None),
            (None, Some("0")),
            (Some("1"), Some("0")),
            (Some("yes"), Some("1")),
        ] {
            let mut c = Command::new(&exe);
            c.args(["--exact", NAME, "--nocapture", "--test-threads=1"])
                .env(CHILD, "1");
            for (var, value) in [
                ("MSCCLPP_FORCE_DISABLE_NVLS", force),
                ("NCCL_NVLS_ENABLE", nccl),
            ] {
                match value {
                    Some(v) => c.env(var, v),
                    None => c.env_remove(var),
                };
            }
            let out = c.output().expect("run the gate check in a child");
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && text.contains(DONE),
                "MSCCLPP_FORCE_DISABLE_NVLS={force:?} NCCL_NVLS_ENABLE={nccl:?}: {text}"
            );
            println!("{DONE} (MSCCLPP_FORCE_DISABLE_NVLS={force:?}, NCCL_NVLS_ENABLE={nccl:?})");
        }
    }

    fn expect_disabled<T: std::fmt::Debug>(what: &str, r: Result<T>) {
        match r {
            Err(e @ Error::NvlsDisabled { .. }) => assert!(
                e.to_string()
                    .contains("NVLS disabled by MSCCLPP_FORCE_DISABLE_NVLS/NCCL_NVLS_ENABLE"),
                "{what}: {e}"
            ),
            other => panic!("{what}: expected Error::NvlsDisabled, got {other:?}"),
        }
    }

    fn check_in_child() {
        assert!(
            crate::nvls_disabled_by_env(),
            "the child must run with a switch that disables NVLS"
        );
        // Stand-ins for objects a process can only get from the driver (never opened, never
        // dropped): with NVLS disabled no real multicast handle can exist at all.
        let dev = CudaDevice {
            inner: Arc::new(DeviceInner {
                ordinal: 0,
                dev: 0,
                ctx: std::ptr::null_mut(),
                sync_stream: std::sync::OnceLock::new(),
            }),
        };
        let info = MulticastInfo {
            size: 1 << 21,
            ndevices: 2,
            granularity: 1 << 21,
        };
        let mc = CudaMulticast {
            inner: Arc::new(McHandle {
                dev: dev.clone(),
                handle: 0,
                info,
                handle_types:
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0,
                added: Mutex::new(Some(0)),
                permit: NvlsPermit::forged_for_tests(),
                _live: Live::new(Kind::Handle),
            }),
        };
        let mem = CudaMemory {
            dev: dev.clone(),
            ptr: 0,
            size: 1 << 21,
            kind: MemoryKind::Physical { granularity: 0 },
            backing: Backing::Physical {
                handle: 0,
                mapped_len: 1 << 21,
                fabric: false,
            },
            fd_export: Mutex::new(None),
        };
        let desc = descriptor(&info, IpcKind::PosixFd, 1, &[]);

        let before = driver_calls_on_this_thread();
        expect_disabled(
            "multicast_granularity",
            Cuda::multicast_granularity(&dev, 1 << 21, 2),
        );
        expect_disabled("create_multicast", Cuda::create_multicast(&dev, 1 << 21, 2));
        expect_disabled("import_multicast", Cuda::import_multicast(&dev, &desc));
        expect_disabled("export_multicast", Cuda::export_multicast(mc.clone()));
        expect_disabled(
            "multicast_add_device",
            Cuda::multicast_add_device(&mc, &dev),
        );
        // SAFETY: refused before anything is bound.
        let bound = unsafe { Cuda::multicast_bind(&mc, &dev, 0, &mem, 0, 1 << 21) };
        expect_disabled("multicast_bind", bound);
        expect_disabled("multicast_map", Cuda::multicast_map(&mc, &dev, 0, 1 << 21));
        let calls = driver_calls_on_this_thread() - before;
        assert_eq!(calls, 0, "driver calls made while NVLS was disabled");
        println!("{DONE}");
        std::mem::forget(mem);
        std::mem::forget(mc);
        std::mem::forget(dev);
    }
}
