//! A farm between processes of one host (seed 004's pattern): a master process
//! whose emitter thread scatters tasks of one size to `--workers` worker processes
//! in turn, each of which sums its task's bytes and sends the 8-byte sum to the
//! master's collector thread, which takes results from any worker
//! (`patterns::Scatter` and `patterns::FromAny` over streams from a listener).
//! For `bench/runtime.sh`, which runs the same farm over ZeroMQ (PUSH/PULL over TCP)
//! and plain TCP (`bench/c/msg_farm.c`) beside it. Across hosts
//! (`bench/runtime-cluster.sh`): `RCH_BENCH_LISTEN=ip:port` runs the master only,
//! listening there, and `RCH_BENCH_CONNECT=ip:port` the workers only.
//!
//! ```text
//! cargo bench --bench farm -- 10,1024,65536 [TASK_BYTES] [WORKERS] [MIN_TASKS]
//! ```
//!
//! Prints "farm SIZE MB/s" lines (task bytes over the time from the first task sent
//! to the last result taken, at most 100,000 tasks a size); every result is
//! checked against the sum the master expects. Asserts nothing about speed.
//!
//! The emitter batches its tasks (`Scatter::send_more`, flushed when a size's
//! tasks are out) and each worker its results (`Messages::send_more`, flushed when
//! no task is waiting), as a runtime's producers would; `RCH_BENCH_BATCH=0` sends
//! one put a message.

use std::io::{self, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use rdma_channel::patterns::{FromAny, Messages, Scatter};
use rdma_channel::RdmaListener;

#[path = "seed004.rs"]
mod seed004;

const ROLE: &str = "RCH_FARM_BENCH_ROLE";
const SOCKET: &str = "RCH_FARM_BENCH_SOCKET";
/// The byte a worker sends first on its task stream, and on its result stream.
const TASKS_TAG: &[u8; 1] = b"T";
const RESULTS_TAG: &[u8; 1] = b"R";

struct Opts {
    sizes: Vec<usize>,
    task_bytes: u64,
    workers: usize,
    /// Fewest tasks of a size (default 1,000).
    min_tasks: u64,
}

fn opts() -> Opts {
    let args = seed004::args();
    Opts {
        sizes: seed004::sizes(args.first()),
        task_bytes: args.get(1).map_or(64 << 20, |s| s.parse().expect("bytes")),
        workers: args.get(2).map_or(2, |s| s.parse().expect("workers")),
        min_tasks: args.get(3).map_or(1000, |s| s.parse().expect("tasks")),
    }
}

fn tasks_for(o: &Opts, size: usize) -> u64 {
    (o.task_bytes / size.max(1) as u64).clamp(o.min_tasks.min(100_000), 100_000)
}

/// The task `k` of a size: bytes whose sum the collector can recompute.
fn fill(task: &mut [u8], k: u64) {
    let b = (k % 251) as u8;
    task.fill(b);
}

fn worker() -> io::Result<()> {
    let socket = std::env::var(SOCKET).unwrap();
    // Retried, as across hosts the master may still be starting; each stream says
    // first what it is (workers' connects may interleave at the master).
    let open = |tag: &[u8; 1]| -> io::Result<Messages> {
        let mut s = seed004::connect_retrying(&socket)?;
        s.write_all(tag)?;
        s.flush()?;
        Ok(Messages::new(s))
    };
    let mut tasks = open(TASKS_TAG)?;
    let mut results = open(RESULTS_TAG)?;
    let mut t = Vec::new();
    let batch = seed004::batching();
    loop {
        // The results batched so far go before this worker waits for a task.
        if batch && !tasks.ready()? {
            results.flush()?;
        }
        if !tasks.recv(&mut t)? {
            break;
        }
        let sum: u64 = t.iter().map(|&b| u64::from(b)).sum();
        if batch {
            results.send_more(&sum.to_le_bytes())?;
        } else {
            results.send(&sum.to_le_bytes())?;
        }
    }
    results.close()
}

fn main() -> io::Result<()> {
    if std::env::var(ROLE).is_ok() {
        return worker();
    }
    let o = opts();
    let spawn_worker = |socket: &std::ffi::OsStr| {
        Command::new(std::env::current_exe()?)
            .env(ROLE, "worker")
            .env(SOCKET, socket)
            .env_remove("RCH_BENCH_CONNECT")
            .stdin(Stdio::null())
            .spawn()
    };
    if let Some(addr) = seed004::connect_address() {
        // The workers only: the master listens on another host.
        let kids: Vec<Child> = (0..o.workers)
            .map(|_| spawn_worker(addr.as_ref()))
            .collect::<io::Result<_>>()?;
        for mut k in kids {
            if !k.wait()?.success() {
                return Err(io::Error::other("a worker failed"));
            }
        }
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("rch-farm-bench-{}", std::process::id()));
    let across = seed004::listen_address();
    let address = match &across {
        Some(a) => a.clone(),
        None => {
            std::fs::create_dir_all(&dir)?;
            dir.join("sock").to_str().unwrap().to_string()
        }
    };
    let listener = RdmaListener::bind(address.as_str())?;
    let mut kids: Vec<Child> = Vec::new();
    let (mut to_workers, mut from_workers) = (Vec::new(), Vec::new());
    for _ in 0..o.workers {
        if across.is_none() {
            kids.push(spawn_worker(address.as_ref())?);
        }
    }
    // Each worker's two streams, told apart by their first byte (across hosts the
    // workers' connects interleave).
    while to_workers.len() + from_workers.len() < 2 * o.workers {
        let mut s = listener.accept()?;
        let mut tag = [0u8; 1];
        s.read_exact(&mut tag)?;
        match &tag {
            TASKS_TAG => to_workers.push(s),
            RESULTS_TAG => from_workers.push(s),
            _ => {
                return Err(io::Error::other(
                    "a stream that is neither tasks nor results",
                ))
            }
        }
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
            let batch = seed004::batching();
            for k in 0..n {
                fill(&mut task, k);
                if batch {
                    scatter.send_more(&task)?;
                } else {
                    scatter.send(&task)?;
                }
            }
            scatter.flush()?;
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
