//! The shape of every operation as a table: per operation name, the channel types it goes
//! through, how many channels it names, how many chunks each side takes and of which kind
//! (position by position), how chunk sizes relate, and the extra fields it needs. [`check`]
//! holds an operation against its row.

use crate::executor::error::{OpLocation, PlanError};
use crate::executor::json::{BufferType, ChannelType, GpuJson, OpJson, OpName, PlanReduceOp};
use crate::executor::limits::{MAX_BARRIERS, MAX_SEMAPHORES_PER_OP};
use crate::executor::model::{BufRef, Chunk, Op};

type R<T> = Result<T, PlanError>;

/// What an operation of one name needs.
#[derive(Clone, Copy)]
struct Shape {
    /// The channel types it may go through (`channel_type`; absent counts as none); `None`:
    /// any (the operation does not communicate through its channel type).
    channel_types: Option<&'static [ChannelType]>,
    /// How many `channel_ids` it names.
    channels: Channels,
    /// `src_buff`.
    src: Side,
    /// `dst_buff`.
    dst: Side,
    /// How the chunk ranges' sizes relate.
    sizes: Sizes,
    /// NVLS operations: only `reduce_op` sum.
    sum_only: bool,
    /// The fields besides chunks and channels it needs.
    fields: Fields,
    /// Whether it moves LL packets (none may sit in a pipeline).
    packets: bool,
}

#[derive(Clone, Copy)]
enum Channels {
    /// Any number (range-checked only).
    Any,
    /// None at all.
    Zero,
    /// At least one.
    AtLeastOne,
    /// Through port channels: exactly one per destination chunk.
    OnePerDstOnPort,
}

/// How many chunks one side takes, and the kind of each: `head` for the first positions,
/// `rest` for the others.
#[derive(Clone, Copy)]
struct Side {
    count: Count,
    head: &'static [Kind],
    rest: Kind,
}

#[derive(Clone, Copy)]
enum Count {
    Any,
    Exactly(usize),
    AtLeast(usize),
    /// As many as `src_buff` has (destinations of a put or get).
    SameAsSrc,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Any,
    /// A local buffer (`type`).
    Local,
    /// A local scratch chunk (`type` s): packets arrive there.
    Scratch,
    /// A peer's buffer (`buffer_id`).
    Remote,
    /// A switch channel (`switch_channel_id`).
    Switch,
}

#[derive(Clone, Copy)]
enum Sizes {
    Any,
    /// `src_buff[i]` and `dst_buff[i]` are the same size.
    Pairwise,
    /// Every chunk range of the op is the same size.
    Equal,
}

#[derive(Clone, Copy)]
enum Fields {
    None,
    /// `barrier_id` and `num_threadblocks`.
    Barrier,
    /// `semaphore_ids`.
    Semaphores,
}

const ANY: Side = Side {
    count: Count::Any,
    head: &[],
    rest: Kind::Any,
};
const NONE: Side = Side {
    count: Count::Exactly(0),
    head: &[],
    rest: Kind::Any,
};

const fn side(count: Count, head: &'static [Kind], rest: Kind) -> Side {
    Side { count, head, rest }
}

/// A row that asks for nothing.
const FREE: Shape = Shape {
    channel_types: None,
    channels: Channels::Any,
    src: ANY,
    dst: ANY,
    sizes: Sizes::Any,
    sum_only: false,
    fields: Fields::None,
    packets: false,
};

const MEMORY: &[ChannelType] = &[ChannelType::Memory];
const PORT: &[ChannelType] = &[ChannelType::Port];
const MEMORY_PORT: &[ChannelType] = &[ChannelType::Memory, ChannelType::Port];
const SWITCH: &[ChannelType] = &[ChannelType::Switch, ChannelType::None];

/// The table.
fn shape(name: OpName) -> Shape {
    use Count::{AtLeast, Exactly, SameAsSrc};
    use Kind::{Local, Remote, Scratch, Switch};
    use OpName::*;
    // Put family: local chunks to as many remote ones, pairwise.
    let put = |types: &'static [ChannelType]| Shape {
        channel_types: Some(types),
        channels: Channels::OnePerDstOnPort,
        src: side(AtLeast(1), &[], Local),
        dst: side(SameAsSrc, &[], Remote),
        sizes: Sizes::Pairwise,
        ..FREE
    };
    // Reductions: `dst` is local chunks then, when sending, remote ones; all one size.
    let reduce = |types, src: Side, locals: &'static [Kind], sends: bool| Shape {
        channel_types: types,
        src,
        dst: if sends {
            side(AtLeast(locals.len() + 1), locals, Remote)
        } else {
            side(Exactly(locals.len()), locals, Local)
        },
        sizes: Sizes::Equal,
        ..FREE
    };
    let local_src = side(AtLeast(1), &[], Local);
    let read_src = side(AtLeast(2), &[Local], Remote);
    let packet_src = side(AtLeast(1), &[Local], Scratch);
    let nvls = |src: Kind, dst: Kind| Shape {
        channel_types: Some(SWITCH),
        src: side(Exactly(1), &[], src),
        dst: side(Exactly(1), &[], dst),
        sizes: Sizes::Pairwise,
        sum_only: true,
        ..FREE
    };
    let sync = |types| Shape {
        channel_types: Some(types),
        channels: Channels::AtLeastOne,
        ..FREE
    };
    let packets = |s: Shape| Shape { packets: true, ..s };
    match name {
        Nop => FREE,
        Barrier => Shape {
            fields: Fields::Barrier,
            ..FREE
        },
        Signal | Wait | Rlxsignal | Rlxwait => sync(MEMORY_PORT),
        Flush => sync(PORT),
        Put => put(MEMORY_PORT),
        Pws | Pwsf => put(PORT),
        Ppkt => packets(put(MEMORY_PORT)),
        Get => Shape {
            channel_types: Some(MEMORY),
            src: side(AtLeast(1), &[], Remote),
            dst: side(SameAsSrc, &[], Local),
            sizes: Sizes::Pairwise,
            ..FREE
        },
        Copy => Shape {
            src: side(Exactly(1), &[], Local),
            dst: side(Exactly(1), &[], Local),
            sizes: Sizes::Equal,
            ..FREE
        },
        Cpkt => packets(shape(Copy)),
        Upkt => packets(Shape {
            src: side(Exactly(1), &[], Scratch),
            dst: side(Exactly(1), &[], Local),
            sizes: Sizes::Equal,
            ..FREE
        }),
        Re => reduce(None, local_src, &[Local], false),
        Res => reduce(Some(MEMORY), local_src, &[Local], true),
        Rre => reduce(Some(MEMORY), read_src, &[Local], false),
        Rres => reduce(Some(MEMORY), read_src, &[Local], true),
        Repkt => packets(reduce(None, packet_src, &[Local], false)),
        Respkt => packets(reduce(Some(MEMORY), packet_src, &[Local], true)),
        Recpkt => packets(reduce(None, packet_src, &[Local, Local], false)),
        Recspkt => packets(reduce(Some(MEMORY), packet_src, &[Local, Local], true)),
        Rppkt => packets(Shape {
            channel_types: Some(MEMORY_PORT),
            channels: Channels::OnePerDstOnPort,
            src: side(Exactly(1), &[], Scratch),
            dst: side(AtLeast(1), &[], Remote),
            sizes: Sizes::Equal,
            ..FREE
        }),
        SemAcquire | SemRelease => Shape {
            fields: Fields::Semaphores,
            ..FREE
        },
        Pipeline => Shape {
            channels: Channels::Zero,
            src: NONE,
            dst: NONE,
            ..FREE
        },
        // glre reads the switch and writes a local chunk, gstore the reverse, glres both
        // through switch channels (NVLS sums).
        Glre => nvls(Switch, Local),
        Glres => nvls(Switch, Switch),
        Gstore => nvls(Local, Switch),
        Gstorepkt => packets(nvls(Local, Switch)),
    }
}

/// Whether `name` moves LL packets.
pub(super) fn is_packet(name: OpName) -> bool {
    shape(name).packets
}

/// Holds the resolved operation `o` (from `op`, at `at`, of a rank described by `gpu`)
/// against its row of the table, and fills the fields only some operations have (barrier,
/// semaphores).
pub(super) fn check(gpu: &GpuJson, op: &OpJson, o: &mut Op, at: OpLocation) -> R<()> {
    let s = shape(o.name);
    if let Some(allowed) = s.channel_types {
        if !allowed.contains(&o.channel_type) {
            let list: Vec<&str> = allowed.iter().map(|t| t.name()).collect();
            return Err(at.shape(
                "channel_type",
                format!("channel_type {}", list.join(" or ")),
                Some(o.channel_type.name().into()),
            ));
        }
    }
    check_count(at, "src_buff", &s.src, o.src.len(), o.src.len())?;
    check_count(at, "dst_buff", &s.dst, o.dst.len(), o.src.len())?;
    check_kinds(at, "src_buff", &s.src, &o.src)?;
    check_kinds(at, "dst_buff", &s.dst, &o.dst)?;
    check_sizes(at, s.sizes, o)?;
    check_channels(at, s.channels, o)?;
    if s.sum_only && o.reduce != PlanReduceOp::Sum {
        return Err(at.shape(
            "reduce_op",
            "reduce_op sum (NVLS reduces with sum only)",
            Some(o.reduce.name().into()),
        ));
    }
    match s.fields {
        Fields::None => Ok(()),
        Fields::Barrier => barrier(gpu, op, o, at),
        Fields::Semaphores => semaphores(gpu, op, o, at),
    }
}

fn check_count(at: OpLocation, field: &str, side: &Side, got: usize, srcs: usize) -> R<()> {
    let (lo, hi) = match side.count {
        Count::Any => return Ok(()),
        Count::Exactly(n) => (n, n),
        Count::AtLeast(n) => (n, usize::MAX),
        Count::SameAsSrc => (srcs, srcs),
    };
    if (lo..=hi).contains(&got) {
        return Ok(());
    }
    let want = if lo == hi {
        format!("{lo}")
    } else {
        format!("at least {lo}")
    };
    Err(at.shape(field, format!("{want} chunks"), Some(got.to_string())))
}

fn check_kinds(at: OpLocation, field: &str, side: &Side, chunks: &[Chunk]) -> R<()> {
    for (i, c) in chunks.iter().enumerate() {
        let want = side.head.get(i).copied().unwrap_or(side.rest);
        let ok = match want {
            Kind::Any => true,
            Kind::Local => matches!(c.buf, BufRef::Local(_)),
            Kind::Scratch => c.buf == BufRef::Local(BufferType::Scratch),
            Kind::Remote => matches!(c.buf, BufRef::Remote { .. }),
            Kind::Switch => matches!(c.buf, BufRef::Switch { .. }),
        };
        if !ok {
            let expected = match want {
                Kind::Any | Kind::Local => "a local chunk (type i, o or s)",
                Kind::Scratch => {
                    "a chunk of the local scratch buffer (type s: packets arrive there)"
                }
                Kind::Remote => "a remote chunk (buffer_id)",
                Kind::Switch => "a switch_channel_id chunk",
            };
            let got = match c.buf {
                BufRef::Local(t) => format!("a local chunk of type {}", t.name()),
                BufRef::Remote { .. } => "a remote chunk".into(),
                BufRef::Switch { .. } => "a switch channel chunk".into(),
            };
            return Err(at.shape(format!("{field}[{i}]"), expected, Some(got)));
        }
    }
    Ok(())
}

fn check_sizes(at: OpLocation, sizes: Sizes, o: &Op) -> R<()> {
    match sizes {
        Sizes::Any => {}
        Sizes::Pairwise => {
            for (i, (s, d)) in o.src.iter().zip(&o.dst).enumerate() {
                if s.size != d.size {
                    return Err(at.shape(
                        format!("dst_buff[{i}].size"),
                        format!("{} chunks (the size of src_buff[{i}])", s.size),
                        Some(d.size.to_string()),
                    ));
                }
            }
        }
        Sizes::Equal => {
            let first = o.src.first().or(o.dst.first()).map(|c| c.size);
            for (field, side) in [("src_buff", &o.src), ("dst_buff", &o.dst)] {
                for (i, c) in side.iter().enumerate() {
                    if Some(c.size) != first {
                        return Err(at.shape(
                            format!("{field}[{i}].size"),
                            format!(
                                "every chunk range of one size ({})",
                                first.unwrap_or_default()
                            ),
                            Some(c.size.to_string()),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

fn check_channels(at: OpLocation, channels: Channels, o: &Op) -> R<()> {
    let n = o.channels.len();
    let bad = |expected: String| Err(at.shape("channel_ids", expected, Some(n.to_string())));
    match channels {
        Channels::Any => Ok(()),
        Channels::Zero if n > 0 => bad("no channels of its own".into()),
        Channels::AtLeastOne if n == 0 => {
            Err(at.shape("channel_ids", "at least one channel", Some("none".into())))
        }
        Channels::OnePerDstOnPort if o.channel_type == ChannelType::Port && n != o.dst.len() => {
            bad(format!(
                "one port channel per destination chunk ({})",
                o.dst.len()
            ))
        }
        _ => Ok(()),
    }
}

/// `barrier_id` (below [`MAX_BARRIERS`]) and `num_threadblocks` (1..= the rank's blocks).
fn barrier(gpu: &GpuJson, op: &OpJson, o: &mut Op, at: OpLocation) -> R<()> {
    let id = op
        .barrier_id
        .ok_or_else(|| at.err("barrier_id", "missing for a barrier"))?;
    let n = op
        .num_threadblocks
        .ok_or_else(|| at.err("num_threadblocks", "missing for a barrier"))?;
    if id as usize >= MAX_BARRIERS {
        return Err(at.err(
            "barrier_id",
            format!("expected a barrier id below {MAX_BARRIERS}, got {id}"),
        ));
    }
    let tbs = gpu.threadblocks.len() as u32;
    if n == 0 || n > tbs {
        return Err(at.err(
            "num_threadblocks",
            format!("expected 1..={tbs} (the rank's thread blocks), got {n}"),
        ));
    }
    o.barrier = Some((id, n));
    Ok(())
}

/// `semaphore_ids`: 1..=[`MAX_SEMAPHORES_PER_OP`] ids of the rank's semaphores.
fn semaphores(gpu: &GpuJson, op: &OpJson, o: &mut Op, at: OpLocation) -> R<()> {
    let ids = op
        .semaphore_ids
        .as_deref()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| at.shape("semaphore_ids", "at least one id", None))?;
    if ids.len() > MAX_SEMAPHORES_PER_OP {
        return Err(at.err(
            "semaphore_ids",
            format!(
                "expected at most {MAX_SEMAPHORES_PER_OP} ids, got {}",
                ids.len()
            ),
        ));
    }
    let n = gpu.semaphores.len();
    if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id >= n) {
        return Err(at.err(
            format!("semaphore_ids[{i}]"),
            format!("expected a semaphore id below {n} (the rank's semaphores), got {id}"),
        ));
    }
    o.semaphores = ids.to_vec();
    Ok(())
}
