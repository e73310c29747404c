//! Chunk geometry for one message size, as upstream's executor computes it: a chunk is
//! `size / chunks` bytes of the rank's input (or output), split evenly in `buffer_alignment`
//! units; thread-block groups split a chunk range again; pipelines step through
//! `num_chunks` chunks `unit_size` bytes at a time; scratch size follows from the chunk size.

use super::error::LowerError;
use crate::executor::json::{BufferType, Protocol};
use crate::executor::limits::REUSE_SCRATCH_BYTES;
use crate::executor::model::{Chunk, PlanMeta, RankPlan};

type R<T> = std::result::Result<T, LowerError>;

/// Chunk offsets and sizes for one (input size, output size).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// Bytes the chunk grid divides and into how many chunks.
    base_size: u64,
    base_chunks: u64,
    align: u64,
    /// `reuse_resources`: scratch chunks are this long (0 = not reused).
    reuse_scratch_chunk: u64,
    /// Whether scratch may be reused at some message size (`reuse_resources` and scratch
    /// chunks), whatever this size does.
    scratch_may_wrap: bool,
}

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl Layout {
    /// Checks the sizes against the plan (alignment, divisibility by the chunk counts, the
    /// plan's size range) and builds the geometry.
    pub(crate) fn new(meta: &PlanMeta, rp: &RankPlan, input: u64, output: u64) -> R<Layout> {
        let a = u64::from(meta.buffer_alignment);
        let (ic, oc) = (u64::from(rp.input_chunks), u64::from(rp.output_chunks));
        for (what, size, chunks) in [("input", input, ic), ("output", output, oc)] {
            if chunks == 0 {
                continue;
            }
            if !size.is_multiple_of(a) || !(size / a).is_multiple_of(chunks) {
                return Err(LowerError::Unaligned {
                    what,
                    size,
                    alignment: a,
                    chunks,
                });
            }
        }
        let size = if meta.collective == "allgather" {
            output
        } else {
            input
        };
        if size < meta.min_message_size || size > meta.max_message_size {
            return Err(LowerError::OutOfRange {
                size,
                min: meta.min_message_size,
                max: meta.max_message_size,
            });
        }
        let (base_size, base_chunks) = if ic != 0 && oc != 0 {
            if input / ic != output / oc {
                return Err(LowerError::ChunksDisagree {
                    input,
                    input_chunks: ic,
                    output,
                    output_chunks: oc,
                });
            }
            (input, ic)
        } else if ic != 0 {
            (input, ic)
        } else {
            (output, oc)
        };
        let mut l = Layout {
            base_size,
            base_chunks,
            align: a,
            reuse_scratch_chunk: 0,
            scratch_may_wrap: meta.reuse_resources && rp.scratch_chunks > 0,
        };
        if l.scratch_may_wrap {
            let sc = max_scratch_chunk(meta, rp, REUSE_SCRATCH_BYTES as u64);
            if sc < base_size.div_ceil(base_chunks) {
                l.reuse_scratch_chunk = sc;
            }
        }
        Ok(l)
    }

    fn calc_offset(&self, size: u64, index: u64, slices: u64) -> u64 {
        let n = size / self.align;
        let (min, rem) = (n / slices, n % slices);
        (index * min + index.min(rem)) * self.align
    }

    fn offset(&self, index: u32, ty: Option<BufferType>) -> u64 {
        if ty == Some(BufferType::Scratch) && self.reuse_scratch_chunk > 0 {
            return u64::from(index) * self.reuse_scratch_chunk;
        }
        self.calc_offset(self.base_size, u64::from(index), self.base_chunks)
    }

    /// Byte (offset, size) of `c` for block `tb_id` of a group of `tbg_size`.
    pub(crate) fn chunk(&self, c: &Chunk, (tb_id, tbg_size): (u32, u32)) -> (u64, u64) {
        let off = self.offset(c.index, c.buf.buffer_type());
        let size = self.offset(c.index + c.size, None) - self.offset(c.index, None);
        let (t, g) = (u64::from(tb_id), u64::from(tbg_size));
        let sub = self.calc_offset(size, t, g);
        (off + sub, self.calc_offset(size, t + 1, g) - sub)
    }

    /// The largest chunk (pipelines iterate over `num_chunks` of these).
    pub(crate) fn upper_chunk(&self) -> u64 {
        (self.base_size / self.align).div_ceil(self.base_chunks) * self.align
    }

    /// Scratch chunk length when scratch is reused modulo a fixed size (0 = not reused).
    pub(crate) fn reuse_scratch_chunk(&self) -> u64 {
        self.reuse_scratch_chunk
    }

    /// Whether the plan's scratch is reused modulo a fixed size at some message size (the
    /// same for every size of the plan, unlike [`Layout::reuse_scratch_chunk`]).
    pub(crate) fn scratch_may_wrap(&self) -> bool {
        self.scratch_may_wrap
    }
}

fn max_scratch_chunk(meta: &PlanMeta, rp: &RankPlan, mut scratch: u64) -> u64 {
    if rp.scratch_chunks == 0 {
        return 0;
    }
    if meta.double_scratch {
        scratch /= 2;
    }
    let a = u64::from(meta.buffer_alignment);
    round_up(scratch.div_ceil(u64::from(rp.scratch_chunks)), a)
}

/// Scratch bytes a (plan, input size, output size) needs (at least 16, so there is always an
/// allocation to register).
pub(crate) fn scratch_bytes(meta: &PlanMeta, rp: &RankPlan, input: u64, output: u64) -> u64 {
    if meta.reuse_resources && rp.scratch_chunks > 0 {
        return REUSE_SCRATCH_BYTES as u64;
    }
    let (input, output) = (
        input.min(meta.max_message_size),
        output.min(meta.max_message_size),
    );
    let per_chunk = if rp.input_chunks != 0 {
        input.div_ceil(u64::from(rp.input_chunks))
    } else {
        output.div_ceil(u64::from(rp.output_chunks.max(1)))
    };
    let mut size = per_chunk * u64::from(rp.scratch_chunks);
    if meta.protocol == Protocol::Ll {
        size *= 2;
    }
    if meta.double_scratch {
        size *= 2;
    }
    round_up(size, u64::from(meta.buffer_alignment)).max(16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::model::BufRef;

    fn meta() -> PlanMeta {
        PlanMeta {
            name: "t".into(),
            collective: "allreduce".into(),
            protocol: Protocol::Simple,
            inplace: true,
            reuse_resources: false,
            num_threads_per_block: 1024,
            double_scratch: false,
            buffer_alignment: 16,
            min_message_size: 0,
            max_message_size: u64::MAX,
            nranks_per_node: None,
        }
    }

    fn rank(i: u32, o: u32, s: u32) -> RankPlan {
        RankPlan {
            input_chunks: i,
            output_chunks: o,
            scratch_chunks: s,
            ..Default::default()
        }
    }

    #[test]
    fn chunks_and_groups() {
        let (m, rp) = (meta(), rank(4, 4, 4));
        let l = Layout::new(&m, &rp, 4096, 4096).expect("aligned sizes");
        let c = Chunk {
            buf: BufRef::Local(BufferType::Input),
            index: 1,
            size: 2,
        };
        assert_eq!(l.chunk(&c, (0, 1)), (1024, 2048));
        // A group of 3 splits 2048 bytes = 128 units into 43, 43, 42.
        assert_eq!(l.chunk(&c, (0, 3)), (1024, 43 * 16));
        assert_eq!(l.chunk(&c, (2, 3)), (1024 + 86 * 16, 42 * 16));
        assert_eq!(l.upper_chunk(), 1024);
        let e = Layout::new(&m, &rp, 4000, 4000).expect_err("not aligned");
        assert!(
            matches!(e, LowerError::Unaligned { what: "input", .. }),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "input size 4000 bytes: expected a multiple of buffer_alignment 16 x input_chunks 4 = 64 bytes"
        );
        let e = Layout::new(&m, &rp, 4096, 2048).expect_err("chunk sizes differ");
        assert!(matches!(e, LowerError::ChunksDisagree { .. }), "{e:?}");
    }

    #[test]
    fn scratch_sizes() {
        let (mut m, rp) = (meta(), rank(2, 2, 6));
        assert_eq!(scratch_bytes(&m, &rp, 2048, 2048), 6 * 1024);
        m.protocol = Protocol::Ll;
        m.double_scratch = true;
        assert_eq!(scratch_bytes(&m, &rp, 2048, 2048), 4 * 6 * 1024);
        m.min_message_size = 4096;
        let e = Layout::new(&m, &rp, 2048, 2048).expect_err("below the range");
        assert!(
            matches!(e, LowerError::OutOfRange { size: 2048, .. }),
            "{e:?}"
        );
    }
}
