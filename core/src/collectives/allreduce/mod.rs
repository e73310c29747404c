//! All-reduce algorithms, one file each (upstream names).

pub mod allpair_packet;
pub mod hier_rsag_port;
pub mod nvls_block_pipeline;
pub mod nvls_packet;
pub mod nvls_warp_pipeline;
pub mod nvls_zero_copy;
pub mod packet;
pub mod rsag;
pub mod rsag_pipeline;
pub mod rsag_port_channel;
pub mod rsag_zero_copy;
