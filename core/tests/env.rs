//! Env parsing through `Env::from_lookup`: defaults, every typed value, and malformed values
//! that come back as errors naming the variable and what was expected.

use mscclpp::env::{Env, IbvMode, LogLevel, SocketFamily};
use mscclpp::ErrorCode;
use std::collections::HashMap;
use std::path::Path;

fn env_of(vars: &[(&str, &str)]) -> Env {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Env::from_lookup(|name| map.get(name).cloned())
}

#[test]
fn defaults() {
    let e = env_of(&[("HOME", "/home/u")]);
    assert_eq!(e.log_level().expect("level"), LogLevel::Warn);
    assert_eq!(e.ibv_mode().expect("mode"), IbvMode::Host);
    assert_eq!(e.ib_gid_index().expect("gid"), 0);
    assert_eq!(e.socket_family().expect("family"), None);
    assert!(!e.force_disable_nvls().expect("nvls"));
    assert!(!e.force_disable_gdr().expect("gdr"));
    assert!(!e.cudaipc_use_default_stream().expect("stream"));
    assert!(e.hca_devices().is_empty());
    assert_eq!(e.ibv_so(), None);
    assert_eq!(e.hostid(), None);
    assert_eq!(e.socket_ifname(), None);
    assert_eq!(e.nccl_lib_path(), None);
    assert_eq!(e.log_file(), None);
    assert_eq!(e.log_subsys(), None);
    assert_eq!(
        e.cache_dir().expect("cache"),
        Path::new("/home/u/.cache/mscclpp")
    );
}

#[test]
fn typed_values() {
    let e = env_of(&[
        ("MSCCLPP_DEBUG", "info"),
        ("MSCCLPP_LOG_SUBSYS", "INIT,NET"),
        ("MSCCLPP_LOG_FILE", "/tmp/log.%p"),
        ("MSCCLPP_HCA_DEVICES", "mlx5_0, mlx5_1,,mlx5_2"),
        ("MSCCLPP_IBV_SO", "/opt/libibverbs.so"),
        ("MSCCLPP_IBV_MODE", "Host-No-Atomic"),
        ("MSCCLPP_IB_GID_INDEX", "3"),
        ("MSCCLPP_HOSTID", "node7"),
        ("MSCCLPP_SOCKET_IFNAME", "eth0"),
        ("MSCCLPP_SOCKET_FAMILY", "af_inet6"),
        ("MSCCLPP_FORCE_DISABLE_NVLS", "1"),
        ("MSCCLPP_FORCE_DISABLE_GDR", "true"),
        ("MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM", "yes"),
        ("MSCCLPP_NCCL_LIB_PATH", "/usr/lib/libnccl.so.2"),
        ("MSCCLPP_CACHE_DIR", "/var/cache/m"),
    ]);
    assert_eq!(e.log_level().expect("level"), LogLevel::Info);
    assert_eq!(e.log_subsys(), Some("INIT,NET"));
    assert_eq!(e.log_file(), Some(Path::new("/tmp/log.%p")));
    assert_eq!(e.hca_devices(), ["mlx5_0", "mlx5_1", "mlx5_2"]);
    assert_eq!(e.ibv_so(), Some(Path::new("/opt/libibverbs.so")));
    assert_eq!(e.ibv_mode().expect("mode"), IbvMode::HostNoAtomic);
    assert_eq!(e.ib_gid_index().expect("gid"), 3);
    assert_eq!(e.hostid(), Some("node7"));
    assert_eq!(e.socket_ifname(), Some("eth0"));
    assert_eq!(
        e.socket_family().expect("family"),
        Some(SocketFamily::Inet6)
    );
    assert!(e.force_disable_nvls().expect("nvls"));
    assert!(e.force_disable_gdr().expect("gdr"));
    assert!(e.cudaipc_use_default_stream().expect("stream"));
    assert_eq!(e.nccl_lib_path(), Some(Path::new("/usr/lib/libnccl.so.2")));
    assert_eq!(e.cache_dir().expect("cache"), Path::new("/var/cache/m"));
    assert!(e.log_enabled(LogLevel::Info, "NET"));
    assert!(!e.log_enabled(LogLevel::Info, "COLL"));
    assert!(!e.log_enabled(LogLevel::Trace, "NET"));
}

#[test]
fn log_level_precedence_and_names() {
    let e = env_of(&[("MSCCLPP_DEBUG", "TRACE"), ("MSCCLPP_LOG_LEVEL", "none")]);
    assert_eq!(e.log_level().expect("level"), LogLevel::None);
    assert!(!e.log_enabled(LogLevel::Warn, "X"));
    for (s, l) in [
        ("NONE", LogLevel::None),
        ("version", LogLevel::Version),
        ("Warn", LogLevel::Warn),
        ("INFO", LogLevel::Info),
        ("abort", LogLevel::Abort),
        ("trace", LogLevel::Trace),
    ] {
        assert_eq!(env_of(&[("MSCCLPP_DEBUG", s)]).log_level().expect(s), l);
    }
    let e = env_of(&[("MSCCLPP_LOG_SUBSYS", "all")]);
    assert!(e.log_enabled(LogLevel::Warn, "ANY"));
}

#[test]
fn nccl_nvls_enable_zero_disables_nvls() {
    assert!(env_of(&[("NCCL_NVLS_ENABLE", "0")])
        .force_disable_nvls()
        .expect("nvls"));
    assert!(!env_of(&[("NCCL_NVLS_ENABLE", "1")])
        .force_disable_nvls()
        .expect("nvls"));
    assert!(!env_of(&[("MSCCLPP_FORCE_DISABLE_NVLS", "0")])
        .force_disable_nvls()
        .expect("nvls"));
}

#[test]
fn malformed_values_are_errors_naming_value_and_expectation() {
    type Getter = fn(&Env) -> Option<mscclpp::Error>;
    let cases: Vec<(&str, &str, Getter, &str)> = vec![
        (
            "MSCCLPP_IBV_MODE",
            "foo",
            |e| e.ibv_mode().err(),
            "MSCCLPP_IBV_MODE=foo: expected one of host, host-no-atomic",
        ),
        (
            "MSCCLPP_IB_GID_INDEX",
            "-1",
            |e| e.ib_gid_index().err(),
            "MSCCLPP_IB_GID_INDEX=-1: expected an integer >= 0",
        ),
        (
            "MSCCLPP_IB_GID_INDEX",
            "x",
            |e| e.ib_gid_index().err(),
            "MSCCLPP_IB_GID_INDEX=x",
        ),
        (
            "MSCCLPP_SOCKET_FAMILY",
            "AF_UNIX",
            |e| e.socket_family().err(),
            "MSCCLPP_SOCKET_FAMILY=AF_UNIX: expected one of AF_INET, AF_INET6",
        ),
        (
            "MSCCLPP_DEBUG",
            "LOUD",
            |e| e.log_level().err(),
            "MSCCLPP_DEBUG=LOUD: expected one of NONE, VERSION, WARN, INFO, ABORT, TRACE",
        ),
        (
            "MSCCLPP_LOG_LEVEL",
            "7",
            |e| e.log_level().err(),
            "MSCCLPP_LOG_LEVEL=7",
        ),
        (
            "MSCCLPP_FORCE_DISABLE_NVLS",
            "maybe",
            |e| e.force_disable_nvls().err(),
            "MSCCLPP_FORCE_DISABLE_NVLS=maybe: expected a boolean",
        ),
        (
            "MSCCLPP_FORCE_DISABLE_GDR",
            "2",
            |e| e.force_disable_gdr().err(),
            "MSCCLPP_FORCE_DISABLE_GDR=2",
        ),
        (
            "MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM",
            "on?",
            |e| e.cudaipc_use_default_stream().err(),
            "MSCCLPP_CUDAIPC_USE_DEFAULT_STREAM=on?",
        ),
    ];
    for (name, value, get, want) in cases {
        let e = env_of(&[(name, value), ("HOME", "/h")]);
        let err = get(&e).unwrap_or_else(|| panic!("{name}={value} must be rejected"));
        assert_eq!(err.code(), ErrorCode::InvalidUsage);
        assert!(err.to_string().contains(want), "{err} (wanted {want:?})");
        // A malformed value does not poison the others.
        assert!(e.cache_dir().is_ok());
    }
    let e = env_of(&[]);
    let err = e.cache_dir().expect_err("no HOME, no MSCCLPP_CACHE_DIR");
    assert!(err.to_string().contains("MSCCLPP_CACHE_DIR"), "{err}");
    // A malformed level still logs warnings.
    assert!(env_of(&[("MSCCLPP_DEBUG", "LOUD")]).log_enabled(LogLevel::Warn, "X"));
}

#[test]
fn process_env_is_read_once() {
    let a = mscclpp::env::env() as *const Env;
    let b = mscclpp::env::env() as *const Env;
    assert_eq!(a, b);
}

#[test]
fn nvls_switches_have_one_parser_that_fails_closed() {
    // Env and the HAL (which guards multicast creation) answer alike for every value, and a
    // value nobody documented is an error, never "NVLS allowed".
    for v in [
        "", "0", "1", "true", "FALSE", " yes ", "no", "on", "off", "maybe", "2", "-1", "disable",
    ] {
        for nccl in [None, Some("0"), Some("1"), Some("2"), Some("off")] {
            let mut pairs = vec![("MSCCLPP_FORCE_DISABLE_NVLS", v)];
            if let Some(n) = nccl {
                pairs.push(("NCCL_NVLS_ENABLE", n));
            }
            let env = env_of(&pairs);
            let hal = mscclpp_hal::parse_nvls_switches(|name| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, x)| x.to_string())
            });
            match (env.force_disable_nvls(), &hal) {
                (Ok(a), Ok(b)) => assert_eq!(a, *b, "{pairs:?}"),
                (Err(a), Err(b)) => assert!(a.to_string().contains(b.as_str()), "{a} / {b}"),
                (a, b) => panic!("{pairs:?}: env says {a:?}, the HAL {b:?}"),
            }
        }
    }
    let e = env_of(&[("MSCCLPP_FORCE_DISABLE_NVLS", "maybe")])
        .force_disable_nvls()
        .unwrap_err()
        .to_string();
    assert!(e.contains("NVLS stays disabled"), "{e}");
}
