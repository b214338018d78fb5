//! Where a listener listens and a stream connects: a Unix socket path (processes of
//! one host, on either fabric) or an IP socket address (any host: rdma_cm on the verbs
//! fabric).

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, ToSocketAddrs};
use std::path::{Path, PathBuf};

/// An endpoint of [`RdmaListener::bind`](crate::RdmaListener::bind) and
/// [`RdmaStream::connect`](crate::RdmaStream::connect).
///
/// ```
/// use rdma_channel::stream::{Address, ToAddress};
/// assert_eq!(
///     "10.0.0.1:7471".to_addresses()?,
///     vec![Address::Inet("10.0.0.1:7471".parse().unwrap())]
/// );
/// assert_eq!(
///     "/tmp/rch.sock".to_addresses()?,
///     vec![Address::Unix("/tmp/rch.sock".into())]
/// );
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Address {
    /// A Unix socket path: the ends meet on this host, and the connection runs on the
    /// fabric `RCH_FABRIC` selects (shared memory by default).
    Unix(PathBuf),
    /// An IP address and port: the ends meet through rdma_cm and the connection runs on
    /// the verbs fabric, on the RDMA device that reaches the address.
    Inet(SocketAddr),
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "{}", p.display()),
            Address::Inet(a) => write!(f, "{a}"),
        }
    }
}

/// What can name an [`Address`], as `ToSocketAddrs` does for sockets: paths, socket
/// addresses, `(ip, port)` and `(host, port)` pairs, and strings.
///
/// A string is an IP address and port when it parses as one (`"10.0.0.1:7471"`,
/// `"[fe80::1%2]:7471"`), or when it has no `/` and ends in `:port` (then the host
/// name is resolved: `"node7:7471"`); anything else is a Unix socket path
/// (`"/tmp/rch.sock"`, `"rch.sock"`). Use a [`Path`] to force a path.
///
/// ```
/// use rdma_channel::stream::{Address, ToAddress};
/// use std::path::Path;
/// assert!(matches!("localhost:7471".to_addresses()?[0], Address::Inet(_)));
/// assert_eq!(Path::new("a:1").to_addresses()?, vec![Address::Unix("a:1".into())]);
/// assert_eq!("rch.sock".to_addresses()?, vec![Address::Unix("rch.sock".into())]);
/// # Ok::<(), std::io::Error>(())
/// ```
pub trait ToAddress {
    /// The addresses this names, to try in order (a host name may have several).
    ///
    /// # Errors
    ///
    /// A host name that does not resolve (the resolver's error, naming the host).
    fn to_addresses(&self) -> io::Result<Vec<Address>>;
}

impl<T: ToAddress + ?Sized> ToAddress for &T {
    fn to_addresses(&self) -> io::Result<Vec<Address>> {
        (**self).to_addresses()
    }
}

impl ToAddress for Address {
    fn to_addresses(&self) -> io::Result<Vec<Address>> {
        Ok(vec![self.clone()])
    }
}

impl ToAddress for str {
    fn to_addresses(&self) -> io::Result<Vec<Address>> {
        if let Ok(a) = self.parse::<SocketAddr>() {
            return Ok(vec![Address::Inet(a)]);
        }
        let looks_inet = !self.contains('/')
            && self
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !looks_inet {
            return Ok(vec![Address::Unix(PathBuf::from(self))]);
        }
        let addrs: Vec<Address> = self
            .to_socket_addrs()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot resolve {self:?}: {e}")))?
            .map(Address::Inet)
            .collect();
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{self:?} resolves to no address"),
            ));
        }
        Ok(addrs)
    }
}

impl ToAddress for String {
    fn to_addresses(&self) -> io::Result<Vec<Address>> {
        self.as_str().to_addresses()
    }
}

impl ToAddress for Path {
    fn to_addresses(&self) -> io::Result<Vec<Address>> {
        Ok(vec![Address::Unix(self.to_path_buf())])
    }
}

impl ToAddress for PathBuf {
    fn to_addresses(&self) -> io::Result<Vec<Address>> {
        Ok(vec![Address::Unix(self.clone())])
    }
}

/// Socket address types: always one IP address.
macro_rules! inet {
    ($($t:ty),*) => {$(
        impl ToAddress for $t {
            fn to_addresses(&self) -> io::Result<Vec<Address>> {
                Ok(self.to_socket_addrs()?.map(Address::Inet).collect())
            }
        }
    )*};
}

inet!(
    SocketAddr,
    SocketAddrV4,
    SocketAddrV6,
    (IpAddr, u16),
    (Ipv4Addr, u16),
    (Ipv6Addr, u16)
);

impl ToAddress for (&str, u16) {
    fn to_addresses(&self) -> io::Result<Vec<Address>> {
        let addrs: Vec<Address> = self
            .to_socket_addrs()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot resolve {:?}: {e}", self.0)))?
            .map(Address::Inet)
            .collect();
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{:?} resolves to no address", self.0),
            ));
        }
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_pick_their_kind() {
        let inet = |s: &str| matches!(s.to_addresses().unwrap()[0], Address::Inet(_));
        assert!(inet("169.254.77.1:7471"));
        assert!(inet("[::1]:1"));
        assert!(inet("localhost:9"));
        for unix in ["/tmp/x.sock", "x.sock", "dir/a:1", "a:b", ":7", "a:99999"] {
            assert_eq!(
                unix.to_addresses().unwrap(),
                vec![Address::Unix(unix.into())],
                "{unix}"
            );
        }
        assert!("no-such-host.invalid:7471".to_addresses().is_err());
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(
            (ip, 5).to_addresses().unwrap(),
            vec![Address::Inet("127.0.0.1:5".parse().unwrap())]
        );
        assert_eq!(
            Address::Inet("[::1]:2".parse().unwrap()).to_string(),
            "[::1]:2"
        );
    }
}
