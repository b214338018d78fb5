//! More busy threads than cores: N pairs of threads in one process do blocking 8-byte
//! ping-pong through `Read`/`Write` for 2 s and the program prints round trips per
//! second. Used to choose the blocking-wait policy (`RCH_SPIN`, `RCH_YIELD`,
//! `RCH_SLEEP_MAX_US`).
//!
//! ```text
//! cargo bench --bench oversubscribed -- 4      # 4 pairs = 8 threads
//! ```
use std::io::{Read, Write};
use std::time::{Duration, Instant};
fn main() {
    let pairs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(4);
    let stop = Instant::now() + Duration::from_secs(2);
    let mut hs = vec![];
    for _ in 0..pairs {
        let (mut a, mut b) = rdma_channel::RdmaStream::pair().unwrap();
        hs.push(std::thread::spawn(move || {
            let mut n = 0u64;
            let mut buf = [0u8; 8];
            while Instant::now() < stop {
                a.write_all(&buf).unwrap();
                a.read_exact(&mut buf).unwrap();
                n += 1;
            }
            a.write_all(&[1u8; 8]).unwrap();
            n
        }));
        hs.push(std::thread::spawn(move || {
            let mut buf = [0u8; 8];
            loop {
                b.read_exact(&mut buf).unwrap();
                if buf == [1u8; 8] {
                    break 0;
                }
                b.write_all(&buf).unwrap();
            }
        }));
    }
    let total: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    println!(
        "{pairs} pairs: {:.0} round trips/s total",
        total as f64 / 2.0
    );
}
