//! A farm between processes of one host (seed 004's pattern): a master process
//! whose emitter thread scatters tasks of one size to `--workers` worker processes
//! in turn, each of which sums its task's bytes and sends the 8-byte sum to the
//! master's collector thread, which takes results from any worker
//! (`patterns::Scatter` and `patterns::FromAny` over streams from a listener).
//! For `bench/runtime.sh`, which runs the same farm over ZeroMQ (PUSH/PULL over TCP)
//! and plain TCP (`bench/c/msg_farm.c`) beside it.
//!
//! ```text
//! cargo bench --bench farm -- 10,1024,65536 [TASK_BYTES] [WORKERS]
//! ```
//!
//! Prints "farm SIZE MB/s" lines (task bytes over the time from the first task sent
//! to the last result taken, at most 100,000 tasks a size); every result is
//! checked against the sum the master expects. Asserts nothing about speed.

use std::io;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use rdma_channel::patterns::{FromAny, Messages, Scatter};
use rdma_channel::{RdmaListener, RdmaStream};

#[path = "seed004.rs"]
mod seed004;

const ROLE: &str = "RCH_FARM_BENCH_ROLE";
const SOCKET: &str = "RCH_FARM_BENCH_SOCKET";

struct Opts {
    sizes: Vec<usize>,
    task_bytes: u64,
    workers: usize,
}

fn opts() -> Opts {
    let args = seed004::args();
    Opts {
        sizes: seed004::sizes(args.first()),
        task_bytes: args.get(1).map_or(64 << 20, |s| s.parse().expect("bytes")),
        workers: args.get(2).map_or(2, |s| s.parse().expect("workers")),
    }
}

fn tasks_for(o: &Opts, size: usize) -> u64 {
    (o.task_bytes / size.max(1) as u64).clamp(1000, 100_000)
}

/// The task `k` of a size: bytes whose sum the collector can recompute.
fn fill(task: &mut [u8], k: u64) {
    let b = (k % 251) as u8;
    task.fill(b);
}

fn worker() -> io::Result<()> {
    let socket = std::env::var(SOCKET).unwrap();
    let mut tasks = Messages::new(RdmaStream::connect(socket.as_str())?);
    let mut results = Messages::new(RdmaStream::connect(socket.as_str())?);
    let mut t = Vec::new();
    while tasks.recv(&mut t)? {
        let sum: u64 = t.iter().map(|&b| u64::from(b)).sum();
        results.send(&sum.to_le_bytes())?;
    }
    results.close()
}

fn main() -> io::Result<()> {
    if std::env::var(ROLE).is_ok() {
        return worker();
    }
    let o = opts();
    let dir = std::env::temp_dir().join(format!("rch-farm-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("sock");
    let listener = RdmaListener::bind(path.to_str().unwrap())?;
    let mut kids: Vec<Child> = Vec::new();
    let (mut to_workers, mut from_workers) = (Vec::new(), Vec::new());
    for _ in 0..o.workers {
        kids.push(
            Command::new(std::env::current_exe()?)
                .env(ROLE, "worker")
                .env(SOCKET, &path)
                .stdin(Stdio::null())
                .spawn()?,
        );
        // A worker connects its task stream first, then its result stream.
        to_workers.push(listener.accept()?);
        from_workers.push(listener.accept()?);
    }
    let sizes = o.sizes.clone();
    let counts: Vec<u64> = sizes.iter().map(|&s| tasks_for(&o, s)).collect();
    let emitter_counts = counts.clone();
    // The emitter starts a size once the collector has every result of the one
    // before: results of two sizes never mix.
    let (size_done, next_size) = std::sync::mpsc::channel::<()>();
    let emitter = std::thread::spawn(move || -> io::Result<()> {
        let mut scatter = Scatter::new(to_workers)?;
        for (i, (&s, &n)) in sizes.iter().zip(&emitter_counts).enumerate() {
            if i > 0 && next_size.recv().is_err() {
                break;
            }
            let mut task = vec![0u8; s];
            for k in 0..n {
                fill(&mut task, k);
                scatter.send(&task)?;
            }
        }
        scatter.close()
    });
    let mut collector = FromAny::new(from_workers)?;
    let mut result = Vec::new();
    for (&s, &n) in o.sizes.iter().zip(&counts) {
        let t0 = Instant::now();
        let (mut got, mut sum) = (0u64, 0u64);
        while got < n {
            if collector.recv(&mut result)?.is_none() {
                return Err(io::Error::other("the workers ended early"));
            }
            sum += u64::from_le_bytes(result[..8].try_into().expect("8-byte results"));
            got += 1;
        }
        let secs = t0.elapsed().as_secs_f64();
        let want: u64 = (0..n).map(|k| (k % 251) * s as u64).sum();
        if sum != want {
            return Err(io::Error::other(format!(
                "size {s}: results sum to {sum}, not {want}"
            )));
        }
        println!("farm {s} {:.1}", (s as u64 * n) as f64 / secs / 1e6);
        let _ = size_done.send(());
    }
    emitter.join().expect("the emitter thread")?;
    for mut k in kids {
        k.wait()?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
