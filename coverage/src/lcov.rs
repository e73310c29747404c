//! Normalise llvm-cov's lcov output for lcov-parser 3.2, then parse and merge it.
//!
//! lcov-parser 3.2 has three sharp edges on what `llvm-cov export -format=lcov` writes:
//! - every record line must end in `\n`; llvm-cov may leave the last line without one, and the
//!   parser then rejects `end_of_record`;
//! - its merger drops every `DA`/`FN`/`FNDA`/`BRDA` seen before a `TN:` line, and llvm-cov
//!   writes none, so a report would come out empty;
//! - it parses numbers with `parse::<u32>().unwrap()` (a count above `u32::MAX` panics) and adds
//!   counts of merged records with `+=` (a sum above `u32::MAX` panics in debug builds).
//!
//! [`normalise`] rewrites a file so none of this can happen: it adds the newline and the `TN:`,
//! and clamps each count so that the sum over all records of the same key stays within `u32`.
//! Coverage only asks "was it run", so clamping a nonzero count never changes a result: a clamped
//! count stays at least 1. Malformed lines (a `DA` outside a record, a line number that is not a
//! number) are errors naming the line; unknown record kinds (lcov 2.x `VER:`, `FNL:`, ...) are
//! dropped and counted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::CoverageError;

/// The result of [`normalise`]: text lcov-parser accepts, and what had to change.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Normalised {
    /// The rewritten lcov text; every line ends in `\n`.
    pub text: String,
    /// The input's last line had no `\n`.
    pub added_trailing_newline: bool,
    /// A `TN:` line was put before the first record.
    pub added_test_name: bool,
    /// How many execution counts were lowered (above `u32::MAX`, or too large to sum).
    pub clamped_counts: usize,
    /// Lines of kinds lcov-parser does not know, dropped: (1-based line number, text).
    pub dropped_lines: Vec<(usize, String)>,
    /// Number of `SF:` records.
    pub records: usize,
}

/// What a record line holds, after a first pass over the input.
enum Line<'a> {
    Blank,
    TestName(&'a str),
    SourceFile(&'a str),
    /// `DA:<line>,<count>[,<checksum>]`
    Data {
        line: u32,
        count: Count,
        rest: &'a str,
    },
    /// `FN:<line>,<name>`, kept as written after validation.
    FunctionName(&'a str),
    /// `FNDA:<count>,<name>`
    FunctionData {
        count: Count,
        name: &'a str,
    },
    /// `BRDA:<line>,<block>,<branch>,<taken or ->`
    BranchData {
        line: u32,
        block: u32,
        branch: u32,
        taken: Option<Count>,
    },
    /// `LF`, `LH`, `FNF`, `FNH`, `BRF`, `BRH`: summary numbers the merger recomputes.
    Total {
        tag: &'a str,
        value: Count,
    },
    EndOfRecord,
    Unknown(&'a str),
}

/// An execution count as written: it may exceed `u64` (then it is "huge").
#[derive(Clone, Copy)]
enum Count {
    Value(u64),
    Huge,
}

impl Count {
    fn parse(text: &str) -> Option<Count> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(text.parse::<u64>().map_or(Count::Huge, Count::Value))
    }

    /// Clamp to `cap`; returns the value and whether it was lowered.
    fn clamp(self, cap: u32) -> (u32, bool) {
        match self {
            Count::Value(v) if v <= u64::from(cap) => (v as u32, false),
            _ => (cap, true),
        }
    }
}

fn parse_u32(text: &str, what: &str) -> Result<u32, String> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "expected {what} (a decimal number), found {text:?}"
        ));
    }
    text.parse::<u32>()
        .map_err(|_| format!("expected {what} at most {}, found {text}", u32::MAX))
}

fn classify(raw: &str) -> Result<Line<'_>, String> {
    let text = raw.strip_suffix('\r').unwrap_or(raw);
    if text.trim().is_empty() {
        return Ok(Line::Blank);
    }
    if text == "end_of_record" {
        return Ok(Line::EndOfRecord);
    }
    let Some((tag, body)) = text.split_once(':') else {
        return Ok(Line::Unknown(text));
    };
    match tag {
        "TN" => Ok(Line::TestName(body)),
        "SF" => {
            if body.is_empty() {
                return Err("expected a source path after SF:, found nothing".into());
            }
            Ok(Line::SourceFile(body))
        }
        "DA" => {
            let mut parts = body.splitn(3, ',');
            let line = parse_u32(parts.next().unwrap_or(""), "a line number after DA:")?;
            let count_text = parts.next().unwrap_or("");
            let count = Count::parse(count_text).ok_or_else(|| {
                format!("expected an execution count after DA:{line}, found {count_text:?}")
            })?;
            let rest = match parts.next() {
                Some(checksum) => &body[body.len() - checksum.len() - 1..],
                None => "",
            };
            Ok(Line::Data { line, count, rest })
        }
        "FN" => {
            let Some((line, name)) = body.split_once(',') else {
                return Err(format!("expected FN:<line>,<name>, found FN:{body}"));
            };
            parse_u32(line, "a line number after FN:")?;
            if name.is_empty() {
                return Err("expected a function name after FN:<line>, found nothing".into());
            }
            Ok(Line::FunctionName(body))
        }
        "FNDA" => {
            let Some((count_text, name)) = body.split_once(',') else {
                return Err(format!("expected FNDA:<count>,<name>, found FNDA:{body}"));
            };
            let count = Count::parse(count_text).ok_or_else(|| {
                format!("expected an execution count after FNDA:, found {count_text:?}")
            })?;
            if name.is_empty() {
                return Err("expected a function name after FNDA:<count>, found nothing".into());
            }
            Ok(Line::FunctionData { count, name })
        }
        "BRDA" => {
            let parts: Vec<&str> = body.split(',').collect();
            if parts.len() != 4 {
                return Err(format!(
                    "expected BRDA:<line>,<block>,<branch>,<taken>, found BRDA:{body}"
                ));
            }
            let line = parse_u32(parts[0], "a line number after BRDA:")?;
            let block = parse_u32(parts[1], "a block number in BRDA")?;
            let branch = parse_u32(parts[2], "a branch number in BRDA")?;
            let taken = if parts[3] == "-" {
                None
            } else {
                Some(Count::parse(parts[3]).ok_or_else(|| {
                    format!(
                        "expected a taken count or '-' in BRDA, found {:?}",
                        parts[3]
                    )
                })?)
            };
            Ok(Line::BranchData {
                line,
                block,
                branch,
                taken,
            })
        }
        "LF" | "LH" | "FNF" | "FNH" | "BRF" | "BRH" => {
            let value = Count::parse(body)
                .ok_or_else(|| format!("expected a number after {tag}:, found {body:?}"))?;
            Ok(Line::Total { tag, value })
        }
        _ => Ok(Line::Unknown(text)),
    }
}

/// Key of a count that the merger sums: same file and same line/function/branch.
#[derive(Hash, PartialEq, Eq)]
enum CountKey<'a> {
    Line(&'a str, u32),
    Function(&'a str, &'a str),
    Branch(&'a str, u32, u32, u32),
}

/// Rewrite lcov text (from a file named `path`, used in errors) so that lcov-parser 3.2 reads
/// and merges it without dropping data or panicking. See the module docs for what changes.
pub fn normalise(path: &str, input: &str) -> Result<Normalised, CoverageError> {
    let err = |line: usize, message: String| CoverageError::Lcov {
        path: path.to_string(),
        line,
        message,
    };
    let mut out = Normalised {
        added_trailing_newline: !input.is_empty() && !input.ends_with('\n'),
        ..Normalised::default()
    };

    // Pass 1: classify, check structure, count how often each summed key occurs.
    let mut lines = Vec::new();
    let mut occurrences: HashMap<CountKey<'_>, u32> = HashMap::new();
    let mut current: Option<&str> = None;
    let mut seen_test_name = false;
    let mut first_record_before_tn = false;
    for (index, raw) in input.lines().enumerate() {
        let number = index + 1;
        let line = classify(raw).map_err(|m| err(number, m))?;
        let key = match (&line, current) {
            (Line::TestName(_), _) => {
                seen_test_name = true;
                None
            }
            (Line::SourceFile(name), None) => {
                if !seen_test_name && out.records == 0 {
                    first_record_before_tn = true;
                }
                out.records += 1;
                current = Some(name);
                None
            }
            (Line::SourceFile(name), Some(open)) => {
                return Err(err(
                    number,
                    format!("SF:{name} starts before the record of {open} has its end_of_record"),
                ));
            }
            (Line::EndOfRecord, None) => {
                return Err(err(
                    number,
                    "end_of_record without a preceding SF: line".into(),
                ));
            }
            (Line::EndOfRecord, Some(_)) => {
                current = None;
                None
            }
            (Line::Data { line, .. }, Some(file)) => Some(CountKey::Line(file, *line)),
            (Line::FunctionData { name, .. }, Some(file)) => Some(CountKey::Function(file, name)),
            (
                Line::BranchData {
                    line,
                    block,
                    branch,
                    ..
                },
                Some(file),
            ) => Some(CountKey::Branch(file, *line, *block, *branch)),
            (Line::Data { .. } | Line::FunctionData { .. } | Line::BranchData { .. }, None)
            | (Line::FunctionName(_) | Line::Total { .. }, None) => {
                return Err(err(
                    number,
                    format!("expected SF: before this line, found {raw:?} outside a record"),
                ));
            }
            _ => None,
        };
        if let Some(key) = key {
            let n = occurrences.entry(key).or_insert(0);
            *n = n.saturating_add(1);
        }
        lines.push((number, line));
    }
    if let Some(open) = current {
        return Err(err(
            lines.len(),
            format!("the file ends inside the record of {open}: expected end_of_record"),
        ));
    }

    // Pass 2: write, clamping each summed count to u32::MAX / occurrences of its key.
    let cap_for = |key: &CountKey<'_>| -> u32 {
        let n = occurrences.get(key).copied().unwrap_or(1).max(1);
        u32::MAX / n
    };
    if first_record_before_tn {
        out.text.push_str("TN:\n");
        out.added_test_name = true;
    }
    let mut current: Option<&str> = None;
    for (number, line) in lines {
        match line {
            Line::Blank => {}
            Line::TestName(name) => {
                out.text.push_str("TN:");
                out.text.push_str(name);
                out.text.push('\n');
            }
            Line::SourceFile(name) => {
                current = Some(name);
                out.text.push_str("SF:");
                out.text.push_str(name);
                out.text.push('\n');
            }
            Line::Data { line, count, rest } => {
                let file = current.unwrap_or("");
                let (value, clamped) = count.clamp(cap_for(&CountKey::Line(file, line)));
                out.clamped_counts += usize::from(clamped);
                out.text.push_str(&format!("DA:{line},{value}{rest}\n"));
            }
            Line::FunctionName(body) => {
                out.text.push_str("FN:");
                out.text.push_str(body);
                out.text.push('\n');
            }
            Line::FunctionData { count, name } => {
                let file = current.unwrap_or("");
                let (value, clamped) = count.clamp(cap_for(&CountKey::Function(file, name)));
                out.clamped_counts += usize::from(clamped);
                out.text.push_str(&format!("FNDA:{value},{name}\n"));
            }
            Line::BranchData {
                line,
                block,
                branch,
                taken,
            } => {
                let file = current.unwrap_or("");
                let taken = match taken {
                    None => "-".to_string(),
                    Some(count) => {
                        let key = CountKey::Branch(file, line, block, branch);
                        let (value, clamped) = count.clamp(cap_for(&key));
                        out.clamped_counts += usize::from(clamped);
                        value.to_string()
                    }
                };
                out.text
                    .push_str(&format!("BRDA:{line},{block},{branch},{taken}\n"));
            }
            Line::Total { tag, value } => {
                let (value, clamped) = value.clamp(u32::MAX);
                out.clamped_counts += usize::from(clamped);
                out.text.push_str(&format!("{tag}:{value}\n"));
            }
            Line::EndOfRecord => {
                current = None;
                out.text.push_str("end_of_record\n");
            }
            Line::Unknown(text) => out.dropped_lines.push((number, text.to_string())),
        }
    }
    Ok(out)
}

/// A normalised copy on disk for lcov-parser's file-based merger; removed on drop.
struct TempCopy(PathBuf);

impl TempCopy {
    fn write(text: &str) -> Result<TempCopy, CoverageError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "mscclpp-coverage-{}-{n}.normalised.info",
            std::process::id()
        ));
        std::fs::write(&path, text).map_err(|source| CoverageError::Io {
            what: "writing the normalised lcov copy",
            path: path.clone(),
            source,
        })?;
        Ok(TempCopy(path))
    }
}

impl Drop for TempCopy {
    fn drop(&mut self) {
        // A leftover temp file is harmless; nothing to surface.
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Read, normalise and merge lcov files into one lcov-parser report. Records of the same source
/// file (within a file or across files) are merged: a line is hit if any record hits it.
/// Returns the report and, per input, what normalisation changed.
pub fn load_report(
    paths: &[PathBuf],
) -> Result<(lcov_parser::Report, Vec<Normalised>), CoverageError> {
    let mut copies = Vec::new();
    let mut notes = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| CoverageError::Io {
            what: "reading lcov file",
            path: path.clone(),
            source,
        })?;
        let normalised = normalise(&path.display().to_string(), &text)?;
        copies.push(TempCopy::write(&normalised.text)?);
        notes.push(normalised);
    }
    let report = merge_texts(&copies, paths)?;
    Ok((report, notes))
}

/// Merge already normalised lcov text (tests and callers holding text in memory).
pub fn merge_normalised(texts: &[&str]) -> Result<lcov_parser::Report, CoverageError> {
    let copies = texts
        .iter()
        .map(|t| TempCopy::write(t))
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<PathBuf> = (0..texts.len())
        .map(|i| PathBuf::from(format!("<input {i}>")))
        .collect();
    merge_texts(&copies, &names)
}

fn merge_texts(
    copies: &[TempCopy],
    names: &[PathBuf],
) -> Result<lcov_parser::Report, CoverageError> {
    let files: Vec<&Path> = copies.iter().map(|c| c.0.as_path()).collect();
    lcov_parser::merge_files(&files).map_err(|e| CoverageError::Merge {
        path: names
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        message: e.to_string(),
    })
}
