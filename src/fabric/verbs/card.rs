//! The verbs connection card: what one end of an RC connection tells the other.
//!
//! Layout (36 bytes, little-endian integers):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `RCHV` |
//! | 4 | 1 | version (1) |
//! | 5 | 1 | reserved (0) |
//! | 6 | 1 | link layer (1 InfiniBand, 2 Ethernet) |
//! | 7 | 1 | active MTU (`ibv_mtu`, 1..=5) |
//! | 8 | 2 | LID |
//! | 10 | 4 | QP number (24 bits) |
//! | 14 | 4 | first packet sequence number (24 bits) |
//! | 18 | 1 | RDMA READs this end accepts in flight (`max_dest_rd_atomic`) |
//! | 19 | 1 | reserved (0) |
//! | 20 | 16 | GID (network byte order, as the device reports it) |
//!
//! A queue pair connected by rdma_cm has the 6-byte card [`CM_CARD`] instead.

use std::io;

use crate::wire::{card_fields, CardFormat};

/// Magic `RCHV`, version 1.
pub(crate) const FORMAT: CardFormat = CardFormat {
    name: "verbs card",
    magic: b"RCHV",
    version: 1,
};
/// The whole card of a queue pair that rdma_cm connects: the connection manager
/// exchanges addressing itself, so only the fabric's magic and a marker travel.
pub(crate) const CM_CARD: &[u8; 6] = b"RCHVcm";
/// Length of an encoded card.
pub(crate) const CARD_LEN: usize = 36;
/// Where the GID lies.
const GID: std::ops::Range<usize> = 20..36;

/// `IBV_LINK_LAYER_INFINIBAND` (an anonymous enum in `verbs.h`).
pub(crate) const LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

/// A verbs card over a byte buffer.
pub(crate) struct VerbsCard<T: AsRef<[u8]>> {
    buf: T,
}

// The layout of the table above (`mtu_code` is an `ibv_mtu`); the GID is 20..36.
card_fields!(VerbsCard {
    reserved_a/set_reserved_a: u8 @ 5, reserved_b/set_reserved_b: u8 @ 19,
    link_layer/set_link_layer: u8 @ 6, mtu_code/set_mtu_code: u8 @ 7, lid/set_lid: u16 @ 8,
    qpn/set_qpn: u32 @ 10, psn/set_psn: u32 @ 14, rd_atomic/set_rd_atomic: u8 @ 18,
});

impl<T: AsRef<[u8]>> VerbsCard<T> {
    /// Checks length, magic, version, reserved bytes, link layer, MTU, QP number,
    /// PSN, and that the address can reach something.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidData`] ("bad verbs card: ...") naming the fault.
    pub(crate) fn new_checked(buf: T) -> io::Result<VerbsCard<T>> {
        let len = buf.as_ref().len();
        FORMAT.check(buf.as_ref(), CARD_LEN)?;
        if len != CARD_LEN {
            return Err(FORMAT.invalid(format_args!("{len} bytes, expected {CARD_LEN}")));
        }
        let card = VerbsCard { buf };
        if card.reserved_a() != 0 || card.reserved_b() != 0 {
            return Err(FORMAT.invalid("reserved byte is not zero"));
        }
        let (ll, mtu, qpn, psn) = (card.link_layer(), card.mtu_code(), card.qpn(), card.psn());
        if ll != LINK_LAYER_INFINIBAND && ll != LINK_LAYER_ETHERNET {
            return Err(FORMAT.invalid(format_args!("unknown link layer {ll}")));
        }
        if !(1..=5).contains(&mtu) {
            return Err(FORMAT.invalid(format_args!("MTU code {mtu} is not 1..=5")));
        }
        if qpn == 0 || qpn > 0xff_ffff {
            return Err(FORMAT.invalid(format_args!("QP number {qpn:#x} out of range")));
        }
        if psn > 0xff_ffff {
            return Err(FORMAT.invalid(format_args!("PSN {psn:#x} wider than 24 bits")));
        }
        if ll == LINK_LAYER_ETHERNET && card.gid() == [0; 16] {
            return Err(FORMAT.invalid("RoCE peer with a zero GID"));
        }
        if ll == LINK_LAYER_INFINIBAND && card.lid() == 0 && card.gid() == [0; 16] {
            return Err(FORMAT.invalid("InfiniBand peer with neither LID nor GID"));
        }
        Ok(card)
    }

    /// The GID, in network byte order.
    pub(crate) fn gid(&self) -> [u8; 16] {
        self.buf.as_ref()[GID].try_into().expect("16 bytes")
    }
}

/// The decoded contents of a verbs card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpCard {
    pub link_layer: u8,
    pub mtu: u32,
    pub lid: u16,
    pub qpn: u32,
    pub psn: u32,
    pub rd_atomic: u8,
    pub gid: [u8; 16],
}

impl QpCard {
    /// Encodes the card.
    pub(crate) fn to_bytes(self) -> Vec<u8> {
        let mut card = VerbsCard {
            buf: vec![0u8; CARD_LEN],
        };
        FORMAT.emit(&mut card.buf);
        card.set_link_layer(self.link_layer);
        card.set_mtu_code(self.mtu as u8);
        card.set_lid(self.lid);
        card.set_qpn(self.qpn);
        card.set_psn(self.psn);
        card.set_rd_atomic(self.rd_atomic);
        card.buf[GID].copy_from_slice(&self.gid);
        card.buf
    }

    /// Decodes and validates a card (see [`VerbsCard::new_checked`]).
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidData`] naming what is wrong.
    pub(crate) fn from_bytes(b: &[u8]) -> io::Result<QpCard> {
        let card = VerbsCard::new_checked(b)?;
        Ok(QpCard {
            link_layer: card.link_layer(),
            mtu: u32::from(card.mtu_code()),
            lid: card.lid(),
            qpn: card.qpn(),
            psn: card.psn(),
            rd_atomic: card.rd_atomic(),
            gid: card.gid(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> QpCard {
        QpCard {
            link_layer: LINK_LAYER_ETHERNET,
            mtu: 3,
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            rd_atomic: 16,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 169, 254, 77, 1],
        }
    }

    #[test]
    fn round_trip() {
        let c = sample();
        let b = c.to_bytes();
        assert_eq!(b.len(), CARD_LEN);
        assert_eq!(QpCard::from_bytes(&b).unwrap(), c);
    }

    #[test]
    fn rejects_malformed_cards() {
        let good = sample().to_bytes();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..35].to_vec(), "at least 36"),
            (
                {
                    let mut b = good.clone();
                    b.push(0);
                    b
                },
                "37 bytes",
            ),
            (
                {
                    let mut b = good.clone();
                    b[0] = b'X';
                    b
                },
                "does not start",
            ),
            (
                {
                    let mut b = good.clone();
                    b[5] = 1;
                    b
                },
                "reserved",
            ),
            (
                {
                    let mut b = good.clone();
                    b[4] = 9;
                    b
                },
                "version 9",
            ),
            (
                {
                    let mut b = good.clone();
                    b[6] = 7;
                    b
                },
                "link layer",
            ),
            (
                {
                    let mut b = good.clone();
                    b[7] = 6;
                    b
                },
                "MTU",
            ),
            (
                {
                    let mut b = good.clone();
                    b[10..14].copy_from_slice(&0x0100_0000u32.to_le_bytes());
                    b
                },
                "QP number",
            ),
            (
                {
                    let mut b = good.clone();
                    b[14..18].copy_from_slice(&0x0100_0000u32.to_le_bytes());
                    b
                },
                "PSN",
            ),
            (
                {
                    let mut b = good.clone();
                    b[20..36].fill(0);
                    b
                },
                "zero GID",
            ),
        ];
        for (bytes, what) in cases {
            let e = QpCard::from_bytes(&bytes).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains(what), "{e} should mention {what}");
        }
    }
}
