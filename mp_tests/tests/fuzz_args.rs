//! Property-based fuzzing (proptest, stable Rust) of `mp_unit_tests`' own argument parser
//! (`--ip_port`, `--np`, `--ib_gid_index`, `--timeout`; the rest goes to the framework). Each
//! case: no panic, and either `Ok` whose options, written back as arguments, parse to the
//! same options, or an `Err` naming the option and what was expected.
//!
//! Budget: `MSCCLPP_FUZZ_CASES` cases (default 256, what CI runs). Long mode:
//! `MSCCLPP_FUZZ_CASES=1000000 cargo test --release -p mp_tests --test fuzz_args`.

// The parser lives in the binary; compile its module here. Only the parser is used.
#[allow(dead_code)] // the binary's module: only its parser is used here
#[path = "../src/launcher.rs"]
mod launcher;

use launcher::{parse_options, MpOptions};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: mscclpp_framework::fuzz_cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn to_args(o: &MpOptions) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(a) = &o.ip_port {
        out.push(format!("--ip_port={a}"));
    }
    if let Some(n) = o.np {
        out.push(format!("--np={n}"));
    }
    if let Some(g) = o.ib_gid_index {
        out.push(format!("--ib_gid_index={g}"));
    }
    out.push(format!("--timeout={}", o.timeout.as_secs()));
    out.extend(o.rest.iter().cloned());
    out
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "0",
            "1",
            "-1",
            "60",
            "86400",
            "86401",
            "1.5",
            "",
            "x",
            "127.0.0.1:1",
            "127.0.0.1:0",
            "1.2.3.4:99999",
            "[::1]:5",
            "lo:127.0.0.1:29053",
            "nocolon",
            "18446744073709551616",
        ])
        .prop_map(str::to_string),
        any::<u64>().prop_map(|n| n.to_string()),
        "[0-9.:a-z\\[\\]-]{0,16}",
    ]
}

fn arg() -> impl Strategy<Value = Vec<String>> {
    let key = prop::sample::select(vec![
        "--ip_port",
        "--np",
        "--ib_gid_index",
        "--timeout",
        "--filter",
        "--list",
        "--np=",
    ]);
    prop_oneof![
        (key.clone(), value()).prop_map(|(k, v)| vec![format!("{k}={v}")]),
        (key.clone(), value()).prop_map(|(k, v)| vec![k.to_string(), v]),
        key.prop_map(|k| vec![k.to_string()]),
        "\\PC{0,10}".prop_map(|s| vec![s]),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn mp_unit_tests_arguments(parts in proptest::collection::vec(arg(), 0..5)) {
        let args: Vec<String> = parts.into_iter().flatten().collect();
        match parse_options(&args) {
            Ok(o) => {
                prop_assert!(o.np != Some(0));
                prop_assert!((1..=launcher::MAX_TIMEOUT_SECS).contains(&o.timeout.as_secs()));
                if let Some(a) = &o.ip_port {
                    prop_assert!(mscclpp::InitAddr::parse(a).is_ok(), "{}", a);
                }
                let again = parse_options(&to_args(&o));
                prop_assert_eq!(again.as_ref(), Ok(&o), "{:?}", args);
            }
            Err(e) => {
                let named = ["--ip_port", "--np", "--ib_gid_index", "--timeout"]
                    .iter()
                    .any(|k| e.starts_with(k));
                prop_assert!(named, "{:?}: error names no option: {}", args, e);
                prop_assert!(e.contains("expected") || e.contains("needs a value") || e.contains("does not exist"), "{:?}: {}", args, e);
            }
        }
    }
}
