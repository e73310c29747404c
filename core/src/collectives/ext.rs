//! Per-communicator state that algorithms set up lazily, at their first call outside graph
//! capture (e.g. the proxy and port channels of the port-channel algorithms, the GPU-sharing
//! census of the mesh algorithms), kept in [`super::Resources::ext`] and dropped with it.
//!
//! Setting a slot up may be collective (bootstrap traffic): it runs inside a collective call,
//! which every rank issues in the same order, under the launch lock.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

type Slot = Arc<dyn Any + Send + Sync>;

/// Named slots of lazily built state (see the module doc).
#[derive(Default)]
pub struct Extensions {
    slots: Mutex<HashMap<&'static str, Slot>>,
}

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&str> = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        f.debug_struct("Extensions").field("slots", &keys).finish()
    }
}

impl Extensions {
    /// The state in slot `key`, if it was built.
    pub fn get<T: Any + Send + Sync>(&self, key: &'static str) -> Result<Option<Arc<T>>> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        match slots.get(key) {
            None => Ok(None),
            Some(s) => s.clone().downcast::<T>().map(Some).map_err(|_| {
                Error::Internal(format!("collectives: slot `{key}` holds another type"))
            }),
        }
    }

    /// The state in slot `key`, built by `init` when missing (`init` runs under the slot
    /// table's lock; a failure leaves the slot empty).
    pub fn get_or_try_init<T: Any + Send + Sync>(
        &self,
        key: &'static str,
        init: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slots.get(key) {
            return s.clone().downcast::<T>().map_err(|_| {
                Error::Internal(format!("collectives: slot `{key}` holds another type"))
            });
        }
        let v = Arc::new(init()?);
        slots.insert(key, v.clone());
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots() {
        let e = Extensions::default();
        assert!(e.get::<u32>("a").unwrap().is_none());
        assert!(e
            .get_or_try_init::<u32>("a", || Err(Error::invalid("no")))
            .is_err());
        assert!(
            e.get::<u32>("a").unwrap().is_none(),
            "a failed init leaves the slot empty"
        );
        assert_eq!(*e.get_or_try_init("a", || Ok(7u32)).unwrap(), 7);
        assert_eq!(*e.get_or_try_init("a", || Ok(8u32)).unwrap(), 7);
        assert!(
            e.get::<u64>("a").is_err(),
            "a wrong type is an error, not a panic"
        );
    }
}
