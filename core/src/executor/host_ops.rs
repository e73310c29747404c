//! The data-moving operations of the host interpreter: puts (memory and port channels),
//! reductions with remote reads and writes, and the LL packet operations.

use super::*;

impl Thread<'_> {
    /// This thread's contiguous share of `n` items.
    pub(super) fn share(&self, n: u64) -> (u64, u64) {
        let per = n.div_ceil(u64::from(self.n));
        let b = (per * u64::from(self.tid)).min(n);
        (b, (b + per).min(n))
    }

    /// put / pws / pwsf.
    ///
    /// # Safety
    /// See [`run`].
    pub(super) unsafe fn put(&self, o: &ExecOp, off: u64, unit: u64) -> Result<()> {
        let t = self.l.timeout;
        let size_of = |s: u32| u64::from(s).saturating_sub(off).min(unit);
        if o.channel_type == CHANNEL_MEMORY {
            for i in 0..o.n_outputs as usize {
                let size = size_of(o.output_sizes[i]);
                if size == 0 {
                    continue;
                }
                let s = self.local(o.input_refs[i]);
                let d = self.loc(o.output_refs[i], o.output_types[i]);
                // SAFETY: validated and lowered chunk ranges.
                unsafe {
                    copy::copy(
                        d.base.add(
                            (u64::from(o.output_offsets[i]) + self.it(d.scratch, off)) as usize,
                        ),
                        s.base.add(
                            (u64::from(o.input_offsets[i]) + self.it(s.scratch, off)) as usize,
                        ),
                        size,
                        self.tid,
                        self.n,
                    )?
                };
            }
            return Ok(());
        }
        for i in self.mine(o.n_outputs as usize) {
            let size = size_of(o.output_sizes[i]);
            if size == 0 {
                continue;
            }
            let (dst, dst_off, src, src_off) = self.port_endpoints(o, i, off, false);
            let ch = &self.block.port_channels[o.channels[i] as usize];
            // SAFETY: live port channel handles (caller's contract).
            unsafe {
                match o.op_type {
                    op::PUT => ch.put(dst, dst_off, src, src_off, size, t)?,
                    op::PUT_WITH_SIGNAL => {
                        ch.put_with_signal(dst, dst_off, src, src_off, size, t)?
                    }
                    _ => ch.put_with_signal_and_flush(dst, dst_off, src, src_off, size, t)?,
                }
            }
        }
        Ok(())
    }

    /// (dst memory id, dst offset, src memory id, src offset) of output `i` of a port op;
    /// `packets` doubles the chunk offsets (packet buffers are twice the data).
    fn port_endpoints(
        &self,
        o: &ExecOp,
        i: usize,
        off: u64,
        packets: bool,
    ) -> (u32, u64, u32, u64) {
        let k = if packets { 2 } else { 1 };
        let slot = (o.output_refs[i] & !REF_REMOTE) as usize;
        let dst_scratch = o.output_types[i] == 2;
        let dst_half = if self.even() {
            u64::from(self.block.port_buffer_halves[slot])
        } else {
            0
        };
        let j = if (i as u8) < o.n_inputs { i } else { 0 };
        let src_ty = o.input_refs[j];
        let src_half = if src_ty == 2 && self.even() {
            self.l.scratch_half
        } else {
            0
        };
        (
            self.block.port_buffers[slot],
            k * u64::from(o.output_offsets[i]) + dst_half + self.it(dst_scratch, off),
            u32::from(src_ty),
            k * u64::from(o.input_offsets[j]) + src_half + self.it(src_ty == 2, off),
        )
    }

    /// re / res / rre / rres: `dst[0] = op(src...)`, then the result to the remote outputs.
    ///
    /// # Safety
    /// See [`run`].
    pub(super) unsafe fn reduce(&self, o: &ExecOp, off: u64, unit: u64) -> Result<()> {
        let size = u64::from(o.input_sizes[0]).saturating_sub(off).min(unit);
        let es = self.l.dtype.size_in_bytes() as u64;
        if size == 0 {
            return Ok(());
        }
        if !size.is_multiple_of(es) {
            return Err(Error::Executor(format!(
                "reduce of {size} bytes: not a whole number of {} elements",
                self.l.dtype
            )));
        }
        let (b, e) = self.share(size / es);
        if e <= b {
            return Ok(());
        }
        let at = |r: u8, ty: u8, o_: u32| -> *mut u8 {
            let l = self.loc(r, ty);
            // SAFETY: the chunk range is inside its buffer (validated and lowered).
            unsafe {
                l.base
                    .add((u64::from(o_) + self.it(l.scratch, off) + b * es) as usize)
            }
        };
        let inputs: Vec<*const u8> = (0..o.n_inputs as usize)
            .map(|i| at(o.input_refs[i], o.input_types[i], o.input_offsets[i]).cast_const())
            .collect();
        let dst = at(o.output_refs[0], o.output_types[0], o.output_offsets[0]);
        let bytes = ((e - b) * es) as usize;
        let op = PlanReduceOp::from_code(o.reduce_op);
        // SAFETY: every range holds `bytes` from this thread's start.
        unsafe { reduce::reduce(self.l.dtype, op, dst, &inputs, bytes) };
        for i in 1..o.n_outputs as usize {
            let r = at(o.output_refs[i], o.output_types[i], o.output_offsets[i]);
            // SAFETY: as above; this thread wrote dst's range itself.
            unsafe { std::ptr::copy_nonoverlapping(dst, r, bytes) };
        }
        Ok(())
    }

    /// The packet at `index` of the packet buffer that chunk offset `off` of a buffer maps to.
    fn pkt<P: HostPacket>(base: *mut u8, off: u32, index: u64) -> *mut P {
        // SAFETY: callers pass ranges inside the (doubled) packet buffer.
        unsafe { base.add(2 * off as usize).cast::<P>().add(index as usize) }
    }

    fn read<P: HostPacket>(&self, p: *const P, out: *mut u32) -> Result<()> {
        let flag = self.flag;
        // SAFETY: p is a live packet slot, out holds PAYLOAD_BYTES.
        self.spin(P::NAME, || unsafe { P::read_once(p, flag, out) })
    }

    /// ppkt / rppkt / cpkt / upkt.
    ///
    /// # Safety
    /// See [`run`].
    pub(super) unsafe fn move_packets<P: HostPacket>(&self, o: &ExecOp) -> Result<()> {
        let pay = P::PAYLOAD_BYTES as u64;
        let size = u64::from(o.input_sizes[0]);
        if !size.is_multiple_of(pay) {
            return Err(Error::Executor(format!(
                "{} packets: {size} bytes is not a multiple of the {pay}-byte payload",
                P::NAME
            )));
        }
        let n = size / pay;
        let src = self.local(o.input_refs[0]).base;
        match o.op_type {
            op::PUT_PACKETS if o.channel_type == CHANNEL_PORT => {
                for i in self.mine(o.n_outputs as usize) {
                    let (dst, dst_off, sid, src_off) = self.port_endpoints(o, i, 0, true);
                    let sz = 2 * u64::from(o.input_sizes[i]);
                    let ch = &self.block.port_channels[o.channels[i] as usize];
                    // SAFETY: live port channel.
                    unsafe { ch.put(dst, dst_off, sid, src_off, sz, self.l.timeout)? };
                }
            }
            op::PUT_PACKETS => {
                for i in 0..o.n_outputs as usize {
                    let d = self.loc(o.output_refs[i], o.output_types[i]).base;
                    let s = self.local(o.input_refs[i]).base;
                    // SAFETY: validated ranges; the destination is a doubled packet range.
                    unsafe {
                        packet::copy_to_packets::<P>(
                            Self::pkt::<P>(d, o.output_offsets[i], 0),
                            s.add(o.input_offsets[i] as usize),
                            u64::from(o.input_sizes[i]),
                            self.tid,
                            self.n,
                            self.flag,
                        )?
                    };
                }
            }
            op::COPY_PACKETS => {
                let d = self.local(o.output_refs[0]).base;
                // SAFETY: as above.
                unsafe {
                    packet::copy_to_packets::<P>(
                        Self::pkt::<P>(d, o.output_offsets[0], 0),
                        src.add(o.input_offsets[0] as usize),
                        size,
                        self.tid,
                        self.n,
                        self.flag,
                    )?
                };
            }
            op::UNPACK_PACKETS => {
                let d = self.local(o.output_refs[0]).base;
                for idx in self.mine(n as usize) {
                    let p = Self::pkt::<P>(src, o.input_offsets[0], idx as u64);
                    // SAFETY: a payload slot inside the destination chunk.
                    let out = unsafe {
                        d.add(o.output_offsets[0] as usize + idx * P::PAYLOAD_BYTES)
                            .cast::<u32>()
                    };
                    self.read(p, out)?;
                }
            }
            _ => {
                // READ_PUT_PACKETS: forward packets of the local scratch as they arrive.
                let mut buf = [0u32; 2];
                for idx in self.mine(n as usize) {
                    let p = Self::pkt::<P>(src, o.input_offsets[0], idx as u64);
                    self.read(p, buf.as_mut_ptr())?;
                    if o.channel_type == CHANNEL_MEMORY {
                        for j in 0..o.n_outputs as usize {
                            let d = self.loc(o.output_refs[j], o.output_types[j]).base;
                            let q = Self::pkt::<P>(d, o.output_offsets[j], idx as u64);
                            // SAFETY: a packet slot of the peer's buffer.
                            unsafe { P::write(q, buf.as_ptr(), self.flag) };
                        }
                    }
                }
                if o.channel_type == CHANNEL_PORT {
                    self.sync()?;
                    for i in self.mine(o.n_outputs as usize) {
                        let (dst, dst_off, sid, src_off) = self.port_endpoints(o, i, 0, true);
                        let ch = &self.block.port_channels[o.channels[i] as usize];
                        // SAFETY: live port channel.
                        unsafe { ch.put(dst, dst_off, sid, src_off, 2 * size, self.l.timeout)? };
                    }
                }
            }
        }
        Ok(())
    }

    /// repkt / respkt / recpkt / recspkt: reduce the local chunk with packets of the local
    /// scratch, store the result, and (copy) write it as packets locally / (send) to peers.
    ///
    /// # Safety
    /// See [`run`].
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
                let p = Self::pkt::<P>(
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
                let q = Self::pkt::<P>(d, o.output_offsets[1], idx as u64);
                // SAFETY: a packet slot of a local packet buffer.
                unsafe { P::write(q, acc.as_ptr(), self.flag) };
            }
            if sends {
                for j in first_remote..o.n_outputs as usize {
                    let d = self.loc(o.output_refs[j], o.output_types[j]).base;
                    let q = Self::pkt::<P>(d, o.output_offsets[j], idx as u64);
                    // SAFETY: a packet slot of the peer's buffer.
                    unsafe { P::write(q, acc.as_ptr(), self.flag) };
                }
            }
        }
        Ok(())
    }
}

impl PlanReduceOp {
    /// From `ExecOp.reduce_op`.
    pub(crate) fn from_code(c: u8) -> PlanReduceOp {
        match c {
            1 => PlanReduceOp::Min,
            2 => PlanReduceOp::Max,
            _ => PlanReduceOp::Sum,
        }
    }
}
