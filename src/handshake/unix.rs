//! Cards over a Unix socket, for ends on one host: the frames of the handshake and
//! its two flows. The process group drives the frames step by step (without
//! blocking); the stream API runs the same flows blocking.
//!
//! Frames are [`oob`] frames that start with a four-byte tag:
//!
//! | frame | body |
//! | --- | --- |
//! | `HELLO` | hello length *h* (1 byte), the hello (e.g. a process group's ranks), the engine card (its descriptors attached: the emulated fabric's segments) |
//! | `ACCEPT` | the acceptor's engine card (descriptors attached) |
//! | `READY` | nothing |
//! | `REJECT` | nothing: both started at once, the lower rank's attempt wins |
//! | `CLOSED` | why the connection cannot be made (UTF-8) |
//! | `BYE` | nothing: an orderly close (the process group keeps the socket as a liveness signal) |
//!
//! The *initiator* sends `HELLO`; the *acceptor* connects its end and answers
//! `ACCEPT` (or `CLOSED`, `REJECT`); the initiator connects its end and answers
//! `READY`, and only then does the acceptor write: a verbs queue pair must be ready to
//! receive before packets arrive. [`initiate`] and [`accept_hello`] then
//! [`accept_ready`] are the two sides, one frame per call (a listener runs many
//! acceptors' steps side by side); [`symmetric`] is the flow for two ends that cannot tell which is which
//! ([`RdmaStream::handshake`](crate::RdmaStream::handshake)): both say `HELLO`, both
//! connect, both say `READY`.

use std::io;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use super::oob;
use crate::engine::{Channel, Prepared};
use crate::fabric::{Card, Fabric};

/// How long a handshake frame may take to arrive once the peer is expected to send
/// it.
pub(crate) const FRAME_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) const TAG_HELLO: &[u8; 4] = b"RCHH";
pub(crate) const TAG_ACCEPT: &[u8; 4] = b"RCHA";
pub(crate) const TAG_READY: &[u8; 4] = b"RCHY";
pub(crate) const TAG_REJECT: &[u8; 4] = b"RCHR";
pub(crate) const TAG_CLOSED: &[u8; 4] = b"RCHX";
pub(crate) const TAG_BYE: &[u8; 4] = b"RCHB";

/// A fresh abstract socket name for this process.
pub(crate) fn socket_name() -> io::Result<String> {
    let mut r = [0u8; 8];
    // SAFETY: getrandom writes at most r.len() bytes into the live local array.
    let n = unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
    if n != r.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(format!(
        "rch-{}-{:016x}",
        std::process::id(),
        u64::from_le_bytes(r)
    ))
}

fn abstract_addr(name: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
}

/// Listens on the abstract socket `name` (no file to clean up after a crash),
/// non-blocking.
pub(crate) fn listen(name: &str) -> io::Result<UnixListener> {
    let l = UnixListener::bind_addr(&abstract_addr(name)?)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Connects to the abstract socket `name`.
pub(crate) fn connect(name: &str) -> io::Result<UnixStream> {
    UnixStream::connect_addr(&abstract_addr(name)?)
}

/// The (pid, uid) of the process at the other end of a Unix socket.
pub(crate) fn peer_cred(s: &UnixStream) -> io::Result<(u32, u32)> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are live locals of the size passed; the kernel writes at
    // most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((c.pid as u32, c.uid))
}

/// True when `s` has something to read (or has been hung up), without waiting.
pub(crate) fn readable(s: &UnixStream) -> bool {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, count 1, no waiting.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents != 0
}

/// Sends a frame: `tag`, then `body`, then `card`'s bytes with its descriptors if
/// any.
pub(crate) fn send(
    s: &UnixStream,
    tag: &[u8; 4],
    body: &[u8],
    card: Option<Card>,
) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(4 + body.len());
    bytes.extend_from_slice(tag);
    bytes.extend_from_slice(body);
    match card {
        Some(c) => {
            bytes.extend_from_slice(&c.bytes);
            oob::send_card(s, &Card { bytes, fds: c.fds })
        }
        None => oob::send_frame(s, &bytes),
    }
}

/// Sends `HELLO` with `hello` and our card.
pub(crate) fn send_hello(s: &UnixStream, hello: &[u8], card: Card) -> io::Result<()> {
    let h = u8::try_from(hello.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "hello over 255 bytes"))?;
    let mut body = Vec::with_capacity(1 + hello.len());
    body.push(h);
    body.extend_from_slice(hello);
    send(s, TAG_HELLO, &body, Some(card))
}

/// The (hello, card) of a `HELLO` frame's body.
///
/// # Errors
///
/// `InvalidData` when the body is shorter than its hello length says.
pub(crate) fn parse_hello(body: Card) -> io::Result<(Vec<u8>, Card)> {
    let b = &body.bytes;
    let h = usize::from(*b.first().ok_or_else(|| bad("an empty HELLO"))?);
    if b.len() < 1 + h {
        return Err(bad("a HELLO shorter than its hello"));
    }
    Ok((
        b[1..1 + h].to_vec(),
        Card {
            bytes: b[1 + h..].to_vec(),
            fds: body.fds,
        },
    ))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("bad handshake frame: {what} (is the peer rdma-channel?)"),
    )
}

/// Receives a frame, waiting up to [`FRAME_TIMEOUT`] for all of it: its tag and the
/// rest, as a card whose descriptors came with it.
pub(crate) fn recv(s: &UnixStream) -> io::Result<([u8; 4], Card)> {
    recv_by(s, Instant::now() + FRAME_TIMEOUT)
}

/// As [`recv`], with the whole frame due by `deadline`.
///
/// # Errors
///
/// `TimedOut` past the deadline; `InvalidData` for a malformed frame; socket errors.
pub(crate) fn recv_by(s: &UnixStream, deadline: Instant) -> io::Result<([u8; 4], Card)> {
    let c = oob::recv_card_by(s, deadline)?;
    if c.bytes.len() < 4 {
        return Err(bad("shorter than its tag"));
    }
    let mut tag = [0u8; 4];
    tag.copy_from_slice(&c.bytes[..4]);
    Ok((
        tag,
        Card {
            bytes: c.bytes[4..].to_vec(),
            fds: c.fds,
        },
    ))
}

/// "`TAG` reason" of a frame, for messages.
pub(crate) fn describe(tag: &[u8; 4], body: &[u8]) -> String {
    format!(
        "{} {}",
        String::from_utf8_lossy(tag),
        String::from_utf8_lossy(&body[..body.len().min(200)])
    )
}

/// The peer's answer was not what the flow expects.
fn refused(tag: &[u8; 4], body: &Card) -> io::Error {
    let kind = if tag == TAG_CLOSED || tag == TAG_REJECT {
        io::ErrorKind::ConnectionRefused
    } else {
        io::ErrorKind::InvalidData
    };
    io::Error::new(
        kind,
        format!("the peer answered {}", describe(tag, &body.bytes)),
    )
}

/// The initiator's side, blocking: `HELLO`, the peer's `ACCEPT`, connect, `READY`.
///
/// # Errors
///
/// `ConnectionRefused` with the peer's reason when it refused; `InvalidData` for a
/// malformed answer or card; socket and fabric failures.
pub(crate) fn initiate<F: Fabric>(
    s: &UnixStream,
    hello: &[u8],
    prepared: Prepared<F>,
    deadline: Instant,
) -> io::Result<Channel<F>> {
    if let Err(e) = send_hello(s, hello, prepared.card()?) {
        // A listener that dropped us (a handshake past its deadline, a refusal) may
        // have said why before closing: report that rather than the broken pipe.
        if e.kind() == io::ErrorKind::BrokenPipe {
            let soon = Instant::now() + Duration::from_millis(100);
            if let Ok((tag, body)) = recv_by(s, soon.min(deadline)) {
                return Err(refused(&tag, &body));
            }
        }
        return Err(e);
    }
    let (tag, card) = recv_by(s, deadline)?;
    if &tag != TAG_ACCEPT {
        return Err(refused(&tag, &card));
    }
    let chan = match prepared.connect(card) {
        Ok(c) => c,
        Err(e) => {
            let _ = send(s, TAG_CLOSED, e.to_string().as_bytes(), None);
            return Err(e);
        }
    };
    send(s, TAG_READY, &[], None)?;
    Ok(chan)
}

/// The acceptor's first step: reads `HELLO` (due by `deadline`), checks its hello,
/// prepares this end (`prepare`, called only for a hello that passed), connects to
/// the initiator's card and answers `ACCEPT`. The channel may not be written to
/// before [`accept_ready`] saw `READY`.
///
/// # Errors
///
/// `PermissionDenied` when `check` refused (the peer is told why); `InvalidData`
/// for malformed frames or cards; socket and fabric failures.
pub(crate) fn accept_hello<F: Fabric>(
    s: &UnixStream,
    prepare: impl FnOnce() -> io::Result<Prepared<F>>,
    check: impl FnOnce(&[u8]) -> Result<(), String>,
    deadline: Instant,
) -> io::Result<(Channel<F>, Vec<u8>)> {
    // A client that is still there learns why it was dropped (a slow one: "timed
    // out"), not only that the socket closed.
    let tell = |e: &io::Error| {
        let _ = send(s, TAG_CLOSED, format!("handshake: {e}").as_bytes(), None);
    };
    let (tag, body) = recv_by(s, deadline).inspect_err(tell)?;
    if &tag != TAG_HELLO {
        let _ = send(s, TAG_CLOSED, b"expected HELLO", None);
        return Err(refused(&tag, &body));
    }
    let (hello, card) = parse_hello(body).inspect_err(tell)?;
    if let Err(why) = check(&hello) {
        let _ = send(s, TAG_CLOSED, why.as_bytes(), None);
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
    }
    let connected = prepare().and_then(|prepared| {
        let ours = prepared.card()?;
        Ok((prepared.connect(card)?, ours))
    });
    let (chan, ours) = match connected {
        Ok(c) => c,
        Err(e) => {
            let _ = send(s, TAG_CLOSED, e.to_string().as_bytes(), None);
            return Err(e);
        }
    };
    send(s, TAG_ACCEPT, &[], Some(ours))?;
    Ok((chan, hello))
}

/// The acceptor's last step: `READY` from the initiator, due by `deadline`.
///
/// # Errors
///
/// `ConnectionRefused` when the peer failed after our `ACCEPT`; `TimedOut`;
/// `InvalidData` for another frame.
pub(crate) fn accept_ready(s: &UnixStream, deadline: Instant) -> io::Result<()> {
    let (tag, body) = recv_by(s, deadline)?;
    if &tag != TAG_READY {
        return Err(refused(&tag, &body));
    }
    Ok(())
}

/// Both ends at once, when neither knows which it is: both send `HELLO`, both
/// connect to the other's card, both send `READY` and wait for the other's.
///
/// # Errors
///
/// As [`initiate`].
pub(crate) fn symmetric<F: Fabric>(
    s: &UnixStream,
    prepared: Prepared<F>,
    deadline: Instant,
) -> io::Result<Channel<F>> {
    send_hello(s, &[], prepared.card()?)?;
    let (tag, body) = recv_by(s, deadline)?;
    if &tag != TAG_HELLO {
        return Err(refused(&tag, &body));
    }
    let (_, card) = parse_hello(body)?;
    let chan = match prepared.connect(card) {
        Ok(c) => c,
        Err(e) => {
            let _ = send(s, TAG_CLOSED, e.to_string().as_bytes(), None);
            return Err(e);
        }
    };
    send(s, TAG_READY, &[], None)?;
    let (tag, body) = recv_by(s, deadline)?;
    if &tag != TAG_READY {
        return Err(refused(&tag, &body));
    }
    Ok(chan)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener that dropped the client before its `HELLO` (the handshake's
    /// deadline passed) said why and closed: the client's write meets a closed
    /// socket, and it reports the listener's reason, not the broken pipe.
    #[test]
    fn a_client_dropped_before_its_hello_reports_the_listeners_reason() {
        let (client, listener) = UnixStream::pair().unwrap();
        send(&listener, TAG_CLOSED, b"handshake timed out", None).unwrap();
        drop(listener);
        let fabric = crate::fabric::emulated::EmuFabric::new().unwrap();
        let prepared = Prepared::new(fabric, crate::Config::default()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let e = initiate(&client, b"", prepared, deadline)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        assert_eq!(e.to_string(), "the peer answered RCHX handshake timed out");
    }

    #[test]
    fn hellos_parse_and_reject_truncation() {
        let (a, b) = UnixStream::pair().unwrap();
        send_hello(
            &a,
            b"ranks",
            Card {
                bytes: b"card".to_vec(),
                fds: Vec::new(),
            },
        )
        .unwrap();
        let (tag, body) = recv(&b).unwrap();
        assert_eq!(&tag, TAG_HELLO);
        let (hello, card) = parse_hello(body).unwrap();
        assert_eq!(
            (hello.as_slice(), card.bytes.as_slice()),
            (&b"ranks"[..], &b"card"[..])
        );
        for bad in [&b""[..], b"\x05abc"] {
            let e = parse_hello(Card {
                bytes: bad.to_vec(),
                fds: Vec::new(),
            })
            .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        }
    }
}
