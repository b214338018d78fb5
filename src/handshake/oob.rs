//! Out-of-band exchange over a Unix stream socket: length-prefixed frames, optionally
//! carrying file descriptors (`SCM_RIGHTS`).
//!
//! This is how two ends swap [`Card`]s before an RDMA connection exists. A frame is a
//! little-endian `u32` length followed by that many bytes (at most [`MAX_FRAME`]); a
//! card's descriptors (at most [`MAX_FDS`]) ride on the frame's first byte. Received
//! descriptors are close-on-exec.
//!
//! The functions block (they honour the socket's read/write timeouts, reporting
//! `WouldBlock`/`TimedOut` as the standard library does). A frame interrupted by such an
//! error leaves the stream in an unknown position: drop the socket.
//!
//! ```
//! use std::os::unix::net::UnixStream;
//! use rdma_channel::oob;
//! let (a, b) = UnixStream::pair()?;
//! oob::send_frame(&a, b"hello")?;
//! assert_eq!(oob::recv_frame(&b)?, b"hello");
//! # Ok::<(), std::io::Error>(())
//! ```

use crate::fabric::Card;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr;
use std::time::Instant;

/// Largest frame payload accepted, in bytes (1 MiB).
pub const MAX_FRAME: usize = 1 << 20;

/// Most descriptors one frame can carry (the kernel's `SCM_MAX_FD`).
pub const MAX_FDS: usize = crate::fabric::MAX_CARD_FDS;

/// Room for the control message of [`MAX_FDS`] descriptors, as `u64`s so that the
/// buffer is aligned for `cmsghdr`.
const CMSG_WORDS: usize = (MAX_FDS * mem::size_of::<RawFd>() + 64) / 8;

fn closed(mid_frame: bool) -> io::Error {
    let msg = if mid_frame {
        "peer closed the out-of-band socket in the middle of a frame"
    } else {
        "peer closed the out-of-band socket"
    };
    io::Error::new(io::ErrorKind::UnexpectedEof, msg)
}

/// Sends `bytes` as one frame.
///
/// ```
/// # use std::os::unix::net::UnixStream;
/// let (a, b) = UnixStream::pair()?;
/// rdma_channel::oob::send_frame(&a, &[])?;
/// assert!(rdma_channel::oob::recv_frame(&b)?.is_empty());
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// # Errors
///
/// `InvalidInput` for more than [`MAX_FRAME`] bytes; `BrokenPipe`-style errors when the
/// peer has closed the socket; other socket errors.
pub fn send_frame(sock: &UnixStream, bytes: &[u8]) -> io::Result<()> {
    send_msg(sock, bytes, &[])
}

/// Receives one frame sent by [`send_frame`].
///
/// # Errors
///
/// `UnexpectedEof` ("peer closed the out-of-band socket") at end of stream;
/// `InvalidData` for a frame longer than [`MAX_FRAME`] or one that carries descriptors;
/// other socket errors.
pub fn recv_frame(sock: &UnixStream) -> io::Result<Vec<u8>> {
    let (bytes, fds) = recv_msg(sock, None)?;
    if !fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "out-of-band frame carried {} unexpected descriptors",
                fds.len()
            ),
        ));
    }
    Ok(bytes)
}

/// Sends a card: its bytes as one frame with its descriptors attached.
///
/// ```
/// # use std::os::unix::net::UnixStream;
/// use rdma_channel::fabric::emulated::EmuFabric;
/// use rdma_channel::fabric::{Fabric, PendingQp};
/// let (a, b) = UnixStream::pair()?;
/// let fabric = EmuFabric::new()?;
/// let pending = fabric.create_qp()?;
/// rdma_channel::oob::send_card(&a, &pending.card()?)?;
/// let card = rdma_channel::oob::recv_card(&b)?;
/// assert_eq!(card.bytes, pending.card()?.bytes);
/// assert_eq!(card.fds.len(), 1);
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// # Errors
///
/// As [`send_frame`], plus `InvalidInput` for more than [`MAX_FDS`] descriptors.
pub fn send_card(sock: &UnixStream, card: &Card) -> io::Result<()> {
    let fds: Vec<RawFd> = card.fds.iter().map(AsRawFd::as_raw_fd).collect();
    send_msg(sock, &card.bytes, &fds)
}

/// Receives a card sent by [`send_card`].
///
/// # Errors
///
/// As [`recv_frame`] (descriptors are expected here, of course), plus `InvalidData` when
/// the sender attached more descriptors than fit.
pub fn recv_card(sock: &UnixStream) -> io::Result<Card> {
    let (bytes, fds) = recv_msg(sock, None)?;
    Ok(Card { bytes, fds })
}

/// As [`recv_card`], but the whole frame must have arrived by `deadline`, however
/// the peer trickles it (the socket's own read timeout bounds one read only).
///
/// # Errors
///
/// As [`recv_card`]; `TimedOut` when the deadline passes first.
pub fn recv_card_by(sock: &UnixStream, deadline: Instant) -> io::Result<Card> {
    let (bytes, fds) = recv_msg(sock, Some(deadline))?;
    Ok(Card { bytes, fds })
}

fn send_msg(sock: &UnixStream, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if payload.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "out-of-band frame of {} bytes exceeds {MAX_FRAME}",
                payload.len()
            ),
        ));
    }
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} descriptors exceed the limit of {MAX_FDS} per frame",
                fds.len()
            ),
        ));
    }
    let header = (payload.len() as u32).to_le_bytes();
    let total = header.len() + payload.len();
    let mut sent = 0usize;
    let mut cmsg = [0u64; CMSG_WORDS];
    while sent < total {
        let (h, p) = if sent < header.len() {
            (&header[sent..], payload)
        } else {
            (&header[..0], &payload[sent - header.len()..])
        };
        let mut iov = [
            libc::iovec {
                iov_base: h.as_ptr() as *mut libc::c_void,
                iov_len: h.len(),
            },
            libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            },
        ];
        // SAFETY: an all-zero msghdr is a valid "no name, no control" header.
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        // Descriptors go with the first byte only (a stream has no message boundaries;
        // the receiver takes them with the frame header).
        if sent == 0 && !fds.is_empty() {
            let data_len = mem::size_of_val(fds) as u32;
            // SAFETY: CMSG_SPACE is a pure size computation.
            let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
            msg.msg_control = cmsg.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: msg_control points at `space` <= sizeof(cmsg) aligned bytes, so the
            // first header and its data (CMSG_LEN(data_len) <= space) fit inside.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(data_len) as _;
                ptr::copy_nonoverlapping(
                    fds.as_ptr().cast::<u8>(),
                    libc::CMSG_DATA(c),
                    data_len as usize,
                );
            }
        }
        // SAFETY: msg describes live buffers (iov, cmsg) for the duration of the call.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                    return Err(io::Error::new(
                        e.kind(),
                        "peer closed the out-of-band socket",
                    ))
                }
                _ => return Err(e),
            }
        }
        sent += n as usize;
    }
    Ok(())
}

/// Receives one frame and the descriptors that came with it.
fn recv_msg(sock: &UnixStream, deadline: Option<Instant>) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut fds = Vec::new();
    let mut header = [0u8; 4];
    recv_exact(sock, &mut header, &mut fds, false, deadline)?;
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("out-of-band frame of {len} bytes exceeds {MAX_FRAME}"),
        ));
    }
    let mut payload = vec![0u8; len];
    recv_exact(sock, &mut payload, &mut fds, true, deadline)?;
    Ok((payload, fds))
}

/// Fills `buf` from the socket, collecting any descriptors that arrive into `fds`.
fn recv_exact(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    mid_frame: bool,
    deadline: Option<Instant>,
) -> io::Result<()> {
    let mut got = 0usize;
    while got < buf.len() {
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out(got, buf.len()));
            }
            sock.set_read_timeout(Some(left))?;
        }
        let mut cmsg = [0u64; CMSG_WORDS];
        let mut iov = libc::iovec {
            iov_base: buf[got..].as_mut_ptr().cast(),
            iov_len: buf.len() - got,
        };
        // SAFETY: an all-zero msghdr is a valid "no name, no control" header.
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = mem::size_of_val(&cmsg) as _;
        // SAFETY: msg describes live, writable buffers for the duration of the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut if deadline.is_some() => {
                    return Err(timed_out(got, buf.len()))
                }
                io::ErrorKind::ConnectionReset => {
                    return Err(io::Error::new(
                        e.kind(),
                        "peer closed the out-of-band socket",
                    ))
                }
                _ => return Err(e),
            }
        }
        // Take ownership of every descriptor first, so that none leaks on any error.
        take_fds(&msg, fds);
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "descriptors of a frame were dropped: the peer sent more than the \
                     {MAX_FDS} a frame may carry, or this process has no descriptor left \
                     (ulimit -n)"
                ),
            ));
        }
        if n == 0 {
            return Err(closed(mid_frame || got > 0));
        }
        got += n as usize;
    }
    Ok(())
}

/// The deadline of a frame passed with `got` of `want` bytes of one part received.
fn timed_out(got: usize, want: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("the peer did not finish its handshake frame in time ({got} of {want} bytes)"),
    )
}

/// Moves the `SCM_RIGHTS` descriptors of a received message into `out`.
fn take_fds(msg: &libc::msghdr, out: &mut Vec<OwnedFd>) {
    // SAFETY: msg was filled by recvmsg; the CMSG_* macros walk its control buffer
    // within msg_controllen, and each SCM_RIGHTS payload holds (cmsg_len - CMSG_LEN(0))
    // bytes of descriptors that the kernel installed in this process for us to own.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c);
                for i in 0..bytes / mem::size_of::<RawFd>() {
                    let fd =
                        ptr::read_unaligned(data.add(i * mem::size_of::<RawFd>()).cast::<RawFd>());
                    out.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Duration;

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        for s in [&a, &b] {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        }
        (a, b)
    }

    fn memfd(content: &[u8]) -> OwnedFd {
        let name = c"oob-test";
        // SAFETY: valid name and flags.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: the descriptor was just created and is ours.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut f = std::fs::File::from(fd);
        f.write_all(content).unwrap();
        OwnedFd::from(f)
    }

    fn content(fd: OwnedFd) -> Vec<u8> {
        use std::io::Seek;
        let mut f = std::fs::File::from(fd);
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn frames_round_trip_in_order() {
        let (a, b) = pair();
        send_frame(&a, b"one").unwrap();
        send_frame(&a, b"").unwrap();
        send_frame(&a, b"three").unwrap();
        assert_eq!(recv_frame(&b).unwrap(), b"one");
        assert_eq!(recv_frame(&b).unwrap(), b"");
        assert_eq!(recv_frame(&b).unwrap(), b"three");
    }

    #[test]
    fn cards_carry_descriptors_that_are_cloexec() {
        let (a, b) = pair();
        let card = Card {
            bytes: vec![1, 2, 3],
            fds: vec![memfd(b"first"), memfd(b"second")],
        };
        send_card(&a, &card).unwrap();
        send_frame(&a, b"after").unwrap();
        let got = recv_card(&b).unwrap();
        assert_eq!(got.bytes, vec![1, 2, 3]);
        assert_eq!(got.fds.len(), 2);
        for fd in &got.fds {
            // SAFETY: F_GETFD only reads the descriptor flags.
            let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
            assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        }
        let mut it = got.fds.into_iter();
        assert_eq!(content(it.next().unwrap()), b"first");
        assert_eq!(content(it.next().unwrap()), b"second");
        assert_eq!(recv_frame(&b).unwrap(), b"after");
    }

    #[test]
    fn max_frame_with_max_fds_survives_partial_transfers() {
        let (a, b) = pair();
        let payload: Vec<u8> = (0..MAX_FRAME).map(|i| (i * 7 + i / 251) as u8).collect();
        let expected = payload.clone();
        let fds: Vec<OwnedFd> = (0..MAX_FDS).map(|_| memfd(b"x")).collect();
        let sender = std::thread::spawn(move || {
            let card = Card {
                bytes: payload,
                fds,
            };
            send_card(&a, &card).unwrap();
            a
        });
        let got = recv_card(&b).unwrap();
        assert_eq!(got.bytes.len(), MAX_FRAME);
        assert!(got.bytes == expected);
        assert_eq!(got.fds.len(), MAX_FDS);
        drop(sender.join().unwrap());
    }

    #[test]
    fn limits_are_enforced_on_both_sides() {
        let (mut a, b) = pair();
        let e = send_frame(&a, &vec![0u8; MAX_FRAME + 1]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let too_many = Card {
            bytes: vec![],
            fds: (0..MAX_FDS + 1).map(|_| memfd(b"")).collect(),
        };
        assert_eq!(
            send_card(&a, &too_many).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // A hand-made header announcing an oversized frame.
        a.write_all(&((MAX_FRAME as u32) + 1).to_le_bytes())
            .unwrap();
        let e = recv_frame(&b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("exceeds"));
    }

    #[test]
    fn plain_frames_refuse_descriptors() {
        let (a, b) = pair();
        send_card(
            &a,
            &Card {
                bytes: vec![9],
                fds: vec![memfd(b"")],
            },
        )
        .unwrap();
        let e = recv_frame(&b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn eof_is_reported_clearly() {
        let (mut a, b) = pair();
        a.write_all(&[10, 0, 0, 0, 1, 2]).unwrap();
        let (c, d) = pair();
        drop(c);
        let e = recv_frame(&d).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(e.to_string(), "peer closed the out-of-band socket");
        drop(a);
        let e = recv_frame(&b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("middle of a frame"));
        let e = send_frame(&d, b"x").unwrap_err();
        assert!(e.to_string().contains("peer closed"), "{e}");
    }
}
