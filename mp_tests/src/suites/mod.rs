//! The suites of `mp_unit_tests`, one file per upstream suite family.

mod bootstrap;
mod communicator;
mod local_communicator;
mod multi_process;
mod fifo;
mod memory_channel;
mod port_channel;
mod semaphore_perf;
