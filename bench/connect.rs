//! Connections per second between two processes (issue #32, item 2).
//!
//! The parent listens (`RdmaListener` on a Unix socket, the emulated fabric unless
//! `RCH_FABRIC` says otherwise) and serves connections one after another, as a
//! server's accept loop does; the child connects `--count` times from each number of
//! threads in `--threads`, every thread connecting in a loop. A connection counts
//! once it carried one byte each way (so the handshake, the rings and the first
//! packet are all in it), then both ends drop it. Prints a table: connections per
//! second over the whole run and the median / 99th percentile time of one
//! connection as its client saw it, from `RdmaStream::connect` to the reply byte.
//!
//! usage: cargo bench --bench connect [-- --count 2000 --threads 1,4,16]
//!
//! A benchmark: nothing asserts. Parent and child are pinned to CPUs 0 and 1.

#[path = "peer.rs"]
#[allow(dead_code)]
mod peer;

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdma_channel::{RdmaListener, RdmaStream};

const SOCKET_VAR: &str = "RCH_CONNECT_BENCH_SOCKET";

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

fn settings() -> io::Result<(usize, Vec<usize>)> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
    let count = match arg("--count") {
        Some(c) => c.parse().map_err(|_| bad("--count needs a number"))?,
        None => 2000,
    };
    let threads = match arg("--threads") {
        Some(t) => t
            .split(',')
            .map(|n| n.parse::<usize>().ok().filter(|&n| n > 0))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("--threads needs a list of positive numbers"))?,
        None => vec![1, 4, 16],
    };
    Ok((count, threads))
}

/// One connection as a client: connect, one byte each way. Returns its time.
fn one_connection(path: &str) -> io::Result<Duration> {
    let t0 = Instant::now();
    let mut s = RdmaStream::connect(path)?;
    s.write_all(b"c")?;
    let mut reply = [0u8; 1];
    s.read_exact(&mut reply)?;
    let took = t0.elapsed();
    if reply != *b"s" {
        return Err(io::Error::other("wrong reply byte"));
    }
    Ok(took)
}

fn child(path: String, count: usize, threads: &[usize]) -> io::Result<()> {
    peer::pin_to_cpu(1);
    let mut out = String::new();
    for &t in threads {
        let times = Arc::new(Mutex::new(Vec::with_capacity(count)));
        let start = Instant::now();
        let workers: Vec<_> = (0..t)
            .map(|k| {
                let (path, times) = (path.clone(), Arc::clone(&times));
                // Thread k makes connections k, k + t, k + 2t, ... of `count`.
                let mine = (count + t - 1 - k) / t;
                std::thread::spawn(move || -> io::Result<()> {
                    for _ in 0..mine {
                        let took = one_connection(&path)?;
                        times.lock().unwrap().push(took);
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a client thread panicked")?;
        }
        let wall = start.elapsed();
        let mut times = std::mem::take(&mut *times.lock().unwrap());
        times.sort();
        let pick = |q: f64| times[((times.len() as f64 - 1.0) * q).round() as usize];
        out.push_str(&format!(
            "| {t} | {count} | {:.0} | {:.1} | {:.1} |\n",
            count as f64 / wall.as_secs_f64(),
            pick(0.5).as_secs_f64() * 1e6,
            pick(0.99).as_secs_f64() * 1e6,
        ));
    }
    // The parent prints, after its last accept: one table, in order.
    print!("{out}");
    io::stdout().flush()
}

fn main() -> io::Result<()> {
    let (count, threads) = settings()?;
    if let Ok(path) = std::env::var(SOCKET_VAR) {
        return child(path, count, &threads);
    }
    let path: PathBuf =
        std::env::temp_dir().join(format!("rch-connect-{}.sock", std::process::id()));
    let listener = RdmaListener::bind(&path)?;
    println!(
        "# bench/connect.rs: {count} connections per row, each one byte each way, fabric {}",
        std::env::var("RCH_FABRIC").unwrap_or_else(|_| "emulated (default)".into())
    );
    println!();
    println!("| client threads | connections | connections/s | median us | p99 us |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    io::stdout().flush()?;
    let mut peer = Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env(SOCKET_VAR, &path)
        .spawn()?;
    peer::pin_to_cpu(0);
    let total = count * threads.len();
    let served = (|| -> io::Result<()> {
        for _ in 0..total {
            let mut s = listener.accept()?;
            let mut byte = [0u8; 1];
            s.read_exact(&mut byte)?;
            s.write_all(b"s")?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    let status = peer.wait()?;
    served?;
    if !status.success() {
        return Err(io::Error::other(format!("client process failed: {status}")));
    }
    Ok(())
}
