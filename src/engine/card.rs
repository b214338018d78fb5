//! The connection card: what one end tells the other about its incoming ring and its
//! control words, followed by the fabric's own card (queue pair addressing, shared
//! memory segments). A typed view over bytes, in the manner of `ring::wire`.
//!
//! Layout (32 bytes and the fabric card, little-endian integers):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `RCHC` |
//! | 4 | 1 | version (2) |
//! | 5 | 1 | log2 of the ring size (12 ..= 30: 4 KiB ..= 1 GiB) |
//! | 6 | 2 | length of the fabric card |
//! | 8 | 8 | ring address (64-byte aligned) |
//! | 16 | 4 | ring remote key |
//! | 20 | 4 | control region remote key |
//! | 24 | 8 | control region address (64-byte aligned, [`CTRL_SIZE`] bytes) |
//! | 32 | n | fabric card |
//!
//! It is this small so that it fits, with the fabric's 6-byte rdma_cm card and a
//! process group's hello, in the 56 bytes of private data an InfiniBand / RoCE
//! connection request carries (see `handshake::cm`).

use std::io;

use crate::fabric::RemoteRegion;

pub use crate::ring::memory::CTRL_SIZE;

const MAGIC: &[u8; 4] = b"RCHC";
const VERSION: u8 = 2;
/// Bytes before the fabric card.
pub const HEADER_LEN: usize = 32;
const MIN_RING_LOG2: u8 = 12;
const MAX_RING_LOG2: u8 = 30;

fn invalid(msg: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("bad connection card: {msg}"),
    )
}

/// A connection card over a byte buffer.
///
/// ```
/// use rdma_channel::engine::card::ConnCard;
/// use rdma_channel::fabric::RemoteRegion;
/// let ring = RemoteRegion { addr: 0x10000, len: 1 << 20, rkey: 7 };
/// let ctrl = RemoteRegion { addr: 0x20000, len: 4096, rkey: 8 };
/// let bytes = ConnCard::encode(ring, ctrl, b"fabric")?;
/// let card = ConnCard::new_checked(&bytes[..])?;
/// assert_eq!((card.ring(), card.ctrl(), card.fabric_card()), (ring, ctrl, &b"fabric"[..]));
/// assert!(ConnCard::new_checked(&bytes[..31]).is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ConnCard<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> ConnCard<T> {
    /// Checks everything a peer could get wrong: length, magic, version, ring size,
    /// alignment, and that the buffer holds exactly the header and the fabric card.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidData`] ("bad connection card: ...") naming the fault.
    pub fn new_checked(buf: T) -> io::Result<ConnCard<T>> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN || &b[0..4] != MAGIC {
            return Err(invalid("not an rdma-channel card"));
        }
        if b[4] != VERSION {
            return Err(invalid(format_args!(
                "version {}, expected {VERSION} (both ends must run the same rdma-channel)",
                b[4]
            )));
        }
        if !(MIN_RING_LOG2..=MAX_RING_LOG2).contains(&b[5]) {
            return Err(invalid(format_args!(
                "ring size 2^{} outside 4 KiB ..= 1 GiB",
                b[5]
            )));
        }
        let flen = usize::from(u16::from_le_bytes([b[6], b[7]]));
        if b.len() != HEADER_LEN + flen {
            return Err(invalid(format_args!(
                "{} bytes, expected {} for a {flen}-byte fabric card",
                b.len(),
                HEADER_LEN + flen
            )));
        }
        let card = ConnCard { buf };
        if card.ring().addr % 64 != 0 || card.ctrl().addr % 64 != 0 {
            return Err(invalid("ring or control region not 64-byte aligned"));
        }
        Ok(card)
    }

    fn u64_at(&self, o: usize) -> u64 {
        let b = self.buf.as_ref();
        u64::from_le_bytes(b[o..o + 8].try_into().expect("checked length"))
    }

    fn u32_at(&self, o: usize) -> u32 {
        let b = self.buf.as_ref();
        u32::from_le_bytes(b[o..o + 4].try_into().expect("checked length"))
    }

    /// The peer's incoming ring (we write into it).
    pub fn ring(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.u64_at(8),
            len: 1 << self.buf.as_ref()[5],
            rkey: self.u32_at(16),
        }
    }

    /// The peer's control words.
    pub fn ctrl(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.u64_at(24),
            len: CTRL_SIZE as u64,
            rkey: self.u32_at(20),
        }
    }

    /// The fabric's part of the card.
    pub fn fabric_card(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..]
    }
}

impl ConnCard<&[u8]> {
    /// Encodes a card.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidInput`] for a ring that is not a power of two in
    /// 4 KiB ..= 1 GiB, a control region of another size, or a fabric card over 64 KiB.
    pub fn encode(ring: RemoteRegion, ctrl: RemoteRegion, fabric: &[u8]) -> io::Result<Vec<u8>> {
        let log2 = ring.len.trailing_zeros() as u8;
        if !ring.len.is_power_of_two() || !(MIN_RING_LOG2..=MAX_RING_LOG2).contains(&log2) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ring of {} bytes cannot be carried in a card", ring.len),
            ));
        }
        let flen = u16::try_from(fabric.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "fabric card over 64 KiB"))?;
        if ctrl.len != CTRL_SIZE as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("control region of {} bytes, expected {CTRL_SIZE}", ctrl.len),
            ));
        }
        let mut b = Vec::with_capacity(HEADER_LEN + fabric.len());
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        b.push(log2);
        b.extend_from_slice(&flen.to_le_bytes());
        b.extend_from_slice(&ring.addr.to_le_bytes());
        b.extend_from_slice(&ring.rkey.to_le_bytes());
        b.extend_from_slice(&ctrl.rkey.to_le_bytes());
        b.extend_from_slice(&ctrl.addr.to_le_bytes());
        b.extend_from_slice(fabric);
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> Vec<u8> {
        let ring = RemoteRegion {
            addr: 1 << 20,
            len: 1 << 22,
            rkey: 0xaabb,
        };
        let ctrl = RemoteRegion {
            addr: 2 << 20,
            len: CTRL_SIZE as u64,
            rkey: 0xccdd,
        };
        ConnCard::encode(ring, ctrl, b"RCHVcm").unwrap()
    }

    #[test]
    fn round_trips() {
        let b = good();
        assert_eq!(b.len(), HEADER_LEN + 6);
        let c = ConnCard::new_checked(&b[..]).unwrap();
        assert_eq!(c.ring().len, 1 << 22);
        assert_eq!(c.ring().rkey, 0xaabb);
        assert_eq!(c.ctrl().addr, 2 << 20);
        assert_eq!(c.fabric_card(), b"RCHVcm");
    }

    #[test]
    fn every_truncation_and_bad_field_is_refused() {
        let b = good();
        for n in 0..b.len() {
            assert!(ConnCard::new_checked(&b[..n]).is_err(), "length {n}");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(ConnCard::new_checked(&longer[..]).is_err());
        for (i, v, what) in [
            (0, b'X', "not an rdma-channel card"),
            (4, 1, "version 1"),
            (5, 11, "ring size"),
            (5, 31, "ring size"),
            (8, 1, "aligned"),
            (24, 8, "aligned"),
        ] {
            let mut c = b.clone();
            c[i] = v;
            let e = ConnCard::new_checked(&c[..]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains(what), "{e} should say {what}");
        }
    }

    #[test]
    fn encode_refuses_what_the_format_cannot_hold() {
        let ctrl = RemoteRegion {
            addr: 0,
            len: CTRL_SIZE as u64,
            rkey: 0,
        };
        let ring = |len| RemoteRegion {
            addr: 0,
            len,
            rkey: 0,
        };
        assert!(ConnCard::encode(ring(3 << 12), ctrl, &[]).is_err());
        assert!(ConnCard::encode(ring(1 << 31), ctrl, &[]).is_err());
        assert!(ConnCard::encode(ring(1 << 12), ctrl, &[0; 70_000]).is_err());
        assert!(ConnCard::encode(ring(1 << 12), ring(4096 * 2), &[]).is_err());
    }
}
