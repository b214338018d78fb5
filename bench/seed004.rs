//! What `bench/runtime.rs` and `bench/farm.rs` share: seed 004's message sizes, the
//! way both read their positional arguments, and the addresses of a run across
//! hosts (`bench/runtime-cluster.sh`).

use std::io;
use std::time::{Duration, Instant};

use rdma_channel::RdmaStream;

/// Seed 004's Table I message sizes (its Table II has the first seven).
pub const TABLE_SIZES: [usize; 10] = [
    10, 100, 1024, 5000, 10000, 25000, 50000, 65536, 200000, 400000,
];

/// The positional arguments (`cargo bench` adds `--bench`, which is skipped).
pub fn args() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect()
}

/// The sizes in `arg` (comma-separated), or [`TABLE_SIZES`].
pub fn sizes(arg: Option<&String>) -> Vec<usize> {
    arg.map(|s| s.split(',').map(|x| x.parse().expect("a size")).collect())
        .unwrap_or_else(|| TABLE_SIZES.to_vec())
}

/// `RCH_BENCH_BATCH`: whether senders that know more messages follow say so
/// (`Messages::send_more`, `Scatter::send_more`), as a runtime's producer does;
/// on unless it is `0` (then one put a message).
pub fn batching() -> bool {
    std::env::var("RCH_BENCH_BATCH").map_or(true, |v| v != "0")
}

/// `RCH_BENCH_LISTEN`: across hosts, the address this side listens at (it plays
/// one role only; the other host's side connects).
pub fn listen_address() -> Option<String> {
    std::env::var("RCH_BENCH_LISTEN")
        .ok()
        .filter(|s| !s.is_empty())
}

/// `RCH_BENCH_CONNECT`: across hosts, the address of the other host's listening
/// side, which this side connects to.
pub fn connect_address() -> Option<String> {
    std::env::var("RCH_BENCH_CONNECT")
        .ok()
        .filter(|s| !s.is_empty())
}

/// Connects to `addr`, retrying refusals for up to two minutes: the listener may
/// still be starting on the other host.
pub fn connect_retrying(addr: &str) -> io::Result<RdmaStream> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match RdmaStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
}
