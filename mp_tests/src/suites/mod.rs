//! The suites of `mp_unit_tests`, one file per upstream suite family.

mod allgather;
mod allreduce;
mod allreduce_nvls;
mod bootstrap;
mod broadcast;
mod check_calls;
mod coll_common;
mod coll_kernels;
mod coll_matrix;
mod coll_plans;
mod coll_scratch;
mod communicator;
mod determinism;
mod device_abort;
mod executor;
mod executor_bad;
mod executor_jit;
mod fifo;
mod ib;
mod ib_reg;
mod local_communicator;
mod memory_channel;
mod multi_process;
mod multinode;
mod p2p;
mod plan_perf;
mod port_channel;
mod port_channel_ib;
mod reduce_scatter;
mod registration;
mod semaphore_perf;
mod single_process;
mod switch_channel;
// Issue 28: zero-copy all-gather / reduce-scatter / broadcast, eager per-call cost.
mod zero_copy;
