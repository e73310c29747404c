//! 07: InfiniBand. The port channel rounds of example 06, over an `Ib0` connection: the proxy
//! posts RDMA writes and atomics instead of Ethernet frames. Without RDMA hardware it runs on the
//! project's user-space verbs provider, which implements the verbs over shared memory:
//!
//! ```text
//! cargo build -p mscclpp-ibv-testprov
//! MSCCLPP_IBV_SO=$PWD/target/debug/libmscclpp_ibv_testprov.so cargo run -p mscclpp --example 07-ib
//! ```
//!
//! With `MSCCLPP_IBV_SO` unset and no IB device it says so and exits 0; with it set to a library
//! that gives no device it fails.

#[path = "06-port-channel.rs"]
#[allow(dead_code)] // 07 uses only port_channel_rounds of 06
mod port_channel;

use mscclpp::{Device, EndpointConfig, Transport};
use port_channel::common::{self, Rank, Res};

fn body(me: &Rank) -> Res {
    // Host memory: the test provider cannot reach GPU memory (a real NIC with GPUDirect can).
    port_channel::port_channel_rounds(me, EndpointConfig::new(Transport::Ib0, Device::CPU))
}

fn main() {
    if let Some(reason) = mscclpp::ib::ib_unavailable_reason() {
        match mscclpp::env().ibv_so() {
            Some(so) => {
                eprintln!(
                    "07-ib: MSCCLPP_IBV_SO={} gives no IB device: {reason}",
                    so.display()
                );
                std::process::exit(1);
            }
            None => {
                println!("07-ib: skipped: no IB device ({reason}); set MSCCLPP_IBV_SO to the test provider, see the file's docs");
                return;
            }
        }
    }
    common::run("07-ib", 2, 22007, body)
}
