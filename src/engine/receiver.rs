//! The receiving direction: packets out of the ring in local memory, the delayed
//! tail update and credit service, and the receiver's side of zero-copy transfers
//! (the RDMA READs themselves are started in [`zerocopy`](super::zerocopy)).

use std::io::{self, IoSliceMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::link::{lock_incoming, Link, HEALTH_EVERY};
use super::sender::copy_short;
use super::stripe::Striper;
use super::wait::{past, Backoff};
use super::zerocopy::{serve_all_lends, Lent, PathMeter, MEASURE_MIN};
use crate::config::MAX_RAILS;
use crate::fabric::{Access, Fabric, MemoryRegion};
use crate::rcache::RegHandle;
use crate::ring::memory::{CtrlWord, RingMemory, RingOffer, CTRL_SIZE, RING_OFFER_SLOT};
use crate::ring::wire::{
    fits_short, is_ack_word, trailer_offset, trailer_word, Header, PacketKind, Rendezvous, RndvSeg,
    ShortHeader, CELL, HEADER_LEN, MAX_RNDV_LEN, MAX_RNDV_SEGS, RNDV_BY_ADVICE, SMALL_RNDV,
};
use crate::ring::{packet_cells, PAYLOAD_OFFSET};

/// Largest single RDMA READ of the zero-copy path: big enough to amortise a request,
/// small enough that several are in flight for a pipelined transfer.
pub(crate) const READ_PIECE: usize = 1 << 20;
/// Most zero-copy reads one receiver keeps in flight.
const MAX_READS_IN_FLIGHT: usize = 16;
/// Packets that alone reach the tail update threshold, in one ring, after which the
/// receiver offers a bigger ring (see `Receiver::count_big_packet`).
const GROW_AFTER_BIG_PACKETS: u32 = 16;

/// Every this many empty polls in a row, one does the full upkeep
/// ([`Receiver::quiet_poll`] cuts the others short).
const QUIET_POLLS: u32 = 8;

/// Words in a [`QuietWatch`].
pub(crate) const QUIET_WATCH_WORDS: usize = 5;

/// What a quiet receiver's caller may watch instead of polling
/// ([`Receiver::quiet_watch`]; the C interface's `rch_watch`): words of the ring and
/// of the control block, each with the value it holds while the receiver has
/// nothing to do, and how many tests may pass before a poll is due (the polls the
/// receiver itself cuts short, [`QUIET_POLLS`] less one).
pub(crate) struct QuietWatch<'a> {
    /// The ring's two head words at the read position first (the C interface's
    /// `rch_lane` relies on that order), then the control words.
    pub(crate) words: [(&'a AtomicU64, u64); QUIET_WATCH_WORDS],
    pub(crate) tests: u32,
    /// The read position (where the next packet starts) and the bytes from it to the
    /// ring's end, for a caller that reads the packet landing there itself
    /// (`rch_lane_packet`), then [`Receiver::consume_landed`].
    pub(crate) pos: u64,
    pub(crate) room: u64,
    /// Cells of the packet at `pos` that a peek lent whole ([`Receiver::lane_after_lend`]);
    /// 0 for a quiet watch.
    pub(crate) lent_cells: usize,
}

/// A packet that landed whole at the read position.
struct Landed {
    /// Its header and ack words (for a short packet, those a full one would carry).
    header: [u8; HEADER_LEN],
    /// Cells it covers.
    cells: usize,
    /// Offset of its payload from its start.
    payload_at: usize,
    /// A short packet's payload word, as loaded after its header.
    short_payload: Option<u64>,
}

/// The receiving direction of a connection.
pub struct Receiver<F: Fabric> {
    pub(crate) link: Arc<Link<F>>,
    /// The incoming ring (a clone of the link's: its address and mask sit here, in
    /// the half that polls it).
    ring: RingMemory<F::Region>,
    /// The rings left at switches since the last read call (`get`, `peek`,
    /// `consume`; not `can_get` or `poll_readable`, which switch too): a
    /// [`QuietWatch`] handed out before a switch may still point into one. Dropped
    /// by [`let_retired_go`](Self::let_retired_go).
    retired_rings: Vec<RingMemory<F::Region>>,
    ring_size: u64,
    threshold: u64,
    /// Start of the packet being read (or of the next one).
    read_pos: u64,
    /// End of the cells given back to the sender (cleared, and stored in
    /// `Link::rx_tail`). The packet read last stays held until the next `get` or
    /// packet: see [`release_read`](Self::release_read).
    released_pos: u64,
    /// Ring offset of the next unread payload byte of the current packet.
    cur_off: usize,
    /// Unread payload bytes of the current packet.
    cur_left: usize,
    /// Payload bytes of the current packet (a data packet's length).
    cur_len: usize,
    cur_cells: usize,
    in_packet: bool,
    empty_polls: u32,
    /// Empty polls in a row cut short by [`quiet_poll`](Self::quiet_poll).
    quiet_polls: u32,
    /// The zero-copy transfer being read, if the stream is at one.
    pub(crate) zc: Option<ZcRecv>,
    /// The segments of `zc` (its `count` first): decoded in place, so that taking
    /// an announcement moves no 16-segment array.
    pub(crate) zc_segs: [RndvSeg; MAX_RNDV_SEGS],
    /// Per segment of `zc`, the keys of rails 1 to `zc_keys` (the sender's rails in
    /// protection domains of their own; 0: every rail reads with the segment's).
    pub(crate) zc_rail_keys: [[u32; MAX_RAILS]; MAX_RNDV_SEGS],
    pub(crate) zc_keys: usize,
    /// Number the next announcement must carry.
    zc_expected_id: u64,
    /// Most RDMA READs in flight (the fabric's `max_rd_atomic`, capped).
    pub(crate) max_reads: usize,
    /// Reads left in flight by [`get_nowait`](Receiver::get_nowait).
    pub(crate) reads: Option<ReadsInFlight<F::Region>>,
    /// Number of the last lend sent to the peer.
    pub(crate) lends_sent: u64,
    /// Requests to ring our doorbell sent to the peer ([`ask_for_bell`](Self::ask_for_bell)).
    bells_asked: u64,
    /// The `CtrlWord::WakeFd` word last sent to the peer (0: none).
    wake_named: u64,
    /// Polls of an unlanded lend since the last health check.
    lend_polls: u32,
    /// Pauses of the stream backoff (`Config::with_stream_backoff`).
    backoff_pauses: u32,
    /// Two or more gets found data since this end last sent, the last of them
    /// after the last empty poll: the next empty poll backs off.
    backoff_armed: bool,
    /// An armed empty poll happened: the next get pauses first, unless this end
    /// sent in between (see [`stream_backoff`](Self::stream_backoff)).
    backoff_due: bool,
    /// The piggybacked tail (`Link::rx_piggy`) when data last arrived, and how many
    /// gets in a row found data with it unchanged (that is, without a send between).
    backoff_piggy: u64,
    /// The sender's noted head (`Link::tx_lane_head`) when data last arrived.
    backoff_sent: u64,
    /// The note (`Link::tx_lane_notes`) under which data last arrived.
    backoff_note: u64,
    backoff_streak: u32,
    /// Stream backoffs taken so far.
    backoffs: u64,
    /// A `get` returned data without the upkeep that follows it (tail update,
    /// credit): the next call does it (see [`get_first_packet`](Self::get_first_packet)).
    upkeep_owed: bool,
    /// The ring size this end starts with and shrinks back to, and the most it grows to.
    initial_ring: u64,
    max_ring: u64,
    /// Ring offers made so far (the number of the last one).
    offers_made: u64,
    /// The ring offered and not yet switched to has this size.
    offered_len: Option<u64>,
    /// A request for a bigger ring that could not be served (no memory): not tried
    /// again.
    wanted_declined: u64,
    /// The sum of the peer sender's two growth words (`RingWanted`, `RingDeclined`,
    /// both only ever rising) when [`serve_growth`](Self::serve_growth) last looked:
    /// the upkeep of every call compares one sum instead of weighing a request.
    growth_seen: u64,
    /// The read position at the last idle check of a grown ring, and when it was
    /// seen to move (see [`shrink_if_idle`](Self::shrink_if_idle)).
    idle_mark: (u64, Option<Instant>),
    /// Packets released in this ring that alone reached the tail update threshold
    /// (see [`count_big_packet`](Self::count_big_packet)).
    big_packets: u32,
    /// The packets asked for a bigger ring ([`count_big_packet`](Self::count_big_packet)).
    grow_for_packets: bool,
    /// A ring offered was refused (no memory here, or the sender declined it): this
    /// end offers no bigger one unasked.
    growth_refused: bool,
    /// Times large copies on the ring and zero-copy paths and advises the sender
    /// which costs less, where the link lets it choose (`Link::zc_adaptive_min`).
    meter: Option<PathMeter>,
    /// The rails' weights, where the connection has more than one rail: zero-copy
    /// steps of at least `Config::stripe_min` bytes are read in stripes across them.
    pub(crate) striper: Option<Striper>,
    /// Bytes RDMA-read over each rail so far (rail 0 first).
    pub(crate) rail_read: [u64; MAX_RAILS],
}

/// What [`Receiver::peek`] found at the head of the stream.
#[derive(Debug)]
pub enum Peeked<'a> {
    /// Bytes in the ring, lent in place (never empty).
    Bytes(&'a [u8]),
    /// Nothing has arrived yet.
    Nothing,
    /// A zero-copy transfer with `left` bytes still to read is next: only
    /// [`Receiver::get`] reads it, into the caller's buffer.
    ZeroCopy {
        /// Bytes of the transfer not read yet.
        left: u64,
    },
}

/// One step of a zero-copy transfer into a caller's buffer, not yet seen complete:
/// RDMA READs of its first part, and the rest lent to the peer to push.
pub(crate) struct ReadsInFlight<R> {
    /// Where they land (the caller's buffer), for matching the retry.
    pub(crate) dst: usize,
    pub(crate) len: usize,
    /// Sequence number of the last read (completions arrive in order), if any.
    pub(crate) last: Option<u64>,
    pub(crate) handle: Option<RegHandle>,
    /// The part lent to the peer, if any.
    pub(crate) lent: Option<LentPart<R>>,
    /// When the step started, if the path meter times it.
    pub(crate) started: Option<Instant>,
    /// Per rail, where the step is read in stripes across the connection's rails
    /// (rail 0's reads are also `last`). Boxed: a step moves between calls several
    /// times, and only steps striped across rails (large ones) carry this.
    pub(crate) stripes: Option<Box<[Stripe; MAX_RAILS]>>,
}

/// Releases the stripes' registrations in their rails' own domains.
pub(crate) fn release_stripe_regs<F: Fabric>(link: &Link<F>, stripes: &mut [Stripe; MAX_RAILS]) {
    for (rail, s) in stripes.iter_mut().enumerate() {
        if let Some(h) = s.reg.take() {
            link.rail_domain(rail)
                .expect("a stripe registered in its rail's domain")
                .rcache
                .release(h);
        }
    }
}

/// One rail's stripe of a step: its bytes, the number of its last read on that
/// rail, when its first read was posted and when its completion was seen (the
/// measurement adaptive striping learns from).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Stripe {
    pub(crate) bytes: usize,
    pub(crate) last: Option<u64>,
    pub(crate) posted: Option<Instant>,
    pub(crate) seen: Option<Instant>,
    /// The registration of the stripe's part of the caller's buffer in the rail's
    /// own protection domain, where it has one (released when the step is done).
    pub(crate) reg: Option<RegHandle>,
}

impl Stripe {
    /// True once its reads completed (or it has none), noting when that was first
    /// seen.
    fn check<F: Fabric>(&mut self, link: &Link<F>, rail: usize) -> bool {
        if self.seen.is_some() {
            return true;
        }
        match self.last {
            Some(seq) if !link.rail_completed(rail, seq) => false,
            _ => {
                self.seen = Some(Instant::now());
                true
            }
        }
    }
}

/// The part of a caller's buffer the peer pushes into: registered for it alone, so
/// dropping this (once it landed, or on failure) revokes the peer's access.
pub(crate) struct LentPart<R> {
    pub(crate) number: u64,
    pub(crate) _region: R,
}

/// An announced transfer the receiver is reading (its segments, and how far it got).
pub(crate) struct ZcRecv {
    pub(crate) id: u64,
    pub(crate) total: u64,
    pub(crate) done: u64,
    /// Segment (of [`Receiver::zc_segs`]) and offset in it of the next byte to read.
    pub(crate) seg: usize,
    pub(crate) seg_off: u64,
    /// The sender chose zero-copy on this end's advice ([`RNDV_BY_ADVICE`]).
    pub(crate) by_advice: bool,
}

impl<F: Fabric> Receiver<F> {
    pub(super) fn new(
        link: Arc<Link<F>>,
        ring: RingMemory<F::Region>,
        max_rd_atomic: usize,
    ) -> Receiver<F> {
        Receiver {
            ring_size: ring.size(),
            threshold: link.cfg.tail_threshold_for(ring.size()),
            initial_ring: ring.size(),
            max_ring: (link.cfg.ring_size() as u64).max(ring.size()),
            offers_made: 0,
            offered_len: None,
            wanted_declined: 0,
            growth_seen: 0,
            idle_mark: (0, None),
            big_packets: 0,
            grow_for_packets: false,
            growth_refused: false,
            meter: (link.zc_adaptive_min != usize::MAX).then(PathMeter::default),
            striper: (!link.rails().is_empty())
                .then(|| Striper::new(link.cfg.stripe_policy(), 1 + link.rails().len())),
            rail_read: [0; MAX_RAILS],
            ring,
            retired_rings: Vec::new(),
            backoff_pauses: link.cfg.stream_backoff(),
            link,
            read_pos: 0,
            released_pos: 0,
            cur_off: 0,
            cur_left: 0,
            cur_len: 0,
            cur_cells: 0,
            in_packet: false,
            empty_polls: 0,
            quiet_polls: 0,
            zc: None,
            zc_segs: [RndvSeg::default(); MAX_RNDV_SEGS],
            zc_rail_keys: [[0; MAX_RAILS]; MAX_RNDV_SEGS],
            zc_keys: 0,
            zc_expected_id: 1,
            max_reads: max_rd_atomic.clamp(1, MAX_READS_IN_FLIGHT),
            reads: None,
            lends_sent: 0,
            bells_asked: 0,
            wake_named: 0,
            lend_polls: 0,
            backoff_armed: false,
            backoff_due: false,
            backoff_piggy: u64::MAX,
            backoff_sent: u64::MAX,
            backoff_note: 0,
            backoff_streak: 0,
            backoffs: 0,
            upkeep_owed: false,
        }
    }

    #[inline]
    fn load_word(&self, pos: u64, order: Ordering) -> u64 {
        self.ring.load_word(pos, order)
    }

    /// The packet at `read_pos` once it has landed whole (either form, ring::wire
    /// docs); `None` while nothing, or only part of it, is there.
    ///
    /// # Errors
    ///
    /// A header whose length runs past the ring's end, or a short header whose
    /// length is out of range (the connection fails).
    #[inline(always)]
    fn landed_packet(&self) -> io::Result<Option<Landed>> {
        // A short packet's header is the last word of its write: once it is visible
        // (head_words loads it with Acquire), so is the payload word before it (the
        // fabric's guarantee 2). A full header is not trusted alone: the trailer's
        // Acquire below is what orders its packet's bytes.
        let [mut first, mut second] = self.ring.head_words(self.read_pos);
        if first | second == 0 {
            // Nothing has landed: the common empty poll. (Both words were zeroed when
            // this cell was last freed, and every packet writes a non-zero second
            // word: a short header or a marked ack.)
            return Ok(None);
        }
        loop {
            // A full header counts only once its ack word is there too: until then it
            // may be the payload of a short packet whose header has not landed. A
            // second word that is no ack is a short header, or nothing yet.
            if !is_ack_word(second) {
                return match ShortHeader::parse(second, self.read_pos) {
                    Some(short) => self.landed_short(short, first).map(Some),
                    None => Ok(None),
                };
            }
            let mut hbytes = [0u8; HEADER_LEN];
            hbytes[..8].copy_from_slice(&first.to_le_bytes());
            if !Header::new_unchecked(&hbytes[..]).is_at(self.read_pos) {
                return Ok(None);
            }
            hbytes[8..].copy_from_slice(&second.to_le_bytes());
            let len = Header::new_unchecked(&hbytes[..]).len() as usize;
            let Some(cells) = packet_cells(self.ring_size, self.read_pos, len) else {
                return Err(self.link.fail(
                    io::ErrorKind::InvalidData,
                    format!(
                        "protocol error: packet of {len} bytes at {} overruns the ring",
                        self.read_pos
                    ),
                ));
            };
            let end = self.read_pos + (cells * CELL) as u64;
            let trailer_at = self.read_pos + trailer_offset(len) as u64;
            // Acquire pairs with the fabric's Release store of the last word of the
            // write: once the trailer is visible, so is every byte before it.
            if self.load_word(trailer_at, Ordering::Acquire) != trailer_word(end) {
                return Ok(None);
            }
            // Re-read the header now that the whole packet is visible; a first read that
            // raced with the write (and so pointed us at a wrong trailer) shows up here.
            let word = self.load_word(self.read_pos, Ordering::Relaxed);
            if word != first {
                [first, second] = self.ring.head_words(self.read_pos);
                continue;
            }
            return Ok(Some(Landed {
                header: hbytes,
                cells,
                payload_at: PAYLOAD_OFFSET,
                short_payload: None,
            }));
        }
    }

    /// The short packet at `read_pos` whose header `short` was seen, after it its
    /// payload word `payload`, as a [`Landed`] with the header a full packet would
    /// carry.
    #[inline(always)]
    fn landed_short(&self, short: ShortHeader, payload: u64) -> io::Result<Landed> {
        let len = short.len();
        if !fits_short(len) {
            return Err(self.link.fail(
                io::ErrorKind::InvalidData,
                format!("protocol error: short packet of {len} bytes"),
            ));
        }
        // Relaxed: only this half stores tx_tail_piggy (take_ack), and the short ack
        // counts from the last one it took, as the sender's does (wire docs).
        let ack = short.ack(self.link.tx_tail_piggy.load(Ordering::Relaxed));
        let mut header = [0u8; HEADER_LEN];
        Header::new_unchecked(&mut header[..]).fill(
            self.read_pos,
            PacketKind::Data,
            len as u32,
            ack,
        );
        Ok(Landed {
            header,
            cells: 1,
            payload_at: 0,
            short_payload: Some(payload),
        })
    }

    /// Looks for a complete packet at `read_pos`; true when one is ready to read.
    fn next_packet(&mut self) -> io::Result<bool> {
        loop {
            let Some(landed) = self.landed_packet()? else {
                return Ok(false);
            };
            let header = Header::new_unchecked(&landed.header[..]);
            let len = header.len() as usize;
            let kind = header.kind().map_err(|e| {
                self.link
                    .fail(io::ErrorKind::InvalidData, format!("protocol error: {e}"))
            })?;
            self.take_ack(header.ack())?;
            self.cur_cells = landed.cells;
            match kind {
                PacketKind::Data => {
                    self.cur_off =
                        (self.read_pos & (self.ring_size - 1)) as usize + landed.payload_at;
                    self.cur_left = len;
                    self.cur_len = len;
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
                PacketKind::Wrap => {
                    if len != 0 {
                        return Err(self.link.fail(
                            io::ErrorKind::InvalidData,
                            format!("protocol error: wrap packet with {len} payload bytes"),
                        ));
                    }
                    self.finish_packet();
                    self.release_read();
                    // The rest of the lap holds no packet: its boundary words were
                    // zeroed when it was last consumed and the sender wrote none since.
                    self.read_pos = self.read_pos.next_multiple_of(self.ring_size);
                    self.released_pos = self.read_pos;
                    // Release: as in release_read (nothing more was read since).
                    self.link.rx_tail.store(self.read_pos, Ordering::Release);
                }
                PacketKind::Switch => {
                    self.switch_ring(len)?;
                }
                PacketKind::Rendezvous => {
                    self.take_rendezvous(len)?;
                    // The announcement is copied out: its cells can be reused at once.
                    self.finish_packet();
                    return Ok(true);
                }
            }
        }
    }

    /// The switch packet at the read position, with `len` payload bytes, is the last
    /// of this ring: goes on in the ring offered last, at the next boundary of its
    /// size in the position space (where the sender went on, `Sender::take_offer`),
    /// and frees this one. The sender wrote nothing after the switch packet into this
    /// ring, and its writes are placed in order (fabric guarantee 1), so nothing
    /// more can land in it.
    #[cold]
    #[inline(never)]
    fn switch_ring(&mut self, len: usize) -> io::Result<()> {
        let mut number = [0u8; 8];
        if len == number.len() {
            self.ring
                .copy_out(self.read_pos + PAYLOAD_OFFSET as u64, &mut number);
        }
        let number = u64::from_le_bytes(number);
        if len != 8 || self.offered_len.is_none() || number != self.offers_made {
            return Err(self.link.fail(
                io::ErrorKind::InvalidData,
                format!(
                    "protocol error: switch to ring offer {number} ({len} bytes) where {} is \
                     outstanding",
                    if self.offered_len.is_some() {
                        self.offers_made
                    } else {
                        0
                    }
                ),
            ));
        }
        self.finish_packet();
        self.release_read();
        let new = {
            let mut rings = lock_incoming(&self.link);
            let new = rings.offered.take().expect("an offer is outstanding");
            // The old ring is freed once our own clone goes (at the next read call:
            // see `retired_rings`).
            rings.current = new.clone();
            new
        };
        let old = std::mem::replace(&mut self.ring, new);
        self.retired_rings.push(old);
        self.ring_size = self.ring.size();
        self.threshold = self.link.cfg.tail_threshold_for(self.ring_size);
        self.offered_len = None;
        // A request for the next size may have come while the offer was out (the
        // sender asks once per ring, once it switched): look again.
        self.growth_seen = u64::MAX;
        self.read_pos = self.read_pos.next_multiple_of(self.ring_size);
        self.released_pos = self.read_pos;
        self.idle_mark = (self.read_pos, None);
        self.big_packets = 0;
        self.grow_for_packets = false;
        // Release: as in release_read (nothing more was read since).
        self.link.rx_tail.store(self.read_pos, Ordering::Release);
        Ok(())
    }

    /// Offers the peer's sender a ring of `len` bytes for this direction: allocates
    /// and registers it, then writes the offer slot of the peer's control region
    /// (four words in one write, the number last). Memory refused (the process's
    /// limit, a registration failure) declines quietly: the current ring goes on
    /// serving.
    #[cold]
    #[inline(never)]
    fn offer_ring(&mut self, len: u64, resident: bool) -> io::Result<()> {
        let link = &*self.link;
        let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let ring = match usize::try_from(len)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
            .and_then(|l| link.fabric.alloc_region(l, rights))
            .and_then(RingMemory::new)
        {
            Ok(r) => r,
            Err(_) => {
                self.wanted_declined = link.ctrl.ring_wanted();
                self.growth_refused = true;
                return Ok(());
            }
        };
        if resident {
            ring.region().make_resident();
        }
        let offer = RingOffer {
            addr: ring.region().addr() as u64,
            rkey: ring.region().rkey(),
            len,
            number: self.offers_made + 1,
        };
        lock_incoming(link).offered = Some(ring);
        let mut bytes = [0u8; 32];
        for (chunk, w) in bytes.chunks_exact_mut(8).zip(offer.to_words()) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        link.post_ctrl_bytes(RING_OFFER_SLOT, &bytes)?;
        self.offers_made = offer.number;
        self.offered_len = Some(len);
        Ok(())
    }

    /// True when the peer's sender asked for a bigger ring that this end can give.
    #[inline]
    fn growth_wanted(&self) -> bool {
        let wanted = self.link.ctrl.ring_wanted();
        wanted > self.offers_made
            && wanted != self.wanted_declined
            && self.offered_len.is_none()
            && self.ring_size < self.max_ring
    }

    /// True when the peer's sender wrote a growth word since the last look
    /// ([`serve_growth`](Self::serve_growth)).
    #[inline]
    fn growth_news(&self) -> bool {
        let ctrl = &self.link.ctrl;
        ctrl.ring_wanted().wrapping_add(ctrl.ring_declined()) != self.growth_seen
    }

    /// Serves a request for a bigger ring (the sender's, or this end's packets'):
    /// four times this one, up to the most; and frees an offered ring the sender
    /// declined. Cold and out of line: a few times in a connection's life, and
    /// `maintain`, which runs on every call, stays small enough to be inlined.
    #[cold]
    #[inline(never)]
    fn serve_growth(&mut self) -> io::Result<()> {
        let ctrl = &self.link.ctrl;
        // Noted first: a word written after this look is news for the next call.
        self.growth_seen = ctrl.ring_wanted().wrapping_add(ctrl.ring_declined());
        if self.offered_len.is_some() && self.link.ctrl.ring_declined() == self.offers_made {
            lock_incoming(&self.link).offered = None;
            self.offered_len = None;
            // The sender asks for no other ring until it switches; nor do we offer.
            self.wanted_declined = self.link.ctrl.ring_wanted();
            self.growth_refused = true;
        }
        let len = (self.ring_size * 4).min(self.max_ring);
        let for_packets = std::mem::take(&mut self.grow_for_packets)
            && self.offered_len.is_none()
            && len > self.ring_size
            && !self.growth_refused
            // A threshold set by the user does not grow with the ring: nor then does it.
            && self.link.cfg.tail_threshold_for(len) > self.threshold;
        // A ring the sender filled is made resident at once: traffic that filled the
        // last ring writes through the next within a few laps, and one pass costs
        // less than a fault per page, in the middle of that traffic, on both ends
        // (1 MiB ping-pong on a fresh connection, bench/ab.sh). A ring offered for
        // big packets keeps to laps inside its working set: its pages fault as used.
        let filled = self.growth_wanted();
        if filled || for_packets {
            self.offer_ring(len, filled)?;
        }
        Ok(())
    }

    /// Counts a released packet that alone reached the tail update threshold (a
    /// quarter of the working set); the [`GROW_AFTER_BIG_PACKETS`]th in this ring
    /// has the next [`serve_growth`](Self::serve_growth) offer a ring four times
    /// this one. Each such packet costs the fabric an extra write (an explicit tail
    /// update) unless a reply happens to carry the tail, and request and reply
    /// traffic never fills a ring, so the stall that asks for growth through the
    /// sender ([`RingWanted`](crate::engine::CtrlWord::RingWanted)) never comes.
    /// Growth stops once the packets stay below the threshold; a few messages never
    /// grow a ring.
    #[cold]
    #[inline(never)]
    fn count_big_packet(&mut self) {
        self.big_packets += 1;
        if self.big_packets >= GROW_AFTER_BIG_PACKETS {
            self.big_packets = 0;
            self.grow_for_packets = true;
            // Makes growth_news true for the next upkeep, as after a switch.
            self.growth_seen = u64::MAX;
        }
    }

    /// At an idle check of a grown ring: offers the peer's sender a ring of the
    /// initial size once this one carried nothing for the configured idle time
    /// (`Config::with_ring_idle`). The sender takes the offer at its next `put`.
    #[cold]
    #[inline(never)]
    fn shrink_if_idle(&mut self) -> io::Result<()> {
        if self.ring_size <= self.initial_ring || self.offered_len.is_some() {
            return Ok(());
        }
        let now = Instant::now();
        match self.idle_mark {
            (pos, Some(since)) if pos == self.read_pos => {
                if now.duration_since(since) >= self.link.cfg.ring_idle() {
                    self.offer_ring(self.initial_ring, false)?;
                }
            }
            _ => self.idle_mark = (self.read_pos, Some(now)),
        }
        Ok(())
    }

    /// Bytes of registered memory this half holds for the peer to write: the
    /// incoming ring, a ring offered and not yet switched to, the control words.
    pub fn registered_bytes(&self) -> u64 {
        self.ring_size + self.offered_len.unwrap_or(0) + CTRL_SIZE as u64
    }

    /// The size of this end's incoming ring now.
    pub fn ring_size(&self) -> u64 {
        self.ring_size
    }

    /// Reads the rendezvous announcement of `len` bytes at the read position (the
    /// packet is fully visible) and makes it the transfer being read.
    fn take_rendezvous(&mut self, len: usize) -> io::Result<()> {
        if len > MAX_RNDV_LEN {
            return Err(self.link.fail(
                io::ErrorKind::InvalidData,
                format!("protocol error: rendezvous of {len} bytes"),
            ));
        }
        // As the sender's: the common one-segment announcement in a small buffer.
        let mut small = [0u8; SMALL_RNDV];
        let mut large;
        let desc: &mut [u8] = if len <= SMALL_RNDV {
            &mut small[..len]
        } else {
            large = [0u8; MAX_RNDV_LEN];
            &mut large[..len]
        };
        self.ring
            .copy_out(self.read_pos + PAYLOAD_OFFSET as u64, desc);
        let r = Rendezvous::new_checked(&*desc).map_err(|e| {
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
        if r.rail_keys() > self.link.rails().len() {
            return Err(self.link.fail(
                io::ErrorKind::InvalidData,
                format!(
                    "protocol error: rendezvous with keys for {} rails on a connection of {}",
                    r.rail_keys() + 1,
                    self.link.rails().len() + 1
                ),
            ));
        }
        self.zc_keys = r.rail_keys();
        for i in 0..r.count() {
            self.zc_segs[i] = r.seg(i);
            for rail in 1..=self.zc_keys {
                self.zc_rail_keys[i][rail] = r.rail_rkey(i, rail);
            }
        }
        self.zc = Some(ZcRecv {
            id: r.id(),
            total: r.total(),
            done: 0,
            seg: 0,
            seg_off: 0,
            by_advice: r.flags() & RNDV_BY_ADVICE != 0,
        });
        self.zc_expected_id += 1;
        // Relaxed: hints for the sending half (`Link::exchanging`).
        self.link.zc_receiving.store(true, Ordering::Relaxed);
        if self.link.sending_zero_copy() {
            self.link.note_exchange();
        }
        Ok(())
    }

    /// Completes reads started by `start_reads`: waits for them
    /// (`wait`) or only checks. Returns `None` (and keeps them in flight) if they are
    /// not done, else the byte count, after confirming the transfer to the sender if
    /// it is complete.
    pub(crate) fn finish_reads(
        &mut self,
        r: ReadsInFlight<F::Region>,
        wait: bool,
    ) -> io::Result<Option<usize>> {
        let link = self.link.clone();
        let mut r = r;
        if !wait && !self.step_done(&mut r)? {
            self.reads = Some(r);
            return Ok(None);
        }
        // Completions arrive in order on each queue pair, so the last read's covers
        // all of them.
        let mut result = match &mut r.stripes {
            Some(stripes) => self.wait_stripes(stripes),
            None => r.last.map_or(Ok(()), |last| link.wait_completed(last)),
        };
        if let Some(h) = r.handle {
            link.rcache.release(h);
        }
        if let Some(stripes) = &mut r.stripes {
            release_stripe_regs(&link, stripes);
        }
        if let (Ok(()), Some(lent)) = (&result, &r.lent) {
            result = self.wait_landed(lent.number);
        }
        // Drops the lent part's registration: the peer can no longer write there.
        drop(r.lent);
        result?;
        if let (Some(striper), Some(stripes)) = (self.striper.as_mut(), &r.stripes) {
            let mut took = [(0usize, std::time::Duration::ZERO); MAX_RAILS];
            for (t, s) in took.iter_mut().zip(stripes.iter()) {
                if let (Some(p), Some(seen)) = (s.posted, s.seen) {
                    *t = (s.bytes, seen.saturating_duration_since(p));
                }
            }
            striper.feedback(&took);
        }
        let z = self.zc.as_mut().expect("reads belong to a transfer");
        let transfer = z.total as usize;
        z.done += r.len as u64;
        if z.done == z.total {
            let id = z.id;
            self.zc = None;
            // Relaxed: as where it is set.
            link.zc_receiving.store(false, Ordering::Relaxed);
            // First: the peer's sender waits for this to complete its send (a
            // two-way exchange's critical path); the meter's sample can come after.
            link.post_ctrl(CtrlWord::ZeroCopyDone, id)?;
            // Its selector may sleep until then (a relay slot, a held buffer).
            link.wake_room_waiter();
        }
        if let Some(t0) = r.started {
            let put_at = link.own_puts().large_at;
            self.advise_path(|m| m.zero_copy_read(r.len, transfer, t0, put_at))?;
        }
        Ok(Some(r.len))
    }

    /// Feeds the path meter a sample and posts its advice to the peer's sender when
    /// it changed.
    fn advise_path(
        &mut self,
        sample: impl FnOnce(&mut PathMeter) -> Option<u64>,
    ) -> io::Result<()> {
        if let Some(word) = self.meter.as_mut().and_then(sample) {
            self.link.post_ctrl(CtrlWord::PathAdvice, word)?;
        }
        Ok(())
    }

    /// Whether a copy or read step of `len` bytes is timed for the path meter.
    pub(crate) fn times_copy(&self, len: usize) -> bool {
        len >= MEASURE_MIN && self.meter.is_some()
    }

    /// True once every read of `r` completed and its lent part landed; checks the
    /// connection now and then while not.
    fn step_done(&mut self, r: &mut ReadsInFlight<F::Region>) -> io::Result<bool> {
        let link = &*self.link;
        let drained = link.drain_completions();
        // Acquire (in is_completed, lend_landed): the bytes placed are visible once
        // they are counted.
        let read = match &mut r.stripes {
            Some(stripes) => {
                let mut all = true;
                for (rail, s) in stripes.iter_mut().enumerate().take(1 + link.rails().len()) {
                    if rail > 0 && s.seen.is_none() {
                        link.drain_rail(rail)?;
                    }
                    all &= s.check(link, rail);
                }
                all
            }
            None => r.last.is_none_or(|last| link.sq.is_completed(last)),
        };
        let landed = r
            .lent
            .as_ref()
            .is_none_or(|l| link.ctrl.lend_landed() >= l.number);
        if read && landed {
            return Ok(true);
        }
        drained?;
        if let Some(l) = &r.lent {
            self.check_lend(l.number)?;
        }
        Ok(false)
    }

    /// Waits until every stripe's reads completed, noting when each was seen: the
    /// rails are polled in turn, so each time is an upper bound of a few polls.
    ///
    /// # Errors
    ///
    /// The connection's error if a completion failed (after all completed: the
    /// memory they target is handed back only then).
    fn wait_stripes(&mut self, stripes: &mut [Stripe; MAX_RAILS]) -> io::Result<()> {
        let link = &*self.link;
        let mut b = Backoff::new(20_000, 1000, std::time::Duration::from_micros(50));
        let mut failure = None;
        loop {
            let mut all = true;
            for (rail, s) in stripes.iter_mut().enumerate().take(1 + link.rails().len()) {
                if s.seen.is_none() {
                    if let Err(e) = link.drain_rail(rail) {
                        failure.get_or_insert(e);
                    }
                }
                all &= s.check(link, rail);
            }
            if all {
                break;
            }
            b.snooze();
        }
        match failure.or_else(|| link.error()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The weights of the connection's rails in the striping of zero-copy steps
    /// (see [`stripe`](crate::engine::stripe)); `[1.0]` for one rail, and, where
    /// the rails were connected after the channel was made
    /// ([`Channel::connect_rails`](crate::Channel::connect_rails)), until the first
    /// striped step.
    pub fn stripe_weights(&self) -> &[f64] {
        match &self.striper {
            Some(s) => s.weights(),
            None => &[1.0],
        }
    }

    /// Bytes this end has RDMA-read over each of the connection's rails (rail 0
    /// first; one entry per rail), counted as the reads are posted: with several
    /// rails, where a connection's zero-copy bytes went. Bytes the peer pushed into
    /// a lent buffer and bytes of the ring are not in it.
    ///
    /// ```
    /// use std::io::{IoSlice, IoSliceMut};
    /// let (mut a, mut b) = rdma_channel::RdmaStream::pair()?;
    /// let big = a.alloc_mem(256 << 10)?;
    /// // SAFETY: `big` stays untouched until put_nocopy counts it.
    /// unsafe { a.channel().sender().put_nocopy(&[IoSlice::new(&big)]) }?;
    /// let mut out = vec![1u8; 256 << 10];
    /// let mut got = 0;
    /// while got < out.len() {
    ///     got += b.channel().receiver().get(&mut [IoSliceMut::new(&mut out[got..])])?;
    /// }
    /// assert_eq!(b.channel().receiver().rail_read_bytes(), &[256 << 10]);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn rail_read_bytes(&self) -> &[u64] {
        &self.rail_read[..1 + self.link.rails().len()]
    }

    /// Waits for lend `number` to land.
    fn wait_landed(&mut self, number: u64) -> io::Result<()> {
        let mut b = Backoff::with_policy(self.link.wait);
        while self.link.ctrl.lend_landed() < number {
            self.check_lend(number)?;
            self.link.snooze(&mut b);
        }
        Ok(())
    }

    /// One poll of an unlanded lend: serves the waiting lends of every connection of
    /// this process, ours included (both ends may wait on each other's pushes, or one
    /// thread may drive both ends); fails when the connection did, or when the peer's
    /// sender closed, as it then never pushes the rest.
    fn check_lend(&mut self, number: u64) -> io::Result<()> {
        let link = &*self.link;
        serve_all_lends();
        if let Some(e) = link.error() {
            return Err(e);
        }
        // A sender that went away revoked its transfer, after the landed number of
        // every lend it pushed, so that number is final. One that only closed still
        // pushes: wait for it as for an open one.
        if link.ctrl.zero_copy_aborted() && link.ctrl.lend_landed() < number {
            return Err(link.fail(
                io::ErrorKind::ConnectionReset,
                "the peer's sender went away in the middle of a zero-copy transfer".into(),
            ));
        }
        self.lend_polls += 1;
        if self.lend_polls >= HEALTH_EVERY {
            self.lend_polls = 0;
            link.check_health()?;
        }
        Ok(())
    }

    /// Takes the piggybacked tail `ack` of a packet: the sending half's replica of the
    /// peer's tail. Inlined (once per message); the error is built out of line.
    #[inline(always)]
    fn take_ack(&self, ack: u64) -> io::Result<()> {
        let link = &*self.link;
        // Relaxed: only this half stores tx_tail_piggy, so it reads its own value.
        if ack > link.tx_tail_piggy.load(Ordering::Relaxed) {
            if ack % CELL as u64 != 0 {
                return Err(self.bad_ack(ack));
            }
            // Release: the sender half's Acquire load then sees a position the peer
            // finished reading (we observed the ack after the peer's Release trailer).
            link.tx_tail_piggy.store(ack, Ordering::Release);
        }
        Ok(())
    }

    #[cold]
    fn bad_ack(&self, ack: u64) -> io::Error {
        self.link.fail(
            io::ErrorKind::InvalidData,
            format!("protocol error: bad ack {ack}"),
        )
    }

    /// The current packet is read: the next one starts after it. Its cells are given
    /// back later, by [`release_read`](Self::release_read).
    #[inline(always)]
    fn finish_packet(&mut self) {
        self.release_read();
        self.read_pos += (self.cur_cells * CELL) as u64;
        self.in_packet = false;
    }

    /// Gives the cells of the packet read last back to the sender: zeroes the words
    /// where a later header or trailer may stand (ring module docs), then moves the
    /// tail past them.
    ///
    /// Called at the start of every `get` and `peek`, when a packet is finished, and
    /// before a wait serves credit, so a receiver that goes idle has given back all it
    /// read.
    ///
    /// Why not at once, when the packet is read: the zeroing stores take the cache
    /// line back from the sender's core, and on x86 a later store cannot become
    /// visible before them. A reply sent right after a `get` would wait behind that
    /// ownership transfer. Done here, at the start of the next `get` (or when the
    /// next packet is finished), the stores overlap the wait for the next message.
    /// The sender learns of the space one packet later, which costs nothing: it
    /// already learns through piggybacked or threshold-delayed tails.
    #[inline(always)]
    fn release_read(&mut self) {
        if self.released_pos == self.read_pos {
            return;
        }
        // Never more than one packet, which never runs past the ring's end.
        let start = (self.released_pos & (self.ring_size - 1)) as usize;
        let cells = ((self.read_pos - self.released_pos) / CELL as u64) as usize;
        // The sender does not touch these cells until it sees the tail stored below,
        // whose Release orders the clearing stores.
        self.ring.clear_boundaries(start, cells);
        self.released_pos = self.read_pos;
        if (cells * CELL) as u64 >= self.threshold {
            self.count_big_packet();
        }
        // Release: our copies out of the packet happen before anyone who reads this tail
        // (the sender half piggybacking it, or publish_tail) lets the peer reuse it.
        self.link.rx_tail.store(self.read_pos, Ordering::Release);
    }

    /// Gives back every cell read since the last release, as
    /// [`release_read`](Self::release_read) does for one packet, for the several
    /// that a caller passed ([`consume_passed`](Self::consume_passed)), `big` of which
    /// alone reached the tail update threshold: their boundary words are zeroed in
    /// at most two runs (the range may wrap at the ring's end, where packets are cut),
    /// and the tail is stored once.
    fn release_passed(&mut self, big: usize) {
        while self.released_pos < self.read_pos {
            let start = (self.released_pos & (self.ring_size - 1)) as usize;
            let to_end = (self.ring_size as usize - start) / CELL;
            let cells = (((self.read_pos - self.released_pos) / CELL as u64) as usize).min(to_end);
            // As in release_read: the tail's Release store below orders these.
            self.ring.clear_boundaries(start, cells);
            self.released_pos += (cells * CELL) as u64;
        }
        for _ in 0..big {
            self.count_big_packet();
        }
        // Release: as in release_read.
        self.link.rx_tail.store(self.read_pos, Ordering::Release);
    }

    /// Frees the rings left at switches since the last read call: a read call ends
    /// every [`QuietWatch`] handed out before it. Called by the read calls (`get`,
    /// `peek`, `consume`) past their cut-short empty poll.
    #[inline(always)]
    fn let_retired_go(&mut self) {
        if !self.retired_rings.is_empty() {
            self.retired_rings.clear();
        }
    }

    /// Reads up to the total length of `iov` bytes, in order, and returns how many
    /// (0 when nothing has arrived).
    ///
    /// ```
    /// use std::io::{ErrorKind, IoSlice, IoSliceMut};
    /// let (mut a, mut b) = rdma_channel::RdmaStream::pair()?;
    /// let mut two = [0u8; 2];
    /// assert_eq!(b.get(&mut [IoSliceMut::new(&mut two)])?, 0); // nothing yet
    /// a.put(&[IoSlice::new(b"abc")])?;
    /// a.shutdown_write()?;
    /// // A message can be taken in parts; FIFO order holds across calls.
    /// assert_eq!(b.get(&mut [IoSliceMut::new(&mut two)])?, 2);
    /// assert_eq!(&two, b"ab");
    /// assert_eq!(b.get(&mut [IoSliceMut::new(&mut two)])?, 1);
    /// assert_eq!(two[0], b'c');
    /// // Then end of stream.
    /// let e = b.get(&mut [IoSliceMut::new(&mut two)]).unwrap_err();
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
        if let [buf] = iov {
            if let Some(n) = self.get_first_packet(buf, GetMode::Wait)? {
                return Ok(n);
            }
        }
        self.get_inner(iov, GetMode::Wait)
    }

    /// The common message of a ping-pong or request-response: a whole data packet
    /// waiting at the read position, with nothing in progress before it, that fits in
    /// one buffer. It takes the same steps as `get_inner` minus its loops and cursor,
    /// and so does an empty poll (`Some(0)`); `None` when something else is next
    /// (then `get_inner` reads it). When more has landed behind the packet and the
    /// buffer has room, `get_inner` reads on into the rest (by `mode`), as a get
    /// takes all that has landed.
    #[inline]
    pub(crate) fn get_first_packet(
        &mut self,
        buf: &mut [u8],
        mode: GetMode,
    ) -> io::Result<Option<usize>> {
        if buf.is_empty() || self.reads.is_some() || self.zc.is_some() || self.in_packet {
            return Ok(None);
        }
        if self.quiet_poll() {
            return Ok(Some(0));
        }
        self.let_retired_go();
        if let Some(e) = self.read_failure() {
            return Err(e);
        }
        // As in get_inner: the packet the last call read goes back to the sender now.
        self.release_read();
        self.take_due_backoff();
        let Some(landed) = self.landed_packet()? else {
            // Nothing has landed: get_inner's loop would stop at once, so its empty
            // poll is this, without repeating the checks above.
            self.after_get(0)?;
            return Ok(Some(0));
        };
        let header = Header::new_unchecked(&landed.header[..]);
        let len = header.len() as usize;
        // get_inner skips empty packets and times the copies the path meter measures.
        if header.kind() != Ok(PacketKind::Data)
            || len == 0
            || len > buf.len()
            || self.times_copy(len)
        {
            return Ok(None);
        }
        // A stream of such gets with no empty poll between: the upkeep the last one
        // left is done now, once per packet, as after any get.
        if self.upkeep_owed {
            self.maintain()?;
        }
        self.take_ack(header.ack())?;
        let at = self.read_pos & (self.ring_size - 1);
        // The whole packet is visible (landed_packet saw its trailer) and will not be
        // rewritten until we publish a tail beyond it.
        match landed.short_payload {
            // Already loaded, in order after its header: no second read of the ring.
            Some(word) => copy_short(&mut buf[..len], &word.to_le_bytes()[..len]),
            None => self
                .ring
                .copy_out(at + landed.payload_at as u64, &mut buf[..len]),
        }
        self.cur_cells = landed.cells;
        self.finish_packet();
        if len < buf.len() {
            let [first, second] = self.ring.head_words(self.read_pos);
            if first | second != 0 {
                // More landed behind it: the general path reads on, and does the upkeep.
                return match self.get_inner(&mut [IoSliceMut::new(&mut buf[len..])], mode) {
                    Ok(more) => Ok(Some(len + more)),
                    // This packet's bytes are the caller's now. A failure seen after
                    // them is the connection's (a protocol error, a lost peer): it
                    // stays, and the next call reports it.
                    Err(_) => Ok(Some(len)),
                };
            }
        }
        self.arm_stream_backoff();
        // When the sender waits for credit, or a tail update is due, the space this
        // call gave back (the packet release_read released above) goes to the
        // sender now, as after any get: a stalled sender must not wait on a receiver
        // that has read everything and makes no further call.
        if self.upkeep_due() {
            self.maintain()?;
            return Ok(Some(len));
        }
        // Otherwise the upkeep is left to the next call on this receiver, whatever
        // it is: its empty poll, a get of the next packet (above), get_inner, a
        // wait. In a ping-pong or request-response the caller replies next, and that
        // reply should not wait behind work with nothing to do; a sender that
        // stalls later asks for credit, which the next call (or a put of the sending
        // half, which serves credit too) answers.
        self.upkeep_owed = true;
        Ok(Some(len))
    }

    /// Lends the next bytes of the stream in place, where the peer wrote them into
    /// this end's ring: no copy. Read them, then call [`consume`](Self::consume) with
    /// how many are done; until then the same bytes are lent again. One call lends at
    /// most the rest of one packet (up to a chunk), so a message may come in parts.
    ///
    /// This is for a caller that looks at a message where it lies (a header it
    /// decodes, a value it adds up) instead of wanting it in a buffer of its own: it
    /// saves the copy, and the cache lines of payload it never touches stay with the
    /// sender. A zero-copy transfer (a large registered or heap buffer the peer
    /// announced) is not in the ring: [`Peeked::ZeroCopy`] says that one is next,
    /// and only [`get`](Self::get) reads it, into the caller's buffer.
    ///
    /// The bytes are the peer's to write, as in any RDMA receive buffer: a peer that
    /// breaks the protocol could change them while they are lent. Treat them as input
    /// from the network, and copy what must not change under a check.
    ///
    /// ```
    /// use std::io::IoSlice;
    /// use rdma_channel::Peeked;
    /// let (mut a, mut b) = rdma_channel::RdmaStream::pair()?;
    /// let rx = b.channel().receiver();
    /// assert!(matches!(rx.peek()?, Peeked::Nothing));
    /// a.put(&[IoSlice::new(b"hello")])?;
    /// let Peeked::Bytes(bytes) = rx.peek()? else { unreachable!() };
    /// assert_eq!(bytes, b"hello");
    /// rx.consume(2)?; // "he" is done; "llo" is lent next
    /// let Peeked::Bytes(bytes) = rx.peek()? else { unreachable!() };
    /// assert_eq!(bytes, b"llo");
    /// rx.consume(3)?;
    /// assert!(matches!(rx.peek()?, Peeked::Nothing));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get); `InvalidInput` while reads started by `get_nowait`
    /// are in flight (finish them with `get_nowait` first).
    pub fn peek(&mut self) -> io::Result<Peeked<'_>> {
        if self.reads.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "zero-copy reads are in flight: finish them with get_nowait first",
            ));
        }
        // An empty poll costs what get's does: a few loads when nothing is owed.
        if self.quiet_poll() {
            return Ok(Peeked::Nothing);
        }
        self.let_retired_go();
        if let Some(e) = self.read_failure() {
            return Err(e);
        }
        self.release_read();
        if self.zc.is_none() && !self.in_packet {
            self.take_due_backoff();
            if !self.next_packet()? {
                // Nothing new: the same upkeep as an empty get (tail, credit, end of
                // stream, health).
                self.after_get(0)?;
                return Ok(Peeked::Nothing);
            }
            // A stream of packets each peeked and consumed whole: the upkeep the
            // last consume left is done now, once per packet, as get does.
            if self.upkeep_owed {
                self.maintain()?;
            }
        }
        if let Some(zc) = &self.zc {
            return Ok(Peeked::ZeroCopy {
                left: zc.total - zc.done,
            });
        }
        Ok(Peeked::Bytes(
            self.ring.lend(self.cur_off as u64, self.cur_left),
        ))
    }

    /// Marks the first `n` bytes [`peek`](Self::peek) lent as read; the ring space
    /// they held goes back to the peer as after a [`get`](Self::get). `consume(0)`
    /// does nothing.
    ///
    /// # Errors
    ///
    /// `InvalidInput`, with nothing consumed, when `n` is more than the last `peek`
    /// lent (or it lent none); otherwise as [`get`](Self::get).
    pub fn consume(&mut self, n: usize) -> io::Result<()> {
        self.let_retired_go();
        if n == 0 {
            return Ok(());
        }
        if self.zc.is_some() || !self.in_packet || n > self.cur_left {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "consume({n}) past the {} bytes peek lends",
                    if self.zc.is_none() && self.in_packet {
                        self.cur_left
                    } else {
                        0
                    }
                ),
            ));
        }
        self.cur_off += n;
        self.cur_left -= n;
        if self.cur_left != 0 {
            return self.after_get(n);
        }
        self.finish_packet();
        self.arm_stream_backoff();
        // As after a get of a whole packet (get_first_packet): the space goes back
        // now when the sender waits for it or a tail update is due, else the upkeep
        // is left to the next call on this receiver, so that a reply is not held up.
        if self.upkeep_due() {
            return self.maintain();
        }
        self.upkeep_owed = true;
        Ok(())
    }

    /// Copies `src`, bytes of a packet lent to the caller ([`peek`](Self::peek), or
    /// the C interface's lane), into `dst`, timing the copy for the path meter as
    /// [`get`](Self::get) times its own: a caller that copies lent messages out
    /// itself (ch3:rch's receive) lets the meter see what the ring costs.
    ///
    /// # Errors
    ///
    /// Posting changed path advice to the peer failed (the connection's error); the
    /// bytes are copied all the same.
    ///
    /// # Panics
    ///
    /// If the two slices differ in length.
    pub(crate) fn copy_lent(&mut self, dst: &mut [u8], src: &[u8]) -> io::Result<()> {
        let timed = self.times_copy(src.len()).then(Instant::now);
        dst.copy_from_slice(src);
        self.ring_copy_timed(src.len(), timed)
    }

    /// Feeds the path meter a copy of `n` bytes out of the ring that started at
    /// `timed` (`None`: not timed, see [`times_copy`](Self::times_copy)).
    fn ring_copy_timed(&mut self, n: usize, timed: Option<Instant>) -> io::Result<()> {
        if let Some(t0) = timed {
            let own = self.link.own_puts();
            self.advise_path(|m| m.ring_copied(n, t0, own))?;
        }
        Ok(())
    }

    /// [`consume`](Self::consume) of `n` bytes of the data packet at the read
    /// position, which a caller found itself where [`quiet_watch`](Self::quiet_watch)
    /// pointed (the C interface's `rch_lane_packet`), without a `peek`: the packet is
    /// looked up first, as `peek` would, taking its acknowledgement. If it is already
    /// lent (a poll since looked at it), as `consume`.
    ///
    /// # Errors
    ///
    /// `InvalidInput`, with nothing consumed, when no data packet of at least `n`
    /// bytes is at the read position; otherwise as [`get`](Self::get).
    pub(crate) fn consume_landed(&mut self, n: usize) -> io::Result<()> {
        if n != 0 && !self.in_packet && self.zc.is_none() && self.reads.is_none() {
            self.let_retired_go();
            if let Some(e) = self.read_failure() {
                return Err(e);
            }
            self.release_read();
            if !self.next_packet()? {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("consume({n}): no packet has landed at the read position"),
                ));
            }
            if self.upkeep_owed {
                self.maintain()?;
            }
        }
        self.consume(n)
    }

    /// Consumes `packets` whole data packets from the read position on, which a
    /// caller read where [`quiet_watch`](Self::quiet_watch) pointed and then cell by
    /// cell past each (the C interface's `rch_lane_next`), without a call: each is
    /// looked up as [`consume_landed`](Self::consume_landed) does (taking its
    /// acknowledgement) and consumed whole.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when fewer plain data packets are there (those before are
    /// consumed); otherwise as [`get`](Self::get).
    pub(crate) fn consume_passed(&mut self, packets: usize) -> io::Result<()> {
        if packets == 0 {
            return Ok(());
        }
        let refuse = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        if self.zc.is_some() || self.reads.is_some() {
            return refuse(format!(
                "{packets} packets passed while a zero-copy transfer is being read"
            ));
        }
        self.let_retired_go();
        if let Some(e) = self.read_failure() {
            return Err(e);
        }
        let mut done = 0;
        if self.in_packet {
            // The lane went on from a packet a peek lent (`lane_after_lend`): its
            // consume does that packet's upkeep (and counts it for the stream
            // backoff, once: a second count would arm the backoff's pause in a
            // ping-pong, which passes one packet a call).
            self.consume(self.cur_left)?;
            done = 1;
            if done == packets {
                return Ok(());
            }
        }
        // The rest one after another, as next_packet and consume would take them,
        // but with the per-call upkeep (tail update, credit, stream backoff) and the
        // cells' release once at the end: a burst's packets cost a few loads and
        // stores each.
        self.release_read();
        let mut big = 0;
        let mut stopped = Ok(());
        while done < packets {
            let landed = match self.landed_packet() {
                Ok(Some(landed)) => landed,
                Ok(None) => {
                    stopped = refuse(format!(
                        "packet {done} of {packets} passed has not landed at the read position"
                    ));
                    break;
                }
                Err(e) => {
                    stopped = Err(e);
                    break;
                }
            };
            let header = Header::new_unchecked(&landed.header[..]);
            if !matches!(header.kind(), Ok(PacketKind::Data)) || header.len() == 0 {
                stopped = refuse(format!(
                    "packet {done} of {packets} passed is not plain data"
                ));
                break;
            }
            if let Err(e) = self.take_ack(header.ack()) {
                stopped = Err(e);
                break;
            }
            self.cur_cells = landed.cells;
            if (landed.cells * CELL) as u64 >= self.threshold {
                big += 1;
            }
            // As finish_packet: the cells go back below, with the others'.
            self.read_pos += (landed.cells * CELL) as u64;
            done += 1;
        }
        self.in_packet = false;
        // The packets taken so far are consumed, even when one after them was refused.
        self.release_passed(big);
        stopped?;
        self.arm_stream_backoff();
        if self.upkeep_due() {
            return self.maintain();
        }
        self.upkeep_owed = true;
        Ok(())
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
        if let [buf] = iov {
            if let Some(n) = self.get_first_packet(buf, GetMode::RingOnly)? {
                return Ok(n);
            }
        }
        self.get_inner(iov, GetMode::RingOnly)
    }

    /// The wait policy this connection's blocking calls use (as
    /// [`Sender::wait_policy`](crate::Sender::wait_policy)).
    pub fn wait_policy(&self) -> crate::config::WaitPolicy {
        self.link.wait
    }

    /// One step of a caller's own wait loop (as [`Sender::snooze`](crate::Sender::snooze)):
    /// on a connection that takes wakes, a wait past its busy polls blocks until
    /// the peer writes or a read of ours completes.
    pub fn snooze(&self, backoff: &mut Backoff) {
        self.link.snooze(backoff);
    }

    /// Parts of zero-copy transfers lent to the peer to push so far (see
    /// [`Config::with_zero_copy_push`](crate::Config::with_zero_copy_push)).
    pub fn lends(&self) -> u64 {
        self.lends_sent
    }

    /// True while RDMA READs started by [`get_nowait`](Self::get_nowait) have not been
    /// counted yet.
    pub fn reads_in_flight(&self) -> bool {
        self.reads.is_some()
    }

    pub(crate) fn get_inner(
        &mut self,
        iov: &mut [IoSliceMut<'_>],
        mode: GetMode,
    ) -> io::Result<usize> {
        if self.quiet_poll() {
            return Ok(0);
        }
        self.let_retired_go();
        let nowait = mode != GetMode::Wait;
        let mut done = 0;
        let mut resumed = 0;
        // A failed connection fails every call (but see ring_outlives). Not while
        // reads are in flight: those must be waited for first (finish_reads below), as
        // they target the caller's memory. Without this a get after a failed zero-copy
        // READ would resume the transfer from a half-advanced state.
        if self.reads.is_none() {
            if let Some(e) = self.read_failure() {
                return Err(e);
            }
        }
        // The packet the last call read goes back to the sender now (see release_read).
        self.release_read();
        self.take_due_backoff();
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
                    match self.zero_copy_step(&mut buf[at..], mode)? {
                        Some(n) => {
                            at += n;
                            continue;
                        }
                        None => {
                            // Stopped at the transfer (get_buffered) or reads left in
                            // flight (get_nowait): what came before it is the answer.
                            done += at;
                            self.maintain()?;
                            return Ok(done);
                        }
                    }
                }
                let n = self.cur_left.min(buf.len() - at);
                let timed = self.times_copy(n).then(Instant::now);
                // The whole packet is visible (next_packet saw its trailer) and will not
                // be rewritten until we publish a tail beyond it.
                self.ring
                    .copy_out(self.cur_off as u64, &mut buf[at..at + n]);
                self.ring_copy_timed(n, timed)?;
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

    /// One step of a `get` at a zero-copy transfer, by `mode`: the bytes that landed
    /// in `buf`, or `None` when the get stops here (`RingOnly` leaves the transfer to
    /// `get_nowait`; `NoWait` left its reads in flight).
    fn zero_copy_step(&mut self, buf: &mut [u8], mode: GetMode) -> io::Result<Option<usize>> {
        match mode {
            GetMode::RingOnly => Ok(None),
            GetMode::Wait => self.read_zero_copy(buf).map(Some),
            GetMode::NoWait(lent) => {
                let r = self.start_reads_lent(buf, lent)?;
                self.finish_reads(r, false)
            }
        }
    }

    /// True when [`maintain`](Self::maintain) would write something: the peer's
    /// sender waits for credit, or the released space not yet told to the peer
    /// reached the update threshold.
    #[inline]
    fn upkeep_due(&self) -> bool {
        self.link.credit_wanted() || self.tail_update_due()
    }

    /// True when the space released but not yet told to the peer (explicitly or
    /// piggybacked) reached the update threshold.
    #[inline]
    fn tail_update_due(&self) -> bool {
        // Relaxed: hints for when to publish; a stale value only repeats or delays an
        // update, and publish_tail itself reads rx_tail with Acquire.
        let link = &*self.link;
        let told = link
            .rx_explicit
            .load(Ordering::Relaxed)
            .max(link.rx_piggy.load(Ordering::Relaxed));
        self.released_pos.saturating_sub(told) >= self.threshold
    }

    /// Delayed tail update and credit service: after every `get` that returned data
    /// (for the straight path, on the next call: see `upkeep_owed`), every empty poll
    /// and every wait step.
    ///
    /// The growth words are looked at only when this upkeep writes a tail or the
    /// peer asked for credit, and at empty polls ([`idle`](Self::idle)), not on
    /// every get: a stalled sender asks for a bigger ring just before it asks for
    /// credit (so the request has landed when the credit request is seen), a packet
    /// that counts toward growth makes a tail update due, and a declined offer can
    /// wait for the next of these. The small messages of a stream pay two loads
    /// less per get (~4% of the 8-byte windowed bandwidth, bench/ab.sh).
    #[inline]
    fn maintain(&mut self) -> io::Result<()> {
        self.upkeep_owed = false;
        let link = &*self.link;
        // Once the peer's sending side has closed, nobody reuses ring space or waits
        // for credit: an update would only be a write to an end that may be gone (on
        // verbs a destroyed queue pair, whose failure would end the connection while
        // its last bytes are still unread here).
        if link.ctrl.end_of_stream() != 0 {
            return Ok(());
        }
        let due = self.tail_update_due();
        let updated = if due { link.publish_tail() } else { Ok(()) };
        let asked = updated.and_then(|()| link.serve_credit_asked());
        let grown = asked.and_then(|asked| {
            if (due || asked) && self.growth_news() {
                self.serve_growth()
            } else {
                Ok(())
            }
        });
        match grown {
            // The peer closed its sending side after the check above, and may have
            // left since (it closes before it goes): the update was not needed, and
            // what it sent is still here to read.
            Err(_) if self.link.ctrl.end_of_stream() != 0 => Ok(()),
            r => r,
        }
    }

    /// True once the peer closed and everything it sent has been read.
    fn at_end(&self) -> bool {
        let fin = self.link.ctrl.end_of_stream();
        !self.in_packet && self.zc.is_none() && fin != 0 && self.read_pos + 1 >= fin
    }

    /// Called when a poll found nothing: end of stream, and now and then the health
    /// of the connection.
    fn idle(&mut self) -> io::Result<()> {
        // The polls cut short since the last full one count toward the health check.
        let quiet = std::mem::take(&mut self.quiet_polls);
        // A failure seen by the other half or by a waiter is this half's too, at once.
        if let Some(e) = self.read_failure() {
            return Err(e);
        }
        if self.at_end() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
        // Our sending side may be blocked on this end's reading while the peer
        // waits for it to push.
        let checked = self.link.serve_lend().and_then(|()| {
            // See maintain: growth words not looked at there are looked at here.
            if self.growth_news() && self.link.ctrl.end_of_stream() == 0 {
                self.serve_growth()?;
            }
            self.empty_polls += 1 + quiet;
            if self.empty_polls < HEALTH_EVERY {
                return Ok(());
            }
            self.empty_polls = 0;
            self.link.check_health()?;
            self.shrink_if_idle()
        });
        match checked {
            // The peer closed and left between this poll's look at the ring and the
            // check: its last packets are here, for the next poll.
            Err(e) if self.ring_outlives(&e) => Ok(()),
            r => r,
        }
    }

    /// The connection's failure, unless it is one the ring outlives (see
    /// [`ring_outlives`](Self::ring_outlives)).
    #[inline]
    fn read_failure(&self) -> Option<io::Error> {
        let e = self.link.error()?;
        (!self.ring_outlives(&e)).then_some(e)
    }

    /// True when reading may go on after `e`: the connection was lost (the peer
    /// left, its queue pair failed) after the peer closed its sending side in
    /// order. The peer writes its end of stream after its last packet, so all it
    /// sent is already in this end's ring, and reading that needs nothing from the
    /// connection: a peer that closes and exits at once must not lose its last
    /// bytes to a health check that runs before they are read. Not so for a
    /// zero-copy transfer (its bytes are in the peer's memory), nor for a protocol
    /// or a local error.
    fn ring_outlives(&self, e: &io::Error) -> bool {
        e.kind() == io::ErrorKind::ConnectionReset
            && self.zc.is_none()
            && self.reads.is_none()
            && self.link.ctrl.end_of_stream() != 0
    }

    /// The common empty poll, cut short: true when nothing is half read, in flight,
    /// left to give back or owed (upkeep, a backoff), the connection has neither
    /// failed nor ended, the peer's sender waits for no credit, and the ring's next
    /// cell is empty. It then skips the rest of an empty poll's upkeep (lends to
    /// serve, ring growth, the health check: requests that can wait a few polls),
    /// which every [`QUIET_POLLS`]-th empty poll still does. In a process group's
    /// progress loop most polls are empty, and their cost is how late a message is
    /// seen: the full empty poll is ~240 instructions, this one a few loads.
    #[inline(always)]
    fn quiet_poll(&mut self) -> bool {
        if self.in_packet || self.zc.is_some() || self.reads.is_some() {
            return false;
        }
        // The ring first: a get that finds a packet pays only this look (the words
        // are the ones landed_packet loads next).
        let [first, second] = self.ring.head_words(self.read_pos);
        if first | second != 0 || self.quiet_polls + 1 >= QUIET_POLLS || !self.nothing_owed() {
            return false;
        }
        let link = &*self.link;
        // Acquire, as in Link::error: a failure takes the full path, which reports it.
        if link.is_broken.load(Ordering::Acquire)
            || link.ctrl.end_of_stream() != 0
            || link.credit_wanted()
        {
            return false;
        }
        self.quiet_polls += 1;
        true
    }

    /// True when this end owes nothing a poll would do: no packet left to give
    /// back, no upkeep, no stream backoff due or armed.
    #[inline(always)]
    fn nothing_owed(&self) -> bool {
        self.released_pos == self.read_pos
            && !self.upkeep_owed
            && !self.backoff_due
            && !self.backoff_armed
    }

    /// The words a watch holds, with the values a quiet connection has (not the ones
    /// loaded now: a word that changed since the poll that found nothing fails the
    /// watch's first test): the ring's two head words at the read position, then
    /// the control words, which must hold their values now (`None` otherwise, or
    /// when the connection is broken).
    fn watch_words(&self) -> Option<[(&AtomicU64, u64); QUIET_WATCH_WORDS]> {
        let link = &*self.link;
        // Acquire, as in Link::error.
        if link.is_broken.load(Ordering::Acquire) {
            return None;
        }
        let [first, second] = self.ring.head_word_refs(self.read_pos);
        let [credit, end, lend] = link.ctrl.quiet_words();
        // Relaxed: as credit_wanted and serve_lend's own looks.
        let words = [
            (first, 0),
            (second, 0),
            (credit, link.credit_served.load(Ordering::Relaxed)),
            (end, 0),
            (lend, link.lends_served.load(Ordering::Relaxed)),
        ];
        // Relaxed: a word that differs makes the caller call at once.
        if words[2..]
            .iter()
            .any(|(w, v)| w.load(Ordering::Relaxed) != *v)
        {
            return None;
        }
        Some(words)
    }

    /// The words to watch in place of the next polls, when this end is quiet as
    /// [`quiet_poll`](Self::quiet_poll) means it (nothing half read, owed or in
    /// flight, the connection open, no request of the peer unanswered) and the
    /// ring's next cell is empty; `None` otherwise. While every word holds its value
    /// a poll would find nothing but what only a poll notices (a failure found
    /// elsewhere, the periodic upkeep): hence a watch's few tests. The words stay
    /// mapped until the next read call here (the ring a switch leaves is kept until
    /// then, see `retired_rings`), or this receiver's drop.
    pub(crate) fn quiet_watch(&self) -> Option<QuietWatch<'_>> {
        if self.in_packet || self.zc.is_some() || self.reads.is_some() || !self.nothing_owed() {
            return None;
        }
        let words = self.watch_words()?;
        // Relaxed: a word that differs makes the caller call at once.
        if words[..2]
            .iter()
            .any(|(w, v)| w.load(Ordering::Relaxed) != *v)
        {
            return None;
        }
        Some(QuietWatch {
            words,
            tests: QUIET_POLLS - 1,
            pos: self.read_pos,
            room: self.ring_size - (self.read_pos & (self.ring_size - 1)),
            lent_cells: 0,
        })
    }

    /// After a [`peek`](Self::peek) that lent a whole data packet from the ring: the
    /// words a caller watches to go on past it without a call (the C interface's
    /// `rch_lane_next`, in a burst of packets that each find the next already
    /// there), with the lent packet at `pos`; `None` when the lend is of part of a
    /// packet or of a zero-copy transfer, or the connection has a request of the
    /// peer unanswered. The cell words are the lent packet's own, expected empty as a
    /// quiet watch's: the caller moves them on to the next cell. Their lifetime is a
    /// quiet watch's.
    pub(crate) fn lane_after_lend(&self) -> Option<QuietWatch<'_>> {
        if !self.in_packet
            || self.zc.is_some()
            || self.reads.is_some()
            || self.cur_left != self.cur_len
            || self.cur_left == 0
        {
            return None;
        }
        // The cell's words are checked by the caller's own reads.
        let words = self.watch_words()?;
        Some(QuietWatch {
            words,
            tests: 0,
            pos: self.read_pos,
            room: self.ring_size - (self.read_pos & (self.ring_size - 1)),
            lent_cells: self.cur_cells,
        })
    }

    fn after_get(&mut self, done: usize) -> io::Result<()> {
        self.maintain()?;
        if done != 0 {
            self.arm_stream_backoff();
        } else if !self.in_packet && self.zc.is_none() {
            self.idle()?;
            self.stream_backoff();
        }
        Ok(())
    }

    /// Data arrived: arms the stream backoff when this is the second get or more
    /// with data since this end last sent. The sending half stores the tail it
    /// piggybacks on every packet (`Link::rx_piggy`) and, where a C caller writes
    /// through the send lane, the head as noted before each read
    /// (`Link::tx_lane_head`), so unchanged values mean nothing went out in between.
    /// Packets such a caller read in place are consumed by its next call, several
    /// at once: one arrival per note (`Link::tx_lane_notes`). One reply per message
    /// (a ping-pong, a request and its response, an exchange) never arms it, even
    /// when the program polls once more before it replies.
    #[inline]
    fn arm_stream_backoff(&mut self) {
        // Relaxed: a hint, written by this connection's sending half; a stale value
        // only decides one pause wrongly.
        let piggy = self.link.rx_piggy.load(Ordering::Relaxed);
        let sent = self.link.tx_lane_head.load(Ordering::Relaxed);
        let note = self.link.tx_lane_notes.load(Ordering::Relaxed);
        if note != 0 && note == self.backoff_note {
            // Another packet consumed in the same library call: one arrival.
            return;
        }
        self.backoff_note = note;
        if piggy == self.backoff_piggy && sent == self.backoff_sent {
            self.backoff_streak = self.backoff_streak.saturating_add(1);
        } else {
            self.backoff_piggy = piggy;
            self.backoff_sent = sent;
            self.backoff_streak = 1;
        }
        self.backoff_armed = self.backoff_streak >= 2;
    }

    /// The stream backoff (`Config::with_stream_backoff`): the first empty poll
    /// after data arrived to an end that is only receiving (armed above, and still
    /// nothing sent) makes the next get pause before it polls the ring, so the
    /// sender can write the next packets without our polls taking their cache lines
    /// away. The pause waits for the next get, not here: a caller that answers
    /// first (the ack after a window of messages, which MPI's bandwidth test waits
    /// for) must not be held up by a pause for a stream that has ended.
    #[inline]
    fn stream_backoff(&mut self) {
        if self.backoff_pauses != 0
            && std::mem::take(&mut self.backoff_armed)
            && self.nothing_sent_since_data()
        {
            self.backoff_due = true;
        }
    }

    /// The pause [`stream_backoff`](Self::stream_backoff) left to this get, if this
    /// end has still sent nothing since.
    #[inline(always)]
    fn take_due_backoff(&mut self) {
        if std::mem::take(&mut self.backoff_due) {
            self.pause_for_stream();
        }
    }

    #[cold]
    #[inline(never)]
    fn pause_for_stream(&mut self) {
        if self.nothing_sent_since_data() {
            self.backoffs += 1;
            for _ in 0..self.backoff_pauses {
                std::hint::spin_loop();
            }
        }
    }

    /// True while this end has sent nothing since data last arrived (by the tail it
    /// piggybacks and the head its lane moved).
    #[inline(always)]
    fn nothing_sent_since_data(&self) -> bool {
        // Relaxed: as in arm_stream_backoff.
        self.link.rx_piggy.load(Ordering::Relaxed) == self.backoff_piggy
            && self.link.tx_lane_head.load(Ordering::Relaxed) == self.backoff_sent
    }

    /// Stream backoffs taken so far (see
    /// [`Config::with_stream_backoff`](crate::Config::with_stream_backoff)).
    pub fn stream_backoffs(&self) -> u64 {
        self.backoffs
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
        self.wait_readable_until(None)
    }

    /// As [`wait_readable`](Self::wait_readable), giving up at `deadline`.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get); `TimedOut` when the deadline passes with nothing to read.
    pub fn wait_readable_until(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        let mut b = Backoff::with_policy(self.link.wait);
        loop {
            if self.can_get()? {
                return Ok(());
            }
            // The packet read last goes back before a credit request is answered.
            self.release_read();
            self.maintain()?;
            self.idle()?;
            past(deadline, "read")?;
            self.link.snooze(&mut b);
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
        if self.quiet_poll() {
            return Ok(false);
        }
        if let Some(mut r) = self.reads.take() {
            let done = self.step_done(&mut r);
            self.reads = Some(r);
            return done;
        }
        if self.can_get()? {
            return Ok(true);
        }
        self.release_read();
        self.maintain()?;
        self.idle()?;
        Ok(false)
    }

    /// Asks the peer's sender to ring this process's doorbell after its next write
    /// (a process group calls it when it stops looking at this connection's ring
    /// on every poll; the peer's group told its sender where the doorbell is). Look
    /// at the ring once more afterwards: a write already under way is not rung for.
    ///
    /// # Errors
    ///
    /// A fabric failure while sending the request.
    pub(crate) fn ask_for_bell(&mut self) -> io::Result<()> {
        self.bells_asked += 1;
        self.link.post_ctrl(CtrlWord::BellWanted, self.bells_asked)
    }

    /// Asks the peer's sender to wake the thread sleeping on eventfd `fd` (its
    /// `instance`: see `QueuePair::notify`) of this process after its next write,
    /// adding bit `hint` (0-31) to its count (a
    /// selector about to sleep, `crate::select`, which looks first at the items
    /// whose hints it finds): names both when they changed, then asks as
    /// [`ask_for_bell`](Self::ask_for_bell) does. Look at the ring once more
    /// afterwards, after a fence that orders the request before that look on both
    /// sides (the selector's `membarrier`): a write already under way is not woken for.
    ///
    /// Returns false, asking nothing, where the fabric has no such wake
    /// ([`QueuePair::can_notify`](crate::fabric::QueuePair::can_notify)).
    ///
    /// # Errors
    ///
    /// A fabric failure while sending the request.
    pub(crate) fn ask_for_wake(&mut self, fd: u32, instance: u32, hint: u32) -> io::Result<bool> {
        let link = Arc::clone(&self.link);
        if !link.name_wake(CtrlWord::WakeFd, &mut self.wake_named, fd, instance, hint)? {
            return Ok(false);
        }
        self.ask_for_bell()?;
        Ok(true)
    }

    /// Stops reading: the peer's `put` fails with `BrokenPipe` from now on. Dropping
    /// the receiver does the same.
    pub fn close(&mut self) {
        if self.link.error().is_none() {
            let _ = self.link.post_ctrl(CtrlWord::ReceiverClosed, 1);
        }
    }
}

impl<F: Fabric> Drop for Receiver<F> {
    fn drop(&mut self) {
        // Reads left in flight by get_nowait target the caller's memory: let them land
        // before the caller can take that memory back.
        // A lent part needs no wait: dropping it revokes the peer's access.
        if let Some(mut r) = self.reads.take() {
            match &mut r.stripes {
                // Every rail's reads, not only rail 0's.
                Some(stripes) => {
                    let _ = self.wait_stripes(stripes);
                    release_stripe_regs(&self.link, stripes);
                }
                None => {
                    if let Some(last) = r.last {
                        let _ = self.link.wait_completed(last);
                    }
                }
            }
            if let Some(h) = r.handle {
                self.link.rcache.release(h);
            }
        }
        self.close();
    }
}

/// How far a `get` goes at a zero-copy transfer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum GetMode {
    /// Starts its RDMA READs and waits for them (`get`).
    Wait,
    /// Starts them and returns (`get_nowait`, whose caller lent the buffer).
    NoWait(Lent),
    /// Stops before it (`get_buffered`).
    RingOnly,
}

#[cfg(test)]
mod tests {
    use std::io::{IoSlice, IoSliceMut};
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::Peeked;
    use crate::{Config, RdmaStream};

    /// An exchange whose sends the library sees only by the head they moved (a C
    /// caller's send lane) and whose packets one library call consumes two at a time
    /// (one read in place by the caller, consumed by the next call, and the next one)
    /// is no stream: the stream backoff stays off. Counting each packet of such a
    /// call as an arrival paused nearly every exchange of IMB PingPing (8 B 0.35 us
    /// a message against 0.21 without the backoff).
    #[test]
    fn an_exchange_through_the_send_lane_takes_no_stream_backoff() {
        let (mut a, mut b) = RdmaStream::pair_with(Config::default()).unwrap();
        // The lane armed, as rch_vc_send_lane does; the group notes its head before
        // each call that reads (`Group::note_lane_sends`).
        let _lane = b.channel().sender().send_lane();
        let mut buf = [0u8; 64];
        for round in 0..50 {
            a.put(&[IoSlice::new(b"ping1")]).unwrap();
            a.put(&[IoSlice::new(b"ping2")]).unwrap();
            // The first packet read in place, not consumed, and answered.
            b.channel().sender().note_lane_sends();
            let rx = b.channel().receiver();
            let lent = loop {
                match rx.peek().unwrap() {
                    Peeked::Bytes(bytes) => {
                        assert_eq!(bytes, b"ping1", "round {round}");
                        break bytes.len();
                    }
                    _ => continue,
                }
            };
            b.put(&[IoSlice::new(b"pong")]).unwrap();
            let mut got = 0;
            while got < 4 {
                got += a.get(&mut [IoSliceMut::new(&mut buf[got..4])]).unwrap();
            }
            // The next call consumes it and reads the second; then the ring is empty.
            b.channel().sender().note_lane_sends();
            let rx = b.channel().receiver();
            rx.consume(lent).unwrap();
            let mut got = 0;
            while got < 5 {
                got += rx.get(&mut [IoSliceMut::new(&mut buf[got..5])]).unwrap();
            }
            assert_eq!(&buf[..5], b"ping2");
            assert_eq!(rx.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
            assert_eq!(rx.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
        }
        assert_eq!(b.channel().receiver().stream_backoffs(), 0);
    }

    /// A watch handed out before a ring switch points into the ring the switch
    /// leaves: that ring stays mapped while a call that is no read (here `can_get`,
    /// as `rch_poll_ready` makes) switches, and goes at the next read.
    #[test]
    fn a_watch_outlives_a_ring_switch_until_the_next_read() {
        let (mut a, mut b) = RdmaStream::pair_with(Config::default()).unwrap();
        let data = vec![7u8; 1 << 20];
        let mut sink = vec![0u8; 1 << 20];
        for _ in 0..10_000 {
            // Drained and quiet: a watch of the current ring.
            while b
                .channel()
                .receiver()
                .get(&mut [IoSliceMut::new(&mut sink)])
                .unwrap()
                > 0
            {}
            let mut watched: Option<*const AtomicU64> = None;
            for _ in 0..20 {
                let rx = b.channel().receiver();
                if let Some(w) = rx.quiet_watch() {
                    watched = Some(w.words[0].0 as *const AtomicU64);
                    break;
                }
                let _ = rx.get(&mut [IoSliceMut::new(&mut sink)]).unwrap();
            }
            let before = a.channel().sender().ring_size();
            // A stall asks for a bigger ring; a put after the offer takes it.
            let _ = a.channel().sender().put(&[IoSlice::new(&data)]).unwrap();
            if a.channel().sender().ring_size() == before {
                continue;
            }
            let Some(word) = watched else {
                continue;
            };
            let rx = b.channel().receiver();
            assert!(rx.retired_rings.is_empty());
            // The switch packet, then data in the new ring; a second look (as every
            // rch_poll_ready makes) keeps the ring too.
            assert!(rx.can_get().unwrap());
            assert!(rx.poll_readable().unwrap());
            let old = rx
                .retired_rings
                .first()
                .expect("the ring left behind is kept");
            let base = old.lend(0, 0).as_ptr() as usize;
            let at = word as usize;
            assert!(
                at >= base && at < base + old.size() as usize,
                "the watched word lies in the ring left behind"
            );
            // SAFETY: inside the retired ring, which the receiver holds (checked just
            // above); accessed atomically as the ring's words always are.
            assert_eq!(unsafe { &*word }.load(Ordering::Relaxed), 0);
            let n = rx.get(&mut [IoSliceMut::new(&mut sink)]).unwrap();
            assert!(n > 0);
            assert!(rx.retired_rings.is_empty(), "a read lets the old ring go");
            return;
        }
        panic!("the ring never switched with a watch out");
    }

    /// A packet found where the quiet watch points, without a peek, is consumed by
    /// `consume_landed` as if it had been lent, in parts and whole; more than it
    /// holds, or nothing landed, is refused with nothing consumed.
    #[test]
    fn consume_landed_takes_the_packet_at_the_watched_cell() {
        let (mut a, mut b) = RdmaStream::pair_with(Config::default()).unwrap();
        let rx = b.channel().receiver();
        let mut w = None;
        for _ in 0..20 {
            if let Some(q) = rx.quiet_watch() {
                w = Some((q.pos, q.room, q.words[0].0 as *const AtomicU64));
                break;
            }
            assert!(matches!(rx.peek().unwrap(), crate::engine::Peeked::Nothing));
        }
        let (pos, room, cell) = w.expect("a quiet receiver has a watch");
        assert_eq!(pos, 0);
        assert_eq!(room, rx.ring_size());
        let err = rx.consume_landed(1).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        for (k, msg) in [&b"short"[..], &[9u8; 100][..]].into_iter().enumerate() {
            assert_eq!(a.put(&[IoSlice::new(msg)]).unwrap(), msg.len());
            let rx = b.channel().receiver();
            if k == 0 {
                // Landed where the watch pointed: its header is the cell's second
                // word, which the watch holds as zero while quiet.
                // SAFETY: the word lies in the receiver's ring, which `b` keeps; it
                // is read atomically, as the ring's words always are.
                assert_ne!(unsafe { &*cell.wrapping_add(1) }.load(Ordering::Acquire), 0);
            }
            let err = rx.consume_landed(msg.len() + 1).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
            rx.consume_landed(2).unwrap();
            match rx.peek().unwrap() {
                crate::engine::Peeked::Bytes(rest) => assert_eq!(rest, &msg[2..]),
                other => panic!("after consume_landed(2): {other:?}"),
            }
            rx.consume_landed(msg.len() - 2).unwrap();
            assert!(matches!(rx.peek().unwrap(), crate::engine::Peeked::Nothing));
        }
        let mut sink = [0u8; 8];
        let rx = b.channel().receiver();
        assert_eq!(rx.get(&mut [IoSliceMut::new(&mut sink)]).unwrap(), 0);
    }

    /// Packets a caller passed whole, without a call, are consumed together by
    /// `consume_passed`, the first one also when a peek had lent it (the lane after
    /// a lend); what comes after them is read next; more packets than landed is
    /// refused, with those before consumed; a lend of part of a packet gives no lane.
    #[test]
    fn consume_passed_takes_whole_packets_from_the_read_position() {
        let (mut a, mut b) = RdmaStream::pair_with(Config::default()).unwrap();
        let msgs: [&[u8]; 4] = [b"one", &[2u8; 70], b"three", &[4u8; 200]];
        for m in msgs {
            assert_eq!(a.put(&[IoSlice::new(m)]).unwrap(), m.len());
        }
        let rx = b.channel().receiver();
        // A lend of the whole first packet: the lane may go on from it.
        match rx.peek().unwrap() {
            crate::engine::Peeked::Bytes(first) => assert_eq!(first, msgs[0]),
            other => panic!("the first packet: {other:?}"),
        }
        let lane = rx.lane_after_lend().expect("a whole packet lent");
        assert_eq!(lane.pos, 0);
        assert_eq!(lane.lent_cells, 1);
        // Passed: the lent one and the next; the third is read normally.
        rx.consume_passed(2).unwrap();
        match rx.peek().unwrap() {
            crate::engine::Peeked::Bytes(third) => assert_eq!(third, msgs[2]),
            other => panic!("after two passed: {other:?}"),
        }
        rx.consume(2).unwrap();
        assert!(
            rx.lane_after_lend().is_none(),
            "a part of a packet was read"
        );
        rx.consume(msgs[2].len() - 2).unwrap();
        // One packet is left: passing two consumes it, then refuses.
        let err = rx.consume_passed(2).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(matches!(rx.peek().unwrap(), crate::engine::Peeked::Nothing));
        assert_eq!(a.put(&[IoSlice::new(b"after")]).unwrap(), 5);
        let mut got = [0u8; 8];
        let rx = b.channel().receiver();
        assert_eq!(rx.get(&mut [IoSliceMut::new(&mut got)]).unwrap(), 5);
        assert_eq!(&got[..5], b"after");
    }

    /// One packet a peek lent, passed: counted once for the stream backoff, as a
    /// consume of it would be. Counted twice it armed the backoff's pause in every
    /// ping-pong (the first packet of a stream must not arm it).
    #[test]
    fn passing_the_lent_packet_counts_it_once() {
        let (mut a, mut b) = RdmaStream::pair_with(Config::default()).unwrap();
        assert_eq!(a.put(&[IoSlice::new(b"ping")]).unwrap(), 4);
        let rx = b.channel().receiver();
        assert!(matches!(
            rx.peek().unwrap(),
            crate::engine::Peeked::Bytes(_)
        ));
        assert!(rx.lane_after_lend().is_some());
        rx.consume_passed(1).unwrap();
        assert_eq!(rx.backoff_streak, 1);
        assert!(!rx.backoff_armed, "one packet armed the stream backoff");
    }
}
