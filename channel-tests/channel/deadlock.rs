//! "Both rings full": both ends put and get at once, non-blocking and blocking, and
//! none may strand the other.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Style {
    /// Put as much as possible, then get as much as possible, repeat.
    Interleave,
    /// Only put until the first stall, then only get until all the peer's data arrived,
    /// then finish sending (interleaving).
    PutThenGet,
    /// Interleave for the first quarter (so piggybacked acks arrive), then only put
    /// (like a blocking write) until everything is sent, then only get.
    SendOnlyPhase,
    /// Like Interleave but each get phase stops at the first empty get and puts and gets
    /// use tiny random sizes.
    Nibble,
}

pub(crate) struct SideReport {
    pub(crate) sent: u64,
    pub(crate) received: u64,
}

/// One side of a non-blocking exchange: sends `total` bytes of stream `my_seed` and
/// checks it receives `total` bytes of stream `peer_seed`, then end of stream.
// Test plumbing: each argument is one knob of the scenario; a struct would only rename them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn exchange_side(
    mut s: RdmaStream,
    name: &'static str,
    my_seed: u64,
    peer_seed: u64,
    total: u64,
    style: Style,
    abort: Arc<AtomicBool>,
    deadline: Deadline,
) -> Result<SideReport, String> {
    let mut rng = Rng::new(my_seed ^ 0xFEED);
    let mut sent = 0u64;
    let mut recvd = 0u64;
    let mut eof = false;
    let mut shut = false;
    let mut msg: Vec<u8> = Vec::new(); // bytes [sent, sent + msg.len() - msg_off) pending
    let mut msg_off = 0usize;
    let mut shape: Vec<usize> = Vec::new();
    let mut rbuf = vec![0u8; 1 << 16];
    let mut scratch = Vec::new();
    let mut stalled_once = false;
    let mut iter = 0u64;
    let state = |sent: u64, recvd: u64, eof: bool| {
        format!("{name}: sent {sent}/{total}, received {recvd}/{total}, eof {eof}")
    };
    loop {
        iter += 1;
        if iter % 256 == 0 {
            if abort.load(Ordering::Relaxed) {
                return Err(format!(
                    "{}: aborted (peer failed)",
                    state(sent, recvd, eof)
                ));
            }
            deadline.check(|| state(sent, recvd, eof))?;
        }
        if sent == total && eof {
            return Ok(SideReport {
                sent,
                received: recvd,
            });
        }
        let phase_put_only = match style {
            Style::PutThenGet => !stalled_once,
            Style::SendOnlyPhase => sent >= total / 4 && sent < total,
            _ => false,
        };
        let phase_get_only = match style {
            Style::PutThenGet => stalled_once && recvd < total,
            Style::SendOnlyPhase => sent == total,
            _ => false,
        };
        // Put phase.
        if !phase_get_only {
            let mut puts = 0;
            while sent < total {
                if msg_off == msg.len() {
                    let max = if style == Style::Nibble {
                        300
                    } else {
                        64 << 10
                    };
                    let n = (rng.log_uniform(1, max) as u64).min(total - sent) as usize;
                    msg.resize(n, 0);
                    stream_fill(my_seed, sent, &mut msg);
                    msg_off = 0;
                    let maxp = if rng.chance(1, 8) { 40 } else { 3 };
                    shape = random_shape(&mut rng, n, maxp);
                }
                // Offer the rest of the message (cut as `shape`, from msg_off).
                let n = s
                    .put(&iovecs(&msg, &shape, msg_off))
                    .map_err(|e| format!("{}: put: {}", state(sent, recvd, eof), ioe(&e)))?;
                if n > msg.len() - msg_off {
                    return Err(format!(
                        "{name}: put took {n}, offered {}",
                        msg.len() - msg_off
                    ));
                }
                msg_off += n;
                sent += n as u64;
                if n == 0 {
                    stalled_once = true;
                    break;
                }
                puts += 1;
                if style == Style::Nibble && puts > 3 {
                    break;
                }
            }
            if sent == total && !shut {
                s.shutdown_write()
                    .map_err(|e| format!("{name}: shutdown_write: {}", ioe(&e)))?;
                shut = true;
            }
        }
        // Get phase.
        if !phase_put_only && !eof {
            loop {
                let cap = if style == Style::Nibble {
                    rng.range(1, 200)
                } else {
                    rng.range(1, rbuf.len())
                };
                match s.get(&mut [IoSliceMut::new(&mut rbuf[..cap])]) {
                    Ok(0) => break,
                    Ok(m) => {
                        if recvd + m as u64 > total {
                            return Err(format!("{name}: received more than {total} bytes"));
                        }
                        stream_check(peer_seed, recvd, &rbuf[..m], &mut scratch)
                            .map_err(|e| format!("{name}: {e}"))?;
                        recvd += m as u64;
                        if style == Style::Nibble {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        if recvd != total {
                            return Err(format!(
                                "{}: premature end of stream",
                                state(sent, recvd, eof)
                            ));
                        }
                        eof = true;
                        break;
                    }
                    Err(e) => return Err(format!("{}: get: {}", state(sent, recvd, eof), ioe(&e))),
                }
            }
        }
        if phase_put_only || phase_get_only {
            std::thread::yield_now();
        }
    }
}

pub(crate) fn run_exchange(t: &Tun, total: u64, style_a: Style, style_b: Style) {
    let total = scaled_bytes(total, EXCHANGE_FLOOR);
    let (a, b) = t.pair();
    let abort = Arc::new(AtomicBool::new(false));
    let deadline = Deadline::after(limit(90));
    let start = Instant::now();
    let spawn = |s: RdmaStream, name: &'static str, mine: u64, peer: u64, style: Style| {
        let abort = abort.clone();
        std::thread::spawn(move || {
            let r = exchange_side(s, name, mine, peer, total, style, abort.clone(), deadline);
            if r.is_err() {
                abort.store(true, Ordering::Relaxed);
            }
            r
        })
    };
    let ha = spawn(a, "A", 0xA11CE, 0xB0B, style_a);
    let hb = spawn(b, "B", 0xB0B, 0xA11CE, style_b);
    let (ra, rb) = (join(ha, "side A"), join(hb, "side B"));
    let (ra, rb) = match (ra, rb) {
        (Ok(a), Ok(b)) => (a, b),
        (ra, rb) => panic!(
            "{t:?} {style_a:?}/{style_b:?}:\n  A: {:?}\n  B: {:?}",
            ra.err(),
            rb.err()
        ),
    };
    assert_eq!(
        (ra.sent, ra.received, rb.sent, rb.received),
        (total, total, total, total)
    );
    eprintln!(
        "exchange {t:?} {style_a:?}/{style_b:?}: 2 x {} MiB in {:?}",
        total >> 20,
        start.elapsed()
    );
}

/// Bytes each way of an exchange at `RCH_TEST_CASE_SCALE` 1 (scaled by it, down to
/// [`EXCHANGE_FLOOR`]: each byte past the first laps only repeats them, and on verbs
/// in a VM these exchanges were half the channel suite's time).
pub(crate) const EXCHANGE_BYTES: u64 = 8 << 20;
/// The least an exchange moves each way at any scale: 256 laps of a 4 KiB ring.
const EXCHANGE_FLOOR: u64 = 1 << 20;

#[test]
fn both_rings_full_nonblocking_interleaved() {
    bounded("both_rings_full_nonblocking_interleaved", || {
        run_exchange(
            &Tun::new(4096, 1024),
            EXCHANGE_BYTES,
            Style::Interleave,
            Style::Interleave,
        );
    });
}

#[test]
fn both_rings_full_nonblocking_large_threshold() {
    bounded("both_rings_full_nonblocking_large_threshold", || {
        run_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64),
            EXCHANGE_BYTES,
            Style::Interleave,
            Style::Interleave,
        );
    });
}

#[test]
fn both_rings_full_tiny_chunks_threshold_one_staging() {
    bounded("both_rings_full_tiny_chunks_threshold_one_staging", || {
        run_exchange(
            &Tun::new(4096, 128).threshold(1).inline(64),
            EXCHANGE_BYTES / 4,
            Style::Interleave,
            Style::Nibble,
        );
    });
}

#[test]
fn one_side_puts_until_stall_then_only_gets() {
    bounded("one_side_puts_until_stall_then_only_gets", || {
        run_exchange(
            &Tun::new(4096, 1024),
            EXCHANGE_BYTES,
            Style::PutThenGet,
            Style::Interleave,
        );
        run_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64),
            EXCHANGE_BYTES,
            Style::PutThenGet,
            Style::Interleave,
        );
        run_exchange(
            &Tun::new(4096, 1024).inline(64),
            EXCHANGE_BYTES,
            Style::Interleave,
            Style::PutThenGet,
        );
    });
}

#[test]
fn one_side_only_sends_for_a_while_large_threshold() {
    bounded("one_side_only_sends_for_a_while_large_threshold", || {
        run_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64),
            EXCHANGE_BYTES,
            Style::SendOnlyPhase,
            Style::Interleave,
        );
        run_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64).inline(64),
            EXCHANGE_BYTES,
            Style::SendOnlyPhase,
            Style::Nibble,
        );
    });
}

#[test]
fn both_rings_full_nibbling() {
    bounded("both_rings_full_nibbling", || {
        run_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64),
            EXCHANGE_BYTES / 4,
            Style::Nibble,
            Style::Nibble,
        );
        run_exchange(
            &Tun::new(8192, 4096).threshold(100),
            EXCHANGE_BYTES / 4,
            Style::Nibble,
            Style::Interleave,
        );
    });
}

/// Blocking variant: each side splits its stream; a writer thread `write_all`s (some
/// vectored) while a reader thread reads and checks. Four threads in all.
pub(crate) fn run_blocking_exchange(t: &Tun, total: u64) {
    let total = scaled_bytes(total, EXCHANGE_FLOOR);
    let (a, b) = t.pair();
    let t2 = t.clone();
    with_watchdog("blocking exchange", limit(120), move || {
        let start = Instant::now();
        let (ra, wa) = a.split();
        let (rb, wb) = b.split();
        let writer = |mut w: rdma_channel::WriteHalf, seed: u64| {
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = Rng::new(seed ^ 77);
                let mut off = 0u64;
                let mut msg = Vec::new();
                while off < total {
                    let n = (rng.log_uniform(1, 256 << 10) as u64).min(total - off) as usize;
                    msg.resize(n, 0);
                    stream_fill(seed, off, &mut msg);
                    if rng.chance(1, 3) {
                        let shape = random_shape(&mut rng, n, 8);
                        write_all_vectored(&mut w, &msg, &shape).map_err(|e| ioe(&e))?;
                    } else {
                        w.write_all(&msg).map_err(|e| ioe(&e))?;
                    }
                    off += n as u64;
                }
                w.shutdown().map_err(|e| ioe(&e))
            })
        };
        let reader = |mut r: rdma_channel::ReadHalf, seed: u64| {
            std::thread::spawn(move || -> Result<u64, String> {
                let mut rng = Rng::new(seed ^ 99);
                let mut buf = vec![0u8; 128 << 10];
                let mut scratch = Vec::new();
                let mut got = 0u64;
                loop {
                    let (n, _) = read_random(&mut r, &mut buf, &mut rng).map_err(|e| ioe(&e))?;
                    if n == 0 {
                        return Ok(got);
                    }
                    stream_check(seed, got, &buf[..n], &mut scratch)?;
                    got += n as u64;
                }
            })
        };
        let w1 = writer(wa, 0x1111);
        let w2 = writer(wb, 0x2222);
        let r1 = reader(rb, 0x1111);
        let r2 = reader(ra, 0x2222);
        let res = (
            join(w1, "writer A"),
            join(w2, "writer B"),
            join(r1, "reader B"),
            join(r2, "reader A"),
        );
        match res {
            (Ok(()), Ok(()), Ok(g1), Ok(g2)) => {
                assert_eq!((g1, g2), (total, total), "{t2:?}: lengths");
            }
            other => panic!("{t2:?}: {other:?}"),
        }
        eprintln!(
            "blocking exchange {t2:?}: 2 x {} MiB in {:?}",
            total >> 20,
            start.elapsed()
        );
    });
}

#[test]
fn both_rings_full_blocking_split_halves() {
    bounded("both_rings_full_blocking_split_halves", || {
        run_blocking_exchange(&Tun::new(4096, 1024), EXCHANGE_BYTES);
    });
}

#[test]
fn both_rings_full_blocking_large_threshold_staging() {
    bounded("both_rings_full_blocking_large_threshold_staging", || {
        run_blocking_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64).inline(64),
            EXCHANGE_BYTES,
        );
    });
}

#[test]
fn blocking_exchange_default_config() {
    bounded("blocking_exchange_default_config", || {
        let (a, b) = RdmaStream::pair_with(Config::default()).unwrap();
        // Default wait policy (long spins) with four threads; at least two laps of
        // the default 4 MiB ring each way.
        let total = scaled_bytes(32 << 20, 8 << 20);
        with_watchdog("default-config exchange", limit(120), move || {
            let (mut ra, mut wa) = a.split();
            let (mut rb, mut wb) = b.split();
            let w1 = std::thread::spawn(move || {
                let data = stream_vec(1, 0, total as usize);
                wa.write_all(&data).unwrap();
            });
            let w2 = std::thread::spawn(move || {
                let data = stream_vec(2, 0, total as usize);
                wb.write_all(&data).unwrap();
            });
            let r1 = std::thread::spawn(move || {
                let mut v = Vec::new();
                rb.read_to_end(&mut v).unwrap();
                v
            });
            let mut v = Vec::new();
            ra.read_to_end(&mut v).unwrap();
            w1.join().unwrap();
            w2.join().unwrap();
            let v1 = r1.join().unwrap();
            assert!(v1 == stream_vec(1, 0, total as usize), "A->B data differs");
            assert!(v == stream_vec(2, 0, total as usize), "B->A data differs");
        });
    });
}
