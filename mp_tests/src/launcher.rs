//! Where a rank comes from: the launcher's environment (Open MPI, MPICH/Hydra, Slurm,
//! torchrun) or our own `--np N` self-launch (`spawn.rs`), and the command-line options that
//! `mp_unit_tests` adds to the framework's.

use std::time::Duration;

/// Rank placement as the launcher describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    pub local_size: usize,
    /// Which launcher's variables were read (for messages).
    pub source: &'static str,
}

impl Placement {
    /// Rank 0 of 1: a process that no launcher started.
    pub fn single_process() -> Placement {
        Placement {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
            source: "single process",
        }
    }
}

/// The variables of each launcher, in the order they are tried:
/// (name, rank, size, local rank, local size).
pub(crate) const LAUNCHERS: &[(&str, &str, &str, &str, &str)] = &[
    (
        "Open MPI",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    (
        "MPICH/Hydra",
        "PMI_RANK",
        "PMI_SIZE",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
    ),
    (
        "Slurm",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "SLURM_NTASKS_PER_NODE",
    ),
    (
        "torchrun",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
    ),
];

fn parse_var(
    lookup: &dyn Fn(&str) -> Option<String>,
    name: &str,
    launcher: &str,
) -> Result<Option<usize>, String> {
    match lookup(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| format!("{launcher}: {name}={v:?} is not a non-negative integer")),
    }
}

/// Reads the placement from a variable lookup. `Ok(None)` when no launcher is detected.
pub fn detect_placement(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Placement>, String> {
    for &(source, r, s, lr, ls) in LAUNCHERS {
        let (Some(rank), Some(size)) =
            (parse_var(lookup, r, source)?, parse_var(lookup, s, source)?)
        else {
            continue;
        };
        if size == 0 || rank >= size {
            return Err(format!(
                "{source}: rank {rank} ({r}) must be below the world size {size} ({s})"
            ));
        }
        // Slurm gives tasks-per-node as e.g. "4(x2)"; take the leading number.
        let local_size = match lookup(ls) {
            Some(v) => {
                let digits: String = v
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_digit())
                    .collect();
                digits.parse::<usize>().ok()
            }
            None => None,
        };
        let local_rank = parse_var(lookup, lr, source)?;
        let (local_rank, local_size) = match (local_rank, local_size) {
            (Some(a), Some(b)) if a < b => (a, b),
            (Some(a), None) => (a, size),
            _ => (rank, size),
        };
        return Ok(Some(Placement {
            rank,
            size,
            local_rank,
            local_size,
            source,
        }));
    }
    Ok(None)
}

/// Options `mp_unit_tests` handles itself; the rest go to the framework.
#[derive(Debug, Clone, PartialEq)]
pub struct MpOptions {
    /// `--ip_port` as given (checked by the library's address parser), `None` when not given.
    pub ip_port: Option<String>,
    pub np: Option<usize>,
    pub ib_gid_index: Option<u32>,
    pub timeout: Duration,
    /// Arguments left for the test framework.
    pub rest: Vec<String>,
}

/// The rendezvous port used when `--ip_port` is not given: below Linux's ephemeral range
/// (32768-60999 by default, where the kernel hands out the local ports of outgoing
/// connections, so a default there can find its port taken by someone's connection) and
/// above the well-known ports.
pub const DEFAULT_PORT: u16 = 29053;
/// The rendezvous address used when `--ip_port` is not given (and the world is larger than
/// one rank, which needs no agreed port).
pub fn default_ip_port() -> String {
    format!("127.0.0.1:{DEFAULT_PORT}")
}
/// The default `--timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest `--timeout` accepted (one day): every wait adds to it, so it must not overflow.
pub const MAX_TIMEOUT_SECS: u64 = 86_400;

/// [`parse_options`] of this process's arguments; on an error, prints it after `prog: ` with
/// `usage` and gives the exit status for bad arguments (2).
pub fn options_of_this_process(prog: &str, usage: &str) -> Result<MpOptions, i32> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    parse_options(&args).map_err(|e| {
        eprintln!("{prog}: {e}\n{usage}");
        2
    })
}

/// [`detect_placement`] from this process's environment; on an error, prints it after
/// `prog: ` and gives the exit status for bad arguments (2).
pub fn placement_of_this_process(prog: &str) -> Result<Option<Placement>, i32> {
    detect_placement(&|k| std::env::var(k).ok()).map_err(|e| {
        eprintln!("{prog}: {e}");
        2
    })
}

/// Splits our own options from the framework's. Both `--opt=value` and `--opt value`.
/// Every malformed value is an error naming the option, what came and what was expected
/// (`mp_unit_tests` exits 2 on it before starting anything).
pub fn parse_options(args: &[String]) -> Result<MpOptions, String> {
    let mut out = MpOptions {
        ip_port: None,
        np: None,
        ib_gid_index: None,
        timeout: DEFAULT_TIMEOUT,
        rest: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let (key, inline) = match arg.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let ours = matches!(
            key.as_str(),
            "--ip_port" | "--np" | "--ib_gid_index" | "--timeout"
        );
        if !ours {
            out.rest.push(arg.clone());
            i += 1;
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => {
                i += 1;
                args.get(i)
                    .cloned()
                    .ok_or_else(|| format!("{key} needs a value"))?
            }
        };
        match key.as_str() {
            "--ip_port" => {
                // The library's own parser: what it would refuse at bootstrap is refused here.
                if let Err(e) = mscclpp::InitAddr::parse(&value) {
                    return Err(format!("--ip_port={value}: {e}"));
                }
                out.ip_port = Some(value);
            }
            "--np" => {
                let n: usize = value
                    .parse()
                    .map_err(|_| format!("--np={value}: expected a positive integer"))?;
                if n == 0 {
                    return Err("--np=0: expected a positive integer".into());
                }
                out.np = Some(n);
            }
            "--ib_gid_index" => {
                out.ib_gid_index = Some(value.parse().map_err(|_| {
                    format!("--ib_gid_index={value}: expected a non-negative integer")
                })?);
            }
            "--timeout" => {
                let secs = value
                    .parse::<u64>()
                    .ok()
                    .filter(|s| (1..=MAX_TIMEOUT_SECS).contains(s))
                    .ok_or_else(|| {
                        format!(
                            "--timeout={value}: expected a whole number of seconds from 1 to \
                             {MAX_TIMEOUT_SECS}"
                        )
                    })?;
                out.timeout = Duration::from_secs(secs);
            }
            _ => unreachable!("matched above"),
        }
        i += 1;
    }
    Ok(out)
}

/// A free loopback port, for self-launch when the user did not choose one.
pub fn free_loopback_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("could not reserve a loopback port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("could not read the reserved port: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| map.get(k).cloned()
    }

    #[test]
    fn detects_each_launcher() {
        let ompi = env_of(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]);
        let p = detect_placement(&ompi).unwrap().unwrap();
        assert_eq!((p.rank, p.size, p.local_rank, p.local_size), (2, 4, 0, 2));
        assert_eq!(p.source, "Open MPI");

        let slurm = env_of(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "4(x2)"),
        ]);
        let p = detect_placement(&slurm).unwrap().unwrap();
        assert_eq!((p.rank, p.size, p.local_rank, p.local_size), (5, 8, 1, 4));

        let torch = env_of(&[("RANK", "1"), ("WORLD_SIZE", "2")]);
        let p = detect_placement(&torch).unwrap().unwrap();
        assert_eq!((p.rank, p.size, p.local_rank, p.local_size), (1, 2, 1, 2));
        assert_eq!(p.source, "torchrun");

        let pmi = env_of(&[("PMI_RANK", "0"), ("PMI_SIZE", "3")]);
        assert_eq!(
            detect_placement(&pmi).unwrap().unwrap().source,
            "MPICH/Hydra"
        );

        assert_eq!(detect_placement(&env_of(&[])).unwrap(), None);
    }

    #[test]
    fn rejects_bad_launcher_values() {
        let bad = env_of(&[("OMPI_COMM_WORLD_RANK", "x"), ("OMPI_COMM_WORLD_SIZE", "4")]);
        let e = detect_placement(&bad).unwrap_err();
        assert!(e.contains("OMPI_COMM_WORLD_RANK"), "{e}");
        let out_of_range = env_of(&[("RANK", "4"), ("WORLD_SIZE", "4")]);
        assert!(detect_placement(&out_of_range)
            .unwrap_err()
            .contains("below"));
    }

    #[test]
    fn splits_options() {
        let args: Vec<String> = [
            "--filter=Bootstrap",
            "--ip_port",
            "10.0.0.1:1234",
            "--np=3",
            "--ib_gid_index=3",
            "--exclude-perf-tests",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let o = parse_options(&args).unwrap();
        assert_eq!(o.ip_port.as_deref(), Some("10.0.0.1:1234"));
        assert_eq!(o.np, Some(3));
        assert_eq!(o.ib_gid_index, Some(3));
        assert_eq!(o.rest, vec!["--filter=Bootstrap", "--exclude-perf-tests"]);
        assert!(parse_options(&["--np=0".to_string()]).is_err());
        assert!(parse_options(&["--np".to_string()]).is_err());
        assert!(parse_options(&["--ip_port=nocolon".to_string()]).is_err());
        assert!(parse_options(&["--ib_gid_index=-1".to_string()]).is_err());
    }

    #[test]
    fn bad_values_are_errors_naming_the_option() {
        for (arg, want) in [
            (
                "--timeout=0",
                "--timeout=0: expected a whole number of seconds from 1 to",
            ),
            ("--timeout=-1", "--timeout=-1: expected"),
            ("--timeout=1.5", "--timeout=1.5: expected"),
            ("--timeout=86401", "--timeout=86401: expected"),
            ("--ip_port=1.2.3.4:99999", "--ip_port=1.2.3.4:99999: "),
            ("--ip_port=1.2.3.4:0", "--ip_port=1.2.3.4:0: "),
            ("--ip_port=:", "--ip_port=:: "),
            ("--ip_port=999.1.1.1:5", "--ip_port=999.1.1.1:5: "),
            ("--np=-2", "--np=-2: expected a positive integer"),
        ] {
            let e = parse_options(&[arg.to_string()]).expect_err(arg);
            assert!(e.starts_with(want), "{arg}: {e}");
        }
        let o = parse_options(&["--timeout=1".to_string()]).unwrap();
        assert_eq!(o.timeout, Duration::from_secs(1));
        assert_eq!(parse_options(&[]).unwrap().ip_port, None);
        assert_eq!(parse_options(&[]).unwrap().timeout, DEFAULT_TIMEOUT);
        assert_eq!(default_ip_port(), "127.0.0.1:29053");
    }

    #[test]
    fn default_port_is_outside_the_ephemeral_range() {
        // Linux hands out 32768-60999 by default; ports below 1024 are well-known.
        assert!((1024..32768).contains(&DEFAULT_PORT), "{DEFAULT_PORT}");
        // Where this machine says otherwise, the default must be outside its range too.
        if let Ok(r) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") {
            let v: Vec<u16> = r
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            if let [lo, hi] = v[..] {
                assert!(
                    !(lo..=hi).contains(&DEFAULT_PORT),
                    "{DEFAULT_PORT} in {lo}-{hi}"
                );
            }
        }
    }
}
