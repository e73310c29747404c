//! The suites of `mp_unit_tests`, one file per upstream suite family.

mod bootstrap;
mod communicator;
mod fifo;
mod ib;
mod local_communicator;
mod memory_channel;
mod multi_process;
mod port_channel;
mod port_channel_ib;
mod semaphore_perf;
mod single_process;
mod switch_channel;
