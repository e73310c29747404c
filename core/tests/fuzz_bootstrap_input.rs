//! Property-based fuzzing (proptest, stable Rust) of what a user or a peer hands the bootstrap
//! and the environment: `UniqueId` bytes, the `ip:port` / `ifname:ip:port` address parser and
//! every `MSCCLPP_*` value parser. Each target: no panic, and either `Ok` with round-trip
//! equality or an `Err` naming what was expected.
//!
//! Budget: `MSCCLPP_FUZZ_CASES` cases per target (default 256, what CI runs). Long mode, at
//! least a million cases per target:
//! `MSCCLPP_FUZZ_CASES=1000000 cargo test --release -p mscclpp --test fuzz_bootstrap_input`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use mscclpp::env::Env;
use mscclpp::{InitAddr, UniqueId};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: mscclpp_framework::fuzz_cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// 64-bit FNV-1a as the id format documents it (checksum of bytes 0..120).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn socket_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port)),
        (any::<[u8; 16]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)),
    ]
}

/// A valid id's bytes with a few bytes overwritten; `resum` recomputes the checksum so the
/// parser's deeper checks (family, reserved bytes, port) are reached.
fn mutated_id() -> impl Strategy<Value = Vec<u8>> {
    (
        socket_addr(),
        any::<u64>(),
        proptest::collection::vec((0usize..128, any::<u8>()), 0..4),
        any::<bool>(),
    )
        .prop_map(|(addr, nonce, edits, resum)| {
            let mut b = match UniqueId::new(addr, nonce) {
                Ok(id) => id.to_bytes().to_vec(),
                Err(_) => vec![0u8; 128],
            };
            for (at, v) in edits {
                b[at] = v;
            }
            if resum {
                let sum = fnv1a(&b[..120]);
                b[120..].copy_from_slice(&sum.to_le_bytes());
            }
            b
        })
}

fn check_unique_id(bytes: &[u8]) -> Result<(), TestCaseError> {
    match UniqueId::from_bytes(bytes) {
        Ok(id) => {
            prop_assert_eq!(&id.to_bytes()[..], bytes, "accepted bytes must round-trip");
            let again = UniqueId::new(id.root_addr(), id.nonce());
            prop_assert_eq!(
                again.map(|i| i.to_bytes().to_vec()).ok(),
                Some(bytes.to_vec())
            );
        }
        Err(e) => {
            let m = e.to_string();
            prop_assert!(
                m.contains("UniqueId::from_bytes:") && m.contains("expected"),
                "{}",
                m
            );
        }
    }
    Ok(())
}

/// Address strings near the accepted forms: optional interface, IPv4/IPv6 (bracketed or not),
/// optional scope, a port from a wide range, stray characters.
fn addr_like() -> impl Strategy<Value = String> {
    let ip = prop_oneof![
        any::<[u8; 4]>().prop_map(|o| Ipv4Addr::from(o).to_string()),
        any::<[u8; 16]>().prop_map(|o| format!("[{}]", Ipv6Addr::from(o))),
        any::<[u8; 16]>().prop_map(|o| Ipv6Addr::from(o).to_string()),
        Just("fe80::1".to_string()),
        Just("[fe80::1%1]".to_string()),
        "[0-9.:a-f\\[\\]%]{0,24}",
    ];
    let ifname = prop_oneof![
        Just(String::new()),
        Just("lo:".to_string()),
        "[a-z0-9]{1,6}:",
        "[a-z:\\[]{0,4}",
    ];
    let port = prop_oneof![
        (0u32..70_000).prop_map(|p| p.to_string()),
        "[0-9a-z+-]{0,7}",
    ];
    (ifname, ip, port, "[ \t:]{0,2}").prop_map(|(i, a, p, junk)| format!("{i}{a}:{p}{junk}"))
}

fn check_addr(s: &str) -> Result<(), TestCaseError> {
    match InitAddr::parse(s) {
        Ok(InitAddr::Addr { ifname, addr }) => {
            prop_assert!(addr.port() != 0, "{}: port 0 accepted", s);
            // Printed back, the address parses to the same value.
            let text = match &ifname {
                Some(n) => format!("{n}:{addr}"),
                None => addr.to_string(),
            };
            match InitAddr::parse(&text) {
                Ok(InitAddr::Addr {
                    ifname: i2,
                    addr: a2,
                }) => {
                    prop_assert_eq!(i2, ifname, "{} -> {}", s, text);
                    prop_assert_eq!(a2, addr, "{} -> {}", s, text);
                }
                other => prop_assert!(false, "{} -> {} reparsed as {:?}", s, text, other),
            }
        }
        Ok(InitAddr::Id(_)) => prop_assert!(false, "{}: a string parsed as a UniqueId", s),
        Err(e) => {
            // What was expected, or (an interface name that is well-formed but absent here)
            // which part of the input is not there.
            let m = e.to_string();
            prop_assert!(
                m.contains("expected") || m.contains("does not exist"),
                "{}: {}",
                s,
                m
            );
        }
    }
    Ok(())
}

/// The variables `Env` types, with the accessor that reports a malformed value.
type Accessor = fn(&Env) -> Option<String>;
/// `name => method`: `name` read through `Env::method`, its error as text.
macro_rules! accessors {
    ($($name:literal => $method:ident),+ $(,)?) => {
        &[$(($name, |e: &Env| e.$method().err().map(|e| e.to_string()))),+]
    };
}
const TYPED: &[(&str, Accessor)] = accessors![
    "MSCCLPP_LOG_LEVEL" => log_level,
    "MSCCLPP_DEBUG" => log_level,
    "MSCCLPP_IBV_MODE" => ibv_mode,
    "MSCCLPP_IB_GID_INDEX" => ib_gid_index,
    "MSCCLPP_SOCKET_FAMILY" => socket_family,
    "MSCCLPP_FORCE_DISABLE_NVLS" => force_disable_nvls,
    "NCCL_NVLS_ENABLE" => force_disable_nvls,
    "MSCCLPP_FORCE_DISABLE_GDR" => force_disable_gdr,
    "MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM" => cudaipc_use_default_stream,
    "MSCCLPP_CACHE_DIR" => cache_dir,
];

/// Values near the documented ones plus arbitrary text.
fn env_value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            "0",
            "1",
            "2",
            "-1",
            "true",
            "FALSE",
            "yes",
            "no",
            "on",
            "off",
            "maybe",
            "host",
            "host-no-atomic",
            "AF_INET",
            "AF_INET6",
            "af_unix",
            "WARN",
            "info",
            "TRACE",
            "7",
            " 1 ",
            "4294967295",
            "4294967296",
            "/tmp/x",
        ])
        .prop_map(str::to_string),
        "\\PC{0,12}",
        any::<u64>().prop_map(|n| n.to_string()),
    ]
}

fn check_env(name: &str, value: &str, accessor: Accessor) -> Result<(), TestCaseError> {
    let env = Env::from_lookup(|k| (k == name).then(|| value.to_string()));
    // Every accessor answers (none panics), whatever the one variable set holds.
    for (_, a) in TYPED {
        let _ = a(&env);
    }
    let _ = (
        env.log_subsys(),
        env.log_file(),
        env.hca_devices(),
        env.ibv_so(),
    );
    let _ = (env.hostid(), env.socket_ifname(), env.nccl_lib_path());
    if let Some(m) = accessor(&env) {
        prop_assert!(
            m.contains(name),
            "{}={:?}: error does not name it: {}",
            name,
            value,
            m
        );
        prop_assert!(m.contains("expected"), "{}={:?}: {}", name, value, m);
    }
    // One parser for the NVLS switches: Env and the HAL agree.
    if name.contains("NVLS") {
        let hal = mscclpp_hal::parse_nvls_switches(|k| (k == name).then(|| value.to_string()));
        match env.force_disable_nvls() {
            Ok(b) => prop_assert_eq!(Ok(b), hal),
            Err(_) => prop_assert!(hal.is_err()),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn unique_id_from_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
        check_unique_id(&bytes)?;
    }

    #[test]
    fn unique_id_from_mutated_ids(bytes in mutated_id()) {
        check_unique_id(&bytes)?;
    }

    #[test]
    fn address_parser_on_near_addresses(s in addr_like()) {
        check_addr(&s)?;
    }

    #[test]
    fn address_parser_on_any_text(s in "\\PC{0,40}") {
        check_addr(&s)?;
    }

    #[test]
    fn env_value_parsers(var in prop::sample::select(TYPED), value in env_value()) {
        check_env(var.0, &value, var.1)?;
    }
}
