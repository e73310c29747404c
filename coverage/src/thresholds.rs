//! The checked-in thresholds (`coverage/thresholds.json`) and the gate that applies them.
//!
//! ```json
//! { "note": "why these numbers",
//!   "overall_line_percent": 10, "overall_function_percent": 5,
//!   "crates": { "core": { "line_percent": 10, "function_percent": 5 } } }
//! ```
//! `overall_function_percent` and every `function_percent` are optional. A crate is named by its
//! workspace folder. A threshold above 0 on something with no lines (functions) in the report
//! fails: nothing measured is not "covered".

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::summary::{Counts, Summary};
use crate::CoverageError;

/// Minimum coverage, overall and per crate, in percent (0 to 100).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    /// Free text: where the numbers come from.
    #[serde(default)]
    pub note: Option<String>,
    /// Minimum line coverage of the whole workspace, percent.
    pub overall_line_percent: f64,
    #[serde(default)]
    /// Minimum function coverage of the whole workspace, percent (none: not gated).
    pub overall_function_percent: Option<f64>,
    #[serde(default)]
    /// Per-crate minimums, by the crate's folder name.
    pub crates: BTreeMap<String, CrateThreshold>,
}

/// Minimum coverage of one crate.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrateThreshold {
    /// Minimum line coverage, percent.
    pub line_percent: f64,
    #[serde(default)]
    /// Minimum function coverage, percent (none: not gated).
    pub function_percent: Option<f64>,
}

impl Thresholds {
    /// Parse and check: every percent in 0..=100, every crate one of `known_crates` (workspace
    /// folders), so a typo cannot switch a check off. `path` names the source in errors.
    pub fn parse(path: &str, json: &str, known_crates: &[String]) -> Result<Self, CoverageError> {
        let err = |message: String| CoverageError::Config {
            path: path.to_string(),
            message,
        };
        let thresholds: Thresholds = serde_json::from_str(json).map_err(|e| err(e.to_string()))?;
        let mut checks: Vec<(String, f64)> = vec![(
            "overall_line_percent".into(),
            thresholds.overall_line_percent,
        )];
        if let Some(p) = thresholds.overall_function_percent {
            checks.push(("overall_function_percent".into(), p));
        }
        for (name, t) in &thresholds.crates {
            if !known_crates.iter().any(|k| k == name) {
                return Err(err(format!(
                    "crate {name:?} is not a workspace folder; expected one of {}",
                    known_crates.join(", ")
                )));
            }
            checks.push((format!("crates.{name}.line_percent"), t.line_percent));
            if let Some(p) = t.function_percent {
                checks.push((format!("crates.{name}.function_percent"), p));
            }
        }
        for (what, value) in checks {
            if !(0.0..=100.0).contains(&value) {
                return Err(err(format!(
                    "{what} must be a percent from 0 to 100, found {value}"
                )));
            }
        }
        Ok(thresholds)
    }
}

/// Which measure a gate failure is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Line coverage.
    Lines,
    /// Function coverage.
    Functions,
}

/// One threshold not met.
#[derive(Debug, Clone, PartialEq)]
pub struct GateFailure {
    /// `"overall"` or the crate's folder name.
    pub scope: String,
    /// Which measure.
    pub metric: Metric,
    /// Measured percent; `None` when nothing of that kind was found.
    pub actual: Option<f64>,
    /// The minimum, percent.
    pub threshold: f64,
    /// Lines or functions hit.
    pub hit: u64,
    /// Lines or functions found.
    pub found: u64,
}

impl fmt::Display for GateFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, unit) = match self.metric {
            Metric::Lines => ("line", "lines"),
            Metric::Functions => ("function", "functions"),
        };
        match self.actual {
            Some(actual) => write!(
                f,
                "{}: {what} coverage {actual:.2}% ({}/{} {unit}) is under the threshold {:.2}% by {:.2} points",
                self.scope,
                self.hit,
                self.found,
                self.threshold,
                self.threshold - actual
            ),
            None => write!(
                f,
                "{}: no {unit} in the report, so the {what} threshold {:.2}% is not met",
                self.scope, self.threshold
            ),
        }
    }
}

fn check(
    failures: &mut Vec<GateFailure>,
    scope: &str,
    metric: Metric,
    counts: &Counts,
    threshold: f64,
) {
    let (hit, found) = match metric {
        Metric::Lines => (counts.lines_hit, counts.lines_found),
        Metric::Functions => (counts.functions_hit, counts.functions_found),
    };
    if threshold <= 0.0 {
        return;
    }
    // Compare hit/found >= threshold/100 without dividing: exact for whole counts.
    let met = found > 0 && (hit as f64) * 100.0 >= threshold * found as f64;
    if !met {
        failures.push(GateFailure {
            scope: scope.to_string(),
            metric,
            actual: (found > 0).then(|| hit as f64 * 100.0 / found as f64),
            threshold,
            hit,
            found,
        });
    }
}

/// Every threshold the summary does not meet; empty means the gate passes.
pub fn gate(summary: &Summary, thresholds: &Thresholds) -> Vec<GateFailure> {
    let mut failures = Vec::new();
    check(
        &mut failures,
        "overall",
        Metric::Lines,
        &summary.total,
        thresholds.overall_line_percent,
    );
    if let Some(p) = thresholds.overall_function_percent {
        check(
            &mut failures,
            "overall",
            Metric::Functions,
            &summary.total,
            p,
        );
    }
    let zero = Counts::default();
    for (name, t) in &thresholds.crates {
        let counts = summary.crates.get(name).unwrap_or(&zero);
        check(&mut failures, name, Metric::Lines, counts, t.line_percent);
        if let Some(p) = t.function_percent {
            check(&mut failures, name, Metric::Functions, counts, p);
        }
    }
    failures
}
