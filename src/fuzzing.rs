//! Entry points into the crate-private parsers of bytes from outside, for the fuzz
//! targets in `fuzz/` (feature `fuzzing`). Each is a thin wrapper that changes
//! nothing about what it calls; this is not a stable API.
//!
//! The public parsers ([`crate::ring::wire::Header`], [`crate::ring::wire::Rendezvous`],
//! [`crate::engine::card::ConnCard`], [`crate::oob`], [`crate::ring::packet_cells`],
//! [`crate::ring::tail_ok`]) are fuzzed directly and need nothing here.

use std::io;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use crate::fabric::emulated::card::CardInfo;
use crate::fabric::Card;
use crate::group::hello::Hello;
use crate::handshake::unix;
use crate::pmi::wire;

/// Most descriptors an emulated fabric card can arrive with.
pub const EMU_MAX_FDS: usize = crate::fabric::MAX_CARD_FDS;

/// Decodes an emulated fabric card that arrived with `fds` descriptors
/// (`EmuCard::new_checked`) and returns the bytes its decoded fields encode to.
///
/// # Errors
///
/// As the parser: `InvalidData` naming the fault.
pub fn emu_card(bytes: &[u8], fds: usize) -> io::Result<Vec<u8>> {
    CardInfo::decode(bytes, fds).map(|c| c.encode())
}

/// Receives one handshake frame (an out-of-band frame that starts with a tag) as
/// the handshake does, due by `deadline`: the tag and the rest.
///
/// # Errors
///
/// As the handshake's receive: `InvalidData` for a malformed frame, `UnexpectedEof`
/// when the stream ends, `TimedOut` past the deadline.
pub fn handshake_recv(sock: &UnixStream, deadline: Instant) -> io::Result<([u8; 4], Vec<u8>)> {
    unix::recv_by(sock, deadline).map(|(tag, card)| (tag, card.bytes))
}

/// The tag of a handshake `HELLO` frame.
pub const HELLO_TAG: [u8; 4] = *unix::TAG_HELLO;

/// Splits the body of a `HELLO` frame into (hello, engine card).
///
/// # Errors
///
/// `InvalidData` for a body shorter than its hello length says.
pub fn handshake_hello(body: &[u8]) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let card = Card {
        bytes: body.to_vec(),
        fds: Vec::new(),
    };
    unix::parse_hello(card).map(|(hello, card)| (hello, card.bytes))
}

/// Decodes a process group's hello card (`rch4,...` text) and returns its encoding
/// of the decoded fields.
///
/// # Errors
///
/// The parser's reason.
pub fn hello_card(bytes: &[u8]) -> Result<String, String> {
    Hello::decode(bytes).map(|h| h.encode())
}

/// Longest PMI line accepted, in bytes.
pub const PMI_MAX_LINE: usize = wire::MAX_LINE;

/// A parsed PMI-1 line: its command and its other attributes, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PmiMessage {
    /// The value of `cmd=`.
    pub cmd: String,
    /// The other attributes.
    pub attrs: Vec<(String, String)>,
}

/// Parses one PMI-1 line (without its `\n`).
///
/// # Errors
///
/// `InvalidData` naming the fault.
pub fn pmi_parse(line: &[u8]) -> io::Result<PmiMessage> {
    wire::parse(line).map(|m| PmiMessage {
        cmd: m.cmd,
        attrs: m.attrs,
    })
}

/// Formats a message as the PMI client and server do, with its `\n`.
pub fn pmi_format(m: &PmiMessage) -> String {
    let attrs: Vec<(&str, &str)> = m
        .attrs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    wire::format(&m.cmd, &attrs)
}

/// Attribute `key` of a PMI line as an integer, as the PMI client reads ranks and
/// sizes.
///
/// # Errors
///
/// `InvalidData` for a malformed line, a missing attribute or a non-integer.
pub fn pmi_int(line: &[u8], key: &str) -> io::Result<i64> {
    wire::parse(line)?.require_int(key)
}

/// The kept seed inputs of each fuzz target, built with the crate's own encoders:
/// (target, file name, bytes). `fuzz/corpus/<target>/` holds them (written by the
/// ignored test `fuzzing::tests::write_seeds`); each is a well-formed input, so
/// the fuzzer starts from the accepting paths.
#[cfg(test)]
fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    use crate::engine::card::ConnCard;
    use crate::fabric::emulated::card::CardSegment;
    use crate::fabric::{FabricKind, RemoteRegion};
    use crate::ring::wire::{Header, PacketKind, Rendezvous, RndvSeg, CELL};

    let header = |pos: u64, kind, len, ack, extra: [u8; 2]| {
        let mut b = vec![0u8; 16];
        Header::new_unchecked(&mut b[..]).fill(pos, kind, len, ack);
        b.extend_from_slice(&extra);
        b
    };
    let rndv = |id, segs: &[RndvSeg]| {
        let mut b = vec![0u8; Rendezvous::encoded_len(segs.len())];
        Rendezvous::encode(&mut b, id, segs);
        b
    };
    let seg = |addr, len, rkey| RndvSeg { addr, len, rkey };
    let region = |addr, len, rkey| RemoteRegion { addr, len, rkey };
    let ctrl = region(0x7f00_0000_2000, crate::ring::memory::CTRL_SIZE as u64, 8);
    let conn = |ring, fabric: &[u8]| ConnCard::encode(ring, ctrl, fabric).expect("valid card");
    let emu = CardInfo {
        pid: 4242,
        domain_id: 0x1092_0000_0001,
        qp_key: 0x1_0003,
        domain_fd: 7,
        segments: vec![
            CardSegment {
                slot: 0,
                gen: 1,
                len: 1 << 20,
            },
            CardSegment {
                slot: 3,
                gen: 2,
                len: 4096,
            },
        ],
    };
    let emu_alone = CardInfo {
        segments: Vec::new(),
        ..emu.clone()
    };
    let with_fds = |fds: u8, card: Vec<u8>| [vec![fds], card].concat();
    let oob = |frames: &[&[u8]]| {
        let mut b = Vec::new();
        for f in frames {
            b.extend_from_slice(&(f.len() as u32).to_le_bytes());
            b.extend_from_slice(f);
        }
        b
    };
    let conn_card = conn(region(0x7f00_0001_0000, 1 << 20, 7), b"RCHVcm");
    let mut hello_frame = unix::TAG_HELLO.to_vec();
    hello_frame.push(8);
    hello_frame.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    hello_frame.extend_from_slice(&conn_card);
    let mut accept_frame = unix::TAG_ACCEPT.to_vec();
    accept_frame.extend_from_slice(&conn_card);
    let hello = |cm| Hello {
        fabric: FabricKind::Emulated,
        pid: 4242,
        socket: "rch-4242-00ff12ab34cd56ef".into(),
        host: "0f1e2d3c4b5a6978-f0000098".into(),
        cm,
        bell: None,
        cpus: None,
    };
    let hello_v = Hello {
        fabric: FabricKind::Verbs,
        bell: Some(region(0x7f00_0002_0000, 64 + 8 * 64, 0x1234)),
        cpus: crate::group::cpus::CpuSet::decode("0-3.8"),
        ..hello(Some("169.254.77.2:40001".parse().expect("address")))
    };
    let pmi = |s: &str| s.as_bytes().to_vec();
    let ctrl_ops = |log2: u8, chunk: u32, start: u32, ops: &[u8]| {
        let mut b = vec![log2];
        b.extend_from_slice(&chunk.to_le_bytes());
        b.extend_from_slice(&start.to_le_bytes());
        b.extend_from_slice(ops);
        b
    };
    vec![
        (
            "ring_header",
            "data",
            header(0, PacketKind::Data, 5, 0, [0, 0]),
        ),
        (
            "ring_header",
            "pad",
            header(4032, PacketKind::Pad, 0, 640, [0, 1]),
        ),
        (
            "ring_header",
            "rendezvous",
            header(1 << 33, PacketKind::Rendezvous, 72, 1 << 20, [2, 8]),
        ),
        (
            "rendezvous",
            "one",
            rndv(1, &[seg(0x7f00_0000_1000, 1 << 20, 9)]),
        ),
        (
            "rendezvous",
            "two",
            rndv(7, &[seg(0x1000, 300, 9), seg(0x9000, 1, 10)]),
        ),
        (
            "rendezvous",
            "sixteen",
            rndv(
                3,
                &(0..16)
                    .map(|i| seg(i << 20, 4096 + i, i as u32))
                    .collect::<Vec<_>>(),
            ),
        ),
        ("rendezvous", "rail_keys", {
            // Two segments with keys for two rails after rail 0.
            let mut b = vec![0u8; Rendezvous::encoded_len_with_keys(2, 2)];
            Rendezvous::encode_seg_with_keys(&mut b, 0, &seg(0x1000, 300, 9), &[20, 30]);
            Rendezvous::encode_seg_with_keys(&mut b, 1, &seg(0x9000, 8, 10), &[21, 31]);
            Rendezvous::encode_fixed_with_keys(&mut b, 4, 308, 2, 0, 2);
            b
        }),
        // Packets and tails in a 4 KiB ring with 1 KiB chunks, then a 1 MiB ring.
        (
            "ctrl_words",
            "small",
            ctrl_ops(0, 1024, 60, &[0, 100, 0, 0, 9, 0, 1, 4, 0, 3, 64, 0, 0, 0]),
        ),
        (
            "ctrl_words",
            "large",
            ctrl_ops(
                8,
                65536,
                0,
                &[0, 255, 255, 2, 0, 16, 0, 0, 0, 0, 0, 0, 1, 16, 0],
            ),
        ),
        ("conn_card", "cm", conn_card.clone()),
        (
            "conn_card",
            "empty_fabric",
            conn(region(CELL as u64, 1 << 12, 1), &[]),
        ),
        (
            "conn_card",
            "emulated",
            conn(region(0x7f00_0001_0000, 1 << 30, 3), &emu.encode()),
        ),
        (
            "conn_card",
            "rails",
            ConnCard::encode_with_rails(
                region(0x7f00_0001_0000, 1 << 20, 7),
                ctrl,
                crate::engine::card::CardFlags {
                    wakes: false,
                    lends: true,
                },
                &emu.encode(),
                &[(&emu_alone.encode()[..], 1), (&emu_alone.encode()[..], 1)],
            )
            .expect("valid card"),
        ),
        (
            "conn_card",
            "rails_in_band",
            ConnCard::encode_with_rails_in_band(
                region(0x7f00_0001_0000, 1 << 20, 7),
                ctrl,
                crate::engine::card::CardFlags {
                    wakes: true,
                    lends: false,
                },
                b"RCHVcm",
                3,
            )
            .expect("valid card"),
        ),
        ("emu_card", "two_segments", with_fds(3, emu.encode())),
        ("emu_card", "domain_only", with_fds(1, emu_alone.encode())),
        (
            "oob_frame",
            "frames",
            [vec![0], oob(&[b"hello", b""])].concat(),
        ),
        (
            "oob_frame",
            "handshake",
            [
                vec![1],
                oob(&[&hello_frame, &accept_frame, unix::TAG_READY]),
            ]
            .concat(),
        ),
        ("hello_card", "emulated", hello(None).encode().into_bytes()),
        ("hello_card", "verbs", hello_v.encode().into_bytes()),
        (
            "hello_card",
            "ipv6",
            hello(Some("[fe80::1]:4791".parse().expect("address")))
                .encode()
                .into_bytes(),
        ),
        (
            "pmi_reply",
            "init",
            pmi("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"),
        ),
        (
            "pmi_reply",
            "maxes",
            pmi("cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0"),
        ),
        (
            "pmi_reply",
            "get",
            pmi("cmd=get_result rc=0 msg=success value=rch4,emulated,42,x,h,-,-,0-1"),
        ),
        (
            "pmi_reply",
            "abort",
            pmi(wire::format("abort", &[("exitcode", "3"), ("message", "a b\\c")]).trim_end()),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::card::ConnCard;
    use crate::ring::wire::{Header, Rendezvous};

    /// Every seed is well-formed: the fuzzer's first inputs take the accepting paths.
    #[test]
    fn seeds_are_accepted() {
        for (target, name, b) in seeds() {
            let ok = match target {
                "ring_header" => Header::new_checked(&b[..]).is_ok_and(|h| h.kind().is_ok()),
                "rendezvous" => Rendezvous::new_checked(&b[..]).is_ok(),
                "conn_card" => ConnCard::new_checked(&b[..]).is_ok(),
                "emu_card" => emu_card(&b[1..], usize::from(b[0])).is_ok_and(|e| e == b[1..]),
                "hello_card" => hello_card(&b).is_ok_and(|t| t.as_bytes() == b),
                "pmi_reply" => pmi_parse(&b).is_ok(),
                "ctrl_words" | "oob_frame" => !b.is_empty(),
                _ => false,
            };
            assert!(ok, "seed {target}/{name}");
        }
    }

    /// Writes the seeds into `fuzz/corpus/<target>/` (run by hand after a format
    /// change: `cargo test --features fuzzing --lib write_seeds -- --ignored`).
    #[test]
    #[ignore = "writes into the source tree"]
    fn write_seeds() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        for (target, name, b) in seeds() {
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), b).unwrap();
        }
    }
}
