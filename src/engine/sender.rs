//! The sending direction: packets into the ring in the peer's memory, flow control
//! by the replicated tail, and the sender's side of zero-copy transfers (announce,
//! confirm; the lending itself is in [`zerocopy`](super::zerocopy)).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::connect::staging_for;
use super::lane::LaneCell;
use super::link::{Link, HEALTH_EVERY};
use super::wait::{past, Backoff};
use super::zerocopy::{advises_zero_copy, CopyInMeter, Lent, Relay, Relayed, MEASURE_MIN};
use crate::fabric::{
    DirectTarget, Fabric, GatherList, QueuePair, RemoteRegion, ZeroCopyThresholds,
};
use crate::rcache::{CacheStats, RdmaBuf, RegCache, RegHandle};
use crate::ring::memory::{BellTarget, CtrlWord, StagingBuffer, EOS_ABORTED};
use crate::ring::wire::{
    cells_for, fits_short, trailer_word, Header, PacketKind, RndvSeg, ShortHeader, CELL,
    HEADER_LEN, ONE_CELL_PAYLOAD, OVERHEAD, SHORT_ACK_SPAN, SHORT_PAYLOAD, SHORT_WRITE,
    TRAILER_LEN,
};
use crate::ring::{lap_end, max_payload_now, tail_ok, wrap_early};

/// Most gather entries one packet uses (header, payload pieces, padding, trailer).
pub(super) const MAX_SGE: usize = 32;
/// Zero bytes that padding (and pad packets) are gathered from.
static ZEROS: [u8; 8 * CELL] = [0; 8 * CELL];
/// Packets of up to this many cells are assembled on the stack and written as one
/// piece: one copy into the ring instead of one per gather entry. Nine cells take a
/// 512-byte message with an MPI header: an MPICH round trip of 512 B on the emulated
/// fabric is ~450 instructions fewer than through the gather list (the work request,
/// its decoding and the piecewise copy; bench/notebook/2026-12.md).
const STACKED_CELLS: usize = 9;
/// The middle size of stack buffer (see [`Sender::write_small`]).
const MID_CELLS: usize = 4;
/// Largest payload of such a packet.
const STACKED_PAYLOAD: usize = STACKED_CELLS * CELL - OVERHEAD;
/// Largest payload of a packet the C caller writes through the lane (besides the
/// limits of [`Sender::lane_payload`]): 16 KiB of ring. Up to 552 bytes (the stacked
/// size) the library's own put was already short; from there to 4 KiB its general
/// path (gather list, work request, piecewise copy: ~900 instructions a round trip
/// more at 2 KiB) took 0.3-0.6 us of a one-way that the lane's one copy does not
/// (MPICH `osu_latency` at 2 KiB, 2.37 against 1.72 us; bench/notebook/2026-12.md).
const LANE_PAYLOAD: usize = 256 * CELL - OVERHEAD;
/// Most buffers a small message may come in and still take the stacked path
/// ([`Sender::put_small_now`]): summing their lengths costs less than the general
/// path's cursor.
const SMALL_PIECES: usize = 4;
/// `BYTES` of packet (whole cells), aligned like the ring's cells so the copy into
/// the ring is aligned too.
#[repr(C, align(64))]
struct Cells<const BYTES: usize>([u8; BYTES]);

/// The sending direction of a connection.
pub struct Sender<F: Fabric> {
    pub(crate) link: Arc<Link<F>>,
    /// The send lane (`lane.rs`), which also holds the master head of the outgoing
    /// ring ([`head`](Self::head)) and the doorbell request last answered: a C caller
    /// may write packets through it between calls.
    lane: Arc<LaneCell>,
    /// A C caller asked for the lane: publish it after each call.
    lane_armed: bool,
    /// Where the peer ring lies in this process, once looked up (for the lane).
    direct: Option<(RemoteRegion, DirectTarget)>,
    /// Cached replica of the peer's tail: never ahead of the real one (or, in a ring
    /// just switched to, the ring's first position: nothing before it is in there).
    tail: u64,
    /// The peer ring we write into, and its size.
    peer_ring: RemoteRegion,
    ring_size: u64,
    /// The peer's first ring's size: the smallest it may offer (a rendezvous
    /// announcement sized for it must fit every ring).
    min_ring: u64,
    /// Registered copy of the peer ring for packets too long to write inline.
    staging: Option<StagingBuffer<F::Region>>,
    /// Staging buffers of rings left behind, with the number of the first request
    /// posted after them: freed once that request's predecessors completed.
    retired_staging: Vec<(u64, StagingBuffer<F::Region>)>,
    /// Ring offers taken so far (the number of the last one).
    offers_taken: u64,
    /// A bigger ring was asked for since the last switch.
    growth_asked: bool,
    /// The last early wrap: where its wrap packet ended, and the bytes of the lap it
    /// skipped (to the next lap's start). Until the receiver is known to be past it,
    /// `head - tail` counts those bytes, which hold nothing.
    last_wrap: (u64, u64),
    /// Ring offset past which the sender starts over at offset 0 when it can
    /// ([`wrap_early`]), for the largest packets; smaller ones start over sooner
    /// where the fabric shares caches ([`lap_for`](Self::lap_for)).
    working_set: u64,
    /// The fabric moves the ring through shared caches ([`Fabric::shares_caches`]).
    short_laps: bool,
    chunk: u64,
    inline_limit: usize,
    /// Payload entries a gather list may hold (the fabric's limit less three).
    max_pieces: usize,
    /// Known tail at our last credit request (so we ask once per stall).
    credit_requested_at: u64,
    /// The `CtrlWord::RoomWakeFd` word last sent to the peer (0: none).
    room_wake_named: u64,
    closed: bool,
    /// Zero-copy transfers announced and not yet released, oldest first (numbered
    /// consecutively; the peer reads and confirms them in this order).
    pub(crate) in_flight: VecDeque<PendingZc>,
    /// The segments of `in_flight`'s transfers, in the same order (each transfer's
    /// `count` of them in turn): kept apart so that a transfer is two words to queue
    /// and drop, not a 16-segment array moved each way (~250 instructions of copies
    /// a 16 KiB MPI round trip, 2026-12-03).
    pub(crate) in_flight_segs: VecDeque<InFlightSeg>,
    /// The registrations of `in_flight_segs`' buffers in the protection domains of
    /// the rails that have their own (`Link::rail_domain`), with the rail: for each
    /// segment in turn, one per such rail.
    pub(crate) in_flight_rail_regs: VecDeque<(usize, RegHandle)>,
    /// The newest of `in_flight` came from `put_nocopy`, whose caller offers its
    /// buffers again until a call counts them: nothing may follow it until then.
    pub(crate) held: bool,
    /// Number of the next announcement.
    pub(crate) zc_next_id: u64,
    /// Polls of an unconfirmed transfer since the last health check.
    pub(crate) zc_polls: u32,
    /// Most segments one announcement may name (so it fits one packet).
    pub(crate) max_rndv_segs: usize,
    /// The peer's doorbell, rung when it asks ([`set_bell`](Self::set_bell)).
    bell: Option<BellTarget>,
    /// Times large copies into the peer's ring for this end's path meter, where the
    /// adaptive choice is on.
    copy_in: Option<CopyInMeter>,
    /// Where copying puts of large pieces go when the connection has rails
    /// (`zerocopy::relay`).
    pub(crate) relay: Relay<F>,
}

/// What a [`put_lending`](Sender::put_lending) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lending {
    /// Bytes counted, in order: copied into the ring or lent.
    pub bytes: usize,
    /// The ticket of the last buffer the call lent (its buffers are the caller's
    /// again once [`lends_released`](Sender::lends_released) returns at least this),
    /// 0 when it lent none.
    pub ticket: u64,
}

/// A zero-copy transfer the peer has been told about, not yet released: its
/// number, and how many of [`Sender::in_flight_segs`] are its segments.
#[derive(Clone, Copy)]
pub(crate) struct PendingZc {
    pub(crate) id: u64,
    pub(crate) count: usize,
    /// Whether it was recorded as a source of pushes (`Link::add_push_source`).
    pub(crate) pushable: bool,
}

/// One announced buffer of a transfer in flight, with the registration that keeps
/// it readable until the transfer is released.
#[derive(Clone, Copy)]
pub(crate) struct InFlightSeg {
    pub(crate) seg: RndvSeg,
    pub(crate) handle: RegHandle,
}

impl<F: Fabric> Sender<F> {
    pub(super) fn new(
        link: Arc<Link<F>>,
        peer_ring: RemoteRegion,
        staging: Option<StagingBuffer<F::Region>>,
        inline_limit: usize,
        max_pieces: usize,
        max_rndv_segs: usize,
        short_laps: bool,
    ) -> Sender<F> {
        let copy_in = (link.zc_adaptive_min != usize::MAX).then(CopyInMeter::default);
        Sender {
            ring_size: peer_ring.len,
            min_ring: peer_ring.len,
            working_set: link.cfg.working_set_for(peer_ring.len),
            chunk: link.cfg.chunk_for(peer_ring.len),
            peer_ring,
            staging,
            retired_staging: Vec::new(),
            offers_taken: 0,
            growth_asked: false,
            last_wrap: (0, 0),
            short_laps,
            link,
            lane: Arc::new(LaneCell::new()),
            lane_armed: false,
            direct: None,
            tail: 0,
            inline_limit,
            max_pieces,
            credit_requested_at: u64::MAX,
            room_wake_named: 0,
            closed: false,
            in_flight: VecDeque::new(),
            in_flight_segs: VecDeque::new(),
            in_flight_rail_regs: VecDeque::new(),
            held: false,
            zc_next_id: 1,
            zc_polls: 0,
            max_rndv_segs,
            bell: None,
            copy_in,
            relay: Relay::new(),
        }
    }

    /// The master head of the outgoing ring (kept in the lane, which may have
    /// advanced it since the last call).
    #[inline(always)]
    fn head(&self) -> u64 {
        self.lane.head()
    }

    /// From now on, rings the peer's doorbell at `target` after the next write each
    /// time the peer asks for it ([`CtrlWord::BellWanted`]: its receiver stopped
    /// looking at this connection's ring and looks at its doorbell instead). A
    /// process group sets it on its connections; a peer that never asks costs one
    /// load per put.
    pub(crate) fn set_bell(&mut self, target: BellTarget) {
        self.bell = Some(target);
        if self.lane_armed {
            self.publish_lane();
        }
    }

    /// The send lane (`lane.rs`), published from now on after each call that may
    /// change what it may write. The cell outlives this sender if the caller keeps it
    /// (it is closed then).
    pub(crate) fn send_lane(&mut self) -> Arc<LaneCell> {
        self.lane_armed = true;
        self.publish_lane();
        Arc::clone(&self.lane)
    }

    /// After packets written through the lane: rings the peer's doorbell if it asked,
    /// and publishes the lane again.
    pub(crate) fn after_lane(&mut self) {
        self.ring_if_asked();
        if self.lane_armed {
            self.publish_lane();
        }
    }

    /// Largest payload of a lane packet: [`LANE_PAYLOAD`], one inline write of whole
    /// cells and one chunk at most, and below every zero-copy threshold, so that the
    /// lane copies only what [`put`](Self::put) would have copied too.
    fn lane_payload(&self) -> usize {
        let by_inline = (self.inline_limit / CELL * CELL).saturating_sub(OVERHEAD);
        let by_chunk = (self.chunk as usize).saturating_sub(OVERHEAD);
        let t = self.link.zc_thresholds;
        let by_zero_copy = t
            .alloc_mem
            .min(t.other)
            .min(self.link.zc_adaptive_min)
            .saturating_sub(1);
        LANE_PAYLOAD.min(by_inline).min(by_chunk).min(by_zero_copy)
    }

    /// Publishes what the lane may write now: nothing while a `put_nocopy` transfer
    /// is held (its bytes are not the caller's to follow yet), after the end of the
    /// stream, while the peer offers another ring (the library takes it), past the
    /// small packets' lap (the library wraps), after a failure, or where the fabric
    /// does not write by plain stores; else packets of up to
    /// [`lane_payload`](Self::lane_payload) bytes, ending by the tail we know and the
    /// lap's end.
    fn publish_lane(&mut self) {
        let head = self.head();
        let payload = self.lane_payload();
        let lap = self.lap_for(payload);
        let offset = head & (self.ring_size - 1);
        if payload == 0
            || self.closed
            || self.held
            || self.offer_pending()
            || offset >= lap
            || self.link.error().is_some()
        {
            self.lane.close();
            return;
        }
        let known = match self.direct {
            Some((region, t)) if region == self.peer_ring => {
                // SAFETY: the word lies in the peer's table, mapped while the queue
                // pair (held by our link) lives. Acquire: as in the fabric's own check.
                let now = unsafe { (*t.changes).load(Ordering::Acquire) };
                (now == t.seen).then_some(t)
            }
            _ => None,
        };
        let target = match known {
            Some(t) => t,
            None => match self.link.qp.direct_target(self.peer_ring) {
                Some(t) => {
                    self.direct = Some((self.peer_ring, t));
                    t
                }
                None => {
                    self.direct = None;
                    self.lane.close();
                    return;
                }
            },
        };
        let link = &*self.link;
        let end = (head - offset + lap).min(self.tail + self.ring_size);
        self.lane.open(
            target,
            self.ring_size - 1,
            end,
            payload as u64,
            &link.rx_tail,
            &link.rx_piggy,
            self.bell.map(|_| link.ctrl.bell_word()),
        );
    }

    /// Rings the doorbell, or wakes the peer's selector, if the peer asked since we
    /// last did. Called after every write a peer's receiver may be waiting for
    /// (data, an announcement, the end).
    ///
    /// The peer asks with a control-word write and then looks at its ring once more;
    /// we write, then load the request. This side never fences (that would cost every
    /// put), so a write racing the request can be missed by both, unless the peer
    /// fences for both: a process group does not (it still looks at its quiet
    /// connections in turn, slowly, and finds the write then); a selector about to
    /// sleep does, with `membarrier` (`select`), which needs only that the compiler
    /// keep our load after our writes.
    #[inline(always)]
    fn ring_if_asked(&mut self) {
        // No instruction: orders this load after the writes above in the program,
        // which the peer's membarrier then orders on the CPU.
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        if self.link.ctrl.bell_wanted() != self.lane.bell_seen() {
            self.ring_bell();
        }
    }

    #[cold]
    #[inline(never)]
    fn ring_bell(&mut self) {
        self.lane.set_bell_seen(self.link.ctrl.bell_wanted());
        if let Some((fd, instance, value)) = self.link.ctrl.wake_fd() {
            // A wake that fails (the fabric has none, the descriptor is gone) leaves
            // the peer to its bounded sleep.
            let _ = self.link.qp.notify(fd, instance, value);
        }
        let Some(t) = self.bell else {
            return;
        };
        let one = 1u64.to_le_bytes();
        // The slot before the summary, on one queue pair, so they land in that order
        // (fabric guarantee 1): a peer that sees the summary finds the slot. A failed
        // write means a failed connection, which the next call reports; the data
        // itself was written. post_inline, not write_inline: the fabric may remember
        // where write_inline's target lies (the ring, for the data path's next
        // packet), and the doorbell should not take the ring's place.
        let mut list = GatherList::<1>::new();
        list.push(&one);
        let _ = self
            .link
            .post_inline(&list, t.slot, t.rkey)
            .and_then(|()| self.link.post_inline(&list, t.summary, t.rkey));
    }

    /// Writes as much of `iov` as the ring has room for, in order, and returns the
    /// number of bytes taken (0 when the ring is full). The caller may reuse the
    /// buffers as soon as this returns and must offer the rest again later.
    ///
    /// ```
    /// use std::io::{IoSlice, IoSliceMut};
    /// use rdma_channel::{Config, RdmaStream};
    /// let cfg = Config::default().with_ring_size(4096).with_chunk_size(1024);
    /// let (mut a, mut b) = RdmaStream::pair_with(cfg)?;
    /// let data = vec![1u8; 10_000];
    /// // A 4 KiB ring cannot take 10,000 bytes at once: put takes part, retry the rest.
    /// let first = a.put(&[IoSlice::new(&data)])?;
    /// assert!(first > 0 && first < data.len());
    /// assert_eq!(a.put(&[IoSlice::new(&data[first..])])?, 0); // still full
    /// let mut sink = vec![0u8; 10_000];
    /// let got = b.get(&mut [IoSliceMut::new(&mut sink)])?;
    /// assert_eq!(got, first);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `BrokenPipe` once the peer stopped reading or after [`close`](Self::close);
    /// `ConnectionReset` when the peer vanished or the fabric failed.
    #[inline]
    pub fn put(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        let r = match self.put_small_now(iov) {
            Some(r) => r,
            None => self.put_inner(iov, ZeroCopy::Never),
        };
        self.after_lane_put();
        r
    }

    /// Notes for this connection's receiver (its stream backoff) where the head is,
    /// when a C caller may have written packets through the send lane since: the
    /// library sees those only by the head they moved. Called before the receiver
    /// reads, under the exclusion the lane's contract gives.
    #[inline(always)]
    pub(crate) fn note_lane_sends(&self) {
        if self.lane_armed {
            // Relaxed: a hint, written and read by the thread that holds the library.
            self.link.tx_lane_head.store(self.head(), Ordering::Relaxed);
            let notes = self.link.tx_lane_notes.load(Ordering::Relaxed);
            self.link.tx_lane_notes.store(notes + 1, Ordering::Relaxed);
        }
    }

    /// After a put: the lane's room again, if a C caller uses it.
    #[inline(always)]
    pub(crate) fn after_lane_put(&mut self) {
        if self.lane_armed {
            self.publish_lane();
        }
    }

    /// The common small message: up to [`SMALL_PIECES`] buffers (an MPI header and
    /// its payload are two) that together fit a stacked packet, with room at the
    /// head, sent with the same steps as `put_inner` minus its loop and cursor;
    /// `None` when `iov` is not such a message (then `put_inner` sends it).
    #[inline(always)]
    pub(crate) fn put_small_now(&mut self, iov: &[IoSlice<'_>]) -> Option<io::Result<usize>> {
        let len = match iov {
            [one] => one.len(),
            [a, b] => a.len() + b.len(),
            _ if iov.len() <= SMALL_PIECES => iov.iter().map(|s| s.len()).sum(),
            _ => return None,
        };
        if !self.small_fits_now(len) {
            return None;
        }
        Some(self.put_small(iov, len))
    }

    /// [`put_small_now`](Self::put_small_now) once it knows the `len` bytes of `iov`
    /// fit.
    #[inline(always)]
    fn put_small(&mut self, iov: &[IoSlice<'_>], len: usize) -> io::Result<usize> {
        let link = &*self.link;
        if let Some(e) = link.error() {
            return Err(e);
        }
        link.check_peer_reading()?;
        link.serve_credit()?;
        let n = if let Some(ack) = self.short_ack(len) {
            self.write_short(iov, 0, len, ack)?
        } else {
            self.write_small(iov, 0, len)?
        };
        self.ring_if_asked();
        Ok(n)
    }

    /// True when `len` bytes go out as one stacked packet at the head now, with
    /// nothing to settle first: no zero-copy transfer pending, not closed, before the
    /// working set's end, and room by the tail we know.
    #[inline]
    fn small_fits_now(&self, len: usize) -> bool {
        len != 0
            && self.stackable(len)
            && !self.closed
            && !self.held
            && !self.offer_pending()
            && self.head() & (self.ring_size - 1) < self.lap_for(len)
            && max_payload_now(self.ring_size, self.head(), self.tail, self.chunk) >= len
    }

    /// The registration cache of this connection's protection domain (see [`Channel::registration_cache`](crate::Channel::registration_cache)).
    pub fn registration_cache(&self) -> &RegCache<F> {
        &self.link.rcache
    }

    /// The wait policy this connection's blocking calls use: the configuration's,
    /// unless a software RDMA device shares this process's only CPU (see
    /// [`Config::with_wait_policy`](crate::Config::with_wait_policy)).
    pub fn wait_policy(&self) -> crate::config::WaitPolicy {
        self.link.wait
    }

    /// One step of a caller's own wait loop that polls the non-blocking calls:
    /// `backoff.snooze()`, except that on a connection that takes wakes
    /// ([`wakes`](Self::wakes)) a wait past its busy polls blocks until the peer
    /// writes something (credit, a confirmation), instead of sleeping on a timer.
    /// Use a backoff made from [`wait_policy`](Self::wait_policy), reset after
    /// progress.
    ///
    /// ```
    /// use rdma_channel::engine::Backoff;
    /// let (mut a, _b) = rdma_channel::RdmaStream::pair()?;
    /// let tx = a.channel().sender();
    /// let mut backoff = Backoff::with_policy(tx.wait_policy());
    /// tx.snooze(&mut backoff); // the peer wrote nothing: a busy poll
    /// assert!(!tx.wakes()); // the emulated fabric: no wakes
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn snooze(&self, backoff: &mut Backoff) {
        self.link.snooze(backoff);
    }

    /// True when this end's waits block until the peer writes, instead of sleeping
    /// (the fabric does wakes here: on verbs with `RCH_IB_WAKE=1`).
    pub fn wakes(&self) -> bool {
        self.link.wakes
    }

    /// True while a zero-copy transfer [`put_nocopy`](Self::put_nocopy) announced
    /// is not yet counted (a later `put_nocopy` must offer its buffers first).
    pub fn zero_copy_pending(&self) -> bool {
        self.held
    }

    /// Waits (with the configured backoff) until the zero-copy transfer
    /// [`put_nocopy`](Self::put_nocopy) announced is confirmed by the peer, so that
    /// the next `put_nocopy` counts it.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put).
    pub fn wait_zero_copy(&mut self) -> io::Result<()> {
        let mut b = Backoff::with_policy(self.link.wait);
        while let Some(id) = self.held_id() {
            if self.zc_confirmed(id)? {
                return Ok(());
            }
            self.link.serve_credit()?;
            self.link.snooze(&mut b);
        }
        Ok(())
    }

    /// Serves the peer's pushes for the lent transfers, releases those the peer has
    /// read, and returns the ticket of the last released: every buffer
    /// [`put_lending`](Sender::put_lending) lent under that ticket or a lower one is
    /// the caller's again. Never blocks.
    ///
    /// # Errors
    ///
    /// The connection's failure (the lent buffers are revoked then and may be
    /// reused: the peer can no longer read them).
    pub fn lends_released(&mut self) -> io::Result<u64> {
        if let Some(front) = self.in_flight.front() {
            let id = front.id;
            if let Err(e) = self.zc_confirmed(id) {
                self.abort_pending();
                return Err(e);
            }
            self.release_confirmed(self.link.ctrl.zero_copy_done(), false);
        }
        Ok(self.released_through())
    }

    /// One non-blocking look for callers that wait on many connections: true when
    /// a lent transfer can be released now (the peer confirmed the oldest; call
    /// [`lends_released`](Sender::lends_released)). Serves the peer's pushes.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put).
    pub fn poll_released(&mut self) -> io::Result<bool> {
        if self.lends_in_flight() == 0 {
            return Ok(false);
        }
        // The oldest lend's confirmation: a relay transfer ahead of it (a copying
        // put's) releases nothing of the caller's.
        let held = self.held_id();
        let relay = &self.relay;
        let Some(id) = self
            .in_flight
            .iter()
            .map(|p| p.id)
            .find(|&id| Some(id) != held && !relay.holds(id))
        else {
            return Ok(false);
        };
        self.zc_confirmed(id)
    }

    /// Transfers lent by [`put_lending`](Sender::put_lending) and not released yet.
    pub fn lends_in_flight(&self) -> usize {
        self.in_flight.len() - usize::from(self.held) - self.relay.in_flight()
    }

    /// Bytes this sender's copying puts sent through relay slots: with rails,
    /// pieces of at least [`Config::stripe_min`](crate::Config::stripe_min) are
    /// copied into registered buffers of the sender's and read by the peer in
    /// stripes across the rails instead of going through the ring on rail 0.
    pub fn relayed_bytes(&self) -> u64 {
        self.relay.bytes
    }

    /// The number of the transfer `put_nocopy` holds, if any.
    fn held_id(&self) -> Option<u64> {
        self.held
            .then(|| self.in_flight.back().map(|p| p.id))
            .flatten()
    }

    /// Allocates `len` bytes of zeroed, registered memory for zero-copy sends (like
    /// `MPI_Alloc_mem` / `ucp_mem_map`). On the emulated fabric it is a shared segment
    /// the peer reads with a plain copy, so it goes zero-copy from a lower threshold
    /// ([`Config::with_zero_copy_threshold`](crate::Config::with_zero_copy_threshold)) than other memory. The buffer belongs to
    /// this connection's protection domain: on every connection of that domain it
    /// counts as allocated memory; on others it can be sent too, as ordinary memory.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for 0 bytes; out of memory or registration failure.
    pub fn alloc_mem(&self, len: usize) -> io::Result<RdmaBuf<F>> {
        RdmaBuf::new(&self.link.rcache, &self.link.fabric, len)
    }

    /// Counters of the registration cache of this connection's protection domain (shared by its connections).
    pub fn cache_stats(&self) -> CacheStats {
        self.link.rcache.stats()
    }

    /// True once the peer confirmed announcement `id`; checks the connection's health
    /// now and then while it has not.
    pub(crate) fn zc_confirmed(&mut self, id: u64) -> io::Result<bool> {
        let link = &*self.link;
        // The peer may have lent part of its buffer for us to push instead of reading.
        link.serve_lend()?;
        if link.ctrl.zero_copy_done() >= id {
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

    /// Gives up the unreleased transfers after an error: releases and deregisters
    /// their buffers so the peer can no longer read them.
    /// Returns whether there was one.
    pub(crate) fn abort_pending(&mut self) -> bool {
        if self.in_flight.is_empty() && self.in_flight_segs.is_empty() {
            return false;
        }
        // First, so that no push starts from these buffers once they are revoked.
        Link::drop_push_sources(&self.link, u64::MAX);
        self.held = false;
        self.in_flight.clear();
        self.relay.abort();
        self.publish_unconfirmed();
        for s in self.in_flight_segs.drain(..) {
            self.link.rcache.release(s.handle);
            if !s.handle.is_owned() {
                self.link
                    .rcache
                    .invalidate(s.seg.addr as *const u8, s.seg.len as usize);
            }
        }
        for (rail, h) in self.in_flight_rail_regs.drain(..) {
            let d = self.link.rail_domain(rail).expect("a rail with a domain");
            d.rcache.release(h);
            let range = h.range();
            d.rcache.invalidate(range.start as *const u8, range.len());
        }
        true
    }

    /// Releases the transfers the peer confirmed, up to `upto`: their buffers are
    /// the caller's again. The held transfer is released only by the `put_nocopy`
    /// that counts it (`settle`). Returns the number of the last released.
    pub(crate) fn release_confirmed(&mut self, upto: u64, settle: bool) -> u64 {
        let upto = match self.held_id() {
            Some(held) if !settle => upto.min(held - 1),
            _ => upto,
        };
        if self.in_flight.front().is_some_and(|p| p.id <= upto) {
            // Their push sources go before their registrations.
            let mut released = self.in_flight.iter().take_while(|p| p.id <= upto);
            if released.any(|p| p.pushable) {
                Link::drop_push_sources(&self.link, upto);
            }
            while let Some(&p) = self.in_flight.front().filter(|p| p.id <= upto) {
                self.in_flight.pop_front();
                for s in self.in_flight_segs.drain(..p.count) {
                    self.link.rcache.release(s.handle);
                }
                let foreign = self.link.foreign_rails();
                for (rail, h) in self.in_flight_rail_regs.drain(..p.count * foreign) {
                    let d = self.link.rail_domain(rail).expect("a rail with a domain");
                    d.rcache.release(h);
                }
            }
            self.publish_unconfirmed();
            if self.in_flight.is_empty() {
                self.held = false;
            }
            self.relay.release_through(upto);
        }
        self.released_through()
    }

    /// Tells the receiving half how many announced transfers are unconfirmed
    /// (`Link::sending_zero_copy`).
    pub(crate) fn publish_unconfirmed(&self) {
        // Relaxed: a hint for the receiver's choice to split a transfer.
        self.link
            .zc_unconfirmed
            .store(self.in_flight.len() as u64, Ordering::Relaxed);
    }

    /// The number of the last transfer whose buffers are the caller's again.
    fn released_through(&self) -> u64 {
        self.in_flight
            .front()
            .map_or(self.zc_next_id - 1, |p| p.id - 1)
    }

    /// The zero-copy thresholds of this connection: the configuration's, else the
    /// fabric's defaults for this peer (on verbs, lower for a peer on the same port).
    /// A caller whose memory never comes from `alloc_mem` (a C library's, for one)
    /// copies anything below `other` with [`put`](Self::put) and skips the checks of
    /// [`put_nocopy`](Self::put_nocopy).
    ///
    /// ```
    /// let (mut a, _b) = rdma_channel::RdmaStream::pair()?;
    /// let t = a.channel().sender().zero_copy_thresholds();
    /// assert!(t.alloc_mem > 0 && t.other > 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn zero_copy_thresholds(&self) -> ZeroCopyThresholds {
        self.link.zc_thresholds
    }

    /// True when no buffer of `len` bytes goes zero-copy, whatever its memory.
    #[inline]
    pub(crate) fn below_zero_copy(&self, len: usize) -> bool {
        let t = self.link.zc_thresholds;
        len < t.alloc_mem.min(t.other).min(self.link.zc_adaptive_min)
    }

    /// The smallest buffer of memory other than `alloc_mem`'s that may go zero-copy:
    /// the private threshold, or below it the adaptive choice's minimum.
    #[inline]
    pub(crate) fn zero_copy_other_min(&self) -> usize {
        self.link.zc_thresholds.other.min(self.link.zc_adaptive_min)
    }

    /// True when `buf` should go zero-copy: at or above a threshold, or, from the
    /// adaptive minimum up, while the peer receiver advises it (`zerocopy/choose.rs`).
    pub(crate) fn zc_eligible(&self, buf: &[u8]) -> bool {
        self.zc_by_threshold(buf) || self.zc_by_advice(buf)
    }

    /// True when `buf` goes zero-copy by a fixed threshold.
    pub(crate) fn zc_by_threshold(&self, buf: &[u8]) -> bool {
        let t = self.link.zc_thresholds;
        buf.len() >= t.other
            || (buf.len() >= t.alloc_mem && self.link.rcache.is_owned(buf.as_ptr(), buf.len()))
    }

    /// True when `buf` may go zero-copy by the peer receiver's advice.
    pub(crate) fn zc_by_advice(&self, buf: &[u8]) -> bool {
        buf.len() >= self.link.zc_adaptive_min
            && advises_zero_copy(self.link.ctrl.path_advice(), buf.len())
    }

    /// The put loop. Unless `mode` is [`ZeroCopy::Never`], eligible buffers are
    /// announced for zero-copy instead of copied.
    pub(crate) fn put_inner(&mut self, iov: &[IoSlice<'_>], mode: ZeroCopy) -> io::Result<usize> {
        let r = self.put_loop(iov, mode);
        // Even after 0 bytes or an error: an announcement may have gone out.
        self.ring_if_asked();
        r
    }

    fn put_loop(&mut self, iov: &[IoSlice<'_>], mode: ZeroCopy) -> io::Result<usize> {
        if self.closed {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "put after close"));
        }
        if let Some(e) = self.link.error() {
            return Err(e);
        }
        let total: usize = iov.iter().map(|s| s.len()).sum();
        if total >= MEASURE_MIN && self.link.zc_adaptive_min != usize::MAX {
            self.link.note_large_put();
        }
        // A held transfer is settled first: a peer that read it and then closed its
        // reading side has still received it, and the count must say so.
        let Some((mut done, mut idx)) = self.settle_held(iov)? else {
            return Ok(0);
        };
        let mut off = 0;
        let link = &*self.link;
        if let Err(e) = link.check_peer_reading() {
            return if done > 0 { Ok(done) } else { Err(e) };
        }
        link.serve_credit()?;
        while done < total {
            if self.offer_pending() {
                self.take_offer()?;
            }
            // Skip empty slices so the cursor always points at a byte.
            while iov[idx].len() == off {
                idx += 1;
                off = 0;
            }
            // With rails, large copied pieces go through relay slots, striped.
            if matches!(mode, ZeroCopy::Never) && self.relays(total - done) {
                match self.relay_put(iov, idx, off, total - done)? {
                    Relayed::Sent(n) => {
                        done += n;
                        (idx, off) = advance(iov, idx, off, n);
                        continue;
                    }
                    Relayed::Stopped => break,
                    Relayed::Refused => {}
                }
            }
            // Eager bytes stop where the next zero-copy buffer starts.
            let mut eager_left = total - done;
            if let ZeroCopy::Hold(lent) | ZeroCopy::Lend(lent) = mode {
                if off == 0 && self.zc_eligible(&iov[idx]) {
                    if !self.room_for_a_transfer() {
                        break;
                    }
                    let hold = matches!(mode, ZeroCopy::Hold(_));
                    match self.announce(&iov[idx..], lent, hold)? {
                        Announce::Sent { .. } if hold => return Ok(done),
                        Announce::Sent { slices, bytes } => {
                            done += bytes;
                            idx += slices;
                            continue;
                        }
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
            if self.head() & (self.ring_size - 1) >= self.lap_for(eager_left) {
                self.wrap_if_caught_up(eager_left)?;
            }
            let mut room = max_payload_now(self.ring_size, self.head(), self.tail, self.chunk);
            if room < eager_left && room < self.chunk as usize - OVERHEAD {
                self.refresh_tail()?;
                room = max_payload_now(self.ring_size, self.head(), self.tail, self.chunk);
                if room == 0 {
                    self.request_credit()?;
                    break;
                }
            }
            let n = self.write_packet(&iov[idx..], off, eager_left.min(room))?;
            done += n;
            (idx, off) = advance(iov, idx, off, n);
        }
        Ok(done)
    }

    /// True when one more transfer may be announced: fewer than
    /// [`MAX_TRANSFERS_IN_FLIGHT`] unreleased, after releasing those the peer
    /// confirmed.
    pub(crate) fn room_for_a_transfer(&mut self) -> bool {
        if self.in_flight.len() < MAX_TRANSFERS_IN_FLIGHT {
            return true;
        }
        self.release_confirmed(self.link.ctrl.zero_copy_done(), false);
        self.in_flight.len() < MAX_TRANSFERS_IN_FLIGHT
    }

    /// Settles the held zero-copy transfer before anything else is sent: `None`
    /// while the peer has not read it all, else the bytes it counts for and the
    /// index of the first slice after its buffers (`(0, 0)` when none was held).
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `iov` does not start with the announced buffers; the
    /// connection's error.
    fn settle_held(&mut self, iov: &[IoSlice<'_>]) -> io::Result<Option<(usize, usize)>> {
        if !self.held {
            return Ok(Some((0, 0)));
        }
        let p = *self.in_flight.back().expect("a held transfer is in flight");
        let segs = self
            .in_flight_segs
            .range(self.in_flight_segs.len() - p.count..);
        // The caller must offer the announced buffers again, first.
        let mut matched = 0;
        let mut bytes = 0;
        for (s, f) in iov.iter().filter(|s| !s.is_empty()).zip(segs) {
            if s.as_ptr() as u64 != f.seg.addr || s.len() as u64 != f.seg.len {
                break;
            }
            matched += 1;
            bytes += s.len();
        }
        if matched < p.count {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a zero-copy put is in flight: offer the same buffers again until it is counted",
            ));
        }
        let (id, count) = (p.id, p.count);
        if !self.zc_confirmed(id)? {
            return Ok(None);
        }
        // The peer confirms in order: the transfers before it are released too.
        self.release_confirmed(id, true);
        // Skip past the announced buffers.
        let (mut idx, mut seen) = (0, 0);
        while seen < count {
            if !iov[idx].is_empty() {
                seen += 1;
            }
            idx += 1;
        }
        Ok(Some((bytes, idx)))
    }

    /// Writes one packet of at most `want` payload bytes starting at byte `skip` of
    /// `iov`; returns the payload bytes written (at least one cell's worth or `want`).
    fn write_packet(&mut self, iov: &[IoSlice<'_>], skip: usize, want: usize) -> io::Result<usize> {
        if self.stackable(want) {
            if let Some(ack) = self.short_ack(want) {
                return self.write_short(iov, skip, want, ack);
            }
            return self.write_small(iov, skip, want);
        }
        self.write_gathered(iov, skip, want, PacketKind::Data)
    }

    /// Makes sure a packet with `payload` bytes fits in one piece at the head, writing
    /// a pad packet to the ring's physical end if that is what stands in the way.
    /// False when the ring has no room (credit requested).
    pub(crate) fn make_room_for(&mut self, payload: usize) -> io::Result<bool> {
        loop {
            let room = max_payload_now(self.ring_size, self.head(), self.tail, self.chunk);
            if room >= payload {
                return Ok(true);
            }
            let to_end = self.ring_size - (self.head() & (self.ring_size - 1));
            let free = self.ring_size - (self.head() - self.tail);
            if room > 0 && to_end < (cells_for(payload) * CELL) as u64 && free >= to_end {
                // Fill to the end with a pad packet; the packet then starts at offset 0.
                let pad = to_end as usize - OVERHEAD;
                self.write_gathered(&[IoSlice::new(&ZEROS[..pad])], 0, pad, PacketKind::Pad)?;
                continue;
            }
            self.refresh_tail()?;
            if max_payload_now(self.ring_size, self.head(), self.tail, self.chunk) >= payload {
                return Ok(true);
            }
            if max_payload_now(self.ring_size, self.head(), self.tail, self.chunk) == room {
                self.request_credit()?;
                return Ok(false);
            }
        }
    }

    /// Ring offset past which the sender starts over at offset 0, when it can,
    /// before a packet of up to `payload` bytes: [`lap_end`] where the fabric shares
    /// caches, else the working set.
    #[inline]
    fn lap_for(&self, payload: usize) -> u64 {
        if !self.short_laps {
            return self.working_set;
        }
        lap_end(self.ring_size, self.working_set, self.packet_bytes(payload))
    }

    /// Ring bytes of the next packet for `payload` bytes to send (at most a chunk).
    #[inline]
    fn packet_bytes(&self, payload: usize) -> u64 {
        (cells_for(payload.min(self.chunk as usize - OVERHEAD)) * CELL) as u64
    }

    /// True when a packet of `len` payload bytes takes the stacked path
    /// ([`write_small`](Self::write_small)): it fits the stack buffer and one inline write.
    #[inline]
    pub(crate) fn stackable(&self, len: usize) -> bool {
        len <= STACKED_PAYLOAD && cells_for(len) * CELL <= self.inline_limit
    }

    /// The tail to piggyback on a short packet of `len` bytes (ring::wire docs), or
    /// `None` when the packet must take the full form: more than
    /// [`SHORT_PAYLOAD`] bytes, or a tail that moved [`SHORT_ACK_SPAN`] or more
    /// since the ack sent last (the short form carries only its low bits).
    #[inline(always)]
    fn short_ack(&self, len: usize) -> Option<u64> {
        if !fits_short(len) {
            return None;
        }
        let link = &*self.link;
        // Acquire: as in write_gathered.
        let ack = link.rx_tail.load(Ordering::Acquire);
        // Relaxed: only this half writes rx_piggy.
        (ack.wrapping_sub(link.rx_piggy.load(Ordering::Relaxed)) < SHORT_ACK_SPAN).then_some(ack)
    }

    /// The small-message path in the full form: the whole packet (at most
    /// [`STACKED_CELLS`] cells) is assembled on the stack and written with a single
    /// gather entry.
    #[inline]
    fn write_small(&mut self, iov: &[IoSlice<'_>], skip: usize, len: usize) -> io::Result<usize> {
        self.write_small_as(iov, skip, len, PacketKind::Data)
    }

    /// [`write_small`](Self::write_small) for a packet of any `kind` (a zero-copy
    /// announcement takes it too: the general path's gather list and work request
    /// cost ~400 instructions more than this copy of 48 bytes).
    #[inline]
    pub(crate) fn write_small_as(
        &mut self,
        iov: &[IoSlice<'_>],
        skip: usize,
        len: usize,
        kind: PacketKind,
    ) -> io::Result<usize> {
        // The smallest buffer that holds the packet: the buffer is zeroed whole (its
        // padding goes to the peer), and zeroing a larger one costs a one-cell packet
        // more than its copy.
        if len <= ONE_CELL_PAYLOAD {
            self.write_stacked::<CELL>(iov, skip, len, kind)
        } else if len <= MID_CELLS * CELL - OVERHEAD {
            self.write_stacked::<{ MID_CELLS * CELL }>(iov, skip, len, kind)
        } else {
            self.write_stacked::<{ STACKED_CELLS * CELL }>(iov, skip, len, kind)
        }
    }

    /// A short packet (ring::wire docs): `len` bytes (at most [`SHORT_PAYLOAD`]) of
    /// `iov` from byte `skip`, then the short header carrying `ack`, which is less
    /// than [`SHORT_ACK_SPAN`] past the ack sent last; 16 bytes written, one cell
    /// taken. Inlined, as `write_stacked`.
    #[inline(always)]
    fn write_short(
        &mut self,
        iov: &[IoSlice<'_>],
        skip: usize,
        len: usize,
        ack: u64,
    ) -> io::Result<usize> {
        let link = &*self.link;
        let mut packet = Cells([0; SHORT_WRITE]);
        gather_into(&mut packet.0[..len], iov, skip);
        let header = ShortHeader::new(self.head(), len, ack);
        packet.0[SHORT_PAYLOAD..].copy_from_slice(&header.word().to_le_bytes());
        let remote = self.peer_ring.addr + (self.head() & (self.ring_size - 1));
        link.write_inline(&packet.0, remote, self.peer_ring.rkey)?;
        self.lane.set_head(self.head() + CELL as u64);
        self.sent_ack(ack);
        Ok(len)
    }

    /// [`write_small`](Self::write_small) with a buffer of `BYTES`, which must hold
    /// the packet. Inlined: each call and return costs a small message's latency
    /// under a TCG guest (see `copy_short`).
    #[inline(always)]
    fn write_stacked<const BYTES: usize>(
        &mut self,
        iov: &[IoSlice<'_>],
        skip: usize,
        len: usize,
        kind: PacketKind,
    ) -> io::Result<usize> {
        let link = &*self.link;
        let bytes = cells_for(len) * CELL;
        let mut cells = Cells([0; BYTES]);
        gather_into(&mut cells.0[HEADER_LEN..HEADER_LEN + len], iov, skip);
        // Acquire: as in write_gathered.
        let ack = link.rx_tail.load(Ordering::Acquire);
        Header::new_unchecked(&mut cells.0[..HEADER_LEN]).fill(self.head(), kind, len as u32, ack);
        let end = self.head() + bytes as u64;
        cells.0[bytes - TRAILER_LEN..bytes].copy_from_slice(&trailer_word(end).to_le_bytes());
        let remote = self.peer_ring.addr + (self.head() & (self.ring_size - 1));
        link.write_inline(&cells.0[..bytes], remote, self.peer_ring.rkey)?;
        self.lane.set_head(end);
        self.sent_ack(ack);
        Ok(len)
    }

    /// Records `ack` as piggybacked on a packet just written: the tail the peer now
    /// knows (the base of the next short packet's ack, and of the receiver's tail
    /// threshold).
    #[inline(always)]
    fn sent_ack(&self, ack: u64) {
        let link = &*self.link;
        // Relaxed: only this half writes rx_piggy; the receiver reads it as a hint.
        if ack > link.rx_piggy.load(Ordering::Relaxed) {
            link.rx_piggy.store(ack, Ordering::Relaxed);
        }
    }

    /// The general path: header, payload slices straight from `iov`, padding and
    /// trailer as one gather list.
    pub(crate) fn write_gathered(
        &mut self,
        iov: &[IoSlice<'_>],
        skip: usize,
        want: usize,
        kind: PacketKind,
    ) -> io::Result<usize> {
        let link = &*self.link;
        // The payload length first: the gather list holds at most `max_pieces`
        // payload entries, which may end the packet before `want` bytes.
        let (mut len, mut pieces) = (0, 0);
        let (mut i, mut o) = (0usize, skip);
        while len < want && pieces < self.max_pieces {
            let n = (iov[i].len() - o).min(want - len);
            if n > 0 {
                len += n;
                pieces += 1;
            }
            i += 1;
            o = 0;
        }
        let cells = cells_for(len);
        let bytes = cells * CELL;
        let end = self.head() + bytes as u64;
        let pad = bytes - OVERHEAD - len;
        let mut header = [0u8; HEADER_LEN];
        // Acquire pairs with the receiver's Release after copying out: the value we
        // announce is only ever a position whose bytes were fully consumed.
        let ack = link.rx_tail.load(Ordering::Acquire);
        Header::new_unchecked(&mut header[..]).fill(self.head(), kind, len as u32, ack);
        let trailer = trailer_word(end).to_le_bytes();
        let mut list = GatherList::<MAX_SGE>::new();
        list.push(&header);
        let (mut i, mut o, mut left) = (0usize, skip, len);
        while left > 0 {
            let n = (iov[i].len() - o).min(left);
            if n > 0 {
                list.push(&iov[i][o..o + n]);
                left -= n;
            }
            i += 1;
            o = 0;
        }
        if pad > 0 {
            list.push(&ZEROS[..pad]);
        }
        list.push(&trailer);
        let at = (self.head() & (self.ring_size - 1)) as usize;
        let remote = self.peer_ring.addr + at as u64;
        let timed = (len >= MEASURE_MIN && self.copy_in.is_some()).then(Instant::now);
        if bytes <= self.inline_limit {
            link.post_inline(&list, remote, self.peer_ring.rkey)?;
        } else {
            // At the offset it will have in the peer's ring: that space is ours until
            // the peer frees it, which it does only after this write landed.
            let staging = self
                .staging
                .as_ref()
                .expect("a staging buffer exists when packets exceed the inline limit");
            link.post_staged(staging, &self.peer_ring, at, &list)?;
        }
        if let (Some(t0), Some(meter)) = (timed, self.copy_in.as_mut()) {
            link.note_ring_copy_in(meter.offer(len, t0.elapsed()));
        }
        self.lane.set_head(end);
        self.sent_ack(ack);
        Ok(len)
    }

    /// Past the working set: ends the lap early with a wrap packet when the receiver
    /// has consumed enough that the next packet, of up to `payload` bytes, fits at
    /// offset 0 ([`wrap_early`]), so traffic stays in the ring's first, cached, bytes.
    fn wrap_if_caught_up(&mut self, payload: usize) -> io::Result<()> {
        let next = self.packet_bytes(payload);
        let lap = self.lap_for(payload);
        if !wrap_early(self.ring_size, self.head(), self.tail, next, lap) {
            self.update_tail()?;
            if !wrap_early(self.ring_size, self.head(), self.tail, next, lap) {
                return Ok(());
            }
        }
        self.write_gathered(&[], 0, 0, PacketKind::Wrap)?;
        // The receiver skips to the same place when it meets the wrap packet.
        let end = self.head();
        let next_lap = end.next_multiple_of(self.ring_size);
        self.last_wrap = (end, next_lap - end);
        self.lane.set_head(next_lap);
        Ok(())
    }

    /// Updates the cached tail from the explicit control word and piggybacked acks,
    /// then checks the connection's health.
    fn refresh_tail(&mut self) -> io::Result<()> {
        self.update_tail()?;
        self.link.check_health()
    }

    /// Updates the cached tail from the explicit control word and piggybacked acks.
    fn update_tail(&mut self) -> io::Result<()> {
        let link = &*self.link;
        // Acquire pairs with the peer's Release (the fabric's last-word store, or our
        // receiver's Release on tx_tail_piggy): the peer finished reading the space
        // before it announced it, so our next writes cannot overtake its reads.
        let explicit = link.ctrl.tail();
        let piggy = link.tx_tail_piggy.load(Ordering::Acquire);
        let t = explicit.max(piggy);
        if !tail_ok(t, self.head()) {
            return Err(link.fail(
                io::ErrorKind::InvalidData,
                format!(
                    "protocol error: peer announced tail {t} beyond head {}",
                    self.head()
                ),
            ));
        }
        if t > self.tail {
            self.tail = t;
        }
        Ok(())
    }

    /// Bytes written that the receiver is not known to have consumed, less the part
    /// of a lap that the last early wrap skipped: what the ring really holds for it.
    fn unconsumed(&self) -> u64 {
        let (wrap_end, skipped) = self.last_wrap;
        let outstanding = self.head() - self.tail;
        if self.tail <= wrap_end {
            outstanding.saturating_sub(skipped)
        } else {
            outstanding
        }
    }

    /// Asks the receiver for an explicit tail update beyond the tail we know; once per
    /// known tail, since the answer necessarily moves it. A full ring is also the
    /// traffic asking for a bigger one: the first stall in each ring that holds at
    /// least half the ring unconsumed asks for it (the receiver offers one unless its
    /// ring is at the configured size already). A stall with less is a tail that
    /// lags a packet or two just after an early wrap (a lap is a few packets long):
    /// a 16 KiB two-way exchange stalled so once in every ring, and the rings grew
    /// to 4 MiB, milliseconds of page faults inside the exchange, while a bigger ring
    /// would only have made the next stall wait for the same tail.
    fn request_credit(&mut self) -> io::Result<()> {
        // Growth first: the receiver looks at the growth words when it sees the
        // credit request (Receiver::maintain), and the two writes land in order.
        if !self.growth_asked && self.unconsumed() >= self.ring_size / 2 {
            self.link
                .post_ctrl(CtrlWord::RingWanted, self.offers_taken + 1)?;
            self.growth_asked = true;
        }
        if self.credit_requested_at != self.tail {
            self.link
                .post_ctrl(CtrlWord::CreditRequest, self.tail + 1)?;
            self.credit_requested_at = self.tail;
        }
        Ok(())
    }

    /// True when the receiver has offered a ring we have not taken.
    #[inline(always)]
    fn offer_pending(&self) -> bool {
        self.link.ctrl.ring_offer_number() != self.offers_taken
    }

    /// Takes the receiver's ring offer: writes a [`PacketKind::Switch`] packet as the
    /// last packet of the current ring, then writes on at the next offer-sized
    /// boundary of the position space, at offset 0 of the new ring, where the
    /// receiver meets the packets after the switch. Returns false when the current
    /// ring has no cell free for the switch packet (credit asked for): the offer
    /// waits, and so does everything else.
    ///
    /// # Errors
    ///
    /// `InvalidData` for an offer no correct receiver makes (a number out of turn, a
    /// size that is no power of two or smaller than its first ring, a misaligned
    /// address); a fabric failure.
    fn take_offer(&mut self) -> io::Result<bool> {
        let offer = self.link.ctrl.ring_offer();
        if offer.number != self.offers_taken + 1
            || !offer.len.is_power_of_two()
            || offer.len < self.min_ring
            || offer.len > 1 << 40
            || offer.addr % CELL as u64 != 0
        {
            return Err(self.link.fail(
                io::ErrorKind::InvalidData,
                format!("protocol error: bad ring offer {offer:?}"),
            ));
        }
        if max_payload_now(self.ring_size, self.head(), self.tail, self.chunk) < 8 {
            self.refresh_tail()?;
            if max_payload_now(self.ring_size, self.head(), self.tail, self.chunk) < 8 {
                self.request_credit()?;
                return Ok(false);
            }
        }
        // The new ring's staging copy first. If it cannot be had (the memory limit),
        // the offer is declined: the receiver frees that ring, and this one goes on,
        // asking for no other.
        let staging = match staging_for(
            &self.link.fabric,
            &self.link.cfg,
            self.inline_limit,
            offer.len,
        ) {
            Ok(s) => s,
            Err(_) => {
                self.link.post_ctrl(CtrlWord::RingDeclined, offer.number)?;
                self.offers_taken = offer.number;
                self.growth_asked = true;
                return Ok(false);
            }
        };
        let number = offer.number.to_le_bytes();
        self.write_gathered(&[IoSlice::new(&number)], 0, 8, PacketKind::Switch)?;
        self.retire_staging();
        if let Some(old) = std::mem::replace(&mut self.staging, staging) {
            // Requests numbered from here on no longer read it.
            self.retired_staging.push((self.link.sq.next_number(), old));
        }
        self.peer_ring = RemoteRegion {
            addr: offer.addr,
            len: offer.len,
            rkey: offer.rkey,
        };
        if self.growth_asked {
            // We filled the last ring, so the receiver made this one resident
            // (Receiver::serve_growth): ready our end for writing through it too.
            self.link.prepare_remote(self.peer_ring);
        }
        self.ring_size = offer.len;
        self.chunk = self.link.cfg.chunk_for(offer.len);
        self.working_set = self.link.cfg.working_set_for(offer.len);
        self.lane.set_head(self.head().next_multiple_of(offer.len));
        // Nothing before the new ring's first position is in it.
        self.tail = self.head();
        self.credit_requested_at = u64::MAX;
        self.offers_taken = offer.number;
        self.growth_asked = false;
        Ok(true)
    }

    /// Frees the staging copies of rings left behind whose last writes completed.
    fn retire_staging(&mut self) {
        let sq = &self.link.sq;
        self.retired_staging
            .retain(|(next, _)| *next > 0 && !sq.is_completed(*next - 1));
    }

    /// Bytes of registered memory this half holds: the staging copies of the peer's
    /// ring (where the fabric's inline limit calls for one), current and left behind.
    pub fn registered_bytes(&self) -> u64 {
        let mut n = self.staging.as_ref().map_or(0, |s| s.size() as u64);
        for (_, s) in &self.retired_staging {
            n += s.size() as u64;
        }
        n
    }

    /// The size of the peer ring this sender writes into now.
    pub fn ring_size(&self) -> u64 {
        self.ring_size
    }

    /// True when a `put` of one byte would make progress now (ring not full).
    pub fn can_put(&mut self) -> io::Result<bool> {
        if self.offer_pending() && !self.closed && !self.held {
            self.take_offer()?;
        }
        if self.relay.blocked {
            // The last put stopped at relay slots all in flight: writable once the
            // peer confirmed one.
            self.link.serve_lend()?;
            self.release_confirmed(self.link.ctrl.zero_copy_done(), false);
            if self.relay.blocked && !self.relay.has_room() {
                self.link.check_peer_reading()?;
                return Ok(false);
            }
            self.relay.blocked = false;
        }
        if max_payload_now(self.ring_size, self.head(), self.tail, self.chunk) > 0 {
            return Ok(true);
        }
        self.refresh_tail()?;
        let ok = max_payload_now(self.ring_size, self.head(), self.tail, self.chunk) > 0;
        if !ok {
            self.request_credit()?;
        }
        Ok(ok)
    }

    /// Asks the peer's receiver to wake the thread sleeping on eventfd `fd` (its
    /// `instance`) of this process, adding bit `hint`, when it answers our credit
    /// request (a selector waiting for room, `crate::select`); makes sure a request
    /// is out while the ring is full. Look once more afterwards, after the
    /// selector's membarrier. The peer keeps waking that eventfd when it answers a
    /// later request, until another is named; each answer is to a stall, which costs
    /// a round trip already. Returns false, asking nothing, where the fabric has no
    /// such wake.
    ///
    /// # Errors
    ///
    /// A fabric failure while sending the request.
    pub(crate) fn ask_for_room_wake(
        &mut self,
        fd: u32,
        instance: u32,
        hint: u32,
    ) -> io::Result<bool> {
        let link = Arc::clone(&self.link);
        if !link.name_wake(
            CtrlWord::RoomWakeFd,
            &mut self.room_wake_named,
            fd,
            instance,
            hint,
        )? {
            return Ok(false);
        }
        // A full ring has its request out (can_put made it); this only repeats it
        // where the tail moved since.
        if max_payload_now(self.ring_size, self.head(), self.tail, self.chunk) == 0 {
            self.request_credit()?;
        }
        Ok(true)
    }

    /// Arms the fabric's own wake for room in the peer's ring and returns the
    /// descriptor it makes readable (see `Link::arm_wake_fd`): the peer's answer to
    /// our credit request is a write of its, which fires it; makes sure a request
    /// is out while the ring is full (armed first, so that the answer cannot come
    /// before the arm). `None`, asking nothing, where the fabric has no such
    /// descriptor.
    ///
    /// # Errors
    ///
    /// A fabric failure while sending the request.
    pub(crate) fn arm_room_wake_fd(&mut self) -> io::Result<Option<std::os::fd::RawFd>> {
        let Some(fd) = self.link.arm_wake_fd() else {
            return Ok(None);
        };
        if max_payload_now(self.ring_size, self.head(), self.tail, self.chunk) == 0 {
            self.request_credit()?;
        }
        Ok(Some(fd))
    }

    /// Ends the stream: the peer's `get` reports end of stream after the data sent
    /// so far. Later `put`s fail. Dropping the sender closes it too.
    ///
    /// # Errors
    ///
    /// A fabric failure while sending the notice.
    pub fn close(&mut self) -> io::Result<()> {
        self.close_with(0)
    }

    /// [`close`](Self::close), with `flags` ([`EOS_ABORTED`]) in the end-of-stream
    /// word.
    fn close_with(&mut self, flags: u64) -> io::Result<()> {
        // Closed before with a transfer unconfirmed, now revoking it: the end of
        // stream goes again, with the flag (the same head).
        if self.closed && flags == 0 {
            return Ok(());
        }
        self.closed = true;
        self.lane.close();
        if self.link.error().is_some() {
            return Ok(());
        }
        self.link
            .post_ctrl(CtrlWord::EndOfStream, (self.head() + 1) | flags)?;
        self.ring_if_asked();
        Ok(())
    }

    /// Bytes written into the ring so far, padding and headers included.
    pub fn position(&self) -> u64 {
        self.head()
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
        if let Some(id) = self.held_id() {
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
        self.wait_writable_until(None)
    }

    /// As [`wait_writable`](Self::wait_writable), giving up at `deadline`.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put); `TimedOut` when the deadline passes with no room.
    pub fn wait_writable_until(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        let mut b = Backoff::with_policy(self.link.wait);
        loop {
            self.link.check_peer_reading()?;
            self.link.serve_credit()?;
            if self.can_put()? {
                return Ok(());
            }
            past(deadline, "write")?;
            self.link.snooze(&mut b);
        }
    }
}

/// How a put treats buffers that may go zero-copy.
#[derive(Clone, Copy)]
pub(crate) enum ZeroCopy {
    /// Copied into the ring, whatever their size (`put`).
    Never,
    /// Announced, and the call returns: later calls offer them again until one
    /// counts them (`put_nocopy`).
    Hold(Lent),
    /// Announced and counted at once; the caller learns when they are released
    /// (`put_lending`).
    Lend(Lent),
}

/// Most zero-copy transfers a sender keeps announced and unreleased: a window of
/// nonblocking sends (OSU's osu_bw has 64) is read back to back by the peer.
pub(crate) const MAX_TRANSFERS_IN_FLIGHT: usize = 64;

/// Outcome of an attempt to announce a zero-copy transfer.
pub(crate) enum Announce {
    /// Announced: the first `slices` buffers, `bytes` in all, are in flight.
    Sent { slices: usize, bytes: usize },
    /// The ring has no room for the announcement now.
    NoRoom,
    /// The buffer could not be registered: send it through the ring instead.
    Refused,
}

impl<F: Fabric> Drop for Sender<F> {
    fn drop(&mut self) {
        // Relayed bytes were counted as sent: give the peer time to read them.
        self.linger_for_relays();
        // Transfers still unreleased are revoked: the peer must not wait for a lend
        // of one to be pushed (a sender that only closed keeps serving them).
        let flags = if self.abort_pending() { EOS_ABORTED } else { 0 };
        // The relay slots are freed with the sender; rails in domains of their own
        // registered them as caller memory: forget those registrations first.
        for r in 1..=self.link.rails().len() {
            if let Some(d) = self.link.rail_domain(r) {
                for (addr, len) in self.relay.ranges() {
                    d.rcache.invalidate(addr, len);
                }
            }
        }
        let _ = self.close_with(flags);
        // The end of stream and the last packets may not have been sent yet: their
        // staging copies go to the link, which frees them after its queue pair (a
        // region freed under a posted request fails the queue pair, and the peer
        // would lose the bytes it had not read yet).
        self.retire_staging();
        let mut left = self
            .link
            .left_staging
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        left.extend(self.staging.take());
        left.extend(self.retired_staging.drain(..).map(|(_, s)| s));
        // The lane's pointers are into this connection's memory.
        self.lane.close();
    }
}

/// Copies `dst.len()` bytes of `iov`, from byte `skip` on, into `dst`, a piece at a
/// time through [`copy_short`].
#[inline(always)]
pub(crate) fn gather_into(dst: &mut [u8], iov: &[IoSlice<'_>], skip: usize) {
    let (mut i, mut o, mut at) = (0usize, skip, 0);
    while at < dst.len() {
        let n = (iov[i].len() - o).min(dst.len() - at);
        copy_short(&mut dst[at..at + n], &iov[i][o..o + n]);
        at += n;
        i += 1;
        o = 0;
    }
}

/// Copies `src` into `dst` (of the same length): 1 to 16 bytes as at most two
/// fixed-size copies that may overlap (or three single bytes), which compile to a
/// few moves, where a `memcpy` call of run-time length costs a small message more
/// than its bytes (a call through the PLT: under a TCG guest, ~12 ns per call and
/// return, bench/notebook/2026-11.md, Soft-RoCE, "Where the rest of the latency goes").
#[inline(always)]
pub(super) fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    if dst.len() != n {
        // Unequal lengths: copy_from_slice's panic says so.
        dst.copy_from_slice(src);
        return;
    }
    match n {
        8..=16 => copy_two_overlapping::<8>(dst, src),
        4..=7 => copy_two_overlapping::<4>(dst, src),
        // First, middle and last byte: for 1 to 3 bytes together they are all.
        1..=3 => {
            dst[0] = src[0];
            dst[n / 2] = src[n / 2];
            dst[n - 1] = src[n - 1];
        }
        _ => dst.copy_from_slice(src),
    }
}

/// Copies `src` into `dst` (both `W` to `2 * W` bytes long, the same) as two
/// `W`-byte moves that may overlap.
#[inline(always)]
fn copy_two_overlapping<const W: usize>(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    let head: [u8; W] = src[..W].try_into().expect("W bytes");
    let tail: [u8; W] = src[n - W..].try_into().expect("W bytes");
    dst[..W].copy_from_slice(&head);
    dst[n - W..].copy_from_slice(&tail);
}

/// The cursor `(slice, offset)` in `iov` moved `n` bytes forward.
#[inline]
fn advance(iov: &[IoSlice<'_>], mut idx: usize, mut off: usize, n: usize) -> (usize, usize) {
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
    (idx, off)
}

#[cfg(test)]
mod tests {
    use super::copy_short;

    #[test]
    fn copy_short_copies_every_length_exactly() {
        let src: Vec<u8> = (1..=40).collect();
        for n in 0..=40 {
            let mut dst = [0xffu8; 42];
            copy_short(&mut dst[1..1 + n], &src[..n]);
            assert_eq!(&dst[1..1 + n], &src[..n], "{n} bytes");
            assert!(
                dst[0] == 0xff && dst[1 + n..].iter().all(|&b| b == 0xff),
                "{n} bytes"
            );
        }
    }
}
