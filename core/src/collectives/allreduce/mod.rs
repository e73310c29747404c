//! All-reduce algorithms, one file each (upstream names).

pub mod allpair_packet;
pub mod packet;
pub mod rsag;
