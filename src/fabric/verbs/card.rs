//! The verbs connection card: what one end of an RC connection tells the other.
//!
//! Layout (36 bytes, little-endian integers):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `RCHV` |
//! | 4 | 2 | version (1) |
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

const MAGIC: &[u8; 4] = b"RCHV";
/// The whole card of a queue pair that rdma_cm connects: the connection manager
/// exchanges addressing itself, so only the fabric's magic and a marker travel.
pub(crate) const CM_CARD: &[u8; 6] = b"RCHVcm";
const VERSION: u16 = 1;
/// Length of an encoded card.
pub(crate) const CARD_LEN: usize = 36;

/// `IBV_LINK_LAYER_INFINIBAND` (an anonymous enum in `verbs.h`).
pub(crate) const LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

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

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("bad verbs card: {msg}"))
}

impl QpCard {
    /// Encodes the card.
    pub(crate) fn to_bytes(self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CARD_LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.push(self.link_layer);
        b.push(self.mtu as u8);
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.extend_from_slice(&self.qpn.to_le_bytes());
        b.extend_from_slice(&self.psn.to_le_bytes());
        b.push(self.rd_atomic);
        b.push(0);
        b.extend_from_slice(&self.gid);
        debug_assert_eq!(b.len(), CARD_LEN);
        b
    }

    /// Decodes and validates a card.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidData`] naming what is wrong: length, magic, version,
    /// link layer, MTU, QP number, PSN, or an address that can reach nothing.
    pub(crate) fn from_bytes(b: &[u8]) -> io::Result<QpCard> {
        if b.len() != CARD_LEN {
            return Err(invalid(format!(
                "{} bytes, expected {CARD_LEN} (is the peer using the verbs fabric?)",
                b.len()
            )));
        }
        if &b[0..4] != MAGIC {
            return Err(invalid(
                "wrong magic (is the peer using the verbs fabric?)".into(),
            ));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(invalid(format!("version {version}, expected {VERSION}")));
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let card = QpCard {
            link_layer: b[6],
            mtu: u32::from(b[7]),
            lid: u16::from_le_bytes([b[8], b[9]]),
            qpn: u32_at(10),
            psn: u32_at(14),
            rd_atomic: b[18],
            gid: b[20..36].try_into().expect("16 bytes"),
        };
        if card.link_layer != LINK_LAYER_INFINIBAND && card.link_layer != LINK_LAYER_ETHERNET {
            return Err(invalid(format!("unknown link layer {}", card.link_layer)));
        }
        if !(1..=5).contains(&card.mtu) {
            return Err(invalid(format!("MTU code {} is not 1..=5", card.mtu)));
        }
        if card.qpn == 0 || card.qpn > 0xff_ffff {
            return Err(invalid(format!("QP number {:#x} out of range", card.qpn)));
        }
        if card.psn > 0xff_ffff {
            return Err(invalid(format!("PSN {:#x} wider than 24 bits", card.psn)));
        }
        if card.link_layer == LINK_LAYER_ETHERNET && card.gid == [0; 16] {
            return Err(invalid("RoCE peer with a zero GID".into()));
        }
        if card.link_layer == LINK_LAYER_INFINIBAND && card.lid == 0 && card.gid == [0; 16] {
            return Err(invalid("InfiniBand peer with neither LID nor GID".into()));
        }
        Ok(card)
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
            (good[..35].to_vec(), "35 bytes"),
            (
                {
                    let mut b = good.clone();
                    b[0] = b'X';
                    b
                },
                "magic",
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
