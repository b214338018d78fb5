//! The channel's own cost, without the cross-core traffic: one thread puts a message
//! and gets it back on a connected pair, so every line stays in its L1/L2. What is
//! left is instructions, in nanoseconds:
//!
//! ```text
//! cargo bench --bench software                      # ns per put + get
//! ```
//!
//! For exact instruction counts, which do not depend on the machine's load and so
//! judge a change to the small-message path on this noisy host, use
//! `bench/instructions.sh` (a put, a get and an empty poll, each counted apart).

use std::io::{self, IoSlice, IoSliceMut};
use std::time::Instant;

#[path = "peer.rs"]
#[allow(dead_code)]
mod peer;

fn main() -> io::Result<()> {
    let sizes = peer::sizes_from_args(&[8, 64, 512, 4096]);
    let args: Vec<String> = std::env::args().collect();
    let iters: usize = args
        .iter()
        .position(|a| a == "--iters")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("--iters N"))
        .unwrap_or(1_000_000);
    peer::pin_to_cpu(0);
    let (mut a, mut b) = rdma_channel::RdmaStream::pair()?;
    println!("# one thread, put then get on a pair; ns per message (best of 3 rounds)");
    println!("{:>10} {:>10} {:>12}", "size", "n", "put+get_ns");
    for size in sizes {
        let sbuf = vec![0x5au8; size];
        let mut rbuf = vec![0u8; size];
        let n = (iters * 64 / (size + 64)).max(1000);
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..n {
                let mut at = 0;
                while at < size {
                    at += a.put(&[IoSlice::new(&sbuf[at..])])?;
                }
                let mut at = 0;
                while at < size {
                    at += b.get(&mut [IoSliceMut::new(&mut rbuf[at..])])?;
                }
            }
            best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
        }
        assert_eq!(rbuf, sbuf, "bytes changed in transit");
        println!("{size:>10} {n:>10} {best:>12.1}");
    }
    // An empty poll: what a receiver spinning on an idle connection pays per try,
    // and so about half of it is added to every message's latency on average.
    let mut rbuf = [0u8; 8];
    let n: usize = args
        .iter()
        .position(|a| a == "--empty-iters")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("--empty-iters N"))
        .unwrap_or(iters * 4);
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..n {
            assert_eq!(b.get(&mut [IoSliceMut::new(&mut rbuf)])?, 0);
        }
        best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
    }
    println!("{:>10} {n:>10} {best:>12.1}", "empty get");
    Ok(())
}
