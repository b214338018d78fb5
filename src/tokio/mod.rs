//! Async Rust on a tokio runtime (feature `tokio`): [`AsyncStream`] and its halves
//! implement tokio's `AsyncRead` and `AsyncWrite`, and [`AsyncListener`] accepts.
//!
//! A read that finds nothing asks the peer's sender to wake it after its next write
//! and parks the task on an eventfd registered in the runtime's reactor (`AsyncFd`):
//! the same request and wake as [`Selector`](crate::select::Selector)'s, so an idle
//! task costs no CPU and the data path pays nothing. Before it parks it orders the
//! request before one more look with `membarrier`, as the selector does. A write that
//! finds the peer's ring full parks the same way, on an eventfd of its own that the
//! peer's receiver wakes when it answers the credit request. On verbs with wakes on
//! (`RCH_IB_WAKE=select` or `1`) the task parks on the connection's completion channel instead
//! (a duplicate of its descriptor in the reactor), armed before the last look. Where
//! the peer cannot wake it at all (verbs without wakes), the task naps on the
//! runtime's timer instead, 10 us doubling to 1 ms as asked (tokio's timer rounds
//! each up to its 1 ms granularity).
//! The blocking API is unchanged and costs the same.
//!
//! ```
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! rt.block_on(async {
//!     let (mut a, mut b) = rdma_channel::tokio::AsyncStream::pair()?;
//!     let echo = tokio::spawn(async move {
//!         let mut buf = [0u8; 5];
//!         b.read_exact(&mut buf).await?;
//!         b.write_all(&buf).await?;
//!         Ok::<_, std::io::Error>(b)
//!     });
//!     a.write_all(b"hello").await?;
//!     let mut back = [0u8; 5];
//!     a.read_exact(&mut back).await?;
//!     assert_eq!(&back, b"hello");
//!     echo.await.unwrap()?;
//!     Ok::<(), std::io::Error>(())
//! })?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::future::Future;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::engine::{Receiver, Sender};
use crate::fabric::any::AnyFabric;
use crate::fabric::Fabric;
use crate::stream::{RdmaListener, RdmaStream, ReadHalf, ToAddress, WriteHalf};

/// The first nap of a wait no wake ends; naps double up to [`LONGEST_NAP`].
const FIRST_NAP: Duration = Duration::from_micros(10);
const LONGEST_NAP: Duration = Duration::from_millis(1);

/// Timer naps, growing while the wait lasts.
#[derive(Debug)]
struct Nap {
    sleep: Option<Pin<Box<::tokio::time::Sleep>>>,
    next: Duration,
}

impl Nap {
    fn new() -> Nap {
        Nap {
            sleep: None,
            next: FIRST_NAP,
        }
    }

    /// Ready once the current nap is over (a new one starts at the first poll).
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let next = self.next;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(::tokio::time::sleep(next)));
        ready!(sleep.as_mut().poll(cx));
        self.sleep = None;
        self.next = (self.next * 2).min(LONGEST_NAP);
        Poll::Ready(())
    }

    fn reset(&mut self) {
        self.sleep = None;
        self.next = FIRST_NAP;
    }
}

/// What a wait waits on: the receiving engine for data, the sending one for room.
trait Waitable {
    /// True when the call waited for would not come back empty (data, room, the
    /// end, an error, which the call reports).
    fn is_ready(&mut self) -> bool;
    /// Asks the peer to wake eventfd `fd` of `instance` when it may be; false where
    /// it cannot.
    fn ask_wake(&mut self, fd: u32, instance: u32) -> io::Result<bool>;
    /// Arms the fabric's own wake and returns the descriptor it makes readable
    /// (verbs: the completion channel); `None` where the fabric has none.
    fn arm_fd(&mut self) -> io::Result<Option<RawFd>>;
    /// The armed descriptor fired: take its events.
    fn fd_fired(&mut self);
}

impl<F: Fabric> Waitable for Receiver<F> {
    fn is_ready(&mut self) -> bool {
        !matches!(self.poll_readable(), Ok(false))
    }

    fn ask_wake(&mut self, fd: u32, instance: u32) -> io::Result<bool> {
        self.ask_for_wake(fd, instance, 0)
    }

    fn arm_fd(&mut self) -> io::Result<Option<RawFd>> {
        Ok(self.link.arm_wake_fd())
    }

    fn fd_fired(&mut self) {
        self.link.wake_fired();
    }
}

impl<F: Fabric> Waitable for Sender<F> {
    fn is_ready(&mut self) -> bool {
        !matches!(self.poll_writable(), Ok(false))
    }

    fn ask_wake(&mut self, fd: u32, instance: u32) -> io::Result<bool> {
        self.ask_for_room_wake(fd, instance, 0)
    }

    fn arm_fd(&mut self) -> io::Result<Option<RawFd>> {
        self.arm_room_wake_fd()
    }

    fn fd_fired(&mut self) {
        self.link.wake_fired();
    }
}

/// How an end waits: its eventfd in the reactor, whether the peer was asked to
/// write it, and naps for a peer that cannot.
#[derive(Debug)]
struct Wait {
    efd: AsyncFd<OwnedFd>,
    /// The eventfd's instance (`select::wake_instance`).
    instance: u32,
    /// A wake is armed or asked for: the next step parks.
    asked: bool,
    /// ... and it is the completion channel's (`channel`), not the eventfd's.
    on_channel: bool,
    /// A duplicate of the connection's completion channel in the reactor (verbs with
    /// wakes), made at the first wait that armed it. A duplicate, because the
    /// stream's two halves may each register one (epoll takes a descriptor number
    /// once) and so that its lifetime is the wait's own.
    channel: Option<AsyncFd<OwnedFd>>,
    nap: Nap,
}

impl Wait {
    fn new() -> io::Result<Wait> {
        // SAFETY: eventfd takes a count and flags and returns a descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor; nobody else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an OwnedFd of an open eventfd, which the AsyncFd owns from now on:
        // it stays open and its as_raw_fd stays the same until the AsyncFd goes.
        let efd = unsafe { AsyncFd::register_with_interest(fd, ::tokio::io::Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Wait {
            efd,
            instance: crate::select::wake_instance(),
            asked: false,
            on_channel: false,
            channel: None,
            nap: Nap::new(),
        })
    }

    /// Arms the fabric's own wake where it has one, registering its descriptor
    /// the first time; false where it has none.
    fn arm_channel(&mut self, end: &mut impl Waitable) -> io::Result<bool> {
        let Some(fd) = end.arm_fd()? else {
            return Ok(false);
        };
        if self.channel.is_none() {
            // SAFETY: F_DUPFD_CLOEXEC on a descriptor the connection keeps open
            // (it was just armed) returns a new one or -1.
            let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
            if dup < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: the kernel just returned this descriptor; nobody else owns it.
            let dup = unsafe { OwnedFd::from_raw_fd(dup) };
            // SAFETY: an OwnedFd of an open descriptor, which the AsyncFd owns from
            // now on: it stays open and keeps its number until the AsyncFd goes.
            let registered =
                unsafe { AsyncFd::register_with_interest(dup, ::tokio::io::Interest::READABLE) }
                    .map_err(io::Error::from)?;
            self.channel = Some(registered);
        }
        Ok(true)
    }

    /// Ready when `end` is.
    fn poll_ready(
        &mut self,
        end: &mut impl Waitable,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if end.is_ready() {
                // What made it ready may have used our request: ask again next time.
                self.asked = false;
                self.nap.reset();
                return Poll::Ready(Ok(()));
            }
            if !self.asked {
                if self.arm_channel(end)? {
                    // Armed before the look below: what lands after it fires.
                    self.asked = true;
                    self.on_channel = true;
                    continue;
                }
                self.on_channel = false;
                let fd = self.efd.get_ref().as_raw_fd() as u32;
                if end.ask_wake(fd, self.instance)? && crate::sync::full_barrier() {
                    // The request is out and ordered: one more look before parking.
                    self.asked = true;
                    continue;
                }
                // This peer cannot wake us.
                ready!(self.nap.poll(cx));
                continue;
            }
            if let Some(channel) = self.channel.as_ref().filter(|_| self.on_channel) {
                let mut guard = ready!(channel.poll_read_ready(cx))?;
                // Cleared before the events are taken: an event after the take is a
                // new edge, which marks the descriptor ready again.
                guard.clear_ready();
                end.fd_fired();
                self.asked = false;
                continue;
            }
            let mut guard = ready!(self.efd.poll_read_ready(cx))?;
            let mut v = [0u8; 8];
            // SAFETY: a nonblocking eventfd we own, and 8 writable bytes.
            let _ = unsafe { libc::read(self.efd.get_ref().as_raw_fd(), v.as_mut_ptr().cast(), 8) };
            guard.clear_ready();
            self.asked = false;
        }
    }
}

/// A read into `buf` by `get`, waiting through `wait` while nothing has arrived.
fn poll_read_with<F: Fabric>(
    rx: &mut Receiver<F>,
    wait: &mut Wait,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    if buf.remaining() == 0 {
        return Poll::Ready(Ok(()));
    }
    loop {
        let dst = buf.initialize_unfilled();
        match rx.get(&mut [IoSliceMut::new(dst)]) {
            Ok(0) => ready!(wait.poll_ready(rx, cx))?,
            Ok(n) => {
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            // The end of the stream: an async read returns nothing.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Poll::Ready(Ok(())),
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

/// A put of `bufs`, waiting for room while the ring is full.
fn poll_write_with<F: Fabric>(
    tx: &mut Sender<F>,
    wait: &mut Wait,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    if bufs.iter().all(|b| b.is_empty()) {
        return Poll::Ready(Ok(0));
    }
    loop {
        match tx.put(bufs) {
            Ok(0) => ready!(wait.poll_ready(tx, cx))?,
            r => return Poll::Ready(r),
        }
    }
}

/// An [`RdmaStream`] for tokio: `AsyncRead` and `AsyncWrite`.
#[derive(Debug)]
pub struct AsyncStream<F: Fabric = AnyFabric> {
    inner: RdmaStream<F>,
    read: Wait,
    write: Wait,
}

impl AsyncStream {
    /// Two connected streams in this process (as [`RdmaStream::pair`]).
    ///
    /// # Errors
    ///
    /// As [`RdmaStream::pair`]; the eventfds cannot be made.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with I/O enabled, as tokio's own I/O types.
    pub fn pair() -> io::Result<(AsyncStream, AsyncStream)> {
        let (a, b) = RdmaStream::pair()?;
        Ok((AsyncStream::new(a)?, AsyncStream::new(b)?))
    }

    /// Connects to `addr` (as [`RdmaStream::connect`]), on a blocking thread of the
    /// runtime: the handshake's system calls block.
    ///
    /// # Errors
    ///
    /// As [`RdmaStream::connect`].
    pub async fn connect<A: ToAddress + Send + 'static>(addr: A) -> io::Result<AsyncStream> {
        let s = ::tokio::task::spawn_blocking(move || RdmaStream::connect(addr))
            .await
            .map_err(io::Error::other)??;
        AsyncStream::new(s)
    }
}

impl<F: Fabric> AsyncStream<F> {
    /// `stream`, for tokio.
    ///
    /// # Errors
    ///
    /// The eventfd cannot be made.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with I/O enabled, as tokio's own I/O types.
    pub fn new(stream: RdmaStream<F>) -> io::Result<AsyncStream<F>> {
        Ok(AsyncStream {
            inner: stream,
            read: Wait::new()?,
            write: Wait::new()?,
        })
    }

    /// The blocking stream back.
    pub fn into_inner(self) -> RdmaStream<F> {
        self.inner
    }

    /// The stream, for its non-blocking calls (`put`, `get`, `peek`, ...).
    pub fn get_mut(&mut self) -> &mut RdmaStream<F> {
        &mut self.inner
    }

    /// Two halves that move to different tasks.
    pub fn into_split(self) -> (AsyncReadHalf<F>, AsyncWriteHalf<F>) {
        let (r, w) = self.inner.split();
        (
            AsyncReadHalf {
                inner: r,
                read: self.read,
            },
            AsyncWriteHalf {
                inner: w,
                write: self.write,
            },
        )
    }
}

// Nothing here is pinned in place: the engine's state moves freely (the rings are
// behind pointers), so the wrappers are Unpin whatever the fabric's types.
impl<F: Fabric> Unpin for AsyncStream<F> {}
impl<F: Fabric> Unpin for AsyncReadHalf<F> {}
impl<F: Fabric> Unpin for AsyncWriteHalf<F> {}

impl<F: Fabric> AsyncRead for AsyncStream<F> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        poll_read_with(me.inner.channel().receiver(), &mut me.read, cx, buf)
    }
}

// AsyncStream's and AsyncWriteHalf's AsyncWrite, which differ only in how they
// reach the sender and end their direction.
macro_rules! async_write {
    ($ty:ident, |$me:ident| $sender:expr, $shutdown:expr) => {
        impl<F: Fabric> AsyncWrite for $ty<F> {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                data: &[u8],
            ) -> Poll<io::Result<usize>> {
                let $me = self.get_mut();
                poll_write_with($sender, &mut $me.write, cx, &[IoSlice::new(data)])
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                let $me = self.get_mut();
                poll_write_with($sender, &mut $me.write, cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                true
            }

            /// Nothing is buffered here: a put is in the peer's ring when it returns.
            fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }

            /// Ends this direction (the peer's reads then end).
            fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                let $me = self.get_mut();
                Poll::Ready($shutdown)
            }
        }
    };
}

async_write!(
    AsyncStream,
    |me| me.inner.channel().sender(),
    me.inner.shutdown_write()
);

/// The reading half of an [`AsyncStream`].
#[derive(Debug)]
pub struct AsyncReadHalf<F: Fabric = AnyFabric> {
    inner: ReadHalf<F>,
    read: Wait,
}

impl<F: Fabric> AsyncRead for AsyncReadHalf<F> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        poll_read_with(me.inner.rx(), &mut me.read, cx, buf)
    }
}

/// The writing half of an [`AsyncStream`].
#[derive(Debug)]
pub struct AsyncWriteHalf<F: Fabric = AnyFabric> {
    inner: WriteHalf<F>,
    write: Wait,
}

async_write!(AsyncWriteHalf, |me| me.inner.sender(), me.inner.shutdown());

/// An [`RdmaListener`] for tokio: [`accept`](Self::accept) runs the blocking
/// accept and handshake on a blocking thread of the runtime.
#[derive(Debug, Clone)]
pub struct AsyncListener {
    inner: Arc<RdmaListener>,
}

impl AsyncListener {
    /// Listens at `addr` (as [`RdmaListener::bind`]).
    ///
    /// # Errors
    ///
    /// As [`RdmaListener::bind`].
    pub fn bind<A: ToAddress>(addr: A) -> io::Result<AsyncListener> {
        Ok(AsyncListener {
            inner: Arc::new(RdmaListener::bind(addr)?),
        })
    }

    /// The next connection.
    ///
    /// # Errors
    ///
    /// As [`RdmaListener::accept`]; the eventfd cannot be made.
    pub async fn accept(&self) -> io::Result<AsyncStream> {
        let l = Arc::clone(&self.inner);
        let s = ::tokio::task::spawn_blocking(move || l.accept())
            .await
            .map_err(io::Error::other)??;
        AsyncStream::new(s)
    }

    /// The blocking listener.
    pub fn get_ref(&self) -> &RdmaListener {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use ::tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::AsyncStream;

    fn runtime() -> ::tokio::runtime::Runtime {
        ::tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A large message that fills the ring many times over arrives whole, written by
    /// one task and read by another on one thread, and a short answer comes back.
    #[test]
    fn tasks_exchange_through_a_pair() {
        runtime().block_on(async {
            let (a, b) = AsyncStream::pair().unwrap();
            let (mut ar, mut aw) = a.into_split();
            let (mut br, mut bw) = b.into_split();
            let len = 8 << 20;
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let sent = data.clone();
            let writer = ::tokio::spawn(async move {
                aw.write_all(&sent).await.unwrap();
                aw.shutdown().await.unwrap();
            });
            let echo = ::tokio::spawn(async move {
                let mut got = Vec::new();
                br.read_to_end(&mut got).await.unwrap();
                bw.write_all(&got[..16]).await.unwrap();
                got
            });
            let mut first = [0u8; 16];
            ar.read_exact(&mut first).await.unwrap();
            writer.await.unwrap();
            let got = echo.await.unwrap();
            assert_eq!(got.len(), len);
            assert!(got == data);
            assert_eq!(&first[..], &data[..16]);
        });
    }

    /// With rails, a large write goes through the sender's relay slots; with all of
    /// them unread it parks, and the peer's confirmation of a read wakes it (the
    /// receiver wakes the named room waiter after each): 8 MiB, twice the slots,
    /// arrive whole. A lost wake would leave the writer parked past the limit.
    #[test]
    fn a_write_parked_on_relay_slots_is_woken_by_the_peers_read() {
        runtime().block_on(async {
            let rails = crate::config::RailSpec::parse_list("@4g,@2g").unwrap();
            let cfg = crate::Config::default().with_rails(rails);
            let (a, b) = crate::RdmaStream::pair_with(cfg).unwrap();
            let (mut a, mut b) = (AsyncStream::new(a).unwrap(), AsyncStream::new(b).unwrap());
            let len = 8 << 20;
            let data: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
            let sent = data.clone();
            let writer = ::tokio::spawn(async move {
                a.write_all(&sent).await.unwrap();
                a
            });
            let mut got = vec![0u8; len];
            ::tokio::time::timeout(std::time::Duration::from_secs(60), b.read_exact(&mut got))
                .await
                .expect("the writer was woken each time a slot was read")
                .unwrap();
            let mut a = writer.await.unwrap();
            assert!(got == data, "bytes differ");
            let relayed = a.get_mut().channel().sender().relayed_bytes();
            assert!(relayed >= 7 << 20, "{relayed} bytes relayed");
        });
    }

    /// A task parked on an empty stream is woken by the peer's write through its
    /// eventfd: the writer (a thread with the blocking stream) writes only once the
    /// request for the wake is out, and a task whose peer can wake it sets no timer,
    /// so a lost wake would leave it parked until the test's own limit fails it.
    #[test]
    fn a_parked_read_is_woken_by_the_peers_write() {
        runtime().block_on(async {
            let (a, mut b) = crate::RdmaStream::pair().unwrap();
            let mut a = AsyncStream::new(a).unwrap();
            let link = std::sync::Arc::clone(&b.channel().sender().link);
            let writer = std::thread::spawn(move || {
                for round in 1..=3u64 {
                    while link.ctrl.bell_wanted() < round {
                        std::thread::yield_now();
                    }
                    std::io::Write::write_all(&mut b, &[round as u8]).unwrap();
                }
                b
            });
            for round in 1..=3u8 {
                let mut one = [0u8; 1];
                ::tokio::time::timeout(std::time::Duration::from_secs(60), a.read_exact(&mut one))
                    .await
                    .expect("the write woke the parked read")
                    .unwrap();
                assert_eq!(one[0], round);
            }
            writer.join().unwrap();
        });
    }
}
