//! A `Selector` between two processes: how soon a sleeping selector wakes when one
//! 8-byte message arrives, beside a bare eventfd wake-up between the same two
//! processes, and what an idle selector over many connections costs in CPU.
//!
//! ```text
//! cargo bench --bench select                         # 1000 connections, 200 wakes
//! cargo bench --bench select -- --conns 100 --rounds 500 --idle-secs 5
//! ```
//!
//! The parent (CPU 0) accepts `--conns` connections from a child (CPU 1) on a Unix
//! socket and then, per round, tells the child to write (a byte on the first
//! connection) and waits in `Selector::select` over all of them; the child sleeps
//! 2 ms, so that the selector is asleep, and writes 8 bytes holding
//! `CLOCK_MONOTONIC` (system-wide) on the next connection in turn. The wake-up
//! latency is the time from that stamp to `select`'s return; only rounds the child's
//! write ended by waking the selector through its eventfd count (`Selector::wakes`).
//! The eventfd row does the same with nothing but an eventfd the child took with
//! `pidfd_getfd` and the parent sleeping in `poll(2)` on it: the floor of any wake.
//! The idle row is the CPU time (user + system, `getrusage`) the parent spends in
//! one `select` over every connection that finds nothing for `--idle-secs`, over the
//! wall time. Prints one table; asserts nothing.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdma_channel::select::{Interest, Select, Selector};
use rdma_channel::{RdmaListener, RdmaStream};

const ROLE: &str = "RCH_SELECT_BENCH_ROLE";
const SOCKET: &str = "RCH_SELECT_BENCH_SOCKET";
const PARENT: &str = "RCH_SELECT_BENCH_PARENT";
const EVENTFD: &str = "RCH_SELECT_BENCH_EVENTFD";

struct Opts {
    conns: usize,
    rounds: usize,
    idle_secs: u64,
}

fn opts() -> Opts {
    let mut o = Opts {
        conns: 1000,
        rounds: 200,
        idle_secs: 3,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = || args.get(i + 1).and_then(|v| v.parse().ok());
        match args[i].as_str() {
            "--conns" => o.conns = value().expect("--conns N"),
            "--rounds" => o.rounds = value().expect("--rounds N"),
            "--idle-secs" => o.idle_secs = value().expect("--idle-secs N") as u64,
            // cargo bench passes --bench.
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    o.conns = o.conns.max(2);
    o
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn cpu_ns() -> u64 {
    // SAFETY: a zeroed rusage to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF and a valid rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(ru.ru_utime) + us(ru.ru_stime)) * 1000
}

fn raise_fd_limit() {
    // SAFETY: a valid rlimit to fill, then to set.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
}

fn quantiles(mut v: Vec<u64>) -> (f64, f64, usize) {
    v.sort_unstable();
    if v.is_empty() {
        return (f64::NAN, f64::NAN, 0);
    }
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    (at(0.5), at(0.9), v.len())
}

fn child() -> io::Result<()> {
    pin(1);
    raise_fd_limit();
    let socket = std::env::var(SOCKET).unwrap();
    let conns: usize = std::env::var("RCH_SELECT_BENCH_CONNS")
        .unwrap()
        .parse()
        .unwrap();
    let rounds: usize = std::env::var("RCH_SELECT_BENCH_ROUNDS")
        .unwrap()
        .parse()
        .unwrap();
    let mut streams = Vec::with_capacity(conns);
    for _ in 0..conns {
        streams.push(RdmaStream::connect(socket.as_str())?);
    }
    for round in 0..rounds {
        let mut go = [0u8; 1];
        streams[0].read_exact(&mut go)?;
        std::thread::sleep(Duration::from_millis(2));
        let k = 1 + round % (conns - 1);
        streams[k].write_all(&monotonic_ns().to_ne_bytes())?;
        streams[k].flush()?;
    }
    // The eventfd rounds: the parent's eventfd, taken from its process.
    let parent: i32 = std::env::var(PARENT).unwrap().parse().unwrap();
    let efd: i32 = std::env::var(EVENTFD).unwrap().parse().unwrap();
    // SAFETY: pidfd_open and pidfd_getfd take numbers and return a descriptor or -1.
    let fd = unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, parent, 0) as i32;
        libc::syscall(libc::SYS_pidfd_getfd, pidfd, efd, 0) as i32
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    for _ in 0..rounds {
        let mut go = [0u8; 1];
        streams[0].read_exact(&mut go)?;
        std::thread::sleep(Duration::from_millis(2));
        let stamp = monotonic_ns().to_ne_bytes();
        // SAFETY: 8 readable bytes to an eventfd we own: adds the stamp.
        unsafe { libc::write(fd.as_raw_fd(), stamp.as_ptr().cast(), 8) };
    }
    let mut done = [0u8; 1];
    streams[0].read_exact(&mut done)?;
    Ok(())
}

fn main() -> io::Result<()> {
    if std::env::var(ROLE).is_ok() {
        return child();
    }
    let o = opts();
    pin(0);
    raise_fd_limit();
    let dir = std::env::temp_dir().join(format!("rch-select-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("sock");
    let listener = RdmaListener::bind(path.to_str().unwrap())?;
    // SAFETY: eventfd takes a count and flags and returns a descriptor or -1.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    // SAFETY: the kernel just returned it (checked below).
    let efd = unsafe { OwnedFd::from_raw_fd(efd) };
    let mut kid = Command::new(std::env::current_exe()?)
        .env(ROLE, "writer")
        .env(SOCKET, &path)
        .env("RCH_SELECT_BENCH_CONNS", o.conns.to_string())
        .env("RCH_SELECT_BENCH_ROUNDS", o.rounds.to_string())
        .env(PARENT, std::process::id().to_string())
        .env(EVENTFD, efd.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .spawn()?;
    let t = Instant::now();
    let mut streams = Vec::with_capacity(o.conns);
    for _ in 0..o.conns {
        streams.push(listener.accept()?);
    }
    let setup = t.elapsed();
    let mut selector = Selector::new()?;

    // A sleeping selector woken by one message.
    let mut lat = Vec::new();
    for _ in 0..o.rounds {
        streams[0].write_all(b"g")?;
        streams[0].flush()?;
        let wakes = selector.wakes();
        let (ready, stamp_at) = {
            let mut items: Vec<Select<'_>> = streams
                .iter_mut()
                .map(|s| Select::new(s, Interest::READABLE))
                .collect();
            let n = selector.select(&mut items, Some(Duration::from_secs(30)))?;
            let at = monotonic_ns();
            let ready = items.iter().position(|i| i.ready().is_readable());
            assert_eq!(n, 1, "one connection is written each round");
            (ready.expect("the written one"), at)
        };
        let mut stamp = [0u8; 8];
        streams[ready].read_exact(&mut stamp)?;
        if selector.wakes() > wakes {
            lat.push(stamp_at.saturating_sub(u64::from_ne_bytes(stamp)));
        }
    }

    // A bare eventfd between the same processes.
    let mut bare = Vec::new();
    for _ in 0..o.rounds {
        streams[0].write_all(b"g")?;
        streams[0].flush()?;
        let mut p = libc::pollfd {
            fd: efd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 30_000) };
        let at = monotonic_ns();
        let mut v = [0u8; 8];
        // SAFETY: 8 writable bytes from an eventfd we own.
        unsafe { libc::read(efd.as_raw_fd(), v.as_mut_ptr().cast(), 8) };
        bare.push(at.saturating_sub(u64::from_ne_bytes(v)));
    }

    // Idle: one select over every connection that finds nothing.
    let (cpu0, wall0) = (cpu_ns(), Instant::now());
    {
        let mut items: Vec<Select<'_>> = streams
            .iter_mut()
            .map(|s| Select::new(s, Interest::READABLE))
            .collect();
        let n = selector.select(&mut items, Some(Duration::from_secs(o.idle_secs)))?;
        assert_eq!(n, 0, "nothing is written while idle");
    }
    let idle = (cpu_ns() - cpu0) as f64 / wall0.elapsed().as_nanos() as f64 * 100.0;

    streams[0].write_all(b"d")?;
    streams[0].flush()?;
    kid.wait()?;
    let _ = std::fs::remove_dir_all(&dir);

    let (m, p90, n) = quantiles(lat);
    let (bm, bp90, bn) = quantiles(bare);
    println!(
        "# select: {} connections from another process (set up in {:.2} s), parent on CPU 0, writer on CPU 1",
        o.conns,
        setup.as_secs_f64()
    );
    println!("| wake-up of a sleeping waiter | median us | p90 us | rounds |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| Selector over {} connections, 8 B message | {m:.1} | {p90:.1} | {n} |",
        o.conns
    );
    println!("| bare eventfd (pidfd_getfd), poll(2) | {bm:.1} | {bp90:.1} | {bn} |");
    println!(
        "\nidle select over {} connections for {} s: {idle:.3}% of a CPU",
        o.conns, o.idle_secs
    );
    Ok(())
}
