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
use crate::memory::{hal_err, host_addressable, write_to};
use crate::registered_memory::RegisteredMemory;
use crate::transport::{Device, DeviceType, Transport};

/// How long `update_and_sync` waits for earlier GPU copies before storing the value.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// Pending stream operations after which the connection synchronizes its stream.
const MAX_IN_FLIGHT: usize = 4096;

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
    /// GPU, so a remote memory is written through the local device, never by opening the
    /// exporter's GPU here.
    fn local_device_for(&self, mem: &RegisteredMemory) -> Device {
        if mem.is_local() || self.local_device.kind == DeviceType::Cpu {
            mem.device()
        } else {
            self.local_device
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
        match &self.stream {
            Some(stream) if !(host_addressable(dst.device()) && host_addressable(src.device())) => {
                // SAFETY: both ranges lie inside live mappings (the memories are kept alive in
                // `in_flight` until the stream is synchronized by flush).
                unsafe { Gpu::memcpy_async(stream, d, s, len) }
                    .map_err(|e| hal_err("CudaIpc write", e))?;
                self.keep_alive((dst.clone(), src.clone()))?;
            }
            _ => {
                // SAFETY: both ranges lie inside host-addressable live mappings held by the
                // borrowed memories; `copy` tolerates overlap (a memory written to itself).
                unsafe { std::ptr::copy(s as usize as *const u8, d as usize as *mut u8, len) };
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
