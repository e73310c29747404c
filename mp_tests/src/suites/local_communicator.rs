//! LocalCommunicatorTest: one rank's communicator on its own memory.

use mscclpp::{Communicator, Context, Device, LocalMemory, RegisteredMemory, Transport};
use mscclpp_framework::*;

use super::bootstrap::random_bytes;
use crate::world::mp_env;

macro_rules! ok {
    ($e:expr, $($what:tt)+) => {
        match $e {
            Ok(v) => v,
            Err(e) => FAIL!("{}: {}", format!($($what)+), e),
        }
    };
}

TEST!(LocalCommunicatorTest, RegisterMemory, |_ctx| {
    let env = mp_env();
    let comm = Communicator::new(env.bootstrap.clone(), ok!(Context::new(), "Context::new"));
    let mem = ok!(LocalMemory::alloc(Device::CPU, 1 << 20), "alloc");
    let flags = Transport::CudaIpc | Transport::Ethernet;
    let reg = ok!(
        comm.register_memory(mem.ptr() + 4096, 8192, flags),
        "register_memory"
    );
    EXPECT_EQ!(reg.data(), mem.ptr() + 4096);
    EXPECT_EQ!(reg.original_data_ptr(), mem.ptr() + 4096);
    EXPECT_EQ!(reg.size(), 8192);
    EXPECT_EQ!(reg.transports(), flags);
    EXPECT_TRUE!(reg.is_local());
    let back = ok!(
        RegisteredMemory::deserialize(&reg.serialize()),
        "deserialize"
    );
    EXPECT_EQ!(back.data(), reg.data());
    EXPECT_EQ!(back.size(), reg.size());
    EXPECT_EQ!(back.transports(), reg.transports());
    // Outside any allocation made through LocalMemory: an error, not a registration.
    EXPECT_TRUE!(comm
        .register_memory(mem.ptr() + (1 << 20) - 8, 16, flags)
        .is_err());
    EXPECT_TRUE!(comm.register_memory(mem.ptr(), 0, flags).is_err());
});

TEST!(LocalCommunicatorTest, SendMemoryToSelf, |_ctx| {
    let env = mp_env();
    let rank = env.bootstrap.rank();
    let comm = Communicator::new(env.bootstrap.clone(), ok!(Context::new(), "Context::new"));
    let mem = ok!(LocalMemory::alloc(Device::CPU, 65536), "alloc");
    let data = random_bytes(65536, rank as u64 + 5);
    ok!(mem.write(0, &data), "fill");
    let reg = ok!(
        comm.register_memory(
            mem.ptr(),
            mem.size(),
            Transport::CudaIpc | Transport::Ethernet
        ),
        "register_memory"
    );
    ok!(comm.send_memory(&reg, rank, 0), "send to self");
    let got = ok!(comm.recv_memory(rank, 0).get(), "recv from self");
    EXPECT_EQ!(got.data(), mem.ptr());
    EXPECT_EQ!(got.size(), mem.size());
    EXPECT_TRUE!(got.is_local());
    // A connection to self writes through the received memory.
    let conn = ok!(
        comm.connect(Transport::CudaIpc, rank, 0).get(),
        "connect to self"
    );
    let src = ok!(LocalMemory::alloc(Device::CPU, 65536), "alloc");
    let src_data = random_bytes(65536, rank as u64 + 77);
    ok!(src.write(0, &src_data), "fill");
    let src_reg = ok!(
        comm.register_memory(src.ptr(), src.size(), Transport::CudaIpc.into()),
        "register"
    );
    ok!(conn.write(&got, 0, &src_reg, 0, 65536), "write");
    ok!(conn.flush(env.timeout), "flush");
    EXPECT_TRUE!(ok!(mem.to_vec(), "read") == src_data);
    // A receive from self with nothing sent is an error, not a hang.
    EXPECT_TRUE!(comm.recv_memory(rank, 1).get().is_err());
});
