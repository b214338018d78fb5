//! The process group's side of rdma_cm: how peers on other hosts reach this process
//! (a listener on all addresses, published as one IP address and the port) and the
//! small hello its connection requests carry.
//!
//! Which address is published: `RCH_CM_ADDR` (`ip` or `ip:port`) if set; else the
//! IPv4 address of the first RoCE v2 GID of the RDMA devices (the address RoCE
//! traffic uses; `RCH_IB_DEVICE` picks the device); else the IPv4 address of the
//! first IPoIB interface. A process with none of them (or without the `verbs`
//! feature, or without an RDMA device) has no rdma_cm side: it reaches only peers
//! on its own host, and says why when asked for another.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::config::Config;
use crate::handshake::cm::{Accepted, CmListener, Connector};

/// Length of the hello of a process-group connection request: the initiator's
/// rank and the rank it wants, little-endian `u32`s.
pub(crate) const HELLO_LEN: usize = 8;

/// The hello of a connection request from rank `from` to rank `to`.
pub(crate) fn hello(from: u32, to: u32) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[..4].copy_from_slice(&from.to_le_bytes());
    b[4..].copy_from_slice(&to.to_le_bytes());
    b
}

/// (from, to) of a request's hello.
pub(crate) fn parse_hello(b: &[u8]) -> Option<(u32, u32)> {
    if b.len() != HELLO_LEN {
        return None;
    }
    let u = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    Some((u(0), u(4)))
}

/// This process's rdma_cm listener and the address it publishes.
pub(crate) struct Remote {
    listener: CmListener,
    pub(crate) addr: SocketAddr,
}

impl Remote {
    /// Listens for peers of other hosts. `Err` says why this process cannot be
    /// reached that way.
    pub(crate) fn open(cfg: &Config) -> Result<Remote, String> {
        let (ip, port) = published_address()?;
        let bind = SocketAddr::new(
            if ip.is_ipv4() {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
            },
            port,
        );
        // Every rail of `cfg`: a connection comes up over rail 0 and the group steps
        // its other rails up before any data moves (`Conn::CmRails`).
        let listener = CmListener::bind(&bind, cfg.clone()).map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        Ok(Remote {
            listener,
            addr: SocketAddr::new(ip, port),
        })
    }

    /// Serves pending rdma_cm events without waiting; see [`CmListener::accept`].
    pub(crate) fn accept(
        &self,
        check: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> io::Result<Option<Accepted>> {
        self.listener.accept(Some(Duration::ZERO), check)
    }

    /// Starts a connection to `peer`'s listener for rank `to`, from rank `from`.
    pub(crate) fn connect(
        peer: &SocketAddr,
        cfg: &Config,
        from: u32,
        to: u32,
    ) -> io::Result<Connector> {
        Connector::start(peer, cfg, &hello(from, to))
    }
}

/// The address and port to publish (port 0: any).
fn published_address() -> Result<(IpAddr, u16), String> {
    if let Ok(Some(v)) = crate::settings::CM_ADDR.value() {
        let v = v.trim();
        if !v.is_empty() {
            if let Ok(a) = v.parse::<SocketAddr>() {
                return Ok((a.ip(), a.port()));
            }
            return v
                .parse::<IpAddr>()
                .map(|ip| (ip, 0))
                .map_err(|_| format!("RCH_CM_ADDR={v:?} is neither an IP address nor ip:port"));
        }
    }
    roce_ip()
        .or_else(ipoib_ip)
        .map(|ip| (ip, 0))
        .ok_or_else(|| {
            "no RDMA device with an IP address (no RoCE v2 IPv4 GID, no IPoIB interface; \
             set RCH_CM_ADDR)"
                .to_string()
        })
}

/// The IPv4 address of the first RoCE v2 GID in sysfs (of `RCH_IB_DEVICE` if set).
fn roce_ip() -> Option<IpAddr> {
    let root = std::path::Path::new("/sys/class/infiniband");
    let mut devices: Vec<String> = std::fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    devices.sort();
    if let Ok(Some(want)) = crate::settings::IB_DEVICE.value() {
        if !want.trim().is_empty() {
            devices.retain(|d| d == want.trim());
        }
    }
    for dev in devices {
        let ports = root.join(&dev).join("ports");
        let mut port_names: Vec<String> = std::fs::read_dir(&ports)
            .ok()?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        port_names.sort();
        for port in port_names {
            let p = ports.join(&port);
            for i in 0..64 {
                let ty = std::fs::read_to_string(p.join(format!("gid_attrs/types/{i}")));
                if !ty.is_ok_and(|t| t.trim().eq_ignore_ascii_case("RoCE v2")) {
                    continue;
                }
                let Ok(gid) = std::fs::read_to_string(p.join(format!("gids/{i}"))) else {
                    continue;
                };
                if let Some(ip) =
                    parse_gid(gid.trim()).and_then(|g| crate::fabric::verbs::cm::gid_ip(&g))
                {
                    return Some(ip);
                }
            }
        }
    }
    None
}

/// A GID as sysfs prints it (`0000:0000:0000:0000:0000:ffff:a9fe:4d01`).
fn parse_gid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, h) in groups.iter().enumerate() {
        let v = u16::from_str_radix(h, 16).ok()?;
        g[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(g)
}

/// The IPv4 address of the first IPoIB interface (type 32, `ARPHRD_INFINIBAND`).
fn ipoib_ip() -> Option<IpAddr> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            std::fs::read_to_string(format!("/sys/class/net/{n}/type"))
                .is_ok_and(|t| t.trim() == "32")
        })
        .collect();
    names.sort();
    let name = names.first()?;
    let mut ifa: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&mut ifa) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = ifa;
    while !p.is_null() {
        // SAFETY: `p` walks the list getifaddrs returned; each entry's name is a
        // C string and its address (if any) a sockaddr of the family it says.
        unsafe {
            let e = &*p;
            let n = std::ffi::CStr::from_ptr(e.ifa_name).to_string_lossy();
            if n == name.as_str()
                && !e.ifa_addr.is_null()
                && i32::from((*e.ifa_addr).sa_family) == libc::AF_INET
            {
                let sin = &*(e.ifa_addr as *const libc::sockaddr_in);
                found = Some(IpAddr::V4(Ipv4Addr::from(
                    sin.sin_addr.s_addr.to_ne_bytes(),
                )));
                break;
            }
            p = e.ifa_next;
        }
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(ifa) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hellos_round_trip() {
        assert_eq!(parse_hello(&hello(3, 70_000)), Some((3, 70_000)));
        assert_eq!(parse_hello(&[0; 7]), None);
        assert_eq!(parse_hello(&[]), None);
    }

    #[test]
    fn gids_parse() {
        let g = parse_gid("0000:0000:0000:0000:0000:ffff:a9fe:4d01").unwrap();
        assert_eq!(
            crate::fabric::verbs::cm::gid_ip(&g),
            Some("169.254.77.1".parse().unwrap())
        );
        assert_eq!(parse_gid("fe80:0000:0000:0000"), None);
        assert_eq!(parse_gid("zz00:0000:0000:0000:0000:ffff:a9fe:4d01"), None);
    }
}
