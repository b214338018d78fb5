//! Edge cases: empty puts and gets, tiny iovec pieces, boundary sizes, end of stream,
//! a peer that goes away, split and reunited halves, bad configurations.

use super::*;

#[test]
fn zero_length_puts_and_gets() {
    bounded("zero_length_puts_and_gets", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            // Empty iovec lists and empty pieces take and give nothing.
            assert_eq!(a.put(&[]).unwrap(), 0, "{t:?}");
            assert_eq!(a.put(&[IoSlice::new(&[])]).unwrap(), 0, "{t:?}");
            assert_eq!(a.put(&[IoSlice::new(&[]); 50]).unwrap(), 0, "{t:?}");
            assert_eq!(b.get(&mut []).unwrap(), 0, "{t:?}");
            assert_eq!(b.get(&mut [IoSliceMut::new(&mut [])]).unwrap(), 0, "{t:?}");
            let mut one = [0u8; 1];
            assert_eq!(
                b.get(&mut [IoSliceMut::new(&mut one)]).unwrap(),
                0,
                "nothing was sent: {t:?}"
            );
            // Blocking calls with empty buffers return at once.
            assert_eq!(a.write(&[]).unwrap(), 0);
            assert_eq!(a.write_vectored(&[]).unwrap(), 0);
            assert_eq!(b.read(&mut []).unwrap(), 0);
            assert_eq!(b.read_vectored(&mut []).unwrap(), 0);
            // Data surrounded by empty pieces.
            let e: [u8; 0] = [];
            let n = a
                .put(&[
                    IoSlice::new(&e),
                    IoSlice::new(b"ab"),
                    IoSlice::new(&e),
                    IoSlice::new(&e),
                    IoSlice::new(b"c"),
                    IoSlice::new(&e),
                ])
                .unwrap();
            assert_eq!(n, 3, "{t:?}");
            await_data(&mut b);
            // A get with only empty buffers takes nothing even though data waits.
            assert_eq!(b.get(&mut []).unwrap(), 0);
            assert_eq!(
                b.get(&mut [IoSliceMut::new(&mut []), IoSliceMut::new(&mut [])])
                    .unwrap(),
                0
            );
            let (mut x, mut y) = ([0u8; 0], [0u8; 2]);
            let mut z = [0u8; 5];
            let m = b
                .get(&mut [
                    IoSliceMut::new(&mut x),
                    IoSliceMut::new(&mut y),
                    IoSliceMut::new(&mut []),
                    IoSliceMut::new(&mut z),
                ])
                .unwrap();
            assert_eq!(m, 3, "{t:?}");
            assert_eq!(&y, b"ab");
            assert_eq!(z[0], b'c');
            // Empty calls in between never disturb the stream.
            for i in 0..200u32 {
                let payload = i.to_le_bytes();
                assert_eq!(
                    a.put(&[IoSlice::new(&[]), IoSlice::new(&payload)]).unwrap(),
                    4
                );
                assert_eq!(a.put(&[]).unwrap(), 0);
                assert_eq!(b.get(&mut []).unwrap(), 0);
                let mut g = [0u8; 4];
                assert_eq!(get_settled(&mut b, &mut g, 4).unwrap(), 4);
                assert_eq!(g, payload);
            }
        }
    });
}

#[test]
fn many_tiny_pieces_beyond_the_gather_limit() {
    bounded("many_tiny_pieces_beyond_the_gather_limit", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            let mut rng = Rng::new(t.ring as u64 ^ t.chunk as u64);
            for pieces in [29usize, 30, 31, 100, 1000] {
                let data = rng.bytes(pieces);
                let iov: Vec<IoSlice> = data.chunks(1).map(IoSlice::new).collect();
                let mut off = 0;
                let mut got = Vec::new();
                let mut stall = StallCheck::new(10_000);
                while got.len() < pieces {
                    // Offer the rest, still one byte per piece.
                    let n = a.put(&iov[off..]).unwrap();
                    off += n;
                    // Get with 1-byte pieces too (100 of them).
                    let mut bufs = [[0u8; 1]; 100];
                    let mut sl: Vec<IoSliceMut> =
                        bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
                    let m = b.get(&mut sl).unwrap();
                    drop(sl);
                    got.extend(bufs[..m].iter().map(|b| b[0]));
                    assert!(!stall.stalled(n + m > 0), "stalled {t:?}");
                }
                assert_eq!(got, data, "{t:?} pieces {pieces}");
            }
            // Mixed empty and one-byte pieces.
            let data = rng.bytes(300);
            let mut iov = Vec::new();
            for c in data.chunks(1) {
                iov.push(IoSlice::new(&[]));
                iov.push(IoSlice::new(c));
            }
            let shape: Vec<usize> = iov.iter().map(|s| s.len()).collect();
            transfer(&mut a, &mut b, &data, &shape, 77).unwrap_or_else(|e| panic!("{t:?}: {e}"));
        }
    });
}

#[test]
fn boundary_message_sizes() {
    bounded("boundary_message_sizes", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            let mut rng = Rng::new(99);
            let c = t.chunk;
            let r = t.ring;
            let o = ONE_CELL_PAYLOAD;
            let sizes = [
                1,
                o - 1,
                o,
                o + 1,
                2 * CELL - 24,
                c - 25,
                c - 24,
                c - 23,
                c,
                c + 1,
                r - 65,
                r - 64,
                r - 63,
                r - 24,
                r,
                r + 63,
                r + 64,
                r + 65,
                3 * r + 7,
            ];
            for &n in &sizes {
                // Several times each, so that the sizes meet the ring end at many offsets.
                for rep in 0..5 {
                    let data = rng.bytes(n);
                    let shape = if rep % 2 == 0 {
                        vec![n]
                    } else {
                        random_shape(&mut rng, n, 5)
                    };
                    let cap = [n, 1 + n / 3, r, 4 * r, 41][rep];
                    transfer(&mut a, &mut b, &data, &shape, cap.max(1))
                        .unwrap_or_else(|e| panic!("{t:?} size {n} rep {rep}: {e}"));
                    transfer(&mut b, &mut a, &data, &shape, cap.max(1))
                        .unwrap_or_else(|e| panic!("{t:?} size {n} rep {rep} (B->A): {e}"));
                }
            }
        }
    });
}

#[test]
fn exact_size_put_into_empty_ring_is_taken_whole() {
    bounded("exact_size_put_into_empty_ring_is_taken_whole", || {
        // Sizes that fit in a fresh, empty ring in one put: a put must take all of them.
        for t in edge_configs() {
            for n in [
                1,
                ONE_CELL_PAYLOAD - 1,
                ONE_CELL_PAYLOAD,
                ONE_CELL_PAYLOAD + 1,
                t.chunk - 24,
                t.chunk - 23,
                t.chunk,
            ] {
                let (mut a, mut b) = t.pair();
                let data = Rng::new(n as u64).bytes(n);
                let took = a.put(&[IoSlice::new(&data)]).unwrap();
                assert_eq!(
                    took, n,
                    "{t:?}: an empty ring must take {n} bytes in one put"
                );
                let mut got = vec![0u8; n + 10];
                let m = get_settled(&mut b, &mut got, n).unwrap();
                assert_eq!(m, n, "{t:?}");
                assert_eq!(&got[..n], &data[..]);
            }
        }
    });
}

/// Gets into a buffer of exactly the next message's length (as a ping-pong or an MPI
/// receive of a known size does) take that message and nothing after it, in order,
/// whether it is one packet or several, with laps, wraps and acks both ways; and a
/// message waiting behind another is left for the next get.
#[test]
fn exact_length_gets_take_one_message_at_a_time() {
    bounded("exact_length_gets_take_one_message_at_a_time", || {
        let mut rng = Rng::new(13);
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            let sizes = [
                1,
                8,
                ONE_CELL_PAYLOAD,
                ONE_CELL_PAYLOAD + 1,
                200,
                t.chunk - 24,
                t.chunk,
                3 * t.chunk + 5,
            ];
            for round in 0..40 {
                let n = sizes[round % sizes.len()];
                // There and back, as a ping-pong, each into an exact-length buffer.
                for there in [true, false] {
                    let (tx, rx) = if there {
                        (&mut a, &mut b)
                    } else {
                        (&mut b, &mut a)
                    };
                    let data = rng.bytes(n);
                    let mut got = vec![0u8; n];
                    let (mut sent, mut at) = (0, 0);
                    let mut stall = StallCheck::new(1000);
                    while at < n {
                        if sent < n {
                            sent += tx.put(&[IoSlice::new(&data[sent..])]).unwrap();
                        }
                        let m = rx.get(&mut [IoSliceMut::new(&mut got[at..])]).unwrap();
                        at += m;
                        assert!(!stall.stalled(m > 0), "{t:?}: {n} B stalled at {at}");
                    }
                    assert!(got == data, "{t:?}, round {round}: {n} B differ");
                }
            }
            // Two small messages queued: an exact-length get takes the first only.
            let (first, second) = (rng.bytes(8), rng.bytes(ONE_CELL_PAYLOAD));
            assert_eq!(a.put(&[IoSlice::new(&first)]).unwrap(), 8);
            assert_eq!(a.put(&[IoSlice::new(&second)]).unwrap(), second.len());
            let mut one = [0u8; 8];
            assert_eq!(get_settled(&mut b, &mut one, 8).unwrap(), 8, "{t:?}");
            assert_eq!(one[..], first[..], "{t:?}");
            let mut two = vec![0u8; second.len()];
            assert_eq!(
                get_settled(&mut b, &mut two, second.len()).unwrap(),
                second.len(),
                "{t:?}"
            );
            assert!(two == second, "{t:?}");
            assert_eq!(b.get(&mut [IoSliceMut::new(&mut one)]).unwrap(), 0, "{t:?}");
        }
    });
}

#[test]
fn one_byte_gets_walk_through_a_large_message() {
    bounded("one_byte_gets_walk_through_a_large_message", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            let n = 3 * t.ring + 123;
            let data = Rng::new(5).bytes(n.min(1 << 20));
            let n = data.len();
            let mut off = 0;
            let mut got = Vec::with_capacity(n);
            let mut stall = StallCheck::new(1000);
            while got.len() < n {
                if off < n {
                    off += a.put(&[IoSlice::new(&data[off..])]).unwrap();
                }
                let mut one = [0u8; 1];
                let m = b.get(&mut [IoSliceMut::new(&mut one)]).unwrap();
                assert!(m <= 1);
                if m == 1 {
                    got.push(one[0]);
                }
                assert!(
                    !stall.stalled(m == 1),
                    "{t:?}: stalled at {} of {n}",
                    got.len()
                );
            }
            assert!(got == data, "{t:?}: data differs");
        }
    });
}

#[test]
fn shutdown_write_gives_eof_after_the_data() {
    bounded("shutdown_write_gives_eof_after_the_data", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            let data = Rng::new(1).bytes(t.ring / 2);
            assert_eq!(a.put(&[IoSlice::new(&data)]).unwrap(), data.len());
            a.shutdown_write().unwrap();
            a.shutdown_write()
                .expect("a second shutdown_write is harmless");
            // Put after shutdown fails.
            let e = a.put(&[IoSlice::new(b"x")]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
            let e = a.write(b"x").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
            // The reader gets everything with `read`, then Ok(0) repeatedly.
            let mut got = Vec::new();
            let mut buf = vec![0u8; 1000];
            loop {
                let n = b.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got == data, "{t:?}");
            assert_eq!(b.read(&mut buf).unwrap(), 0);
            assert_eq!(
                b.read_vectored(&mut [IoSliceMut::new(&mut buf)]).unwrap(),
                0
            );
            let e = b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{t:?}: {e}");
            let e = b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{t:?}: {e}");
            // read_to_end works too (already at end).
            let mut rest = Vec::new();
            assert_eq!(b.read_to_end(&mut rest).unwrap(), 0);
            // The other direction still works.
            b.write_all(b"still open").unwrap();
            let mut g = [0u8; 10];
            a.read_exact(&mut g).unwrap();
            assert_eq!(&g, b"still open");
        }
    });
}

#[test]
fn try_get_reports_eof_only_after_all_data() {
    bounded("try_get_reports_eof_only_after_all_data", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            let data = Rng::new(2).bytes(3 * t.ring);
            let mut off = 0;
            let mut got = Vec::new();
            let mut closed = false;
            let mut stall = StallCheck::new(100_000);
            loop {
                let mut progressed = false;
                if off < data.len() {
                    let n = a.put(&[IoSlice::new(&data[off..])]).unwrap();
                    off += n;
                    progressed = n > 0;
                } else if !closed {
                    a.shutdown_write().unwrap();
                    closed = true;
                    progressed = true;
                }
                let mut buf = [0u8; 333];
                match b.get(&mut [IoSliceMut::new(&mut buf)]) {
                    Ok(m) => {
                        got.extend_from_slice(&buf[..m]);
                        assert!(
                            !stall.stalled(progressed || m > 0),
                            "{t:?}: no end of stream"
                        );
                    }
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        assert!(closed, "{t:?}: end of stream before the writer closed");
                        break;
                    }
                    Err(e) => panic!("{t:?}: {e}"),
                }
            }
            assert!(got == data, "{t:?}: {} of {} bytes", got.len(), data.len());
        }
    });
}

#[test]
fn write_half_shutdown_gives_eof() {
    bounded("write_half_shutdown_gives_eof", || {
        let t = Tun::new(4096, 1024);
        let (a, mut b) = t.pair();
        let (_ra, mut wa) = a.split();
        wa.write_all(b"last words").unwrap();
        wa.shutdown().unwrap();
        assert_eq!(
            wa.put(&[IoSlice::new(b"x")]).unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
        let mut s = String::new();
        with_watchdog("read_to_string", limit(30), move || {
            b.read_to_string(&mut s).unwrap();
            assert_eq!(s, "last words");
        });
    });
}

#[test]
fn put_after_peer_dropped_is_broken_pipe() {
    bounded("put_after_peer_dropped_is_broken_pipe", || {
        for t in edge_configs() {
            let (mut a, b) = t.pair();
            a.write_all(b"before").unwrap();
            drop(b);
            let e = put_error(&mut a, b"after");
            assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
            let e = a.put(&[IoSlice::new(b"again")]).unwrap_err();
            assert!(
                matches!(e.kind(), io::ErrorKind::BrokenPipe),
                "{t:?}: second put after peer drop: {e}"
            );
            // Blocking write fails too, without hanging.
            let e = with_watchdog("write_all to dropped peer", limit(30), move || {
                a.write_all(&vec![1u8; 1 << 20]).unwrap_err()
            });
            assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
        }
    });
}

#[test]
fn put_into_full_ring_after_peer_dropped_is_broken_pipe() {
    bounded(
        "put_into_full_ring_after_peer_dropped_is_broken_pipe",
        || {
            for t in edge_configs() {
                let (mut a, b) = t.pair();
                // Fill the ring.
                let data = vec![7u8; 4 * t.ring];
                let mut n = 0;
                loop {
                    let k = a.put(&[IoSlice::new(&data)]).unwrap();
                    if k == 0 {
                        break;
                    }
                    n += k;
                    assert!(n <= t.ring, "{t:?}: ring took {n} bytes without a reader");
                }
                drop(b);
                let e = put_error(&mut a, b"x");
                assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
            }
        },
    );
}

#[test]
fn blocked_writer_fails_when_the_peer_drops() {
    bounded("blocked_writer_fails_when_the_peer_drops", || {
        for t in [Tun::new(4096, 1024), Tun::new(4096, 1024).inline(64)] {
            let (mut a, b) = t.pair();
            let r = with_watchdog("blocked writer", limit(60), move || {
                let w = std::thread::spawn(move || a.write_all(&vec![3u8; 1 << 20]));
                // Give the writer a moment to fill the ring and block (not required for
                // correctness: either way the write must end with BrokenPipe).
                std::thread::sleep(Duration::from_millis(50));
                drop(b);
                w.join().unwrap()
            });
            let e = r.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
        }
    });
}

#[test]
fn read_after_peer_dropped_gets_data_then_eof() {
    bounded("read_after_peer_dropped_gets_data_then_eof", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            // Fill the ring without reading.
            let mut data = Rng::new(3).bytes(2 * t.ring);
            let mut off = 0;
            loop {
                let n = a.put(&[IoSlice::new(&data[off..])]).unwrap();
                if n == 0 {
                    break;
                }
                off += n;
            }
            assert!(off > 100, "{t:?}");
            data.truncate(off);
            drop(a);
            // With 1-byte reads first, then larger ones.
            let mut got = Vec::new();
            for _ in 0..100 {
                let mut one = [0u8; 1];
                assert_eq!(b.read(&mut one).unwrap(), 1, "{t:?}");
                got.push(one[0]);
            }
            let got = with_watchdog("read_to_end after peer drop", limit(30), move || {
                b.read_to_end(&mut got).unwrap();
                let e = b.get(&mut [IoSliceMut::new(&mut [0u8; 8])]).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
                // Writing back to the dropped peer fails (its notice that it stopped
                // reading follows the end of stream).
                let e = put_error(&mut b, b"x");
                assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{e}");
                got
            });
            assert!(got == data, "{t:?}: {} of {} bytes", got.len(), data.len());
        }
    });
}

#[test]
fn dropping_both_ends_in_any_order_is_quiet() {
    bounded("dropping_both_ends_in_any_order_is_quiet", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            a.write_all(b"pending").unwrap();
            b.write_all(b"pending").unwrap();
            drop(b);
            drop(a);
            let (a, b) = t.pair();
            drop(a);
            drop(b);
            let (a, b) = t.pair();
            let (ra, wa) = a.split();
            drop(wa);
            drop(b);
            drop(ra);
        }
    });
}

#[test]
fn reunite_accepts_own_halves_only() {
    bounded("reunite_accepts_own_halves_only", || {
        let t = Tun::new(4096, 1024);
        let (a, b) = t.pair();
        let (ra, wa) = a.split();
        let (rb, wb) = b.split();
        let (ra, wb) = match RdmaStream::reunite(ra, wb) {
            Ok(_) => panic!("halves of different streams were reunited"),
            Err(halves) => halves,
        };
        let (rb, wa) = match RdmaStream::reunite(rb, wa) {
            Ok(_) => panic!("halves of different streams were reunited"),
            Err(halves) => halves,
        };
        let mut a = RdmaStream::reunite(ra, wa).unwrap_or_else(|_| panic!("own halves refused"));
        let mut b = RdmaStream::reunite(rb, wb).unwrap_or_else(|_| panic!("own halves refused"));
        a.write_all(b"ping").unwrap();
        let mut g = [0u8; 4];
        b.read_exact(&mut g).unwrap();
        assert_eq!(&g, b"ping");
    });
}

#[test]
fn vectored_blocking_io_round_trip() {
    bounded("vectored_blocking_io_round_trip", || {
        let t = Tun::new(4096, 512).inline(64);
        let (mut a, mut b) = t.pair();
        let data = Rng::new(4).bytes(200_000);
        let d2 = data.clone();
        let w = std::thread::spawn(move || {
            let mut rng = Rng::new(8);
            let mut off = 0;
            while off < d2.len() {
                let n = rng.range(1, 20_000).min(d2.len() - off);
                let shape = random_shape(&mut rng, n, 40);
                write_all_vectored(&mut a, &d2[off..off + n], &shape).unwrap();
                off += n;
            }
            a
        });
        let got = with_watchdog("vectored reader", limit(60), move || {
            let mut rng = Rng::new(9);
            let mut got = Vec::new();
            while got.len() < 200_000 {
                let cap = rng.range(1, 9000);
                let mut buf = vec![0u8; cap];
                let shape = random_shape(&mut rng, cap, 40);
                let n = b.read_vectored(&mut iovecs_mut(&mut buf, &shape)).unwrap();
                assert!(n > 0 && n <= cap);
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
        let _a = w.join().unwrap();
        assert!(got == data);
    });
}

#[test]
fn invalid_configurations_are_rejected() {
    bounded("invalid_configurations_are_rejected", || {
        let bad = [
            Config::default().with_ring_size(5000),
            Config::default().with_ring_size(2048).with_chunk_size(1024),
            Config::default().with_ring_size(2 << 30),
            Config::default().with_ring_size(4096).with_chunk_size(64),
            Config::default().with_ring_size(4096).with_chunk_size(200),
            Config::default().with_ring_size(4096).with_chunk_size(4096),
            Config::default()
                .with_ring_size(4096)
                .with_chunk_size(1024)
                .with_tail_threshold(0),
            Config::default()
                .with_ring_size(4096)
                .with_chunk_size(1024)
                .with_tail_threshold(4096 - 63),
            Config::default()
                .with_ring_size(4096)
                .with_chunk_size(1024)
                .with_max_inline(63),
        ];
        for cfg in bad {
            match RdmaStream::pair_with(cfg.clone()) {
                Ok(_) => panic!("accepted invalid config {cfg:?}"),
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{cfg:?}: {e}"),
            }
        }
        let good = [
            Config::default()
                .with_ring_size(4096)
                .with_chunk_size(128)
                .with_tail_threshold(1)
                .with_max_inline(64),
            Config::default()
                .with_ring_size(4096)
                .with_chunk_size(2048)
                .with_tail_threshold(4096 - 64),
        ];
        for cfg in good {
            let (mut a, mut b) =
                RdmaStream::pair_with(cfg.clone()).unwrap_or_else(|e| panic!("{cfg:?}: {e}"));
            transfer(&mut a, &mut b, &[5u8; 10_000], &[10_000], 1000).unwrap();
        }
    });
}

/// The stream backoff pauses a receiver that is only receiving (two or more messages
/// since it last sent), once per message, and never one that replies to each message,
/// even when it polls once more before replying: counted by `Receiver::stream_backoffs`.
/// The pause is taken by the get after the empty poll that found the ring empty, and
/// not at all when the receiver sends in between (the ack that ends a window).
#[test]
fn stream_backoff_only_for_a_receiver_that_only_receives_and_once_per_message() {
    bounded("stream_backoff", || {
        let cfg = || Config::from_env().unwrap();
        let (mut a, mut b) = RdmaStream::pair_with(cfg()).unwrap();
        // `from` sends 4 bytes, `to` reads them and then polls its empty ring
        // `empty_polls` times; returns `to`'s backoffs so far.
        let send_one = |from: &mut RdmaStream, to: &mut RdmaStream, empty_polls: usize| {
            let mut buf = [0u8; 8];
            from.put(&[IoSlice::new(b"data")]).unwrap();
            await_data(to);
            assert_eq!(get_settled(to, &mut buf, 4).unwrap(), 4);
            for _ in 0..empty_polls {
                assert_eq!(to.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
            }
            to.channel().receiver().stream_backoffs()
        };
        // A ping-pong: each end replies to what it got, so neither backs off, though
        // each polls once more before replying.
        for _ in 0..50 {
            assert_eq!(send_one(&mut a, &mut b, 1), 0);
            assert_eq!(send_one(&mut b, &mut a, 1), 0);
        }
        // A stream: b only receives. From its second message on, each message and
        // then empty polls: one backoff per message; more empty polls of an idle
        // connection cost nothing more.
        for i in 0..20 {
            assert_eq!(send_one(&mut a, &mut b, 3), i, "message {i}");
        }
        assert_eq!(send_one(&mut a, &mut b, 1000), 20, "the 21st message");
        // Once b sends, it is a replying end again: one message since is no stream.
        b.put(&[IoSlice::new(b"ack")]).unwrap();
        assert_eq!(send_one(&mut a, &mut b, 1), 20, "one message since the ack");
        let mut buf = [0u8; 8];
        assert_eq!(
            send_one(&mut a, &mut b, 1),
            20,
            "two since the ack: the pause is the next get's"
        );
        assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
        assert_eq!(
            b.channel().receiver().stream_backoffs(),
            21,
            "two since the ack, paused"
        );
        // A third message and its empty poll arm the pause again; b answers before its
        // next get, so that get does not pause: the stream it was for has ended.
        assert_eq!(send_one(&mut a, &mut b, 1), 21, "three since the ack");
        b.put(&[IoSlice::new(b"ack")]).unwrap();
        assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
        assert_eq!(
            b.channel().receiver().stream_backoffs(),
            21,
            "answered: no pause"
        );
        // Turned off: no backoff at all.
        let (mut a, mut b) = RdmaStream::pair_with(cfg().with_stream_backoff(0)).unwrap();
        for _ in 0..10 {
            assert_eq!(send_one(&mut a, &mut b, 1), 0);
        }
    });
}

/// A ping-pong keeps each ring's traffic in a lap sized to its messages
/// (`ring::lap_end`) where the fabric shares caches (the emulated fabric): for
/// packets under 4 KiB, past room for two of them, at least 8 KiB, the sender starts
/// over at offset 0 as soon as it knows the receiver caught up (in a ping-pong,
/// within a packet or two); packets of 4 KiB and more, and every packet on other
/// fabrics, lap the working set. Every byte arrives in order across the wraps, and a
/// working set of the whole ring turns them off.
#[test]
fn a_ping_pong_stays_in_a_lap_sized_to_its_messages() {
    bounded("a_ping_pong_stays_in_a_lap_sized_to_its_messages", || {
        use rdma_channel::fabric::{AnyFabric, Fabric};
        const RING: u64 = 1 << 20;
        let shares = AnyFabric::from_env().unwrap().shares_caches();
        // Lap end, and laps at least.
        type Expect = (u64, u64);
        // (message bytes, working set, round trips, then what to expect with shared
        // caches and without)
        let cases: [(usize, usize, usize, Expect, Expect); 5] = [
            // 8 B: one cell each, an 8 KiB lap, so 2000 messages wrap 15 times; the
            // 256 KiB working set holds them all.
            (8, 256 << 10, 2000, (8 << 10, 14), (256 << 10, 0)),
            // 2 KiB: 2112-byte packets, four to an 8 KiB lap, so 400 messages wrap
            // about 100 times; or about three laps of the working set.
            (2048, 256 << 10, 400, (8 << 10, 80), (256 << 10, 2)),
            // 4 KiB: 4160-byte packets lap the working set, about three times.
            (4096, 256 << 10, 200, (256 << 10, 2), (256 << 10, 2)),
            // A working set smaller than the shortest lap is the lap.
            (8, 4 << 10, 1000, (4 << 10, 15), (4 << 10, 15)),
            // Working set off: one pass through the ring, no wrap.
            (8, RING as usize, 2000, (RING, 0), (RING, 0)),
        ];
        for (size, ws, trips, with, without) in cases {
            let (lap, min_laps) = if shares { with } else { without };
            let cfg = Config::default()
                .with_ring_size(RING as usize)
                .with_initial_ring_size(RING as usize)
                .with_working_set(ws);
            let (mut a, mut b) = RdmaStream::pair_with(cfg).unwrap();
            let packet = (size + 24).next_multiple_of(64) as u64;
            let (mut got, mut back) = (vec![0u8; size], vec![0u8; size]);
            let mut furthest = 0;
            for i in 0..trips {
                let msg: Vec<u8> = (0..size).map(|k| (i * 31 + k) as u8).collect();
                a.write_all(&msg).unwrap();
                b.read_exact(&mut got).unwrap();
                assert_eq!(got, msg, "{size} B message {i}");
                b.write_all(&got).unwrap();
                a.read_exact(&mut back).unwrap();
                assert_eq!(back, msg, "{size} B reply {i}");
                for end in [&mut a, &mut b] {
                    let offset = end.channel().sender().position() % RING;
                    furthest = furthest.max(offset);
                    assert!(
                        offset < lap + 3 * packet,
                        "{size} B, working set {ws}: offset {offset} after message {i} is past the lap ({lap}) and a packet in flight"
                    );
                }
            }
            // Traffic enough to fill a lap goes all the way through it (a long lap
            // is not cut short).
            if trips as u64 * packet >= lap {
                assert!(
                    furthest + 3 * packet >= lap,
                    "{size} B, working set {ws}: no further than offset {furthest} in a lap of {lap}"
                );
            }
            for end in [&mut a, &mut b] {
                let laps = end.channel().sender().position() / RING;
                assert!(
                    laps >= min_laps,
                    "{size} B, working set {ws}: {laps} laps in {trips} round trips, want {min_laps} or more"
                );
                if min_laps == 0 {
                    assert_eq!(laps, 0, "{size} B, working set {ws}: no early wrap");
                }
            }
        }
    });
}

/// A get whose buffer has room for more than the first packet takes every packet
/// that has landed behind it, in order, in each kind of get: `get`, `get_nowait` and
/// `get_buffered` read a lone first packet on a straight path and the rest on the
/// general one.
#[test]
fn a_roomy_get_takes_every_landed_packet() {
    bounded("a_roomy_get_takes_every_landed_packet", || {
        for t in edge_configs() {
            for kind in ["get", "get_nowait", "get_buffered"] {
                let (mut a, mut b) = t.pair();
                let mut want = Vec::new();
                for m in [&b"x"[..], b"0123456789abcdef", &[9u8; 40], &[3u8; 300]] {
                    assert_eq!(a.put(&[IoSlice::new(m)]).unwrap(), m.len(), "{t:?}");
                    want.extend_from_slice(m);
                }
                let mut buf = vec![0u8; 4096];
                let mut got = 0;
                let start = Instant::now();
                while got < want.len() {
                    assert!(start.elapsed() < SETTLE, "{kind}: {got} bytes ({t:?})");
                    let rx = b.channel().receiver();
                    let dst = &mut [IoSliceMut::new(&mut buf[got..])];
                    got += match kind {
                        "get" => rx.get(dst),
                        // SAFETY: only ring bytes were sent: no read is left in flight.
                        "get_nowait" => unsafe { rx.get_nowait(dst) },
                        _ => rx.get_buffered(dst),
                    }
                    .unwrap();
                    if !lands_later() {
                        assert_eq!(got, want.len(), "one {kind} takes all ({t:?})");
                    }
                }
                assert_eq!(&buf[..got], &want[..], "{kind} ({t:?})");
            }
        }
    })
}
