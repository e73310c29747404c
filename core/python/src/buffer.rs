//! What a collective or the executor is given as a buffer: a NumPy array or any object with
//! the buffer protocol (host memory), a [`RawGpuBuffer`], or a [`BufferRef`] that the Python
//! side made of a torch tensor or an object with `__cuda_array_interface__` (CuPy).

use std::ffi::CStr;

use mscclpp::collectives::DataType;
use mscclpp::{Device, DeviceType};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::error::invalid;
use crate::exec::RawGpuBuffer;

/// A description of memory this package does not own: its address, size in bytes, element
/// type, device and the object that owns it (kept alive as long as this description).
/// `mscclpp._buffers.describe` makes them of torch tensors and `__cuda_array_interface__`
/// objects; make one yourself for memory from elsewhere (the address and size are taken on
/// trust: the collectives read and write that range).
#[pyclass(module = "mscclpp._mscclpp", frozen, get_all)]
pub struct BufferRef {
    /// The address (a device address for GPU memory).
    pub ptr: u64,
    /// Its size in bytes.
    pub nbytes: usize,
    /// Element type name (`"float32"`, `"float16"`, `"bfloat16"`, `"int32"`, ...), or `None`.
    pub dtype: Option<String>,
    /// The GPU it lives on, -1 for host memory, -2 for a GPU it does not tell.
    pub device: i32,
    /// Whether it must not be written.
    pub readonly: bool,
    /// Whether the elements are contiguous (row-major, no gaps).
    pub contiguous: bool,
    /// The stream the owner works on (torch's current stream), used when a call names none.
    pub stream: Option<u64>,
    /// The object that owns the memory.
    pub owner: Option<Py<PyAny>>,
    /// What the owner is, for messages (`"torch.Tensor"`, `"cupy.ndarray"`, ...).
    pub kind: String,
}

#[pymethods]
impl BufferRef {
    /// A description of `nbytes` bytes at `ptr` (see the class doc).
    #[new]
    #[pyo3(signature = (ptr, nbytes, dtype=None, device=-1, *, readonly=false, contiguous=true, stream=None, owner=None, kind="buffer".to_string()))]
    #[pyo3(
        text_signature = "(ptr, nbytes, dtype=None, device=-1, *, readonly=False, contiguous=True, stream=None, owner=None, kind='buffer')"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        ptr: u64,
        nbytes: usize,
        dtype: Option<String>,
        device: i32,
        readonly: bool,
        contiguous: bool,
        stream: Option<u64>,
        owner: Option<Py<PyAny>>,
        kind: String,
    ) -> PyResult<Self> {
        if let Some(d) = &dtype {
            parse_dtype(d)?;
        }
        Ok(BufferRef {
            ptr,
            nbytes,
            dtype,
            device,
            readonly,
            contiguous,
            stream,
            owner,
            kind,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "BufferRef(ptr={:#x}, nbytes={}, dtype={:?}, device={}, kind={:?})",
            self.ptr, self.nbytes, self.dtype, self.device, self.kind
        )
    }
}

/// `BufferRef.device` of GPU memory whose ordinal its object does not tell (the
/// communicator's GPU is assumed); `mscclpp._buffers.ANY_GPU`.
pub const ANY_GPU: i32 = -2;

/// A data type by any of the library's names (`float16`/`half`, `bfloat16`, `int32`, ...).
pub fn parse_dtype(name: &str) -> PyResult<DataType> {
    name.parse::<DataType>().map_err(crate::error::from_lib)
}

/// The Python (NumPy/torch) name of a data type (`float32`, `float16`, `bfloat16`, `int8`,
/// `uint64`, `float8_e4m3`, ...), made of its kernel name (`f32`, `bf16`, `i8`, `fp8e4m3`).
pub fn dtype_name(t: DataType) -> String {
    let k = t.kernel_name();
    if let Some(fp8) = k.strip_prefix("fp8") {
        return format!("float8_{fp8}");
    }
    let (prefix, bits) = k.split_at(k.find(|c: char| c.is_ascii_digit()).unwrap_or(0));
    let name = match prefix {
        "i" => "int",
        "u" => "uint",
        "f" => "float",
        "bf" => "bfloat",
        other => other,
    };
    format!("{name}{bits}")
}

/// One buffer of a call, checked for what the call needs of it.
pub struct Buf {
    /// Its address.
    pub ptr: u64,
    /// Its bytes.
    pub nbytes: usize,
    /// Its element type, when known.
    pub dtype: Option<DataType>,
    /// GPU ordinal, -1 for host memory.
    pub device: i32,
    /// The owner's stream, if it has one.
    pub stream: Option<u64>,
    /// What it is, for messages.
    pub kind: String,
    /// Holds the buffer-protocol export while the call runs.
    _view: Option<PyUntypedBuffer>,
    /// Holds the DLPack import (its deleter runs when the call is over).
    _dlpack: Option<crate::dlpack::Imported>,
}

impl Buf {
    /// Elements of `dtype` it holds; an error unless its size is a multiple of it.
    pub fn count(&self, role: &str, dtype: DataType) -> PyResult<usize> {
        let sz = dtype.size_in_bytes();
        if !self.nbytes.is_multiple_of(sz) {
            return Err(invalid(format!(
                "{role} ({}): {} bytes is not a whole number of {} elements ({sz} bytes each)",
                self.kind,
                self.nbytes,
                dtype_name(dtype)
            )));
        }
        Ok(self.nbytes / sz)
    }
}

/// The element type of a buffer-protocol format (`"f"`, `"<e"`, `"=i"`, ...), `None` for a
/// format the collectives have no type for.
fn format_dtype(format: &CStr, itemsize: usize) -> Option<DataType> {
    let f = format.to_str().ok()?;
    let f = f.trim_start_matches(['@', '=', '<']);
    let native_le = cfg!(target_endian = "little");
    if !native_le {
        return None;
    }
    Some(match (f, itemsize) {
        ("b", 1) => DataType::I8,
        ("B", 1) | ("c", 1) => DataType::U8,
        ("i" | "l" | "q", 4) => DataType::I32,
        ("i" | "l" | "q", 8) => DataType::I64,
        ("I" | "L" | "Q", 4) => DataType::U32,
        ("I" | "L" | "Q", 8) => DataType::U64,
        ("e", 2) => DataType::F16,
        ("f", 4) => DataType::F32,
        ("d", 8) => DataType::F64,
        _ => return None,
    })
}

/// Whether `obj` is described by the Python side (`mscclpp._buffers.describe`): a torch tensor
/// or an object with `__cuda_array_interface__`.
fn described_in_python(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    if obj.hasattr("__cuda_array_interface__").unwrap_or(false) {
        return Ok(true);
    }
    let module: String = obj
        .get_type()
        .getattr("__module__")
        .and_then(|m| m.extract())
        .unwrap_or_default();
    Ok(module == "torch" || module.starts_with("torch."))
}

/// `obj` as a buffer of a call: `role` names it in messages (`"send"`, `"recv"`); `writable`
/// refuses read-only memory.
pub fn extract(obj: &Bound<'_, PyAny>, role: &str, writable: bool) -> PyResult<Buf> {
    if let Ok(g) = obj.cast::<RawGpuBuffer>() {
        let g = g.get();
        return Ok(Buf {
            ptr: g.ptr(),
            nbytes: g.nbytes(),
            dtype: None,
            device: g.device_ordinal(),
            stream: None,
            kind: "RawGpuBuffer".into(),
            _view: None,
            _dlpack: None,
        });
    }
    if let Ok(r) = obj.cast::<BufferRef>() {
        let r = r.get();
        if !r.contiguous {
            return Err(invalid(format!(
                "{role} ({}): not contiguous: expected a contiguous buffer (call .contiguous() / \
                 numpy.ascontiguousarray first)",
                r.kind
            )));
        }
        if writable && r.readonly {
            return Err(invalid(format!(
                "{role} ({}): read-only: expected a writable buffer",
                r.kind
            )));
        }
        let dtype = r.dtype.as_deref().map(parse_dtype).transpose()?;
        return Ok(Buf {
            ptr: r.ptr,
            nbytes: r.nbytes,
            dtype,
            device: r.device,
            stream: r.stream,
            kind: r.kind.clone(),
            _view: None,
            _dlpack: None,
        });
    }
    if described_in_python(obj)? {
        let py = obj.py();
        let d = py
            .import("mscclpp._buffers")?
            .getattr("describe")?
            .call1((obj,))?;
        if d.cast::<BufferRef>().is_err() {
            return Err(PyTypeError::new_err(format!(
                "{role}: mscclpp._buffers.describe returned {}, expected a BufferRef",
                d.get_type().name()?
            )));
        }
        return extract(&d, role, writable);
    }
    let kind = obj.get_type().name()?.to_string();
    let view = match PyUntypedBuffer::get(obj) {
        Ok(v) => v,
        Err(_) if has_dlpack(obj) => return from_dlpack(obj, role, writable),
        Err(_) => {
            return Err(PyTypeError::new_err(format!(
                "{role}: {kind}: expected a NumPy array (or another object with the buffer \
                 protocol), a torch tensor, an object with __dlpack__ or \
                 __cuda_array_interface__, a RawGpuBuffer or a BufferRef"
            )))
        }
    };
    if !view.is_c_contiguous() {
        return Err(invalid(format!(
            "{role} ({kind}): not contiguous: expected a C-contiguous buffer \
             (numpy.ascontiguousarray first)"
        )));
    }
    if writable && view.readonly() {
        return Err(invalid(format!(
            "{role} ({kind}): read-only: expected a writable buffer"
        )));
    }
    Ok(Buf {
        ptr: view.buf_ptr() as u64,
        nbytes: view.len_bytes(),
        dtype: format_dtype(view.format(), view.item_size()),
        device: -1,
        stream: None,
        kind: format!("{kind} of format {:?}", view.format().to_string_lossy()),
        _view: Some(view),
        _dlpack: None,
    })
}

/// Whether `obj` speaks DLPack: `__dlpack__`, or a DLPack capsule itself.
fn has_dlpack(obj: &Bound<'_, PyAny>) -> bool {
    obj.hasattr("__dlpack__").unwrap_or(false)
        || obj
            .get_type()
            .name()
            .map(|n| n == "PyCapsule")
            .unwrap_or(false)
}

/// `obj` (with `__dlpack__`, or a capsule) as a buffer of a call, through DLPack.
fn from_dlpack(obj: &Bound<'_, PyAny>, role: &str, writable: bool) -> PyResult<Buf> {
    let d = crate::dlpack::import(obj, role)?;
    if writable && (d.readonly || d.copied) {
        return Err(invalid(format!(
            "{role} ({}): {}: expected a writable buffer",
            d.kind,
            if d.readonly {
                "read-only"
            } else {
                "its DLPack export is a copy (results written there would be lost)"
            }
        )));
    }
    Ok(Buf {
        ptr: d.ptr,
        nbytes: d.nbytes,
        dtype: d.dtype,
        device: d.device,
        stream: None,
        kind: d.kind.clone(),
        _view: None,
        _dlpack: Some(d),
    })
}

/// The ordinal `BufferRef.device` holds for memory of `device` (-1: host memory).
pub fn ordinal(device: Device) -> i32 {
    match device.kind {
        DeviceType::Cpu => -1,
        DeviceType::Gpu => device.id,
    }
}

/// Checks that `b` lives on `device` (where a call of `what` runs); `role` names it.
pub fn check_device(device: Device, what: &str, role: &str, b: &Buf) -> PyResult<()> {
    let want = ordinal(device);
    // ANY_GPU (-2): GPU memory whose object does not tell its ordinal (taken as ours).
    if b.device == want || (b.device == ANY_GPU && want >= 0) {
        return Ok(());
    }
    let got = if b.device == ANY_GPU {
        "GPU memory".to_string()
    } else if b.device < 0 {
        "host memory".to_string()
    } else {
        format!("memory of GPU {}", b.device)
    };
    let expected = if want < 0 {
        "host memory (this mscclpp was built for the host backend: NumPy arrays, CPU tensors)"
            .to_string()
    } else {
        format!("memory of GPU {want}, this communicator's device")
    };
    Err(invalid(format!(
        "{what}: {role} ({}) is {got}: expected {expected}",
        b.kind
    )))
}
