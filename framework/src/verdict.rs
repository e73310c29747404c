//! Test verdicts, their wire format, and the `World` that agrees on them across ranks.

/// The outcome of one test on one rank, or the combined outcome over all ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every check held.
    Passed,
    /// A check failed (the messages say which).
    Failed,
    /// Skipped, with the reason given to `SKIP!`.
    Skipped(String),
}

/// Version byte that starts every encoded verdict.
const WIRE_VERSION: u8 = 1;
const TAG_PASSED: u8 = 0;
const TAG_FAILED: u8 = 1;
const TAG_SKIPPED: u8 = 2;
/// version (1) + tag (1) + reason length (u32 LE).
const HEADER_LEN: usize = 6;

impl Verdict {
    /// Encodes the verdict as `[version=1][tag][reason length: u32 LE][reason UTF-8]`.
    /// Passed (tag 0) and Failed (tag 1) carry an empty reason; Skipped is tag 2.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (tag, reason) = match self {
            Verdict::Passed => (TAG_PASSED, ""),
            Verdict::Failed => (TAG_FAILED, ""),
            Verdict::Skipped(r) => (TAG_SKIPPED, r.as_str()),
        };
        // Reasons longer than u32::MAX bytes are cut; nobody writes a 4 GiB skip reason.
        let reason = &reason.as_bytes()[..reason.len().min(u32::MAX as usize)];
        let mut out = Vec::with_capacity(HEADER_LEN + reason.len());
        out.push(WIRE_VERSION);
        out.push(tag);
        out.extend_from_slice(&(reason.len() as u32).to_le_bytes());
        out.extend_from_slice(reason);
        out
    }

    /// Decodes what [`Verdict::to_bytes`] produced; every malformation is an error naming
    /// what was expected and what came.
    pub fn from_bytes(bytes: &[u8]) -> Result<Verdict, String> {
        if bytes.len() < HEADER_LEN {
            return Err(format!(
                "verdict: expected at least {HEADER_LEN} header bytes, got {}",
                bytes.len()
            ));
        }
        if bytes[0] != WIRE_VERSION {
            return Err(format!(
                "verdict: expected wire version {WIRE_VERSION}, got {}",
                bytes[0]
            ));
        }
        let tag = bytes[1];
        let len = u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]) as usize;
        let body = &bytes[HEADER_LEN..];
        if body.len() != len {
            return Err(format!(
                "verdict: expected the {len}-byte reason the header announces, got {} bytes",
                body.len()
            ));
        }
        match tag {
            TAG_PASSED | TAG_FAILED if len != 0 => Err(format!(
                "verdict: expected no reason with tag {tag} (passed/failed), got {len} bytes"
            )),
            TAG_PASSED => Ok(Verdict::Passed),
            TAG_FAILED => Ok(Verdict::Failed),
            TAG_SKIPPED => match std::str::from_utf8(body) {
                Ok(s) => Ok(Verdict::Skipped(s.to_owned())),
                Err(e) => Err(format!("verdict: expected a UTF-8 skip reason: {e}")),
            },
            other => Err(format!(
                "verdict: expected tag {TAG_PASSED}, {TAG_FAILED} or {TAG_SKIPPED}, got {other}"
            )),
        }
    }
}

/// Combines the verdicts of all ranks (in rank order): Failed if any failed, else the first
/// Skipped (by rank), else Passed. An empty slice is Passed.
pub fn combine_verdicts(all: &[Verdict]) -> Verdict {
    if all.contains(&Verdict::Failed) {
        return Verdict::Failed;
    }
    all.iter()
        .find(|v| matches!(v, Verdict::Skipped(_)))
        .cloned()
        .unwrap_or(Verdict::Passed)
}

/// The set of ranks running the same test binary. The runner calls [`World::combine`] once
/// after every selected test, on every rank, in the same order.
pub trait World: Send + Sync {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Exchanges `local` with all other ranks and returns [`combine_verdicts`] of all of them.
    /// An error (a peer gone, a timeout) fails the test and stops the run; implementations
    /// must time out rather than block forever.
    fn combine(&self, local: &Verdict) -> Result<Verdict, String>;
}

/// A world of one process: rank 0 of 1; `combine` returns the local verdict.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleProcessWorld;

impl World for SingleProcessWorld {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn combine(&self, local: &Verdict) -> Result<Verdict, String> {
        Ok(local.clone())
    }
}
