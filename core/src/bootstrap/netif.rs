//! Network interface discovery (`getifaddrs`, through `nix`) and `MSCCLPP_SOCKET_IFNAME`
//! matching.

use crate::env::SocketFamily;
use crate::error::{Error, Result};
use nix::net::if_::InterfaceFlags;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};

/// One address of a network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// The address.
    pub addr: IpAddr,
    /// IPv6 scope id (interface index for link-local addresses), 0 otherwise.
    pub scope_id: u32,
    /// `IFF_UP`.
    pub up: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
}

/// Every IPv4/IPv6 address of every interface, in the order the kernel lists them.
pub fn list_interfaces() -> Result<Vec<Interface>> {
    let addrs =
        nix::ifaddrs::getifaddrs().map_err(|e| Error::io("getifaddrs", std::io::Error::from(e)))?;
    let mut out = Vec::new();
    for ifa in addrs {
        let Some(sa) = ifa.address else { continue };
        let (addr, scope_id) = if let Some(sin) = sa.as_sockaddr_in() {
            (IpAddr::V4(sin.ip()), 0)
        } else if let Some(sin6) = sa.as_sockaddr_in6() {
            (IpAddr::V6(sin6.ip()), sin6.scope_id())
        } else {
            continue;
        };
        out.push(Interface {
            name: ifa.interface_name,
            addr,
            scope_id,
            up: ifa.flags.contains(InterfaceFlags::IFF_UP),
            loopback: ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK),
        });
    }
    Ok(out)
}

/// The index of interface `name` (for IPv6 scope ids), or an error naming it.
pub fn interface_index(name: &str) -> Result<u32> {
    if name.contains('\0') {
        return Err(Error::invalid(format!(
            "interface name {name:?} contains a NUL byte"
        )));
    }
    match nix::net::if_::if_nametoindex(name) {
        Ok(idx) if idx != 0 => Ok(idx),
        _ => Err(Error::invalid(format!(
            "network interface {name:?} does not exist"
        ))),
    }
}

/// Whether interface `name` matches an NCCL-style `spec`: a comma list of name prefixes;
/// a leading `^` excludes the listed names, a leading `=` makes the match exact.
pub fn ifname_matches(spec: &str, name: &str) -> bool {
    let (exclude, rest) = match spec.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, spec),
    };
    let (exact, rest) = match rest.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let hit = rest
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .any(|p| {
            if exact {
                name == p
            } else {
                name.starts_with(p)
            }
        });
    hit != exclude
}

fn family_ok(addr: &IpAddr, family: Option<SocketFamily>) -> bool {
    match family {
        None => true,
        Some(SocketFamily::Inet) => addr.is_ipv4(),
        Some(SocketFamily::Inet6) => addr.is_ipv6(),
    }
}

/// Chooses the interface for bootstrap sockets from `candidates`: those matching `ifname`
/// (when given) and `family`; without `ifname`, the first up non-loopback interface, else the
/// loopback. IPv4 is preferred when no family is given.
pub fn choose_interface(
    candidates: &[Interface],
    ifname: Option<&str>,
    family: Option<SocketFamily>,
) -> Result<Interface> {
    let usable: Vec<&Interface> = candidates
        .iter()
        .filter(|i| i.up && family_ok(&i.addr, family))
        .filter(|i| ifname.is_none_or(|spec| ifname_matches(spec, &i.name)))
        .collect();
    let pick = |want_loopback: bool| {
        let of_kind = usable.iter().filter(|i| i.loopback == want_loopback);
        of_kind
            .clone()
            .find(|i| i.addr.is_ipv4())
            .or_else(|| of_kind.clone().next())
            .map(|i| (*i).clone())
    };
    pick(false).or_else(|| pick(true)).ok_or_else(|| {
        let names: Vec<String> = candidates
            .iter()
            .map(|i| format!("{}={}{}", i.name, i.addr, if i.up { "" } else { "(down)" }))
            .collect();
        Error::invalid(format!(
            "no usable network interface: MSCCLPP_SOCKET_IFNAME={} MSCCLPP_SOCKET_FAMILY={}; \
             expected an up interface matching them among [{}]",
            ifname.unwrap_or("(unset)"),
            match family {
                None => "(unset)",
                Some(SocketFamily::Inet) => "AF_INET",
                Some(SocketFamily::Inet6) => "AF_INET6",
            },
            names.join(", ")
        ))
    })
}

/// The interface for bootstrap sockets under this process's `MSCCLPP_SOCKET_IFNAME` and
/// `MSCCLPP_SOCKET_FAMILY`.
pub fn select_interface() -> Result<Interface> {
    let env = crate::env::env();
    let family = env.socket_family()?;
    choose_interface(&list_interfaces()?, env.socket_ifname(), family)
}

/// The address to bind on interface `i`, with an ephemeral port.
pub(crate) fn iface_bind_addr(i: &Interface) -> SocketAddr {
    match i.addr {
        IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, 0, 0, i.scope_id)),
        IpAddr::V4(_) => SocketAddr::new(i.addr, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: &str, up: bool, lo: bool) -> Interface {
        Interface {
            name: name.into(),
            addr: addr.parse().expect("test address"),
            scope_id: 0,
            up,
            loopback: lo,
        }
    }

    #[test]
    fn ifname_spec() {
        assert!(ifname_matches("eth", "eth0"));
        assert!(!ifname_matches("eth", "ib0"));
        assert!(ifname_matches("ib,eth", "eth1"));
        assert!(!ifname_matches("^eth", "eth1"));
        assert!(ifname_matches("^eth", "ib0"));
        assert!(!ifname_matches("=eth", "eth0"));
        assert!(ifname_matches("=eth0", "eth0"));
    }

    #[test]
    fn choose() {
        let list = vec![
            iface("lo", "127.0.0.1", true, true),
            iface("eth0", "fe80::1", true, false),
            iface("eth0", "10.0.0.2", true, false),
            iface("eth1", "10.0.1.2", false, false),
        ];
        assert_eq!(
            choose_interface(&list, None, None).expect("pick").addr,
            "10.0.0.2".parse::<IpAddr>().expect("ip")
        );
        assert_eq!(
            choose_interface(&list, None, Some(SocketFamily::Inet6))
                .expect("pick")
                .addr,
            "fe80::1".parse::<IpAddr>().expect("ip")
        );
        assert_eq!(
            choose_interface(&list, Some("lo"), None)
                .expect("pick")
                .name,
            "lo"
        );
        let err = choose_interface(&list, Some("eth1"), None).expect_err("eth1 is down");
        assert!(err.to_string().contains("eth1=10.0.1.2(down)"), "{err}");
        let only_lo = vec![iface("lo", "127.0.0.1", true, true)];
        assert_eq!(
            choose_interface(&only_lo, None, None).expect("pick").name,
            "lo"
        );
    }

    #[test]
    fn real_interfaces_include_loopback() {
        let list = list_interfaces().expect("getifaddrs");
        assert!(list.iter().any(|i| i.loopback), "{list:?}");
        assert!(interface_index("lo").expect("lo index") > 0);
        assert!(interface_index("no-such-if0").is_err());
    }
}
