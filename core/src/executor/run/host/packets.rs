//! The LL packet operations of the host interpreter: packets put, forwarded, copied and
//! unpacked (ppkt, rppkt, cpkt, upkt), and reductions of packets (repkt, respkt, recpkt,
//! recspkt).

use super::reduce;
use super::thread::Thread;
use crate::device_emu::packet;
use crate::device_emu::packet::HostPacket;
use crate::error::{Error, Result};
use crate::executor::json::PlanReduceOp;
use crate::executor::lower::device::{op, ExecOp, CHANNEL_MEMORY, CHANNEL_PORT};

impl Thread<'_> {
    /// ppkt / rppkt / cpkt / upkt.
    ///
    /// # Safety
    /// See [`super::run`].
    pub(super) unsafe fn move_packets<P: HostPacket>(&self, o: &ExecOp) -> Result<()> {
        let pay = P::PAYLOAD_BYTES as u64;
        let size = u64::from(o.input_sizes[0]);
        if !size.is_multiple_of(pay) {
            return Err(Error::Executor(format!(
                "{} packets: {size} bytes is not a multiple of the {pay}-byte payload",
                P::NAME
            )));
        }
        // SAFETY: forwarded (every arm).
        unsafe {
            match o.op_type {
                op::PUT_PACKETS if o.channel_type == CHANNEL_PORT => {
                    self.port_put_packets(o, |i| 2 * u64::from(o.input_sizes[i]))
                }
                op::PUT_PACKETS | op::COPY_PACKETS => self.pack::<P>(o),
                op::UNPACK_PACKETS => self.unpack::<P>(o, size / pay),
                _ => self.forward_packets::<P>(o, size / pay),
            }
        }
    }

    /// Packets through port channels: the proxy copies output `i`'s packet range
    /// (`bytes(i)` bytes) from this rank's buffer to the peer's.
    ///
    /// # Safety
    /// See [`super::run`].
    unsafe fn port_put_packets(&self, o: &ExecOp, bytes: impl Fn(usize) -> u64) -> Result<()> {
        for i in self.mine(o.n_outputs as usize) {
            let (dst, dst_off, sid, src_off) = self.port_endpoints(o, i, 0, true);
            let ch = &self.block.port_channels[o.channels[i] as usize];
            // SAFETY: live port channel.
            unsafe { ch.put(dst, dst_off, sid, src_off, bytes(i), self.l.timeout)? };
        }
        Ok(())
    }

    /// ppkt (memory channels) / cpkt: input chunk `i` written as packets into output `i`.
    ///
    /// # Safety
    /// See [`super::run`].
    unsafe fn pack<P: HostPacket>(&self, o: &ExecOp) -> Result<()> {
        for i in 0..o.n_outputs as usize {
            let d = self.loc(o.output_refs[i], o.output_types[i]).base;
            let s = self.local(o.input_refs[i]).base;
            // SAFETY: validated ranges; the destination is a doubled packet range.
            unsafe {
                packet::copy_to_packets::<P>(
                    Thread::pkt::<P>(d, o.output_offsets[i], 0),
                    s.add(o.input_offsets[i] as usize),
                    u64::from(o.input_sizes[i]),
                    self.tid,
                    self.n,
                    self.flag,
                )?
            };
        }
        Ok(())
    }

    /// upkt: waits for the `n` packets in local scratch and stores their data.
    ///
    /// # Safety
    /// See [`super::run`].
    unsafe fn unpack<P: HostPacket>(&self, o: &ExecOp, n: u64) -> Result<()> {
        let src = self.local(o.input_refs[0]).base;
        let d = self.local(o.output_refs[0]).base;
        for idx in self.mine(n as usize) {
            let p = Thread::pkt::<P>(src, o.input_offsets[0], idx as u64);
            // SAFETY: a payload slot inside the destination chunk.
            let out = unsafe {
                d.add(o.output_offsets[0] as usize + idx * P::PAYLOAD_BYTES)
                    .cast::<u32>()
            };
            self.read(p, out)?;
        }
        Ok(())
    }

    /// rppkt: forwards the `n` packets of the local scratch to peers as they arrive (memory
    /// channels), or once all arrived (port channels: the proxy copies the range).
    ///
    /// # Safety
    /// See [`super::run`].
    unsafe fn forward_packets<P: HostPacket>(&self, o: &ExecOp, n: u64) -> Result<()> {
        let src = self.local(o.input_refs[0]).base;
        let mut buf = [0u32; 2];
        for idx in self.mine(n as usize) {
            let p = Thread::pkt::<P>(src, o.input_offsets[0], idx as u64);
            self.read(p, buf.as_mut_ptr())?;
            if o.channel_type == CHANNEL_MEMORY {
                for j in 0..o.n_outputs as usize {
                    let d = self.loc(o.output_refs[j], o.output_types[j]).base;
                    let q = Thread::pkt::<P>(d, o.output_offsets[j], idx as u64);
                    // SAFETY: a packet slot of the peer's buffer.
                    unsafe { P::write(q, buf.as_ptr(), self.flag) };
                }
            }
        }
        if o.channel_type == CHANNEL_PORT {
            self.sync()?;
            let bytes = 2 * u64::from(o.input_sizes[0]);
            // SAFETY: forwarded.
            unsafe { self.port_put_packets(o, |_| bytes)? };
        }
        Ok(())
    }

    /// repkt / respkt / recpkt / recspkt: reduce the local chunk with packets of the local
    /// scratch, store the result, and (copy) write it as packets locally / (send) to peers.
    ///
    /// # Safety
    /// See [`super::run`].
    pub(super) unsafe fn reduce_packets<P: HostPacket>(&self, o: &ExecOp) -> Result<()> {
        let pay = P::PAYLOAD_BYTES;
        let es = self.l.dtype.size_in_bytes();
        if !pay.is_multiple_of(es) {
            return Err(Error::Executor(format!(
                "{} packets carry {pay} bytes: cannot reduce {es}-byte {} elements in them (use LL16)",
                P::NAME,
                self.l.dtype
            )));
        }
        let size = o.input_sizes[0] as usize;
        let n = size / pay;
        let op = PlanReduceOp::from_code(o.reduce_op);
        let copies = matches!(
            o.op_type,
            op::REDUCE_COPY_PACKETS | op::REDUCE_COPY_SEND_PACKETS
        );
        let first_remote = if copies { 2 } else { 1 };
        let sends = matches!(
            o.op_type,
            op::REDUCE_SEND_PACKETS | op::REDUCE_COPY_SEND_PACKETS
        );
        let src0 = self.local(o.input_refs[0]).base;
        let dst0 = self.local(o.output_refs[0]).base;
        let ni = o.n_inputs as usize;
        // Payload of every input for one packet index: reduced in one pass, so 16-bit and
        // fp8 floats accumulate in f32 as in the plain (non-packet) reductions.
        let mut vals = vec![[0u32; 2]; ni];
        let mut acc = [0u32; 2];
        for idx in self.mine(n) {
            // SAFETY: payload slots inside the validated chunks.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src0.add(o.input_offsets[0] as usize + idx * pay),
                    vals[0].as_mut_ptr().cast::<u8>(),
                    pay,
                )
            };
            for (j, v) in vals.iter_mut().enumerate().skip(1) {
                let p = Thread::pkt::<P>(
                    self.local(o.input_refs[j]).base,
                    o.input_offsets[j],
                    idx as u64,
                );
                self.read(p, v.as_mut_ptr())?;
            }
            let ptrs: Vec<*const u8> = vals.iter().map(|v| v.as_ptr().cast::<u8>()).collect();
            // SAFETY: every payload array holds 8 bytes >= pay.
            unsafe { reduce::reduce(self.l.dtype, op, acc.as_mut_ptr().cast(), &ptrs, pay) };
            // SAFETY: as above.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    acc.as_ptr().cast::<u8>(),
                    dst0.add(o.output_offsets[0] as usize + idx * pay),
                    pay,
                )
            };
            if copies {
                let d = self.local(o.output_refs[1]).base;
                let q = Thread::pkt::<P>(d, o.output_offsets[1], idx as u64);
                // SAFETY: a packet slot of a local packet buffer.
                unsafe { P::write(q, acc.as_ptr(), self.flag) };
            }
            if sends {
                for j in first_remote..o.n_outputs as usize {
                    let d = self.loc(o.output_refs[j], o.output_types[j]).base;
                    let q = Thread::pkt::<P>(d, o.output_offsets[j], idx as u64);
                    // SAFETY: a packet slot of the peer's buffer.
                    unsafe { P::write(q, acc.as_ptr(), self.flag) };
                }
            }
        }
        Ok(())
    }
}
