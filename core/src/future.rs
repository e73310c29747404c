//! Deferred results of the communicator: the work that needs the peer runs when `get` is
//! called.

use crate::error::Result;

/// A result that becomes available when [`Future::get`] is called. For one `(rank, tag)` of a
/// [`crate::Communicator`], receives complete in call order whatever order the futures are
/// waited: getting a later future first completes (and keeps) the earlier ones.
#[must_use = "a Future does nothing until get() is called"]
pub struct Future<T> {
    work: Box<dyn FnOnce() -> Result<T> + Send>,
}

impl<T> std::fmt::Debug for Future<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Future")
    }
}

impl<T: 'static> Future<T> {
    /// A future that runs `work` when waited.
    pub fn new(work: impl FnOnce() -> Result<T> + Send + 'static) -> Future<T> {
        Future {
            work: Box::new(work),
        }
    }

    /// A future whose result is already known.
    pub fn ready(result: Result<T>) -> Future<T>
    where
        T: Send,
    {
        Future::new(move || result)
    }

    /// Waits for the result.
    pub fn get(self) -> Result<T> {
        (self.work)()
    }
}
