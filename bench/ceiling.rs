//! What this machine allows, with no channel at all: the one-way cross-core hand-off of
//! one cache line, the one-way latency of a minimal ring with the channel's one-cell
//! packet format (header, payload, trailer; the reader zeroes header and trailer),
//! and the bandwidth of a minimal two-copy ring (a producer thread
//! copies into a shared ring and publishes a head index, a consumer on the other core
//! copies out and publishes a tail). Any ring-based channel is bounded by these.
//!
//! ```text
//! cargo bench --bench ceiling
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[path = "peer.rs"]
#[allow(dead_code)]
mod peer;

/// An index on its own cache lines, so head and tail do not share one.
#[repr(align(128))]
struct Index(AtomicU64);

struct Ring {
    buf: Vec<u8>,
    head: Index,
    tail: Index,
}

/// One-way hand-off: half the round trip of a value bounced between two threads.
fn handoff_ns(rounds: u64) -> f64 {
    let pair = Arc::new((Index(AtomicU64::new(0)), Index(AtomicU64::new(0))));
    let other = pair.clone();
    let t = std::thread::spawn(move || {
        peer::pin_to_cpu(1);
        for i in 1..=rounds {
            // Acquire/Release: a plain hand-off; the value is the payload.
            while other.0 .0.load(Ordering::Acquire) != i {}
            other.1 .0.store(i, Ordering::Release);
        }
    });
    peer::pin_to_cpu(0);
    let start = Instant::now();
    for i in 1..=rounds {
        pair.0 .0.store(i, Ordering::Release);
        while pair.1 .0.load(Ordering::Acquire) != i {}
    }
    t.join().unwrap();
    start.elapsed().as_nanos() as f64 / rounds as f64 / 2.0
}

/// GB/s of moving `total` bytes through a ring of `ring` bytes in `chunk`-byte copies.
fn two_copy_gbs(ring: usize, chunk: usize, total: usize) -> f64 {
    let r = Arc::new(Ring {
        buf: vec![0u8; ring],
        head: Index(AtomicU64::new(0)),
        tail: Index(AtomicU64::new(0)),
    });
    let base = r.buf.as_ptr() as usize;
    let consumer = {
        let r = r.clone();
        std::thread::spawn(move || {
            peer::pin_to_cpu(1);
            let mut dst = vec![0u8; chunk];
            let mut got = 0usize;
            while got < total {
                // Acquire: the producer's bytes before its Release of `head` are visible.
                let head = r.head.0.load(Ordering::Acquire) as usize;
                if head == got {
                    std::hint::spin_loop();
                    continue;
                }
                let n = (head - got).min(chunk);
                // SAFETY: [got % ring, +n) lies in the ring (chunks divide the ring) and
                // the producer will not rewrite it before we publish a tail past it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (base + got % ring) as *const u8,
                        dst.as_mut_ptr(),
                        n,
                    )
                };
                got += n;
                // Release: our reads happen before the producer reuses the space.
                r.tail.0.store(got as u64, Ordering::Release);
            }
            std::hint::black_box(&dst);
        })
    };
    peer::pin_to_cpu(0);
    let src = vec![1u8; chunk];
    let start = Instant::now();
    let mut put = 0usize;
    while put < total {
        // Acquire: the consumer finished reading what it released.
        if put + chunk - r.tail.0.load(Ordering::Acquire) as usize > ring {
            std::hint::spin_loop();
            continue;
        }
        // SAFETY: the chunk lies inside the ring and the consumer has released it; the
        // consumer reads it only after the Release store of `head` below.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), (base + put % ring) as *mut u8, chunk)
        };
        put += chunk;
        // Release: the bytes above are visible before the new head.
        r.head.0.store(put as u64, Ordering::Release);
    }
    consumer.join().unwrap();
    total as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// One direction of the minimal cell ring: 64-byte cells, each packet one cell with
/// a header word (position and length), the payload, and a trailer word; the reader
/// copies the payload out and zeroes both words before it moves on. The format of
/// the channel's own one-cell packets, with nothing else around it.
#[repr(align(128))]
struct CellRing {
    words: Vec<AtomicU64>,
    cells: u64,
}

impl CellRing {
    fn new(cells: u64) -> CellRing {
        CellRing {
            words: (0..cells * 8).map(|_| AtomicU64::new(0)).collect(),
            cells,
        }
    }

    fn word(&self, pos: u64) -> usize {
        ((pos % self.cells) * 8) as usize
    }

    fn write(&self, pos: u64, payload: u64) {
        let w = self.word(pos);
        // Relaxed: the trailer's Release below orders these before it.
        self.words[w].store(pos << 8 | 8, Ordering::Relaxed);
        self.words[w + 2].store(payload, Ordering::Relaxed);
        // Release: the reader sees header and payload once it sees the trailer.
        self.words[w + 7].store(!pos, Ordering::Release);
    }

    fn read(&self, pos: u64) -> Option<u64> {
        let w = self.word(pos);
        if self.words[w].load(Ordering::Relaxed) != pos << 8 | 8 {
            return None;
        }
        // Acquire: pairs with the writer's Release of the trailer.
        if self.words[w + 7].load(Ordering::Acquire) != !pos {
            return None;
        }
        Some(self.words[w + 2].load(Ordering::Relaxed))
    }

    /// Zeroes the header and trailer of the cell at `pos` (the reader's part before
    /// the writer may reuse it). Relaxed: in this ping-pong the writer comes back to
    /// the cell only a lap later, after many replies that order it.
    fn clear(&self, pos: u64) {
        let w = self.word(pos);
        self.words[w].store(0, Ordering::Relaxed);
        self.words[w + 7].store(0, Ordering::Relaxed);
    }

    /// Waits for the packet at `pos`; clears it at once, or leaves that to the next
    /// call (`deferred`, as the channel's `Receiver::release_read` does).
    fn take(&self, pos: u64, deferred: bool) -> u64 {
        if deferred && pos > 0 {
            self.clear(pos - 1);
        }
        let v = loop {
            if let Some(v) = self.read(pos) {
                break v;
            }
        };
        if !deferred {
            self.clear(pos);
        }
        v
    }
}

/// One-way latency of an 8-byte message through two minimal cell rings of `cells`
/// cells (one per direction): the floor for any channel with this packet format,
/// cycling through as many lines, on this machine.
fn cell_ring_pingpong_ns(rounds: u64, cells: u64, deferred: bool) -> f64 {
    let rings = Arc::new((CellRing::new(cells), CellRing::new(cells)));
    let other = rings.clone();
    let t = std::thread::spawn(move || {
        peer::pin_to_cpu(1);
        for pos in 0..rounds {
            let v = other.0.take(pos, deferred);
            other.1.write(pos, v + 1);
        }
    });
    peer::pin_to_cpu(0);
    let start = Instant::now();
    for pos in 0..rounds {
        rings.0.write(pos, pos);
        assert_eq!(rings.1.take(pos, deferred), pos + 1);
    }
    t.join().unwrap();
    start.elapsed().as_nanos() as f64 / rounds as f64 / 2.0
}

fn main() {
    println!(
        "# cross-core one-way hand-off: {:.1} ns",
        handoff_ns(1_000_000)
    );
    // 4096 cells: a full 256 KiB working set. 128 cells: the 8 KiB lap the channel
    // cycles through with small messages on a fabric that shares caches
    // (ring::lap_end), which is the floor its 8 B latency is to be held against: lines
    // both cores touched a moment ago move faster between them.
    for cells in [4096, 128] {
        for (deferred, when) in [(false, "at once"), (true, "one step later")] {
            println!(
                "# 8 B one-way through a minimal ring of {cells} one-cell packets, cells cleared {when}: {:.1} ns",
                cell_ring_pingpong_ns(1_000_000, cells, deferred)
            );
        }
    }
    println!("{:>10} {:>10} {:>14}", "ring", "chunk", "two-copy GB/s");
    for (ring, chunk) in [
        (64 << 10, 16 << 10),
        (256 << 10, 16 << 10),
        (1 << 20, 64 << 10),
        (4 << 20, 64 << 10),
    ] {
        println!(
            "{:>10} {:>10} {:>14.2}",
            ring,
            chunk,
            two_copy_gbs(ring, chunk, 2 << 30)
        );
    }
}
