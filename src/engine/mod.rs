//! The put/get engine: the RDMA Channel of seed 001 (Liu et al., *Design and
//! Implementation of MPICH2 over InfiniBand with RDMA Support*, IPDPS 2004) on any
//! [`Fabric`].
//!
//! A [`Channel`] is one connection. Its [`Sender`] writes packets into the ring that
//! lives in the peer's memory; its [`Receiver`] reads packets from the ring in local
//! memory that the peer writes. Both are non-blocking and return how many bytes they
//! moved (possibly 0), in FIFO order; the caller retries the rest (seed 001 sec. 3.2).
//!
//! Besides the two rings, each side has a small *control region* the peer writes
//! ([`CtrlWord`](crate::ring::memory::CtrlWord) names each word and its offset):
//!
//! | word | written by the peer as | meaning |
//! | --- | --- | --- |
//! | `Tail` | receiver of our ring | its tail (explicit, delayed update) |
//! | `ReceiverClosed` | receiver of our ring | nonzero once it stopped reading |
//! | `ZeroCopyDone` | receiver of our ring | number of the last zero-copy announcement it has read in full |
//! | `PathAdvice` | receiver of our ring | the path it measured cheaper for large buffers that may go either way (`zerocopy/choose.rs`) |
//! | `BellWanted` | receiver of our ring | number of its last request to ring its process's doorbell after our next write |
//! | `CreditRequest` | sender into our ring | credit request: the tail it knows + 1, when out of room |
//! | `EndOfStream` | sender into our ring | end of stream: its final head + 1 (top bit: it went away with a zero-copy transfer unconfirmed) |
//! | `LendLanded` | sender into our ring | number of the last lend it pushed in full |
//! | `RingWanted` | sender into our ring | number of the ring offer it asks for (it found our ring full) |
//! | `RingDeclined` | sender into our ring | number of the last ring offer it declined |
//!
//! The rooms: `link.rs` (what both halves share), `connect.rs` ([`Prepared`]),
//! `sender.rs`, `receiver.rs`, `card.rs` (the connection card), `wait.rs`
//! ([`Backoff`]), and `zerocopy/` (caller memory lent to the fabric). Raw memory is
//! behind the types of [`ring::memory`](crate::ring::memory): the protocol's code has
//! no `unsafe`. What does is named: the zero-copy entry points, whose contracts are
//! `unsafe`, and the code relying on them (`zerocopy/`), and `wait.rs`'s two `prctl`
//! calls for the thread's timer slack.
//!
//! Tail updates (seed 001 sec. 4.3) travel piggybacked in every packet of the reverse
//! direction, and explicitly (one 8-byte write) when the consumed-but-unannounced
//! bytes pass the threshold, or when the sender asked for credit. The credit request
//! is what makes "both rings full" safe: a sender that cannot progress says so, and
//! the receiver answers as soon as it has consumed anything, even if the piggybacked
//! updates it sent sit unread in the other ring.
//!
//! Large buffers can travel zero-copy (seed 001 sec. 5): the sender registers them
//! through its protection domain's [registration cache](crate::rcache), writes a
//! [`Rendezvous`](crate::ring::wire::Rendezvous) packet naming them into the ring and keeps them untouched; the
//! receiver, on reaching that packet in FIFO order, pulls the bytes straight into the
//! caller's buffers with RDMA READ, then writes the announcement's number into the
//! sender's `ZeroCopyDone` word. See [`Sender::put_nocopy`] for the contract.

pub mod card;
mod connect;
pub(crate) mod lane;
mod link;
mod receiver;
mod sender;
pub mod stripe;
mod wait;
mod zerocopy;

pub use card::CTRL_SIZE;
pub use connect::Prepared;
pub(crate) use link::Link;
pub(crate) use receiver::{
    GetMode, LentPart, QuietWatch, ReadsInFlight, Stripe, QUIET_WATCH_WORDS, READ_PIECE,
};
pub use receiver::{Peeked, Receiver};
pub(crate) use sender::{Announce, InFlightSeg, PendingZc, ZeroCopy};
pub use sender::{Lending, Sender};
pub use wait::Backoff;
pub(crate) use wait::{available_cpus, CONTENDED_SPIN};

pub use crate::rcache::RdmaBuf;

use std::io::{self, IoSlice, IoSliceMut};
use std::sync::Arc;

use crate::config::Config;
use crate::fabric::Fabric;
use crate::rcache::{CacheStats, RegCache};

/// One connection: a [`Sender`] and a [`Receiver`].
pub struct Channel<F: Fabric> {
    tx: Sender<F>,
    rx: Receiver<F>,
}

impl<F: Fabric> Channel<F> {
    /// Connects the rails whose cards did not travel with the connection's own
    /// (a handshake through rdma_cm, whose private data has no room for them: the
    /// card then says only how many rails an end has, and
    /// [`Prepared::card_rails_in_band`] makes such a card). Both ends call it once
    /// the channel is up; it exchanges the cards over rail 0 and returns once both
    /// ends' rails are connected. Returns at once where there are none to connect.
    /// `RdmaStream::connect` and `RdmaListener::accept` call it themselves.
    ///
    /// # Errors
    ///
    /// `TimedOut` when the peer's cards or its word that its rails are up do not
    /// come within `timeout`; `InvalidData` for malformed cards; fabric failures.
    pub fn connect_rails(&mut self, timeout: std::time::Duration) -> io::Result<()> {
        self.rx.link.connect_rails(timeout)
    }

    /// One step of [`connect_rails`](Self::connect_rails) that never waits, for
    /// callers that drive many connections from one loop (a process group does):
    /// true once both ends' rails are connected (at once where there are none to
    /// connect). Until then, neither put nor get on this channel: the peer may not
    /// be able to serve a read through its rails yet.
    ///
    /// # Errors
    ///
    /// As [`connect_rails`](Self::connect_rails), but never `TimedOut`: the caller
    /// keeps its own deadline.
    pub fn poll_connect_rails(&mut self) -> io::Result<bool> {
        self.rx.link.step_rails()
    }

    /// Non-blocking put: see [`Sender::put`].
    ///
    /// # Errors
    ///
    /// As [`Sender::put`].
    pub fn put(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        self.tx.put(iov)
    }

    /// Non-blocking get: see [`Receiver::get`].
    ///
    /// # Errors
    ///
    /// As [`Receiver::get`].
    pub fn get(&mut self, iov: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.rx.get(iov)
    }

    /// Splits into the two directions, usable from different threads.
    ///
    /// ```
    /// use std::io::{IoSlice, IoSliceMut};
    /// use rdma_channel::fabric::emulated::EmuFabric;
    /// use rdma_channel::{Channel, Config, Prepared};
    /// let a = Prepared::new(EmuFabric::new()?, Config::default())?;
    /// let b = Prepared::new(EmuFabric::new()?, Config::default())?;
    /// let (ca, cb) = (a.card()?, b.card()?);
    /// let (a, mut b) = (a.connect(cb)?, b.connect(ca)?);
    /// let (rx, mut tx) = a.split();
    /// std::thread::spawn(move || tx.put(&[IoSlice::new(b"x")])).join().unwrap()?;
    /// let mut buf = [0u8; 1];
    /// while b.get(&mut [IoSliceMut::new(&mut buf)])? == 0 {}
    /// assert!(Channel::unsplit(rx, b.split().1).is_err()); // halves of different channels
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn split(self) -> (Receiver<F>, Sender<F>) {
        (self.rx, self.tx)
    }

    /// Rejoins halves split from the same channel.
    ///
    /// # Errors
    ///
    /// Returns the halves if they belong to different channels.
    // The halves come back by value on a mismatch, as with tokio's `reunite`; boxing
    // them would only move the size to the heap.
    #[allow(clippy::result_large_err)]
    pub fn unsplit(rx: Receiver<F>, tx: Sender<F>) -> Result<Channel<F>, (Receiver<F>, Sender<F>)> {
        if Arc::ptr_eq(&rx.link, &tx.link) {
            Ok(Channel { tx, rx })
        } else {
            Err((rx, tx))
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.tx.link.cfg
    }

    /// Allocates `len` bytes of registered memory for zero-copy sends (like
    /// `MPI_Alloc_mem` or `ucp_mem_map`): see [`Sender::alloc_mem`].
    ///
    /// # Errors
    ///
    /// As [`Sender::alloc_mem`].
    pub fn alloc_mem(&self, len: usize) -> io::Result<RdmaBuf<F>> {
        self.tx.alloc_mem(len)
    }

    /// Counters of the registration cache of this connection's protection domain (shared by its connections).
    pub fn cache_stats(&self) -> CacheStats {
        self.tx.cache_stats()
    }

    /// The registration cache of this connection's protection domain: its counters, its limits, how it detects
    /// unmapped memory, and [`RegCache::invalidate`] for memory the program is about
    /// to remap behind the cache's back (only needed where the automatic detection is
    /// unavailable).
    pub fn registration_cache(&self) -> &RegCache<F> {
        &self.tx.link.rcache
    }

    /// The sending half.
    pub fn sender(&mut self) -> &mut Sender<F> {
        &mut self.tx
    }

    /// The receiving half.
    pub fn receiver(&mut self) -> &mut Receiver<F> {
        &mut self.rx
    }
}
