//! Bounded resources: memory that a caller (or a peer's card) sizes is checked
//! against the process's limit (`rdma_channel::limits`) before anything is committed,
//! so an absurd request is a clean `OutOfMemory` and the machine is unharmed.

use std::io::ErrorKind;
use std::process::Command;
use std::time::{Duration, Instant};

use rdma_channel::{limits, Config, RdmaStream};

/// Resident memory of this process in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap()
}

#[test]
fn absurd_sizes_fail_cleanly_and_commit_nothing() {
    let (a, _b) = RdmaStream::pair().unwrap();
    let (rss, in_use) = (rss_kib(), limits::memory_in_use());
    let start = Instant::now();
    for len in [1usize << 46, usize::MAX / 2, limits::memory_limit() + 1] {
        let e = a.alloc_mem(len).map(|_| ()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{len}: {e}");
        assert!(e.to_string().contains("limit"), "{e}");
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "refusing took {:?}",
        start.elapsed()
    );
    assert_eq!(limits::memory_in_use(), in_use);
    let grew = rss_kib().saturating_sub(rss);
    assert!(grew < 64 << 10, "resident memory grew by {grew} KiB");
    // What fits is still served.
    let buf = a.alloc_mem(1 << 20).unwrap();
    assert_eq!(buf.len(), 1 << 20);
    assert!(limits::memory_in_use() >= in_use + (1 << 20));
    drop(buf);
    assert_eq!(limits::memory_in_use(), in_use);
}

/// The role run under `ulimit -v` by the test below: the default limit follows the
/// address-space limit, so requests beyond it (and a ring that cannot fit) fail
/// with `OutOfMemory` instead of a crash.
#[test]
fn under_ulimit_role() {
    if std::env::var("RCH_LIMITS_ROLE").is_err() {
        return;
    }
    let limit = limits::memory_limit();
    assert!(
        limit <= 512 << 20,
        "default limit {limit} ignores ulimit -v"
    );
    let (a, _b) = RdmaStream::pair().unwrap();
    for len in [1usize << 46, 600 << 20] {
        let e = a.alloc_mem(len).map(|_| ()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{len}: {e}");
    }
    let big = Config::default().with_ring_size(1 << 30);
    let e = RdmaStream::pair_with(big.clone().with_initial_ring_size(1 << 30))
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{e}");
    // A ring that starts small and may grow to 1 GiB: growth past the limit is
    // declined, and the connection goes on in the ring it has.
    let (mut c, mut d) = RdmaStream::pair_with(big).unwrap();
    let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 253) as u8).collect();
    let mut got = vec![0u8; data.len()];
    for _ in 0..16 {
        let (mut sent, mut read) = (0, 0);
        while read < data.len() {
            if sent < data.len() {
                sent += c.put(&[std::io::IoSlice::new(&data[sent..])]).unwrap();
            }
            read += d
                .get(&mut [std::io::IoSliceMut::new(&mut got[read..])])
                .unwrap();
        }
        assert!(got == data, "bytes lost or changed");
    }
    let ring = d.channel().receiver().ring_size();
    assert!(
        ring > 16 << 10 && ring < 1 << 30,
        "grown within the limit: {ring}"
    );
    assert_eq!(a.alloc_mem(4 << 20).unwrap().len(), 4 << 20);
    println!("under ulimit -v: limit {limit} bytes, absurd requests refused");
}

#[test]
fn under_ulimit_v_requests_beyond_the_limit_are_refused_cleanly() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$0\" --exact under_ulimit_role --nocapture --test-threads=1")
        .arg(exe)
        .env("RCH_LIMITS_ROLE", "1")
        .env_remove("RCH_MEMORY_LIMIT")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "role failed: {:?}\n{text}",
        out.status
    );
    assert!(text.contains("absurd requests refused"), "{text}");
}
