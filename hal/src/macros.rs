//! Declarations the backends share where the shape is fixed by a trait (the [`crate::Api`]
//! type map, [`crate::StreamApi`] over a GPU driver, "no graph capture") or by the way a driver
//! handle is owned (thread-safe, destroyed once on drop through [`crate::auxil::deferred`]).
//! Each backend writes only what differs: its types, its driver calls, its names.

/// `Send` and `Sync` for types that hold raw handles or pointers which any thread may use;
/// every call site says why (a `// Thread-safe:` comment).
macro_rules! thread_safe {
    ($($t:ty),+ $(,)?) => {
        $(
            // SAFETY: the call site's `Thread-safe:` comment says why the handles this type
            // holds may be used and dropped from any thread.
            unsafe impl Send for $t {}
            // SAFETY: as above.
            unsafe impl Sync for $t {}
        )+
    };
}

#[cfg(any(hal_cuda, hal_rocm))]
/// A handle `self.raw` owned by a type with a device `self.dev`: thread-safe (the call site
/// says why, as for [`thread_safe`]), and destroyed once on drop by `$destroy(self.raw)` with the device current (failures deferred).
macro_rules! owned_handle {
    ($t:ty, $destroy:path) => {
        thread_safe!($t);

        impl Drop for $t {
            fn drop(&mut self) {
                // SAFETY: `raw` was created for this value alone and is destroyed once, here.
                crate::auxil::deferred::release(self.dev.bind(), || unsafe { $destroy(self.raw) });
            }
        }
    };
}

/// A backend: its unit type, the re-export of its types from their files and its
/// [`crate::Api`] impl (its name, whether its device memory is host addressable, and its types
/// in the trait's order, each as `file::Type`; the graph type of [`crate::StreamInterop`] is
/// re-exported too).
macro_rules! backend_api {
    ($api:ident, $name:literal, host_addressable: $host:literal, graph: $gfile:ident :: $graph:ident,
     $($file:ident :: $ty:ident),+ $(,)?) => {
        #[doc = concat!("The ", $name, " backend type (`mscclpp_hal::api::", stringify!($api), "`).")]
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $api;

        pub use $gfile::$graph;
        $(pub use $file::$ty;)+

        backend_api!(@impl $api, $name, $host, [] [Device Memory Imported Stream Event Module
            Kernel HostRegistration Multicast MulticastExport MulticastBinding MulticastMapping]
            $($ty),+);
    };
    // Pairs each associated type's name with the next type given, in order.
    (@impl $api:ident, $name:literal, $host:literal, [$($done:tt)*] [$assoc:ident $($names:ident)*]
     $ty:ty $(, $rest:ty)*) => {
        backend_api!(@impl $api, $name, $host, [$($done)* type $assoc = $ty;] [$($names)*] $($rest),*);
    };
    (@impl $api:ident, $name:literal, $host:literal, [$($done:tt)*] []) => {
        impl crate::Api for $api {
            const NAME: &'static str = $name;
            const HOST_ADDRESSABLE: bool = $host;
            $($done)*
        }
    };
}

#[cfg(any(hal_cuda, hal_rocm))]
/// [`crate::StreamApi`] for a GPU backend whose `stream`, `event` and `mem` driver wrappers
/// have the same names (CUDA, ROCm): streams and events carry `dev` and `raw`; waits poll the
/// query call with a timeout (`$stream_sync` and `$event_sync` name them in timeout errors);
/// `$D`, `$S` and `$E` are the device, stream and event types;
/// `$memset` is the driver's 8-bit asynchronous memset.
macro_rules! gpu_stream_api {
    ($api:ty, $D:ty, $S:ident($stream_sync:literal),
     $E:ident($event_sync:literal), $memset:path $(,)?) => {
        const _: () = {
            use crate::{Result, StreamApi};
            use std::time::Duration;

            impl StreamApi for $api {
                fn create_stream(dev: &$D) -> Result<$S> {
                    dev.enter()?;
                    Ok($S {
                        dev: <$D as Clone>::clone(dev),
                        raw: stream::create_non_blocking()?,
                    })
                }

                fn stream_synchronize(s: &$S, timeout: Duration) -> Result<()> {
                    s.dev.enter()?;
                    // Work that ran while the abort word was up may have left its waits
                    // early: reported as aborted, naming the peer (crate::abort).
                    let epoch = crate::abort::epoch();
                    // SAFETY: the stream is live while `s` is borrowed.
                    crate::auxil::poll_until($stream_sync, timeout, || unsafe {
                        stream::query(s.raw)
                    })?;
                    crate::abort::check_since($stream_sync, epoch)
                }

                fn create_event(dev: &$D) -> Result<$E> {
                    dev.enter()?;
                    Ok($E {
                        dev: <$D as Clone>::clone(dev),
                        raw: event::create()?,
                    })
                }

                fn record_event(e: &$E, s: &$S) -> Result<()> {
                    e.dev.enter()?;
                    // SAFETY: both are live while borrowed.
                    unsafe { event::record(e.raw, s.raw) }
                }

                fn event_synchronize(e: &$E, timeout: Duration) -> Result<()> {
                    e.dev.enter()?;
                    let epoch = crate::abort::epoch();
                    // SAFETY: the event is live while `e` is borrowed.
                    crate::auxil::poll_until($event_sync, timeout, || unsafe {
                        event::query(e.raw)
                    })?;
                    crate::abort::check_since($event_sync, epoch)
                }

                fn event_elapsed_ms(start: &$E, end: &$E) -> Result<f32> {
                    start.dev.enter()?;
                    // SAFETY: both events are live while borrowed.
                    unsafe { event::elapsed_ms(start.raw, end.raw) }
                }

                unsafe fn memset_async(s: &$S, dst: u64, value: u8, len: usize) -> Result<()> {
                    s.dev.enter()?;
                    // SAFETY: the caller keeps the range alive until the stream is done.
                    unsafe { $memset(dst, value, len, s.raw) }
                }

                unsafe fn memcpy_async(s: &$S, dst: u64, src: u64, len: usize) -> Result<()> {
                    s.dev.enter()?;
                    // SAFETY: the caller keeps both ranges alive until the stream is done.
                    unsafe { mem::copy_async(dst, src, len, s.raw) }
                }

                unsafe fn write_value64_async(s: &$S, dst: u64, value: u64) -> Result<()> {
                    s.dev.enter()?;
                    // SAFETY: the caller keeps the aligned target alive until the stream is done.
                    unsafe { stream::write_value64(s.raw, dst, value) }
                }
            }
        };
    };
}

/// The graph half of [`crate::StreamInterop`] for a backend without graph capture: nothing is
/// ever capturing; capture and launch are [`crate::Error::Unsupported`] with `$reason`.
macro_rules! no_graph_capture {
    ($backend:literal, $reason:literal, $stream:ty, $graph:ty) => {
        fn is_capturing(_stream: &$stream) -> crate::Result<bool> {
            Ok(false)
        }
        fn begin_capture(_stream: &$stream) -> crate::Result<()> {
            crate::unsupported("begin_capture", $backend, $reason)
        }
        fn end_capture(_stream: &$stream) -> crate::Result<$graph> {
            crate::unsupported("end_capture", $backend, $reason)
        }
        fn launch_graph(_graph: &$graph, _stream: &$stream) -> crate::Result<()> {
            crate::unsupported("launch_graph", $backend, $reason)
        }
    };
}
