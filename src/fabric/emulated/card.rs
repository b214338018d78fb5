//! The emulated fabric's connection card: what one end tells the other.
//!
//! Bytes (all little-endian):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `"RDMAEMU1"` |
//! | 8 | 1 | layout version (of the card and the domain segment) |
//! | 9 | 3 | reserved, 0 |
//! | 12 | 4 | owner pid |
//! | 16 | 8 | domain id |
//! | 24 | 4 | queue-pair key |
//! | 28 | 4 | the owner's descriptor number of the domain segment |
//! | 32 | 8 | domain layout size |
//! | 40 | 4 | number of segment records `n` |
//! | 44 | 4 | reserved, 0 |
//! | 48 | 16 n | `n` records: slot (4), generation (4), length (8) |
//!
//! Descriptors: the domain segment first, then one per segment record, in order.
//! At most [`MAX_CARD_FDS`](crate::fabric::MAX_CARD_FDS) descriptors travel (the kernel's limit for
//! one message); segments beyond that are opened later through `/proc`.

use super::table::{LAYOUT_SIZE, MAGIC, SEG_CAPACITY, VERSION};
use crate::fabric::MAX_CARD_FDS;
use crate::wire::{card_fields, le, CardFormat};
use std::io;

const MAGIC_BYTES: [u8; 8] = MAGIC.to_le_bytes();
const _: () = assert!(
    VERSION <= u8::MAX as u32,
    "the card carries the version in a byte"
);

/// Magic `RDMAEMU1` (the domain segment's), then the layout version.
pub(crate) const FORMAT: CardFormat = CardFormat {
    name: "emulated fabric card",
    magic: &MAGIC_BYTES,
    version: VERSION as u8,
};
/// Bytes before the segment records.
const HEAD: usize = 48;
/// Bytes per segment record: slot (4), generation (4), length (8).
const RECORD: usize = 16;

/// A live data segment as listed in a card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CardSegment {
    /// Segment slot.
    pub(crate) slot: u32,
    /// Segment generation.
    pub(crate) gen: u32,
    /// Length in bytes.
    pub(crate) len: u64,
}

/// An emulated fabric card over a byte buffer.
pub(crate) struct EmuCard<T: AsRef<[u8]>> {
    buf: T,
}

// The layout of the table above; the segment records follow at HEAD.
card_fields!(EmuCard {
    reserved_a/set_reserved_a: u16 @ 9, reserved_c/set_reserved_c: u8 @ 11,
    reserved_b/set_reserved_b: u32 @ 44, pid/set_pid: u32 @ 12,
    domain_id/set_domain_id: u64 @ 16, qp_key/set_qp_key: u32 @ 24,
    domain_fd/set_domain_fd: u32 @ 28, layout_size/set_layout_size: u64 @ 32,
    records/set_records: u32 @ 40,
});

impl<T: AsRef<[u8]>> EmuCard<T> {
    /// Checks a card that arrived with `fds` descriptors: magic, version, layout
    /// size, record count against length and descriptors, reserved fields, pid, key
    /// and every segment record.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidData`] ("bad emulated fabric card: ...") naming the
    /// fault.
    pub(crate) fn new_checked(buf: T, fds: usize) -> io::Result<EmuCard<T>> {
        let len = buf.as_ref().len();
        FORMAT.check(buf.as_ref(), HEAD)?;
        let card = EmuCard { buf };
        let layout = card.layout_size();
        if layout != LAYOUT_SIZE as u64 {
            return Err(FORMAT.invalid(format_args!(
                "domain layout of {layout} bytes, expected {LAYOUT_SIZE}"
            )));
        }
        let n = card.records() as usize;
        if n >= MAX_CARD_FDS {
            return Err(FORMAT.invalid(format_args!(
                "{n} segment records, at most {} fit",
                MAX_CARD_FDS - 1
            )));
        }
        if len != HEAD + RECORD * n {
            return Err(FORMAT.invalid(format_args!(
                "{len} bytes for {n} segment records, expected {}",
                HEAD + RECORD * n
            )));
        }
        if fds != n + 1 {
            return Err(FORMAT.invalid(format_args!(
                "{fds} descriptors arrived, the card needs {} (domain + {n} segments)",
                n + 1
            )));
        }
        if card.reserved_a() != 0 || card.reserved_c() != 0 || card.reserved_b() != 0 {
            return Err(FORMAT.invalid("reserved field is not zero"));
        }
        let pid = card.pid();
        if pid == 0 || pid > i32::MAX as u32 {
            return Err(FORMAT.invalid(format_args!("bad process id {pid}")));
        }
        if card.qp_key() == 0 {
            return Err(FORMAT.invalid("queue-pair key 0"));
        }
        for i in 0..n {
            let s = card.segment(i);
            if s.slot >= SEG_CAPACITY || s.gen == 0 || s.len == 0 {
                return Err(FORMAT.invalid(format_args!("bad segment record {i}: {s:?}")));
            }
        }
        Ok(card)
    }

    /// Segment record `i`.
    pub(crate) fn segment(&self, i: usize) -> CardSegment {
        let (b, at) = (self.buf.as_ref(), HEAD + RECORD * i);
        CardSegment {
            slot: le::u32(b, at),
            gen: le::u32(b, at + 4),
            len: le::u64(b, at + 8),
        }
    }
}

/// The decoded bytes of a card.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CardInfo {
    /// Owner process id.
    pub(crate) pid: u32,
    /// Owner domain id.
    pub(crate) domain_id: u64,
    /// Queue-pair key (index in the low 16 bits).
    pub(crate) qp_key: u32,
    /// The owner's descriptor number of its domain segment.
    pub(crate) domain_fd: u32,
    /// Segments whose descriptors follow the domain segment's.
    pub(crate) segments: Vec<CardSegment>,
}

impl CardInfo {
    /// Serialises the card's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut card = EmuCard {
            buf: vec![0u8; HEAD + RECORD * self.segments.len()],
        };
        FORMAT.emit(&mut card.buf);
        card.set_pid(self.pid);
        card.set_domain_id(self.domain_id);
        card.set_qp_key(self.qp_key);
        card.set_domain_fd(self.domain_fd);
        card.set_layout_size(LAYOUT_SIZE as u64);
        card.set_records(self.segments.len() as u32);
        for (i, s) in self.segments.iter().enumerate() {
            let at = HEAD + RECORD * i;
            le::set_u32(&mut card.buf, at, s.slot);
            le::set_u32(&mut card.buf, at + 4, s.gen);
            le::set_u64(&mut card.buf, at + 8, s.len);
        }
        card.buf
    }

    /// Parses and validates card bytes that arrived with `fds` descriptors (see
    /// [`EmuCard::new_checked`]).
    ///
    /// # Errors
    ///
    /// `InvalidData` naming what is wrong.
    pub(crate) fn decode(b: &[u8], fds: usize) -> io::Result<CardInfo> {
        let card = EmuCard::new_checked(b, fds)?;
        Ok(CardInfo {
            pid: card.pid(),
            domain_id: card.domain_id(),
            qp_key: card.qp_key(),
            domain_fd: card.domain_fd(),
            segments: (0..card.records() as usize)
                .map(|i| card.segment(i))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CardInfo {
        CardInfo {
            pid: 1234,
            domain_id: 0x4d2_0000_0007,
            qp_key: 0x1_0003,
            domain_fd: 9,
            segments: vec![
                CardSegment {
                    slot: 0,
                    gen: 1,
                    len: 4096,
                },
                CardSegment {
                    slot: 5,
                    gen: 9,
                    len: 1 << 20,
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let c = sample();
        assert_eq!(CardInfo::decode(&c.encode(), 3).unwrap(), c);
    }

    #[test]
    fn malformed_cards_are_invalid_data_with_a_reason() {
        let good = sample().encode();
        let check = |b: &[u8], fds: usize, needle: &str| {
            let e = CardInfo::decode(b, fds).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(
                e.to_string().contains(needle),
                "{e} should mention {needle}"
            );
        };
        check(&good[..10], 3, "at least");
        let mut b = good.clone();
        b[10] = 1;
        check(&b, 3, "reserved");
        let mut b = good.clone();
        b[0] ^= 1;
        check(&b, 3, "magic");
        let mut b = good.clone();
        b[8] = 99;
        check(&b, 3, "version");
        check(&good[..good.len() - 1], 3, "expected");
        check(&good, 2, "descriptors");
        let mut b = good.clone();
        b[HEAD..HEAD + 4].copy_from_slice(&SEG_CAPACITY.to_le_bytes());
        check(&b, 3, "segment record 0");
        let mut b = good.clone();
        b[40..44].copy_from_slice(&1000u32.to_le_bytes());
        check(&b, 3, "at most");
        let mut b = good;
        b[24..28].copy_from_slice(&0u32.to_le_bytes());
        check(&b, 3, "key 0");
    }
}
