//! `GpuBuffer<T>`: typed communication buffers, and the `gpu_calloc`/`gpu_memcpy` helpers,
//! built on [`crate::memory::LocalMemory`] (so they can be registered with a context).
//!
//! Communication buffers must be memory a peer can map: `MemoryKind::Physical` (cuMem, exported
//! as a POSIX fd, granular enough for NVLS multicast) when NVLS is usable, else plain device
//! memory (`cuMemAlloc`, legacy IPC); never stream-ordered pool memory (peers fault on it). On
//! `Device::CPU` (host backend) every kind is a memfd mapping. Buffers start zeroed.

use std::marker::PhantomData;

use mscclpp_hal::MemoryKind;

use crate::error::{Error, Result};
use crate::memory::LocalMemory;
use crate::transport::{Device, DeviceType};

/// The memory kind communication buffers use on `device`.
pub fn communication_memory_kind(device: Device) -> MemoryKind {
    if device.kind == DeviceType::Gpu && mscclpp_hal::nvls_supported() {
        MemoryKind::Physical { granularity: 0 }
    } else {
        MemoryKind::Device
    }
}

/// `len` zeroed elements of `T` in memory peers can map. `T` must be plain data (integers,
/// floats, `#[repr(C)]` structs of them): the device writes arbitrary bytes into it.
#[derive(Clone, Debug)]
pub struct GpuBuffer<T> {
    mem: LocalMemory,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: Copy> GpuBuffer<T> {
    /// Allocates `len` zeroed elements on `device` (kind: [`communication_memory_kind`]).
    pub fn new(device: Device, len: usize) -> Result<Self> {
        Self::with_kind(device, len, communication_memory_kind(device))
    }

    /// Allocates `len` zeroed elements of a given memory kind.
    pub fn with_kind(device: Device, len: usize, kind: MemoryKind) -> Result<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).filter(|b| *b > 0).ok_or_else(|| {
            Error::invalid(format!(
                "GpuBuffer::new: expected a non-zero byte size that fits in usize, got {len} elements of {} bytes",
                std::mem::size_of::<T>()
            ))
        })?;
        let mem = LocalMemory::alloc_kind(device, bytes, kind)?;
        Ok(GpuBuffer {
            mem,
            len,
            _elem: PhantomData,
        })
    }

    /// The device address of element 0 (on the CPU: the host address).
    pub fn data(&self) -> u64 {
        self.mem.ptr()
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it has no elements (never: zero-sized buffers are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
    /// The underlying allocation.
    pub fn memory(&self) -> &LocalMemory {
        &self.mem
    }
    /// The device it lives on.
    pub fn device(&self) -> Device {
        self.mem.device()
    }
    /// The host address when the host can touch it directly (CPU memory).
    pub fn host_ptr(&self) -> Option<*mut T> {
        self.mem.host_ptr().map(|p| p.cast::<T>())
    }

    /// Copies `src` into elements `offset..offset + src.len()`.
    pub fn copy_from_host(&self, offset: usize, src: &[T]) -> Result<()> {
        self.check("copy_from_host", offset, src.len())?;
        // SAFETY: T is Copy plain data; viewing initialised elements as bytes is fine.
        let bytes = unsafe {
            std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), std::mem::size_of_val(src))
        };
        self.mem.write(offset * std::mem::size_of::<T>(), bytes)
    }

    /// Copies elements `offset..offset + dst.len()` into `dst`.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [T]) -> Result<()> {
        self.check("copy_to_host", offset, dst.len())?;
        // SAFETY: T is plain data (see the type docs): any byte pattern is a value of it.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                dst.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(dst),
            )
        };
        self.mem.read(offset * std::mem::size_of::<T>(), bytes)
    }

    /// The whole contents.
    pub fn to_vec(&self) -> Result<Vec<T>>
    where
        T: Default,
    {
        let mut v = vec![T::default(); self.len];
        self.copy_to_host(0, &mut v)?;
        Ok(v)
    }

    fn check(&self, op: &str, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::invalid(format!(
                "GpuBuffer::{op}: expected a range inside {} elements, got offset {offset} + {n}",
                self.len
            ))),
        }
    }
}

/// `len` zeroed elements of `T` on `device` (upstream `gpuCallocShared`).
pub fn gpu_calloc<T: Copy>(device: Device, len: usize) -> Result<GpuBuffer<T>> {
    GpuBuffer::new(device, len)
}

/// Copies `len` elements from `src[src_off..]` to `dst[dst_off..]` (through a host bounce
/// buffer: a setup helper, not a data path).
pub fn gpu_memcpy<T: Copy + Default>(
    dst: &GpuBuffer<T>,
    dst_off: usize,
    src: &GpuBuffer<T>,
    src_off: usize,
    len: usize,
) -> Result<()> {
    dst.check("gpu_memcpy destination", dst_off, len)?;
    src.check("gpu_memcpy source", src_off, len)?;
    let mut bounce = vec![T::default(); len];
    src.copy_to_host(src_off, &mut bounce)?;
    dst.copy_from_host(dst_off, &bounce)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_copy_roundtrip() -> Result<()> {
        let a: GpuBuffer<u32> = gpu_calloc(Device::CPU, 1000)?;
        let b: GpuBuffer<u32> = gpu_calloc(Device::CPU, 1000)?;
        assert!(
            a.to_vec()?.iter().all(|&x| x == 0),
            "fresh buffer is zeroed"
        );
        let src: Vec<u32> = (0..500).map(|i| i * 3 + 1).collect();
        a.copy_from_host(100, &src)?;
        gpu_memcpy(&b, 0, &a, 100, 500)?;
        let mut got = vec![0u32; 500];
        b.copy_to_host(0, &mut got)?;
        assert_eq!(got, src);
        assert!(a.copy_from_host(999, &src).is_err());
        assert!(gpu_memcpy(&b, 600, &a, 0, 500).is_err());
        assert!(GpuBuffer::<u64>::new(Device::CPU, 0).is_err());
        assert_eq!(a.bytes(), 4000);
        Ok(())
    }
}
