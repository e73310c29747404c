//! Completion queues and the work completions polled from them.

use std::ptr::NonNull;
use std::sync::Arc;

use ibverbs_sys as sys;

use super::conv::{wc_opcode_name, wc_status_name};
use super::device::Context;
use super::{inline, IbvError};

impl Context {
    /// `ibv_create_cq` with `cqe` entries, no completion channel.
    pub fn create_cq(self: &Arc<Self>, cqe: i32) -> Result<Arc<CompletionQueue>, IbvError> {
        CompletionQueue::create(self.clone(), cqe)
    }
}

/// A completion queue; destroyed when the last `Arc` goes (after the QPs using it).
pub struct CompletionQueue {
    ctx: Arc<Context>,
    raw: NonNull<sys::ibv_cq>,
}

// Thread-safe: verbs CQs are thread-safe; the pointer is only passed to verbs calls.
thread_safe!(CompletionQueue);

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.ctx.name())
            .finish()
    }
}

/// One polled work completion, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// `ibv_wc.wr_id`: the caller's id of the work request this completes.
    pub wr_id: u64,
    /// `ibv_wc_status::Type`; 0 is success.
    pub status: u32,
    /// `ibv_wc_opcode::Type` (only meaningful on success, as in verbs).
    pub opcode: u32,
    /// `ibv_wc.vendor_err`: the HCA's vendor-specific error syndrome (set on failures).
    pub vendor_err: u32,
    /// `ibv_wc.byte_len`: bytes transferred (for receives, bytes written to the buffer).
    pub byte_len: u32,
    /// Immediate data in host order, when the completion carries it.
    pub imm_data: Option<u32>,
    /// The local QP number the completion belongs to.
    pub qp_num: u32,
}

impl WorkCompletion {
    /// Whether the status is `IBV_WC_SUCCESS`.
    pub fn is_success(&self) -> bool {
        self.status == sys::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// A readable description, e.g. `RDMA_WRITE wr_id 3: remote access error (10)`.
    pub fn describe(&self) -> String {
        format!(
            "{} wr_id {}: {} ({})",
            wc_opcode_name(self.opcode),
            self.wr_id,
            wc_status_name(self.status),
            self.status
        )
    }

    fn from_sys(wc: &sys::ibv_wc) -> Self {
        let (status, vendor_err) = wc
            .error()
            .unwrap_or((sys::ibv_wc_status::IBV_WC_SUCCESS, 0));
        WorkCompletion {
            wr_id: wc.wr_id(),
            status,
            opcode: wc.opcode(),
            vendor_err,
            byte_len: wc.len() as u32,
            imm_data: wc.imm_data().map(u32::from_be),
            qp_num: wc.qp_num,
        }
    }
}

/// How many completions one `poll_cq` call asks for.
const POLL_BATCH: usize = 16;

impl CompletionQueue {
    pub(crate) fn create(ctx: Arc<Context>, cqe: i32) -> Result<Arc<Self>, IbvError> {
        if cqe <= 0 {
            return Err(IbvError::InvalidArgument {
                op: "ibv_create_cq",
                reason: format!("cqe must be positive, got {cqe}"),
            });
        }
        // SAFETY: live context; no completion channel, vector 0.
        let raw = unsafe {
            (ctx.lib().create_cq)(
                ctx.as_ptr(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| IbvError::from_errno("ibv_create_cq"))?;
        Ok(Arc::new(CompletionQueue { ctx, raw }))
    }

    /// The context this CQ belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw `ibv_cq` (valid while `self` lives).
    pub fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.raw.as_ptr()
    }

    /// Polls up to `max` completions (never blocks), appending them to `out`; returns how many
    /// were appended.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize, IbvError> {
        let mut total = 0;
        let mut wcs = [sys::ibv_wc::default(); POLL_BATCH];
        while total < max {
            let want = (max - total).min(POLL_BATCH);
            // SAFETY: live CQ; `wcs` has room for `want` entries.
            let n = unsafe { inline::poll_cq(self.as_ptr(), want as i32, wcs.as_mut_ptr()) };
            if n < 0 {
                return Err(IbvError::from_ret("ibv_poll_cq", n));
            }
            let n = n as usize;
            out.extend(wcs[..n].iter().map(WorkCompletion::from_sys));
            total += n;
            if n < want {
                break;
            }
        }
        Ok(total)
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: live CQ; by the Arc ownership no QP uses it any more.
        let ret = unsafe { (self.ctx.lib().destroy_cq)(self.as_ptr()) };
        if ret != 0 {
            log::warn!(
                "ibv_destroy_cq on {} failed: {}",
                self.ctx.name(),
                IbvError::from_ret("ibv_destroy_cq", ret)
            );
        }
    }
}
