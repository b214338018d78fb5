//! A line-oriented connection to a PMI server with a deadline on every exchange.
//!
//! The descriptor may be any stream: a Unix socket (`PMI_FD` from Hydra or
//! `rch-run`), a TCP socket (`PMI_PORT`) or a pipe pair's end. Waiting is `poll(2)`
//! with the remaining time, so a server that stops answering gives `TimedOut` instead
//! of a hang; writes use `MSG_NOSIGNAL` so a server that hung up gives `BrokenPipe`
//! instead of a `SIGPIPE`.

use super::wire::{self, Message};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

pub(crate) struct Conn {
    fd: OwnedFd,
    buf: Vec<u8>,
    pub timeout: Duration,
}

fn millis_until(deadline: Instant) -> libc::c_int {
    let left = deadline.saturating_duration_since(Instant::now());
    // Round up so that we never wake just before the deadline and spin.
    let ms = left.as_nanos().div_ceil(1_000_000);
    ms.min(libc::c_int::MAX as u128) as libc::c_int
}

impl Conn {
    pub fn new(fd: OwnedFd, timeout: Duration) -> Conn {
        Conn {
            fd,
            buf: Vec::new(),
            timeout,
        }
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    fn timed_out(&self, doing: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "PMI: timed out after {:?} {doing} (the process manager did not answer; \
                 RCH_PMI_TIMEOUT_MS sets the limit)",
                self.timeout
            ),
        )
    }

    /// Waits until the descriptor is ready for `events` or the deadline passes.
    fn wait(&self, events: libc::c_short, deadline: Instant, doing: &str) -> io::Result<()> {
        loop {
            let ms = millis_until(deadline);
            if ms == 0 {
                return Err(self.timed_out(doing));
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events,
                revents: 0,
            };
            // SAFETY: `pfd` is one valid, initialised pollfd that lives across the call.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n > 0 {
                // POLLHUP/POLLERR: the following read or write reports what happened.
                return Ok(());
            }
        }
    }

    /// Sends one line (which must end in `\n`).
    pub fn send(&mut self, line: &str) -> io::Result<()> {
        debug_assert!(line.ends_with('\n'));
        let deadline = Instant::now() + self.timeout;
        let cmd = line.split(' ').next().unwrap_or("").trim_end();
        let doing = format!("sending {cmd} to the process manager");
        let mut rest = line.as_bytes();
        let mut is_socket = true;
        while !rest.is_empty() {
            self.wait(libc::POLLOUT, deadline, &doing)?;
            let n = if is_socket {
                // SAFETY: `rest` is a valid readable buffer of `rest.len()` bytes.
                unsafe {
                    libc::send(
                        self.fd.as_raw_fd(),
                        rest.as_ptr().cast(),
                        rest.len(),
                        libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                    )
                }
            } else {
                // SAFETY: as above; `write` on a non-socket descriptor.
                unsafe { libc::write(self.fd.as_raw_fd(), rest.as_ptr().cast(), rest.len()) }
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::ENOTSOCK) => is_socket = false,
                    Some(libc::EINTR) | Some(libc::EAGAIN) => {}
                    Some(libc::EPIPE) | Some(libc::ECONNRESET) => {
                        return Err(io::Error::new(
                            io::ErrorKind::BrokenPipe,
                            format!("PMI: the process manager closed the connection ({doing})"),
                        ))
                    }
                    _ => return Err(io::Error::new(e.kind(), format!("PMI: {doing}: {e}"))),
                }
                continue;
            }
            rest = &rest[n as usize..];
        }
        Ok(())
    }

    /// Receives one line, without its `\n`. `expecting` names the awaited command for
    /// error messages.
    pub fn recv_line(&mut self, expecting: &str) -> io::Result<Vec<u8>> {
        let deadline = Instant::now() + self.timeout;
        let doing = format!("waiting for cmd={expecting} from the process manager");
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                return Ok(line);
            }
            if self.buf.len() > wire::MAX_LINE {
                return Err(wire::invalid_data(format!(
                    "PMI: line longer than {} bytes while {doing}: '{}'",
                    wire::MAX_LINE,
                    wire::excerpt(&self.buf)
                )));
            }
            self.wait(libc::POLLIN, deadline, &doing)?;
            let mut chunk = [0u8; 4096];
            // SAFETY: `chunk` is a valid writable buffer of `chunk.len()` bytes.
            let n =
                unsafe { libc::read(self.fd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) | Some(libc::EAGAIN) => continue,
                    Some(libc::ECONNRESET) => {}
                    _ => return Err(io::Error::new(e.kind(), format!("PMI: {doing}: {e}"))),
                }
            }
            if n <= 0 {
                let msg = if self.buf.is_empty() {
                    format!("PMI: the process manager closed the connection while {doing}")
                } else {
                    format!(
                        "PMI: the process manager closed the connection in the middle of a line \
                         (truncated line '{}') while {doing}",
                        wire::excerpt(&self.buf)
                    )
                };
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, msg));
            }
            self.buf.extend_from_slice(&chunk[..n as usize]);
        }
    }

    /// Receives one message, which must be `cmd=<expected>`.
    pub fn recv(&mut self, expected: &str) -> io::Result<Message> {
        let line = self.recv_line(expected)?;
        let msg = wire::parse(&line).map_err(|e| {
            wire::invalid_data(format!("PMI: while waiting for cmd={expected}: {e}"))
        })?;
        if msg.cmd != expected {
            return Err(wire::invalid_data(format!(
                "PMI: expected cmd={expected} from the process manager, got cmd={} ('{}')",
                msg.cmd,
                wire::excerpt(&line)
            )));
        }
        Ok(msg)
    }

    /// Sends `request` and receives the answer, which must be `cmd=<expected>`.
    pub fn call(&mut self, request: &str, expected: &str) -> io::Result<Message> {
        self.send(request)?;
        self.recv(expected)
    }
}
