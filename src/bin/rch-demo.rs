//! The demo: two processes connect over the emulated RDMA fabric, move data both ways,
//! verify it, and print latency and bandwidth.
//!
//! ```text
//! cargo run --release --bin rch-demo
//! ```

// Shared with the benchmarks; not every helper is used here.
#[path = "../../bench/peer.rs"]
#[allow(dead_code)]
mod peer;

use std::io;
use std::time::Instant;

use peer::{bandwidth, connect_pair, finish, latency, recv_all, send_all, Side};

/// A cheap deterministic byte stream both sides can regenerate.
fn fill(buf: &mut [u8], mut seed: u64) {
    for chunk in buf.chunks_mut(8) {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let bytes = (seed ^ (seed >> 29)).to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

fn main() -> io::Result<()> {
    let (mut s, side) = connect_pair("demo")?;
    let parent = matches!(side, Side::Parent(_));
    if parent {
        println!(
            "rdma-channel demo: two processes, emulated RDMA fabric (shared memory), CPUs 0 and 1"
        );
    }

    // 1. Move 256 MiB each way in 1 MiB messages and verify every byte.
    let msg = 1 << 20;
    let count = 256;
    let mut out = vec![0u8; msg];
    let mut inp = vec![0u8; msg];
    let t = Instant::now();
    for i in 0..count {
        let (my, theirs) = if parent {
            (i, i + 1_000_000)
        } else {
            (i + 1_000_000, i)
        };
        fill(&mut out, my as u64);
        if parent {
            send_all(&mut s, &out)?;
            recv_all(&mut s, &mut inp)?;
        } else {
            recv_all(&mut s, &mut inp)?;
            send_all(&mut s, &out)?;
        }
        fill(&mut out, theirs as u64);
        if inp != out {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("message {i} corrupted"),
            ));
        }
    }
    if parent {
        let secs = t.elapsed().as_secs_f64();
        println!(
            "verified {} MiB each way in 1 MiB messages ({:.2} s, checked byte for byte)",
            (count * msg) >> 20,
            secs
        );
        println!(
            "{:>10} {:>14} {:>16}",
            "size", "latency (us)", "bandwidth (GB/s)"
        );
    }

    // 2. Latency and bandwidth at a few sizes.
    for size in [8usize, 4096, 65536, 1 << 20] {
        let lat = latency(
            &mut s,
            &side,
            size,
            (4_000_000 / (size + 1000)).clamp(100, 10_000),
        )?;
        let bw = bandwidth(
            &mut s,
            &side,
            size,
            64,
            (400_000_000 / (size * 64 + 10_000)).clamp(5, 500),
        )?;
        if parent {
            println!(
                "{:>10} {:>14.3} {:>16.2}",
                size,
                lat.as_secs_f64() * 1e6,
                bw / 1e9
            );
        }
    }
    drop(s);
    finish(side)?;
    if parent {
        println!("(one-way latency = half the ping-pong round trip; bandwidth with 64 messages in flight)");
    }
    Ok(())
}
