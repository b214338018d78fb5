//! A connected byte stream with the feel of `UnixStream`, on top of the engine.
//!
//! [`RdmaStream`] offers both faces of the channel: the non-blocking vectored
//! [`put`](RdmaStream::put)/[`get`](RdmaStream::get) of seed 001 (the
//! MPICH2 RDMA Channel paper, Liu et al., IPDPS 2004), and blocking
//! `std::io::Read`/`Write`. [`RdmaStream::pair`] connects two streams inside one
//! process; [`RdmaListener`] and [`RdmaStream::connect`] connect two processes, by
//! [`Address`]:
//!
//! * a Unix socket path: processes of one host, exchanging connection cards (and, on
//!   the emulated fabric, the shared-memory descriptors they carry) over the socket,
//!   on the fabric `RCH_FABRIC` selects ([`AnyFabric::from_env`]: the emulated fabric
//!   unless it says `verbs`);
//! * an IP address and port (`"10.0.0.1:7471"`): processes on any hosts, through
//!   rdma_cm on the verbs fabric (feature `verbs`), on the RDMA device that reaches
//!   the address; the cards travel in the connection manager's messages.
//!
//! [`RdmaStream::handshake`] takes any fabric value, of any [`Fabric`] type.
//!
//! # Errors: one contract
//!
//! Every failure is one of these kinds, the same on both fabrics and for the
//! [`Channel`] underneath; the C interface (`ffi/rch.h`) maps them to the statuses in
//! the last column. A connection that failed stays failed (every later call returns
//! the same error); other connections are unaffected.
//!
//! | what happened | `io::ErrorKind` | `rch_status` |
//! | --- | --- | --- |
//! | the peer closed its sending side and every byte it sent was read | `read`: `Ok(0)`; `get`: `UnexpectedEof` | `RCH_ERR_PEER_CLOSED` |
//! | the peer closed its reading side (or the whole stream) and we write | `BrokenPipe` | `RCH_ERR_PEER_CLOSED` |
//! | the peer died, its queue pair failed, the link is down, or its memory refused an access (a dead peer's regions are gone) | `ConnectionReset` | `RCH_ERR_PEER_GONE` |
//! | a read or write timeout ([`RdmaStream::set_read_timeout`]), a connect or handshake that did not finish in time ([`Config::with_connect_timeout`]) | `TimedOut` | `RCH_ERR_TIMEOUT` (`rch_wait`) / `RCH_ERR_PEER_GONE` |
//! | nobody listens at the address, or the listener refused us | `ConnectionRefused` (`NotFound` for a path that does not exist) | `RCH_ERR_PEER_GONE` |
//! | the peer broke the protocol: a malformed card or handshake frame, ring contents no correct peer writes, a bad zero-copy announcement | `InvalidData` | `RCH_ERR_PROTOCOL` |
//! | out of resources: the process's memory limit ([`crate::limits`]) or the kernel refused memory | `OutOfMemory` | `RCH_ERR_NO_MEMORY` |
//! | a bad argument or configuration (ring size not a power of two, zero timeout...) | `InvalidInput` | `RCH_ERR_INVALID` / `RCH_ERR_CONFIG` |
//! | a live listener already holds the path | `AddrInUse` | - |
//! | a fabric of another kind on the other end, or no RDMA device / verbs support | `InvalidInput` / `NotFound` / `Unsupported` | `RCH_ERR_FABRIC` |
//!
//! A peer's death is never `Other`: `channel-tests/peer_death.rs` kills peers at
//! every stage and matches the kinds, `channel-tests/error_contract.rs` produces the
//! rest through this API.

pub mod addr;

pub use addr::{Address, ToAddress};

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::engine::{Channel, Peeked, Prepared, RdmaBuf, Receiver, Sender};
use crate::fabric::{AnyFabric, Fabric};
use crate::handshake::unix;
use crate::rcache::{CacheStats, RegCache};

/// A connected stream. `F` is the fabric: by default [`AnyFabric`], which the
/// constructors below open as `RCH_FABRIC` says (the emulated fabric unless it says
/// `verbs`); [`handshake`](RdmaStream::handshake) connects on any fabric value.
///
/// ```
/// use std::io::{Read, Write};
/// use rdma_channel::RdmaStream;
///
/// let (mut a, mut b) = RdmaStream::pair()?;
/// a.write_all(b"hello")?;
/// let mut buf = [0u8; 5];
/// b.read_exact(&mut buf)?;
/// assert_eq!(&buf, b"hello");
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct RdmaStream<F: Fabric = AnyFabric> {
    chan: Channel<F>,
    /// Where the peer is, when known (streams made by address).
    peer: Option<Address>,
    /// Our own address, for streams made through rdma_cm.
    local: Option<Address>,
    /// Limits on one blocking `read` / `write` (`None`: wait as long as it takes).
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
}

impl<F: Fabric> std::fmt::Debug for RdmaStream<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaStream")
            .field("local", &self.local)
            .field("peer", &self.peer)
            .field("config", self.chan.config())
            .field("read_timeout", &self.read_timeout)
            .field("write_timeout", &self.write_timeout)
            .finish_non_exhaustive()
    }
}

/// Checks a timeout the way `std::net::TcpStream::set_read_timeout` does.
fn valid_timeout(t: Option<Duration>) -> io::Result<Option<Duration>> {
    if t == Some(Duration::ZERO) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a zero timeout is not allowed (use None to wait without a limit)",
        ));
    }
    Ok(t)
}

impl RdmaStream<AnyFabric> {
    /// Two connected streams in this process, on the fabric `RCH_FABRIC` selects,
    /// configured from the `RCH_*` environment (see [`Config`]).
    ///
    /// # Errors
    ///
    /// A bad `RCH_*` variable, or a failure to open the fabric (see
    /// [`AnyFabric::from_env`]) or to create the connection on it.
    pub fn pair() -> io::Result<(RdmaStream, RdmaStream)> {
        Self::pair_with(Config::from_env()?)
    }

    /// Two connected streams in this process with an explicit configuration, on the
    /// fabric `RCH_FABRIC` selects (two emulated domains, or one verbs protection
    /// domain: see [`AnyFabric::for_connection`]).
    ///
    /// ```
    /// use rdma_channel::{Config, RdmaStream};
    /// let (mut a, mut b) = RdmaStream::pair_with(Config::default().with_ring_size(8192).with_chunk_size(1024))?;
    /// assert_eq!(a.put(&[std::io::IoSlice::new(&[7; 100])])?, 100);
    /// let mut buf = [0u8; 100];
    /// assert_eq!(b.get(&mut [std::io::IoSliceMut::new(&mut buf)])?, 100);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// An invalid configuration, a bad `RCH_FABRIC`, or a failure to open the fabric
    /// or to create the connection on it.
    pub fn pair_with(cfg: Config) -> io::Result<(RdmaStream, RdmaStream)> {
        let fabric = AnyFabric::from_env()?;
        let other = fabric.for_connection()?;
        let a = Prepared::new(fabric, cfg.clone())?;
        let b = Prepared::new(other, cfg)?;
        let (ca, cb) = (a.card()?, b.card()?);
        Ok((
            RdmaStream::from_channel(a.connect(cb)?),
            RdmaStream::from_channel(b.connect(ca)?),
        ))
    }

    /// Connects to an [`RdmaListener`] at `addr`, with the `RCH_*` configuration:
    /// a Unix socket path (the listener must use the same `RCH_FABRIC`) or an IP
    /// address and port (rdma_cm on the verbs fabric). See [`ToAddress`] for what
    /// `addr` can be; with several addresses (a host name), each is tried in turn.
    ///
    /// ```no_run
    /// use std::io::Write;
    /// let mut s = rdma_channel::RdmaStream::connect("10.0.0.1:7471")?;
    /// s.write_all(b"hello")?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`connect_with`](Self::connect_with), plus a bad `RCH_*` variable.
    pub fn connect<A: ToAddress>(addr: A) -> io::Result<RdmaStream> {
        Self::connect_with(addr, Config::from_env()?)
    }

    /// Connects to an [`RdmaListener`] with an explicit configuration.
    ///
    /// # Errors
    ///
    /// * Unix path: nobody listening there, a peer that is not an rdma-channel
    ///   listener or is on another fabric, a fabric failure.
    /// * IP address: `ConnectionRefused` (nothing listens there, or the listener
    ///   refused, with its reason), `HostUnreachable` (no RDMA device reaches the
    ///   address, no route, no answer), `TimedOut` after
    ///   [`Config::connect_timeout`], `NotFound` (no RDMA device on this host),
    ///   `Unsupported` in a build without the `verbs` feature or with
    ///   `RCH_FABRIC=emulated` (shared memory cannot cross hosts).
    pub fn connect_with<A: ToAddress>(addr: A, cfg: Config) -> io::Result<RdmaStream> {
        let mut last = None;
        for a in addr.to_addresses()? {
            let r = match &a {
                Address::Unix(p) => Self::connect_unix(p, cfg.clone()),
                Address::Inet(sa) => Self::connect_inet(sa, &cfg),
            };
            match r {
                Ok(mut s) => {
                    s.peer = Some(a);
                    return Ok(s);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address")))
    }

    fn connect_unix(path: &Path, cfg: Config) -> io::Result<RdmaStream> {
        let sock = UnixStream::connect(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot reach rdma-channel listener at {}: {e}",
                    path.display()
                ),
            )
        })?;
        // The whole handshake, like connecting by address, within the connect timeout.
        let deadline = Instant::now() + cfg.connect_timeout();
        let prepared = Prepared::new(AnyFabric::from_env()?, cfg)?;
        unix::initiate(&sock, &[], prepared, deadline).map(RdmaStream::from_channel)
    }

    #[cfg(feature = "verbs")]
    fn connect_inet(addr: &std::net::SocketAddr, cfg: &Config) -> io::Result<RdmaStream> {
        inet_allowed(&Address::Inet(*addr))?;
        let mut c = crate::handshake::cm::connect(addr, cfg, &[])?;
        c.channel.connect_rails(cfg.connect_timeout())?;
        let mut s = RdmaStream::from_channel(c.channel);
        s.local = Some(Address::Inet(c.local));
        Ok(s)
    }

    #[cfg(not(feature = "verbs"))]
    fn connect_inet(addr: &std::net::SocketAddr, _cfg: &Config) -> io::Result<RdmaStream> {
        Err(inet_allowed(&Address::Inet(*addr))
            .err()
            .unwrap_or_else(|| no_verbs(addr)))
    }
}

/// Refuses an IP address when `RCH_FABRIC` explicitly asks for the emulated fabric.
fn inet_allowed(addr: &Address) -> io::Result<()> {
    let forced = crate::settings::FABRIC.value().ok().flatten();
    if let Some(v) = forced {
        if v.parse::<crate::fabric::FabricKind>()? == crate::fabric::FabricKind::Emulated {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{addr} is an IP address, which needs the verbs fabric, but \
                     RCH_FABRIC={v} asks for shared memory (which connects by Unix socket path)"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(not(feature = "verbs"))]
fn no_verbs(addr: &std::net::SocketAddr) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "{addr} is an IP address, which needs the verbs fabric (rdma_cm): \
             rdma-channel was built without it (build with `--features verbs`)"
        ),
    )
}

impl<F: Fabric> RdmaStream<F> {
    fn from_channel(chan: Channel<F>) -> RdmaStream<F> {
        RdmaStream {
            chan,
            peer: None,
            local: None,
            read_timeout: None,
            write_timeout: None,
        }
    }

    /// Limits how long one blocking `read` waits for data; `None` (the default)
    /// waits as long as it takes. A read that times out fails with `TimedOut` and
    /// takes nothing; the stream stays usable.
    ///
    /// ```
    /// use std::io::{ErrorKind, Read};
    /// use std::time::Duration;
    /// let (mut a, _b) = rdma_channel::RdmaStream::pair()?;
    /// a.set_read_timeout(Some(Duration::from_millis(20)))?;
    /// assert_eq!(a.read(&mut [0u8; 8]).unwrap_err().kind(), ErrorKind::TimedOut);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a zero duration, as `std::net::TcpStream`.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.read_timeout = valid_timeout(timeout)?;
        Ok(())
    }

    /// Limits how long one blocking `write` waits for room; `None` (the default)
    /// waits as long as it takes. With a limit, writes copy through the ring (no
    /// zero-copy rendezvous, whose buffers would still be lent when time runs out),
    /// and one that times out with nothing written fails with `TimedOut`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a zero duration.
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.write_timeout = valid_timeout(timeout)?;
        Ok(())
    }

    /// The read timeout in force.
    pub fn read_timeout(&self) -> Option<Duration> {
        self.read_timeout
    }

    /// The write timeout in force.
    pub fn write_timeout(&self) -> Option<Duration> {
        self.write_timeout
    }

    /// Our end's IP address and port, for a stream made through rdma_cm (connected
    /// to or accepted on an IP address); `None` otherwise.
    pub fn local_addr(&self) -> Option<&Address> {
        self.local.as_ref()
    }

    /// Where the peer is: the address this stream connected to, or (for a stream a
    /// listener accepted by IP address) the peer's address; `None` for
    /// [`pair`](RdmaStream::pair) and Unix-socket accepts.
    pub fn peer_addr(&self) -> Option<&Address> {
        self.peer.as_ref()
    }

    /// Sets up a connection on `fabric` by exchanging cards over `sock`, a connected
    /// Unix socket whose other end runs the same call (both say `HELLO` with their
    /// card, both connect, both say `READY`: see `handshake::unix`).
    ///
    /// # Errors
    ///
    /// The socket failing, a malformed or mismatched card, or a fabric failure; the
    /// peer's error message is reported when it failed first.
    pub fn handshake(fabric: F, sock: &UnixStream, cfg: Config) -> io::Result<RdmaStream<F>> {
        let deadline = Instant::now() + cfg.connect_timeout();
        let prepared = Prepared::new(fabric, cfg)?;
        unix::symmetric(sock, prepared, deadline).map(RdmaStream::from_channel)
    }

    /// Non-blocking put (seed 001 sec. 3.2): writes what fits of `iov`, in order, and
    /// returns the byte count (0 when the ring is full). The buffers may be reused as
    /// soon as it returns; offer the rest again later.
    ///
    /// # Errors
    ///
    /// `BrokenPipe` when the peer stopped reading; `ConnectionReset` when it vanished.
    pub fn put(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        self.chan.put(iov)
    }

    /// Allocates registered memory for zero-copy sends: see [`Channel::alloc_mem`].
    ///
    /// # Errors
    ///
    /// As [`Channel::alloc_mem`].
    pub fn alloc_mem(&self, len: usize) -> io::Result<RdmaBuf<F>> {
        self.chan.alloc_mem(len)
    }

    /// Counters of the registration cache of this connection's protection domain (shared by its connections).
    pub fn cache_stats(&self) -> CacheStats {
        self.chan.cache_stats()
    }

    /// The registration cache of this connection's protection domain: see [`Channel::registration_cache`].
    pub fn registration_cache(&self) -> &RegCache<F> {
        self.chan.registration_cache()
    }

    /// Non-blocking get: fills `iov` with what has arrived, in order, and returns the
    /// byte count (0 when nothing has arrived).
    ///
    /// # Errors
    ///
    /// `UnexpectedEof` once the peer closed and all its data was read;
    /// `ConnectionReset` when it vanished.
    pub fn get(&mut self, iov: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.chan.get(iov)
    }

    /// Non-blocking: the next bytes of the stream in place, where the peer wrote
    /// them, without a copy; give them back with [`consume`](Self::consume). See
    /// [`Receiver::peek`] (zero-copy transfers are read with `get`).
    ///
    /// ```
    /// use std::io::Write;
    /// use rdma_channel::Peeked;
    /// let (mut a, mut b) = rdma_channel::RdmaStream::pair()?;
    /// a.write_all(b"hello")?;
    /// let Peeked::Bytes(bytes) = b.peek()? else { unreachable!() };
    /// assert_eq!(bytes, b"hello");
    /// b.consume(5)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Receiver::peek`].
    pub fn peek(&mut self) -> io::Result<Peeked<'_>> {
        self.chan.receiver().peek()
    }

    /// Gives back the first `n` bytes [`peek`](Self::peek) lent: see
    /// [`Receiver::consume`].
    ///
    /// # Errors
    ///
    /// As [`Receiver::consume`].
    pub fn consume(&mut self, n: usize) -> io::Result<()> {
        self.chan.receiver().consume(n)
    }

    /// Splits into halves that can be used from different threads.
    ///
    /// ```
    /// use std::io::{Read, Write};
    /// let (a, mut b) = rdma_channel::RdmaStream::pair()?;
    /// let (mut ra, mut wa) = a.split();
    /// let t = std::thread::spawn(move || wa.write_all(&[1u8; 100_000]));
    /// let mut got = vec![0u8; 100_000];
    /// b.read_exact(&mut got)?;
    /// t.join().unwrap()?;
    /// b.write_all(b"ok")?;
    /// let mut ok = [0u8; 2];
    /// ra.read_exact(&mut ok)?;
    /// assert_eq!(&ok, b"ok");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn split(self) -> (ReadHalf<F>, WriteHalf<F>) {
        let (rx, tx) = self.chan.split();
        (
            ReadHalf {
                rx,
                timeout: self.read_timeout,
            },
            WriteHalf {
                tx,
                timeout: self.write_timeout,
            },
        )
    }

    /// Rejoins two halves of the same stream.
    ///
    /// # Errors
    ///
    /// Gives the halves back when they come from different streams.
    // The halves come back by value on a mismatch, as with tokio's `reunite`; boxing
    // them would only move the size to the heap.
    #[allow(clippy::result_large_err)]
    pub fn reunite(
        r: ReadHalf<F>,
        w: WriteHalf<F>,
    ) -> Result<RdmaStream<F>, (ReadHalf<F>, WriteHalf<F>)> {
        let (rt, wt) = (r.timeout, w.timeout);
        Channel::unsplit(r.rx, w.tx)
            .map(|c| {
                let mut s = RdmaStream::from_channel(c);
                (s.read_timeout, s.write_timeout) = (rt, wt);
                s
            })
            .map_err(|(rx, tx)| (ReadHalf { rx, timeout: rt }, WriteHalf { tx, timeout: wt }))
    }

    /// Ends the writing direction: the peer reads end of stream after the data sent.
    ///
    /// # Errors
    ///
    /// A fabric failure while sending the notice.
    pub fn shutdown_write(&mut self) -> io::Result<()> {
        self.chan.sender().close()
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        self.chan.config()
    }

    /// The underlying channel (for callers that drive put/get themselves).
    pub fn channel(&mut self) -> &mut Channel<F> {
        &mut self.chan
    }
}

fn blocking_read<F: Fabric>(
    rx: &mut Receiver<F>,
    bufs: &mut [IoSliceMut<'_>],
    timeout: Option<Duration>,
) -> io::Result<usize> {
    if bufs.iter().all(|b| b.is_empty()) {
        return Ok(0);
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        match rx.get(bufs) {
            Ok(0) => {}
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
            Err(e) => return Err(e),
        }
        match rx.wait_readable_until(deadline) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
            Err(e) => return Err(e),
        }
    }
}

/// Blocking write. Buffers at or above the zero-copy threshold go zero-copy, which
/// is safe here because `bufs` stays borrowed until the peer confirmed its read (or
/// the transfer was revoked on an error): the write is then a rendezvous.
fn blocking_write<F: Fabric>(
    tx: &mut Sender<F>,
    bufs: &[IoSlice<'_>],
    timeout: Option<Duration>,
) -> io::Result<usize> {
    if bufs.iter().all(|b| b.is_empty()) {
        return Ok(0);
    }
    if let Some(t) = timeout {
        // Copies only: nothing is lent to the fabric when the time runs out.
        let deadline = Some(Instant::now() + t);
        loop {
            let n = tx.put(bufs)?;
            if n > 0 {
                return Ok(n);
            }
            tx.wait_writable_until(deadline)?;
        }
    }
    let mut done = 0;
    loop {
        // A transfer in flight always starts at a buffer boundary, so `bufs[i..]`
        // begins with the announced buffers whenever one is pending.
        let (mut i, mut skip) = (0, done);
        while i < bufs.len() && skip >= bufs[i].len() && skip > 0 {
            skip -= bufs[i].len();
            i += 1;
        }
        if skip > 0 {
            // Mid-buffer: nothing is in flight, so the bytes counted so far can go back.
            return Ok(done);
        }
        // SAFETY: `bufs` is borrowed for this whole call, and the loop only returns
        // when nothing of it is in flight: after put_nocopy counted the transfer, or
        // with an error (put_nocopy revokes the transfer then). Every retry offers the
        // announced buffers first (see above), so no mismatch leaves one in flight.
        let n = unsafe { tx.put_nocopy(&bufs[i..]) }?;
        done += n;
        if tx.zero_copy_pending() {
            tx.wait_zero_copy()?;
        } else if done > 0 {
            return Ok(done);
        } else {
            tx.wait_writable()?;
        }
    }
}

impl<F: Fabric> Read for RdmaStream<F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let t = self.read_timeout;
        blocking_read(self.chan.receiver(), &mut [IoSliceMut::new(buf)], t)
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let t = self.read_timeout;
        blocking_read(self.chan.receiver(), bufs, t)
    }
}

impl<F: Fabric> Write for RdmaStream<F> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let t = self.write_timeout;
        blocking_write(self.chan.sender(), &[IoSlice::new(buf)], t)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let t = self.write_timeout;
        blocking_write(self.chan.sender(), bufs, t)
    }
    /// Nothing is buffered: when `write` returns, its bytes have been posted to the
    /// fabric, which places them in the peer's ring in order (at once on the emulated
    /// fabric; on verbs the NIC may still be moving them), so there is nothing to flush.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The reading half of a split [`RdmaStream`].
pub struct ReadHalf<F: Fabric = AnyFabric> {
    rx: Receiver<F>,
    timeout: Option<Duration>,
}

impl<F: Fabric> std::fmt::Debug for ReadHalf<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadHalf")
            .field("read_timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<F: Fabric> ReadHalf<F> {
    /// Waits until a `get` (or `read`) would return data or end of stream, up to the
    /// read timeout if one is set: the reading half's counterpart of writing's
    /// blocking calls, for callers that use [`get`](Self::get).
    ///
    /// ```
    /// use std::io::{IoSlice, IoSliceMut};
    /// let (a, b) = rdma_channel::RdmaStream::pair()?;
    /// let (mut rx, _) = b.split();
    /// let (_, mut tx) = a.split();
    /// std::thread::spawn(move || tx.put(&[IoSlice::new(b"x")]));
    /// rx.wait_readable()?;
    /// let mut one = [0u8; 1];
    /// assert_eq!(rx.get(&mut [IoSliceMut::new(&mut one)])?, 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `UnexpectedEof` at end of stream; `TimedOut` past the read timeout; the
    /// connection's error.
    pub fn wait_readable(&mut self) -> io::Result<()> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        self.rx.wait_readable_until(deadline)
    }

    /// Limits one blocking `read` (or [`wait_readable`](Self::wait_readable)), as
    /// [`RdmaStream::set_read_timeout`].
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a zero duration.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.timeout = valid_timeout(timeout)?;
        Ok(())
    }

    /// Non-blocking get, as [`RdmaStream::get`].
    ///
    /// # Errors
    ///
    /// As [`RdmaStream::get`].
    pub fn get(&mut self, iov: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.rx.get(iov)
    }

    /// The next bytes in place, without a copy: see [`Receiver::peek`].
    ///
    /// # Errors
    ///
    /// As [`Receiver::peek`].
    pub fn peek(&mut self) -> io::Result<Peeked<'_>> {
        self.rx.peek()
    }

    /// Gives back the first `n` bytes [`peek`](Self::peek) lent: see
    /// [`Receiver::consume`].
    ///
    /// # Errors
    ///
    /// As [`Receiver::consume`].
    pub fn consume(&mut self, n: usize) -> io::Result<()> {
        self.rx.consume(n)
    }
}

impl<F: Fabric> ReadHalf<F> {
    /// The receiving engine (a selector's look).
    pub(crate) fn rx(&mut self) -> &mut Receiver<F> {
        &mut self.rx
    }
}

impl<F: Fabric> Read for ReadHalf<F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        blocking_read(&mut self.rx, &mut [IoSliceMut::new(buf)], self.timeout)
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        blocking_read(&mut self.rx, bufs, self.timeout)
    }
}

/// The writing half of a split [`RdmaStream`].
pub struct WriteHalf<F: Fabric = AnyFabric> {
    tx: Sender<F>,
    timeout: Option<Duration>,
}

impl<F: Fabric> std::fmt::Debug for WriteHalf<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteHalf")
            .field("write_timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<F: Fabric> WriteHalf<F> {
    /// Waits until a `put` would take bytes, up to the write timeout if one is set.
    ///
    /// # Errors
    ///
    /// `BrokenPipe` once the peer stopped reading; `TimedOut` past the write
    /// timeout; the connection's error.
    pub fn wait_writable(&mut self) -> io::Result<()> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        self.tx.wait_writable_until(deadline)
    }

    /// Limits one blocking `write`, as [`RdmaStream::set_write_timeout`].
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a zero duration.
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.timeout = valid_timeout(timeout)?;
        Ok(())
    }

    /// Non-blocking put, as [`RdmaStream::put`].
    ///
    /// # Errors
    ///
    /// As [`RdmaStream::put`].
    pub fn put(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        self.tx.put(iov)
    }

    /// Allocates registered memory for zero-copy sends: see [`Sender::alloc_mem`].
    ///
    /// # Errors
    ///
    /// As [`Sender::alloc_mem`].
    pub fn alloc_mem(&self, len: usize) -> io::Result<RdmaBuf<F>> {
        self.tx.alloc_mem(len)
    }

    /// The registration cache of this connection's protection domain: see [`Channel::registration_cache`].
    pub fn registration_cache(&self) -> &RegCache<F> {
        self.tx.registration_cache()
    }

    /// The engine's sender, for [`Sender::put_nocopy`].
    pub fn sender(&mut self) -> &mut Sender<F> {
        &mut self.tx
    }

    /// Ends the stream, as [`RdmaStream::shutdown_write`].
    ///
    /// # Errors
    ///
    /// A fabric failure while sending the notice.
    pub fn shutdown(&mut self) -> io::Result<()> {
        self.tx.close()
    }
}

impl<F: Fabric> Write for WriteHalf<F> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        blocking_write(&mut self.tx, &[IoSlice::new(buf)], self.timeout)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        blocking_write(&mut self.tx, bufs, self.timeout)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Accepts connections from other processes: on a Unix socket path (processes of
/// this host, on the fabric `RCH_FABRIC` selects, opened by [`bind`](Self::bind):
/// every connection gets its own emulated domain, or shares the listener's verbs
/// protection domain), or on an IP address and port (peers on any host, through
/// rdma_cm on the verbs fabric: each connection on the RDMA device it arrived on).
///
/// ```
/// use std::io::{Read, Write};
/// use rdma_channel::{RdmaListener, RdmaStream};
/// let dir = std::env::temp_dir().join(format!("rch-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("sock");
/// let listener = RdmaListener::bind(&path)?;
/// let p = path.clone();
/// let t = std::thread::spawn(move || -> std::io::Result<()> {
///     let mut s = RdmaStream::connect(&p)?;
///     s.write_all(b"ping")
/// });
/// let mut s = listener.accept()?;
/// let mut buf = [0u8; 4];
/// s.read_exact(&mut buf)?;
/// t.join().unwrap()?;
/// assert_eq!(&buf, b"ping");
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// Across hosts, by address (the `verbs` feature and an RDMA device with an IP
/// address, e.g. RoCE):
///
/// ```no_run
/// use std::io::Read;
/// let listener = rdma_channel::RdmaListener::bind("0.0.0.0:7471")?;
/// let mut s = listener.accept()?; // a peer ran RdmaStream::connect("<our ip>:7471")
/// let mut buf = [0u8; 5];
/// s.read_exact(&mut buf)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct RdmaListener {
    inner: Listening,
}

impl std::fmt::Debug for RdmaListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("RdmaListener");
        match &self.inner {
            Listening::Unix {
                path, fabric, cfg, ..
            } => d
                .field("path", path)
                .field("fabric", &fabric.name())
                .field("config", cfg),
            #[cfg(feature = "verbs")]
            Listening::Inet(l) => d.field("address", &l.local_addr().ok()),
        }
        .finish_non_exhaustive()
    }
}

enum Listening {
    Unix {
        /// Non-blocking: accepting polls it beside the handshakes under way.
        listener: UnixListener,
        path: std::path::PathBuf,
        cfg: Config,
        fabric: AnyFabric,
        /// Clients accepted whose handshakes have not finished, each with its deadline.
        handshakes: std::sync::Mutex<Vec<Handshake>>,
    },
    #[cfg(feature = "verbs")]
    Inet(crate::handshake::cm::CmListener),
}

impl RdmaListener {
    /// Listens at `addr` with the `RCH_*` configuration: a Unix socket path (an
    /// existing socket file there is replaced) on the fabric `RCH_FABRIC` selects,
    /// or an IP address and port (rdma_cm, verbs fabric; port 0 picks a free port,
    /// see [`local_addr`](Self::local_addr)). See [`ToAddress`].
    ///
    /// # Errors
    ///
    /// As [`bind_with`](Self::bind_with), plus a bad `RCH_*` variable.
    pub fn bind<A: ToAddress>(addr: A) -> io::Result<RdmaListener> {
        Self::bind_with(addr, Config::from_env()?)
    }

    /// Listens with an explicit configuration.
    ///
    /// # Errors
    ///
    /// An invalid configuration; for a path a bad `RCH_FABRIC`, a fabric that cannot
    /// be opened (see [`AnyFabric::from_env`]) or a socket that cannot be bound; for
    /// an IP address `NotFound` (no RDMA device), `AddrInUse`, `AddrNotAvailable` (not
    /// an address of this host), `Unsupported` (no `verbs` feature, or
    /// `RCH_FABRIC=emulated`). With several addresses, the first that works.
    pub fn bind_with<A: ToAddress>(addr: A, cfg: Config) -> io::Result<RdmaListener> {
        cfg.validate()?;
        let mut last = None;
        for a in addr.to_addresses()? {
            let r = match &a {
                Address::Unix(p) => Self::bind_unix(p, cfg.clone()),
                Address::Inet(sa) => Self::bind_inet(sa, cfg.clone()),
            };
            match r {
                Ok(l) => return Ok(l),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address")))
    }

    fn bind_unix(path: &Path, cfg: Config) -> io::Result<RdmaListener> {
        let fabric = AnyFabric::from_env()?;
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if meta.file_type().is_socket() {
                // Replace a stale socket only: one that still accepts belongs to a
                // live listener, which would otherwise silently lose its path.
                if UnixStream::connect(path).is_ok() {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("a listener is alive at {}", path.display()),
                    ));
                }
                std::fs::remove_file(path)?;
            }
        }
        let listener = UnixListener::bind(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot listen at {}: {e}", path.display()),
            )
        })?;
        listener.set_nonblocking(true)?;
        Ok(RdmaListener {
            inner: Listening::Unix {
                listener,
                path: path.to_path_buf(),
                cfg,
                fabric,
                handshakes: std::sync::Mutex::new(Vec::new()),
            },
        })
    }

    #[cfg(feature = "verbs")]
    fn bind_inet(addr: &std::net::SocketAddr, cfg: Config) -> io::Result<RdmaListener> {
        inet_allowed(&Address::Inet(*addr))?;
        Ok(RdmaListener {
            inner: Listening::Inet(crate::handshake::cm::CmListener::bind(addr, cfg)?),
        })
    }

    #[cfg(not(feature = "verbs"))]
    fn bind_inet(addr: &std::net::SocketAddr, _cfg: Config) -> io::Result<RdmaListener> {
        Err(inet_allowed(&Address::Inet(*addr))
            .err()
            .unwrap_or_else(|| no_verbs(addr)))
    }

    /// Where this listener listens: its path, or its IP address with the port it
    /// got.
    ///
    /// # Errors
    ///
    /// rdma_cm failing to report the address.
    pub fn local_addr(&self) -> io::Result<Address> {
        match &self.inner {
            Listening::Unix { path, .. } => Ok(Address::Unix(path.clone())),
            #[cfg(feature = "verbs")]
            Listening::Inet(l) => l.local_addr().map(Address::Inet),
        }
    }

    /// The fabric connections are made on, for a listener on a Unix socket path;
    /// `None` for one on an IP address, whose connections are on the verbs fabric of
    /// the device each arrives on.
    ///
    /// ```
    /// use rdma_channel::fabric::Fabric;
    /// let dir = std::env::temp_dir().join(format!("rch-doc-fabric-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let listener = rdma_channel::RdmaListener::bind(dir.join("sock"))?;
    /// println!("listening on the {} fabric", listener.fabric().unwrap().name());
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn fabric(&self) -> Option<&AnyFabric> {
        match &self.inner {
            Listening::Unix { fabric, .. } => Some(fabric),
            #[cfg(feature = "verbs")]
            Listening::Inet(_) => None,
        }
    }

    /// Waits for a peer and connects to it. Handshakes run side by side: a client
    /// that connects and says nothing (or stops halfway) delays no other, and is
    /// dropped (told why where possible) once its handshake passes the connect
    /// timeout ([`Config::with_connect_timeout`]); so is one whose handshake fails.
    ///
    /// # Errors
    ///
    /// Only a failure of the listener itself.
    pub fn accept(&self) -> io::Result<RdmaStream> {
        match &self.inner {
            Listening::Unix {
                listener,
                cfg,
                fabric,
                handshakes,
                ..
            } => {
                let mut pending = handshakes.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if let Some(c) = step_handshakes(listener, cfg, fabric, &mut pending)? {
                        return Ok(RdmaStream::from_channel(c));
                    }
                }
            }
            #[cfg(feature = "verbs")]
            Listening::Inet(l) => {
                // A stream's connection request carries no hello.
                let mut streams_only = |hello: &[u8]| {
                    if hello.is_empty() {
                        Ok(())
                    } else {
                        Err("this listener takes streams, not process-group connections".into())
                    }
                };
                loop {
                    if let Some(crate::handshake::cm::Accepted::Up(mut c)) =
                        l.accept(None, &mut streams_only)?
                    {
                        c.channel.connect_rails(l.config().connect_timeout())?;
                        let mut s = RdmaStream::from_channel(c.channel);
                        s.peer = Some(Address::Inet(c.peer));
                        s.local = Some(Address::Inet(c.local));
                        return Ok(s);
                    }
                }
            }
        }
    }
}

/// A client of a listener on a Unix socket, between `accept(2)` and the end of its
/// handshake.
struct Handshake {
    sock: UnixStream,
    deadline: Instant,
    /// Connected and `ACCEPT` sent: waiting for `READY` before anything is written.
    accepted: Option<Channel<AnyFabric>>,
}

/// Longest wait for the rest of a frame once its first bytes are readable: a client
/// that stops mid-frame holds the others up for no longer than this. Not shorter:
/// with 100 ms, 8 processes connecting over verbs in a Soft-RoCE VM (the soak, in
/// CI) saw the listener drop good clients in 2 runs of 3 (the host's CPUs busy);
/// with 2 s, none in 6.
const REST_OF_FRAME: Duration = Duration::from_millis(2000);

/// One step of a listener: takes the clients waiting in `listener`'s backlog, waits
/// (in `poll(2)`, at most until the nearest handshake deadline) until the listener
/// or one of the handshakes under way has something to read, and moves every
/// readable handshake on by one frame. Returns the first connection whose
/// handshake finished. Handshakes past their deadline are dropped, their clients
/// told so.
fn step_handshakes(
    listener: &UnixListener,
    cfg: &Config,
    fabric: &AnyFabric,
    pending: &mut Vec<Handshake>,
) -> io::Result<Option<Channel<AnyFabric>>> {
    loop {
        match listener.accept() {
            Ok((sock, _)) => pending.push(Handshake {
                sock,
                deadline: Instant::now() + cfg.connect_timeout(),
                accepted: None,
            }),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // The client gave up before we took it: not the listener's failure.
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
            Err(e) => return Err(e),
        }
    }
    let now = Instant::now();
    pending.retain(|h| {
        let alive = h.deadline > now;
        if !alive {
            let _ = unix::send(&h.sock, unix::TAG_CLOSED, b"handshake timed out", None);
        }
        alive
    });
    use std::os::fd::AsRawFd;
    let mut fds = Vec::with_capacity(pending.len() + 1);
    fds.push(libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    for h in pending.iter() {
        fds.push(libc::pollfd {
            fd: h.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
    }
    let wait = pending
        .iter()
        .map(|h| h.deadline.saturating_duration_since(now))
        .min()
        .unwrap_or(Duration::from_secs(1))
        .min(Duration::from_secs(1));
    let ms = libc::c_int::try_from(wait.as_millis() + 1).unwrap_or(1000);
    // SAFETY: `fds` is a live array of initialised pollfds of the length passed.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(None)
        } else {
            Err(e)
        };
    }
    // Walk the handshakes that have something to read (hang-ups included), from the
    // back so that removing one keeps the indices of the rest.
    for i in (0..pending.len()).rev() {
        if fds[i + 1].revents == 0 {
            continue;
        }
        let h = &mut pending[i];
        let by = h.deadline.min(Instant::now() + REST_OF_FRAME);
        match h.accepted.take() {
            None => {
                let prepare = || Prepared::new(fabric.for_connection()?, cfg.clone());
                match unix::accept_hello(&h.sock, prepare, streams_only, by) {
                    Ok((c, _)) => h.accepted = Some(c),
                    // A client whose handshake fails (silent, malformed, another
                    // fabric, a refused hello) is dropped, told why where it can be.
                    Err(_) => {
                        pending.swap_remove(i);
                    }
                }
            }
            Some(c) => {
                let ready = unix::accept_ready(&h.sock, by);
                pending.swap_remove(i);
                if ready.is_ok() {
                    return Ok(Some(c));
                }
            }
        }
    }
    Ok(None)
}

/// The hello check of a listener for streams: a stream's `HELLO` carries no hello (a
/// process group's carries ranks).
fn streams_only(hello: &[u8]) -> Result<(), String> {
    if hello.is_empty() {
        Ok(())
    } else {
        Err("this listener takes streams, not process-group connections".into())
    }
}
