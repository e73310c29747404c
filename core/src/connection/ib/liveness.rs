//! Peer liveness of an IB connection (see "Peer liveness" in the parent module): the
//! non-blocking health check host waits poll.

use std::time::Instant;

use mscclpp_hal::ibv::{SendOp, SendWr};

use super::{IbConnection, SendState, PROBE_INTERVAL};
use crate::error::Result;
use crate::ib::ibv_err;
use crate::transport::IbMode;

impl IbConnection {
    /// See "Peer liveness" in the parent module: never blocks, posts at most one probe per
    /// [`PROBE_INTERVAL`].
    pub(super) fn check_health(&self) -> Result<()> {
        if let Some(a) = self.aborted() {
            return Err(self.broken_err(&a));
        }
        if let Some(f) = self.recv.fatal_message() {
            return Err(self.broken_err(&format!("receive thread: {f}")));
        }
        // Someone holding the send lock is polling the send CQ already.
        let Ok(mut st) = self.send.try_lock() else {
            return Ok(());
        };
        if let Some(b) = &st.broken {
            return Err(self.broken_err(b));
        }
        self.poll_send(&mut st)?;
        if self.mode != IbMode::HostNoAtomic {
            self.poll_recv_host_mode(&mut st)?;
        }
        let due = st.last_probe.is_none_or(|t| t.elapsed() >= PROBE_INTERVAL);
        if st.broken.is_none() && due && st.in_queue == 0 && self.max_send_wr > 0 {
            st.last_probe = Some(Instant::now());
            let wr = SendWr {
                wr_id: st.next_wr_id,
                op: SendOp::Write {
                    remote_addr: self.remote.mailbox_addr,
                    rkey: self.remote.mailbox_rkey,
                },
                local: None,
                signaled: true,
            };
            st.next_wr_id += 1;
            self.post(&mut st, &[wr], &[false])?;
        }
        match &st.broken {
            Some(b) => Err(self.broken_err(b)),
            None => Ok(()),
        }
    }

    /// Host mode has no receive thread: a completion on the receive CQ can only be a posted
    /// receive flushed because the QP went to the error state (the peer died).
    fn poll_recv_host_mode(&self, st: &mut SendState) -> Result<()> {
        let mut wcs = Vec::new();
        self.qp
            .recv_cq()
            .poll(&mut wcs, 4)
            .map_err(|e| ibv_err(&format!("{}: polling the receive CQ", self.transport), e))?;
        if let Some(wc) = wcs.iter().find(|wc| !wc.is_success()) {
            if st.broken.is_none() {
                st.broken = Some(format!(
                    "receive completion error: {} (vendor error {:#x}); the QP is in the error \
                     state (the peer may have died)",
                    wc.describe(),
                    wc.vendor_err
                ));
            }
        }
        Ok(())
    }
}
