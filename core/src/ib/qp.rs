//! The queue pair of a local IB endpoint and its description for the peer.
//!
//! Creating an IB endpoint opens the transport's device ([`super`]), picks the port and GID,
//! creates a send CQ, a receive CQ and an RC QP (moved to INIT, with `max_recv_wr` zero-length
//! receives posted so that signals never find an empty receive queue), and registers a small
//! host "mailbox" ring (see HostNoAtomic below). Its transport payload (`MIBQ` envelope,
//! version 1): `port u8 | lid u32 | gid blob(16) | qpn u32 | psn u32 | mtu u8 | link layer u8 |
//! mode u8 (1 Host, 2 HostNoAtomic) | mailbox address u64 | mailbox rkey u32 | mailbox slots
//! u32`. Connecting moves the QP to RTR towards the peer's QP, then to RTS; an endpoint connects
//! once.
//!

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mscclpp_hal::ibv::{AccessFlags, Gid, MemoryRegion, QpCaps, QueuePair, RecvWr};

use super::{ib_ctx, ibv_err, IbCtx};
use crate::error::{Error, Result};
use crate::serialize::{Reader, Writer};
use crate::transport::{EndpointConfig, IbMode};

const QP_MAGIC: &[u8; 4] = b"MIBQ";
const QP_VERSION: u16 = 1;

/// Host memory registered for one QP's local use (atomics' old values, staging, mailbox).
/// The region is declared first so it is deregistered before the buffer is freed.
pub(crate) struct HostRing {
    pub(crate) mr: MemoryRegion,
    pub(crate) buf: Box<[AtomicU64]>,
}

impl HostRing {
    pub(crate) fn new(ctx: &IbCtx, slots: usize, access: AccessFlags) -> Result<HostRing> {
        let buf: Box<[AtomicU64]> = (0..slots.max(1)).map(|_| AtomicU64::new(0)).collect();
        let len = buf.len() * 8;
        // SAFETY: `buf` is owned by the returned ring and freed only after `mr` is dropped
        // (field order); the device writes it only through atomics-compatible 8-byte stores.
        let mr = unsafe { ctx.pd.reg_mr(buf.as_ptr() as *mut u8, len, access) }.map_err(|e| {
            ibv_err(
                &format!("{}: registering a {len}-byte ring", ctx.transport),
                e,
            )
        })?;
        Ok(HostRing { mr, buf })
    }
    pub(crate) fn slot_addr(&self, i: usize) -> u64 {
        self.buf.as_ptr() as u64 + (i % self.buf.len()) as u64 * 8
    }
}

/// What the peer's endpoint says about its QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpInfo {
    pub port: u8,
    pub lid: u16,
    pub gid: Gid,
    pub qpn: u32,
    pub psn: u32,
    pub mtu: u8,
    pub link_layer: u8,
    pub mode: IbMode,
    pub mailbox_addr: u64,
    pub mailbox_rkey: u32,
    pub mailbox_slots: u32,
}

impl QpInfo {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(QP_MAGIC, QP_VERSION);
        w.u8(self.port)
            .u32(u32::from(self.lid))
            .blob(&self.gid.0)
            .u32(self.qpn)
            .u32(self.psn)
            .u8(self.mtu)
            .u8(self.link_layer)
            .u8(match self.mode {
                IbMode::HostNoAtomic => 2,
                _ => 1,
            })
            .u64(self.mailbox_addr)
            .u32(self.mailbox_rkey)
            .u32(self.mailbox_slots);
        w.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<QpInfo> {
        let mut r = Reader::new("IB endpoint info", bytes, QP_MAGIC, QP_VERSION)?;
        let port = r.u8("port")?;
        let lid = r.u32("lid")?;
        let lid = u16::try_from(lid).map_err(|_| r.bad("lid", "a 16-bit LID", lid))?;
        let g = r.blob("gid", 16)?;
        let gid = <[u8; 16]>::try_from(g).map_err(|_| r.bad("gid", "16 bytes", g.len()))?;
        let qpn = r.u32("qpn")?;
        let psn = r.u32("psn")?;
        let mtu = r.u8("mtu")?;
        let link_layer = r.u8("link layer")?;
        let mode = match r.u8("mode")? {
            1 => IbMode::Host,
            2 => IbMode::HostNoAtomic,
            m => return Err(r.bad("mode", "1 (Host) or 2 (HostNoAtomic)", m)),
        };
        let mailbox_addr = r.u64("mailbox address")?;
        let mailbox_rkey = r.u32("mailbox rkey")?;
        let mailbox_slots = r.u32("mailbox slots")?;
        r.finish()?;
        if port == 0 {
            return Err(Error::invalid(
                "IB endpoint info: port: expected 1..=255, got 0".to_string(),
            ));
        }
        if qpn == 0 || qpn > 0x00FF_FFFF || psn > 0x00FF_FFFF {
            return Err(Error::invalid(format!(
                "IB endpoint info: expected a 24-bit QP number above 0 and a 24-bit PSN, got \
                 qpn {qpn:#x}, psn {psn:#x}"
            )));
        }
        if !(1..=5).contains(&mtu) {
            return Err(Error::invalid(format!(
                "IB endpoint info: mtu: expected IBV_MTU_256..IBV_MTU_4096 (1..=5), got {mtu}"
            )));
        }
        if mailbox_slots == 0 {
            return Err(Error::invalid(
                "IB endpoint info: mailbox slots: expected above 0, got 0".to_string(),
            ));
        }
        Ok(QpInfo {
            port,
            lid,
            gid: Gid(gid),
            qpn,
            psn,
            mtu,
            link_layer,
            mode,
            mailbox_addr,
            mailbox_rkey,
            mailbox_slots,
        })
    }
}

/// The QP side of a local IB endpoint, taken by the first `connect`.
pub(crate) struct IbQp {
    pub(crate) ctx: Arc<IbCtx>,
    pub(crate) qp: Arc<QueuePair>,
    pub(crate) info: QpInfo,
    pub(crate) gid_index: u8,
    pub(crate) is_ethernet: bool,
    pub(crate) mailbox: Arc<HostRing>,
    pub(crate) max_send_wr: usize,
    pub(crate) max_recv_wr: usize,
    pub(crate) max_wr_per_send: usize,
    pub(crate) poll_num: usize,
}

impl std::fmt::Debug for IbQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbQp").field("info", &self.info).finish()
    }
}

fn positive(what: &str, v: i32) -> Result<usize> {
    if v <= 0 {
        return Err(Error::invalid(format!(
            "IbConfig.{what}: expected a positive value, got {v}"
        )));
    }
    Ok(v as usize)
}

/// The mode an endpoint asks for: the config's, `Default` read from `MSCCLPP_IBV_MODE`; Host
/// on a device without atomics falls back to HostNoAtomic with a warning.
fn resolve_mode(cfg: &EndpointConfig, ctx: &IbCtx) -> Result<IbMode> {
    let mode = match cfg.ib.mode {
        IbMode::Default => match crate::env::env().ibv_mode()? {
            crate::env::IbvMode::Host => IbMode::Host,
            crate::env::IbvMode::HostNoAtomic => IbMode::HostNoAtomic,
        },
        m => m,
    };
    if mode == IbMode::Host && !ctx.atomics {
        crate::log_warn!(
            "NET",
            "{}: device `{}` has no RDMA atomics; using HostNoAtomic instead of Host",
            cfg.transport,
            ctx.name()
        );
        return Ok(IbMode::HostNoAtomic);
    }
    Ok(mode)
}

fn fresh_psn() -> u32 {
    static N: AtomicU64 = AtomicU64::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    (crate::identity::fnv1a(&n.to_le_bytes(), crate::identity::pid_hash()) as u32) & 0x00FF_FFFF
}

impl IbQp {
    /// Creates the QP of a new endpoint of `cfg` and returns it with its payload.
    pub(crate) fn create(cfg: &EndpointConfig) -> Result<(Vec<u8>, IbQp)> {
        let t = cfg.transport;
        let ctx = ib_ctx(t)?;
        let (port, pa, gid, gid_index) = ctx.select_port(&cfg.ib)?;
        let mode = resolve_mode(cfg, &ctx)?;
        let limit = (ctx.max_qp_wr as usize).max(1);
        let max_send_wr = positive("max_send_wr", cfg.ib.max_send_wr)?.min(limit);
        let max_recv_wr = positive("max_recv_wr", cfg.ib.max_recv_wr)?.min(limit);
        let max_wr_per_send = positive("max_wr_per_send", cfg.ib.max_wr_per_send)?.min(max_send_wr);
        let poll_num = positive("max_cq_poll_num", cfg.ib.max_cq_poll_num)?;
        let cq_size = positive("max_cq_size", cfg.ib.max_cq_size)?;
        let ctx_ib = ctx.pd.context();
        let send_cq = ctx_ib
            .create_cq(cq_size.max(max_send_wr) as i32)
            .map_err(|e| ibv_err(&format!("{t}: creating the send CQ"), e))?;
        let recv_cq = ctx_ib
            .create_cq(cq_size.max(max_recv_wr) as i32)
            .map_err(|e| ibv_err(&format!("{t}: creating the receive CQ"), e))?;
        let caps = QpCaps {
            max_send_wr: max_send_wr as u32,
            max_recv_wr: max_recv_wr as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = ctx
            .pd
            .create_rc_qp(&send_cq, &recv_cq, caps)
            .map_err(|e| ibv_err(&format!("{t}: creating an RC QP on `{}`", ctx.name()), e))?;
        qp.to_init(port, AccessFlags::ALL_REMOTE)
            .map_err(|e| ibv_err(&format!("{t}: QP {} to INIT", qp.qp_num()), e))?;
        let recvs: Vec<RecvWr> = (0..max_recv_wr)
            .map(|i| RecvWr {
                wr_id: i as u64,
                local: None,
            })
            .collect();
        qp.post_recv(&recvs)
            .map_err(|e| ibv_err(&format!("{t}: posting {max_recv_wr} receives"), e))?;
        let mailbox = HostRing::new(
            &ctx,
            2 * max_recv_wr,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )?;
        let info = QpInfo {
            port,
            lid: pa.lid,
            gid,
            qpn: qp.qp_num(),
            psn: fresh_psn(),
            mtu: pa.active_mtu as u8,
            link_layer: pa.link_layer,
            mode,
            mailbox_addr: mailbox.mr.addr(),
            mailbox_rkey: mailbox.mr.rkey(),
            mailbox_slots: mailbox.buf.len() as u32,
        };
        let payload = info.encode();
        Ok((
            payload,
            IbQp {
                ctx,
                qp: Arc::new(qp),
                info,
                gid_index,
                is_ethernet: pa.is_ethernet(),
                mailbox: Arc::new(mailbox),
                max_send_wr,
                max_recv_wr,
                max_wr_per_send,
                poll_num,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> QpInfo {
        QpInfo {
            port: 1,
            lid: 0,
            gid: Gid([7; 16]),
            qpn: 0x1234,
            psn: 0x55,
            mtu: 5,
            link_layer: 2,
            mode: IbMode::HostNoAtomic,
            mailbox_addr: 0x1000,
            mailbox_rkey: 9,
            mailbox_slots: 32,
        }
    }

    #[test]
    fn qp_info_round_trips_and_rejects_malformed() {
        let i = info();
        let b = i.encode();
        assert_eq!(QpInfo::decode(&b).unwrap(), i);
        assert!(QpInfo::decode(&b[..b.len() - 1]).is_err());
        let mut bad = i;
        bad.qpn = 0x0100_0000;
        assert!(QpInfo::decode(&bad.encode()).is_err());
        bad = i;
        bad.mtu = 9;
        assert!(QpInfo::decode(&bad.encode()).is_err());
        bad = i;
        bad.port = 0;
        assert!(QpInfo::decode(&bad.encode()).is_err());
    }
}
