//! Port channel device operations on the host backend (`port_channel_device.hpp`): each
//! request is one FIFO push; flush and put_with_signal_and_flush then wait until the proxy's
//! tail passes the pushed position. wait/poll use the Host2Device semaphore (one thread per
//! handle). All methods are `unsafe`: the handle must come from a live channel of a proxy
//! whose memory this process can touch (host backend).

use std::time::Duration;

use super::semaphore;
use crate::error::{Error, Result};
use crate::fifo::{ProxyTrigger, MAX_TRIGGER_SIZE, TRIGGER_DATA, TRIGGER_FLAG, TRIGGER_SYNC};
use crate::port_channel::{BasePortChannelDeviceHandle, MemoryId, PortChannelDeviceHandle};

impl BasePortChannelDeviceHandle {
    /// Pushes one request; returns its FIFO position. `timeout` bounds the wait for FIFO space.
    ///
    /// # Safety
    /// See the module docs.
    #[allow(clippy::too_many_arguments)] // a FIFO trigger's fields, as the device handle takes them
    pub unsafe fn push(
        &self,
        trigger_type: u64,
        dst: MemoryId,
        dst_offset: u64,
        src: MemoryId,
        src_offset: u64,
        size: u64,
        timeout: Duration,
    ) -> Result<u64> {
        if (dst_offset | src_offset | size) > MAX_TRIGGER_SIZE {
            return Err(Error::invalid(format!(
                "port channel: expected offsets and size < 2^32, got dst offset {dst_offset}, src offset {src_offset}, size {size}"
            )));
        }
        let t = ProxyTrigger::new(
            trigger_type,
            dst,
            dst_offset,
            src,
            src_offset,
            size,
            self.semaphore_id,
        )?;
        // SAFETY: forwarded from the caller.
        unsafe { self.fifo.push(t, timeout) }
    }

    /// Copies `size` bytes from memory `src` + `src_offset` to memory `dst` + `dst_offset`.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn put(
        &self,
        dst: MemoryId,
        dst_offset: u64,
        src: MemoryId,
        src_offset: u64,
        size: u64,
        timeout: Duration,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            self.push(
                TRIGGER_DATA,
                dst,
                dst_offset,
                src,
                src_offset,
                size,
                timeout,
            )
        }
        .map(|_| ())
    }

    /// Signals the peer after earlier puts.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn signal(&self, timeout: Duration) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.push(TRIGGER_FLAG, 0, 0, 0, 0, 0, timeout) }.map(|_| ())
    }

    /// put then signal, in one request.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn put_with_signal(
        &self,
        dst: MemoryId,
        dst_offset: u64,
        src: MemoryId,
        src_offset: u64,
        size: u64,
        timeout: Duration,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            self.push(
                TRIGGER_DATA | TRIGGER_FLAG,
                dst,
                dst_offset,
                src,
                src_offset,
                size,
                timeout,
            )
        }
        .map(|_| ())
    }

    /// Waits until the proxy handled position `pos`; an error when a request failed meanwhile
    /// (the FIFO's failed-trigger count grew past `failed_before`).
    ///
    /// # Safety
    /// See the module docs.
    unsafe fn sync_checked(&self, pos: u64, failed_before: u64, timeout: Duration) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.fifo.sync(pos, timeout)? };
        // SAFETY: forwarded.
        let failed = unsafe { self.fifo.failed_triggers() };
        if failed > failed_before {
            return Err(Error::Aborted(format!(
                "port channel flush: the proxy failed {} request(s) of this FIFO up to this \
                 flush (see ProxyService::last_error)",
                failed - failed_before
            )));
        }
        Ok(())
    }

    /// put, signal and flush in one request, then waits until the proxy handled it. An error
    /// when the proxy failed a request of this FIFO meanwhile.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn put_with_signal_and_flush(
        &self,
        dst: MemoryId,
        dst_offset: u64,
        src: MemoryId,
        src_offset: u64,
        size: u64,
        timeout: Duration,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            let before = self.fifo.failed_triggers();
            let pos = self.push(
                TRIGGER_DATA | TRIGGER_FLAG | TRIGGER_SYNC,
                dst,
                dst_offset,
                src,
                src_offset,
                size,
                timeout,
            )?;
            self.sync_checked(pos, before, timeout)
        }
    }

    /// Waits until every earlier request of this FIFO is complete; an error when the proxy
    /// failed one of them meanwhile (the FIFO's failed-trigger count grew).
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn flush(&self, timeout: Duration) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            let before = self.fifo.failed_triggers();
            let pos = self.push(TRIGGER_SYNC, 0, 0, 0, 0, 0, timeout)?;
            self.sync_checked(pos, before, timeout)
        }
    }

    /// Non-blocking wait for the peer's signal.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn poll(&self) -> bool {
        // SAFETY: forwarded.
        unsafe {
            semaphore::poll(
                self.semaphore.inbound_token,
                self.semaphore.expected_inbound_token,
            )
        }
    }

    /// Waits (at most `timeout`) for the peer's signal.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn wait(&self, timeout: Duration) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            semaphore::wait(
                self.semaphore.inbound_token,
                self.semaphore.expected_inbound_token,
                timeout,
            )
        }
    }
}

impl PortChannelDeviceHandle {
    /// Copies `size` bytes from the source memory + `src_offset` to the destination + `dst_offset`.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn put(
        &self,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        timeout: Duration,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            self.base
                .put(self.dst, dst_offset, self.src, src_offset, size, timeout)
        }
    }
    /// Signals the peer after earlier puts.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn signal(&self, timeout: Duration) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.base.signal(timeout) }
    }
    /// put then signal.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn put_with_signal(
        &self,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        timeout: Duration,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            self.base
                .put_with_signal(self.dst, dst_offset, self.src, src_offset, size, timeout)
        }
    }
    /// put, signal, flush.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn put_with_signal_and_flush(
        &self,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        timeout: Duration,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            self.base.put_with_signal_and_flush(
                self.dst, dst_offset, self.src, src_offset, size, timeout,
            )
        }
    }
    /// Waits until every earlier request is complete.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn flush(&self, timeout: Duration) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.base.flush(timeout) }
    }
    /// Non-blocking wait.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn poll(&self) -> bool {
        // SAFETY: forwarded.
        unsafe { self.base.poll() }
    }
    /// Waits for the peer's signal.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn wait(&self, timeout: Duration) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.base.wait(timeout) }
    }
}
