//! The CudaIpc connection: both endpoints on one host, the destination mapped into this
//! process. CPU memory (and every memory on the host backend) is copied with memcpy and
//! signalled with an atomic release store; GPU memory is copied on a context-owned stream of
//! the build's GPU backend, and `flush` synchronizes that stream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mscclpp_hal::{prelude::*, Gpu};

use super::BaseConnection;
use crate::error::Result;
use crate::memory::{default_gpu, gpu_device, hal_err, host_addressable, write_to, RawBuf};
use crate::registered_memory::RegisteredMemory;
use crate::transport::{Device, DeviceType, Transport};

/// How long `update_and_sync` waits for earlier GPU copies before storing the value.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// Pending stream operations after which the connection synchronizes its stream.
const MAX_IN_FLIGHT: usize = 4096;

/// How a CudaIpc write moves its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyRoute {
    /// Both sides are host-addressable: a host memcpy.
    Host,
    /// A GPU side and a stream of ours: an asynchronous copy on it (`flush` waits).
    Stream,
    /// A GPU side but no stream (the local endpoint is the CPU): a blocking copy through the
    /// GPU driver. Never a host memcpy onto a device address.
    GpuBlocking,
}

/// The route of a write whose destination and source are (or are not) host-addressable.
pub(crate) fn copy_route(has_stream: bool, dst_host: bool, src_host: bool) -> CopyRoute {
    match (dst_host && src_host, has_stream) {
        (true, _) => CopyRoute::Host,
        (false, true) => CopyRoute::Stream,
        (false, false) => CopyRoute::GpuBlocking,
    }
}

pub(crate) struct IpcConnection {
    local_device: Device,
    /// The stream GPU copies go on (None when the local device is the CPU).
    stream: Option<Arc<<Gpu as Api>::Stream>>,
    /// Memories used by copies not yet flushed: kept alive until the stream is synchronized.
    in_flight: Mutex<Vec<(RegisteredMemory, RegisteredMemory)>>,
}

impl IpcConnection {
    pub(crate) fn new(
        local_device: Device,
        stream: Option<Arc<<Gpu as Api>::Stream>>,
    ) -> IpcConnection {
        IpcConnection {
            local_device,
            stream,
            in_flight: Mutex::new(Vec::new()),
        }
    }

    /// The device whose context maps `mem` in this process: imports are mapped on our own
    /// GPU (the local endpoint's, or for a CPU endpoint the GPU the process used last, as
    /// `RegisteredMemory` maps them), never the exporter's ordinal opened here.
    fn local_device_for(&self, mem: &RegisteredMemory) -> Device {
        let dev = mem.device();
        if mem.is_local() || dev.kind == DeviceType::Cpu {
            dev
        } else if self.local_device.kind == DeviceType::Gpu {
            self.local_device
        } else {
            Device::gpu(default_gpu())
        }
    }

    /// Keeps `pair` alive until the stream is synchronized; bounds the list by synchronizing
    /// when it grows long (a proxy may write and signal for a long time without a flush).
    fn keep_alive(&self, pair: (RegisteredMemory, RegisteredMemory)) -> Result<()> {
        let len = {
            let mut v = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            v.push(pair);
            v.len()
        };
        if len >= MAX_IN_FLIGHT {
            self.sync_stream(SYNC_TIMEOUT)?;
        }
        Ok(())
    }

    fn sync_stream(&self, timeout: Duration) -> Result<()> {
        if let Some(s) = &self.stream {
            Gpu::stream_synchronize(s, timeout).map_err(|e| hal_err("CudaIpc flush", e))?;
        }
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        Ok(())
    }
}

impl BaseConnection for IpcConnection {
    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_offset: u64,
        src: &RegisteredMemory,
        src_offset: u64,
        size: u64,
    ) -> Result<()> {
        // Connection checked: both ranges are inside their memories and both are mapped here.
        let d = dst.data() + dst_offset;
        let s = src.data() + src_offset;
        let len = size as usize;
        let route = copy_route(
            self.stream.is_some(),
            host_addressable(dst.device()),
            host_addressable(src.device()),
        );
        match (route, &self.stream) {
            (CopyRoute::Stream, Some(stream)) => {
                // SAFETY: both ranges lie inside live mappings (the memories are kept alive in
                // `in_flight` until the stream is synchronized by flush).
                unsafe { Gpu::memcpy_async(stream, d, s, len) }
                    .map_err(|e| hal_err("CudaIpc write", e))?;
                self.keep_alive((dst.clone(), src.clone()))?;
            }
            (CopyRoute::Host, _) => {
                // SAFETY: both ranges lie inside host-addressable live mappings held by the
                // borrowed memories; `copy` tolerates overlap (a memory written to itself).
                unsafe { std::ptr::copy(s as usize as *const u8, d as usize as *mut u8, len) };
            }
            _ => {
                // A CPU endpoint with a GPU side: a blocking driver copy (unified addressing)
                // in the context of the GPU that maps the device side here.
                let gpu_side = if host_addressable(dst.device()) {
                    src
                } else {
                    dst
                };
                let dev = gpu_device(self.local_device_for(gpu_side).id)?;
                let host = <Gpu as Api>::HOST_ADDRESSABLE;
                let dst_buf = RawBuf { ptr: d, len, host };
                let src_buf = RawBuf { ptr: s, len, host };
                Gpu::copy(&dev, &dst_buf, 0, &src_buf, 0, len)
                    .map_err(|e| hal_err("CudaIpc write (CPU endpoint, GPU memory)", e))?;
            }
        }
        Ok(())
    }

    fn update_and_sync(
        &self,
        dst: &RegisteredMemory,
        dst_offset: u64,
        src: &AtomicU64,
        new_value: u64,
    ) -> Result<()> {
        src.store(new_value, Ordering::Release);
        let addr = dst.data() + dst_offset;
        if host_addressable(dst.device()) {
            // Earlier GPU copies must land first.
            if self.stream.is_some() {
                self.sync_stream(SYNC_TIMEOUT)?;
            }
            // SAFETY: the address is 8-byte aligned (checked by Connection) and inside the
            // mapping held by `dst`; other processes access it only atomically.
            let atom = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
            atom.store(new_value, Ordering::Release);
            Ok(())
        } else if let Some(stream) = &self.stream {
            // A stream memory operation: ordered after the copies already on the stream and
            // preceded by a flush of prior writes, so a kernel that sees the token also sees
            // the data. The host does not wait (upstream enqueues a memcpy here instead).
            // SAFETY: 8-byte aligned (checked by Connection) and inside the mapping held by
            // `dst`, which `in_flight` keeps alive until the stream is synchronized.
            unsafe { Gpu::write_value64_async(stream, addr, new_value) }
                .map_err(|e| hal_err("CudaIpc update_and_sync", e))?;
            self.keep_alive((dst.clone(), dst.clone()))
        } else {
            // A CPU endpoint writing GPU memory: no stream of ours, a blocking write.
            // SAFETY: the range is inside the GPU mapping held by `dst`.
            unsafe { write_to(self.local_device_for(dst), addr, &new_value.to_le_bytes()) }
        }
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        self.sync_stream(timeout)
    }
    fn transport(&self) -> Transport {
        Transport::CudaIpc
    }
    fn remote_transport(&self) -> Transport {
        Transport::CudaIpc
    }
    fn local_device(&self) -> Device {
        self.local_device
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_route, CopyRoute};

    #[test]
    fn device_sides_never_take_the_host_memcpy() {
        // Both host-addressable: memcpy, with or without a stream.
        assert_eq!(copy_route(false, true, true), CopyRoute::Host);
        assert_eq!(copy_route(true, true, true), CopyRoute::Host);
        // A GPU side with a stream: the stream.
        for (d, s) in [(false, true), (true, false), (false, false)] {
            assert_eq!(copy_route(true, d, s), CopyRoute::Stream, "dst {d} src {s}");
        }
        // A GPU side without a stream (the CPU endpoint of CommunicatorTest.BasicWrite with
        // two ranks on one GPU): through the driver, never a host memcpy onto device memory.
        for (d, s) in [(false, true), (true, false), (false, false)] {
            assert_eq!(
                copy_route(false, d, s),
                CopyRoute::GpuBlocking,
                "dst {d} src {s}"
            );
        }
    }
}
