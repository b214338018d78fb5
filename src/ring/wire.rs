//! The packet format inside a ring: typed views over bytes, no I/O.
//!
//! A packet occupies whole 64-byte *cells* and is written by one RDMA WRITE:
//!
//! ```text
//!  cell 0                                   ...          last cell
//! +--------+--------+---------------------- ... -------+-----+---------+
//! | header |  ack   | payload (len bytes)               | pad | trailer |
//! +--------+--------+---------------------- ... -------+-----+---------+
//!   8 B      8 B                                               8 B
//! ```
//!
//! * `header` = tag (4 bits) | kind (4) | payload length (24) | stamp (32), where the
//!   stamp is the low 32 bits of the packet's absolute cell number. A header from an
//!   earlier lap at the same place carries another stamp, so it never looks new.
//! * `ack` is the piggybacked tail of the reverse direction's ring (seed 001 sec. 4.3).
//! * `trailer` = [`TRAILER_KEY`] xor the absolute byte position where the packet ends.
//!   It is the last aligned word of the write, so when it is visible the whole packet is
//!   (the fabric's ordering guarantee 2).
//!
//! Payload bytes are the user's and can hold any value, including a valid-looking
//! header or trailer; the receiver zeroes the words where headers and trailers can
//! stand before it frees space ([`crate::ring::boundary_offsets`]), so neither stale
//! bytes nor such payload can fool it.

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
/// Payload that fits in a one-cell packet.
pub const ONE_CELL_PAYLOAD: usize = CELL - OVERHEAD;

const TAG: u64 = 0xA;
const TAG_SHIFT: u32 = 60;
const KIND_SHIFT: u32 = 56;
const LEN_SHIFT: u32 = 32;
const STAMP_MASK: u64 = 0xffff_ffff;
/// Bits of a header word that say "a packet starts here in this lap".
pub const HEADER_MATCH_MASK: u64 = (0xf << TAG_SHIFT) | STAMP_MASK;
/// Mixed into trailers so that zero-filled memory never holds a valid trailer.
pub const TRAILER_KEY: u64 = 0xC3A5_96E1_5A0F_7B2D;

/// What a packet carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketKind {
    /// Stream bytes.
    Data = 1,
    /// Filler that carries no stream bytes (skipped by the reader).
    Pad = 2,
}

impl PacketKind {
    fn from_bits(bits: u64) -> Option<PacketKind> {
        match bits {
            1 => Some(PacketKind::Data),
            2 => Some(PacketKind::Pad),
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

/// Why a header could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The buffer is shorter than a header.
    Truncated,
    /// The kind field is not a known [`PacketKind`].
    UnknownKind(u8),
    /// The length does not fit the cell count the ring allows.
    BadLength(u32),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated => write!(f, "packet header truncated"),
            WireError::UnknownKind(k) => write!(f, "unknown packet kind {k}"),
            WireError::BadLength(l) => write!(f, "packet length {l} exceeds the chunk limit"),
        }
    }
}

impl std::error::Error for WireError {}

/// A typed view over the 16 header bytes of a packet (header word and ack word).
///
/// ```
/// use rdma_channel::ring::wire::{Header, PacketKind};
/// let mut bytes = [0u8; 16];
/// Header::new_unchecked(&mut bytes[..]).fill(128, PacketKind::Data, 3, 77);
/// let h = Header::new_checked(&bytes[..]).unwrap();
/// assert_eq!(h.kind().unwrap(), PacketKind::Data);
/// assert_eq!(h.len(), 3);
/// assert_eq!(h.ack(), 77);
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
    pub fn kind(&self) -> Result<PacketKind, WireError> {
        let bits = (self.word() >> KIND_SHIFT) & 0xf;
        PacketKind::from_bits(bits).ok_or(WireError::UnknownKind(bits as u8))
    }

    /// Payload length in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u32 {
        ((self.word() >> LEN_SHIFT) & 0xff_ffff) as u32
    }

    /// The piggybacked tail of the reverse ring.
    pub fn ack(&self) -> u64 {
        u64::from_le_bytes(self.buffer.as_ref()[8..16].try_into().unwrap())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Writes a header for a packet at `pos`.
    pub fn fill(&mut self, pos: u64, kind: PacketKind, len: u32, ack: u64) {
        let b = self.buffer.as_mut();
        b[0..8].copy_from_slice(&header_word(pos, kind, len).to_le_bytes());
        b[8..16].copy_from_slice(&ack.to_le_bytes());
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
        assert_eq!(h.ack(), u64::MAX);
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
