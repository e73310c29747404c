//! NUMA placement of host threads: how many nodes there are, which CPUs a node has, and
//! binding the calling thread to a node (the proxy thread binds to its GPU's node).
//!
//! The node topology comes from sysfs (`/sys/devices/system/node`); affinity is set and read
//! with `sched_setaffinity`/`sched_getaffinity` on the calling thread through rustix, whose
//! `CpuSet` holds CPUs below [`MAX_AFFINITY_CPUS`] (glibc's `cpu_set_t`: 1024). A NUMA node of -1 means
//! "unknown" (GPUs on VMs report it): [`bind_current_thread_to_node`] then leaves the thread
//! alone and says so by returning `Ok(false)`. A kernel built without NUMA support has no node
//! directories; it is treated as one node, 0, holding every online CPU.

use crate::{Error, Result};
use rustix::thread::CpuSet;

const NODE_DIR: &str = "/sys/devices/system/node";
const CPU_ONLINE: &str = "/sys/devices/system/cpu/online";
/// CPU numbers at or above this are rejected by the parser (no machine has a million CPUs; a
/// larger number is a corrupt list, and would make an absurd affinity mask).
const MAX_CPUS: usize = 1 << 20;
/// CPUs an affinity mask can name: those below this number (rustix's `CpuSet`, the size of
/// glibc's `cpu_set_t`).
pub const MAX_AFFINITY_CPUS: usize = CpuSet::MAX_CPU;

/// The number of NUMA nodes (`node<N>` directories under `/sys/devices/system/node`); 1 on a
/// kernel without NUMA support (or when sysfs cannot be read): the machine is one node.
pub fn node_count() -> usize {
    let Ok(dir) = std::fs::read_dir(NODE_DIR) else {
        return 1;
    };
    let n = dir
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    n.max(1)
}

/// The CPUs of NUMA node `node`, ascending, from `/sys/devices/system/node/node<N>/cpulist`
/// (empty for a memory-only node). Errors name the node and the file or text at fault.
pub fn cpus_of_node(node: i32) -> Result<Vec<usize>> {
    if node < 0 {
        return Err(Error::invalid(
            "cpus_of_node",
            "a NUMA node >= 0",
            node.to_string(),
        ));
    }
    let path = format!("{NODE_DIR}/node{node}/cpulist");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        // No node directories at all: a non-NUMA kernel, where node 0 is the whole machine.
        Err(e) if node == 0 && !std::path::Path::new(NODE_DIR).exists() => {
            std::fs::read_to_string(CPU_ONLINE).map_err(|e2| Error::Os {
                op: "cpus_of_node",
                source: std::io::Error::new(
                    e2.kind(),
                    format!("NUMA node 0: reading {path} ({e}) and {CPU_ONLINE}: {e2}"),
                ),
            })?
        }
        Err(e) => {
            return Err(Error::Os {
                op: "cpus_of_node",
                source: std::io::Error::new(
                    e.kind(),
                    format!("NUMA node {node}: reading {path}: {e}"),
                ),
            })
        }
    };
    parse_cpu_list(&text).map_err(|e| match e {
        Error::InvalidArgument { expected, got, .. } => Error::InvalidArgument {
            op: "cpus_of_node",
            expected: format!("{expected} in {path} (NUMA node {node})"),
            got,
        },
        other => other,
    })
}

/// Parses a kernel CPU list such as `"0-3,8-11\n"` into ascending, de-duplicated CPU numbers.
/// An empty list (only whitespace) is no CPUs. Malformed text is an
/// [`Error::InvalidArgument`] naming the whole text and the bad item.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>> {
    let bad = |item: &str, why: &str| {
        Error::invalid(
            "parse_cpu_list",
            format!("a CPU list like \"0-3,8-11\" ({why})"),
            format!("{text:?} (item {item:?})"),
        )
    };
    let trimmed = text.trim();
    let mut cpus = Vec::new();
    if trimmed.is_empty() {
        return Ok(cpus);
    }
    let number = |item: &str, s: &str| -> Result<usize> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(item, "CPU numbers are decimal digits"));
        }
        match s.parse::<usize>() {
            Ok(n) if n < MAX_CPUS => Ok(n),
            _ => Err(bad(item, &format!("CPU numbers below {MAX_CPUS}"))),
        }
    };
    for item in trimmed.split(',') {
        match item.split_once('-') {
            None => cpus.push(number(item, item)?),
            Some((lo, hi)) => {
                let (lo, hi) = (number(item, lo)?, number(item, hi)?);
                if lo > hi {
                    return Err(bad(item, "a range's first CPU is not above its last"));
                }
                cpus.extend(lo..=hi);
            }
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Binds the calling thread to the CPUs of NUMA node `node`.
///
/// `node < 0` (unknown, e.g. a GPU on a VM) binds nothing and returns `Ok(false)`; otherwise
/// the thread's affinity becomes the node's CPUs (the kernel further limits it to the
/// process's cpuset) and the result is `Ok(true)`. Errors name the node and the OS error.
pub fn bind_current_thread_to_node(node: i32) -> Result<bool> {
    if node < 0 {
        return Ok(false);
    }
    let cpus = cpus_of_node(node)?;
    if cpus.is_empty() {
        return Err(Error::invalid(
            "bind_current_thread_to_node",
            format!("NUMA node {node} to have CPUs"),
            "a node without CPUs (memory only)",
        ));
    }
    let mask = cpu_mask(&cpus).map_err(|e| match e {
        Error::InvalidArgument { expected, got, .. } => Error::InvalidArgument {
            op: "bind_current_thread_to_node",
            expected: format!("{expected} (NUMA node {node})"),
            got,
        },
        other => other,
    })?;
    // <https://man7.org/linux/man-pages/man2/sched_setaffinity.2.html>; None = this thread.
    if let Err(e) = rustix::thread::sched_setaffinity(None, &mask) {
        let os = std::io::Error::from(e);
        return Err(Error::Os {
            op: "sched_setaffinity",
            source: std::io::Error::new(
                os.kind(),
                format!(
                    "binding the thread to NUMA node {node} (CPUs {}): {os}",
                    format_cpu_list(&cpus)
                ),
            ),
        });
    }
    Ok(true)
}

/// The CPUs the calling thread may run on, ascending (`sched_getaffinity`).
pub fn current_thread_cpus() -> Result<Vec<usize>> {
    // <https://man7.org/linux/man-pages/man2/sched_getaffinity.2.html>; None = this thread.
    let mask = rustix::thread::sched_getaffinity(None).map_err(|e| Error::Os {
        op: "sched_getaffinity",
        source: std::io::Error::from(e),
    })?;
    Ok(mask_cpus(&mask))
}

/// An affinity mask with the bits of `cpus` set; an error names a CPU the mask cannot hold.
fn cpu_mask(cpus: &[usize]) -> Result<CpuSet> {
    let mut mask = CpuSet::new();
    for &c in cpus {
        if c >= MAX_AFFINITY_CPUS {
            return Err(Error::invalid(
                "cpu_mask",
                format!("CPU numbers below {MAX_AFFINITY_CPUS} (what an affinity mask holds)"),
                format!("CPU {c}"),
            ));
        }
        mask.set(c);
    }
    Ok(mask)
}

/// The CPU numbers whose bits are set in `mask`, ascending.
fn mask_cpus(mask: &CpuSet) -> Vec<usize> {
    (0..MAX_AFFINITY_CPUS).filter(|&c| mask.is_set(c)).collect()
}

/// `[0, 1, 2, 5]` -> `"0-2,5"` (for messages).
fn format_cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_parse_ranges_and_singles() {
        let v = parse_cpu_list("0-3,8-11\n").expect("valid list");
        assert_eq!(v, vec![0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(parse_cpu_list("5").expect("single"), vec![5]);
        assert_eq!(parse_cpu_list("2,0,1-2").expect("unsorted"), vec![0, 1, 2]);
        assert_eq!(parse_cpu_list("7-7").expect("one-cpu range"), vec![7]);
        assert!(parse_cpu_list("\n").expect("memory-only node").is_empty());
        assert!(parse_cpu_list("").expect("empty").is_empty());
    }

    #[test]
    fn numa_parse_rejects_malformed_naming_the_text() {
        for text in [
            "a-b", "3-1", "1,,2", "-", "5-", "-5", "1-2-3", "0x3", " 1, 2", "1;2", "99999999",
        ] {
            match parse_cpu_list(text) {
                Err(Error::InvalidArgument { got, .. }) => assert!(
                    got.contains(&format!("{text:?}")),
                    "error for {text:?} should name the text, got {got}"
                ),
                other => panic!("{text:?}: expected InvalidArgument, got {other:?}"),
            }
        }
        let msg = parse_cpu_list("3-1").map(|_| ()).unwrap_err().to_string();
        assert!(
            msg.contains("\"3-1\"") && msg.contains("first CPU"),
            "{msg}"
        );
    }

    #[test]
    fn numa_mask_round_trip_and_format() {
        let cpus = vec![0, 1, 63, 64, 130, MAX_AFFINITY_CPUS - 1];
        let mask = cpu_mask(&cpus).expect("CPUs inside the mask");
        assert_eq!(mask_cpus(&mask), cpus);
        let msg = cpu_mask(&[3, MAX_AFFINITY_CPUS])
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(msg.contains(&format!("CPU {MAX_AFFINITY_CPUS}")), "{msg}");
        assert_eq!(format_cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(format_cpu_list(&[]), "");
    }

    #[test]
    fn numa_unknown_node_is_not_bound() {
        let before = current_thread_cpus().expect("sched_getaffinity");
        assert!(!before.is_empty());
        assert!(!bind_current_thread_to_node(-1).expect("node -1 is not an error"));
        assert_eq!(current_thread_cpus().expect("sched_getaffinity"), before);
        assert!(matches!(
            cpus_of_node(-1),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn numa_bind_node0_on_a_thread() {
        assert!(node_count() >= 1);
        let node0 = cpus_of_node(0).expect("node 0 exists on Linux");
        assert!(!node0.is_empty());
        let got = std::thread::spawn(move || -> Result<(bool, Vec<usize>)> {
            Ok((bind_current_thread_to_node(0)?, current_thread_cpus()?))
        })
        .join()
        .expect("binding thread panicked")
        .expect("binding to node 0");
        assert!(got.0);
        assert!(!got.1.is_empty());
        assert!(
            got.1.iter().all(|c| node0.contains(c)),
            "{:?} vs {node0:?}",
            got.1
        );
    }

    #[test]
    fn numa_missing_node_names_it() {
        let msg = cpus_of_node(1_000_000).map(|_| ()).unwrap_err().to_string();
        assert!(msg.contains("NUMA node 1000000"), "{msg}");
        let msg = bind_current_thread_to_node(1_000_000)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("NUMA node 1000000"), "{msg}");
    }
}
