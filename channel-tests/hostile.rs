//! A hostile peer, on the emulated fabric: the other end of the connection is not
//! rdma-channel but this test, which hands the victim a well-formed card and then
//! writes whatever it likes into the victim's ring with RDMA WRITE: garbage, packets
//! that lie about their length, kind or acknowledgement, zero-copy announcements
//! with bad keys, lengths or addresses, replays of old packets; or it never grants
//! credit. The victim must report a protocol error (`InvalidData`) where the bytes
//! themselves are wrong, `ConnectionReset` where the fabric refused an access the
//! peer asked for (its memory refused us, as a dead peer's does), never deliver a
//! byte that was not a well-formed packet, never read or write outside registered
//! memory, stay failed once failed, and leave every other connection working.

mod common;

use std::io::{self, ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::time::Duration;

use rdma_channel::engine::card::{ConnCard, CTRL_SIZE};
use rdma_channel::fabric::emulated::{EmuFabric, EmuQp, EmuRegion};
use rdma_channel::fabric::{
    Access, Card, Fabric, MemoryRegion, Opcode, PendingQp, QueuePair, RemoteRegion, Sge,
    WorkRequest,
};
use rdma_channel::ring::memory::{CtrlWord, Lend, LEND_SLOT};
use rdma_channel::ring::wire::{
    ack_word, cells_for, header_match, header_word, trailer_word, PacketKind, Rendezvous, RndvSeg,
    ShortHeader, CELL, SHORT_WRITE,
};
use rdma_channel::{Channel, Config, Prepared, RdmaStream};

const RING: usize = 4096;

/// The victim's connection and the hostile end's means to write into it.
struct Hostile {
    victim: Channel<EmuFabric>,
    qp: EmuQp,
    /// The victim's incoming ring, as its card announced it.
    ring: RemoteRegion,
    /// Memory of the hostile end: the ring and control words it announced, and a
    /// buffer it may announce for zero-copy.
    _own: Vec<EmuRegion>,
    exposed: EmuRegion,
    fabric: EmuFabric,
    /// The victim's control words, as its card announced them.
    ctrl: RemoteRegion,
}

impl Hostile {
    fn new() -> Hostile {
        Hostile::with_config(Config::default())
    }

    fn with_config(cfg: Config) -> Hostile {
        let cfg = cfg.with_ring_size(RING).with_chunk_size(1024);
        let victim = Prepared::new(EmuFabric::new().unwrap(), cfg).unwrap();
        let fabric = EmuFabric::new().unwrap();
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let own = vec![
            fabric.alloc_region(RING, rw).unwrap(),
            fabric.alloc_region(CTRL_SIZE, rw).unwrap(),
        ];
        let exposed = fabric
            .alloc_region(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
        let pending = fabric.create_qp().unwrap();
        let fabric_card = pending.card().unwrap();
        let ours = Card {
            bytes: ConnCard::encode(own[0].remote(), own[1].remote(), &fabric_card.bytes).unwrap(),
            fds: fabric_card.fds,
        };
        let theirs = victim.card().unwrap();
        let (ring, ctrl, fabric_part) = {
            let c = ConnCard::new_checked(&theirs.bytes[..]).unwrap();
            (c.ring(), c.ctrl(), c.fabric_card().to_vec())
        };
        let qp = pending
            .connect(Card {
                bytes: fabric_part,
                fds: theirs.fds,
            })
            .unwrap();
        let victim = victim.connect(ours).unwrap();
        Hostile {
            victim,
            qp,
            ring,
            _own: own,
            exposed,
            fabric,
            ctrl,
        }
    }

    /// Writes `lend` into the victim's lend slot, as a receiver lending its buffer.
    fn lend(&self, lend: Lend) {
        let bytes: Vec<u8> = lend
            .to_words()
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        self.write_to(self.ctrl.addr + LEND_SLOT, self.ctrl.rkey, &bytes);
    }

    /// The lend the victim last wrote into our control words.
    fn victim_lend(&self) -> Lend {
        let base = self._own[1].addr() as u64 + LEND_SLOT;
        // SAFETY: the slot's five words lie inside our 4 KiB control region, which the
        // victim writes only by RDMA WRITE executed inside its own post (emulated).
        let w = |i: u64| unsafe { std::ptr::read_volatile((base + 8 * i) as *const u64) };
        Lend::from_words([w(0), w(1), w(2), w(3), w(4)])
    }

    /// RDMA WRITE of `bytes` to ring offset `at` of the victim.
    fn write(&self, at: u64, bytes: &[u8]) {
        self.write_to(self.ring.addr + at, self.ring.rkey, bytes);
    }

    fn write_to(&self, addr: u64, rkey: u32, bytes: &[u8]) {
        let sge = [Sge {
            addr: bytes.as_ptr() as *mut u8,
            len: bytes.len() as u32,
            lkey: 0,
        }];
        let wr = WorkRequest {
            wr_id: 0,
            opcode: Opcode::Write {
                local: &sge,
                remote_addr: addr,
                rkey,
                inline: true,
            },
            signaled: false,
        };
        // SAFETY: an inline write copies `bytes` during the call, and `bytes` is a
        // live slice for all of it.
        unsafe { self.qp.post(&wr) }.unwrap();
    }

    /// Writes packet `kind` with `payload` at absolute position `pos` (ring offset
    /// `pos % RING`), its header word as given, trailer last.
    fn packet_with_word(&self, pos: u64, word: u64, payload: &[u8], ack: u64) {
        let cells = cells_for(payload.len());
        // In the full form (a correct sender may use it for any packet), the ack marked.
        let mut p = vec![0u8; cells * CELL];
        p[0..8].copy_from_slice(&word.to_le_bytes());
        p[8..16].copy_from_slice(&ack_word(ack).to_le_bytes());
        p[16..16 + payload.len()].copy_from_slice(payload);
        let end = pos + (cells * CELL) as u64;
        let n = p.len();
        p[n - 8..].copy_from_slice(&trailer_word(end).to_le_bytes());
        self.write(pos % RING as u64, &p);
    }

    fn packet(&self, pos: u64, kind: PacketKind, payload: &[u8], ack: u64) {
        let word = header_word(pos, kind, payload.len() as u32);
        self.packet_with_word(pos, word, payload, ack);
    }

    /// A zero-copy announcement at `pos`.
    fn rendezvous(&self, pos: u64, id: u64, segs: &[RndvSeg]) {
        let mut desc = vec![0u8; Rendezvous::encoded_len(segs.len())];
        Rendezvous::encode(&mut desc, id, segs);
        self.packet(pos, PacketKind::Rendezvous, &desc, 0);
    }

    fn get(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.victim.get(&mut [IoSliceMut::new(buf)])
    }

    /// Asserts that the victim's connection failed with `kind`, and stays failed.
    fn expect_failed(&mut self, kind: ErrorKind, what: &str) {
        let mut buf = [0u8; 64];
        let e = self.get(&mut buf).expect_err(what);
        assert_eq!(e.kind(), kind, "{what}: {e}");
        let again = self
            .get(&mut buf)
            .expect_err("a failed connection stays failed");
        assert_eq!(again.kind(), kind, "{what}, again: {again}");
        assert_eq!(
            self.victim.put(&[IoSlice::new(b"x")]).map_err(|e| e.kind()),
            Err(kind),
            "{what}: put on the failed connection"
        );
    }
}

/// Other connections work whatever happened to the victim.
fn others_unaffected() {
    let (mut a, mut b) = RdmaStream::pair().unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let d = data.clone();
    let t = std::thread::spawn(move || a.write_all(&d).map(|()| a));
    let mut got = vec![0u8; data.len()];
    b.read_exact(&mut got).unwrap();
    t.join().unwrap().unwrap();
    assert!(got == data, "another connection lost or changed bytes");
}

fn skip_on_verbs() -> bool {
    // The hostile end is built from the emulated fabric's parts.
    common::fabric_kind() != rdma_channel::fabric::FabricKind::Emulated
}

#[test]
fn garbage_is_never_delivered_and_a_packet_of_unknown_kind_is_a_protocol_error() {
    if skip_on_verbs() {
        return;
    }
    let mut h = Hostile::new();
    // Random words everywhere: none carries this lap's stamp, so nothing arrives.
    let mut rng = common::Rng::new(7);
    let garbage = rng.bytes(RING);
    h.write(0, &garbage);
    let mut buf = vec![0u8; RING];
    for _ in 0..10 {
        assert_eq!(h.get(&mut buf).unwrap(), 0, "garbage delivered as data");
    }
    // A well-formed packet over the garbage is delivered, exactly.
    h.packet(0, PacketKind::Data, b"hello", 0);
    assert_eq!(h.get(&mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    // Then a header with this lap's stamp and a kind no sender writes.
    let word = header_match(64) | (7 << 56) | (3 << 32);
    h.packet_with_word(64, word, b"abc", 0);
    h.expect_failed(ErrorKind::InvalidData, "unknown packet kind");
    others_unaffected();
}

#[test]
fn a_packet_longer_than_the_ring_is_a_protocol_error() {
    if skip_on_verbs() {
        return;
    }
    let mut h = Hostile::new();
    // Only the header and ack words: the victim must refuse it before looking for its
    // trailer.
    let mut words = [0u8; 16];
    words[..8].copy_from_slice(&header_word(0, PacketKind::Data, 0xff_ffff).to_le_bytes());
    words[8..].copy_from_slice(&ack_word(0).to_le_bytes());
    h.write(0, &words);
    h.expect_failed(ErrorKind::InvalidData, "length beyond the ring");
    others_unaffected();
}

#[test]
fn acknowledgements_that_are_misaligned_or_beyond_what_was_sent_are_protocol_errors() {
    if skip_on_verbs() {
        return;
    }
    let mut h = Hostile::new();
    h.packet(0, PacketKind::Data, b"a", 3);
    h.expect_failed(ErrorKind::InvalidData, "misaligned ack");

    // An aligned ack far beyond anything the victim sent: refused when the victim's
    // sender relies on it, so no unread byte of the peer is ever overwritten.
    let mut h = Hostile::new();
    h.packet(0, PacketKind::Data, b"b", 1 << 20);
    let mut one = [0u8; 1];
    assert_eq!(h.get(&mut one).unwrap(), 1);
    let mut failed = None;
    for _ in 0..1000 {
        match h.victim.put(&[IoSlice::new(&[0u8; 512])]) {
            Ok(_) => {}
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let e = failed.expect("the victim's sender must not trust the bogus ack");
    assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
    others_unaffected();
}

#[test]
fn zero_copy_announcements_out_of_order_or_inconsistent_are_protocol_errors() {
    if skip_on_verbs() {
        return;
    }
    let seg = RndvSeg {
        addr: 0x1000,
        len: 100,
        rkey: 1,
    };
    // The first announcement must be number 1.
    let mut h = Hostile::new();
    h.rendezvous(0, 5, &[seg]);
    h.expect_failed(ErrorKind::InvalidData, "rendezvous out of order");
    // A total that is not the sum of the segments.
    let mut h = Hostile::new();
    let mut desc = vec![0u8; Rendezvous::encoded_len(1)];
    Rendezvous::encode(&mut desc, 1, &[seg]);
    desc[8..16].copy_from_slice(&1_000_000u64.to_le_bytes());
    h.packet(0, PacketKind::Rendezvous, &desc, 0);
    h.expect_failed(ErrorKind::InvalidData, "inconsistent total");
    // No segments at all.
    let mut h = Hostile::new();
    desc[8..24].fill(0);
    h.packet(0, PacketKind::Rendezvous, &desc[..24], 0);
    h.expect_failed(ErrorKind::InvalidData, "empty rendezvous");
    others_unaffected();
}

/// Makes a zero-copy segment the fabric must refuse, from the hostile end's memory.
type BadSegment = fn(&Hostile) -> RndvSeg;

#[test]
fn zero_copy_reads_the_fabric_refuses_touch_nothing_and_reset_the_connection() {
    if skip_on_verbs() {
        return;
    }
    let exposed_len = 4096u64;
    let cases: [(&str, BadSegment); 3] = [
        ("a key that was never handed out", |h| RndvSeg {
            addr: h.exposed.addr() as u64,
            len: 100,
            rkey: h.exposed.rkey() ^ 0x5a5a_0000,
        }),
        ("a real key, past the end of its region", |h| RndvSeg {
            addr: h.exposed.addr() as u64 + 4000,
            len: 1000,
            rkey: h.exposed.rkey(),
        }),
        ("a real key, an address before its region", |h| RndvSeg {
            addr: h.exposed.addr() as u64 - 4096,
            len: 4096,
            rkey: h.exposed.rkey(),
        }),
    ];
    for (what, seg) in cases {
        let mut h = Hostile::new();
        let seg = seg(&h);
        h.rendezvous(0, 1, &[seg]);
        // The destination, with canaries around where the read would land.
        let mut buf = vec![0xEEu8; 8192];
        let e = h.get(&mut buf[..]).expect_err(what);
        assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{what}: {e}");
        assert!(
            buf.iter().all(|&b| b == 0xEE),
            "{what}: the refused read wrote into the destination"
        );
        h.expect_failed(ErrorKind::ConnectionReset, what);
        // The hostile end's own memory was not written either.
        assert!(h.exposed.len() == exposed_len as usize && h.fabric.caps().max_sge > 0);
    }
    others_unaffected();
}

#[test]
fn writes_outside_the_announced_ring_are_refused_by_the_fabric() {
    if skip_on_verbs() {
        return;
    }
    let mut h = Hostile::new();
    // One byte past the ring, with the ring's own key.
    h.write_to(h.ring.addr + h.ring.len, h.ring.rkey, &[0xAB; 64]);
    assert_eq!(
        h.qp.state(),
        rdma_channel::fabric::QpState::Error,
        "a write past the ring must fail on the writer's side"
    );
    // The victim saw nothing and is not harmed.
    let mut buf = [0u8; 64];
    assert_eq!(h.get(&mut buf).unwrap(), 0);
    others_unaffected();
}

#[test]
fn a_wrap_packet_moves_the_reader_to_the_next_lap_and_one_with_payload_is_a_protocol_error() {
    if skip_on_verbs() {
        return;
    }
    let mut h = Hostile::new();
    h.packet(0, PacketKind::Data, b"one", 0);
    let mut buf = [0u8; 16];
    assert_eq!(h.get(&mut buf).unwrap(), 3);
    assert_eq!(&buf[..3], b"one");
    // A wrap at 64: the rest of the lap holds nothing; the next packet is at RING
    // (physical offset 0 again, where "one" was consumed).
    h.packet(64, PacketKind::Wrap, b"", 0);
    // Bait where the reader would look if it ignored the wrap.
    h.packet(128, PacketKind::Data, b"bait", 0);
    // The reader gives "one" back (zeroes its cell) at this get, skips the lap, and
    // finds nothing at RING: as a sender must, we write there only after that.
    assert_eq!(h.get(&mut buf).unwrap(), 0, "the bait is not read");
    h.packet(RING as u64, PacketKind::Data, b"two", 0);
    assert_eq!(
        h.get(&mut buf).unwrap(),
        3,
        "the wrap is skipped, the bait never read"
    );
    assert_eq!(&buf[..3], b"two");

    let mut h = Hostile::new();
    h.packet(0, PacketKind::Wrap, b"x", 0);
    h.expect_failed(ErrorKind::InvalidData, "wrap packet with a payload");
    others_unaffected();
}

#[test]
fn a_switch_to_a_ring_never_offered_is_a_protocol_error() {
    if skip_on_verbs() {
        return;
    }
    // No offer outstanding: a switch packet (with any number) fails the connection
    // instead of moving the reader into memory it never gave out.
    for number in [0u64, 1, 7] {
        let mut h = Hostile::new();
        h.packet(0, PacketKind::Data, b"one", 0);
        h.packet(64, PacketKind::Switch, &number.to_le_bytes(), 0);
        let mut buf = [0u8; 3];
        assert_eq!(h.get(&mut buf).unwrap(), 3, "the bytes before it arrive");
        assert_eq!(&buf, b"one");
        h.expect_failed(ErrorKind::InvalidData, "switch to a ring never offered");
    }
    let mut h = Hostile::new();
    h.packet(0, PacketKind::Switch, b"", 0);
    h.expect_failed(ErrorKind::InvalidData, "switch without a number");
    others_unaffected();
}

#[test]
fn a_replayed_packet_from_an_earlier_lap_is_never_delivered_again() {
    if skip_on_verbs() {
        return;
    }
    let mut h = Hostile::new();
    // One lap of one-cell packets, all read.
    let lap = (RING / CELL) as u64;
    let mut buf = vec![0u8; RING];
    let mut got = Vec::new();
    for i in 0..lap {
        let msg = format!("m{i:02}");
        h.packet(i * CELL as u64, PacketKind::Data, msg.as_bytes(), 0);
        let n = h.get(&mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got.len(), lap as usize * 3);
    // Replays of packets 0 and 1, byte for byte, where the next lap starts.
    h.packet(0, PacketKind::Data, b"m00", 0);
    h.packet(CELL as u64, PacketKind::Data, b"m01", 0);
    for _ in 0..10 {
        assert_eq!(
            h.get(&mut buf).unwrap(),
            0,
            "a replayed packet was delivered"
        );
    }
    // The real next packet still arrives.
    h.packet(lap * CELL as u64, PacketKind::Data, b"new", 0);
    assert_eq!(h.get(&mut buf).unwrap(), 3);
    assert_eq!(&buf[..3], b"new");
}

/// A short packet's header stands in its cell's second word, which an earlier lap's
/// payload may have filled with exactly the short header this packet will carry; and
/// its payload word stands where a full header does, so it may look like one (here,
/// of a packet running past the ring's end). The receiver zeroes the second word when
/// it frees the cell, and takes a full header only with its ack word, so a payload
/// word that landed before its header is neither read with the stale header nor
/// taken for a broken full packet.
#[test]
fn a_short_packet_is_not_read_before_its_header_lands_over_flag_payload() {
    if skip_on_verbs() {
        return;
    }
    let mut h = Hostile::new();
    let ring = RING as u64;
    let at = ring + CELL as u64; // lap 1, cell 1
    let word0 = header_word(at, PacketKind::Data, 0xff_ffff).to_le_bytes();
    let short = ShortHeader::new(at, 8, 0).word().to_le_bytes();
    // Lap 0: four 1000-byte packets fill the ring. The first one's payload bytes
    // 56..64 land on cell 1's second word and hold the short header due there.
    let mut evil = vec![0x5au8; 1000];
    evil[56..64].copy_from_slice(&short);
    let mut buf = vec![0u8; RING];
    for k in 0..4u64 {
        h.packet(k * 1024, PacketKind::Data, &evil, 0);
        assert_eq!(h.get(&mut buf).unwrap(), 1000);
        assert_eq!(buf[..1000], evil[..]);
    }
    // Lap 1: a whole short packet in cell 0, then only the payload word of cell 1's.
    let mut p = [0u8; SHORT_WRITE];
    p[..1].copy_from_slice(b"x");
    p[8..].copy_from_slice(&ShortHeader::new(ring, 1, 0).word().to_le_bytes());
    h.write(0, &p);
    assert_eq!(h.get(&mut buf[..1]).unwrap(), 1);
    assert_eq!(&buf[..1], b"x");
    h.write(CELL as u64, &word0);
    for _ in 0..10 {
        assert_eq!(
            h.get(&mut buf).unwrap(),
            0,
            "a short packet was read (or failed) before its header landed"
        );
    }
    // Then its header: delivered exactly.
    h.write(CELL as u64 + 8, &short);
    assert_eq!(h.get(&mut buf).unwrap(), 8);
    assert_eq!(buf[..8], word0);
}

/// A short header whose length is out of range is a protocol error.
#[test]
fn a_short_packet_longer_than_a_word_is_a_protocol_error() {
    if skip_on_verbs() {
        return;
    }
    let mut h = Hostile::new();
    h.write(8, &ShortHeader::new(0, 9, 0).word().to_le_bytes());
    h.expect_failed(ErrorKind::InvalidData, "short packet of 9 bytes");
    others_unaffected();
}

#[test]
fn a_peer_that_never_grants_credit_blocks_writes_until_their_timeout_and_no_further() {
    if skip_on_verbs() {
        return;
    }
    let mut h = Hostile::new();
    let mut sent = 0;
    loop {
        let n = h.victim.put(&[IoSlice::new(&[1u8; 1000])]).unwrap();
        if n == 0 {
            break;
        }
        sent += n;
        assert!(
            sent <= RING,
            "the victim wrote {sent} bytes into a {RING}-byte ring"
        );
    }
    // The ring is full and stays full: the wait ends by its deadline with TimedOut,
    // and the connection is not broken by it.
    let deadline = std::time::Instant::now() + Duration::from_millis(100);
    let e = h
        .victim
        .sender()
        .wait_writable_until(Some(deadline))
        .expect_err("no credit: no room");
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert_eq!(h.victim.put(&[IoSlice::new(b"x")]).unwrap(), 0);
    others_unaffected();
}

#[test]
fn lends_that_skip_a_number_or_name_bytes_outside_the_transfer_are_protocol_errors() {
    if skip_on_verbs() {
        return;
    }
    let cases: [(&str, Lend); 4] = [
        (
            "a lend past the transfer's end",
            Lend {
                addr: 0x1000,
                rkey: 1,
                len: 4096,
                offset: 65536 - 4095,
                transfer: 1,
                number: 1,
            },
        ),
        (
            "a lend whose end overflows",
            Lend {
                addr: 0x1000,
                rkey: 1,
                len: 4096,
                offset: u64::MAX - 10,
                transfer: 1,
                number: 1,
            },
        ),
        (
            "an empty lend",
            Lend {
                addr: 0x1000,
                rkey: 1,
                len: 0,
                offset: 0,
                transfer: 1,
                number: 1,
            },
        ),
        (
            "a lend that skips a number",
            Lend {
                addr: 0x1000,
                rkey: 1,
                len: 4096,
                offset: 0,
                transfer: 1,
                number: 2,
            },
        ),
    ];
    for (what, lend) in cases {
        let mut h = Hostile::new();
        let big = h.victim.alloc_mem(65536).unwrap();
        // SAFETY: `big` lives, untouched, until the end of this iteration, after the
        // connection failed (which revokes the transfer).
        let n = unsafe { h.victim.sender().put_nocopy(&[IoSlice::new(&big)]) }.unwrap();
        assert_eq!(n, 0, "{what}: the buffer is announced, not copied");
        h.lend(lend);
        // SAFETY: as above.
        let e = unsafe { h.victim.sender().put_nocopy(&[IoSlice::new(&big)]) }.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidData, "{what}: {e}");
        h.expect_failed(ErrorKind::InvalidData, what);
    }
    others_unaffected();
}

/// A victim that receives and lends all of each transfer (push 100%), with an
/// announcement of `total` bytes of the hostile end's exposed buffer in its ring.
fn lending_victim(total: u64) -> Hostile {
    let h = Hostile::with_config(Config::default().with_zero_copy_push(Some(100)));
    let seg = RndvSeg {
        addr: h.exposed.addr() as u64,
        len: total,
        rkey: h.exposed.rkey(),
    };
    h.rendezvous(0, 1, &[seg]);
    h
}

#[test]
fn a_lent_buffer_takes_only_its_bytes_and_only_until_they_are_counted() {
    if skip_on_verbs() {
        return;
    }
    let total = 4096u64;
    let mut h = lending_victim(total);
    // The destination, with canaries on both sides of the 4096 bytes lent.
    let mut buf = vec![0xEEu8; 3 * 4096];
    let dst = &mut buf[4096..8192];
    // SAFETY: `buf` is neither moved nor touched until the step is counted below.
    let n = unsafe { h.victim.receiver().get_nowait(&mut [IoSliceMut::new(dst)]) }.unwrap();
    assert_eq!(n, 0, "the lend is out, nothing landed");
    let lend = h.victim_lend();
    assert_eq!(
        (lend.number, lend.offset, u64::from(lend.len)),
        (1, 0, total)
    );
    assert_eq!(lend.addr, buf[4096..].as_ptr() as u64);
    // A write past the lent bytes, with the lend's key, is refused by the fabric...
    h.write_to(lend.addr + total, lend.rkey, &[0xAB; 64]);
    assert_eq!(
        h.qp.state(),
        rdma_channel::fabric::QpState::Error,
        "a write past the lent bytes must fail"
    );
    assert!(
        buf.iter().all(|&b| b == 0xEE),
        "a refused write touched the victim's buffer"
    );

    // On a fresh connection: a correct push is counted, and then the key is dead.
    let mut h = lending_victim(total);
    let mut buf = vec![0xEEu8; 3 * 4096];
    let at = buf[4096..].as_ptr() as u64;
    // SAFETY: as above.
    let n = unsafe {
        h.victim
            .receiver()
            .get_nowait(&mut [IoSliceMut::new(&mut buf[4096..8192])])
    }
    .unwrap();
    assert_eq!(n, 0);
    let lend = h.victim_lend();
    assert_eq!(lend.addr, at);
    h.write_to(lend.addr, lend.rkey, &[0x5A; 4096]);
    h.write_to(
        h.ctrl.addr + CtrlWord::LendLanded.offset(),
        h.ctrl.rkey,
        &1u64.to_le_bytes(),
    );
    // SAFETY: as above.
    let n = unsafe {
        h.victim
            .receiver()
            .get_nowait(&mut [IoSliceMut::new(&mut buf[4096..8192])])
    }
    .unwrap();
    assert_eq!(n, 4096, "the pushed bytes are counted once landed");
    assert!(buf[4096..8192].iter().all(|&b| b == 0x5A));
    assert!(
        buf[..4096].iter().chain(&buf[8192..]).all(|&b| b == 0xEE),
        "canaries"
    );
    // Counted: the lent bytes are the caller's again, and the key is dead.
    h.write_to(lend.addr, lend.rkey, &[0x11; 64]);
    assert_eq!(
        h.qp.state(),
        rdma_channel::fabric::QpState::Error,
        "a write after the count must fail"
    );
    assert!(
        buf[4096..8192].iter().all(|&b| b == 0x5A),
        "a write after the count landed"
    );
    others_unaffected();
}
