//! OSU-style point-to-point benchmark between two processes pinned to different cores:
//! one-way latency (ping-pong) and windowed bandwidth (64 messages in flight), sizes
//! 1 B to 4 MiB, beside a single-thread memcpy of the same size.
//!
//! ```text
//! cargo bench --bench pingpong                       # full table
//! cargo bench --bench pingpong -- --sizes 8,65536    # chosen sizes
//! cargo bench --bench pingpong -- --alloc            # buffers from alloc_mem
//! cargo bench --bench pingpong -- --in-place         # receive in place (Receiver::peek)
//! cargo bench --bench pingpong -- --csv t.csv         # the table as CSV too
//! RCH_RING_SIZE=1m RCH_CHUNK_SIZE=32k cargo bench --bench pingpong -- --sizes 1048576
//! ```
//!
//! A byte pipe has no 0-byte message (a put of nothing moves nothing), so the table
//! starts at 1 B.
//!
//! `--csv FILE` writes the table in the format `bench/plot.rs` draws (that of
//! `bench/peers.sh`): `system,label,size,latency_us,bw_GBps` after the `#` comments,
//! the memcpy column as a system of its own with no latency.

#[path = "peer.rs"]
mod peer;

use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;
use std::time::Instant;

use peer::{bandwidth, connect_pair, finish, latency, Side};

const WINDOW: usize = 64;

/// 1 B, 2 B, 4 B, ... 4 MiB.
fn default_sizes() -> Vec<usize> {
    (0..=22).map(|k| 1usize << k).collect()
}

/// Iteration counts that keep each row near a fixed time budget.
fn lat_iters(size: usize) -> usize {
    (20_000_000 / (size + 2000)).clamp(50, 20_000)
}

fn bw_iters(size: usize) -> usize {
    (2_000_000_000 / (size * WINDOW + 100_000)).clamp(5, 2_000)
}

/// GB/s of a single-thread memcpy of `size` bytes between two warm buffers.
fn memcpy_rate(size: usize) -> f64 {
    let src = vec![1u8; size];
    let mut dst = vec![0u8; size];
    let iters = (4_000_000_000 / (size + 64)).clamp(10, 1_000_000);
    dst.copy_from_slice(&src);
    let t = Instant::now();
    for _ in 0..iters {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// The file of `--csv FILE`, if given.
fn csv_path() -> Option<PathBuf> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2)
        .find(|w| w[0] == "--csv")
        .map(|w| PathBuf::from(&w[1]))
}

fn main() -> io::Result<()> {
    // cargo bench passes --bench; ignore it.
    let sizes = peer::sizes_from_args(&default_sizes());
    let (mut s, side) = connect_pair("bench")?;
    let parent = matches!(side, Side::Parent(_));
    let cfg = s.config().clone();
    let buffers = match (peer::alloc_buffers(), peer::in_place()) {
        (false, false) => "heap",
        (true, false) => "alloc_mem",
        (false, true) => "heap, in place",
        (true, true) => "alloc_mem, in place",
    };
    let comments = [
        format!(
            "# rdma-channel {} on the {} fabric (RCH_FABRIC), two processes on CPUs 0 and 1",
            env!("CARGO_PKG_VERSION"),
            std::env::var("RCH_FABRIC")
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "emulated".into())
        ),
        format!(
            "# ring {} B, chunk {} B, tail threshold {} B; one-way latency = half the mean round trip",
            cfg.ring_size(),
            cfg.chunk_size(),
            cfg.tail_threshold()
        ),
        format!(
            "# buffers: {} (separate send and receive buffers, as osu_latency/osu_bw); default zero-copy thresholds",
            if peer::alloc_buffers() { "alloc_mem (like MPI_Alloc_mem)" } else { "heap" }
        ),
        format!(
            "# receive: {}",
            if peer::in_place() {
                "in place (Receiver::peek and consume; the bytes are not read, as ucx_perftest's am test)"
            } else {
                "copied into the receive buffer (get)"
            }
        ),
    ];
    // The rows of --csv: ours, then memcpy's (its latency column empty).
    let (mut ours, mut memcpy) = (String::new(), String::new());
    if parent {
        for c in &comments {
            println!("{c}");
        }
        println!(
            "{:>10} {:>12} {:>12} {:>12}",
            "size", "latency_us", "bw_GB/s", "memcpy_GB/s"
        );
    }
    for &size in &sizes {
        let lat = latency(&mut s, &side, size, lat_iters(size))?;
        let bw = bandwidth(&mut s, &side, size, WINDOW, bw_iters(size))?;
        if parent {
            let (lat_us, bw_gbps, copy) = (lat.as_secs_f64() * 1e6, bw / 1e9, memcpy_rate(size));
            println!("{size:>10} {lat_us:>12.3} {bw_gbps:>12.3} {copy:>12.2}");
            let _ = writeln!(
                ours,
                "rdma-channel,rdma-channel ({buffers}),{size},{lat_us:.3},{bw_gbps:.2}"
            );
            let _ = writeln!(memcpy, "memcpy,single-thread memcpy,{size},,{copy:.2}");
        }
    }
    drop(s);
    if let (true, Some(path)) = (parent, csv_path()) {
        let text = format!(
            "{}\nsystem,label,size,latency_us,bw_GBps\n{ours}{memcpy}",
            comments.join("\n")
        );
        std::fs::write(&path, text)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    }
    finish(side)
}
