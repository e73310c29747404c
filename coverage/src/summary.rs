//! Line and function coverage per crate and overall, and the aligned table printed for it.

use std::collections::{BTreeMap, BTreeSet};

use lcov_parser::summary::Summary as _;

use crate::workspace::CrateMap;

/// Found/hit counts of lines and functions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Instrumented lines.
    pub lines_found: u64,
    /// Lines executed at least once.
    pub lines_hit: u64,
    /// Instrumented functions.
    pub functions_found: u64,
    /// Functions called at least once.
    pub functions_hit: u64,
}

impl Counts {
    /// Percent of lines hit; `None` when no line was found.
    pub fn line_percent(&self) -> Option<f64> {
        percent(self.lines_hit, self.lines_found)
    }

    /// Percent of functions hit; `None` when no function was found.
    pub fn function_percent(&self) -> Option<f64> {
        percent(self.functions_hit, self.functions_found)
    }

    fn add(&mut self, other: &Counts) {
        self.lines_found += other.lines_found;
        self.lines_hit += other.lines_hit;
        self.functions_found += other.functions_found;
        self.functions_hit += other.functions_hit;
    }
}

fn percent(hit: u64, found: u64) -> Option<f64> {
    (found > 0).then(|| hit as f64 * 100.0 / found as f64)
}

/// Coverage of one source file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileCoverage {
    /// The source file, relative to the workspace root.
    pub path: String,
    /// The crate (its folder) the file belongs to.
    pub crate_name: String,
    /// Its counts.
    pub counts: Counts,
}

/// Coverage per crate (folder name, or [`crate::workspace::OTHER`]) and in total.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Counts per crate (by folder name).
    pub crates: BTreeMap<String, Counts>,
    /// Counts over every file.
    pub total: Counts,
    /// Every file's counts, sorted by path.
    pub files: Vec<FileCoverage>,
}

/// Summarise a merged report. A file's line (function) is hit if any test record of it hits it.
pub fn summarise(report: &lcov_parser::Report, map: &CrateMap) -> Summary {
    let mut summary = Summary::default();
    for (path, file) in report.files().iter() {
        let mut lines: BTreeMap<u32, bool> = BTreeMap::new();
        let mut functions: BTreeMap<&str, bool> = BTreeMap::new();
        for (_, test) in file.tests().iter() {
            for (number, line) in test.lines().iter() {
                *lines.entry(*number).or_insert(false) |= line.is_hit();
            }
            for (name, function) in test.functions().iter() {
                *functions.entry(name.as_str()).or_insert(false) |= function.is_hit();
            }
        }
        let counts = Counts {
            lines_found: lines.len() as u64,
            lines_hit: lines.values().filter(|h| **h).count() as u64,
            functions_found: functions.len() as u64,
            functions_hit: functions.values().filter(|h| **h).count() as u64,
        };
        let crate_name = map.crate_of(path).to_string();
        summary
            .crates
            .entry(crate_name.clone())
            .or_default()
            .add(&counts);
        summary.total.add(&counts);
        summary.files.push(FileCoverage {
            path: path.clone(),
            crate_name,
            counts,
        });
    }
    summary
}

fn show_percent(p: Option<f64>) -> String {
    p.map_or_else(|| "-".to_string(), |p| format!("{p:.2}%"))
}

/// The table: one row per crate in `expected` (crates with nothing in the report show zeros)
/// and per crate present in the summary, then a TOTAL row.
pub fn format_table(summary: &Summary, expected: &[String]) -> String {
    let names: BTreeSet<&str> = summary
        .crates
        .keys()
        .map(String::as_str)
        .chain(expected.iter().map(String::as_str))
        .collect();
    let mut rows: Vec<[String; 7]> = vec![[
        "crate".into(),
        "lines".into(),
        "hit".into(),
        "line %".into(),
        "functions".into(),
        "hit".into(),
        "function %".into(),
    ]];
    let row = |name: &str, c: &Counts| -> [String; 7] {
        [
            name.to_string(),
            c.lines_found.to_string(),
            c.lines_hit.to_string(),
            show_percent(c.line_percent()),
            c.functions_found.to_string(),
            c.functions_hit.to_string(),
            show_percent(c.function_percent()),
        ]
    };
    let zero = Counts::default();
    for name in &names {
        rows.push(row(name, summary.crates.get(*name).unwrap_or(&zero)));
    }
    rows.push(row("TOTAL", &summary.total));

    let mut widths = [0usize; 7];
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let rule: String = widths
        .iter()
        .map(|w| "-".repeat(*w))
        .collect::<Vec<_>>()
        .join("  ");
    let mut out = String::new();
    let last = rows.len() - 1;
    for (i, r) in rows.iter().enumerate() {
        if i == last {
            out.push_str(&rule);
            out.push('\n');
        }
        let cells: Vec<String> = r
            .iter()
            .zip(widths.iter())
            .enumerate()
            .map(|(col, (cell, w))| {
                if col == 0 {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
        if i == 0 {
            out.push_str(&rule);
            out.push('\n');
        }
    }
    out
}
