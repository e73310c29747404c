//! Cooperative copy on the host backend (`copy_device.hpp`'s `copy`): all `num_threads`
//! threads call it with the same arguments; thread `thread_id` copies one contiguous share.
//! No ordering with later signals is implied: the threads synchronize before one signals.

use crate::error::{Error, Result};

/// Copies `bytes` from `src` to `dst`, this thread's share of `num_threads`.
///
/// # Safety
/// `dst` writable and `src` readable for `bytes`, not overlapping; other threads only touch
/// their own shares meanwhile.
pub unsafe fn copy(
    dst: *mut u8,
    src: *const u8,
    bytes: u64,
    thread_id: u32,
    num_threads: u32,
) -> Result<()> {
    if !bytes.is_multiple_of(4)
        || !(dst as usize).is_multiple_of(4)
        || !(src as usize).is_multiple_of(4)
        || num_threads == 0
        || thread_id >= num_threads
    {
        return Err(Error::invalid(format!(
            "copy: expected 4-byte aligned pointers, bytes a multiple of 4 and thread_id < num_threads; got dst {dst:p}, src {src:p}, bytes {bytes}, thread {thread_id}/{num_threads}"
        )));
    }
    let words = bytes / 4;
    let per = words.div_ceil(u64::from(num_threads));
    let begin = (per * u64::from(thread_id)).min(words);
    let end = (begin + per).min(words);
    if end > begin {
        let (off, len) = ((begin * 4) as usize, ((end - begin) * 4) as usize);
        // SAFETY: off + len <= bytes; the caller guarantees both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_everything() {
        let src: Vec<u32> = (0..1001).collect();
        for threads in [1u32, 3, 7, 2000] {
            let mut dst = vec![0u32; 1001];
            for t in 0..threads {
                // SAFETY: both vectors hold 1001 words.
                unsafe {
                    copy(
                        dst.as_mut_ptr().cast(),
                        src.as_ptr().cast(),
                        4004,
                        t,
                        threads,
                    )
                }
                .expect("valid args");
            }
            assert_eq!(dst, src, "{threads} threads");
        }
        let mut d = [0u32; 2];
        // SAFETY: 6 bytes fit in both arrays; the call is refused anyway.
        assert!(unsafe { copy(d.as_mut_ptr().cast(), src.as_ptr().cast(), 6, 0, 1) }.is_err());
    }
}
