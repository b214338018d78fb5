//! Rings that grow with their traffic and shrink back when idle (ARCHITECTURE.md,
//! "Rings that grow"), with the defaults a user gets: a 16 KiB start, growth up to
//! the 4 MiB ring size. The property tests (`properties.rs`) run growing and
//! shrinking rings against the byte-queue model; these check that it happens.

use super::*;

/// Streams `total` bytes of a counting pattern from `a` to `b` in one thread with
/// `piece`-byte puts and gets, checking every byte.
fn stream(a: &mut RdmaStream, b: &mut RdmaStream, total: usize, piece: usize) {
    let data: Vec<u8> = (0..piece).map(|i| (i * 7 + 3) as u8).collect();
    let (mut sent, mut got) = (0usize, 0usize);
    let mut buf = vec![0u8; piece];
    let deadline = Instant::now() + Duration::from_secs(60);
    while got < total {
        assert!(
            Instant::now() < deadline,
            "stalled at {got} of {total} bytes"
        );
        if sent < total {
            let at = sent % piece;
            let n = (piece - at).min(total - sent);
            sent += a.put(&[IoSlice::new(&data[at..at + n])]).unwrap();
        }
        let at = got % piece;
        let want = (piece - at).min(total - got);
        let n = b.get(&mut [IoSliceMut::new(&mut buf[..want])]).unwrap();
        assert_eq!(&buf[..n], &data[at..at + n], "bytes {got}..{}", got + n);
        got += n;
    }
}

#[test]
fn a_ring_starts_small_and_grows_to_the_ring_size_under_a_stream() {
    bounded("a_ring_starts_small_and_grows", || {
        let cfg = Config::default();
        let (mut a, mut b) = RdmaStream::pair_with(cfg.clone()).unwrap();
        let initial = cfg.initial_ring_size() as u64;
        assert_eq!(initial, 16 << 10, "the default start");
        assert_eq!(a.channel().sender().ring_size(), initial);
        assert_eq!(b.channel().receiver().ring_size(), initial);
        // Messages larger than the ring stall it: each stall asks for a ring four
        // times as large, until the ring size.
        stream(&mut a, &mut b, 32 << 20, 1 << 20);
        let grown = b.channel().receiver().ring_size();
        assert_eq!(grown, cfg.ring_size() as u64, "grown to the ring size");
        assert_eq!(a.channel().sender().ring_size(), grown);
        // The other direction never carried anything: still small.
        assert_eq!(a.channel().receiver().ring_size(), initial);
        // And the stream goes on, both ways.
        stream(&mut b, &mut a, 1 << 20, 4096);
        stream(&mut a, &mut b, 1 << 20, 100);
    });
}

/// `rounds` round trips of `size`-byte messages from `a` to `b` and back, checked.
fn ping_pong(a: &mut RdmaStream, b: &mut RdmaStream, rounds: u32, size: usize) {
    let mut buf = vec![0u8; size];
    for i in 0..rounds {
        let msg = vec![i as u8; size];
        a.write_all(&msg).unwrap();
        b.read_exact(&mut buf).unwrap();
        assert_eq!(buf, msg);
        b.write_all(&buf).unwrap();
        a.read_exact(&mut buf).unwrap();
        assert_eq!(buf, msg);
    }
}

#[test]
fn small_messages_never_grow_the_ring() {
    bounded("small_messages_never_grow_the_ring", || {
        let (mut a, mut b) = RdmaStream::pair().unwrap();
        // A ping-pong of 64-byte messages: the reply's piggybacked tail answers for
        // every packet, and no packet comes near the update threshold.
        ping_pong(&mut a, &mut b, 5000, 64);
        // A few larger messages are not traffic yet.
        ping_pong(&mut a, &mut b, 12, 4096);
        assert_eq!(a.channel().sender().ring_size(), 16 << 10);
        assert_eq!(b.channel().sender().ring_size(), 16 << 10);
    });
}

#[test]
fn a_ping_pong_grows_the_ring_only_as_far_as_its_messages_need() {
    bounded("a_ping_pong_grows_the_ring_as_far_as_needed", || {
        let (mut a, mut b) = RdmaStream::pair().unwrap();
        // 4 KiB messages never fill a 16 KiB ring, but each crosses its 2 KiB tail
        // update threshold, costing an explicit update per message: after 16 of
        // them the receiver offers a ring four times larger, whose 8 KiB threshold
        // the reply's piggybacked tail keeps ahead of. Both directions, and no
        // further.
        ping_pong(&mut a, &mut b, 2000, 4096);
        for (half, side) in [(&mut a, "a"), (&mut b, "b")] {
            assert_eq!(half.channel().sender().ring_size(), 64 << 10, "{side}");
            assert_eq!(half.channel().receiver().ring_size(), 64 << 10, "{side}");
        }
    });
}

/// `rounds` rounds in which `a` and `b` each send the other a `size`-byte message
/// at once and then read the other's (MPI's PingPing), with non-blocking puts and
/// gets in one thread, checked; `b` reads in every fourth round only (as a busy rank
/// does), or when a put can go no further.
fn exchange(a: &mut RdmaStream, b: &mut RdmaStream, rounds: usize, size: usize) {
    // Byte `p` of a side's stream belongs to message p / size, which is its number
    // (`b`'s inverted).
    let byte = |side: usize, p: usize| {
        if side == 0 {
            (p / size) as u8
        } else {
            !((p / size) as u8)
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut sent, mut got) = ([0usize; 2], [0usize; 2]);
    let mut buf = vec![0u8; size];
    for round in 0..rounds {
        let late = round % 4 != 3;
        let end = (round + 1) * size;
        loop {
            assert!(
                Instant::now() < deadline,
                "round {round} stalled: {sent:?} {got:?}"
            );
            let mut stuck = false;
            for (side, s) in [&mut *a, &mut *b].into_iter().enumerate() {
                if sent[side] < end {
                    let from = sent[side];
                    let msg: Vec<u8> = (from..end).map(|p| byte(side, p)).collect();
                    let n = s.put(&[IoSlice::new(&msg)]).unwrap();
                    stuck |= n == 0;
                    sent[side] += n;
                }
            }
            // `a` reads what `b` sent; `b` reads only when it is not late, or when a
            // put is stuck (the only way then is for someone to read).
            for (side, (s, got)) in [&mut *a, &mut *b].into_iter().zip(&mut got).enumerate() {
                if side == 1 && late && !stuck {
                    continue;
                }
                let want = (end - *got).min(size);
                let n = s.get(&mut [IoSliceMut::new(&mut buf[..want])]).unwrap();
                for (k, &v) in buf[..n].iter().enumerate() {
                    let p = *got + k;
                    assert_eq!(v, byte(1 - side, p), "side {side} byte {p}");
                }
                *got += n;
            }
            if sent == [end, end] && got[0] == end && (late || got[1] == end) {
                break;
            }
        }
    }
}

#[test]
fn a_two_way_exchange_grows_the_rings_no_further_than_its_packets_need() {
    bounded("a_two_way_exchange_grows_the_rings_no_further", || {
        let (mut a, mut b) = RdmaStream::pair().unwrap();
        // 16 KiB messages need a ring that holds a lap of two of them (a 64 KiB ring's
        // 8 KiB update threshold then makes it 256 KiB). With `b` up to four messages
        // behind, `a` stalls right after early wraps, a quarter of the ring
        // unconsumed: a stall no bigger ring avoids, so it must not ask for one. It
        // did, once per ring, up to 4 MiB: in MPI's PingPing of 16 KiB, where the
        // tail a sender knows lags a message or two, milliseconds of page faults.
        exchange(&mut a, &mut b, 3000, 16 << 10);
        for (half, side) in [(&mut a, "a"), (&mut b, "b")] {
            let ring = half.channel().sender().ring_size();
            assert!(ring <= 256 << 10, "{side}'s ring grew to {ring}");
        }
    });
}

#[test]
fn a_grown_ring_shrinks_back_after_it_idled() {
    bounded("a_grown_ring_shrinks_back_after_it_idled", || {
        let cfg = Config::default().with_ring_idle(Duration::from_millis(50));
        let (mut a, mut b) = RdmaStream::pair_with(cfg).unwrap();
        stream(&mut a, &mut b, 4 << 20, 256 << 10);
        let grown = b.channel().receiver().ring_size();
        assert!(grown > 16 << 10, "grew: {grown}");
        // The receiver polls its empty ring (an idle check every 1024 empty polls):
        // once it saw the ring idle for 50 ms, it offers the initial size, which the
        // sender takes at its next put, before the byte it puts.
        let mut buf = [0u8; 64];
        for _ in 0..3 {
            for _ in 0..1024 {
                assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
            }
            std::thread::sleep(Duration::from_millis(60));
        }
        assert_eq!(
            b.channel().receiver().ring_size(),
            grown,
            "not before the put"
        );
        a.put(&[IoSlice::new(b"z")]).unwrap();
        let mut one = [0u8; 1];
        assert_eq!(get_settled(&mut b, &mut one, 1).unwrap(), 1);
        assert_eq!(one[0], b'z');
        assert_eq!(b.channel().receiver().ring_size(), 16 << 10);
        assert_eq!(a.channel().sender().ring_size(), 16 << 10);
        // Bytes after the switch are intact, and the ring can grow again.
        stream(&mut a, &mut b, 8 << 20, 1 << 20);
        assert!(b.channel().receiver().ring_size() > 16 << 10);
    });
}

#[test]
fn growth_under_two_threads_keeps_every_byte_in_order() {
    bounded("growth_under_two_threads", || {
        let cfg = Config::default().with_ring_idle(Duration::from_millis(1));
        let (a, mut b) = RdmaStream::pair_with(cfg).unwrap();
        let total = 48usize << 20;
        let writer = std::thread::spawn(move || {
            let mut a = a;
            let mut rng = Rng::new(9);
            let mut sent = 0usize;
            let mut i = 0u64;
            while sent < total {
                // Bursts of large writes, then small ones with pauses, so rings grow,
                // idle, shrink and grow again.
                let n = if (i / 64) % 2 == 0 {
                    rng.below(1 << 20) as usize + 1
                } else {
                    std::thread::sleep(Duration::from_micros(200));
                    rng.below(200) as usize + 1
                };
                let n = n.min(total - sent);
                let chunk: Vec<u8> = (sent..sent + n).map(|k| (k % 251) as u8).collect();
                a.write_all(&chunk).unwrap();
                sent += n;
                i += 1;
            }
            a
        });
        let mut got = 0usize;
        let mut buf = vec![0u8; 300_000];
        while got < total {
            let n = b.read(&mut buf).unwrap();
            assert!(n > 0, "end of stream at {got}");
            for (k, &byte) in buf[..n].iter().enumerate() {
                assert_eq!(byte, ((got + k) % 251) as u8, "byte {}", got + k);
            }
            got += n;
        }
        drop(writer.join().unwrap());
    });
}

#[test]
fn a_sending_half_dropped_right_after_its_puts_loses_nothing() {
    bounded("a_sending_half_dropped_right_after_its_puts", || {
        let (mut a, mut b) = RdmaStream::pair().unwrap();
        // Grow the ring (several rings, and staging copies on verbs, left behind).
        stream(&mut a, &mut b, 16 << 20, 1 << 20);
        // Fill most of the grown ring without reading, so that on verbs the last
        // writes may still be queued when the half drops; then drop the sending half
        // alone (the connection lives on in the reading half).
        let (read_half, write_half) = a.split();
        let mut write_half = write_half;
        let total = (b.channel().receiver().ring_size() as usize) * 3 / 4;
        let piece: Vec<u8> = (0..32 << 10).map(|i| (i % 253) as u8).collect();
        let mut sent = 0usize;
        while sent < total {
            let n = piece.len().min(total - sent);
            let done = write_half.put(&[IoSlice::new(&piece[..n])]).unwrap();
            if done == 0 {
                // Full as far as the sender knows (a tail update still to come).
                break;
            }
            sent += done;
        }
        assert!(sent >= 1 << 20, "only {sent} bytes fitted");
        drop(write_half);
        // The reader comes late: every byte is there, then end of stream.
        std::thread::sleep(Duration::from_millis(100));
        let mut buf = vec![0u8; 32 << 10];
        let mut got = 0usize;
        loop {
            match b.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    for (k, &byte) in buf[..n].iter().enumerate() {
                        let at = (got + k) % piece.len();
                        assert_eq!(byte, piece[at], "byte {}", got + k);
                    }
                    got += n;
                }
                Err(e) => panic!("after {got} of {sent} bytes: {e}"),
            }
        }
        assert_eq!(got, sent);
        drop(read_half);
    });
}
