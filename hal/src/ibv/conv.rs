//! Names for verbs enum values (pure mapping; libibverbs' own `*_str` functions are not
//! required from the loaded library).

use ibverbs_sys::{ibv_wc_opcode, ibv_wc_status};

/// The name of a work-completion status, as `ibv_wc_status_str` would print it.
pub fn wc_status_name(status: u32) -> &'static str {
    use ibv_wc_status::*;
    match status {
        IBV_WC_SUCCESS => "success",
        IBV_WC_LOC_LEN_ERR => "local length error",
        IBV_WC_LOC_QP_OP_ERR => "local QP operation error",
        IBV_WC_LOC_EEC_OP_ERR => "local EE context operation error",
        IBV_WC_LOC_PROT_ERR => "local protection error",
        IBV_WC_WR_FLUSH_ERR => "Work Request Flushed Error",
        IBV_WC_MW_BIND_ERR => "memory bind operation error",
        IBV_WC_BAD_RESP_ERR => "bad response error",
        IBV_WC_LOC_ACCESS_ERR => "local access error",
        IBV_WC_REM_INV_REQ_ERR => "remote invalid request error",
        IBV_WC_REM_ACCESS_ERR => "remote access error",
        IBV_WC_REM_OP_ERR => "remote operation error",
        IBV_WC_RETRY_EXC_ERR => "transport retry counter exceeded",
        IBV_WC_RNR_RETRY_EXC_ERR => "RNR retry counter exceeded",
        IBV_WC_LOC_RDD_VIOL_ERR => "local RDD violation error",
        IBV_WC_REM_INV_RD_REQ_ERR => "remote invalid RD request",
        IBV_WC_REM_ABORT_ERR => "operation aborted",
        IBV_WC_INV_EECN_ERR => "invalid EE context number",
        IBV_WC_INV_EEC_STATE_ERR => "invalid EE context state",
        IBV_WC_FATAL_ERR => "fatal error",
        IBV_WC_RESP_TIMEOUT_ERR => "response timeout error",
        IBV_WC_GENERAL_ERR => "general error",
        _ => "unknown status",
    }
}

/// The name of a work-completion opcode.
pub fn wc_opcode_name(opcode: u32) -> &'static str {
    use ibv_wc_opcode::*;
    match opcode {
        IBV_WC_SEND => "SEND",
        IBV_WC_RDMA_WRITE => "RDMA_WRITE",
        IBV_WC_RDMA_READ => "RDMA_READ",
        IBV_WC_COMP_SWAP => "COMP_SWAP",
        IBV_WC_FETCH_ADD => "FETCH_ADD",
        IBV_WC_RECV => "RECV",
        IBV_WC_RECV_RDMA_WITH_IMM => "RECV_RDMA_WITH_IMM",
        _ => "OTHER",
    }
}
