//! Payloads full of words equal to ring header and trailer values cost nothing extra
//! and cannot fool the receiver.

use super::*;

/// Payload words equal to the header or trailer a later lap will write at a cell
/// boundary need no special treatment from the sender (the receiver clears boundary
/// words before freeing cells, ring module docs): such a packet takes exactly the
/// cells a plain one does, and arrives intact.
#[test]
fn flag_words_in_payload_cost_no_extra_cells() {
    bounded("flag_words_in_payload_cost_no_extra_cells", || {
        for t in [Tun::new(4096, 1024), Tun::new(4096, 1024).inline(64)] {
            let ring = t.ring as u64;
            let mut evil = vec![0x11u8; 104];
            // Payload offset 48 lands on the boundary at 64, offset 40 just before it.
            evil[48..56].copy_from_slice(&header_match(64 + ring).to_le_bytes());
            evil[40..48].copy_from_slice(&trailer_word(64 + ring).to_le_bytes());
            let (mut a, mut b) = t.pair();
            assert_eq!(a.put(&[IoSlice::new(&evil)]).unwrap(), 104);
            assert_eq!(
                a.channel().sender().position(),
                128,
                "{t:?}: 104 bytes are one 2-cell packet, flag words or not"
            );
            let mut got = vec![0u8; 104];
            assert_eq!(get_settled(&mut b, &mut got, 104).unwrap(), 104);
            assert_eq!(got, evil, "{t:?}");
        }
    });
}

/// For every starting cell over three laps, payloads made of next-lap flag words (for a
/// cutting sender and for a non-cutting one) go through intact, and the drained ring
/// never yields a phantom packet.
#[test]
fn flag_payloads_at_every_start_cell() {
    bounded("flag_payloads_at_every_start_cell", || {
        let configs = [
            Tun::new(4096, 128),
            Tun::new(4096, 1024),
            Tun::new(4096, 2048).inline(64),
            Tun::new(4096, 1024).inline(300).threshold(4096 - 64),
            Tun::new(8192, 4096).threshold(1),
        ];
        for t in configs {
            let (mut a, mut b) = t.pair();
            let ring = t.ring as u64;
            let mut rng = Rng::new(t.chunk as u64);
            let cells = (t.ring / CELL) as u64;
            for step in 0..3 * cells {
                for lap in [1u64, 1, 2, 0] {
                    let head = a.channel().sender().position();
                    let len = rng.range(41, 2 * t.ring);
                    let kind = rng.below(6);
                    let flags = [Flags::Trailer, Flags::Header, Flags::Both][(kind % 3) as usize];
                    let data = if kind < 3 {
                        cut_chain(&mut rng, head, ring, lap, flags, len)
                    } else {
                        aligned_flags(&mut rng, head, ring, lap, flags, len)
                    };
                    let shape = if rng.chance(1, 3) {
                        random_shape(&mut rng, len, 6)
                    } else {
                        vec![len]
                    };
                    transfer(&mut a, &mut b, &data, &shape, rng.range(1, t.ring)).unwrap_or_else(
                        |e| {
                            panic!(
                                "{t:?} step {step} lap {lap} head {head} len {len} {flags:?}: {e}"
                            )
                        },
                    );
                    // The ring is drained: a poll must find nothing.
                    let mut buf = vec![0u8; t.ring];
                    assert_eq!(
                        b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(),
                        0,
                        "{t:?}: phantom data after step {step}"
                    );
                }
                // Move the start by one cell.
                transfer(&mut a, &mut b, b"x", &[1], 1).unwrap();
            }
        }
    });
}
