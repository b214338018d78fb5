//! The packet format inside a ring: typed views over bytes, no I/O.
//!
//! A packet occupies whole 64-byte *cells* and is written by one RDMA WRITE. It has
//! one of two forms. A *full* packet (any kind, any length):
//!
//! ```text
//!  cell 0                                   ...          last cell
//! +--------+--------+---------------------- ... -------+-----+---------+
//! | header |  ack   | payload (len bytes)               | pad | trailer |
//! +--------+--------+---------------------- ... -------+-----+---------+
//!   8 B      8 B                                               8 B
//! ```
//!
//! A *short* packet carries data of at most [`SHORT_PAYLOAD`] = 8 bytes. It still takes
//! a whole cell, but only its first [`SHORT_WRITE`] = 16 bytes are written:
//!
//! ```text
//! +---------------------------+--------------+---- ... (not written) ----+
//! | payload (len bytes, 0-pad)| short header |                           |
//! +---------------------------+--------------+---- ... ------------------+
//!   8 B                         8 B
//! ```
//!
//! On verbs every byte of a write costs the NIC's copy and checksum: Soft-RoCE's own
//! `ib_write_lat` took 11.08 us at 16 bytes and 11.24 us at 32 (medians of six rounds
//! in one boot, 2026-11-27), and a ping-pong of small messages is what latency is.
//!
//! * `header` = tag (4 bits) | kind (4) | payload length (24) | stamp (32), where the
//!   stamp is the low 32 bits of the packet's absolute cell number. A header from an
//!   earlier lap at the same place carries another stamp, so it never looks new.
//! * `ack` is the piggybacked tail of the reverse direction's ring (seed 001 sec. 4.3,
//!   the MPICH2 RDMA Channel paper of Liu et al., IPDPS 2004), stored with its lowest
//!   bit set ([`ACK_MARK`]; a tail is a cell boundary, so the bit is free): the
//!   second word of a full packet is never zero, which tells the receiver it landed.
//! * `trailer` = [`TRAILER_KEY`] xor the absolute byte position where the packet ends.
//!   It is the last aligned word of the write, so when it is visible the whole packet is
//!   (the fabric's ordering guarantee 2).
//! * `short header` ([`ShortHeader`]) = short tag (4 bits) | length (4) | ack (24) |
//!   stamp (32). It is the write's last word, so it is the trailer too: once it is
//!   visible, so is the payload before it. Its ack is the piggybacked tail in cells,
//!   modulo 2^24: the receiver adds the difference to the last ack it took, which is
//!   exact because a sender uses the short form only while the tail moved less than
//!   [`SHORT_ACK_SPAN`] since the ack it sent last.
//!
//! Payload bytes are the user's and can hold any value, including a valid-looking
//! header or trailer; the receiver zeroes the words where headers and trailers can
//! stand before it frees space ([`crate::ring::boundary_offsets`]), so neither stale
//! bytes nor such payload can fool it. A short packet's payload word is where a full
//! header stands, so the receiver looks for the short header first, and takes a full
//! header only once the word after it holds a marked ack: a short packet whose
//! payload looks like a full header, seen before its short header lands, is then
//! just not there yet. The ack of a full packet, a position below 2^60 with its mark,
//! is never a short header (whose top four bits are the short tag) nor zero.

use std::fmt;

/// Size of a cell; packets start and end on cell boundaries.
pub const CELL: usize = 64;
/// Header plus ack word.
pub const HEADER_LEN: usize = 16;
/// Trailer word.
pub const TRAILER_LEN: usize = 8;
/// Bytes of a packet that are not payload (besides padding).
pub const OVERHEAD: usize = HEADER_LEN + TRAILER_LEN;
/// Largest payload one packet can describe (24-bit length field).
pub const MAX_PAYLOAD: usize = (1 << 24) - 1;
// Config validates chunk sizes against its own copy (it sits below this layer).
const _: () = assert!(MAX_PAYLOAD == crate::config::MAX_CHUNK_PAYLOAD);
/// Payload that fits in a one-cell packet.
pub const ONE_CELL_PAYLOAD: usize = CELL - OVERHEAD;
/// Largest payload of a *short* packet (one cell, of which only the first
/// [`SHORT_WRITE`] bytes are written: the payload word, then the [`ShortHeader`]).
pub const SHORT_PAYLOAD: usize = 8;
/// Bytes written for a short packet: one word of payload and the short header.
pub const SHORT_WRITE: usize = SHORT_PAYLOAD + 8;
/// Offset in its cell of a short packet's header word (a boundary word too).
pub const SHORT_HEADER_OFFSET: usize = SHORT_PAYLOAD;
/// A short packet's ack counts cells modulo 2^24: a sender uses the short form only
/// while its ack is less than this many bytes past the ack it sent last.
pub const SHORT_ACK_SPAN: u64 = (1 << SHORT_ACK_BITS) * CELL as u64;

const TAG: u64 = 0xA;
const SHORT_TAG: u64 = 0x5;
const TAG_SHIFT: u32 = 60;
const SHORT_LEN_SHIFT: u32 = 56;
const SHORT_ACK_SHIFT: u32 = 32;
const SHORT_ACK_BITS: u32 = 24;
const SHORT_ACK_MASK: u64 = (1 << SHORT_ACK_BITS) - 1;
const KIND_SHIFT: u32 = 56;
const LEN_SHIFT: u32 = 32;
const STAMP_MASK: u64 = 0xffff_ffff;
/// Bits of a header word that say "a packet starts here in this lap".
pub const HEADER_MATCH_MASK: u64 = (0xf << TAG_SHIFT) | STAMP_MASK;
/// Set in the ack word of every full packet ([`Header::fill`]), so that the word is
/// never zero and a receiver can tell that it landed (module docs).
pub const ACK_MARK: u64 = 1;
/// Mixed into trailers so that zero-filled memory never holds a valid trailer.
pub const TRAILER_KEY: u64 = 0xC3A5_96E1_5A0F_7B2D;

/// What a packet carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketKind {
    /// Stream bytes.
    Data = 1,
    /// Filler that carries no stream bytes (skipped by the reader).
    Pad = 2,
    /// A zero-copy announcement: the payload is a [`Rendezvous`] naming the sender's
    /// buffers, which the receiver pulls with RDMA READ (seed 001 sec. 5).
    Rendezvous = 3,
    /// The rest of this lap is left unused: the next packet starts at the ring's
    /// physical offset 0. Lets the sender keep its traffic in the ring's first
    /// bytes, which stay in cache ([`crate::ring::wrap_early`]). One cell, no payload.
    Wrap = 4,
    /// The last packet of this ring: the next one is in the ring the receiver offered
    /// last ([`RingOffer`](crate::ring::memory::RingOffer)), at the position after
    /// this packet. One cell; the payload is the offer's number (8 bytes,
    /// little-endian), so a receiver never switches to a ring it did not offer.
    Switch = 5,
}

impl PacketKind {
    fn from_bits(bits: u64) -> Option<PacketKind> {
        match bits {
            1 => Some(PacketKind::Data),
            2 => Some(PacketKind::Pad),
            3 => Some(PacketKind::Rendezvous),
            4 => Some(PacketKind::Wrap),
            5 => Some(PacketKind::Switch),
            _ => None,
        }
    }
}

/// Number of cells a packet with `payload` bytes occupies.
///
/// ```
/// use rdma_channel::ring::wire::{cells_for, ONE_CELL_PAYLOAD};
/// assert_eq!(cells_for(0), 1);
/// assert_eq!(cells_for(ONE_CELL_PAYLOAD), 1);
/// assert_eq!(cells_for(ONE_CELL_PAYLOAD + 1), 2);
/// ```
pub const fn cells_for(payload: usize) -> usize {
    (payload + OVERHEAD).div_ceil(CELL)
}

/// True when data of `payload` bytes may go as a short packet.
///
/// ```
/// use rdma_channel::ring::wire::{fits_short, SHORT_PAYLOAD};
/// assert!(fits_short(1) && fits_short(SHORT_PAYLOAD));
/// assert!(!fits_short(0) && !fits_short(SHORT_PAYLOAD + 1));
/// ```
pub const fn fits_short(payload: usize) -> bool {
    payload != 0 && payload <= SHORT_PAYLOAD
}

/// Offset from a full packet's start of its trailer word: the last word of its
/// last cell.
///
/// ```
/// use rdma_channel::ring::wire::trailer_offset;
/// assert_eq!(trailer_offset(0), 56);
/// assert_eq!(trailer_offset(100), 120);
/// ```
pub const fn trailer_offset(payload: usize) -> usize {
    cells_for(payload) * CELL - TRAILER_LEN
}

/// The part of a header word that must match for a packet starting at `pos`.
///
/// ```
/// use rdma_channel::ring::wire::{header_word, header_match, HEADER_MATCH_MASK, PacketKind};
/// let w = header_word(640, PacketKind::Data, 5);
/// assert_eq!(w & HEADER_MATCH_MASK, header_match(640));
/// assert_ne!(header_match(640), header_match(640 + 4096));
/// ```
pub const fn header_match(pos: u64) -> u64 {
    (TAG << TAG_SHIFT) | ((pos / CELL as u64) & STAMP_MASK)
}

/// The header word of a packet at absolute position `pos`.
///
/// ```
/// use rdma_channel::ring::wire::{header_word, PacketKind};
/// assert_ne!(header_word(0, PacketKind::Data, 0), 0);
/// ```
pub const fn header_word(pos: u64, kind: PacketKind, len: u32) -> u64 {
    header_match(pos) | ((kind as u64) << KIND_SHIFT) | (((len as u64) & 0xff_ffff) << LEN_SHIFT)
}

/// The trailer word of a packet that ends at absolute position `end`.
///
/// ```
/// use rdma_channel::ring::wire::trailer_word;
/// assert_ne!(trailer_word(64), trailer_word(64 + 4096));
/// assert_ne!(trailer_word(64), 0);
/// ```
pub const fn trailer_word(end: u64) -> u64 {
    TRAILER_KEY ^ end
}

/// The header word of a short packet ([`SHORT_PAYLOAD`] bytes or fewer of data), which
/// follows its payload word and ends its write (module docs).
///
/// ```
/// use rdma_channel::ring::wire::ShortHeader;
/// let h = ShortHeader::new(640, 5, 128);
/// let seen = ShortHeader::parse(h.word(), 640).unwrap();
/// assert_eq!(seen.len(), 5);
/// assert_eq!(seen.ack(64), 128); // the last ack taken was 64
/// assert!(ShortHeader::parse(h.word(), 640 + 4096).is_none()); // another lap
/// assert!(ShortHeader::parse(0, 640).is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortHeader(u64);

impl ShortHeader {
    /// The header of a short packet at absolute position `pos` with `len` payload
    /// bytes (at most [`SHORT_PAYLOAD`]) and the piggybacked tail `ack` (a cell
    /// boundary, less than [`SHORT_ACK_SPAN`] past the ack sent last).
    pub const fn new(pos: u64, len: usize, ack: u64) -> ShortHeader {
        ShortHeader(
            (SHORT_TAG << TAG_SHIFT)
                | (((len as u64) & 0xf) << SHORT_LEN_SHIFT)
                | (((ack / CELL as u64) & SHORT_ACK_MASK) << SHORT_ACK_SHIFT)
                | ((pos / CELL as u64) & STAMP_MASK),
        )
    }

    /// `word` as the header of a short packet at `pos` in the current lap, if it is
    /// one. Its length may still be out of range: see [`len`](Self::len).
    #[inline]
    pub const fn parse(word: u64, pos: u64) -> Option<ShortHeader> {
        let expect = (SHORT_TAG << TAG_SHIFT) | ((pos / CELL as u64) & STAMP_MASK);
        if word & HEADER_MATCH_MASK == expect {
            Some(ShortHeader(word))
        } else {
            None
        }
    }

    /// The raw word.
    pub const fn word(self) -> u64 {
        self.0
    }

    /// Payload length in bytes: 0 to 15 as encoded; a correct sender writes 1 to
    /// [`SHORT_PAYLOAD`].
    #[allow(clippy::len_without_is_empty)]
    pub const fn len(self) -> usize {
        ((self.0 >> SHORT_LEN_SHIFT) & 0xf) as usize
    }

    /// The piggybacked tail, given `last`, the last ack taken from this peer (a cell
    /// boundary): the one position at or past `last`, within [`SHORT_ACK_SPAN`],
    /// whose cell number has the header's low 24 bits.
    pub const fn ack(self, last: u64) -> u64 {
        let low = (self.0 >> SHORT_ACK_SHIFT) & SHORT_ACK_MASK;
        let ahead = low.wrapping_sub(last / CELL as u64) & SHORT_ACK_MASK;
        last + ahead * CELL as u64
    }
}

/// The ack word of a full packet: `ack` (a cell boundary) with [`ACK_MARK`].
///
/// ```
/// use rdma_channel::ring::wire::{ack_word, is_ack_word};
/// assert!(is_ack_word(ack_word(0)) && is_ack_word(ack_word(1 << 40)));
/// assert!(!is_ack_word(0));
/// ```
pub const fn ack_word(ack: u64) -> u64 {
    ack | ACK_MARK
}

/// True when `word`, the second word of a packet whose header is a full one, is the
/// ack word of a full packet: it has landed, and no short packet is being written
/// there (module docs).
pub const fn is_ack_word(word: u64) -> bool {
    word & ACK_MARK != 0 && word >> TAG_SHIFT == 0
}

/// Why a header could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The buffer is shorter than a header.
    Truncated,
    /// The kind field is not a known [`PacketKind`].
    UnknownKind(u8),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated => write!(f, "packet header truncated"),
            WireError::UnknownKind(k) => write!(f, "unknown packet kind {k}"),
        }
    }
}

impl std::error::Error for WireError {}

/// Most buffers one zero-copy announcement names.
pub const MAX_RNDV_SEGS: usize = 16;
/// Bytes of a [`Rendezvous`] before its segment list.
pub const RNDV_FIXED: usize = 24;

/// [`Rendezvous`] flag: the first buffer goes zero-copy only because the receiver's
/// path advice asked for it (it is below the sender's fixed thresholds), so the
/// receiver splits it with the sender as it does for such transfers
/// ([`Fabric::zero_copy_adaptive_push_default`](crate::fabric::Fabric::zero_copy_adaptive_push_default)).
pub const RNDV_BY_ADVICE: u32 = 1;

/// Bytes of one segment entry of a [`Rendezvous`] (without rail keys).
pub const RNDV_SEG: usize = 24;

/// Bytes of an announcement of up to two segments without rail keys, the common
/// case, which the ends encode and decode in a buffer of this size on the stack.
pub(crate) const SMALL_RNDV: usize = RNDV_FIXED + 2 * RNDV_SEG;

/// Bytes of the largest announcement: [`MAX_RNDV_SEGS`] segments, each with keys for
/// every rail after rail 0.
pub(crate) const MAX_RNDV_LEN: usize =
    Rendezvous::encoded_len_with_keys(MAX_RNDV_SEGS, crate::config::MAX_RAILS - 1);

/// [`Rendezvous`] flags, bits 8-10: how many rails after rail 0 have a key of their
/// own in each segment entry (0: every rail reads with the segment's `rkey`). A
/// sender whose rails include one in another protection domain (another device)
/// registers each buffer there too and sends one key per rail after rail 0.
pub const RNDV_RAIL_KEYS_SHIFT: u32 = 8;
const RNDV_RAIL_KEYS_MASK: u32 = 0x7 << RNDV_RAIL_KEYS_SHIFT;

/// One buffer of a zero-copy announcement: where the receiver reads it from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RndvSeg {
    /// Address in the sender's address space.
    pub addr: u64,
    /// Length in bytes (never zero).
    pub len: u64,
    /// Remote key of a registration covering the buffer with REMOTE_READ.
    pub rkey: u32,
}

/// Why a rendezvous payload was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RndvError {
    /// Shorter than its fixed part or than its segment count says.
    Truncated,
    /// No segments, or more than [`MAX_RNDV_SEGS`].
    BadCount(u32),
    /// A zero-length segment, an address range that wraps, or a total that does not
    /// match the sum of the segments.
    BadLength,
}

impl fmt::Display for RndvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RndvError::Truncated => write!(f, "rendezvous announcement truncated"),
            RndvError::BadCount(n) => write!(f, "rendezvous with {n} segments"),
            RndvError::BadLength => write!(f, "rendezvous lengths inconsistent"),
        }
    }
}

impl std::error::Error for RndvError {}

/// A typed view over a zero-copy announcement (the payload of a
/// [`PacketKind::Rendezvous`] packet):
///
/// ```text
/// | id u64 | total u64 | count u32 | flags u32 | count x (addr u64, len u64, rkey u32, 0 u32, k x rail key u32) |
/// ```
///
/// where `k` is in the flags' bits 8-10 ([`RNDV_RAIL_KEYS_SHIFT`]): rail `r`'s key
/// of a segment, for rails 1 to `k`, when the sender's rails are in several
/// protection domains.
///
/// `id` numbers the sender's announcements from 1; the receiver reports `id` back in
/// its control word when it has read them all. `flags` says why the buffers go
/// zero-copy ([`RNDV_BY_ADVICE`]); a receiver ignores bits it does not know, and a
/// sender from before flags sends 0.
///
/// ```
/// use rdma_channel::ring::wire::{Rendezvous, RndvSeg};
/// let segs = [RndvSeg { addr: 0x1000, len: 300, rkey: 9 }, RndvSeg { addr: 0x9000, len: 1, rkey: 9 }];
/// let mut buf = [0u8; 96];
/// let n = Rendezvous::encode(&mut buf, 7, &segs);
/// let r = Rendezvous::new_checked(&buf[..n]).unwrap();
/// assert_eq!((r.id(), r.total(), r.count()), (7, 301, 2));
/// assert_eq!(r.seg(1), segs[1]);
/// assert!(Rendezvous::new_checked(&buf[..n - 1]).is_err());
/// ```
#[derive(Debug)]
pub struct Rendezvous<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Rendezvous<T> {
    /// Wraps `buffer` after checking every length and segment (so the accessors cannot
    /// panic and the segments describe exactly `total` bytes).
    ///
    /// # Errors
    ///
    /// The [`RndvError`] that applies.
    pub fn new_checked(buffer: T) -> Result<Rendezvous<T>, RndvError> {
        let b = buffer.as_ref();
        if b.len() < RNDV_FIXED {
            return Err(RndvError::Truncated);
        }
        let count = u32::from_le_bytes(b[16..20].try_into().unwrap());
        if count == 0 || count as usize > MAX_RNDV_SEGS {
            return Err(RndvError::BadCount(count));
        }
        let flags = u32::from_le_bytes(b[20..24].try_into().unwrap());
        let keys = ((flags & RNDV_RAIL_KEYS_MASK) >> RNDV_RAIL_KEYS_SHIFT) as usize;
        if b.len() != RNDV_FIXED + count as usize * (RNDV_SEG + 4 * keys) {
            return Err(RndvError::Truncated);
        }
        let view = Rendezvous { buffer };
        let mut sum = 0u64;
        for i in 0..count as usize {
            let s = view.seg(i);
            if s.len == 0 || s.addr.checked_add(s.len).is_none() {
                return Err(RndvError::BadLength);
            }
            sum = sum.checked_add(s.len).ok_or(RndvError::BadLength)?;
        }
        if sum != view.total() {
            return Err(RndvError::BadLength);
        }
        Ok(view)
    }

    /// The announcement's number.
    pub fn id(&self) -> u64 {
        u64::from_le_bytes(self.buffer.as_ref()[0..8].try_into().unwrap())
    }

    /// Bytes in all segments together.
    pub fn total(&self) -> u64 {
        u64::from_le_bytes(self.buffer.as_ref()[8..16].try_into().unwrap())
    }

    /// Number of segments.
    pub fn count(&self) -> usize {
        u32::from_le_bytes(self.buffer.as_ref()[16..20].try_into().unwrap()) as usize
    }

    /// The announcement's flags ([`RNDV_BY_ADVICE`]; other bits are reserved).
    pub fn flags(&self) -> u32 {
        u32::from_le_bytes(self.buffer.as_ref()[20..24].try_into().unwrap())
    }

    /// How many rails after rail 0 have keys of their own (0 to 7).
    pub fn rail_keys(&self) -> usize {
        ((self.flags() & RNDV_RAIL_KEYS_MASK) >> RNDV_RAIL_KEYS_SHIFT) as usize
    }

    /// Rail `rail`'s key of segment `i`: the segment's `rkey` for rail 0 or a rail
    /// without a key of its own (panics if `i >= count()`).
    pub fn rail_rkey(&self, i: usize, rail: usize) -> u32 {
        let k = self.rail_keys();
        if rail == 0 || rail > k {
            return self.seg(i).rkey;
        }
        let at = RNDV_FIXED + i * (RNDV_SEG + 4 * k) + RNDV_SEG + 4 * (rail - 1);
        u32::from_le_bytes(self.buffer.as_ref()[at..at + 4].try_into().unwrap())
    }

    /// Segment `i` (panics if `i >= count()`).
    pub fn seg(&self, i: usize) -> RndvSeg {
        let entry = RNDV_SEG + 4 * self.rail_keys();
        let b = &self.buffer.as_ref()[RNDV_FIXED + i * entry..][..RNDV_SEG];
        RndvSeg {
            addr: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            len: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            rkey: u32::from_le_bytes(b[16..20].try_into().unwrap()),
        }
    }
}

impl Rendezvous<&[u8]> {
    /// Bytes an announcement of `count` segments takes.
    ///
    /// ```
    /// assert_eq!(rdma_channel::ring::wire::Rendezvous::encoded_len(2), 72);
    /// ```
    pub const fn encoded_len(count: usize) -> usize {
        RNDV_FIXED + count * RNDV_SEG
    }

    /// Bytes an announcement of `count` segments with `keys` rail keys each takes.
    pub const fn encoded_len_with_keys(count: usize, keys: usize) -> usize {
        RNDV_FIXED + count * (RNDV_SEG + 4 * keys)
    }

    /// Writes segment `i` of an announcement whose entries carry `rail_keys.len()`
    /// rail keys (rails 1 on), for a sender encoding as it registers; then
    /// [`encode_fixed_with_keys`](Self::encode_fixed_with_keys). Panics if `out` is
    /// too short.
    ///
    /// ```
    /// use rdma_channel::ring::wire::{Rendezvous, RndvSeg};
    /// let seg = RndvSeg { addr: 0x1000, len: 64, rkey: 5 };
    /// let mut buf = [0u8; 64];
    /// Rendezvous::encode_seg_with_keys(&mut buf, 0, &seg, &[6, 7]);
    /// let n = Rendezvous::encode_fixed_with_keys(&mut buf, 3, 64, 1, 0, 2);
    /// let r = Rendezvous::new_checked(&buf[..n]).unwrap();
    /// assert_eq!((r.seg(0), r.rail_keys()), (seg, 2));
    /// assert_eq!((r.rail_rkey(0, 0), r.rail_rkey(0, 1), r.rail_rkey(0, 2)), (5, 6, 7));
    /// ```
    pub fn encode_seg_with_keys(out: &mut [u8], i: usize, s: &RndvSeg, rail_keys: &[u32]) {
        let entry = RNDV_SEG + 4 * rail_keys.len();
        let b = &mut out[RNDV_FIXED + i * entry..][..entry];
        b[0..8].copy_from_slice(&s.addr.to_le_bytes());
        b[8..16].copy_from_slice(&s.len.to_le_bytes());
        b[16..20].copy_from_slice(&s.rkey.to_le_bytes());
        b[20..24].fill(0);
        for (j, k) in rail_keys.iter().enumerate() {
            b[RNDV_SEG + 4 * j..][..4].copy_from_slice(&k.to_le_bytes());
        }
    }

    /// Writes the fixed part of an announcement of `count` segments with `keys` rail
    /// keys each (at most 7; the entries written by
    /// [`encode_seg_with_keys`](Self::encode_seg_with_keys)); returns its length.
    pub fn encode_fixed_with_keys(
        out: &mut [u8],
        id: u64,
        total: u64,
        count: usize,
        flags: u32,
        keys: usize,
    ) -> usize {
        assert!(keys <= 7);
        let flags = (flags & !RNDV_RAIL_KEYS_MASK) | ((keys as u32) << RNDV_RAIL_KEYS_SHIFT);
        Self::encode_fixed(out, id, total, count, flags);
        Self::encoded_len_with_keys(count, keys)
    }

    /// Writes an announcement into `out` and returns its length. Panics if `out` is
    /// shorter than [`encoded_len`](Self::encoded_len) or `segs` is empty or longer
    /// than [`MAX_RNDV_SEGS`] (the sender's own invariants).
    pub fn encode(out: &mut [u8], id: u64, segs: &[RndvSeg]) -> usize {
        Self::encode_with_flags(out, id, segs, 0)
    }

    /// As [`encode`](Self::encode), with `flags` ([`RNDV_BY_ADVICE`]).
    ///
    /// ```
    /// use rdma_channel::ring::wire::{Rendezvous, RndvSeg, RNDV_BY_ADVICE};
    /// let segs = [RndvSeg { addr: 0x1000, len: 300, rkey: 9 }];
    /// let mut buf = [0u8; 48];
    /// let n = Rendezvous::encode_with_flags(&mut buf, 1, &segs, RNDV_BY_ADVICE);
    /// assert_eq!(Rendezvous::new_checked(&buf[..n]).unwrap().flags(), RNDV_BY_ADVICE);
    /// ```
    pub fn encode_with_flags(out: &mut [u8], id: u64, segs: &[RndvSeg], flags: u32) -> usize {
        assert!(!segs.is_empty() && segs.len() <= MAX_RNDV_SEGS);
        for (i, s) in segs.iter().enumerate() {
            Self::encode_seg(out, i, s);
        }
        let total: u64 = segs.iter().map(|s| s.len).sum();
        Self::encode_fixed(out, id, total, segs.len(), flags)
    }

    /// Writes segment `i` of an announcement into `out`, for a sender that encodes
    /// its segments as it registers them and then calls
    /// [`encode_fixed`](Self::encode_fixed). Panics if `out` is too short for it.
    pub(crate) fn encode_seg(out: &mut [u8], i: usize, s: &RndvSeg) {
        let b = &mut out[RNDV_FIXED + i * RNDV_SEG..][..RNDV_SEG];
        b[0..8].copy_from_slice(&s.addr.to_le_bytes());
        b[8..16].copy_from_slice(&s.len.to_le_bytes());
        b[16..20].copy_from_slice(&s.rkey.to_le_bytes());
        b[20..24].fill(0);
    }

    /// Writes the fixed part of an announcement of `count` segments (written by
    /// [`encode_seg`](Self::encode_seg)) and `total` bytes; returns its length.
    /// Panics if `count` is 0 or above [`MAX_RNDV_SEGS`], or `out` is too short.
    pub(crate) fn encode_fixed(
        out: &mut [u8],
        id: u64,
        total: u64,
        count: usize,
        flags: u32,
    ) -> usize {
        assert!(count > 0 && count <= MAX_RNDV_SEGS);
        let n = Self::encoded_len(count);
        let out = &mut out[..n];
        out[0..8].copy_from_slice(&id.to_le_bytes());
        out[8..16].copy_from_slice(&total.to_le_bytes());
        out[16..20].copy_from_slice(&(count as u32).to_le_bytes());
        out[20..24].copy_from_slice(&flags.to_le_bytes());
        n
    }
}

#[cfg(test)]
mod rail_key_tests {
    use super::*;

    /// Announcements with 0 to 7 rail keys a segment round-trip; one byte short or
    /// long, or a key count the length does not match, is refused.
    #[test]
    fn rail_keys_are_checked_against_the_length() {
        let segs = [
            RndvSeg {
                addr: 0x1000,
                len: 10,
                rkey: 1,
            },
            RndvSeg {
                addr: 0x9000,
                len: 20,
                rkey: 2,
            },
        ];
        for k in 0..=7usize {
            let mut buf = [0u8; 512];
            for (i, s) in segs.iter().enumerate() {
                let keys: Vec<u32> = (0..k as u32).map(|r| 100 * (i as u32 + 1) + r).collect();
                Rendezvous::encode_seg_with_keys(&mut buf, i, s, &keys);
            }
            let n = Rendezvous::encode_fixed_with_keys(&mut buf, 9, 30, 2, RNDV_BY_ADVICE, k);
            assert_eq!(n, Rendezvous::encoded_len_with_keys(2, k));
            let r = Rendezvous::new_checked(&buf[..n]).unwrap();
            assert_eq!(
                (r.rail_keys(), r.seg(1), r.flags() & RNDV_BY_ADVICE),
                (k, segs[1], 1)
            );
            for rail in 1..=k {
                assert_eq!(r.rail_rkey(1, rail), 200 + rail as u32 - 1);
            }
            assert_eq!(r.rail_rkey(1, 0), 2);
            assert_eq!(
                Rendezvous::new_checked(&buf[..n - 1]).unwrap_err(),
                RndvError::Truncated
            );
            assert_eq!(
                Rendezvous::new_checked(&buf[..n + 4]).unwrap_err(),
                RndvError::Truncated
            );
        }
    }
}

/// A typed view over the 16 header bytes of a packet (header word and ack word).
///
/// ```
/// use rdma_channel::ring::wire::{Header, PacketKind};
/// let mut bytes = [0u8; 16];
/// Header::new_unchecked(&mut bytes[..]).fill(128, PacketKind::Data, 3, 640);
/// let h = Header::new_checked(&bytes[..]).unwrap();
/// assert_eq!(h.kind().unwrap(), PacketKind::Data);
/// assert_eq!(h.len(), 3);
/// assert_eq!(h.ack(), 640);
/// assert_eq!(h.ack_word(), 641); // marked: ACK_MARK
/// assert!(h.is_at(128));
/// assert!(!h.is_at(192));
/// ```
#[derive(Debug)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps a buffer without checking its length (the accessors may then panic).
    pub const fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }

    /// Wraps a buffer after checking it holds a whole header.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] for fewer than [`HEADER_LEN`] bytes.
    ///
    /// ```
    /// use rdma_channel::ring::wire::{Header, WireError};
    /// assert_eq!(Header::new_checked(&[0u8; 15][..]).unwrap_err(), WireError::Truncated);
    /// ```
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        Ok(Header { buffer })
    }

    /// The raw header word.
    pub fn word(&self) -> u64 {
        u64::from_le_bytes(self.buffer.as_ref()[0..8].try_into().unwrap())
    }

    /// True when the header belongs to a packet starting at `pos` in the current lap.
    pub fn is_at(&self, pos: u64) -> bool {
        self.word() & HEADER_MATCH_MASK == header_match(pos)
    }

    /// The packet kind.
    ///
    /// # Errors
    ///
    /// [`WireError::UnknownKind`] for a value outside [`PacketKind`].
    #[inline(always)]
    pub fn kind(&self) -> Result<PacketKind, WireError> {
        let bits = (self.word() >> KIND_SHIFT) & 0xf;
        PacketKind::from_bits(bits).ok_or(WireError::UnknownKind(bits as u8))
    }

    /// Payload length in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u32 {
        ((self.word() >> LEN_SHIFT) & 0xff_ffff) as u32
    }

    /// The raw ack word (the ack with [`ACK_MARK`]).
    pub fn ack_word(&self) -> u64 {
        u64::from_le_bytes(self.buffer.as_ref()[8..16].try_into().unwrap())
    }

    /// The piggybacked tail of the reverse ring.
    pub fn ack(&self) -> u64 {
        self.ack_word() & !ACK_MARK
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Writes a header for a packet at `pos`, with `ack` (a cell boundary) marked.
    pub fn fill(&mut self, pos: u64, kind: PacketKind, len: u32, ack: u64) {
        let b = self.buffer.as_mut();
        b[0..8].copy_from_slice(&header_word(pos, kind, len).to_le_bytes());
        b[8..16].copy_from_slice(&ack_word(ack).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_differ_between_laps_for_any_ring_size_up_to_256_gib() {
        for ring_cells in [64u64, 1 << 10, 1 << 20, (1 << 32) - 1] {
            let ring = ring_cells * CELL as u64;
            for pos in [0u64, 64, 1 << 40] {
                assert_ne!(header_match(pos), header_match(pos + ring));
            }
        }
    }

    #[test]
    fn zeroed_memory_is_never_a_header_or_trailer() {
        let zero = std::hint::black_box(0u64);
        for pos in (0..1 << 20).step_by(CELL) {
            assert_ne!(zero & HEADER_MATCH_MASK, header_match(pos));
            assert_ne!(zero, trailer_word(pos + CELL as u64));
        }
    }

    #[test]
    fn length_and_kind_round_trip() {
        let mut b = [0u8; 16];
        Header::new_unchecked(&mut b[..]).fill(
            1 << 33,
            PacketKind::Pad,
            MAX_PAYLOAD as u32,
            u64::MAX,
        );
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(h.kind(), Ok(PacketKind::Pad));
        assert_eq!(h.len() as usize, MAX_PAYLOAD);
        assert_eq!(h.ack(), u64::MAX - 1);
        assert!(!is_ack_word(h.ack_word())); // not a position a ring reaches
    }

    #[test]
    fn rendezvous_rejects_inconsistent_announcements() {
        let segs = [RndvSeg {
            addr: 64,
            len: 10,
            rkey: 1,
        }];
        let mut b = [0u8; 56];
        let n = Rendezvous::encode(&mut b, 1, &segs);
        assert!(Rendezvous::new_checked(&b[..n]).is_ok());
        let mut bad = b;
        bad[8] = 11; // total no longer matches
        assert_eq!(
            Rendezvous::new_checked(&bad[..n]).unwrap_err(),
            RndvError::BadLength
        );
        let mut bad = b;
        bad[16] = 0; // no segments
        assert_eq!(
            Rendezvous::new_checked(&bad[..n]).unwrap_err(),
            RndvError::BadCount(0)
        );
        let mut bad = b;
        bad[24..32].copy_from_slice(&u64::MAX.to_le_bytes()); // wraps
        assert_eq!(
            Rendezvous::new_checked(&bad[..n]).unwrap_err(),
            RndvError::BadLength
        );
        assert_eq!(
            Rendezvous::new_checked(&b[..n + 8]).unwrap_err(),
            RndvError::Truncated
        );
    }

    #[test]
    fn short_acks_are_exact_within_the_span_and_never_past_the_real_tail() {
        for last in [0u64, 64, SHORT_ACK_SPAN - 64, 5 * SHORT_ACK_SPAN + 640] {
            for ahead in [0u64, 64, 4096, SHORT_ACK_SPAN - 64] {
                let h = ShortHeader::new(1 << 20, 8, last + ahead);
                assert_eq!(h.ack(last), last + ahead, "last {last}, ahead {ahead}");
            }
        }
    }

    #[test]
    fn a_full_packets_ack_word_is_never_a_short_header_nor_zero() {
        // The word after a full header is its ack, a position below 2^60, marked.
        for ack in [0u64, 64, 1 << 40, (1 << 60) - 64] {
            let word = ack_word(ack);
            assert!(is_ack_word(word) && word != 0);
            for pos in [0u64, 64, ack, ack / 128 * 64] {
                assert_eq!(ShortHeader::parse(word, pos), None);
                assert!(!is_ack_word(ShortHeader::new(pos, 8, ack).word()));
            }
        }
        assert_ne!(SHORT_TAG, TAG);
    }

    #[test]
    fn short_headers_round_trip_every_length_and_differ_between_laps() {
        for len in 1..=SHORT_PAYLOAD {
            let h = ShortHeader::new(4096, len, 0);
            assert_eq!(ShortHeader::parse(h.word(), 4096).unwrap().len(), len);
            assert_eq!(ShortHeader::parse(h.word(), 4096 + (1 << 20)), None);
            // Not a full header either.
            assert_ne!(h.word() & HEADER_MATCH_MASK, header_match(4096));
        }
    }

    #[test]
    fn unknown_kind_is_an_error() {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&(header_match(0) | (7 << KIND_SHIFT)).to_le_bytes());
        assert_eq!(
            Header::new_checked(&b[..]).unwrap().kind(),
            Err(WireError::UnknownKind(7))
        );
    }
}
