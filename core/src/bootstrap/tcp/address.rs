//! Where the bootstrap root is: [`InitAddr`], a [`UniqueId`] or `"[ifname:]ip:port"`.

use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::str::FromStr;

use crate::bootstrap::netif::interface_index;
use crate::bootstrap::unique_id::UniqueId;
use crate::error::{Error, Result};

/// Where to find the bootstrap root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitAddr {
    /// A [`UniqueId`] from [`TcpBootstrap::create_unique_id`](super::TcpBootstrap::create_unique_id).
    Id(UniqueId),
    /// `"ip:port"` (`ifname: None`) or `"ifname:ip:port"`: the root listens on `addr`; with an
    /// interface name, this rank's peer sockets use that interface's address.
    Addr {
        /// Interface for this rank's own sockets.
        ifname: Option<String>,
        /// The root's address.
        addr: SocketAddr,
    },
}

impl InitAddr {
    /// Parses `"ip:port"`, `"[ipv6]:port"`, `"ifname:ip:port"` or `"ifname:[ipv6]:port"`.
    pub fn parse(s: &str) -> Result<InitAddr> {
        let s = s.trim();
        let bad = || {
            Error::invalid(format!(
                "bootstrap address {s:?}: expected \"ip:port\" or \"ifname:ip:port\" \
                 (IPv6 as [addr]), with a non-zero port"
            ))
        };
        let (ifname, addr) = match SocketAddr::from_str(s) {
            Ok(a) => (None, a),
            Err(_) => {
                let (name, rest) = s.split_once(':').ok_or_else(bad)?;
                if name.is_empty() || name.contains('[') {
                    return Err(bad());
                }
                let addr = match SocketAddr::from_str(rest) {
                    Ok(a) => a,
                    Err(_) => {
                        // "ifname:fe80::1:5000": the last colon separates the port.
                        let (ip, port) = rest.rsplit_once(':').ok_or_else(bad)?;
                        let ip = IpAddr::from_str(ip).map_err(|_| bad())?;
                        let port = u16::from_str(port).map_err(|_| bad())?;
                        SocketAddr::new(ip, port)
                    }
                };
                (Some(name.to_string()), addr)
            }
        };
        if addr.port() == 0 {
            return Err(bad());
        }
        let addr = match (addr, &ifname) {
            (SocketAddr::V6(a), Some(name)) if a.scope_id() == 0 && is_link_local(a.ip()) => {
                SocketAddr::V6(SocketAddrV6::new(
                    *a.ip(),
                    a.port(),
                    a.flowinfo(),
                    interface_index(name)?,
                ))
            }
            (a, _) => a,
        };
        Ok(InitAddr::Addr { ifname, addr })
    }
}

fn is_link_local(ip: &std::net::Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

impl FromStr for InitAddr {
    type Err = Error;
    fn from_str(s: &str) -> Result<InitAddr> {
        InitAddr::parse(s)
    }
}

impl From<UniqueId> for InitAddr {
    fn from(id: UniqueId) -> InitAddr {
        InitAddr::Id(id)
    }
}

impl From<&UniqueId> for InitAddr {
    fn from(id: &UniqueId) -> InitAddr {
        InitAddr::Id(*id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_init_addr() {
        let a = InitAddr::parse("127.0.0.1:5000").expect("ip:port");
        assert_eq!(
            a,
            InitAddr::Addr {
                ifname: None,
                addr: "127.0.0.1:5000".parse().expect("addr")
            }
        );
        let a = InitAddr::parse("lo:127.0.0.1:5000").expect("ifname:ip:port");
        assert!(matches!(a, InitAddr::Addr { ifname: Some(ref n), .. } if n == "lo"));
        let a = InitAddr::parse("[::1]:7").expect("v6");
        assert!(matches!(a, InitAddr::Addr { ifname: None, addr } if addr.is_ipv6()));
        let a = InitAddr::parse("lo:::1:7").expect("ifname v6 without brackets");
        assert!(matches!(a, InitAddr::Addr { addr, .. } if addr.port() == 7 && addr.is_ipv6()));
        for bad in [
            "",
            "127.0.0.1",
            "127.0.0.1:0",
            "x:y:z",
            ":1.2.3.4:5",
            "1.2.3.4:99999",
        ] {
            let e = InitAddr::parse(bad).expect_err(bad);
            assert!(e.to_string().contains("expected \"ip:port\""), "{e}");
        }
    }
}
