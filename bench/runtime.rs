//! rdma-channel as a parallel runtime's channel between two processes of one host:
//! the two patterns of seed 004's evaluation over `patterns::Messages` (a framed
//! message on an `RdmaStream` from a listener, as a runtime would use it), for
//! `bench/runtime.sh`, which runs ZeroMQ over TCP and plain TCP beside it
//! (`bench/c/msg_peers.c`, the same patterns and output).
//!
//! ```text
//! cargo bench --bench runtime -- 10,100,1024 [PINGPONG_ITERS] [STREAM_BYTES]
//! ```
//!
//! `pingpong`: a message to the peer and the same size back (Table II), one-way us;
//! `stream`: messages sent continuously one way, then a 1-byte answer (Table I), MB/s;
//! the sender batches them (`Messages::send_more`) unless `RCH_BENCH_BATCH=0`.
//! The parent (CPU 0) is the client, a child (CPU 1) the server, connected on a Unix
//! socket in a scratch folder. Across hosts (`bench/runtime-cluster.sh`) each host
//! runs one side: `RCH_BENCH_LISTEN=ip:port` the server, `RCH_BENCH_CONNECT=ip:port`
//! the client. Prints "pattern size value" lines; asserts nothing.

use std::io;
use std::process::{Command, Stdio};
use std::time::Instant;

use rdma_channel::patterns::Messages;
use rdma_channel::{RdmaListener, RdmaStream};

#[path = "seed004.rs"]
mod seed004;

const ROLE: &str = "RCH_RUNTIME_BENCH_ROLE";
const SOCKET: &str = "RCH_RUNTIME_BENCH_SOCKET";

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

struct Opts {
    sizes: Vec<usize>,
    iters: u64,
    stream_bytes: u64,
}

fn opts() -> Opts {
    let args = seed004::args();
    Opts {
        sizes: seed004::sizes(args.first()),
        iters: args.get(1).map_or(2000, |s| s.parse().expect("iterations")),
        stream_bytes: args.get(2).map_or(64 << 20, |s| s.parse().expect("bytes")),
    }
}

fn stream_count(o: &Opts, size: usize) -> u64 {
    (o.stream_bytes / size.max(1) as u64).clamp(200, 200_000)
}

fn server(o: &Opts, m: &mut Messages) -> io::Result<()> {
    let mut buf = Vec::new();
    for &s in &o.sizes {
        for _ in 0..o.iters + o.iters / 10 {
            m.recv(&mut buf)?;
            m.send(&buf)?;
        }
        for _ in 0..stream_count(o, s) {
            m.recv(&mut buf)?;
        }
        m.send(&[1])?;
    }
    Ok(())
}

fn client(o: &Opts, m: &mut Messages) -> io::Result<()> {
    let mut buf = Vec::new();
    for &s in &o.sizes {
        let msg = vec![7u8; s];
        let warm = o.iters / 10;
        let mut t0 = Instant::now();
        for k in 0..o.iters + warm {
            if k == warm {
                t0 = Instant::now();
            }
            m.send(&msg)?;
            m.recv(&mut buf)?;
        }
        let us = t0.elapsed().as_secs_f64() * 1e6;
        println!("pingpong {s} {:.3}", us / o.iters as f64 / 2.0);
        let count = stream_count(o, s);
        let batch = seed004::batching();
        let t0 = Instant::now();
        for _ in 0..count {
            if batch {
                m.send_more(&msg)?;
            } else {
                m.send(&msg)?;
            }
        }
        // A batching sender's last batch goes before this waits.
        m.recv(&mut buf)?;
        let us = t0.elapsed().as_secs_f64() * 1e6;
        println!("stream {s} {:.1}", (s as u64 * count) as f64 / us);
    }
    Ok(())
}

fn main() -> io::Result<()> {
    let o = opts();
    if let Some(addr) = seed004::listen_address() {
        let s = RdmaListener::bind(addr.as_str())?.accept()?;
        return server(&o, &mut Messages::new(s));
    }
    if let Some(addr) = seed004::connect_address() {
        let s = seed004::connect_retrying(&addr)?;
        return client(&o, &mut Messages::new(s));
    }
    if std::env::var(ROLE).is_ok() {
        pin(1);
        let s = RdmaStream::connect(std::env::var(SOCKET).unwrap().as_str())?;
        return server(&o, &mut Messages::new(s));
    }
    pin(0);
    let dir = std::env::temp_dir().join(format!("rch-runtime-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("sock");
    let listener = RdmaListener::bind(path.to_str().unwrap())?;
    let mut kid = Command::new(std::env::current_exe()?)
        .args(std::env::args().skip(1))
        .env(ROLE, "server")
        .env(SOCKET, &path)
        .stdin(Stdio::null())
        .spawn()?;
    let s = listener.accept()?;
    let r = client(&o, &mut Messages::new(s));
    kid.wait()?;
    let _ = std::fs::remove_dir_all(&dir);
    r
}
