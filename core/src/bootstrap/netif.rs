//! Network interface discovery (`getifaddrs`) and `MSCCLPP_SOCKET_IFNAME` matching.

use crate::env::SocketFamily;
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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

// Linux `struct ifaddrs` (<ifaddrs.h>); the last field is a union of two pointers.
#[repr(C)]
struct IfAddrs {
    ifa_next: *mut IfAddrs,
    ifa_name: *mut c_char,
    ifa_flags: c_uint,
    ifa_addr: *mut SockAddr,
    ifa_netmask: *mut SockAddr,
    ifa_ifu: *mut SockAddr,
    ifa_data: *mut c_void,
}

#[repr(C)]
struct SockAddr {
    sa_family: u16,
    sa_data: [u8; 14],
}

#[repr(C)]
struct SockAddrIn {
    sin_family: u16,
    sin_port: u16,
    sin_addr: [u8; 4],
    sin_zero: [u8; 8],
}

#[repr(C)]
struct SockAddrIn6 {
    sin6_family: u16,
    sin6_port: u16,
    sin6_flowinfo: u32,
    sin6_addr: [u8; 16],
    sin6_scope_id: u32,
}

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const IFF_UP: c_uint = 0x1;
const IFF_LOOPBACK: c_uint = 0x8;

extern "C" {
    fn getifaddrs(ifap: *mut *mut IfAddrs) -> c_int;
    fn freeifaddrs(ifa: *mut IfAddrs);
    fn if_nametoindex(ifname: *const c_char) -> c_uint;
}

/// Every IPv4/IPv6 address of every interface, in the order the kernel lists them.
pub fn list_interfaces() -> Result<Vec<Interface>> {
    let mut head: *mut IfAddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head`, which we free below with freeifaddrs.
    if unsafe { getifaddrs(&mut head) } != 0 {
        return Err(Error::io("getifaddrs", std::io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list returned by getifaddrs, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and points at a sockaddr of at least sa_family.
        let family = unsafe { (*ifa.ifa_addr).sa_family };
        let (addr, scope_id) = match family {
            AF_INET => {
                // SAFETY: family AF_INET means the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const SockAddrIn) };
                (IpAddr::V4(Ipv4Addr::from(sin.sin_addr)), 0)
            }
            AF_INET6 => {
                // SAFETY: family AF_INET6 means the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const SockAddrIn6) };
                (
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr)),
                    sin6.sin6_scope_id,
                )
            }
            _ => continue,
        };
        out.push(Interface {
            name,
            addr,
            scope_id,
            up: ifa.ifa_flags & IFF_UP != 0,
            loopback: ifa.ifa_flags & IFF_LOOPBACK != 0,
        });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { freeifaddrs(head) };
    Ok(out)
}

/// The index of interface `name` (for IPv6 scope ids), or an error naming it.
pub fn interface_index(name: &str) -> Result<u32> {
    let c = CString::new(name)
        .map_err(|_| Error::invalid(format!("interface name {name:?} contains a NUL byte")))?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let idx = unsafe { if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(Error::invalid(format!(
            "network interface {name:?} does not exist"
        )));
    }
    Ok(idx)
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
