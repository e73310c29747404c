//! Switch channel device operations on the host backend (`switch_channel_device.hpp`): the
//! multimem load-reduce and store of NVLink SHARP, done by CPU threads over every member.
//!
//! A multicast address of the host emulation resolves (through
//! [`mscclpp_hal::host::multicast_members`]) into one pointer per device: that device's bound
//! memory at the same offset, mapped into this process from the member's memfd. A load-reduce
//! reads every member's copy and adds them up; a store writes every member's copy. Members are
//! visited in device order; f16/bf16 accumulate in f32 and round once (as `.acc::f32`; use data
//! that is exact in the type when comparing with a GPU), integers wrap. Nothing orders these
//! accesses with other ranks' work: as on the GPU, the ranks synchronise around them
//! (semaphores, barriers).
//!
//! Vectors are `Vector<E, N>` (`F32x4`, `F16x8`, `Bf16x8` are the 16-byte ones). All operations
//! are `unsafe`: the handle must come from a live [`crate::SwitchChannel`]; index ranges are
//! checked against its buffer size here (the GPU checks nothing).

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::switch_channel::SwitchChannelDeviceHandle;

/// An element type multimem operations reduce.
pub trait MultimemElem: Copy + Send + Sync + 'static {
    /// The accumulator.
    type Acc: Copy;
    /// The accumulator's zero.
    fn zero() -> Self::Acc;
    /// `acc + x`.
    fn add(acc: Self::Acc, x: Self) -> Self::Acc;
    /// The accumulator rounded back to the element type.
    fn finish(acc: Self::Acc) -> Self;
}

impl MultimemElem for f32 {
    type Acc = f32;
    fn zero() -> f32 {
        0.0
    }
    fn add(acc: f32, x: f32) -> f32 {
        acc + x
    }
    fn finish(acc: f32) -> f32 {
        acc
    }
}

impl MultimemElem for f16 {
    type Acc = f32;
    fn zero() -> f32 {
        0.0
    }
    fn add(acc: f32, x: f16) -> f32 {
        acc + x.to_f32()
    }
    fn finish(acc: f32) -> f16 {
        f16::from_f32(acc)
    }
}

impl MultimemElem for bf16 {
    type Acc = f32;
    fn zero() -> f32 {
        0.0
    }
    fn add(acc: f32, x: bf16) -> f32 {
        acc + x.to_f32()
    }
    fn finish(acc: f32) -> bf16 {
        bf16::from_f32(acc)
    }
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl MultimemElem for $t {
            type Acc = $t;
            fn zero() -> $t { 0 }
            fn add(acc: $t, x: $t) -> $t { acc.wrapping_add(x) }
            fn finish(acc: $t) -> $t { acc }
        }
    )*};
}
int_elem!(i32, u32);

/// `N` elements moved and reduced as one (the C header's `f32x4`, `f16x8`, ...).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Vector<E, const N: usize>(pub [E; N]);

/// 4 x f32 (16 bytes).
pub type F32x4 = Vector<f32, 4>;
/// 2 x f32.
pub type F32x2 = Vector<f32, 2>;
/// 1 x f32.
pub type F32x1 = Vector<f32, 1>;
/// 8 x f16 (16 bytes).
pub type F16x8 = Vector<f16, 8>;
/// 4 x f16.
pub type F16x4 = Vector<f16, 4>;
/// 2 x f16.
pub type F16x2 = Vector<f16, 2>;
/// 8 x bf16 (16 bytes).
pub type Bf16x8 = Vector<bf16, 8>;
/// 4 x bf16.
pub type Bf16x4 = Vector<bf16, 4>;
/// 2 x bf16.
pub type Bf16x2 = Vector<bf16, 2>;
/// 1 x i32.
pub type I32x1 = Vector<i32, 1>;
/// 1 x u32.
pub type U32x1 = Vector<u32, 1>;
/// 4 x u32 (16 bytes): raw 16-byte stores (packets) through [`multimem_store`] /
/// `broadcast_from`; as a load-reduce it adds lane by lane with wrap-around.
pub type U32x4 = Vector<u32, 4>;

/// A value multimem operations load, reduce and store as one.
pub trait MultimemVector: Copy + Send + Sync + 'static {
    /// The sum of `values` (lane by lane).
    fn sum(values: impl Iterator<Item = Self>) -> Self;
}

impl<E: MultimemElem, const N: usize> MultimemVector for Vector<E, N> {
    fn sum(values: impl Iterator<Item = Self>) -> Self {
        let mut acc = [E::zero(); N];
        for v in values {
            for (a, x) in acc.iter_mut().zip(v.0) {
                *a = E::add(*a, x);
            }
        }
        Vector(acc.map(E::finish))
    }
}

/// Every device's copy of `count` vectors at multicast address `mc`, one pointer per device.
fn members<V>(mc: u64, count: u64) -> Result<mscclpp_hal::host::MulticastMembers> {
    let bytes = count
        .checked_mul(std::mem::size_of::<V>() as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| Error::invalid(format!("multimem: {count} vectors overflow")))?;
    mscclpp_hal::host::multicast_members(mc, bytes).map_err(|e| Error::Hal {
        op: "multimem access on the host emulation".into(),
        source: e,
    })
}

/// `multimem.ld_reduce`: the sum of every device's copy of the vector at multicast address
/// `mc_addr`.
///
/// # Safety
/// `mc_addr` lies in a multicast mapping of a live [`crate::SwitchChannel`] of this process.
pub unsafe fn multimem_load_reduce<V: MultimemVector>(mc_addr: *const V) -> Result<V> {
    let m = members::<V>(mc_addr as usize as u64, 1)?;
    // SAFETY: each member pointer is valid for one V while `m` lives.
    Ok(V::sum(
        m.ptrs()
            .iter()
            .map(|p| unsafe { p.cast::<V>().read_unaligned() }),
    ))
}

/// `multimem.st`: writes `val` into every device's copy at multicast address `mc_addr`.
///
/// # Safety
/// As [`multimem_load_reduce`].
pub unsafe fn multimem_store<V: MultimemVector>(val: V, mc_addr: *mut V) -> Result<()> {
    let m = members::<V>(mc_addr as usize as u64, 1)?;
    for p in m.ptrs() {
        // SAFETY: each member pointer is valid for one V while `m` lives.
        unsafe { p.cast::<V>().write_unaligned(val) };
    }
    Ok(())
}

/// Thread `tid`'s contiguous share of `count` items among `n` threads: `[begin, end)`.
fn share(count: u64, tid: u32, n: u32) -> Result<(u64, u64)> {
    if n == 0 || tid >= n {
        return Err(Error::invalid(format!(
            "switch channel: expected thread_id < num_threads, got {tid} of {n}"
        )));
    }
    let per = count.div_ceil(u64::from(n));
    let begin = (per * u64::from(tid)).min(count);
    Ok((begin, (begin + per).min(count)))
}

impl SwitchChannelDeviceHandle {
    fn check<V>(&self, first: u64, count: u64) -> Result<()> {
        let end = first
            .checked_add(count)
            .and_then(|e| e.checked_mul(std::mem::size_of::<V>() as u64));
        match end {
            Some(e) if e <= self.buffer_size => Ok(()),
            _ => Err(Error::invalid(format!(
                "switch channel: vectors [{first}, {first} + {count}) of {} bytes exceed the \
                 {}-byte buffer",
                std::mem::size_of::<V>(),
                self.buffer_size
            ))),
        }
    }

    fn mc_at<V>(&self, index: u64) -> u64 {
        self.mc_ptr as usize as u64 + index * std::mem::size_of::<V>() as u64
    }

    /// This thread's share of vectors `[first, first + count)` (checked against the buffer):
    /// its first index `b` relative to `first`, its length and every rank's copy of it; `None`
    /// when the share is empty.
    fn my_share<V>(
        &self,
        first: u64,
        count: u64,
        thread_id: u32,
        num_threads: u32,
    ) -> Result<Option<(u64, usize, mscclpp_hal::host::MulticastMembers)>> {
        self.check::<V>(first, count)?;
        let (b, e) = share(count, thread_id, num_threads)?;
        if b == e {
            return Ok(None);
        }
        let m = members::<V>(self.mc_at::<V>(first + b), e - b)?;
        Ok(Some((b, (e - b) as usize, m)))
    }

    /// The sum over every rank's copy of vector `index` (`reduce<V>(index)` of the header).
    ///
    /// # Safety
    /// The handle comes from a live [`crate::SwitchChannel`].
    pub unsafe fn reduce<V: MultimemVector>(&self, index: u64) -> Result<V> {
        self.check::<V>(index, 1)?;
        // SAFETY: inside the channel's mapping (checked above).
        unsafe { multimem_load_reduce(self.mc_at::<V>(index) as usize as *const V) }
    }

    /// Writes `val` as vector `index` of every rank's copy (`broadcast<V>(index, val)`).
    ///
    /// # Safety
    /// As [`SwitchChannelDeviceHandle::reduce`].
    pub unsafe fn broadcast<V: MultimemVector>(&self, index: u64, val: V) -> Result<()> {
        self.check::<V>(index, 1)?;
        // SAFETY: inside the channel's mapping (checked above).
        unsafe { multimem_store(val, self.mc_at::<V>(index) as usize as *mut V) }
    }

    /// In place over every rank's copy: vectors `[first, first + count)` become their sum on
    /// every rank (load-reduce, then store), this thread's share of `num_threads`.
    ///
    /// # Safety
    /// As [`SwitchChannelDeviceHandle::reduce`]; the ranks' threads split the range between
    /// them (each vector reduced and stored by one thread of one rank).
    pub unsafe fn all_reduce<V: MultimemVector>(
        &self,
        first: u64,
        count: u64,
        thread_id: u32,
        num_threads: u32,
    ) -> Result<()> {
        let Some((_, n, m)) = self.my_share::<V>(first, count, thread_id, num_threads)? else {
            return Ok(());
        };
        for i in 0..n {
            // SAFETY: every member is valid for n vectors while `m` lives.
            let v = V::sum(
                m.ptrs()
                    .iter()
                    .map(|p| unsafe { p.cast::<V>().add(i).read_unaligned() }),
            );
            for p in m.ptrs() {
                // SAFETY: as above.
                unsafe { p.cast::<V>().add(i).write_unaligned(v) };
            }
        }
        Ok(())
    }

    /// `dst[k] = reduce(first + k)` for this thread's share of `k in 0..count`.
    ///
    /// # Safety
    /// As [`SwitchChannelDeviceHandle::reduce`]; `dst` is valid for `count` vectors of local
    /// memory no other thread writes in this share.
    pub unsafe fn reduce_to<V: MultimemVector>(
        &self,
        dst: *mut V,
        first: u64,
        count: u64,
        thread_id: u32,
        num_threads: u32,
    ) -> Result<()> {
        let Some((b, n, m)) = self.my_share::<V>(first, count, thread_id, num_threads)? else {
            return Ok(());
        };
        for i in 0..n {
            // SAFETY: members valid for n vectors; dst for count (the caller's promise).
            unsafe {
                let v = V::sum(
                    m.ptrs()
                        .iter()
                        .map(|p| p.cast::<V>().add(i).read_unaligned()),
                );
                dst.add(b as usize + i).write_unaligned(v);
            }
        }
        Ok(())
    }

    /// `broadcast(first + k, src[k])` for this thread's share of `k in 0..count`.
    ///
    /// # Safety
    /// As [`SwitchChannelDeviceHandle::reduce`]; `src` is valid for `count` vectors.
    pub unsafe fn broadcast_from<V: MultimemVector>(
        &self,
        src: *const V,
        first: u64,
        count: u64,
        thread_id: u32,
        num_threads: u32,
    ) -> Result<()> {
        let Some((b, n, m)) = self.my_share::<V>(first, count, thread_id, num_threads)? else {
            return Ok(());
        };
        for i in 0..n {
            // SAFETY: src valid for count vectors; members for n.
            unsafe {
                let v = src.add(b as usize + i).read_unaligned();
                for p in m.ptrs() {
                    p.cast::<V>().add(i).write_unaligned(v);
                }
            }
        }
        Ok(())
    }
}

impl SwitchChannelDeviceHandle {
    /// `dst`'s vector `first + k` on every rank = the sum over every rank of this channel's
    /// vector `first + k` (load-reduce here, store into the other channel), this thread's share.
    /// The zero-copy all-reduce: input channel to output channel; in place when both are one.
    ///
    /// # Safety
    /// Both handles come from live channels of the same group; as for
    /// [`SwitchChannelDeviceHandle::all_reduce`].
    pub unsafe fn reduce_store_to<V: MultimemVector>(
        &self,
        dst: &SwitchChannelDeviceHandle,
        first: u64,
        count: u64,
        thread_id: u32,
        num_threads: u32,
    ) -> Result<()> {
        self.check::<V>(first, count)?;
        dst.check::<V>(first, count)?;
        let (b, e) = share(count, thread_id, num_threads)?;
        if b == e {
            return Ok(());
        }
        let from = members::<V>(self.mc_at::<V>(first + b), e - b)?;
        let to = members::<V>(dst.mc_at::<V>(first + b), e - b)?;
        for i in 0..(e - b) as usize {
            // SAFETY: both member sets are valid for e - b vectors while they live.
            unsafe {
                let v = V::sum(
                    from.ptrs()
                        .iter()
                        .map(|p| p.cast::<V>().add(i).read_unaligned()),
                );
                for p in to.ptrs() {
                    p.cast::<V>().add(i).write_unaligned(v);
                }
            }
        }
        Ok(())
    }

    /// Stores `count` 8-byte words from local `src` into every rank's copy at byte offset
    /// `offset` of the buffer, each word with one relaxed 64-bit atomic store (as an LL packet
    /// half must land: data and flag together), this thread's share. The host form of storing
    /// LL16 packets through the multicast address.
    ///
    /// # Safety
    /// As [`SwitchChannelDeviceHandle::reduce`]; `src` is valid for `count` words; `offset` is a
    /// multiple of 8.
    pub unsafe fn broadcast_words(
        &self,
        src: *const u64,
        offset: u64,
        count: u64,
        thread_id: u32,
        num_threads: u32,
    ) -> Result<()> {
        if !offset.is_multiple_of(8) {
            return Err(Error::invalid(format!(
                "switch channel: broadcast_words at offset {offset}: expected a multiple of 8"
            )));
        }
        self.check::<u64>(offset / 8, count)?;
        let (b, e) = share(count, thread_id, num_threads)?;
        if b == e {
            return Ok(());
        }
        let m = members::<u64>(self.mc_ptr as usize as u64 + offset + b * 8, e - b)?;
        for i in 0..(e - b) as usize {
            // SAFETY: src valid for count words; members for e - b words, 8-byte aligned
            // (page-aligned bindings, offset a multiple of 8).
            unsafe {
                let w = src.add(b as usize + i).read_unaligned();
                for p in m.ptrs() {
                    std::sync::atomic::AtomicU64::from_ptr(p.cast::<u64>().add(i))
                        .store(w, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_shares() {
        let a = F32x4::sum([Vector([1.0, 2.0, 3.0, 4.0]), Vector([0.5; 4])].into_iter());
        assert_eq!(a, Vector([1.5, 2.5, 3.5, 4.5]));
        let h = F16x2::sum(
            [
                Vector([f16::from_f32(1.0), f16::from_f32(-2.0)]),
                Vector([f16::from_f32(3.0), f16::from_f32(0.25)]),
            ]
            .into_iter(),
        );
        assert_eq!(h.0.map(f16::to_f32), [4.0, -1.75]);
        let w = U32x1::sum([Vector([u32::MAX]), Vector([2])].into_iter());
        assert_eq!(w, Vector([1]), "integers wrap");
        let shares: Vec<_> = (0..3).map(|t| share(10, t, 3).expect("ok")).collect();
        assert_eq!(shares, vec![(0, 4), (4, 8), (8, 10)]);
        assert!(share(10, 3, 3).is_err());
        assert_eq!(std::mem::size_of::<F16x8>(), 16);
        assert_eq!(std::mem::size_of::<Bf16x8>(), 16);
    }

    #[test]
    fn out_of_range_and_unmapped_are_errors() {
        let h = SwitchChannelDeviceHandle {
            device_ptr: std::ptr::null_mut(),
            mc_ptr: 4096 as *mut std::ffi::c_void,
            buffer_size: 64,
        };
        // SAFETY: refused before any access (out of range, then no mapping at 4096).
        unsafe {
            assert!(
                h.reduce::<F32x4>(4).is_err(),
                "vector 4 ends at byte 80 > 64"
            );
            assert!(
                h.all_reduce::<F32x4>(0, 4, 0, 1).is_err(),
                "no mapping there"
            );
        }
    }
}
