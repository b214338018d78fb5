//! The emulated fabric's connection card: what one end tells the other.
//!
//! Bytes (all little-endian):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `"RDMAEMU1"` |
//! | 8 | 4 | layout version |
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
use std::io;

/// Bytes before the segment records.
const HEAD: usize = 48;
/// Bytes per segment record.
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

fn invalid(msg: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("emulated fabric card: {msg}"),
    )
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl CardInfo {
    /// Serialises the card's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEAD + RECORD * self.segments.len());
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.domain_id.to_le_bytes());
        b.extend_from_slice(&self.qp_key.to_le_bytes());
        b.extend_from_slice(&self.domain_fd.to_le_bytes());
        b.extend_from_slice(&(LAYOUT_SIZE as u64).to_le_bytes());
        b.extend_from_slice(&(self.segments.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        for s in &self.segments {
            b.extend_from_slice(&s.slot.to_le_bytes());
            b.extend_from_slice(&s.gen.to_le_bytes());
            b.extend_from_slice(&s.len.to_le_bytes());
        }
        b
    }

    /// Parses and validates card bytes that arrived with `fds` descriptors.
    ///
    /// # Errors
    ///
    /// `InvalidData` naming what is wrong: not a card of this fabric, another layout
    /// version, a length or descriptor count that does not match, a bad record.
    pub(crate) fn decode(b: &[u8], fds: usize) -> io::Result<CardInfo> {
        if b.len() < HEAD {
            return Err(invalid(format!(
                "{} bytes, a card has at least {HEAD}",
                b.len()
            )));
        }
        let magic = u64_at(b, 0);
        if magic != MAGIC {
            return Err(invalid(format!(
                "bad magic {magic:#018x} (not a card of the emulated fabric)"
            )));
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(invalid(format!(
                "layout version {version}, this build speaks {VERSION}"
            )));
        }
        let layout = u64_at(b, 32);
        if layout != LAYOUT_SIZE as u64 {
            return Err(invalid(format!(
                "domain layout of {layout} bytes, expected {LAYOUT_SIZE}"
            )));
        }
        let n = u32_at(b, 40) as usize;
        if n >= crate::fabric::MAX_CARD_FDS {
            return Err(invalid(format!(
                "{n} segment records, at most {} fit",
                crate::fabric::MAX_CARD_FDS - 1
            )));
        }
        if b.len() != HEAD + RECORD * n {
            return Err(invalid(format!(
                "{} bytes for {n} segment records, expected {}",
                b.len(),
                HEAD + RECORD * n
            )));
        }
        if fds != n + 1 {
            return Err(invalid(format!(
                "{fds} descriptors arrived, the card needs {} (domain + {n} segments)",
                n + 1
            )));
        }
        if u32_at(b, 44) != 0 {
            return Err(invalid("reserved field is not zero".into()));
        }
        let pid = u32_at(b, 12);
        if pid == 0 || pid > i32::MAX as u32 {
            return Err(invalid(format!("bad process id {pid}")));
        }
        let qp_key = u32_at(b, 24);
        if qp_key == 0 {
            return Err(invalid("queue-pair key 0".into()));
        }
        let mut segments = Vec::with_capacity(n);
        for i in 0..n {
            let at = HEAD + RECORD * i;
            let s = CardSegment {
                slot: u32_at(b, at),
                gen: u32_at(b, at + 4),
                len: u64_at(b, at + 8),
            };
            if s.slot >= SEG_CAPACITY || s.gen == 0 || s.len == 0 {
                return Err(invalid(format!("bad segment record {i}: {s:?}")));
            }
            segments.push(s);
        }
        Ok(CardInfo {
            pid,
            domain_id: u64_at(b, 16),
            qp_key,
            domain_fd: u32_at(b, 28),
            segments,
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
