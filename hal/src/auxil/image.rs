//! Code objects as the GPU drivers load them (`cuModuleLoadData`, `hipModuleLoadData`).

use crate::{Error, Result};

/// `code` copied into an 8-byte-aligned buffer with at least one zero byte after it (fatbins
/// and HIP code objects want the alignment, PTX the NUL); an empty `code` is an error of `op`.
pub(crate) fn aligned_code_image(op: &'static str, code: &[u8]) -> Result<Vec<u64>> {
    if code.is_empty() {
        return Err(Error::invalid(op, "code object bytes", "an empty slice"));
    }
    let mut aligned = vec![0u64; code.len() / 8 + 2];
    for (word, chunk) in aligned.iter_mut().zip(code.chunks(8)) {
        let mut bytes = [0u8; 8];
        bytes[..chunk.len()].copy_from_slice(chunk);
        // Native order: the buffer's bytes are `code`'s bytes, in order.
        *word = u64::from_ne_bytes(bytes);
    }
    Ok(aligned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_is_the_code_then_zeros() {
        let code: Vec<u8> = (1..=13).collect();
        let img = aligned_code_image("t", &code).unwrap();
        let bytes: Vec<u8> = img.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert!(bytes.len() >= code.len() + 8);
        assert_eq!(&bytes[..13], &code[..]);
        assert!(bytes[13..].iter().all(|&b| b == 0));
        assert!(aligned_code_image("t", &[]).is_err());
    }
}
