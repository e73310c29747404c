//! The cache of registered user buffers for zero-copy algorithms, keyed by `(ptr, size)`.
//!
//! A miss outside graph capture is collective: every rank registers its buffer for CudaIpc
//! (which fails for memory the library did not allocate, e.g. a foreign `cudaMalloc`), then one
//! bootstrap all-gather exchanges the results. If any rank could not register, every rank
//! caches a negative entry and the caller falls back to a copying algorithm, so all ranks take
//! the same path. A miss under graph capture returns `None` without any traffic. Ranks must
//! therefore meet the same buffers in the same order (as with upstream MSCCL++).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::memory::LocalMemory;
use crate::registered_memory::RegisteredMemory;
use crate::transport::{Device, Transport};

/// One registered user buffer and its peers' mappings.
pub struct UserBuffer {
    /// The local registration (keeps the allocation alive).
    pub local: RegisteredMemory,
    /// The peers' buffers mapped here (`None` at this rank).
    pub peers: Vec<Option<RegisteredMemory>>,
    /// `u64[nranks]`: every rank's buffer as mapped here (own address at this rank).
    pub bases: Vec<u64>,
    /// Device copy of `bases` for kernels.
    pub table: LocalMemory,
}

/// Cached registrations: `None` = not registrable by every rank.
type Entries = HashMap<(u64, usize), Option<Arc<UserBuffer>>>;

/// The cache (see the module doc).
#[derive(Default)]
pub struct UserBufferCache {
    entries: Mutex<Entries>,
}

impl UserBufferCache {
    /// The registered buffer `(ptr, size)`, registering it on a miss when not `capturing`.
    /// `Ok(None)`: not registrable by every rank (or a miss during capture): use a copying
    /// algorithm.
    pub fn get_or_register(
        &self,
        comm: &Communicator,
        device: Device,
        ptr: u64,
        size: usize,
        capturing: bool,
    ) -> Result<Option<Arc<UserBuffer>>> {
        let key = (ptr, size);
        if let Some(e) = self
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(e.clone());
        }
        if capturing {
            return Ok(None);
        }
        let b = comm.bootstrap();
        let (rank, n) = (b.rank(), b.nranks());
        let local = comm
            .register_memory(ptr, size, Transport::CudaIpc.into())
            .ok();
        let mut blob = vec![u8::from(local.is_some())];
        if let Some(l) = &local {
            blob.extend_from_slice(&l.serialize());
        }
        let all = b.all_gather(&blob)?;
        let entry = if all.iter().all(|x| x.first() == Some(&1)) {
            let local = local.ok_or_else(|| Error::Internal("registration vanished".into()))?;
            let mut peers = Vec::with_capacity(n);
            let mut bases = Vec::with_capacity(n);
            for (p, x) in all.iter().enumerate() {
                if p == rank {
                    peers.push(None);
                    bases.push(ptr);
                    continue;
                }
                let m = RegisteredMemory::deserialize(&x[1..])?;
                if m.data() == 0 {
                    return Err(Error::remote(
                        p,
                        "user buffer: expected memory mapped in this process (CudaIpc on this host)",
                    ));
                }
                bases.push(m.data());
                peers.push(Some(m));
            }
            let table = LocalMemory::alloc(device, 8 * n)?;
            let bytes: Vec<u8> = bases.iter().flat_map(|v| v.to_le_bytes()).collect();
            table.write(0, &bytes)?;
            Some(Arc::new(UserBuffer {
                local,
                peers,
                bases,
                table,
            }))
        } else {
            None
        };
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, entry.clone());
        Ok(entry)
    }

    /// Entries cached so far (positive and negative).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
