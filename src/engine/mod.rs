//! The put/get engine: seed 001's RDMA Channel on any [`Fabric`].
//!
//! A [`Channel`] is one connection. Its [`Sender`] writes packets into the ring that
//! lives in the peer's memory; its [`Receiver`] reads packets from the ring in local
//! memory that the peer writes. Both are non-blocking and return how many bytes they
//! moved (possibly 0), in FIFO order; the caller retries the rest (seed 001 sec. 3.2).
//!
//! Besides the two rings, each side has a small *control region* the peer writes:
//!
//! | offset | written by the peer as | meaning |
//! | --- | --- | --- |
//! | 0 | receiver of our ring | its tail (explicit, delayed update) |
//! | 8 | receiver of our ring | nonzero once it stopped reading |
//! | 16 | receiver of our ring | number of the last zero-copy announcement it has read in full |
//! | 64 | sender into our ring | credit request: the tail it knows + 1, when out of room |
//! | 72 | sender into our ring | end of stream: its final head + 1 |
//!
//! Tail updates (seed 001 sec. 4.3) travel piggybacked in every packet of the reverse
//! direction, and explicitly (one 8-byte write) when the consumed-but-unannounced
//! bytes pass the threshold, or when the sender asked for credit. The credit request
//! is what makes "both rings full" safe: a sender that cannot progress says so, and
//! the receiver answers as soon as it has consumed anything, even if the piggybacked
//! updates it sent sit unread in the other ring.
//!
//! Large buffers can travel zero-copy (seed 001 sec. 5): the sender registers them
//! through the connection's [registration cache](crate::rcache), writes a
//! [`Rendezvous`] packet naming them into the ring and keeps them untouched; the
//! receiver, on reaching that packet in FIFO order, pulls the bytes straight into the
//! caller's buffers with RDMA READ, then writes the announcement's number into the
//! sender's control word 16. See [`Sender::put_nocopy`] for the contract.

pub mod card;
mod wait;

pub use card::CTRL_SIZE;
pub use wait::Backoff;

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::Config;
use crate::fabric::{
    Access, Card, CompletionStatus, Fabric, MemoryRegion, Opcode, PendingQp, QpState, QueuePair,
    RemoteRegion, Sge, WorkRequest,
};
use crate::rcache::{CacheLimits, CacheStats, RegCache, RegHandle};
use crate::ring::wire::{
    cells_for, trailer_word, Header, PacketKind, Rendezvous, RndvSeg, CELL, HEADER_LEN,
    MAX_RNDV_SEGS, ONE_CELL_PAYLOAD, OVERHEAD, TRAILER_LEN,
};
use crate::ring::{boundary_offsets, max_payload_now, PAYLOAD_OFFSET};
use card::ConnCard;

const CTRL_TAIL: u64 = 0;
const CTRL_RX_CLOSED: u64 = 8;
const CTRL_ZC_DONE: u64 = 16;
const CTRL_CREDIT: u64 = 64;
const CTRL_FIN: u64 = 72;

/// Most gather entries one packet uses (header, payload pieces, padding, trailer).
const MAX_SGE: usize = 32;
/// Empty polls between two checks of the queue pair's health.
const HEALTH_EVERY: u32 = 1024;

/// Zero bytes that padding (and pad packets) are gathered from.
static ZEROS: [u8; 8 * CELL] = [0; 8 * CELL];
/// Largest single RDMA READ of the zero-copy path: big enough to amortise a request,
/// small enough that several are in flight for a pipelined transfer.
const READ_PIECE: usize = 1 << 20;
/// Most zero-copy reads one receiver keeps in flight.
const MAX_READS_IN_FLIGHT: usize = 16;

/// One cell, aligned like the ring's cells so the copy into the ring is aligned too.
#[repr(C, align(64))]
struct Cell([u8; CELL]);

/// State both halves of a connection share.
struct Link<F: Fabric> {
    qp: F::Qp,
    /// Incoming ring (the peer writes it).
    ring: F::Region,
    /// Control words the peer writes.
    ctrl: F::Region,
    /// Registered copy of the outgoing ring for packets too long to write inline.
    staging: Option<F::Region>,
    peer_ring: RemoteRegion,
    peer_ctrl: RemoteRegion,
    /// Master tail of the incoming ring (bytes fully consumed).
    rx_tail: AtomicU64,
    /// Highest incoming tail sent to the peer in an explicit update.
    rx_explicit: AtomicU64,
    /// Highest incoming tail sent to the peer piggybacked on a packet.
    rx_piggy: AtomicU64,
    /// Credit request value last answered.
    credit_served: AtomicU64,
    /// Highest tail of the outgoing ring seen piggybacked on incoming packets.
    tx_tail_piggy: AtomicU64,
    /// Serialises explicit control writes so that they reach the peer in value order.
    publish: Mutex<()>,
    /// Send queue accounting, for fabrics whose queue needs signalled completions.
    sq: SendQueue,
    /// First error seen, after which every call fails.
    broken: Mutex<Option<(io::ErrorKind, String)>>,
    is_broken: AtomicBool,
    /// Zero-copy thresholds in force, as (allocated memory, other memory).
    zc_thresholds: (usize, usize),
    /// Registrations of user buffers for the zero-copy path (dropped before the fabric).
    rcache: RegCache<F>,
    cfg: Config,
    fabric: F,
}

/// Counts posted and retired work requests where the fabric's queue is finite.
///
/// Work request ids are sequence numbers from `posted` (writes take one only when the
/// queue is finite; reads always do, as they are always signalled). Completions of an
/// RC queue pair arrive in posting order, so `completed` > n means request n is done.
struct SendQueue {
    depth: u64,
    interval: u64,
    posted: AtomicU64,
    /// One past the highest request retired by a successful signalled completion.
    retired: AtomicU64,
    /// One past the highest request with any completion (success, error or flush).
    completed: AtomicU64,
}

impl<F: Fabric> Link<F> {
    fn ctrl_word(&self, off: u64) -> &AtomicU64 {
        // SAFETY: the control region is page-aligned, CTRL_SIZE long and lives as long
        // as `self`; its words are only ever accessed atomically here and written by the
        // peer's fabric as aligned 8-byte words (fabric guarantee 3).
        unsafe { &*(self.ctrl.addr().add(off as usize) as *const AtomicU64) }
    }

    /// `Err(BrokenPipe)` once the peer's receiver has stopped reading.
    fn check_peer_reading(&self) -> io::Result<()> {
        // Relaxed: a flag only; nothing is read on its strength.
        if self.ctrl_word(CTRL_RX_CLOSED).load(Ordering::Relaxed) != 0 {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the peer closed its reading side",
            ));
        }
        Ok(())
    }

    fn fail(&self, kind: io::ErrorKind, msg: String) -> io::Error {
        let mut b = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        if b.is_none() {
            *b = Some((kind, msg));
        }
        self.is_broken.store(true, Ordering::Release);
        let (k, m) = b.as_ref().unwrap();
        io::Error::new(*k, m.clone())
    }

    #[inline]
    fn error(&self) -> Option<io::Error> {
        // Acquire: pairs with the Release in `fail`, so the message is there to read.
        if !self.is_broken.load(Ordering::Acquire) {
            return None;
        }
        self.stored_error()
    }

    #[cold]
    fn stored_error(&self) -> Option<io::Error> {
        let b = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        b.as_ref().map(|(k, m)| io::Error::new(*k, m.clone()))
    }

    /// Drains completions and turns an error completion or an error state into a
    /// permanent connection error.
    fn check_health(&self) -> io::Result<()> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        self.drain_completions()?;
        if self.qp.state() == QpState::Error {
            let why = self
                .qp
                .error_reason()
                .map_or_else(String::new, |r| format!(" ({r})"));
            return Err(self.fail(
                io::ErrorKind::ConnectionReset,
                format!("connection broken: the peer is gone or the queue pair failed{why}"),
            ));
        }
        Ok(())
    }

    fn drain_completions(&self) -> io::Result<()> {
        let mut wcs = [crate::fabric::Completion {
            wr_id: 0,
            status: CompletionStatus::Success,
            op: crate::fabric::CompletedOp::Write,
            byte_len: 0,
        }; 16];
        let mut failure = None;
        loop {
            let n = self.qp.poll(&mut wcs);
            for wc in &wcs[..n] {
                // AcqRel on both counters: a waiter that sees the new value also sees
                // what the request did (the bytes a read placed).
                self.sq.completed.fetch_max(wc.wr_id + 1, Ordering::AcqRel);
                if wc.status != CompletionStatus::Success {
                    let kind = match wc.status {
                        CompletionStatus::TransportError | CompletionStatus::Flushed => {
                            io::ErrorKind::ConnectionReset
                        }
                        _ => io::ErrorKind::Other,
                    };
                    if failure.is_none() {
                        failure = Some(
                            self.fail(kind, format!("RDMA operation failed: {:?}", wc.status)),
                        );
                    }
                    continue;
                }
                // A signalled success retires it and every unsignalled request before it.
                self.sq.retired.fetch_max(wc.wr_id + 1, Ordering::AcqRel);
            }
            if n < wcs.len() {
                return failure.map_or(Ok(()), Err);
            }
        }
    }

    /// Posts a write, keeping the send queue within its depth.
    ///
    /// # Safety
    ///
    /// Non-inline gather entries must stay valid until retired (the staging buffer
    /// does: its bytes are only rewritten after the peer consumed them).
    unsafe fn post_write(
        &self,
        local: &[Sge],
        remote_addr: u64,
        rkey: u32,
        inline: bool,
    ) -> io::Result<()> {
        let mut signaled = false;
        let mut wr_id = 0;
        if self.sq.depth != u64::MAX {
            self.wait_for_send_slot()?;
            wr_id = self.sq.posted.fetch_add(1, Ordering::AcqRel);
            signaled = wr_id % self.sq.interval == self.sq.interval - 1;
        }
        let wr = WorkRequest {
            wr_id,
            opcode: Opcode::Write {
                local,
                remote_addr,
                rkey,
                inline,
            },
            signaled,
        };
        // SAFETY: forwarded from this function's contract.
        unsafe { self.qp.post(&wr) }.map_err(io::Error::from)
    }

    /// Waits until the finite send queue has a free slot (requests posted and not yet
    /// retired by a signalled completion stay below its depth).
    fn wait_for_send_slot(&self) -> io::Result<()> {
        let mut backoff = Backoff::new(1000, 100, std::time::Duration::from_micros(100));
        while self.sq.posted.load(Ordering::Acquire) - self.sq.retired.load(Ordering::Acquire)
            >= self.sq.depth
        {
            self.check_health()?;
            backoff.snooze();
        }
        Ok(())
    }

    /// Posts a signalled RDMA READ and returns its sequence number (see [`SendQueue`]).
    ///
    /// # Safety
    ///
    /// `local` must stay valid and unaliased until `sq.completed` passes the returned
    /// number (see [`wait_completed`](Self::wait_completed)).
    unsafe fn post_read(&self, local: &[Sge], remote_addr: u64, rkey: u32) -> io::Result<u64> {
        if self.sq.depth != u64::MAX {
            self.wait_for_send_slot()?;
        }
        let seq = self.sq.posted.fetch_add(1, Ordering::AcqRel);
        let wr = WorkRequest {
            wr_id: seq,
            opcode: Opcode::Read {
                local,
                remote_addr,
                rkey,
            },
            signaled: true,
        };
        // SAFETY: forwarded from this function's contract.
        unsafe { self.qp.post(&wr) }.map_err(io::Error::from)?;
        Ok(seq)
    }

    /// Waits until request `seq` has a completion, successful or not. Never gives up
    /// early: the memory a read targets must not be handed back while the NIC may
    /// still write it, and an RC queue pair completes (or flushes) every request.
    ///
    /// # Errors
    ///
    /// The connection's error if any completion failed.
    fn wait_completed(&self, seq: u64) -> io::Result<()> {
        let mut backoff = Backoff::new(20_000, 1000, std::time::Duration::from_micros(50));
        let mut failure = None;
        while self.sq.completed.load(Ordering::Acquire) <= seq {
            if let Err(e) = self.drain_completions() {
                failure.get_or_insert(e);
            }
            if self.sq.completed.load(Ordering::Acquire) > seq {
                break;
            }
            backoff.snooze();
        }
        match failure.or_else(|| self.error()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Writes one 8-byte control word into the peer's control region.
    fn post_ctrl(&self, off: u64, value: u64) -> io::Result<()> {
        let word = value.to_le_bytes();
        let sge = [Sge {
            addr: word.as_ptr() as *mut u8,
            len: 8,
            lkey: 0,
        }];
        // SAFETY: inline write: the fabric copies `word` before returning.
        unsafe { self.post_write(&sge, self.peer_ctrl.addr + off, self.peer_ctrl.rkey, true) }
    }

    /// Sends the incoming ring's tail explicitly if it moved since the last explicit
    /// update. Serialised so that updates reach the peer in increasing order.
    fn publish_tail(&self) -> io::Result<()> {
        let _g = self.publish.lock().unwrap_or_else(|p| p.into_inner());
        // Acquire pairs with the receiver's Release store after it finished copying out
        // of the ring: the peer may reuse the space as soon as it sees this value.
        let tail = self.rx_tail.load(Ordering::Acquire);
        if tail > self.rx_explicit.load(Ordering::Relaxed) {
            self.post_ctrl(CTRL_TAIL, tail)?;
            self.rx_explicit.store(tail, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Answers a pending credit request from the peer's sender (see module docs).
    ///
    /// A request carries the tail the sender already knows, plus one. It is answered
    /// only once our tail has moved past that value, so the answer always frees room;
    /// until then it stays pending, however many tails we piggyback meanwhile (the
    /// stalled sender may not be reading them).
    #[inline]
    fn serve_credit(&self) -> io::Result<()> {
        // Relaxed: only the value matters; publish_tail orders the data itself.
        let req = self.ctrl_word(CTRL_CREDIT).load(Ordering::Relaxed);
        if req != self.credit_served.load(Ordering::Relaxed)
            && self.rx_tail.load(Ordering::Acquire) >= req
        {
            self.publish_tail()?;
            self.credit_served.store(req, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// A connection being set up: create it, send [`card`](Prepared::card) to the peer,
/// then [`connect`](Prepared::connect) with the peer's card.
///
/// ```
/// use std::io::{IoSlice, IoSliceMut};
/// use rdma_channel::fabric::emulated::EmuFabric;
/// use rdma_channel::{Config, Prepared};
///
/// // Two ends in one process; across processes the cards travel over a Unix socket
/// // (see `rdma_channel::oob` and `RdmaStream::handshake`).
/// let a = Prepared::new(EmuFabric::new()?, Config::default())?;
/// let b = Prepared::new(EmuFabric::new()?, Config::default())?;
/// let (card_a, card_b) = (a.card()?, b.card()?);
/// let mut a = a.connect(card_b)?;
/// let mut b = b.connect(card_a)?;
/// assert_eq!(a.put(&[IoSlice::new(b"pipe")])?, 4);
/// let mut buf = [0u8; 4];
/// assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf)])?, 4);
/// assert_eq!(&buf, b"pipe");
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Prepared<F: Fabric> {
    fabric: F,
    pending: F::Pending,
    ring: F::Region,
    ctrl: F::Region,
    cfg: Config,
}

impl<F: Fabric> Prepared<F> {
    /// Allocates the incoming ring and control region and an unconnected queue pair.
    ///
    /// # Errors
    ///
    /// An invalid `cfg` or a fabric failure.
    pub fn new(fabric: F, cfg: Config) -> io::Result<Prepared<F>> {
        let pending = fabric.create_qp()?;
        Self::with_pending(fabric, pending, cfg)
    }

    /// As [`new`](Self::new), with a queue pair the caller created (for instance
    /// through rdma_cm, which connects it while the cards travel).
    ///
    /// # Errors
    ///
    /// An invalid `cfg` or a fabric failure.
    pub fn with_pending(fabric: F, pending: F::Pending, cfg: Config) -> io::Result<Prepared<F>> {
        cfg.validate()?;
        let ring = fabric.alloc_region(
            cfg.ring_size_bytes(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        let ctrl = fabric.alloc_region(CTRL_SIZE, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        Ok(Prepared {
            fabric,
            pending,
            ring,
            ctrl,
            cfg,
        })
    }

    /// The card for the peer: the fabric's card plus where our ring and control words are.
    ///
    /// # Errors
    ///
    /// A fabric failure.
    pub fn card(&self) -> io::Result<Card> {
        let fabric_card = self.pending.card()?;
        let bytes = ConnCard::encode(self.ring.remote(), self.ctrl.remote(), &fabric_card.bytes)?;
        Ok(Card {
            bytes,
            fds: fabric_card.fds,
        })
    }

    /// Connects to the peer described by `peer` and returns the channel.
    ///
    /// # Errors
    ///
    /// `InvalidData` for a malformed card (see [`ConnCard::new_checked`]); fabric
    /// failures as they come.
    pub fn connect(self, peer: Card) -> io::Result<Channel<F>> {
        let card = ConnCard::new_checked(&peer.bytes[..])?;
        let (peer_ring, peer_ctrl) = (card.ring(), card.ctrl());
        let fabric_bytes = card.fabric_card().to_vec();
        let qp = self.pending.connect(Card {
            bytes: fabric_bytes,
            fds: peer.fds,
        })?;
        let caps = qp.caps();
        if caps.max_sge < 4 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "fabric allows {} gather entries; the ring needs at least 4",
                    caps.max_sge
                ),
            ));
        }
        let inline_limit = caps
            .max_inline
            .min(self.cfg.max_inline_bytes().unwrap_or(usize::MAX));
        let chunk = (self.cfg.chunk_size_bytes() as u64).min(peer_ring.len / 2);
        let staging = if (inline_limit as u64) < chunk {
            Some(
                self.fabric
                    .alloc_region(peer_ring.len as usize, Access::LOCAL_WRITE)?,
            )
        } else {
            None
        };
        let (depth, interval) = if caps.max_send_wr == usize::MAX {
            (u64::MAX, u64::MAX)
        } else {
            let d = caps.max_send_wr.max(2) as u64;
            (d, (d / 2).max(1))
        };
        let (alloc_default, private_default) = self.fabric.zero_copy_defaults();
        let (alloc_set, private_set) = self.cfg.zero_copy_thresholds();
        let (max_entries, max_bytes) = self.cfg.registration_cache_limits();
        let link = Arc::new(Link {
            qp,
            ring: self.ring,
            ctrl: self.ctrl,
            staging,
            peer_ring,
            peer_ctrl,
            rx_tail: AtomicU64::new(0),
            rx_explicit: AtomicU64::new(0),
            rx_piggy: AtomicU64::new(0),
            credit_served: AtomicU64::new(0),
            tx_tail_piggy: AtomicU64::new(0),
            publish: Mutex::new(()),
            sq: SendQueue {
                depth,
                interval,
                posted: AtomicU64::new(0),
                retired: AtomicU64::new(0),
                completed: AtomicU64::new(0),
            },
            broken: Mutex::new(None),
            is_broken: AtomicBool::new(false),
            zc_thresholds: (
                alloc_set.unwrap_or(alloc_default).max(1),
                private_set.unwrap_or(private_default).max(1),
            ),
            rcache: RegCache::new(CacheLimits {
                max_entries,
                max_bytes,
            }),
            cfg: self.cfg,
            fabric: self.fabric,
        });
        let ring_base = link.ring.addr();
        let ring_size = link.ring.len() as u64;
        let threshold = link.cfg.tail_threshold_bytes() as u64;
        Ok(Channel {
            tx: Sender {
                link: link.clone(),
                head: 0,
                tail: 0,
                ring_size: peer_ring.len,
                chunk,
                inline_limit,
                max_pieces: caps.max_sge.min(MAX_SGE) - 3,
                credit_requested_at: u64::MAX,
                closed: false,
                pending: None,
                zc_next_id: 1,
                zc_polls: 0,
                max_rndv_segs: ((chunk as usize - OVERHEAD - Rendezvous::encoded_len(0))
                    / Rendezvous::encoded_len(1).saturating_sub(Rendezvous::encoded_len(0)))
                .clamp(1, MAX_RNDV_SEGS),
            },
            rx: Receiver {
                link,
                ring_base,
                ring_size,
                threshold,
                read_pos: 0,
                cur_off: 0,
                cur_left: 0,
                cur_cells: 0,
                in_packet: false,
                empty_polls: 0,
                zc: None,
                zc_expected_id: 1,
                max_reads: caps.max_rd_atomic.clamp(1, MAX_READS_IN_FLIGHT),
                reads: None,
            },
        })
    }
}

/// One connection: a [`Sender`] and a [`Receiver`].
pub struct Channel<F: Fabric> {
    tx: Sender<F>,
    rx: Receiver<F>,
}

impl<F: Fabric> Channel<F> {
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

    /// Counters of this connection's registration cache.
    pub fn cache_stats(&self) -> CacheStats {
        self.tx.link.rcache.stats()
    }

    /// This connection's registration cache: its counters, its limits, how it detects
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

/// The sending direction of a connection.
pub struct Sender<F: Fabric> {
    link: Arc<Link<F>>,
    /// Master head of the outgoing ring (in the peer's memory).
    head: u64,
    /// Cached replica of the peer's tail: never ahead of the real one.
    tail: u64,
    ring_size: u64,
    chunk: u64,
    inline_limit: usize,
    /// Payload entries a gather list may hold (the fabric's limit less three).
    max_pieces: usize,
    /// Known tail at our last credit request (so we ask once per stall).
    credit_requested_at: u64,
    closed: bool,
    /// The zero-copy transfer announced and not yet confirmed, if any.
    pending: Option<PendingZc>,
    /// Number of the next announcement.
    zc_next_id: u64,
    /// Polls of an unconfirmed transfer since the last health check.
    zc_polls: u32,
    /// Most segments one announcement may name (so it fits one packet).
    max_rndv_segs: usize,
}

/// A zero-copy transfer the peer has been told about and has not confirmed.
struct PendingZc {
    id: u64,
    count: usize,
    segs: [RndvSeg; MAX_RNDV_SEGS],
    handles: [Option<RegHandle>; MAX_RNDV_SEGS],
}

impl PendingZc {
    fn total(&self) -> usize {
        self.segs[..self.count].iter().map(|s| s.len as usize).sum()
    }
}

/// Registered memory from [`Channel::alloc_mem`]: on the emulated fabric a shared
/// segment the peer reads with a plain copy, so sends from it go zero-copy from a
/// lower threshold than other memory. Dereferences to `[u8]`; dropping it frees it.
///
/// ```
/// use std::io::{Read, Write};
/// use rdma_channel::RdmaStream;
/// let (mut a, mut b) = RdmaStream::pair()?;
/// let mut buf = a.alloc_mem(1 << 20)?;
/// buf.fill(7);
/// let t = std::thread::spawn(move || {
///     a.write_all(&buf)?; // zero-copy: returns once b has pulled the bytes
///     Ok::<_, std::io::Error>(a)
/// });
/// let mut got = vec![0u8; 1 << 20];
/// b.read_exact(&mut got)?;
/// assert!(got.iter().all(|&x| x == 7));
/// t.join().unwrap()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct RdmaBuf<F: Fabric> {
    link: Arc<Link<F>>,
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value (the cache only keeps its
// registration); moving it between threads is as safe as moving a Vec<u8>.
unsafe impl<F: Fabric> Send for RdmaBuf<F> {}
// SAFETY: shared references only give out `&[u8]`.
unsafe impl<F: Fabric> Sync for RdmaBuf<F> {}

impl<F: Fabric> std::ops::Deref for RdmaBuf<F> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is the live, initialised (zeroed at allocation)
        // allocation this value owns until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<F: Fabric> std::ops::DerefMut for RdmaBuf<F> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref; `&mut self` makes the access exclusive, and no transfer
        // can be reading it: the safe send paths borrow the buffer until the peer
        // confirmed, and `put_nocopy`'s contract forbids touching it meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<F: Fabric> Drop for RdmaBuf<F> {
    fn drop(&mut self) {
        // SAFETY: ptr came from this cache's alloc and is freed once, here. If it is
        // still acquired (only possible after a broken `put_nocopy` contract) the
        // cache refuses and the memory is leaked rather than freed under the NIC.
        let _ = unsafe { self.link.rcache.free(self.ptr.as_ptr()) };
    }
}

impl<F: Fabric> Sender<F> {
    /// Writes as much of `iov` as the ring has room for, in order, and returns the
    /// number of bytes taken (0 when the ring is full). The caller may reuse the
    /// buffers as soon as this returns and must offer the rest again later.
    ///
    /// ```
    /// use std::io::{IoSlice, IoSliceMut};
    /// use rdma_channel::{Config, RdmaStream};
    /// let cfg = Config::default().ring_size(4096).chunk_size(1024);
    /// let (mut a, mut b) = RdmaStream::pair_with(cfg)?;
    /// let data = vec![1u8; 10_000];
    /// // A 4 KiB ring cannot take 10,000 bytes at once: put takes part, retry the rest.
    /// let first = a.try_put(&[IoSlice::new(&data)])?;
    /// assert!(first > 0 && first < data.len());
    /// assert_eq!(a.try_put(&[IoSlice::new(&data[first..])])?, 0); // still full
    /// let mut sink = vec![0u8; 10_000];
    /// let got = b.try_get(&mut [IoSliceMut::new(&mut sink)])?;
    /// assert_eq!(got, first);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `BrokenPipe` once the peer stopped reading or after [`close`](Self::close);
    /// `ConnectionReset` when the peer vanished or the fabric failed.
    pub fn put(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        self.put_inner(iov, false)
    }

    /// As [`put`](Self::put), but buffers at or above the zero-copy threshold travel
    /// without a copy: the peer reads them straight from `iov` with RDMA READ.
    ///
    /// When `put_nocopy` reaches such a buffer it announces it to the peer and returns
    /// the bytes completed before it (possibly 0). The announced buffers are then in
    /// flight: call `put_nocopy` again with an `iov` that starts with the same buffers
    /// (same addresses and lengths) until it counts them, which it does once the peer
    /// has read them all. Eager and zero-copy bytes keep one FIFO order.
    ///
    /// ```
    /// use std::io::{IoSlice, IoSliceMut};
    /// let (mut a, mut b) = rdma_channel::RdmaStream::pair()?;
    /// let big = a.alloc_mem(256 << 10)?;
    /// let iov = [IoSlice::new(b"head"), IoSlice::new(&big)];
    /// // SAFETY: `big` and "head" stay untouched until put_nocopy has counted them.
    /// let n = unsafe { a.channel().sender().put_nocopy(&iov) }?;
    /// assert_eq!(n, 4); // the eager part; the big buffer is announced
    /// let mut out = vec![1u8; 4 + (256 << 10)];
    /// let mut got = 0;
    /// while got < out.len() {
    ///     got += b.try_get(&mut [IoSliceMut::new(&mut out[got..])])?;
    /// }
    /// assert_eq!(unsafe { a.channel().sender().put_nocopy(&iov[1..]) }?, 256 << 10);
    /// assert!(out[4..].iter().all(|&x| x == 0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Safety
    ///
    /// While a transfer is in flight (from the call that announced it until a call
    /// counts it, or the sender is dropped), the announced memory must stay mapped
    /// and unmodified. Dropping the sender with a transfer in flight deregisters the
    /// buffers, so the peer's read fails instead of reading freed memory.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put); `InvalidInput` if a transfer is in flight and `iov`
    /// does not start with its buffers.
    pub unsafe fn put_nocopy(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        let r = self.put_inner(iov, true);
        if let Err(e) = &r {
            // A mismatched retry leaves the transfer in flight (the caller may retry
            // correctly); any other error ends the connection, so revoke the buffers.
            if e.kind() != io::ErrorKind::InvalidInput || self.link.error().is_some() {
                self.abort_pending();
            }
        }
        r
    }

    /// This connection's registration cache (see [`Channel::registration_cache`]).
    pub fn registration_cache(&self) -> &RegCache<F> {
        &self.link.rcache
    }

    /// True while a zero-copy transfer is announced and not yet confirmed.
    pub fn zero_copy_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Waits (with the configured backoff) until the announced zero-copy transfer is
    /// confirmed by the peer, so that the next [`put_nocopy`](Self::put_nocopy) counts it.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put).
    pub fn wait_zero_copy(&mut self) -> io::Result<()> {
        let (s, y, m) = self.link.cfg.wait();
        let mut b = Backoff::new(s, y, m);
        while let Some(p) = &self.pending {
            if self.zc_confirmed(p.id)? {
                return Ok(());
            }
            self.link.serve_credit()?;
            b.snooze();
        }
        Ok(())
    }

    /// Allocates `len` bytes of zeroed, registered memory for zero-copy sends (like
    /// `MPI_Alloc_mem` / `ucp_mem_map`). On the emulated fabric it is a shared segment
    /// the peer reads with a plain copy, so it goes zero-copy from a lower threshold
    /// ([`Config::zero_copy_threshold`]) than other memory. The buffer is registered
    /// in this connection's domain; it can be sent on other connections too, at the
    /// cost of ordinary memory.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for 0 bytes; out of memory or registration failure.
    pub fn alloc_mem(&self, len: usize) -> io::Result<RdmaBuf<F>> {
        let ptr = self.link.rcache.alloc(&self.link.fabric, len)?;
        Ok(RdmaBuf {
            link: self.link.clone(),
            ptr,
            len,
        })
    }

    /// True once the peer confirmed announcement `id`; checks the connection's health
    /// now and then while it has not.
    fn zc_confirmed(&mut self, id: u64) -> io::Result<bool> {
        let link = &*self.link;
        // Acquire pairs with the fabric's Release store of the control word: the
        // peer's reads were complete before it wrote the number.
        if link.ctrl_word(CTRL_ZC_DONE).load(Ordering::Acquire) >= id {
            return Ok(true);
        }
        link.check_peer_reading()?;
        self.zc_polls += 1;
        if self.zc_polls >= HEALTH_EVERY {
            self.zc_polls = 0;
            link.check_health()?;
        }
        Ok(false)
    }

    /// Gives up an unconfirmed transfer after an error: releases and deregisters its
    /// buffers so the peer can no longer read them.
    fn abort_pending(&mut self) {
        if let Some(p) = self.pending.take() {
            for (seg, h) in p.segs.iter().zip(p.handles.iter()).take(p.count) {
                if let Some(h) = h {
                    self.link.rcache.release(*h);
                    if !h.is_owned() {
                        self.link
                            .rcache
                            .invalidate(seg.addr as *const u8, seg.len as usize);
                    }
                }
            }
        }
    }

    /// True when `buf` should go zero-copy.
    fn zc_eligible(&self, buf: &[u8]) -> bool {
        let (alloc_t, private_t) = self.link.zc_thresholds;
        buf.len() >= private_t
            || (buf.len() >= alloc_t && self.link.rcache.is_owned(buf.as_ptr(), buf.len()))
    }

    fn put_inner(&mut self, iov: &[IoSlice<'_>], zero_copy: bool) -> io::Result<usize> {
        if self.closed {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "put after close"));
        }
        if let Some(e) = self.link.error() {
            return Err(e);
        }
        let total: usize = iov.iter().map(|s| s.len()).sum();
        let (mut idx, mut off, mut done) = (0usize, 0usize, 0usize);
        // An announced transfer is settled first: a peer that read it and then closed
        // its reading side has still received it, and the count must say so.
        if let Some(p) = &self.pending {
            // The caller must offer the announced buffers again, first.
            let mut matched = 0;
            for s in iov.iter().filter(|s| !s.is_empty()).take(p.count) {
                let seg = &p.segs[matched];
                if s.as_ptr() as u64 != seg.addr || s.len() as u64 != seg.len {
                    break;
                }
                matched += 1;
            }
            if matched < p.count {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a zero-copy put is in flight: offer the same buffers again until it is counted",
                ));
            }
            let id = p.id;
            if !self.zc_confirmed(id)? {
                return Ok(0);
            }
            let p = self.pending.take().expect("checked above");
            for h in p.handles.iter().take(p.count).flatten() {
                self.link.rcache.release(*h);
            }
            done = p.total();
            // Skip past the announced buffers.
            let mut seen = 0;
            while seen < p.count {
                if !iov[idx].is_empty() {
                    seen += 1;
                }
                idx += 1;
            }
        }
        let link = &*self.link;
        if let Err(e) = link.check_peer_reading() {
            return if done > 0 { Ok(done) } else { Err(e) };
        }
        link.serve_credit()?;
        while done < total {
            // Skip empty slices so the cursor always points at a byte.
            while iov[idx].len() == off {
                idx += 1;
                off = 0;
            }
            // Eager bytes stop where the next zero-copy buffer starts.
            let mut eager_left = total - done;
            if zero_copy {
                if off == 0 && self.zc_eligible(&iov[idx]) {
                    match self.announce(&iov[idx..])? {
                        Announce::Sent => return Ok(done),
                        Announce::NoRoom => break,
                        Announce::Refused => {}
                    }
                } else {
                    eager_left = iov[idx].len() - off;
                    for s in &iov[idx + 1..] {
                        if self.zc_eligible(s) {
                            break;
                        }
                        eager_left += s.len();
                    }
                }
            }
            let mut room = max_payload_now(self.ring_size, self.head, self.tail, self.chunk);
            if room < eager_left && room < self.chunk as usize - OVERHEAD {
                self.refresh_tail()?;
                room = max_payload_now(self.ring_size, self.head, self.tail, self.chunk);
                if room == 0 {
                    self.request_credit()?;
                    break;
                }
            }
            let n = self.write_packet(&iov[idx..], off, eager_left.min(room))?;
            done += n;
            // Advance the cursor by n bytes.
            let mut left = n;
            while left > 0 {
                let here = (iov[idx].len() - off).min(left);
                off += here;
                left -= here;
                if off == iov[idx].len() {
                    idx += 1;
                    off = 0;
                }
            }
        }
        Ok(done)
    }

    /// Writes one packet of at most `want` payload bytes starting at byte `skip` of
    /// `iov`; returns the payload bytes written (at least one cell's worth or `want`).
    fn write_packet(&mut self, iov: &[IoSlice<'_>], skip: usize, want: usize) -> io::Result<usize> {
        if want <= ONE_CELL_PAYLOAD && self.inline_limit >= CELL {
            return self.write_cell(iov, skip, want);
        }
        self.write_gathered(iov, skip, want, PacketKind::Data)
    }

    /// Announces a zero-copy transfer of the buffers at the start of `iov` (the first
    /// is eligible; following eligible ones join it, up to the segment limit).
    fn announce(&mut self, iov: &[IoSlice<'_>]) -> io::Result<Announce> {
        let mut count = 1;
        while count < iov.len().min(self.max_rndv_segs) && self.zc_eligible(&iov[count]) {
            count += 1;
        }
        let need = Rendezvous::encoded_len(count);
        if !self.make_room_for(need)? {
            return Ok(Announce::NoRoom);
        }
        let link = self.link.clone();
        let mut p = PendingZc {
            id: self.zc_next_id,
            count: 0,
            segs: [RndvSeg::default(); MAX_RNDV_SEGS],
            handles: [None; MAX_RNDV_SEGS],
        };
        for buf in &iov[..count] {
            // SAFETY: put_nocopy's contract keeps announced buffers mapped until the
            // transfer is counted (then we release) or aborted (release + invalidate).
            match unsafe {
                link.rcache
                    .acquire(&link.fabric, buf.as_ptr(), buf.len(), Access::REMOTE_READ)
            } {
                Ok(h) => {
                    p.segs[p.count] = RndvSeg {
                        addr: buf.as_ptr() as u64,
                        len: buf.len() as u64,
                        rkey: h.rkey(),
                    };
                    p.handles[p.count] = Some(h);
                    p.count += 1;
                }
                // Memory the fabric cannot register (read-only pages on verbs, say)
                // simply goes through the ring.
                Err(_) => break,
            }
        }
        if p.count == 0 {
            return Ok(Announce::Refused);
        }
        let mut desc = [0u8; Rendezvous::encoded_len(MAX_RNDV_SEGS)];
        let n = Rendezvous::encode(&mut desc, p.id, &p.segs[..p.count]);
        let written =
            self.write_gathered(&[IoSlice::new(&desc[..n])], 0, n, PacketKind::Rendezvous);
        match written {
            Ok(_) => {
                self.zc_next_id += 1;
                self.zc_polls = 0;
                self.pending = Some(p);
                Ok(Announce::Sent)
            }
            Err(e) => {
                for h in p.handles.iter().take(p.count).flatten() {
                    link.rcache.release(*h);
                }
                Err(e)
            }
        }
    }

    /// Makes sure a packet with `payload` bytes fits in one piece at the head, writing
    /// a pad packet to the ring's physical end if that is what stands in the way.
    /// False when the ring has no room (credit requested).
    fn make_room_for(&mut self, payload: usize) -> io::Result<bool> {
        loop {
            let room = max_payload_now(self.ring_size, self.head, self.tail, self.chunk);
            if room >= payload {
                return Ok(true);
            }
            let to_end = self.ring_size - (self.head & (self.ring_size - 1));
            let free = self.ring_size - (self.head - self.tail);
            if room > 0 && to_end < (cells_for(payload) * CELL) as u64 && free >= to_end {
                // Fill to the end with a pad packet; the packet then starts at offset 0.
                let pad = to_end as usize - OVERHEAD;
                self.write_gathered(&[IoSlice::new(&ZEROS[..pad])], 0, pad, PacketKind::Pad)?;
                continue;
            }
            self.refresh_tail()?;
            if max_payload_now(self.ring_size, self.head, self.tail, self.chunk) >= payload {
                return Ok(true);
            }
            if max_payload_now(self.ring_size, self.head, self.tail, self.chunk) == room {
                self.request_credit()?;
                return Ok(false);
            }
        }
    }

    /// The small-message path: the whole one-cell packet is assembled on the stack and
    /// written with a single gather entry.
    fn write_cell(&mut self, iov: &[IoSlice<'_>], skip: usize, len: usize) -> io::Result<usize> {
        let link = &*self.link;
        let mut cell = Cell([0; CELL]);
        let (mut i, mut o, mut at) = (0usize, skip, HEADER_LEN);
        while at < HEADER_LEN + len {
            let n = (iov[i].len() - o).min(HEADER_LEN + len - at);
            cell.0[at..at + n].copy_from_slice(&iov[i][o..o + n]);
            at += n;
            i += 1;
            o = 0;
        }
        // Acquire: as in write_gathered.
        let ack = link.rx_tail.load(Ordering::Acquire);
        Header::new_unchecked(&mut cell.0[..HEADER_LEN]).fill(
            self.head,
            PacketKind::Data,
            len as u32,
            ack,
        );
        let end = self.head + CELL as u64;
        cell.0[CELL - TRAILER_LEN..].copy_from_slice(&trailer_word(end).to_le_bytes());
        let sge = [Sge {
            addr: cell.0.as_mut_ptr(),
            len: CELL as u32,
            lkey: 0,
        }];
        let remote = link.peer_ring.addr + (self.head & (self.ring_size - 1));
        // SAFETY: inline write of a stack buffer that lives through the call.
        unsafe { link.post_write(&sge, remote, link.peer_ring.rkey, true)? };
        self.head = end;
        if ack > link.rx_piggy.load(Ordering::Relaxed) {
            link.rx_piggy.store(ack, Ordering::Relaxed);
        }
        Ok(len)
    }

    /// The general path: header, payload slices straight from `iov`, padding and
    /// trailer as one gather list.
    fn write_gathered(
        &mut self,
        iov: &[IoSlice<'_>],
        skip: usize,
        want: usize,
        kind: PacketKind,
    ) -> io::Result<usize> {
        let link = &*self.link;
        let mut len = want;
        // Gather list: header, payload pieces, padding, trailer. Left uninitialised
        // because zeroing 32 entries costs more than a small message's whole write.
        let mut sges = [const { MaybeUninit::<Sge>::uninit() }; MAX_SGE];
        let max_pieces = self.max_pieces;
        let mut pieces = 0;
        {
            let (mut i, mut o, mut left) = (0usize, skip, len);
            while left > 0 {
                if pieces == max_pieces {
                    len -= left;
                    break;
                }
                let n = (iov[i].len() - o).min(left);
                if n > 0 {
                    sges[1 + pieces].write(Sge {
                        addr: iov[i][o..].as_ptr() as *mut u8,
                        len: n as u32,
                        lkey: 0,
                    });
                    pieces += 1;
                    left -= n;
                }
                i += 1;
                o = 0;
            }
        }
        let cells = cells_for(len);
        let bytes = cells * CELL;
        let end = self.head + bytes as u64;
        let pad = bytes - OVERHEAD - len;
        let mut header = [0u8; HEADER_LEN];
        // Acquire pairs with the receiver's Release after copying out: the value we
        // announce is only ever a position whose bytes were fully consumed.
        let ack = link.rx_tail.load(Ordering::Acquire);
        Header::new_unchecked(&mut header[..]).fill(self.head, kind, len as u32, ack);
        let trailer = trailer_word(end).to_le_bytes();
        sges[0].write(Sge {
            addr: header.as_mut_ptr(),
            len: HEADER_LEN as u32,
            lkey: 0,
        });
        let mut n = 1 + pieces;
        if pad > 0 {
            sges[n].write(Sge {
                addr: ZEROS.as_ptr() as *mut u8,
                len: pad as u32,
                lkey: 0,
            });
            n += 1;
        }
        sges[n].write(Sge {
            addr: trailer.as_ptr() as *mut u8,
            len: 8,
            lkey: 0,
        });
        n += 1;
        // SAFETY: entries 0..n were all written above (header, `pieces` payload entries,
        // optional padding, trailer), and MaybeUninit<Sge> has Sge's layout.
        let sges = unsafe { std::slice::from_raw_parts(sges.as_ptr() as *const Sge, n) };
        let remote = link.peer_ring.addr + (self.head & (self.ring_size - 1));
        if bytes <= self.inline_limit {
            // SAFETY: inline: every entry points at memory valid for this call (stack
            // arrays, the static zero page, or the caller's slices).
            unsafe { link.post_write(sges, remote, link.peer_ring.rkey, true)? };
        } else {
            self.write_staged(sges, remote, bytes)?;
        }
        self.head = end;
        if ack > link.rx_piggy.load(Ordering::Relaxed) {
            link.rx_piggy.store(ack, Ordering::Relaxed);
        }
        Ok(len)
    }

    /// Copies a packet into the registered staging buffer at the same offset it will
    /// have in the peer's ring, then writes it from there (seed 001 sec. 4.2's
    /// pre-registered send buffer, for fabrics whose inline limit is small).
    fn write_staged(&self, sges: &[Sge], remote: u64, bytes: usize) -> io::Result<()> {
        let link = &*self.link;
        let staging = link
            .staging
            .as_ref()
            .expect("staging buffer exists when inline is limited");
        let at = (self.head & (self.ring_size - 1)) as usize;
        debug_assert!(at + bytes <= staging.len());
        let mut dst = at;
        for s in sges {
            // SAFETY: `s` describes readable memory (see write_packet); the staging
            // range [at, at + bytes) lies inside the region and is not in flight: its
            // previous contents were consumed by the peer before the tail let us here.
            unsafe {
                std::ptr::copy_nonoverlapping(s.addr, staging.addr().add(dst), s.len as usize)
            };
            dst += s.len as usize;
        }
        let sge = [Sge {
            // SAFETY: `at` is inside the staging region (checked above).
            addr: unsafe { staging.addr().add(at) },
            len: bytes as u32,
            lkey: staging.lkey(),
        }];
        // SAFETY: the staging bytes stay untouched until the peer consumed them, which
        // implies the write completed.
        unsafe { link.post_write(&sge, remote, link.peer_ring.rkey, false) }
    }

    /// Updates the cached tail from the explicit control word and piggybacked acks.
    fn refresh_tail(&mut self) -> io::Result<()> {
        let link = &*self.link;
        // Acquire pairs with the peer's Release (the fabric's last-word store, or our
        // receiver's Release on tx_tail_piggy): the peer finished reading the space
        // before it announced it, so our next writes cannot overtake its reads.
        let explicit = link.ctrl_word(CTRL_TAIL).load(Ordering::Acquire);
        let piggy = link.tx_tail_piggy.load(Ordering::Acquire);
        let t = explicit.max(piggy);
        if t > self.head || t % CELL as u64 != 0 {
            return Err(link.fail(
                io::ErrorKind::InvalidData,
                format!(
                    "protocol error: peer announced tail {t} beyond head {}",
                    self.head
                ),
            ));
        }
        if t > self.tail {
            self.tail = t;
        }
        link.check_health()
    }

    /// Asks the receiver for an explicit tail update beyond the tail we know; once per
    /// known tail, since the answer necessarily moves it.
    fn request_credit(&mut self) -> io::Result<()> {
        if self.credit_requested_at != self.tail {
            self.link.post_ctrl(CTRL_CREDIT, self.tail + 1)?;
            self.credit_requested_at = self.tail;
        }
        Ok(())
    }

    /// True when a `put` of one byte would make progress now (ring not full).
    pub fn can_put(&mut self) -> io::Result<bool> {
        if max_payload_now(self.ring_size, self.head, self.tail, self.chunk) > 0 {
            return Ok(true);
        }
        self.refresh_tail()?;
        let ok = max_payload_now(self.ring_size, self.head, self.tail, self.chunk) > 0;
        if !ok {
            self.request_credit()?;
        }
        Ok(ok)
    }

    /// Ends the stream: the peer's `get` reports end of stream after the data sent
    /// so far. Later `put`s fail. Dropping the sender closes it too.
    ///
    /// # Errors
    ///
    /// A fabric failure while sending the notice.
    pub fn close(&mut self) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        if self.link.error().is_some() {
            return Ok(());
        }
        self.link.post_ctrl(CTRL_FIN, self.head + 1)
    }

    /// Bytes written into the ring so far, padding and headers included.
    pub fn position(&self) -> u64 {
        self.head
    }

    /// One non-blocking step of [`wait_writable`](Self::wait_writable), for callers
    /// that wait on many connections at once: true when a `put` would progress now
    /// (the ring has room), or, while a zero-copy transfer is in flight, when the peer
    /// has confirmed it (so that [`put_nocopy`](Self::put_nocopy) would count it).
    /// Serves the peer's credit requests; asks for credit when the ring is full.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put).
    pub fn poll_writable(&mut self) -> io::Result<bool> {
        self.link.serve_credit()?;
        if let Some(p) = &self.pending {
            let id = p.id;
            return self.zc_confirmed(id);
        }
        self.link.check_peer_reading()?;
        self.can_put()
    }

    /// Waits (with the configured backoff) until `put` can progress.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put).
    pub fn wait_writable(&mut self) -> io::Result<()> {
        let (s, y, m) = self.link.cfg.wait();
        let mut b = Backoff::new(s, y, m);
        loop {
            self.link.check_peer_reading()?;
            self.link.serve_credit()?;
            if self.can_put()? {
                return Ok(());
            }
            b.snooze();
        }
    }
}

/// Outcome of an attempt to announce a zero-copy transfer.
enum Announce {
    /// Announced; the transfer is in flight.
    Sent,
    /// The ring has no room for the announcement now.
    NoRoom,
    /// The buffer could not be registered: send it through the ring instead.
    Refused,
}

impl<F: Fabric> Drop for Sender<F> {
    fn drop(&mut self) {
        self.abort_pending();
        let _ = self.close();
    }
}

/// The receiving direction of a connection.
pub struct Receiver<F: Fabric> {
    link: Arc<Link<F>>,
    ring_base: *mut u8,
    ring_size: u64,
    threshold: u64,
    /// Start of the packet being read (or of the next one).
    read_pos: u64,
    /// Ring offset of the next unread payload byte of the current packet.
    cur_off: usize,
    /// Unread payload bytes of the current packet.
    cur_left: usize,
    cur_cells: usize,
    in_packet: bool,
    empty_polls: u32,
    /// The zero-copy transfer being read, if the stream is at one.
    zc: Option<ZcRecv>,
    /// Number the next announcement must carry.
    zc_expected_id: u64,
    /// Most RDMA READs in flight (the fabric's `max_rd_atomic`, capped).
    max_reads: usize,
    /// Reads left in flight by [`get_nowait`](Receiver::get_nowait).
    reads: Option<ReadsInFlight>,
}

/// RDMA READs posted into a caller's buffer and not yet seen complete.
struct ReadsInFlight {
    /// Where they land (the caller's buffer), for matching the retry.
    dst: usize,
    len: usize,
    /// Sequence number of the last read (completions arrive in order).
    last: u64,
    handle: RegHandle,
}

/// An announced transfer the receiver is reading (its segments, and how far it got).
struct ZcRecv {
    id: u64,
    total: u64,
    done: u64,
    count: usize,
    segs: [RndvSeg; MAX_RNDV_SEGS],
    /// Segment and offset in it of the next byte to read.
    seg: usize,
    seg_off: u64,
}

// SAFETY: `ring_base` points into the ring region owned by `link`, which the Receiver
// keeps alive; only the Receiver reads it, so moving it to another thread is fine.
unsafe impl<F: Fabric> Send for Receiver<F> {}

impl<F: Fabric> Receiver<F> {
    fn load_word(&self, pos: u64, order: Ordering) -> u64 {
        let off = (pos & (self.ring_size - 1)) as usize;
        // SAFETY: `off` is 8-aligned and below the ring size, so the word lies inside the
        // ring region kept alive by `link`. The peer's fabric writes ring memory like a
        // NIC's DMA; the words we poll are read atomically and never torn (guarantee 3).
        unsafe { (*(self.ring_base.add(off) as *const AtomicU64)).load(order) }
    }

    /// Looks for a complete packet at `read_pos`; true when one is ready to read.
    fn next_packet(&mut self) -> io::Result<bool> {
        loop {
            // Relaxed: the header alone is not trusted; the trailer's Acquire below is
            // what orders the packet's bytes.
            let first = self.load_word(self.read_pos, Ordering::Relaxed);
            let mut hbytes = [0u8; HEADER_LEN];
            hbytes[..8].copy_from_slice(&first.to_le_bytes());
            if !Header::new_unchecked(&hbytes[..]).is_at(self.read_pos) {
                return Ok(false);
            }
            let len = Header::new_unchecked(&hbytes[..]).len() as usize;
            let cells = cells_for(len);
            let end = self.read_pos + (cells * CELL) as u64;
            if (self.read_pos & (self.ring_size - 1)) + (cells * CELL) as u64 > self.ring_size {
                return Err(self.link.fail(
                    io::ErrorKind::InvalidData,
                    format!(
                        "protocol error: packet of {len} bytes at {} overruns the ring",
                        self.read_pos
                    ),
                ));
            }
            // Acquire pairs with the fabric's Release store of the last word of the
            // write: once the trailer is visible, so is every byte before it.
            if self.load_word(end - 8, Ordering::Acquire) != trailer_word(end) {
                return Ok(false);
            }
            // Re-read the header now that the whole packet is visible; a first read that
            // raced with the write (and so pointed us at a wrong trailer) shows up here.
            let word = self.load_word(self.read_pos, Ordering::Relaxed);
            if word != first {
                continue;
            }
            let ack = self.load_word(self.read_pos + 8, Ordering::Relaxed);
            hbytes[8..].copy_from_slice(&ack.to_le_bytes());
            let header = Header::new_unchecked(&hbytes[..]);
            let kind = header.kind().map_err(|e| {
                self.link
                    .fail(io::ErrorKind::InvalidData, format!("protocol error: {e}"))
            })?;
            self.take_ack(header.ack())?;
            self.cur_cells = cells;
            match kind {
                PacketKind::Data => {
                    self.cur_off = (self.read_pos & (self.ring_size - 1)) as usize + PAYLOAD_OFFSET;
                    self.cur_left = len;
                    self.in_packet = true;
                    if len == 0 {
                        self.finish_packet();
                        continue;
                    }
                    return Ok(true);
                }
                PacketKind::Pad => {
                    self.finish_packet();
                }
                PacketKind::Rendezvous => {
                    let at = (self.read_pos & (self.ring_size - 1)) as usize + PAYLOAD_OFFSET;
                    let mut desc = [0u8; Rendezvous::encoded_len(MAX_RNDV_SEGS)];
                    if len > desc.len() {
                        return Err(self.link.fail(
                            io::ErrorKind::InvalidData,
                            format!("protocol error: rendezvous of {len} bytes"),
                        ));
                    }
                    // SAFETY: the packet lies inside the ring and is fully visible (the
                    // trailer check above); `desc` is a local array of at least len bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.ring_base.add(at),
                            desc.as_mut_ptr(),
                            len,
                        )
                    };
                    let r = Rendezvous::new_checked(&desc[..len]).map_err(|e| {
                        self.link
                            .fail(io::ErrorKind::InvalidData, format!("protocol error: {e}"))
                    })?;
                    if r.id() != self.zc_expected_id {
                        return Err(self.link.fail(
                            io::ErrorKind::InvalidData,
                            format!(
                                "protocol error: rendezvous {} where {} was due",
                                r.id(),
                                self.zc_expected_id
                            ),
                        ));
                    }
                    let mut z = ZcRecv {
                        id: r.id(),
                        total: r.total(),
                        done: 0,
                        count: r.count(),
                        segs: [RndvSeg::default(); MAX_RNDV_SEGS],
                        seg: 0,
                        seg_off: 0,
                    };
                    for i in 0..z.count {
                        z.segs[i] = r.seg(i);
                    }
                    self.zc_expected_id += 1;
                    self.zc = Some(z);
                    // The announcement is copied out: its cells can be reused at once.
                    self.finish_packet();
                    return Ok(true);
                }
            }
        }
    }

    /// Starts RDMA READs of the next bytes of the announced transfer into `dst`
    /// (`len` bytes at most, capped so that all of them fit the read window) and
    /// returns them as in flight.
    ///
    /// # Safety
    ///
    /// `dst..dst + len` must be writable memory that nothing else touches until
    /// [`finish_reads`](Self::finish_reads) has seen the reads complete.
    unsafe fn start_reads(&mut self, dst: *mut u8, len: usize) -> io::Result<ReadsInFlight> {
        let link = self.link.clone();
        let z = self
            .zc
            .as_mut()
            .expect("called with a transfer in progress");
        let n = (len as u64)
            .min(z.total - z.done)
            .min((self.max_reads * READ_PIECE) as u64) as usize;
        // SAFETY: forwarded from this function's contract; released in finish_reads.
        let h = unsafe {
            link.rcache
                .acquire(&link.fabric, dst, n, Access::LOCAL_WRITE)
        }?;
        let (mut posted, mut last) = (0usize, None);
        let mut seg = z.seg;
        let mut seg_off = z.seg_off;
        while posted < n {
            let s = z.segs[seg];
            let piece = ((s.len - seg_off) as usize).min(n - posted).min(READ_PIECE);
            let sge = [Sge {
                // SAFETY: posted + piece <= n, inside dst..dst + len.
                addr: unsafe { dst.add(posted) },
                len: piece as u32,
                lkey: h.lkey(),
            }];
            // SAFETY: the target lies in the registered dst, which the caller keeps
            // untouched until finish_reads has seen this read complete.
            match unsafe { link.post_read(&sge, s.addr + seg_off, s.rkey) } {
                Ok(seq) => last = Some(seq),
                Err(e) => {
                    // Let what was posted land before the memory is handed back.
                    if let Some(seq) = last {
                        let _ = link.wait_completed(seq);
                    }
                    link.rcache.release(h);
                    return Err(e);
                }
            }
            posted += piece;
            seg_off += piece as u64;
            if seg_off == s.len {
                seg += 1;
                seg_off = 0;
            }
        }
        z.seg = seg;
        z.seg_off = seg_off;
        Ok(ReadsInFlight {
            dst: dst as usize,
            len: n,
            last: last.expect("n >= 1, so a read was posted"),
            handle: h,
        })
    }

    /// Completes reads started by [`start_reads`](Self::start_reads): waits for them
    /// (`wait`) or only checks. Returns `None` (and keeps them in flight) if they are
    /// not done, else the byte count, after confirming the transfer to the sender if
    /// it is complete.
    fn finish_reads(&mut self, r: ReadsInFlight, wait: bool) -> io::Result<Option<usize>> {
        let link = self.link.clone();
        if !wait {
            let drained = link.drain_completions();
            if link.sq.completed.load(Ordering::Acquire) <= r.last {
                drained?;
                self.reads = Some(r);
                return Ok(None);
            }
        }
        // Completions arrive in order, so the last read's covers all of them.
        let result = link.wait_completed(r.last);
        link.rcache.release(r.handle);
        result?;
        let z = self.zc.as_mut().expect("reads belong to a transfer");
        z.done += r.len as u64;
        if z.done == z.total {
            let id = z.id;
            self.zc = None;
            link.post_ctrl(CTRL_ZC_DONE, id)?;
        }
        Ok(Some(r.len))
    }

    /// Pulls the next bytes of the announced transfer into `dst` and returns how many
    /// (at least one), once every read into `dst` has completed, so the caller's
    /// buffer is never written after this borrow ends.
    fn read_zero_copy(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `dst` is exclusively borrowed for this call, and finish_reads waits
        // for the reads (even on error) before we return.
        let r = unsafe { self.start_reads(dst.as_mut_ptr(), dst.len()) }?;
        Ok(self
            .finish_reads(r, true)?
            .expect("a waiting finish completes"))
    }

    fn take_ack(&self, ack: u64) -> io::Result<()> {
        let link = &*self.link;
        if ack > link.tx_tail_piggy.load(Ordering::Relaxed) {
            if ack % CELL as u64 != 0 {
                return Err(link.fail(
                    io::ErrorKind::InvalidData,
                    format!("protocol error: bad ack {ack}"),
                ));
            }
            // Release: the sender half's Acquire load then sees a position the peer
            // finished reading (we observed the ack after the peer's Release trailer).
            link.tx_tail_piggy.store(ack, Ordering::Release);
        }
        Ok(())
    }

    fn finish_packet(&mut self) {
        // Zero the words where a later header or trailer may stand, before the tail
        // below lets the sender reuse these cells (ring module docs).
        let start = (self.read_pos & (self.ring_size - 1)) as usize;
        for off in boundary_offsets(start, self.cur_cells) {
            // SAFETY: the packet's cells lie inside the ring (next_packet checked it),
            // off is 8-aligned, and the sender does not touch these cells until it sees
            // the tail stored below. Relaxed: that Release store orders these.
            unsafe { (*(self.ring_base.add(off) as *const AtomicU64)).store(0, Ordering::Relaxed) };
        }
        self.read_pos += (self.cur_cells * CELL) as u64;
        self.in_packet = false;
        // Release: our copies out of the packet happen before anyone who reads this tail
        // (the sender half piggybacking it, or publish_tail) lets the peer reuse it.
        self.link.rx_tail.store(self.read_pos, Ordering::Release);
    }

    /// Reads up to the total length of `iov` bytes, in order, and returns how many
    /// (0 when nothing has arrived).
    ///
    /// ```
    /// use std::io::{ErrorKind, IoSlice, IoSliceMut};
    /// let (mut a, mut b) = rdma_channel::RdmaStream::pair()?;
    /// let mut two = [0u8; 2];
    /// assert_eq!(b.try_get(&mut [IoSliceMut::new(&mut two)])?, 0); // nothing yet
    /// a.try_put(&[IoSlice::new(b"abc")])?;
    /// a.shutdown_write()?;
    /// // A message can be taken in parts; FIFO order holds across calls.
    /// assert_eq!(b.try_get(&mut [IoSliceMut::new(&mut two)])?, 2);
    /// assert_eq!(&two, b"ab");
    /// assert_eq!(b.try_get(&mut [IoSliceMut::new(&mut two)])?, 1);
    /// assert_eq!(two[0], b'c');
    /// // Then end of stream.
    /// let e = b.try_get(&mut [IoSliceMut::new(&mut two)]).unwrap_err();
    /// assert_eq!(e.kind(), ErrorKind::UnexpectedEof);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `UnexpectedEof` once the peer closed its sending side and every byte it sent
    /// has been read; `ConnectionReset` when the peer vanished or the fabric failed;
    /// `InvalidData` if the ring holds something no correct peer writes.
    pub fn get(&mut self, iov: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.get_inner(iov, GetMode::Wait)
    }

    /// As [`get_nowait`](Self::get_nowait), but copies only bytes that are in the
    /// ring: it stops before a zero-copy transfer instead of starting its RDMA READs,
    /// so it never leaves reads in flight and `iov` may be any scratch buffer. For a
    /// caller that reads ahead into a staging buffer of its own and wants the large
    /// transfers to land straight in their destination: when this returns fewer
    /// bytes than asked, a zero-copy transfer may be next; read it with `get_nowait`.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get); `InvalidInput` while reads started by `get_nowait` are
    /// in flight (finish them with `get_nowait` first).
    pub fn get_buffered(&mut self, iov: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        if self.reads.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "zero-copy reads are in flight: finish them with get_nowait first",
            ));
        }
        self.get_inner(iov, GetMode::RingOnly)
    }

    /// As [`get`](Self::get), but never waits for the RDMA READs of a zero-copy
    /// transfer (seed 001 sec. 5's `get`): when it reaches one it starts the reads into
    /// `iov` and returns the bytes completed before them (possibly 0). While reads are
    /// in flight, call it again with an `iov` that starts with the same buffer; it
    /// returns 0 until they have landed, then counts them.
    ///
    /// ```
    /// use std::io::{IoSlice, IoSliceMut};
    /// let (mut a, mut b) = rdma_channel::RdmaStream::pair()?;
    /// let big = a.alloc_mem(64 << 10)?;
    /// // SAFETY: `big` stays untouched until put_nocopy counts it.
    /// assert_eq!(unsafe { a.channel().sender().put_nocopy(&[IoSlice::new(&big)]) }?, 0);
    /// let mut out = vec![1u8; 64 << 10];
    /// let mut got = 0;
    /// while got < out.len() {
    ///     let rx = b.channel().receiver();
    ///     // SAFETY: `out` is neither moved nor touched while reads are in flight.
    ///     got += unsafe { rx.get_nowait(&mut [IoSliceMut::new(&mut out[got..])]) }?;
    /// }
    /// assert!(out.iter().all(|&x| x == 0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Safety
    ///
    /// While reads are in flight (from a call that returned without counting them
    /// until one that counts them), the buffer they target must stay allocated and
    /// untouched: the fabric writes into it.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get); `InvalidInput` if reads are in flight and `iov` does not
    /// start with their buffer.
    pub unsafe fn get_nowait(&mut self, iov: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.get_inner(iov, GetMode::NoWait)
    }

    /// True while RDMA READs started by [`get_nowait`](Self::get_nowait) have not been
    /// counted yet.
    pub fn reads_in_flight(&self) -> bool {
        self.reads.is_some()
    }

    fn get_inner(&mut self, iov: &mut [IoSliceMut<'_>], mode: GetMode) -> io::Result<usize> {
        let nowait = mode != GetMode::Wait;
        let mut done = 0;
        let mut resumed = 0;
        if let Some(r) = self.reads.take() {
            // Reads in flight: the caller must offer their buffer first.
            let first = iov.iter().find(|b| !b.is_empty());
            if !first.is_some_and(|b| b.as_ptr() as usize == r.dst && b.len() >= r.len) {
                self.reads = Some(r);
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "zero-copy reads are in flight: offer the same buffer again until they are counted",
                ));
            }
            match self.finish_reads(r, !nowait)? {
                None => return Ok(0),
                Some(n) => resumed = n,
            }
        }
        for buf in iov.iter_mut() {
            if buf.is_empty() {
                continue;
            }
            // Bytes of reads counted above landed at the start of the first buffer.
            let mut at = std::mem::take(&mut resumed);
            while at < buf.len() {
                if self.zc.is_none() && !self.in_packet && !self.next_packet()? {
                    break;
                }
                if self.zc.is_some() {
                    if mode == GetMode::RingOnly {
                        // The zero-copy transfer is left for get_nowait.
                        done += at;
                        self.after_get(done)?;
                        return Ok(done);
                    }
                    if !nowait {
                        at += self.read_zero_copy(&mut buf[at..])?;
                        continue;
                    }
                    // SAFETY: get_nowait's contract keeps the buffer untouched while
                    // the reads are in flight.
                    let r = unsafe { self.start_reads(buf[at..].as_mut_ptr(), buf.len() - at) }?;
                    match self.finish_reads(r, false)? {
                        Some(n) => {
                            at += n;
                            continue;
                        }
                        None => {
                            done += at;
                            self.maintain()?;
                            return Ok(done);
                        }
                    }
                }
                let n = self.cur_left.min(buf.len() - at);
                // SAFETY: [cur_off, cur_off + n) lies inside the ring (next_packet checked
                // the packet fits) and the whole packet is visible and will not be
                // rewritten until we publish a tail beyond it; `buf` is exclusively ours.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.ring_base.add(self.cur_off),
                        buf[at..].as_mut_ptr(),
                        n,
                    );
                }
                at += n;
                self.cur_off += n;
                self.cur_left -= n;
                if self.cur_left == 0 {
                    self.finish_packet();
                }
            }
            done += at;
            if at < buf.len() {
                break;
            }
        }
        self.after_get(done)?;
        Ok(done)
    }

    /// Delayed tail update and credit service, run after every `get`.
    fn maintain(&mut self) -> io::Result<()> {
        let link = &*self.link;
        let told = link
            .rx_explicit
            .load(Ordering::Relaxed)
            .max(link.rx_piggy.load(Ordering::Relaxed));
        if self.read_pos.saturating_sub(told) >= self.threshold {
            link.publish_tail()?;
        }
        link.serve_credit()
    }

    /// True once the peer closed and everything it sent has been read.
    fn at_end(&self) -> bool {
        // Acquire: pairs with the fabric's Release store of the end-of-stream word, which
        // the peer posted after all its packets.
        let fin = self.link.ctrl_word(CTRL_FIN).load(Ordering::Acquire);
        !self.in_packet && self.zc.is_none() && fin != 0 && self.read_pos + 1 >= fin
    }

    /// Called when a poll found nothing: end of stream, and now and then the health
    /// of the connection.
    fn idle(&mut self) -> io::Result<()> {
        // A failure seen by the other half or by a waiter is this half's too, at once.
        if let Some(e) = self.link.error() {
            return Err(e);
        }
        if self.at_end() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
        self.empty_polls += 1;
        if self.empty_polls >= HEALTH_EVERY {
            self.empty_polls = 0;
            self.link.check_health()?;
        }
        Ok(())
    }

    fn after_get(&mut self, done: usize) -> io::Result<()> {
        self.maintain()?;
        if done == 0 && !self.in_packet && self.zc.is_none() {
            self.idle()?;
        }
        Ok(())
    }

    /// True when a `get` would return data now.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub fn can_get(&mut self) -> io::Result<bool> {
        Ok(self.in_packet || self.zc.is_some() || self.next_packet()?)
    }

    /// Waits (with the configured backoff) until `get` can return data.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get): `UnexpectedEof` at end of stream.
    pub fn wait_readable(&mut self) -> io::Result<()> {
        let (s, y, m) = self.link.cfg.wait();
        let mut b = Backoff::new(s, y, m);
        loop {
            if self.can_get()? {
                return Ok(());
            }
            self.maintain()?;
            self.idle()?;
            b.snooze();
        }
    }

    /// One non-blocking step of [`wait_readable`](Self::wait_readable), for callers
    /// that wait on many connections at once: true when a `get` would return data
    /// now, or when the RDMA READs that [`get_nowait`](Self::get_nowait) left in
    /// flight have landed (so that it would count them). Serves credit requests and
    /// delayed tail updates, and checks the connection's health now and then.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get): `UnexpectedEof` at end of stream.
    pub fn poll_readable(&mut self) -> io::Result<bool> {
        if let Some(r) = &self.reads {
            let link = &*self.link;
            let drained = link.drain_completions();
            // Acquire: as in finish_reads.
            if link.sq.completed.load(Ordering::Acquire) > r.last {
                return Ok(true);
            }
            drained?;
            return Ok(false);
        }
        if self.can_get()? {
            return Ok(true);
        }
        self.maintain()?;
        self.idle()?;
        Ok(false)
    }

    /// Stops reading: the peer's `put` fails with `BrokenPipe` from now on. Dropping
    /// the receiver does the same.
    pub fn close(&mut self) {
        if self.link.error().is_none() {
            let _ = self.link.post_ctrl(CTRL_RX_CLOSED, 1);
        }
    }
}

impl<F: Fabric> Drop for Receiver<F> {
    fn drop(&mut self) {
        // Reads left in flight by get_nowait target the caller's memory: let them land
        // before the caller can take that memory back.
        if let Some(r) = self.reads.take() {
            let _ = self.link.wait_completed(r.last);
            self.link.rcache.release(r.handle);
        }
        self.close();
    }
}

/// How far a `get` goes at a zero-copy transfer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum GetMode {
    /// Starts its RDMA READs and waits for them (`get`).
    Wait,
    /// Starts them and returns (`get_nowait`).
    NoWait,
    /// Stops before it (`get_buffered`).
    RingOnly,
}
