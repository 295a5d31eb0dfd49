//! Host network interfaces: enumeration and `NCCL_SOCKET_IFNAME`-style selection.
//!
//! [`interfaces`] lists the host's IP addresses (one entry per interface and address); the
//! selection functions are pure so they can be tested on synthetic lists.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One IP address of one network interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub addr: IpAddr,
    /// `IFF_UP`.
    pub up: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
}

/// `fe80::/10`.
fn is_link_local_v6(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

/// Frees a `getifaddrs` list when dropped.
struct IfAddrs(*mut libc::ifaddrs);

impl Drop for IfAddrs {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful getifaddrs and is freed exactly once.
        unsafe { libc::freeifaddrs(self.0) }
    }
}

/// Every IPv4 and IPv6 address of every interface, in the kernel's order (IPv6 link-local
/// addresses are skipped: they need a scope id to be usable).
pub fn interfaces() -> io::Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head`, which we own on success.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let list = IfAddrs(head);
    let mut out = Vec::new();
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the live list owned by `list` (freed only on drop).
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to at least a sockaddr header.
        let family = libc::c_int::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: the family says this is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says this is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                let a = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                if is_link_local_v6(&a) {
                    continue;
                }
                IpAddr::V6(a)
            }
            _ => continue,
        };
        // SAFETY: ifa_name is a non-null NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let flags = ifa.ifa_flags;
        out.push(Interface {
            name,
            addr,
            up: flags & libc::IFF_UP as libc::c_uint != 0,
            loopback: flags & libc::IFF_LOOPBACK as libc::c_uint != 0,
        });
    }
    Ok(out)
}

/// First of `candidates` with an IPv4 address, else the first one.
fn prefer_v4<'a>(candidates: impl Iterator<Item = &'a Interface> + Clone) -> Option<Interface> {
    candidates
        .clone()
        .find(|i| i.addr.is_ipv4())
        .or_else(|| candidates.clone().next())
        .cloned()
}

/// The interface (address) for out-of-band connections, chosen like NCCL's
/// `NCCL_SOCKET_IFNAME`: `spec` is a comma-separated list of name prefixes; a leading `^`
/// makes it an exclude list, a following `=` (`=eth0`, `^=eth0`) makes the names exact.
/// Unset or blank: any interface other than loopback and `docker*`, else loopback.
/// Only interfaces that are up are considered; among the matches IPv4 is preferred, then the
/// kernel's order.
pub fn select_oob(spec: Option<&str>, ifs: &[Interface]) -> Option<Interface> {
    let up = ifs.iter().filter(|i| i.up);
    let spec = spec.map(str::trim).filter(|s| !s.is_empty());
    let Some(spec) = spec else {
        let general = up
            .clone()
            .filter(|i| !i.loopback && !i.name.starts_with("docker"));
        return prefer_v4(general).or_else(|| prefer_v4(up.filter(|i| i.loopback)));
    };
    let (exclude, rest) = match spec.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, spec),
    };
    let (exact, rest) = match rest.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let items: Vec<&str> = rest
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let listed = move |name: &str| {
        items.iter().any(|item| {
            if exact {
                name == *item
            } else {
                name.starts_with(item)
            }
        })
    };
    prefer_v4(up.filter(move |i| listed(&i.name) != exclude))
}

/// Resolve one `HA_NCCL_SOCK_RAILS` entry to `(name, address)`: an interface name gives that
/// interface's first IPv4 address (else its first IPv6 one); an IP literal gives the literal,
/// named after the interface holding it (or the literal itself if none does).
pub fn resolve_rail(spec: &str, ifs: &[Interface]) -> io::Result<(String, IpAddr)> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "empty rail specification",
        ));
    }
    if let Ok(ip) = spec.parse::<IpAddr>() {
        let name = ifs
            .iter()
            .find(|i| i.addr == ip)
            .map_or_else(|| spec.to_string(), |i| i.name.clone());
        return Ok((name, ip));
    }
    let named = ifs.iter().filter(|i| i.name == spec);
    match prefer_v4(named) {
        Some(i) => Ok((i.name, i.addr)),
        None => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("rail {spec:?}: no interface with that name has an IP address"),
        )),
    }
}

/// The interface an address of this host lives on: the one holding it, else (a loopback
/// address such as 127.0.0.2, local through the loopback route) the loopback interface.
pub fn interface_of(ip: IpAddr, ifs: &[Interface]) -> Option<String> {
    ifs.iter()
        .find(|i| i.addr == ip)
        .or_else(|| {
            ip.is_loopback()
                .then(|| ifs.iter().find(|i| i.loopback))
                .flatten()
        })
        .map(|i| i.name.clone())
}

/// Check resolved `HA_NCCL_SOCK_RAILS` (`(spec, address)` per rail): two rails with the same
/// address are one rail — the standby would share everything with the primary — and are
/// refused; rails on one interface (say two addresses of `lo`) fail together and get a
/// warning each, returned. Errors and warnings name the variable.
pub fn check_rails(rails: &[(String, IpAddr)], ifs: &[Interface]) -> Result<Vec<String>, String> {
    let mut warnings = Vec::new();
    for (i, (si, ai)) in rails.iter().enumerate() {
        for (j, (sj, aj)) in rails.iter().enumerate().skip(i + 1) {
            if ai == aj {
                return Err(format!(
                    "HA_NCCL_SOCK_RAILS: rails {i} ({si:?}) and {j} ({sj:?}) are the same address {ai}: one rail counted twice, so a standby on it would fail with the primary; give each rail its own interface"
                ));
            }
            if let (Some(a), Some(b)) = (interface_of(*ai, ifs), interface_of(*aj, ifs)) {
                if a == b {
                    warnings.push(format!(
                        "HA_NCCL_SOCK_RAILS: rails {i} ({si:?}) and {j} ({sj:?}) share interface {a}: a failure of {a} takes both down, the standby does not protect against it"
                    ));
                }
            }
        }
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: &str, up: bool) -> Interface {
        Interface {
            name: name.to_string(),
            addr: addr.parse().unwrap(),
            up,
            loopback: name == "lo",
        }
    }

    /// lo, docker0, eth0 (v6 first, then v4), eth1 (v4), ib0 (down), enp3s0 (v6 only).
    fn host() -> Vec<Interface> {
        vec![
            iface("lo", "::1", true),
            iface("lo", "127.0.0.1", true),
            iface("docker0", "172.17.0.1", true),
            iface("eth0", "2001:db8::10", true),
            iface("eth0", "10.0.0.10", true),
            iface("eth1", "10.0.1.10", true),
            iface("ib0", "192.168.5.1", false),
            iface("enp3s0", "2001:db8::30", true),
        ]
    }

    fn pick(spec: Option<&str>, ifs: &[Interface]) -> Option<(String, String)> {
        select_oob(spec, ifs).map(|i| (i.name, i.addr.to_string()))
    }

    fn some(name: &str, addr: &str) -> Option<(String, String)> {
        Some((name.to_string(), addr.to_string()))
    }

    #[test]
    fn unset_prefers_non_loopback_non_docker_ipv4() {
        assert_eq!(pick(None, &host()), some("eth0", "10.0.0.10"));
        assert_eq!(pick(Some("  "), &host()), some("eth0", "10.0.0.10"));
    }

    #[test]
    fn unset_takes_ipv6_when_no_ipv4_candidate() {
        let ifs = vec![
            iface("lo", "127.0.0.1", true),
            iface("docker0", "172.17.0.1", true),
            iface("enp3s0", "2001:db8::30", true),
        ];
        assert_eq!(pick(None, &ifs), some("enp3s0", "2001:db8::30"));
    }

    #[test]
    fn unset_falls_back_to_loopback() {
        let ifs = vec![
            iface("lo", "::1", true),
            iface("lo", "127.0.0.1", true),
            iface("docker0", "172.17.0.1", true),
            iface("eth0", "10.0.0.10", false),
        ];
        assert_eq!(pick(None, &ifs), some("lo", "127.0.0.1"));
        assert_eq!(pick(None, &[]), None);
    }

    #[test]
    fn prefix_list() {
        assert_eq!(pick(Some("eth1"), &host()), some("eth1", "10.0.1.10"));
        assert_eq!(pick(Some("eth"), &host()), some("eth0", "10.0.0.10"));
        assert_eq!(pick(Some("enp,eth1"), &host()), some("eth1", "10.0.1.10"));
        assert_eq!(pick(Some("enp"), &host()), some("enp3s0", "2001:db8::30"));
        assert_eq!(pick(Some("lo"), &host()), some("lo", "127.0.0.1"));
        // ib0 matches but is down.
        assert_eq!(pick(Some("ib"), &host()), None);
        assert_eq!(pick(Some("wlan"), &host()), None);
    }

    #[test]
    fn exclude_list() {
        assert_eq!(pick(Some("^eth0"), &host()), some("lo", "127.0.0.1"));
        assert_eq!(pick(Some("^lo,docker"), &host()), some("eth0", "10.0.0.10"));
        assert_eq!(
            pick(Some("^lo,docker,eth"), &host()),
            some("enp3s0", "2001:db8::30")
        );
        assert_eq!(pick(Some("^lo,docker,eth,enp"), &host()), None);
    }

    #[test]
    fn exact_names() {
        assert_eq!(pick(Some("=eth"), &host()), None);
        assert_eq!(pick(Some("=eth1"), &host()), some("eth1", "10.0.1.10"));
        assert_eq!(pick(Some("=eth,eth1"), &host()), some("eth1", "10.0.1.10"));
        // Exact exclude: "eth" names no interface, so only lo goes; docker0 is then the first
        // IPv4 match (an explicit list has no implicit docker exclusion).
        assert_eq!(
            pick(Some("^=lo,eth"), &host()),
            some("docker0", "172.17.0.1")
        );
        assert_eq!(
            pick(Some("^=lo,docker0,eth0"), &host()),
            some("eth1", "10.0.1.10")
        );
    }

    #[test]
    fn rail_by_name() {
        let (n, a) = resolve_rail("eth0", &host()).unwrap();
        assert_eq!((n.as_str(), a), ("eth0", "10.0.0.10".parse().unwrap()));
        let (n, a) = resolve_rail(" enp3s0 ", &host()).unwrap();
        assert_eq!((n.as_str(), a), ("enp3s0", "2001:db8::30".parse().unwrap()));
        // Down interfaces still resolve: link state is the fabric's business.
        let (n, a) = resolve_rail("ib0", &host()).unwrap();
        assert_eq!((n.as_str(), a), ("ib0", "192.168.5.1".parse().unwrap()));
        // Names are exact, not prefixes.
        let e = resolve_rail("eth", &host()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("\"eth\""), "{e}");
        assert_eq!(
            resolve_rail("", &host()).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn rail_by_address() {
        let (n, a) = resolve_rail("10.0.1.10", &host()).unwrap();
        assert_eq!((n.as_str(), a), ("eth1", "10.0.1.10".parse().unwrap()));
        let (n, a) = resolve_rail("2001:db8::10", &host()).unwrap();
        assert_eq!((n.as_str(), a), ("eth0", "2001:db8::10".parse().unwrap()));
        let (n, a) = resolve_rail("192.0.2.7", &host()).unwrap();
        assert_eq!((n.as_str(), a), ("192.0.2.7", "192.0.2.7".parse().unwrap()));
    }

    /// Finding: `HA_NCCL_SOCK_RAILS=d0,d0` (or `lo,lo`, or one IP twice) was accepted with no
    /// word: "2 devices" on one interface, and one cut ended the connection.
    #[test]
    fn the_same_rail_twice_is_refused_and_rails_sharing_an_interface_warned() {
        let ifs = host();
        let resolved = |specs: &[&str]| -> Vec<(String, IpAddr)> {
            specs
                .iter()
                .map(|s| (s.to_string(), resolve_rail(s, &ifs).unwrap().1))
                .collect()
        };
        for twice in [&["eth0", "eth0"][..], &["lo", "lo"], &["10.0.1.10", "eth1"]] {
            let e = check_rails(&resolved(twice), &ifs).unwrap_err();
            assert!(e.starts_with("HA_NCCL_SOCK_RAILS: rails 0"), "{e}");
            assert!(e.contains("same address"), "{e}");
        }
        // Two addresses of one interface (loopback aliases): allowed, with a warning.
        let w = check_rails(&resolved(&["127.0.0.1", "127.0.0.2"]), &ifs).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("HA_NCCL_SOCK_RAILS:") && w[0].contains("share interface lo"));
        let w = check_rails(&resolved(&["eth0", "2001:db8::10"]), &ifs).unwrap();
        assert!(w[0].contains("share interface eth0"), "{w:?}");
        // Separate interfaces: nothing to say.
        assert_eq!(
            check_rails(&resolved(&["eth0", "eth1"]), &ifs).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(interface_of("192.0.2.9".parse().unwrap(), &ifs), None);
    }

    #[test]
    fn link_local_detection() {
        assert!(is_link_local_v6(&"fe80::1".parse().unwrap()));
        assert!(is_link_local_v6(&"febf::1".parse().unwrap()));
        assert!(!is_link_local_v6(&"fec0::1".parse().unwrap()));
        assert!(!is_link_local_v6(&"::1".parse().unwrap()));
    }

    #[test]
    fn host_interfaces_include_loopback() {
        let ifs = interfaces().unwrap();
        let lo = ifs
            .iter()
            .find(|i| i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST))
            .unwrap_or_else(|| panic!("no 127.0.0.1 in {ifs:?}"));
        assert_eq!(lo.name, "lo");
        assert!(lo.up && lo.loopback);
        assert!(ifs.iter().all(|i| match i.addr {
            IpAddr::V6(a) => !is_link_local_v6(&a),
            IpAddr::V4(_) => true,
        }));
        assert_eq!(
            resolve_rail("lo", &ifs).unwrap().1,
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
    }
}
