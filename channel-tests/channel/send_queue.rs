//! A finite send queue shared by both halves of a connection. On verbs the sending
//! half posts its packets and the receiving half posts control words (tail updates,
//! credit) and RDMA READs on the same queue pair, whose send queue has a fixed depth:
//! a post to a full queue fails (`ibv_post_send` returns ENOMEM) and breaks the
//! connection. The emulated fabric models such a queue
//! (`EmuFabric::with_send_queue_depth`), so the engine's discipline is tested here
//! on every run: both halves of both ends post as fast as they can into a queue of
//! 4 while the data is checked byte for byte. A reservation that checks for a slot
//! and takes it in two steps lets both halves take the last slot; the queue then
//! refuses a post and the connection fails (seen with the check-then-`fetch_add`
//! reservation this test was written against).

use super::*;
use rdma_channel::fabric::emulated::EmuFabric;
use rdma_channel::Prepared;
use std::thread;

/// Bytes each direction carries.
const TOTAL: usize = 4 << 20;

#[test]
fn both_halves_posting_never_overrun_a_finite_send_queue() {
    // The queue under test is the emulated fabric's, whatever RCH_FABRIC says: on a
    // verbs run (the Soft-RoCE VM, ~70 s under TCG) it would only repeat the host's.
    if fabric_kind() != rdma_channel::fabric::FabricKind::Emulated {
        println!(
            "both_halves_posting: emulated fabric only, skipped on {:?}",
            fabric_kind()
        );
        return;
    }
    // A small ring, small chunks and a tail update after every 64 bytes read: many
    // packets and many control writes, so the two halves of each end post all the time.
    let cfg = Config::default()
        .with_ring_size(4096)
        .with_chunk_size(256)
        .with_tail_threshold(64);
    // Several rounds per depth: the race the test is after is a matter of timing.
    for depth in [2, 2, 2, 2, 3, 3, 4, 4, 16] {
        let a = Prepared::new(
            EmuFabric::new().unwrap().with_send_queue_depth(depth),
            cfg.clone(),
        )
        .unwrap();
        let b = Prepared::new(
            EmuFabric::new().unwrap().with_send_queue_depth(depth),
            cfg.clone(),
        )
        .unwrap();
        let (ca, cb) = (a.card().unwrap(), b.card().unwrap());
        let (a, b) = (a.connect(cb).unwrap(), b.connect(ca).unwrap());
        let (mut rx_a, mut tx_a) = a.split();
        let (mut rx_b, mut tx_b) = b.split();
        let deadline = Instant::now() + limit(120);
        let send = move |tx: &mut rdma_channel::Sender<EmuFabric>, seed: u64| -> io::Result<()> {
            let data = stream_vec(seed, 0, TOTAL);
            let mut rng = Rng::new(seed);
            let mut off = 0;
            while off < TOTAL {
                let n = rng.range(1, 700).min(TOTAL - off);
                off += tx.put(&[IoSlice::new(&data[off..off + n])])?;
                if Instant::now() > deadline {
                    return Err(io::Error::other(format!("writer stuck at {off}")));
                }
            }
            tx.close()
        };
        let recv = move |rx: &mut rdma_channel::Receiver<EmuFabric>, seed: u64| -> io::Result<()> {
            let mut got = vec![0u8; TOTAL];
            let mut off = 0;
            let mut rng = Rng::new(seed ^ 0xabc);
            while off < TOTAL {
                let n = rng.range(1, 300).min(TOTAL - off);
                off += rx.get(&mut [IoSliceMut::new(&mut got[off..off + n])])?;
                if Instant::now() > deadline {
                    return Err(io::Error::other(format!("reader stuck at {off}")));
                }
            }
            if got != stream_vec(seed, 0, TOTAL) {
                let at = (0..TOTAL).find(|&i| got[i] != stream_vec(seed, i as u64, 1)[0]);
                return Err(io::Error::other(format!("corrupt byte at {at:?}")));
            }
            Ok(())
        };
        // Each thread hands its half back, so that no end is dropped (and its queue
        // pair with it) while the other end still posts to it.
        let writers = [
            thread::spawn(move || send(&mut tx_a, 1).map(|()| tx_a)),
            thread::spawn(move || send(&mut tx_b, 2).map(|()| tx_b)),
        ];
        let readers = [
            thread::spawn(move || recv(&mut rx_b, 1).map(|()| rx_b)),
            thread::spawn(move || recv(&mut rx_a, 2).map(|()| rx_a)),
        ];
        let mut halves = (Vec::new(), Vec::new());
        for t in writers {
            match t.join().expect("writer thread") {
                Ok(tx) => halves.0.push(tx),
                Err(e) => panic!("send queue of depth {depth}: writer: {}", ioe(&e)),
            }
        }
        for t in readers {
            match t.join().expect("reader thread") {
                Ok(rx) => halves.1.push(rx),
                Err(e) => panic!("send queue of depth {depth}: reader: {}", ioe(&e)),
            }
        }
    }
}
