//! [`PlanError`]: what is wrong with an execution plan. Every variant says where (the JSON
//! path; for an operation its rank, thread block, index and name, [`OpLocation`]) and what was
//! expected. [`crate::executor::ExecutionPlan::from_json`] turns it into the crate's
//! [`crate::Error`] with the plan's source in front; [`crate::executor::ExecutionPlan::parse`]
//! returns it as it is.

use std::fmt;

use super::json::OpName;

/// Where an operation sits in a plan: `gpus[rank].threadblocks[thread_block].ops[op]`, and for
/// an operation inside a pipeline `gpus[..].threadblocks[..].ops[op].ops[inner]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpLocation {
    /// The rank (index into `gpus`).
    pub rank: usize,
    /// The thread block (index into the rank's `threadblocks`).
    pub thread_block: usize,
    /// Index into the thread block's `ops`.
    pub op: usize,
    /// Index into the pipeline's `ops`, for an operation inside a pipeline.
    pub inner: Option<usize>,
    /// The operation's name.
    pub name: OpName,
}

impl OpLocation {
    /// The same place, inside the pipeline at `self`: its `index`-th operation, `name`.
    pub(crate) fn inner(self, index: usize, name: OpName) -> OpLocation {
        OpLocation {
            inner: Some(index),
            name,
            ..self
        }
    }

    /// A [`PlanError::Op`] at `field` of this operation.
    pub(crate) fn err(self, field: impl Into<String>, message: impl Into<String>) -> PlanError {
        PlanError::Op {
            op: self,
            field: field.into(),
            message: message.into(),
        }
    }

    /// A [`PlanError::Shape`] at `field` of this operation.
    pub(crate) fn shape(
        self,
        field: impl Into<String>,
        expected: impl Into<String>,
        got: Option<String>,
    ) -> PlanError {
        PlanError::Shape {
            op: self,
            field: field.into(),
            expected: expected.into(),
            got,
        }
    }
}

impl fmt::Display for OpLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gpus[{}].threadblocks[{}].ops[{}]",
            self.rank, self.thread_block, self.op
        )?;
        if let Some(i) = self.inner {
            write!(f, ".ops[{i}]")?;
        }
        Ok(())
    }
}

/// What is wrong with a plan.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The text is not JSON of the plan format: a syntax error, a value of the wrong type, an
    /// unknown name or a missing required field.
    #[error("{}", at_path(.path, .message))]
    Json {
        /// The JSON path of the offending value (empty: the document, e.g. a syntax error).
        path: String,
        /// The parser's message (with the line and column of syntax errors).
        message: String,
    },
    /// A value outside the operations (top level, a gpu, its channels and remote buffers, a
    /// thread block's tables) is not what the format allows.
    #[error("{path}: {message}")]
    Field {
        /// The JSON path (`gpus[1].channels[0].connected_to[2]`).
        path: String,
        /// What came and what was expected.
        message: String,
    },
    /// A field of an operation is malformed or names something out of range.
    #[error("{}: {message}", op_field(.op, .field))]
    Op {
        /// The operation.
        op: OpLocation,
        /// The field, relative to the operation (`src_buff[0].buffer_id`; empty: the whole op).
        field: String,
        /// What came and what was expected.
        message: String,
    },
    /// An operation does not have the shape its name requires: channel type, channel and
    /// chunk counts, chunk kinds and sizes, reduce op, barrier or semaphore fields.
    #[error("{}: {} expects {expected}{}", op_field(.op, .field), .op.name.name(), got_suffix(.got))]
    Shape {
        /// The operation (its name is the one whose shape is not met).
        op: OpLocation,
        /// The field, relative to the operation (`dst_buff[1]`, `channel_type`).
        field: String,
        /// What the operation needs there.
        expected: String,
        /// What the plan has there, where that says more than the JSON itself.
        got: Option<String>,
    },
    /// Synchronization that cannot complete: a wait without its signal, thread blocks that meet
    /// a barrier different numbers of times, a device semaphore acquired and released unequally.
    #[error("{}: {message}", sync_place(.rank, .op))]
    Unbalanced {
        /// The rank whose operations do not balance.
        rank: usize,
        /// The first operation concerned, where there is one.
        op: Option<OpLocation>,
        /// What does not balance, with the counts.
        message: String,
    },
    /// The plan was loaded for a rank it has no entry for.
    #[error("rank {rank}: expected a rank below the plan's {gpus} gpus")]
    NoSuchRank {
        /// The rank asked for.
        rank: usize,
        /// The plan's number of gpus (ranks).
        gpus: usize,
    },
}

impl PlanError {
    /// A [`PlanError::Field`] at `path`.
    pub(crate) fn field(path: impl Into<String>, message: impl Into<String>) -> PlanError {
        PlanError::Field {
            path: path.into(),
            message: message.into(),
        }
    }
}

fn at_path(path: &str, message: &str) -> String {
    if path.is_empty() {
        message.to_string()
    } else {
        format!("at {path}: {message}")
    }
}

fn op_field(op: &OpLocation, field: &str) -> String {
    if field.is_empty() {
        op.to_string()
    } else {
        format!("{op}.{field}")
    }
}

fn got_suffix(got: &Option<String>) -> String {
    got.as_ref().map_or(String::new(), |g| format!(", got {g}"))
}

fn sync_place(rank: &usize, op: &Option<OpLocation>) -> String {
    op.map_or_else(|| format!("gpus[{rank}]"), |o| o.to_string())
}
