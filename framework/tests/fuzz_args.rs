//! Property-based fuzzing (proptest, stable Rust) of the framework's parsers: the runner's
//! command line and the verdict wire format. Each target: no panic, and either `Ok` with
//! round-trip equality or an `Err` naming what was expected.
//!
//! Budget: `MSCCLPP_FUZZ_CASES` cases per target (default 256, what CI runs). Long mode:
//! `MSCCLPP_FUZZ_CASES=1000000 cargo test --release -p mscclpp-framework --test fuzz_args`.

use mscclpp_framework::{parse_args, Filter, Options, PerfSelection, Verdict};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: mscclpp_framework::fuzz_cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The command line that gives `o` back.
fn to_args(o: &Options) -> Vec<String> {
    let mut out = Vec::new();
    match &o.filter {
        Filter::All => {}
        // A first part starting with '-' needs a leading ',' to stay an include filter.
        Filter::Include(p) if p.first().is_some_and(|f| f.starts_with('-')) => {
            out.push(format!("--filter=,{}", p.join(",")))
        }
        Filter::Include(p) => out.push(format!("--filter={}", p.join(","))),
        Filter::Exclude(p) => out.push(format!("--filter=-{}", p.join(","))),
    }
    match o.perf {
        PerfSelection::Both => {}
        PerfSelection::ExcludePerf => out.push("--exclude-perf-tests".into()),
        PerfSelection::OnlyPerf => out.push("--only-perf-tests".into()),
    }
    if o.list {
        out.push("--list".into());
    }
    if o.help {
        out.push("--help".into());
    }
    out
}

fn arg() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "--filter",
            "--filter=",
            "--filter=-",
            "--exclude-perf-tests",
            "--only-perf-tests",
            "--list",
            "--help",
            "-h",
            "--",
            "-",
            "=",
        ])
        .prop_map(str::to_string),
        "--filter=[-,.A-Za-z]{0,10}",
        "[-,.=A-Za-z]{0,10}",
        "\\PC{0,8}",
    ]
}

fn verdict_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..24),
        (
            prop_oneof![Just(1u8), any::<u8>()],
            prop_oneof![0u8..3, any::<u8>()],
            "\\PC{0,6}",
            proptest::collection::vec(any::<u8>(), 0..3),
            any::<bool>(),
        )
            .prop_map(|(v, tag, reason, junk, honest)| {
                let mut body = reason.into_bytes();
                body.extend_from_slice(&junk);
                let len = if honest {
                    body.len() as u32
                } else {
                    body.len() as u32 ^ 1
                };
                let mut out = vec![v, tag];
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&body);
                out
            }),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn runner_arguments(args in proptest::collection::vec(arg(), 0..6)) {
        match parse_args(&args) {
            Ok(o) => {
                let again = parse_args(&to_args(&o));
                prop_assert_eq!(again.as_ref(), Ok(&o), "{:?} -> {:?}", args, to_args(&o));
            }
            Err(e) => prop_assert!(
                e.contains("expect") || e.contains("unknown argument") || e.contains("exclude each other"),
                "{:?}: {}", args, e
            ),
        }
    }

    #[test]
    fn verdict_from_bytes(bytes in verdict_bytes()) {
        match Verdict::from_bytes(&bytes) {
            Ok(v) => prop_assert_eq!(v.to_bytes(), bytes),
            Err(e) => prop_assert!(e.starts_with("verdict: ") && e.contains("expected"), "{}", e),
        }
    }
}
