//! The AMD IPC handle cache: one open mapping per IPC handle per process.
//!
//! ROCm limits how often a process may open the same IPC handle (a second
//! `hipIpcOpenMemHandle` of one handle fails or leaks), while NVIDIA refcounts internally. The
//! cache maps handle bytes to a weak reference of the opened mapping: a second open of the same
//! handle returns the same mapping, and the last release closes it. Reference-count changes that
//! can open or close happen under the cache lock, so concurrent opens of one handle open it once
//! and a close never races a reopen.
//!
//! The cache is generic over an [`IpcOpener`] (the seam): the ROCm backend plugs in
//! `hipIpcOpenMemHandle`/`hipIpcCloseMemHandle`; unit tests plug in a counting fake.

use crate::auxil::deferred;
use crate::Result;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};

/// Opens and closes IPC mappings for the cache.
pub trait IpcOpener: Send + Sync + 'static {
    /// The handle identity (e.g. the 64 handle bytes).
    type Key: Eq + Hash + Clone + Send + Sync + std::fmt::Debug;
    /// What an open produces (e.g. the mapped base address).
    type Mapping: Send + Sync + std::fmt::Debug;
    /// Opens `key`. Called at most once per live mapping.
    fn open(&self, key: &Self::Key) -> Result<Self::Mapping>;
    /// Closes a mapping returned by `open`. Called once, after the last release.
    fn close(&self, key: &Self::Key, mapping: &Self::Mapping) -> Result<()>;
}

struct Entry<O: IpcOpener> {
    key: O::Key,
    mapping: O::Mapping,
}

struct Shared<O: IpcOpener> {
    opener: O,
    map: Mutex<HashMap<O::Key, Weak<Entry<O>>>>,
}

/// A process-wide (or test-local) cache of opened IPC mappings.
pub struct IpcHandleCache<O: IpcOpener> {
    shared: Arc<Shared<O>>,
}

impl<O: IpcOpener> std::fmt::Debug for IpcHandleCache<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcHandleCache")
            .field("live", &self.live())
            .finish()
    }
}

/// A shared reference to an opened mapping; the last one dropped closes it.
pub struct CachedMapping<O: IpcOpener> {
    entry: Option<Arc<Entry<O>>>,
    shared: Arc<Shared<O>>,
}

impl<O: IpcOpener> std::fmt::Debug for CachedMapping<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedMapping")
            .field("mapping", &self.entry.as_ref().map(|e| &e.mapping))
            .finish()
    }
}

impl<O: IpcOpener> IpcHandleCache<O> {
    /// An empty cache using `opener`.
    pub fn new(opener: O) -> Self {
        IpcHandleCache {
            shared: Arc::new(Shared {
                opener,
                map: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Returns the live mapping of `key`, opening it if there is none.
    pub fn open(&self, key: &O::Key) -> Result<CachedMapping<O>> {
        let mut map = self.shared.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get(key).and_then(Weak::upgrade) {
            return Ok(CachedMapping {
                entry: Some(entry),
                shared: Arc::clone(&self.shared),
            });
        }
        let mapping = self.shared.opener.open(key)?;
        let entry = Arc::new(Entry {
            key: key.clone(),
            mapping,
        });
        map.insert(key.clone(), Arc::downgrade(&entry));
        Ok(CachedMapping {
            entry: Some(entry),
            shared: Arc::clone(&self.shared),
        })
    }

    /// Number of handles currently open.
    pub fn live(&self) -> usize {
        let map = self.shared.map.lock().unwrap_or_else(|p| p.into_inner());
        map.values().filter(|w| w.strong_count() > 0).count()
    }

    /// The opener (for inspection in tests).
    pub fn opener(&self) -> &O {
        &self.shared.opener
    }
}

impl<O: IpcOpener> CachedMapping<O> {
    /// The opened mapping.
    pub fn mapping(&self) -> &O::Mapping {
        // `entry` is only None inside Drop.
        match &self.entry {
            Some(e) => &e.mapping,
            None => unreachable!("CachedMapping used after drop"),
        }
    }
}

impl<O: IpcOpener> Clone for CachedMapping<O> {
    fn clone(&self) -> Self {
        let _guard = self.shared.map.lock().unwrap_or_else(|p| p.into_inner());
        CachedMapping {
            entry: self.entry.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<O: IpcOpener> Drop for CachedMapping<O> {
    fn drop(&mut self) {
        let mut map = self.shared.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = self.entry.take().and_then(Arc::into_inner) {
            // This was the last reference: close under the lock so no open can race it.
            if map.get(&entry.key).is_some_and(|w| w.strong_count() == 0) {
                map.remove(&entry.key);
            }
            if let Err(e) = self.shared.opener.close(&entry.key, &entry.mapping) {
                deferred::record(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Counting {
        opens: AtomicUsize,
        closes: AtomicUsize,
        next: AtomicUsize,
    }

    impl IpcOpener for Counting {
        type Key = [u8; 4];
        type Mapping = usize;
        fn open(&self, key: &[u8; 4]) -> Result<usize> {
            if key == b"fail" {
                return Err(crate::Error::invalid("open", "a good handle", "fail"));
            }
            self.opens.fetch_add(1, Ordering::SeqCst);
            // Widen the race window for the concurrency test.
            std::thread::sleep(std::time::Duration::from_millis(2));
            Ok(0x1000 * (1 + self.next.fetch_add(1, Ordering::SeqCst)))
        }
        fn close(&self, _key: &[u8; 4], _mapping: &usize) -> Result<()> {
            self.closes.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn counts(c: &IpcHandleCache<Counting>) -> (usize, usize) {
        (
            c.opener().opens.load(Ordering::SeqCst),
            c.opener().closes.load(Ordering::SeqCst),
        )
    }

    #[test]
    fn two_opens_share_one_mapping_and_close_after_last_release() {
        let cache = IpcHandleCache::new(Counting::default());
        let a = cache.open(b"hnd1").unwrap();
        let b = cache.open(b"hnd1").unwrap();
        assert_eq!(a.mapping(), b.mapping());
        assert_eq!(counts(&cache), (1, 0));
        let other = cache.open(b"hnd2").unwrap();
        assert_ne!(other.mapping(), a.mapping());
        assert_eq!(counts(&cache), (2, 0));
        drop(a);
        assert_eq!(counts(&cache), (2, 0), "closed while a reference was alive");
        assert_eq!(cache.live(), 2);
        drop(b);
        assert_eq!(counts(&cache), (2, 1));
        assert_eq!(cache.live(), 1);
        // Reopening after the close opens again.
        let c = cache.open(b"hnd1").unwrap();
        assert_eq!(counts(&cache), (3, 1));
        drop(c);
        drop(other);
        assert_eq!(counts(&cache), (3, 3));
        assert_eq!(cache.live(), 0);
    }

    #[test]
    fn clone_keeps_mapping_open() {
        let cache = IpcHandleCache::new(Counting::default());
        let a = cache.open(b"hnd1").unwrap();
        let b = a.clone();
        drop(a);
        assert_eq!(counts(&cache), (1, 0));
        drop(b);
        assert_eq!(counts(&cache), (1, 1));
    }

    #[test]
    fn failed_open_caches_nothing() {
        let cache = IpcHandleCache::new(Counting::default());
        assert!(cache.open(b"fail").is_err());
        assert_eq!(cache.live(), 0);
    }

    #[test]
    fn concurrent_opens_open_once() {
        let cache = Arc::new(IpcHandleCache::new(Counting::default()));
        let barrier = Arc::new(std::sync::Barrier::new(16));
        let handles: Vec<_> = (0..16)
            .map(|_| {
                let cache = Arc::clone(&cache);
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    let m = cache.open(b"same").unwrap();
                    let v = *m.mapping();
                    (v, m)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(results.iter().all(|(v, _)| *v == results[0].0));
        assert_eq!(counts(&cache), (1, 0));
        drop(results);
        assert_eq!(counts(&cache), (1, 1));
    }
}
