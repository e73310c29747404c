//! Tests of the normaliser, summariser and gate on the small lcov files in tests/fixtures/.

use std::path::PathBuf;

use mscclpp_coverage::lcov::{load_report, merge_normalised, normalise};
use mscclpp_coverage::show_env::{parse_show_env, per_process_profile_pattern};
use mscclpp_coverage::workspace::OTHER;
use mscclpp_coverage::{
    format_table, gate, summarise, Counts, CoverageError, CrateMap, Metric, Summary, Thresholds,
};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).expect("fixture file is checked in")
}

fn members() -> Vec<String> {
    [
        "hal",
        "mp_tests/ibv-testprov",
        "core",
        "framework",
        "mp_tests",
        "coverage",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn map() -> CrateMap {
    CrateMap::new("/ws", members())
}

fn summary_of(names: &[&str]) -> Summary {
    let paths: Vec<PathBuf> = names.iter().map(|n| fixture(n)).collect();
    let (report, _) = load_report(&paths).expect("fixtures load");
    summarise(&report, &map())
}

/// The summary of fixture `name` (a one-file `core` report): 3 lines, 2 hit; 1 function, hit.
fn assert_core_summary(name: &str) {
    let core = summary_of(&[name]).crates["core"];
    assert_eq!((core.lines_found, core.lines_hit), (3, 2), "{name}");
    assert_eq!((core.functions_found, core.functions_hit), (1, 1), "{name}");
}

fn thresholds(json: &str) -> Thresholds {
    Thresholds::parse("inline", json, &members()).expect("valid thresholds")
}

#[test]
fn missing_trailing_newline_is_added_and_the_last_record_survives() {
    let text = read("no_trailing_newline.info");
    assert!(
        !text.ends_with('\n'),
        "the fixture must lack its final newline"
    );
    // lcov-parser alone rejects it: the last line needs a newline.
    assert!(merge_normalised(&[text.as_str()]).is_err());

    let n = normalise("no_trailing_newline.info", &text).expect("normalises");
    assert!(n.added_trailing_newline);
    assert!(n.text.ends_with("end_of_record\n"));
    assert_core_summary("no_trailing_newline.info");
}

#[test]
fn missing_tn_is_added_so_the_merger_keeps_the_data() {
    let text = read("no_tn.info");
    // Without TN: lcov-parser's merger silently drops every line: the quirk is real.
    let raw = merge_normalised(&[text.as_str()]).expect("parses");
    let raw_summary = summarise(&raw, &map());
    assert_eq!(raw_summary.total.lines_found, 0);

    let n = normalise("no_tn.info", &text).expect("normalises");
    assert!(n.added_test_name);
    assert!(n.text.starts_with("TN:\nSF:/ws/core/src/a.rs\n"));
    assert_eq!(n.records, 2);
    let s = summary_of(&["no_tn.info"]);
    assert_eq!(
        s.crates["core"],
        Counts {
            lines_found: 4,
            lines_hit: 2,
            functions_found: 2,
            functions_hit: 1
        }
    );
    assert_eq!(
        (s.crates["hal"].lines_found, s.crates["hal"].lines_hit),
        (1, 1)
    );
    assert_eq!(s.total.lines_found, 5);
}

#[test]
fn counts_above_u32_are_clamped_not_panicking() {
    let text = read("huge_count.info");
    let n = normalise("huge_count.info", &text).expect("normalises");
    // DA:1, DA:2, FNDA and the numeric BRDA are above u32::MAX; BRDA '-' stays.
    assert_eq!(n.clamped_counts, 4);
    assert!(n.text.contains(&format!("DA:1,{}\n", u32::MAX)));
    assert!(n.text.contains(&format!("FNDA:{},spin\n", u32::MAX)));
    assert!(n.text.contains("BRDA:2,0,1,-\n"));
    assert!(n.text.contains("DA:3,0\n"), "a zero count stays zero");
    assert_core_summary("huge_count.info");
}

#[test]
fn two_records_of_one_file_are_merged_without_overflow() {
    let text = read("two_records.info");
    let n = normalise("two_records.info", &text).expect("normalises");
    // DA:1 is u32::MAX in both records: each is lowered so the merged sum fits in u32.
    assert_eq!(n.clamped_counts, 2);
    assert!(n.text.contains(&format!("DA:1,{}\n", u32::MAX / 2)));
    let s = summary_of(&["two_records.info"]);
    let m = s
        .files
        .iter()
        .find(|f| f.path == "/ws/core/src/m.rs")
        .expect("m.rs in the summary");
    // Lines 1..=5 across both records; hit: 1 (both), 3 (second), 5 (first).
    assert_eq!((m.counts.lines_found, m.counts.lines_hit), (5, 3));
    // f hit in the second record, g in the first: both hit once merged.
    assert_eq!((m.counts.functions_found, m.counts.functions_hit), (2, 2));
    assert_eq!(s.files.len(), 2, "one entry per source file after merging");
}

#[test]
fn the_same_file_given_twice_merges_across_inputs() {
    let s = summary_of(&["no_tn.info", "no_tn.info"]);
    assert_eq!(s.total.lines_found, 5);
    assert_eq!(s.total.lines_hit, 3);
}

#[test]
fn paths_map_to_workspace_folders_and_unknown_paths_to_other() {
    let m = map();
    assert_eq!(
        m.crate_of("/ws/mp_tests/ibv-testprov/src/lib.rs"),
        "mp_tests/ibv-testprov"
    );
    assert_eq!(m.crate_of("/ws/hal/src/lib.rs"), "hal");
    assert_eq!(m.crate_of("/ws/halo/src/lib.rs"), OTHER);
    assert_eq!(m.crate_of("./core/src/x.rs"), "core");
    assert_eq!(m.crate_of("/elsewhere/core/src/x.rs"), OTHER);

    let s = summary_of(&["workspace.info"]);
    let pair = |name: &str| {
        let c = s.crates[name];
        (c.lines_found, c.lines_hit)
    };
    assert_eq!(pair("core"), (4, 3));
    assert_eq!(pair("hal"), (5, 1));
    assert_eq!(pair("mp_tests/ibv-testprov"), (2, 0));
    assert_eq!(pair("framework"), (1, 1));
    assert_eq!(
        pair(OTHER),
        (2, 1),
        "kernels/ (no member) and the registry path"
    );
    assert_eq!((s.total.lines_found, s.total.lines_hit), (14, 6));
}

#[test]
fn table_has_a_row_per_crate_and_a_total() {
    let s = summary_of(&["workspace.info"]);
    let expected: Vec<String> = vec!["core".into(), "hal".into(), "mp_tests".into()];
    let table = format_table(&s, &expected);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("crate"));
    let row = |name: &str| {
        lines
            .iter()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("no row for {name} in\n{table}"))
    };
    assert_eq!(row("core")[1..4], ["4", "3", "75.00%"]);
    assert_eq!(row("hal")[1..4], ["5", "1", "20.00%"]);
    assert_eq!(
        row("mp_tests")[1..4],
        ["0", "0", "-"],
        "expected crates show even when absent"
    );
    assert_eq!(row("TOTAL")[1..4], ["14", "6", "42.86%"]);
    assert_eq!(lines.last().map(|l| l.starts_with("TOTAL")), Some(true));
    // Aligned: every row with cells has the same width as the header rule.
    let width = lines[1].len();
    assert!(lines.iter().all(|l| l.len() <= width));
    assert_eq!(row("TOTAL").len(), 7);
}

#[test]
fn gate_fails_naming_the_crate_under_threshold_and_by_how_much() {
    let s = summary_of(&["workspace.info"]);
    let t = thresholds(
        r#"{ "overall_line_percent": 40,
             "crates": { "core": { "line_percent": 70 }, "hal": { "line_percent": 25 } } }"#,
    );
    let failures = gate(&s, &t);
    assert_eq!(failures.len(), 1, "{failures:?}");
    let f = &failures[0];
    assert_eq!(f.scope, "hal");
    assert_eq!(f.metric, Metric::Lines);
    let message = f.to_string();
    assert!(
        message.contains("hal: line coverage 20.00% (1/5 lines)"),
        "{message}"
    );
    assert!(
        message.contains("threshold 25.00% by 5.00 points"),
        "{message}"
    );
}

#[test]
fn gate_fails_on_overall_and_function_thresholds() {
    let s = summary_of(&["no_tn.info"]);
    // Lines 3/5 = 60 %, functions 1/2 = 50 %.
    let t = thresholds(r#"{ "overall_line_percent": 61, "overall_function_percent": 50.5 }"#);
    let failures = gate(&s, &t);
    let scopes: Vec<(String, Metric)> = failures
        .iter()
        .map(|f| (f.scope.clone(), f.metric))
        .collect();
    assert_eq!(
        scopes,
        vec![
            ("overall".to_string(), Metric::Lines),
            ("overall".to_string(), Metric::Functions)
        ]
    );
    assert!(failures[1].to_string().contains("function coverage 50.00%"));
}

#[test]
fn gate_passes_when_all_thresholds_are_met_exactly_or_above() {
    let s = summary_of(&["workspace.info"]);
    let t = thresholds(
        r#"{ "note": "test", "overall_line_percent": 42.8,
             "crates": { "core": { "line_percent": 75 }, "hal": { "line_percent": 20 },
                         "framework": { "line_percent": 100 } } }"#,
    );
    assert_eq!(gate(&s, &t), vec![]);
}

#[test]
fn empty_file_gives_an_empty_summary_and_fails_a_nonzero_gate() {
    let n = normalise("empty.info", "").expect("empty is valid");
    assert_eq!(n, Default::default());
    let s = summary_of(&["empty.info"]);
    assert_eq!(s.total, Counts::default());
    assert!(s.crates.is_empty());
    assert!(format_table(&s, &[]).contains("TOTAL"));

    let zero =
        thresholds(r#"{ "overall_line_percent": 0, "crates": { "core": { "line_percent": 0 } } }"#);
    assert!(gate(&s, &zero).is_empty(), "0 % thresholds pass on nothing");
    let some =
        thresholds(r#"{ "overall_line_percent": 1, "crates": { "core": { "line_percent": 5 } } }"#);
    let failures = gate(&s, &some);
    assert_eq!(failures.len(), 2);
    assert_eq!(failures[0].actual, None);
    assert!(failures[1]
        .to_string()
        .contains("core: no lines in the report"));
}

#[test]
fn unknown_record_kinds_are_dropped_and_reported() {
    let n = normalise("unknown_kinds.info", &read("unknown_kinds.info")).expect("normalises");
    assert_eq!(
        n.dropped_lines,
        vec![(2, "VER:2".to_string()), (4, "FNL:0,1,2".to_string())]
    );
    assert!(!n.text.contains("VER"));
    let s = summary_of(&["unknown_kinds.info"]);
    assert_eq!(s.total.lines_hit, 1);
}

#[test]
fn malformed_files_are_errors_naming_the_line() {
    let err = normalise("da_outside_record.info", &read("da_outside_record.info"))
        .expect_err("DA before SF");
    match &err {
        CoverageError::Lcov { line, message, .. } => {
            assert_eq!(*line, 2);
            assert!(message.contains("expected SF:"), "{message}");
        }
        other => panic!("unexpected error {other}"),
    }
    let err = normalise("truncated.info", &read("truncated.info")).expect_err("no end_of_record");
    assert!(err.to_string().contains("expected end_of_record"), "{err}");
    let err = normalise("x", "TN:\nSF:a\nDA:99999999999,1\nend_of_record\n").expect_err("line");
    assert!(
        err.to_string()
            .starts_with("x:3: expected a line number after DA: at most"),
        "{err}"
    );
    let err = normalise("x", "TN:\nSF:a\nDA:1,-3\nend_of_record\n").expect_err("negative");
    assert!(
        err.to_string().contains("expected an execution count"),
        "{err}"
    );
}

#[test]
fn thresholds_reject_unknown_crates_fields_and_bad_percents() {
    let known = members();
    let bad_crate = Thresholds::parse(
        "t.json",
        r#"{ "overall_line_percent": 1, "crates": { "cor": { "line_percent": 1 } } }"#,
        &known,
    );
    assert!(bad_crate
        .expect_err("typo")
        .to_string()
        .contains("\"cor\" is not a workspace folder"));
    let bad_field = Thresholds::parse("t.json", r#"{ "overall_lines_percent": 1 }"#, &known);
    assert!(bad_field.is_err());
    let bad_value = Thresholds::parse("t.json", r#"{ "overall_line_percent": 120 }"#, &known);
    assert!(bad_value
        .expect_err("out of range")
        .to_string()
        .contains("from 0 to 100, found 120"));
}

#[test]
fn checked_in_thresholds_parse_against_the_workspace_folders() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("thresholds.json");
    let text = std::fs::read_to_string(&path).expect("thresholds.json is checked in");
    let t = Thresholds::parse("thresholds.json", &text, &members()).expect("valid");
    assert!(
        t.note.is_some(),
        "the config says where its numbers come from"
    );
}

#[test]
fn show_env_lines_are_unquoted() {
    let text = "export LLVM_PROFILE_FILE='/t/main-%p-%2m.profraw'\n\
                export FLAGS='-C\u{1f}instrument-coverage'\n\
                export PLAIN=1\n\
                export Q='it'\\''s'\n\
                export D=\"a \\\"b\\\"\"\n\
                info: not an export line\n";
    let vars = parse_show_env(text).expect("parses");
    let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("LLVM_PROFILE_FILE"), Some("/t/main-%p-%2m.profraw"));
    assert_eq!(get("FLAGS"), Some("-C\u{1f}instrument-coverage"));
    assert_eq!(get("PLAIN"), Some("1"));
    assert_eq!(get("Q"), Some("it's"));
    assert_eq!(get("D"), Some("a \"b\""));
    assert_eq!(vars.len(), 5);
    assert!(parse_show_env("export X='open\n").is_err());
}

#[test]
fn profile_pattern_gets_a_pid_when_missing() {
    assert_eq!(
        per_process_profile_pattern("/t/a-%p-%m.profraw"),
        "/t/a-%p-%m.profraw"
    );
    assert_eq!(
        per_process_profile_pattern("/t/a-%m.profraw"),
        "/t/a-%m-%p.profraw"
    );
    assert_eq!(per_process_profile_pattern("/t/a"), "/t/a-%p");
}

#[test]
fn ignore_regex_names_the_excluded_parts() {
    let r = mscclpp_coverage::ignore::default_ignore_regex(std::path::Path::new("/w.s/main"));
    assert!(r.contains("^/w\\.s/main/("), "{r}");
    for part in [
        "coverage",
        "mp_tests/ibv-testprov",
        "mp_tests",
        "(tests|examples|benches)/",
        "/out/",
    ] {
        assert!(r.contains(part), "{part} missing from {r}");
    }
}

#[test]
fn crate_map_from_cargo_metadata() {
    let json = r#"{ "workspace_root": "/ws", "target_directory": "/ws/target",
        "packages": [ { "manifest_path": "/ws/hal/Cargo.toml" },
                      { "manifest_path": "/ws/mp_tests/ibv-testprov/Cargo.toml" },
                      { "manifest_path": "/ws/core/Cargo.toml" } ] }"#;
    let m = CrateMap::from_cargo_metadata(json).expect("parses");
    assert_eq!(m.folders()[0], "mp_tests/ibv-testprov");
    assert_eq!(
        m.crate_of("/ws/mp_tests/ibv-testprov/src/a.rs"),
        "mp_tests/ibv-testprov"
    );
    assert_eq!(m.crate_of("/ws/core/src/a.rs"), "core");
    assert!(CrateMap::from_cargo_metadata(r#"{ "packages": [] }"#).is_err());
    let outside =
        r#"{ "workspace_root": "/ws", "packages": [ { "manifest_path": "/x/Cargo.toml" } ] }"#;
    assert!(CrateMap::from_cargo_metadata(outside).is_err());
}
