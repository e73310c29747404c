//! DLPack for the package (through the `dlpark` crate, which owns the C layout of
//! `DLManagedTensor`/`DLManagedTensorVersioned`, the capsule protocol and the deleters):
//! [`export`] makes the capsule of a [`RawGpuBuffer`]'s bytes (a 1-D `uint8` tensor whose
//! deleter keeps the allocation alive), [`import`] reads any object with `__dlpack__`
//! (or a DLPack capsule) as a buffer of a call.

use dlpark::allocation::fixed::Allocation;
use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType};
use dlpark::python::{export_dlpack, from_dlpack, DlpackExporter, ExportRequest, ImportedDlpack};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use mscclpp::collectives::DataType;
use mscclpp::LocalMemory;
use pyo3::prelude::*;

use crate::buffer::ANY_GPU;
use crate::error::invalid;

/// `(device_type, device_id)` of memory on `ordinal` (-1: host memory).
pub fn device_of(ordinal: i32) -> DLDevice {
    if ordinal < 0 {
        DLDevice::CPU
    } else if crate::backend() == "rocm" {
        DLDevice {
            device_type: DLDeviceType::ROCM,
            device_id: ordinal,
        }
    } else {
        DLDevice::cuda(ordinal)
    }
}

/// The exporter of one allocation: its bytes as a 1-D `uint8` tensor.
struct Bytes {
    mem: LocalMemory,
    device: DLDevice,
}

impl Bytes {
    fn managed<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let alloc =
            Allocation::<M, 1>::allocate().map_err(|e| invalid(format!("DLPack export: {e}")))?;
        // The context (freed by the consumer's call of the deleter) holds the allocation.
        let mut t = alloc.initialize(Box::new(self.mem.clone()));
        let n = i64::try_from(self.mem.size())
            .map_err(|_| invalid("DLPack export: the buffer is too large for an i64 shape"))?;
        t.set_data(self.mem.ptr() as usize as *mut std::ffi::c_void)
            .set_device(self.device)
            .set_dtype(DLDataType::U8);
        *t.shape_mut() = [n];
        *t.strides_mut() = [1];
        // The tensor points at the shape and strides stored in the same allocation.
        t.tensor_mut().shape = t.shape_mut().as_mut_ptr();
        t.tensor_mut().strides = t.strides_mut().as_mut_ptr();
        // SAFETY: data, device, dtype, shape and strides were set above and describe
        // `size` bytes the context keeps alive.
        Ok(unsafe { t.finish() })
    }
}

impl DlpackExporter for Bytes {
    fn device(&self) -> DLDevice {
        self.device
    }

    fn flags(&self) -> DlpackFlags {
        DlpackFlags::empty()
    }

    fn prepare_export(&self, _py: Python<'_>, _request: &ExportRequest<'_>) -> PyResult<()> {
        // Nothing to order: this buffer has no stream of its own (the library's calls run on
        // the caller's streams, which the caller orders).
        Ok(())
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<dlpark::ffi::DLManagedTensor>> {
        self.managed()
    }

    fn export_versioned(
        &self,
        _py: Python<'_>,
    ) -> PyResult<Managed<dlpark::ffi::DLManagedTensorVersioned>> {
        self.managed()
    }
}

/// The `__dlpack__` capsule of `mem` (on `ordinal`, -1 for host memory) for the standard
/// arguments (`stream`, `max_version`, `dl_device`, `copy`; only zero-copy exports).
pub fn export<'py>(
    py: Python<'py>,
    mem: &LocalMemory,
    ordinal: i32,
    stream: Option<&Bound<'py, PyAny>>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(u32, i32)>,
    copy: Option<bool>,
) -> PyResult<Py<PyAny>> {
    let request = ExportRequest::parse(stream, max_version, dl_device, copy)?;
    let bytes = Bytes {
        mem: mem.clone(),
        device: device_of(ordinal),
    };
    export_dlpack(&bytes, py, request)
}

/// What [`import`] read of an object: its memory and the imported tensor that keeps it
/// alive (its deleter runs when this is dropped).
pub struct Imported {
    /// The first element's address.
    pub ptr: u64,
    /// Bytes.
    pub nbytes: usize,
    /// Element type, when the collectives have one for it.
    pub dtype: Option<DataType>,
    /// GPU ordinal, -1 for host memory.
    pub device: i32,
    /// Whether the producer marked it read-only (versioned DLPack).
    pub readonly: bool,
    /// Whether the producer handed a copy (versioned DLPack), not its own memory.
    pub copied: bool,
    /// What it was, for messages.
    pub kind: String,
    /// Held until the call is over.
    pub _tensor: ImportedDlpack,
}

/// The collectives' element type of a DLPack type (single lane), `None` for one they lack.
fn data_type(t: DLDataType) -> Option<DataType> {
    if t.lanes != 1 {
        return None;
    }
    Some(match (t.code, t.bits) {
        (DLDataTypeCode::INT, 8) => DataType::I8,
        (DLDataTypeCode::INT, 32) => DataType::I32,
        (DLDataTypeCode::INT, 64) => DataType::I64,
        (DLDataTypeCode::UINT, 8) => DataType::U8,
        (DLDataTypeCode::UINT, 32) => DataType::U32,
        (DLDataTypeCode::UINT, 64) => DataType::U64,
        (DLDataTypeCode::FLOAT, 16) => DataType::F16,
        (DLDataTypeCode::FLOAT, 32) => DataType::F32,
        (DLDataTypeCode::FLOAT, 64) => DataType::F64,
        (DLDataTypeCode::BFLOAT, 16) => DataType::Bf16,
        _ => return None,
    })
}

/// Reads `obj` (an object with `__dlpack__`, or a DLPack capsule) as a buffer: zero-copy,
/// C-contiguous; `role` names it in messages.
pub fn import(obj: &Bound<'_, PyAny>, role: &str) -> PyResult<Imported> {
    let kind = format!("{} (DLPack)", obj.get_type().name()?);
    // copy=None (not False): legacy producers take no arguments; a versioned producer that
    // copied says so (IS_COPIED), which a receive buffer refuses.
    let tensor = from_dlpack(obj.as_borrowed(), None, None)
        .map_err(|e| invalid(format!("{role} ({kind}): its DLPack export failed: {e}")))?;
    let readonly = tensor.flags().contains(DlpackFlags::READ_ONLY);
    let copied = tensor.flags().contains(DlpackFlags::IS_COPIED);
    let t = tensor
        .validate()
        .map_err(|e| invalid(format!("{role} ({kind}): invalid DLPack tensor: {e}")))?;
    let compact = t
        .is_compact()
        .map_err(|e| invalid(format!("{role} ({kind}): invalid DLPack strides: {e}")))?;
    if !compact {
        return Err(invalid(format!(
            "{role} ({kind}): not contiguous: expected a C-contiguous tensor (make it \
             contiguous first)"
        )));
    }
    let dev = t.device();
    let device = match dev.device_type {
        DLDeviceType::CPU | DLDeviceType::CUDAHOST | DLDeviceType::ROCMHOST => -1,
        DLDeviceType::CUDA | DLDeviceType::ROCM | DLDeviceType::CUDAMANAGED => {
            if dev.device_id >= 0 {
                dev.device_id
            } else {
                ANY_GPU
            }
        }
        other => {
            return Err(invalid(format!(
                "{role} ({kind}): DLPack device type {}: expected CPU, CUDA or ROCm memory",
                other.0
            )))
        }
    };
    let (ptr, nbytes, dtype) = (t.data_ptr() as u64, t.num_bytes(), t.dtype());
    let kind = format!("{kind} of {:?} x{}", dtype, t.num_elements());
    Ok(Imported {
        ptr,
        nbytes,
        dtype: data_type(dtype),
        device,
        readonly,
        copied,
        kind,
        _tensor: tensor,
    })
}
