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
//! | 64 | sender into our ring | credit request: the tail it knows + 1, when out of room |
//! | 72 | sender into our ring | end of stream: its final head + 1 |
//!
//! Tail updates (seed 001 sec. 4.3) travel piggybacked in every packet of the reverse
//! direction, and explicitly (one 8-byte write) when the consumed-but-unannounced
//! bytes pass the threshold, or when the sender asked for credit. The credit request
//! is what makes "both rings full" safe: a sender that cannot progress says so, and
//! the receiver answers as soon as it has consumed anything, even if the piggybacked
//! updates it sent sit unread in the other ring.

mod wait;

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
use crate::ring::wire::{
    cells_for, trailer_word, Header, PacketKind, CELL, HEADER_LEN, ONE_CELL_PAYLOAD, OVERHEAD,
    TRAILER_LEN,
};
use crate::ring::{boundary_offsets, max_payload_now, PAYLOAD_OFFSET};

const CTRL_SIZE: usize = 4096;
const CTRL_TAIL: u64 = 0;
const CTRL_RX_CLOSED: u64 = 8;
const CTRL_CREDIT: u64 = 64;
const CTRL_FIN: u64 = 72;

const CARD_MAGIC: &[u8; 4] = b"RCHC";
const CARD_VERSION: u16 = 1;

/// Most gather entries one packet uses (header, payload pieces, padding, trailer).
const MAX_SGE: usize = 32;
/// Empty polls between two checks of the queue pair's health.
const HEALTH_EVERY: u32 = 1024;

/// Zero bytes that padding is gathered from.
static ZEROS: [u8; CELL] = [0; CELL];

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
    cfg: Config,
    _fabric: F,
}

/// Counts posted and retired work requests where the fabric's queue is finite.
struct SendQueue {
    depth: u64,
    interval: u64,
    posted: AtomicU64,
    retired: AtomicU64,
}

impl<F: Fabric> Link<F> {
    fn ctrl_word(&self, off: u64) -> &AtomicU64 {
        // SAFETY: the control region is page-aligned, CTRL_SIZE long and lives as long
        // as `self`; its words are only ever accessed atomically here and written by the
        // peer's fabric as aligned 8-byte words (fabric guarantee 3).
        unsafe { &*(self.ctrl.addr().add(off as usize) as *const AtomicU64) }
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
            return Err(self.fail(
                io::ErrorKind::ConnectionReset,
                "connection broken: the peer is gone or the queue pair failed".into(),
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
        loop {
            let n = self.qp.poll(&mut wcs);
            for wc in &wcs[..n] {
                if wc.status != CompletionStatus::Success {
                    let kind = match wc.status {
                        CompletionStatus::TransportError | CompletionStatus::Flushed => {
                            io::ErrorKind::ConnectionReset
                        }
                        _ => io::ErrorKind::Other,
                    };
                    return Err(self.fail(kind, format!("RDMA operation failed: {:?}", wc.status)));
                }
                // A signalled success retires it and every unsignalled request before it.
                self.sq.retired.fetch_max(wc.wr_id + 1, Ordering::AcqRel);
            }
            if n < wcs.len() {
                return Ok(());
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
            let mut backoff = Backoff::new(1000, 100, std::time::Duration::from_micros(100));
            while self.sq.posted.load(Ordering::Acquire) - self.sq.retired.load(Ordering::Acquire)
                >= self.sq.depth
            {
                self.check_health()?;
                backoff.snooze();
            }
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
        cfg.validate()?;
        let ring = fabric.alloc_region(
            cfg.ring_size_bytes(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        let ctrl = fabric.alloc_region(CTRL_SIZE, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        let pending = fabric.create_qp()?;
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
        let mut bytes = Vec::with_capacity(fabric_card.bytes.len() + 50);
        bytes.extend_from_slice(CARD_MAGIC);
        bytes.extend_from_slice(&CARD_VERSION.to_le_bytes());
        bytes.extend_from_slice(&(fabric_card.bytes.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&fabric_card.bytes);
        bytes.extend_from_slice(&self.ring.remote().to_bytes());
        bytes.extend_from_slice(&self.ctrl.remote().to_bytes());
        Ok(Card {
            bytes,
            fds: fabric_card.fds,
        })
    }

    /// Connects to the peer described by `peer` and returns the channel.
    ///
    /// # Errors
    ///
    /// `InvalidData` for a malformed card or one whose ring is unusable; fabric
    /// failures as they come.
    pub fn connect(self, peer: Card) -> io::Result<Channel<F>> {
        let invalid = |m: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad connection card: {m}"),
            )
        };
        let b = &peer.bytes;
        if b.len() < 10 || &b[0..4] != CARD_MAGIC {
            return Err(invalid("not an rdma-channel card"));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != CARD_VERSION {
            return Err(invalid(&format!(
                "version {version}, expected {CARD_VERSION}"
            )));
        }
        let flen = u32::from_le_bytes(b[6..10].try_into().unwrap()) as usize;
        if b.len() != 10 + flen + 40 {
            return Err(invalid("wrong length"));
        }
        let fabric_bytes = b[10..10 + flen].to_vec();
        let peer_ring = RemoteRegion::from_bytes(&b[10 + flen..]).ok_or_else(|| invalid("ring"))?;
        let peer_ctrl =
            RemoteRegion::from_bytes(&b[30 + flen..]).ok_or_else(|| invalid("control"))?;
        if !peer_ring.len.is_power_of_two()
            || peer_ring.len < 4096
            || peer_ring.addr % CELL as u64 != 0
        {
            return Err(invalid(
                "peer ring size must be a power of two of at least 4 KiB, cell aligned",
            ));
        }
        if peer_ctrl.len < 128 || peer_ctrl.addr % 64 != 0 {
            return Err(invalid("peer control region too small or misaligned"));
        }
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
            },
            broken: Mutex::new(None),
            is_broken: AtomicBool::new(false),
            cfg: self.cfg,
            _fabric: self.fabric,
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
        if self.closed {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "put after close"));
        }
        let link = &*self.link;
        if let Some(e) = link.error() {
            return Err(e);
        }
        // Relaxed: a flag only; nothing is read on its strength.
        if link.ctrl_word(CTRL_RX_CLOSED).load(Ordering::Relaxed) != 0 {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the peer closed its reading side",
            ));
        }
        link.serve_credit()?;
        let total: usize = iov.iter().map(|s| s.len()).sum();
        let (mut idx, mut off, mut done) = (0usize, 0usize, 0usize);
        while done < total {
            let mut room = max_payload_now(self.ring_size, self.head, self.tail, self.chunk);
            if room < total - done && room < self.chunk as usize - OVERHEAD {
                self.refresh_tail()?;
                room = max_payload_now(self.ring_size, self.head, self.tail, self.chunk);
                if room == 0 {
                    self.request_credit()?;
                    break;
                }
            }
            // Skip empty slices so the cursor always points at a byte.
            while iov[idx].len() == off {
                idx += 1;
                off = 0;
            }
            let n = self.write_packet(&iov[idx..], off, (total - done).min(room))?;
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
        self.write_gathered(iov, skip, want)
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
        Header::new_unchecked(&mut header[..]).fill(self.head, PacketKind::Data, len as u32, ack);
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

    /// Waits (with the configured backoff) until `put` can progress.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put).
    pub fn wait_writable(&mut self) -> io::Result<()> {
        let (s, y, m) = self.link.cfg.wait();
        let mut b = Backoff::new(s, y, m);
        loop {
            if self.link.ctrl_word(CTRL_RX_CLOSED).load(Ordering::Relaxed) != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the peer closed its reading side",
                ));
            }
            self.link.serve_credit()?;
            if self.can_put()? {
                return Ok(());
            }
            b.snooze();
        }
    }
}

impl<F: Fabric> Drop for Sender<F> {
    fn drop(&mut self) {
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
            }
        }
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
        let mut done = 0;
        for buf in iov.iter_mut() {
            let mut at = 0;
            while at < buf.len() {
                if !self.in_packet && !self.next_packet()? {
                    break;
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
        !self.in_packet && fin != 0 && self.read_pos + 1 >= fin
    }

    /// Called when a poll found nothing: end of stream, and now and then the health
    /// of the connection.
    fn idle(&mut self) -> io::Result<()> {
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
        if done == 0 && !self.in_packet {
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
        Ok(self.in_packet || self.next_packet()?)
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
        self.close();
    }
}
