//! Hello cards and the connection handshake of the lazy connections.
//!
//! At process-group initialisation every process listens on an abstract Unix socket
//! (no file to clean up after a crash), and where it can, on rdma_cm too, and
//! publishes a *hello card* ([`Hello`]: printable ASCII without spaces or `=` so that
//! any string key-value store, PMI's, holds it).
//!
//! Peers on the same host ([`host_id`]) connect through the abstract socket, on the
//! process's fabric (shared memory unless `RCH_FABRIC=verbs`), as below. Peers on
//! other hosts connect through rdma_cm on the verbs fabric (`super::remote`), where
//! the connection manager's request, reply and ready-to-use play the parts of
//! `HELLO`, `ACCEPT` and `READY`.
//!
//! A connection is made when a pair first communicates. The side that starts
//! (*initiator*) connects to the peer's socket and sends a `HELLO` frame (its rank and
//! the peer's rank as the hello, and its engine card, with the card's descriptors
//! attached: the emulated fabric's shared-memory segments travel by `SCM_RIGHTS`;
//! the frames are those of `handshake::unix`). The peer (*acceptor*) answers during
//! any of its own library calls:
//!
//! * `ACCEPT` with its own card: it has connected its end; the initiator connects
//!   its end and answers `READY`, and only then does the acceptor write (a verbs
//!   queue pair must be ready to receive before the peer sends);
//! * `REJECT`: both sides started at once, and the attempt of the lower rank wins;
//!   the initiator waits for the peer's own `HELLO`;
//! * `CLOSED` with a reason: the acceptor closed that connection or cannot set it up.
//!
//! Once connected, both ends keep the socket open as a liveness signal: the kernel
//! closes it when a process ends, and an orderly close (`rch_vc_close`,
//! `rch_finalize`) sends `BYE` first, so a hang-up without `BYE` means the peer died.
//! The fabrics notice a dead peer too, but an RC queue pair on verbs only when it
//! sends, and a process that only reads never does.

use super::cpus::CpuSet;
use crate::fabric::{FabricKind, RemoteRegion};

/// Longest hello card, in bytes (`RCH_CARD_MAX`).
pub(crate) const CARD_MAX: usize = 255;

/// What a process publishes about itself: how peers of its host reach it (the
/// fabric and the abstract socket), which host it is on, where peers of other
/// hosts reach it through rdma_cm (if it can be reached that way), its doorbell,
/// which the senders of its host ring when it asks (if it has one), and the CPUs it
/// may run on (its affinity mask as ranges, `0-3.8`, if known and short):
///
/// ```text
/// rch4,<fabric>,<pid>,<socket name>,<host id>,<ip:port or ->,<addr:len:rkey in hex or ->,<cpus or ->
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) fabric: FabricKind,
    pub(crate) pid: u32,
    pub(crate) socket: String,
    /// Same kernel and network namespace as us (see [`host_id`]): shared memory
    /// and abstract sockets reach the process.
    pub(crate) host: String,
    /// Its rdma_cm listener, if it has one.
    pub(crate) cm: Option<std::net::SocketAddr>,
    /// Its doorbell ([`Doorbell`](crate::ring::memory::Doorbell)) on its fabric,
    /// if it has one.
    pub(crate) bell: Option<RemoteRegion>,
    /// The CPUs it may run on ([`CpuSet::of_this_process`]), if known.
    pub(crate) cpus: Option<CpuSet>,
}

/// A field of a hello card: printable ASCII without the separator, spaces or `=`.
fn field_ok(f: &str) -> bool {
    !f.is_empty()
        && f.len() <= 100
        && f.bytes()
            .all(|c| c.is_ascii_graphic() && c != b',' && c != b'=')
}

impl Hello {
    pub(crate) fn encode(&self) -> String {
        let cm = self.cm.map_or_else(|| "-".to_string(), |a| a.to_string());
        let bell = self.bell.map_or_else(
            || "-".to_string(),
            |b| format!("{:x}:{:x}:{:x}", b.addr, b.len, b.rkey),
        );
        let card = format!(
            "rch4,{},{},{},{},{cm},{bell}",
            self.fabric, self.pid, self.socket, self.host
        );
        // The CPU list goes only where the card stays within CARD_MAX (an IPv6
        // address and a long list could pass it); without it peers count as before.
        match self.cpus.as_ref().and_then(CpuSet::encode) {
            Some(cpus) if card.len() + 1 + cpus.len() <= CARD_MAX => format!("{card},{cpus}"),
            _ => format!("{card},-"),
        }
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Hello, String> {
        let s = std::str::from_utf8(b).map_err(|_| "not UTF-8".to_string())?;
        let parts: Vec<&str> = s.trim_end_matches('\0').split(',').collect();
        if parts.len() != 8 || parts[0] != "rch4" {
            return Err(format!(
                "{s:?} is not an rch4 hello card (do all ranks run the same rdma-channel?)"
            ));
        }
        let fabric = parts[1]
            .parse::<FabricKind>()
            .map_err(|_| format!("unknown fabric {:?} in hello card", parts[1]))?;
        let pid = parts[2]
            .parse::<u32>()
            .map_err(|_| format!("bad pid {:?} in hello card", parts[2]))?;
        let (socket, host) = (parts[3], parts[4]);
        if !field_ok(socket) {
            return Err(format!("bad socket name {socket:?} in hello card"));
        }
        if !field_ok(host) {
            return Err(format!("bad host id {host:?} in hello card"));
        }
        let cm = match parts[5] {
            "-" => None,
            a => Some(
                a.parse()
                    .map_err(|_| format!("bad rdma_cm address {a:?} in hello card"))?,
            ),
        };
        let bell = match parts[6] {
            "-" => None,
            b => Some(parse_bell(b).ok_or_else(|| format!("bad doorbell {b:?} in hello card"))?),
        };
        let cpus = match parts[7] {
            "-" => None,
            c => {
                Some(CpuSet::decode(c).ok_or_else(|| format!("bad CPU list {c:?} in hello card"))?)
            }
        };
        Ok(Hello {
            fabric,
            pid,
            socket: socket.to_string(),
            host: host.to_string(),
            cm,
            bell,
            cpus,
        })
    }
}

/// `addr:len:rkey` in hex.
fn parse_bell(s: &str) -> Option<RemoteRegion> {
    let mut it = s.split(':');
    let mut next = || u64::from_str_radix(it.next()?, 16).ok();
    let (addr, len, rkey) = (next()?, next()?, next()?);
    if it.next().is_some() {
        return None;
    }
    Some(RemoteRegion {
        addr,
        len,
        rkey: u32::try_from(rkey).ok()?,
    })
}

/// This process's host identity: processes with the same one share a kernel and a
/// network namespace, so they reach each other through shared memory and abstract
/// Unix sockets. `RCH_HOST_ID` overrides it (tests use it to make ranks of one
/// machine talk as if on different hosts); otherwise it is the kernel's boot id and
/// the network namespace's inode.
pub(crate) fn host_id() -> String {
    if let Ok(Some(h)) = crate::settings::HOST_ID.value() {
        if field_ok(h.trim()) {
            return h.trim().to_string();
        }
    }
    let boot: String = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(16)
        .collect();
    use std::os::unix::fs::MetadataExt;
    let netns = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
    format!(
        "{}-{netns:x}",
        if boot.is_empty() { "noboot" } else { &boot }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_rejects_garbage() {
        let h = Hello {
            fabric: FabricKind::Emulated,
            pid: 42,
            socket: "rch-42-00ff".into(),
            host: host_id(),
            cm: Some("169.254.77.2:40001".parse().unwrap()),
            bell: Some(RemoteRegion {
                addr: 0x7f00_1234_0000,
                len: 4160,
                rkey: 0xdead_beef,
            }),
            cpus: CpuSet::decode("0-3.8"),
        };
        let s = h.encode();
        assert!(s.len() <= CARD_MAX && !s.contains(' ') && !s.contains('='));
        assert!(s.ends_with(",0-3.8"), "{s}");
        assert_eq!(Hello::decode(s.as_bytes()), Ok(h.clone()));
        let without = Hello {
            cm: None,
            bell: None,
            cpus: None,
            ..h.clone()
        };
        assert!(without.encode().ends_with(",-,-,-"));
        // A list that would take the card past CARD_MAX is left out.
        let long: Vec<String> = (0..34).map(|c| (c * 3).to_string()).collect();
        let crowded = Hello {
            pid: u32::MAX,
            socket: "rch-4294967295-00ff12ab34cd56ef".into(),
            cm: Some(
                "[fd00:1234:5678:9abc:def0:1234:5678:9abc]:40001"
                    .parse()
                    .unwrap(),
            ),
            bell: Some(RemoteRegion {
                addr: 0x7fff_ffff_0000,
                len: 0xffff_ffff,
                rkey: 0xdead_beef,
            }),
            cpus: CpuSet::decode(&long.join(".")),
            ..h
        };
        assert!(crowded.cpus.is_some());
        let s = crowded.encode();
        assert!(
            s.len() <= CARD_MAX && s.ends_with(",-"),
            "{} bytes: {s}",
            s.len()
        );
        assert_eq!(Hello::decode(without.encode().as_bytes()), Ok(without));
        for bad in [
            &b""[..],
            b"rch1:emulated:42:x",
            b"rch2,emulated,42,x,h,-",
            // The previous version's card: all ranks must run one library.
            b"rch3,emulated,42,x,h,-,-",
            b"rch4,emulated,42,x,h,-,-",
            b"rch4,nic,42,x,h,-,-,-",
            b"rch4,emulated,-1,x,h,-,-,-",
            b"rch4,emulated,42,,h,-,-,-",
            b"rch4,emulated,42,a b,h,-,-,-",
            b"rch4,emulated,42,x,h=1,-,-,-",
            b"rch4,emulated,42,x,h,10.0.0.1,-,-",
            b"rch4,emulated,42,x,h,-,10:20,-",
            b"rch4,emulated,42,x,h,-,10:20:1ffffffff,-",
            b"rch4,emulated,42,x,h,-,10:20:30:40,-",
            b"rch4,emulated,42,x,h,-,g:20:30,-",
            b"rch4,emulated,42,x,h,-,-,3-1",
            b"rch4,emulated,42,x,h,-,-,0-3,8",
            b"rch4,emulated,42,x,h,-,-,-,extra",
            b"\xff\xfe",
        ] {
            assert!(Hello::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn host_id_is_a_valid_field_and_stable() {
        let h = host_id();
        assert!(field_ok(&h), "{h:?}");
        assert_eq!(h, host_id());
    }
}
