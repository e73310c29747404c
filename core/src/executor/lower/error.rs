//! [`LowerError`]: why a valid plan cannot run at one message size (sizes the chunking does
//! not divide, sizes outside the plan's range, offsets past the device form's 32 bits,
//! operations the device form has no code for). The executor turns it into the crate's error
//! with the plan's name in front.

use crate::executor::json::OpName;

/// Why a plan cannot be lowered for a message size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LowerError {
    /// The input or output size is not a multiple of `buffer_alignment` x its chunk count.
    #[error("{what} size {size} bytes: expected a multiple of buffer_alignment {alignment} x {what}_chunks {chunks} = {} bytes", .alignment * .chunks)]
    Unaligned {
        /// `input` or `output`.
        what: &'static str,
        size: u64,
        alignment: u64,
        chunks: u64,
    },
    /// The message size is outside the plan's `min_message_size..=max_message_size`.
    #[error("message size {size} bytes: outside the plan's range {min}..={max} bytes")]
    OutOfRange { size: u64, min: u64, max: u64 },
    /// Input and output chunks differ in size.
    #[error("chunk sizes disagree: input {input} bytes / {input_chunks} chunks != output {output} bytes / {output_chunks} chunks")]
    ChunksDisagree {
        input: u64,
        input_chunks: u64,
        output: u64,
        output_chunks: u64,
    },
    /// An operation the device form has no code for.
    #[error("operation {} (packets through a switch channel): not supported by this executor yet; expected glre, glres or gstore", .0.name())]
    Unsupported(OpName),
    /// A switch chunk that is not whole 16-byte vectors.
    #[error("switch channel chunk at byte {offset} of {size} bytes: switch operations move 16-byte vectors, expected a multiple of 16 (a buffer_alignment of 16 and sizes to match)")]
    SwitchMisaligned { offset: u64, size: u64 },
    /// A byte count past the device form's 32-bit offsets and sizes.
    #[error("{what} {value} bytes: the executor's offsets and sizes are 32-bit (below 4 GiB)")]
    Above32Bits { what: &'static str, value: u64 },
    /// One of the above in thread block `thread_block`.
    #[error("thread block {thread_block}: {source}")]
    InBlock {
        thread_block: usize,
        source: Box<LowerError>,
    },
}
