//! OSU-style point-to-point benchmark over real verbs (`VerbsFabric`, e.g. Soft-RoCE):
//! the same measurements as `bench/pingpong.rs` (one-way latency = half the ping-pong
//! round trip; windowed bandwidth = 64 messages in flight, then a 4-byte ack), between
//! two processes. By default the program re-runs itself as the peer on this host and
//! the two exchange connection cards over a Unix socket (`RdmaStream::handshake`).
//! Across hosts, one side listens and the other connects by IP address through
//! rdma_cm: `RCH_BENCH_LISTEN=ip:port` (the echoing peer; it serves one run and
//! exits) and `RCH_BENCH_CONNECT=ip:port` (the side that measures and prints the
//! table), both with the same `--sizes`.
//!
//! ```text
//! cargo bench --features verbs --bench verbs_pingpong                     # 2 B .. 1 MiB
//! cargo bench --features verbs --bench verbs_pingpong -- --sizes 2,65536
//! cargo bench --features verbs --bench verbs_pingpong -- --sizes 2 --latency-only
//! bench/softroce-bench.sh          # in a Soft-RoCE VM, beside perftest
//! bench/softroce-cluster-bench.sh  # between two VMs, beside perftest and rsocket
//! ```
//!
//! Ring and chunk default to 1 MiB and 64 KiB here (not the channel's 4 MiB ring).
//! Measured on rxe under TCG (2026-11-22): chunk 32 KiB, 64 KiB, 64 KiB + 64 B and
//! 128 KiB (2 MiB ring), and rings of 256 KiB to 4 MiB, all land within noise
//! (34-37 MB/s at 64 KiB and 1 MiB), because rxe's per-packet work, not the number of
//! writes, sets the pace. 64 KiB is the fewest writes per byte that a 1 MiB ring still
//! holds 16 of in flight; the smaller ring registers less memory. `RCH_RING_SIZE` /
//! `RCH_CHUNK_SIZE` (and the other `RCH_*`) override.
//!
//! `RCH_BENCH_PIN=1` pins the two local processes to CPUs 0 and 1 (unpinned by
//! default, as perftest). Both ends wait as the blocking calls do, with the
//! connection's wait policy (`Receiver::wait_policy`: `RCH_SPIN`, `RCH_YIELD`,
//! `RCH_SLEEP_MAX_US`, and on a one-CPU host with Soft-RoCE a brief poll, then
//! sleep); `RCH_BENCH_WAIT=spin` busy-polls instead, which between two one-CPU VMs
//! took the CPU from rxe (10.5 against 17.8-18.9 MB/s at 64 KiB, bench/notebook/2026-11.md,
//! 2026-11-25).
//!
//! `--latency-only` skips the bandwidth runs (the column shows `-`), and
//! `--bandwidth-only` the latency runs: the Soft-RoCE scripts time a short run of one
//! kind right beside each `ib_write_lat` or `ib_write_bw`, so that the two of a pair
//! meet the same phase of the shared host.
//!
//! Bandwidth is printed in MB/s of 2^20 bytes, the unit of perftest's `BW average[MB/sec]`.

#[path = "peer.rs"]
#[allow(dead_code)] // only the pinning and the child bookkeeping are used here
mod peer;

use std::io::{self, IoSlice, IoSliceMut};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use peer::{finish, pin_to_cpu, recv_all, send_all, Side};
use rdma_channel::engine::Backoff;
use rdma_channel::fabric::verbs::VerbsFabric;
use rdma_channel::fabric::AnyFabric;
use rdma_channel::{Config, RdmaListener, RdmaStream};

type Stream = RdmaStream<AnyFabric>;

const WINDOW: usize = 64;
const SOCKET_VAR: &str = "RCH_VERBS_PEER_SOCKET";
const DEFAULT_RING: usize = 1 << 20;
const DEFAULT_CHUNK: usize = 64 << 10;
const MIB: f64 = (1 << 20) as f64;

/// The `RCH_*` configuration, with this benchmark's ring and chunk unless set.
fn config() -> io::Result<Config> {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    let mut cfg = Config::from_env()?;
    if !set("RCH_RING_SIZE") {
        cfg = cfg.with_ring_size(DEFAULT_RING);
    }
    if !set("RCH_CHUNK_SIZE") {
        let chunk = DEFAULT_CHUNK.min(cfg.ring_size() / 2);
        cfg = cfg.with_chunk_size(chunk);
    }
    cfg.validate()?;
    Ok(cfg)
}

/// How the benchmark waits for its peer (`RCH_BENCH_WAIT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// Busy-poll `put_nocopy` / `get` in a loop (`spin`), as `bench/pingpong.rs`.
    Spin,
    /// Wait as the blocking calls do, with the connection's wait policy (`policy`,
    /// the default): `RCH_SPIN` polls, `RCH_YIELD` yields, then sleeps up to
    /// `RCH_SLEEP_MAX_US`; on a one-CPU host with Soft-RoCE, polls briefly and sleeps
    /// (`Receiver::wait_policy`).
    Policy,
}

fn wait_mode() -> io::Result<Wait> {
    match std::env::var("RCH_BENCH_WAIT").as_deref() {
        Ok("spin") => Ok(Wait::Spin),
        Err(_) | Ok("") | Ok("policy") => Ok(Wait::Policy),
        Ok(v) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("RCH_BENCH_WAIT: {v:?} is neither spin nor policy"),
        )),
    }
}

/// Sends all of `buf` with the channel's default choice between the ring and
/// zero-copy, waiting as `wait` says: between calls that made no progress, `Policy`
/// snoozes with the connection's wait policy (busy polls first, so a message that
/// is due soon is seen as fast as by `Spin`), blocking until the peer writes where
/// the connection takes wakes (`Sender::snooze`).
fn send_msg(s: &mut Stream, buf: &[u8], wait: Wait) -> io::Result<()> {
    if wait == Wait::Spin {
        return send_all(s, buf);
    }
    let tx = s.channel().sender();
    let mut b = Backoff::with_policy(tx.wait_policy());
    let mut at = 0;
    while at < buf.len() {
        // SAFETY: `buf` stays borrowed, so alive and unchanged, until this loop has
        // seen every byte counted, which includes the end of any zero-copy transfer
        // (a pending one is offered again from the same `at`: put_nocopy returned the
        // bytes before it).
        let n = unsafe { tx.put_nocopy(&[IoSlice::new(&buf[at..])]) }?;
        at += n;
        if n == 0 {
            tx.snooze(&mut b);
        } else {
            b.reset();
        }
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes, waiting as `wait` says (as in `send_msg`).
/// The RDMA READs of a zero-copy transfer are started with `get_nowait` and polled.
fn recv_msg(s: &mut Stream, buf: &mut [u8], wait: Wait) -> io::Result<()> {
    if wait == Wait::Spin {
        return recv_all(s, buf);
    }
    let rx = s.channel().receiver();
    let mut b = Backoff::with_policy(rx.wait_policy());
    let mut at = 0;
    while at < buf.len() {
        // SAFETY: reads left in flight target `buf[at..]`, which nothing touches until
        // a later call counts them: the loop only polls, then offers the same slice
        // again. On an error the process exits at once (below), so `buf` is never
        // freed or reused while the fabric may still write it.
        match unsafe { rx.get_nowait(&mut [IoSliceMut::new(&mut buf[at..])]) } {
            Ok(0) => rx.snooze(&mut b),
            Ok(n) => {
                at += n;
                b.reset();
            }
            Err(e) => {
                eprintln!("verbs_pingpong: receive failed: {e}");
                std::process::exit(1);
            }
        }
    }
    Ok(())
}

/// Pins this process to `cpu` when `RCH_BENCH_PIN=1`. Unpinned by default, as
/// perftest runs: in a VM on a shared host a pinned process cannot move off a vCPU
/// that the host has descheduled, and on Soft-RoCE the kernel's protocol work runs
/// on the CPU of the process that posts. Unpinned moved 64 KiB messages 35.6 MB/s
/// against 32.5 pinned in the same boot (bench/notebook/2026-11.md, 2026-11-25).
fn pin(cpu: usize) {
    if std::env::var("RCH_BENCH_PIN").as_deref() == Ok("1") {
        pin_to_cpu(cpu);
    }
}

/// `peer::connect_pair` for the verbs fabric (that one builds emulated streams): the
/// parent listens on a temp Unix socket and spawns itself; both sides open the device
/// and run the card handshake over the socket (parent on CPU 0, child on CPU 1 with
/// `RCH_BENCH_PIN=1`).
fn connect_pair() -> io::Result<(Stream, Side)> {
    let cfg = config()?;
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let Some(addr) = var("RCH_BENCH_LISTEN") {
        let l = RdmaListener::bind_with(addr.as_str(), cfg)?;
        return Ok((l.accept()?, Side::Child));
    }
    if let Some(addr) = var("RCH_BENCH_CONNECT") {
        // The listener may still be starting on the other host: retry refusals.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match RdmaStream::connect_with(addr.as_str(), cfg.clone()) {
                Ok(s) => return Ok((s, Side::Parent(None))),
                Err(e)
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }
    let verbs = || VerbsFabric::open().map(AnyFabric::Verbs);
    if let Some(path) = std::env::var_os(SOCKET_VAR) {
        pin(1);
        let sock = UnixStream::connect(path)?;
        return Ok((RdmaStream::handshake(verbs()?, &sock, cfg)?, Side::Child));
    }
    let path: PathBuf =
        std::env::temp_dir().join(format!("rch-verbs-bench-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    let child = Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env(SOCKET_VAR, &path)
        .spawn()?;
    pin(0);
    let accepted = listener.accept();
    let _ = std::fs::remove_file(&path);
    let (sock, _) = accepted?;
    let s = RdmaStream::handshake(verbs()?, &sock, cfg)?;
    Ok((s, Side::Parent(Some(child))))
}

/// A cheap clock for per-iteration timestamps, as perftest's `get_cycles`: the CPU's
/// time-stamp counter, calibrated once against `Instant`. Soft-RoCE VMs run on the
/// `hpet` clocksource, where every `clock_gettime` is a system call that costs about
/// 1 us under TCG (measured 0.93-0.99 us): two per round trip added a microsecond to
/// our one-way latency that perftest, reading the counter, never paid. Elsewhere
/// (no x86-64, or a counter that does not tick) it falls back to `Instant`.
struct Ticks {
    /// Nanoseconds per counter tick; 0 when `Instant` is used instead.
    ns_per_tick: f64,
    epoch: Instant,
}

impl Ticks {
    fn calibrate() -> Ticks {
        let epoch = Instant::now();
        let Some(t0) = Self::counter() else {
            return Ticks {
                ns_per_tick: 0.0,
                epoch,
            };
        };
        std::thread::sleep(Duration::from_millis(50));
        let (t1, ns) = (
            Self::counter().unwrap_or(t0),
            epoch.elapsed().as_nanos() as f64,
        );
        let ticks = t1.wrapping_sub(t0);
        // A counter that barely moved (or went backwards) is no clock to trust.
        let ns_per_tick = if ticks > 1000 && ticks < u64::MAX / 2 {
            ns / ticks as f64
        } else {
            0.0
        };
        Ticks { ns_per_tick, epoch }
    }

    #[cfg(target_arch = "x86_64")]
    fn counter() -> Option<u64> {
        // SAFETY: RDTSC has no memory effects; every x86-64 CPU has it.
        Some(unsafe { std::arch::x86_64::_rdtsc() })
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn counter() -> Option<u64> {
        None
    }

    /// Now, in this clock's units (ticks, or nanoseconds since the epoch).
    fn now(&self) -> u64 {
        match Self::counter() {
            Some(t) if self.ns_per_tick > 0.0 => t,
            _ => self.epoch.elapsed().as_nanos() as u64,
        }
    }

    /// The time between two `now` readings.
    fn between(&self, from: u64, to: u64) -> Duration {
        let units = to.wrapping_sub(from) as f64;
        let ns = if self.ns_per_tick > 0.0 {
            units * self.ns_per_tick
        } else {
            units
        };
        Duration::from_nanos(ns as u64)
    }
}

/// One-way latency by ping-pong: half the mean round trip of `iters` exchanges (as
/// `peer::latency`), and on the parent also the median and 99th percentile half round
/// trips (perftest's `t_typical` is the median). Timestamps come from [`Ticks`].
fn latency(
    s: &mut Stream,
    side: &Side,
    size: usize,
    iters: usize,
    wait: Wait,
) -> io::Result<(Duration, Duration, Duration)> {
    let clock = Ticks::calibrate();
    let mut buf = vec![0x5au8; size];
    let mut rtts = Vec::with_capacity(iters);
    let warm = (iters / 10).max(5);
    let mut start = clock.now();
    for i in 0..warm + iters {
        if i == warm {
            start = clock.now();
        }
        if matches!(side, Side::Parent(_)) {
            let t = clock.now();
            send_msg(s, &buf, wait)?;
            recv_msg(s, &mut buf, wait)?;
            if i >= warm {
                rtts.push(clock.between(t, clock.now()));
            }
        } else {
            recv_msg(s, &mut buf, wait)?;
            send_msg(s, &buf, wait)?;
        }
    }
    let mean = clock.between(start, clock.now()) / (2 * iters as u32);
    rtts.sort_unstable();
    let pick = |q: f64| {
        let i = ((rtts.len() as f64 * q) as usize).min(rtts.len().saturating_sub(1));
        rtts.get(i).map_or(Duration::ZERO, |d| *d / 2)
    };
    Ok((mean, pick(0.5), pick(0.99)))
}

/// Windowed bandwidth (OSU style, as `peer::bandwidth`): the parent sends `WINDOW`
/// messages back to back, the child acknowledges each window with 4 bytes. Returns
/// bytes per second.
fn bandwidth(
    s: &mut Stream,
    side: &Side,
    size: usize,
    iters: usize,
    wait: Wait,
) -> io::Result<f64> {
    let sbuf = vec![0xa5u8; size];
    let mut rbuf = vec![0u8; size];
    peer::bandwidth_with(
        s,
        side,
        (&sbuf, &mut rbuf),
        WINDOW,
        iters,
        (
            &mut move |s: &mut Stream, b: &[u8]| send_msg(s, b, wait),
            &mut move |s: &mut Stream, b: &mut [u8]| recv_msg(s, b, wait),
        ),
    )
}

/// Iteration counts sized for rxe under TCG (~10 µs, ~50 MB/s): about 0.1-1 s per
/// measurement, so the default five sizes take well under a minute. `RCH_BENCH_SCALE`
/// multiplies them (e.g. 0.2 for a smoke run, 5 on real hardware).
fn scale() -> f64 {
    std::env::var("RCH_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|&x| x > 0.0)
        .unwrap_or(1.0)
}

/// Round trips timed per latency size. `bench/softroce-bench.sh` and
/// `softroce-cluster-bench.sh` give `ib_write_lat` the same count at 2 B, so that both
/// meet the host's slow phases alike.
fn lat_iters(size: usize) -> usize {
    ((2_000_000.0 / (size + 200) as f64 * scale()) as usize).clamp(10, 5_000)
}

fn bw_iters(size: usize) -> usize {
    // ~64 MiB per measurement at large sizes; small messages are per-message bound.
    (((64 << 20) as f64 / (size * WINDOW + 8192) as f64 * scale()) as usize).clamp(2, 500)
}

/// Microseconds of one single-thread memcpy of `size` bytes between warm buffers: the
/// price of each of the channel's two copies (into the registered staging buffer on
/// the sender when the packet is above the inline size, out of the ring on the
/// receiver), which perftest does not pay.
fn memcpy_us(size: usize) -> f64 {
    let src = vec![1u8; size];
    let mut dst = vec![0u8; size];
    let iters = (20_000_000 / (size + 64)).clamp(5, 100_000);
    dst.copy_from_slice(&src);
    let t = Instant::now();
    for _ in 0..iters {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

fn main() -> io::Result<()> {
    // cargo bench passes --bench; ignore it.
    let sizes = peer::sizes_from_args(&[2, 8, 4096, 65536, 1 << 20]);
    let latency_only = std::env::args().any(|a| a == "--latency-only");
    let bandwidth_only = std::env::args().any(|a| a == "--bandwidth-only");
    if latency_only && bandwidth_only {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--latency-only and --bandwidth-only exclude each other",
        ));
    }
    let wait = wait_mode()?;
    let (mut s, side) = connect_pair()?;
    let parent = matches!(side, Side::Parent(_));
    let cfg = s.config().clone();
    if parent {
        println!(
            "# rdma-channel {} on VerbsFabric ({}), two processes{}",
            env!("CARGO_PKG_VERSION"),
            std::env::var("RCH_IB_DEVICE")
                .or_else(|_| std::env::var("SOFTROCE_IBDEV"))
                .unwrap_or_else(|_| "first device".into()),
            if std::env::var("RCH_BENCH_PIN").as_deref() == Ok("1") {
                " on CPUs 0 and 1"
            } else {
                ", not pinned"
            }
        );
        println!(
            "# ring {} B, chunk {} B, tail threshold {} B; one-way latency = half the mean round trip; \
             bandwidth: {WINDOW} messages in flight, MB = 2^20 B",
            cfg.ring_size(),
            cfg.chunk_size(),
            cfg.tail_threshold()
        );
        let ch = s.channel();
        let (policy, wakes) = (ch.receiver().wait_policy(), ch.sender().wakes());
        println!(
            "# waits: {}; spin {}, yields {}, then {} (up to {:?})",
            if wait == Wait::Spin {
                "busy polling"
            } else {
                "the connection's policy"
            },
            policy.spin,
            policy.yields,
            if wakes {
                "block until the peer writes (wakes)"
            } else {
                "sleep"
            },
            policy.sleep_max
        );
        println!(
            "{:>10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9}",
            "size",
            "latency_us",
            "lat_med_us",
            "lat_p99_us",
            "bw_MB/s",
            "memcpy_us",
            "lat_iters",
            "bw_iters"
        );
    }
    for &size in &sizes {
        let (li, bi) = (lat_iters(size), bw_iters(size));
        let lat = if bandwidth_only {
            None
        } else {
            Some(latency(&mut s, &side, size, li, wait)?)
        };
        let bw = if latency_only {
            None
        } else {
            Some(bandwidth(&mut s, &side, size, bi, wait)?)
        };
        if parent {
            let (bw, bi) = match bw {
                Some(bw) => (format!("{:.2}", bw / MIB), bi.to_string()),
                None => ("-".into(), "-".into()),
            };
            let us = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e6);
            let (lat, med, p99, li) = match lat {
                Some((lat, med, p99)) => (us(lat), us(med), us(p99), li.to_string()),
                None => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            println!(
                "{:>10} {:>12} {:>12} {:>12} {:>12} {:>12.3} {:>9} {:>9}",
                size,
                lat,
                med,
                p99,
                bw,
                memcpy_us(size),
                li,
                bi
            );
        }
    }
    drop(s);
    finish(side)
}
