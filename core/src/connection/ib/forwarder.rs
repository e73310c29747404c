//! The receive side of a HostNoAtomic IB connection: a thread per connection that takes the
//! write-with-immediate completions, reads the destination address from the mailbox ring,
//! rebuilds the 64-bit token value and forwards it into the local token (see the parent
//! module's "Signals").

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mscclpp_hal::ibv::{QueuePair, RecvWr};

use crate::error::Error;
use crate::ib::qp::HostRing;
use crate::ib::CQ_BACKOFF;
use crate::memory::host_addressable;
use crate::registered_memory::{find_local, RegisteredMemory};
use crate::transport::Transport;

/// Shared with the receive thread.
pub(super) struct RecvShared {
    pub(super) closing: AtomicBool,
    /// Fatal (the thread stopped) errors stay; reported ones are returned once.
    pub(super) fatal: Mutex<Option<String>>,
    pub(super) reported: Mutex<Vec<String>>,
}

impl RecvShared {
    /// The receive thread's fatal error, without taking anything.
    pub(super) fn fatal_message(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn take_error(&self, peer: &str) -> Option<Error> {
        if let Some(f) = self
            .fatal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            return Some(Error::io(
                format!("IB connection to {peer}: receive thread"),
                std::io::Error::new(std::io::ErrorKind::ConnectionAborted, f.clone()),
            ));
        }
        let mut r = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_empty() {
            return None;
        }
        let msgs = std::mem::take(&mut *r);
        Some(Error::invalid(format!(
            "IB connection to {peer}: {}",
            msgs.join("; ")
        )))
    }
}

/// Where forwarded values go: a GDRCopy mapping (GPU memory, GDRCopy status ok), a host
/// store (host-addressable memory), or a blocking GPU copy.
///
/// # Ordering: data before token
/// A token is forwarded only after its RECV_RDMA_WITH_IMM completion was polled. On an RC QP
/// the responder completes that receive only after the data of the write-with-immediate, and
/// of every RDMA write posted before it on the QP, has been placed in memory (writes execute in
/// order; the completion is generated after placement). The NIC places data in GPU memory and
/// the CQE in host memory with PCIe posted writes, which stay ordered without relaxed ordering
/// (the MRs are registered without IBV_ACCESS_RELAXED_ORDERING); a PCIe bridge that reorders
/// posted writes breaks this, as it breaks peermem-based IB for every library. The poll reads
/// the CQE with acquire semantics; [`mscclpp_hal::gdr::GdrMapping::store_u64`] then issues a
/// full fence (x86 `mfence`, which also orders write-combining stores) before the token store
/// and another after it (draining the write-combining buffer so the token reaches the GPU
/// promptly). So the GPU can observe the token only after the data it announces landed.
/// Tested by the IbGdrTest suite (data checked when the token is seen, every round).
struct Forwarder {
    transport: Transport,
    peer: String,
    prev: HashMap<u64, u64>,
    /// Mappings first in each tuple: a mapping is dropped before the memory it maps.
    maps: HashMap<u64, (mscclpp_hal::gdr::GdrMapping, RegisteredMemory)>,
}

impl Forwarder {
    fn forward(&mut self, addr: u64, imm: u32) -> std::result::Result<(), String> {
        if addr & 7 != 0 {
            return Err(format!(
                "peer {} signalled the unaligned address {addr:#x}",
                self.peer
            ));
        }
        let mem = find_local(addr, 8, self.transport).ok_or_else(|| {
            format!(
                "peer {} signalled {addr:#x}, which is not inside a live local memory registered \
                 for {}",
                self.peer, self.transport
            )
        })?;
        let device = mem.device();
        let host = host_addressable(device);
        let prev = match self.prev.get(&addr) {
            Some(&p) => p,
            None if host => {
                // SAFETY: `addr` is 8 aligned bytes of a live registered host memory (kept alive
                // by `mem`); tokens are only accessed atomically.
                unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) }.load(Ordering::Acquire)
            }
            None => 0,
        };
        let step = imm.wrapping_sub(prev as u32);
        let value = prev.wrapping_add(u64::from(step));
        self.prev.insert(addr, value);
        if let Some(g) = gdr_for(device) {
            if let std::collections::hash_map::Entry::Vacant(slot) = self.maps.entry(addr) {
                // SAFETY: `addr..addr+8` lies in a live device allocation kept alive by `mem`,
                // which is stored next to the mapping and dropped after it.
                match unsafe { g.map(addr, 8) } {
                    Ok(m) => {
                        slot.insert((m, mem.clone()));
                    }
                    Err(e) => {
                        crate::log_warn!("NET", "GDRCopy map of {addr:#x} failed ({e}); copying");
                    }
                }
            }
            if let Some((m, _)) = self.maps.get(&addr) {
                crate::ib::gdr::count_forward();
                return m
                    .store_u64(0, value)
                    .map_err(|e| format!("GDRCopy store to {addr:#x}: {e}"));
            }
        }
        if host {
            // SAFETY: as above.
            unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) }
                .store(value, Ordering::Release);
            return Ok(());
        }
        // SAFETY: `addr..addr+8` is live memory of `device` (kept alive by `mem`).
        unsafe { crate::memory::write_to(device, addr, &value.to_le_bytes()) }
            .map_err(|e| format!("forwarding to GPU token {addr:#x}: {e}"))
    }
}

/// The GDRCopy handle for tokens in memory of `device`: GPU memory only (the host backend's
/// "GPU" memory too, so its stand-in library exercises this path), when the status is ok.
fn gdr_for(device: crate::transport::Device) -> Option<&'static mscclpp_hal::gdr::Gdr> {
    (device.kind == crate::transport::DeviceType::Gpu)
        .then(crate::ib::gdr::gdr)
        .flatten()
}

pub(super) fn recv_loop(
    sh: Arc<RecvShared>,
    qp: Arc<QueuePair>,
    mailbox: Arc<HostRing>,
    transport: Transport,
    peer: String,
    _max_recv: usize,
) {
    let fatal = |msg: String| {
        *sh.fatal.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg);
    };
    let slots = mailbox.buf.len() as u64;
    let mut fw = Forwarder {
        transport,
        peer: peer.clone(),
        prev: HashMap::new(),
        maps: HashMap::new(),
    };
    let mut count: u64 = 0;
    let mut wcs = Vec::new();
    let mut backoff = CQ_BACKOFF;
    loop {
        if sh.closing.load(Ordering::Acquire) {
            return;
        }
        wcs.clear();
        match qp.recv_cq().poll(&mut wcs, 16) {
            Err(e) => return fatal(format!("polling the receive CQ: {e}")),
            Ok(0) => {
                backoff.snooze();
                continue;
            }
            Ok(_) => backoff.reset(),
        }
        for wc in &wcs {
            if !wc.is_success() {
                if !sh.closing.load(Ordering::Acquire) {
                    fatal(format!(
                        "receive completion from {peer}: {} (vendor error {:#x})",
                        wc.describe(),
                        wc.vendor_err
                    ));
                }
                return;
            }
            let Some(imm) = wc.imm_data else {
                return fatal(format!(
                    "receive completion from {peer}: expected immediate data, got none ({})",
                    wc.describe()
                ));
            };
            let addr = mailbox.buf[(count % slots) as usize].load(Ordering::Acquire);
            count += 1;
            if let Err(msg) = fw.forward(addr, imm) {
                sh.reported
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(msg);
            }
            if let Err(e) = qp.post_recv(&[RecvWr {
                wr_id: count,
                local: None,
            }]) {
                return fatal(format!("reposting a receive: {e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn wrap_around_rebuild_is_exact() {
        // prev + ((imm - low32(prev)) mod 2^32), as the receive thread computes it.
        let rebuild =
            |prev: u64, imm: u32| prev.wrapping_add(u64::from(imm.wrapping_sub(prev as u32)));
        let mut prev = 0u64;
        for k in 1..10u64 {
            let v = k * ((1 << 31) - 1);
            prev = rebuild(prev, v as u32);
            assert_eq!(prev, v);
        }
        assert_eq!(rebuild(u32::MAX as u64, 3), (1u64 << 32) + 3);
    }
}
