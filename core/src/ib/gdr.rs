//! The process's GDRCopy status: probed once ([`mscclpp_hal::gdr::Gdr::probe`]), printed once
//! at info level, readable with [`gdr_status`]; the open handle HostNoAtomic receive threads
//! forward tokens into GPU memory through ([`gdr`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub use mscclpp_hal::gdr::GdrStatus;
use mscclpp_hal::gdr::{Gdr, GdrProbe};

static FORWARDS: AtomicU64 = AtomicU64::new(0);

fn probe() -> &'static GdrProbe {
    static PROBE: OnceLock<GdrProbe> = OnceLock::new();
    PROBE.get_or_init(|| {
        // The core's parse of MSCCLPP_FORCE_DISABLE_GDR decides; a malformed value keeps
        // GDRCopy off (fail closed) and says why.
        let not_built = (<mscclpp_hal::Gpu as mscclpp_hal::Api>::NAME == "rocm")
            .then_some("GDRCopy serves CUDA GPUs; this build's GPU backend is rocm");
        let disable = crate::env::env()
            .force_disable_gdr()
            .map_err(|e| e.to_string());
        let so = mscclpp_hal::env::gdrcopy_so();
        let p = Gdr::probe_switched(disable, so.as_deref(), not_built);
        crate::log_info!("NET", "GDRCopy: {} ({})", p.status.name(), p.message);
        p
    })
}

/// This process's GDRCopy status and the message saying why.
pub fn gdr_status() -> (GdrStatus, &'static str) {
    let p = probe();
    (p.status, p.message.as_str())
}

/// The open GDRCopy handle when the status is [`GdrStatus::Ok`].
pub(crate) fn gdr() -> Option<&'static Gdr> {
    probe().gdr.as_ref()
}

/// Counts one token forwarded through a GDRCopy mapping.
pub(crate) fn count_forward() {
    FORWARDS.fetch_add(1, Ordering::Relaxed);
}

/// How many HostNoAtomic tokens this process forwarded through GDRCopy mappings.
pub fn gdr_forwarded_signals() -> u64 {
    FORWARDS.load(Ordering::Relaxed)
}
