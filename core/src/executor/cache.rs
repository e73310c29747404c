//! Plans from `MSCCLPP_CACHE_DIR` (upstream's layout: bundled plans in `<dir>/default/`,
//! compiled ones as `<dir>/<id>.json`) for the collectives' selector and the NCCL library:
//! [`find_plan`] returns the best plan for a call, or `None`.
//!
//! A plan matches when its collective, world size, ranks per node, in/out-of-place and size
//! range fit the call and the message divides into its chunks. Ranks per node come from the
//! plan's `nranks_per_node` field (our plans write it), else from upstream's table of its
//! bundled multi-node plans, else the plan is taken as single-node. Among matches the one
//! with the narrowest size range wins (then the file name). Plans that fail to parse are
//! skipped with a warning. Parsed plans are cached per (file, modification time, rank).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use super::lower::layout::Layout;
use super::plan::ExecutionPlan;
use crate::error::Result;

/// What a call needs from a plan.
#[derive(Clone, Copy, Debug)]
pub struct PlanQuery<'a> {
    /// `allreduce`, `allgather`, `reducescatter`, ... (upstream's names).
    pub collective: &'a str,
    /// Ranks of the communicator.
    pub world_size: usize,
    /// Ranks per node.
    pub nranks_per_node: usize,
    /// Whether the call is in place.
    pub in_place: bool,
    /// Bytes of the send buffer.
    pub input_bytes: u64,
    /// Bytes of the receive buffer.
    pub output_bytes: u64,
    /// The calling rank (plans are loaded for it).
    pub rank: usize,
}

/// Upstream's bundled multi-node plans (file name, world size, ranks per node).
const UPSTREAM_DEFAULTS: &[(&str, usize, usize)] = &[
    ("allreduce_2nodes_1K_64K.json", 16, 8),
    ("allreduce_2nodes_128K_2M.json", 16, 8),
    ("allreduce_4nodes_1K_64K.json", 32, 8),
    ("allreduce_4nodes_128K_2M.json", 64, 4),
];

type Cached = HashMap<(PathBuf, usize), (SystemTime, Option<ExecutionPlan>)>;

fn cache() -> &'static Mutex<Cached> {
    static C: OnceLock<Mutex<Cached>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The best plan under `MSCCLPP_CACHE_DIR` for `q`, if any.
pub fn find_plan(q: &PlanQuery) -> Result<Option<ExecutionPlan>> {
    let dir = crate::env::env().cache_dir()?;
    Ok(find_plan_in(&dir, q))
}

/// The `.json` files of a plan directory: those of `dir/default`, then those of `dir`, each
/// sorted by name (a folder that cannot be read contributes none).
pub fn plan_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for d in [dir.join("default"), dir.to_path_buf()] {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
            .collect();
        v.sort();
        files.extend(v);
    }
    files
}

/// [`find_plan`] in an explicit cache directory.
pub fn find_plan_in(dir: &Path, q: &PlanQuery) -> Option<ExecutionPlan> {
    let files = plan_files(dir);
    let mut best: Option<(u64, ExecutionPlan)> = None;
    for f in files {
        let Some(plan) = load(&f, q.rank) else {
            continue;
        };
        if !matches(&plan, &f, q) {
            continue;
        }
        let width = plan.max_message_size() - plan.min_message_size();
        if best.as_ref().is_none_or(|(w, _)| width < *w) {
            best = Some((width, plan));
        }
    }
    best.map(|(_, p)| p)
}

fn load(f: &Path, rank: usize) -> Option<ExecutionPlan> {
    let mtime = std::fs::metadata(f).and_then(|m| m.modified()).ok()?;
    let key = (f.to_path_buf(), rank);
    let mut c = cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some((t, p)) = c.get(&key) {
        if *t == mtime {
            return p.clone();
        }
    }
    let p = match ExecutionPlan::from_file(f, rank) {
        Ok(p) => Some(p),
        Err(e) => {
            crate::log_warn!("EXEC", "skipping plan {}: {e}", f.display());
            None
        }
    };
    c.insert(key, (mtime, p.clone()));
    p
}

/// Ranks per node of a plan (see the module docs).
pub fn plan_nranks_per_node(plan: &ExecutionPlan, file: &Path) -> usize {
    if let Some(n) = plan.nranks_per_node() {
        return n;
    }
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    UPSTREAM_DEFAULTS
        .iter()
        .find(|(f, w, _)| *f == name && *w == plan.world_size())
        .map_or(plan.world_size(), |(_, _, n)| *n)
}

fn matches(plan: &ExecutionPlan, file: &Path, q: &PlanQuery) -> bool {
    if !plan.collective().eq_ignore_ascii_case(q.collective)
        || plan.world_size() != q.world_size
        || plan_nranks_per_node(plan, file) != q.nranks_per_node
        || plan.is_in_place() != q.in_place
        || plan.uses_switch_channels()
    {
        return false;
    }
    Layout::new(plan.meta(), plan.rank_plan(), q.input_bytes, q.output_bytes).is_ok()
}
