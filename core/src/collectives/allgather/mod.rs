//! All-gather algorithms, one file each (upstream names).

pub mod fullmesh;
pub mod hier_port;
pub mod packet;
pub mod port_channel;
