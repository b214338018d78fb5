//! What this machine allows, with no channel at all: the one-way cross-core hand-off of
//! one cache line, and the bandwidth of a minimal two-copy ring (a producer thread
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

fn main() {
    println!(
        "# cross-core one-way hand-off: {:.1} ns",
        handoff_ns(1_000_000)
    );
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
