//! Tests across processes, on the fabric `RCH_FABRIC` selects (the emulated one by
//! default; children inherit the choice). The test binary re-executes itself as the
//! child (`current_exe() --exact <child test> --nocapture --test-threads=1`) with
//! `RCH_TEST_CHILD_ROLE` set; the child tests return at once when that variable is
//! absent, so in a normal run they are no-ops.
//!
//! * `two_processes_exchange_both_ways`: parent listens, child connects, both send
//!   `RCH_TEST_BYTES` (default 1 GiB) each way at once in random message sizes (some
//!   vectored); every received byte is checked against the regenerated stream
//!   (`RCH_TEST_SEED` picks other content). Throughput is printed, not asserted. A
//!   watchdog kills the child and fails the test after 300 s (1500 s on verbs, where
//!   rxe under emulation moves 1 GiB each way in about 70 s).
//! * `config_from_env_rejects_bad_ring_size`: `Config::from_env` in a child whose
//!   `RCH_RING_SIZE` is bad must fail with `InvalidInput` naming the variable.
//! * `fabric_from_env_is_checked`: the same for `RCH_FABRIC` in `RdmaStream::pair` and
//!   `RdmaListener::bind`.
//! * `peer_process_death_is_an_error_not_a_hang`: the child aborts mid-stream; the
//!   parent's blocked reader and blocked writer must fail with `ConnectionReset`.
//! * in-process listener tests: mismatched configurations, missing listener, rebinding.

mod common;

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::exchange::exchange;
use common::peer::{listen_for_child, scratch_dir, spawn_peer, spawn_self, RemoveOnDrop};
use common::*;
use rdma_channel::{Config, RdmaListener, RdmaStream};

const ROLE: &str = "RCH_TEST_CHILD_ROLE";
const SOCKET: &str = "RCH_TEST_SOCKET";
const SEED_PARENT: &str = "RCH_TEST_SEED_PARENT";
const SEED_CHILD: &str = "RCH_TEST_SEED_CHILD";
const BYTES: &str = "RCH_TEST_BYTES";
const DEFAULT_BYTES: u64 = 1 << 30;
/// Time bound of the exchange (five times longer where writes land later).
fn child_limit() -> Duration {
    limit(300)
}

fn role() -> Option<String> {
    std::env::var(ROLE).ok().filter(|r| !r.is_empty())
}

/// A unique scratch directory under the system temp dir.
fn transfer_bytes() -> u64 {
    match std::env::var(BYTES) {
        Ok(v) if !v.is_empty() => rdma_channel::config::parse_size(&v)
            .unwrap_or_else(|e| panic!("{BYTES}={v:?}: {e}"))
            as u64,
        _ => DEFAULT_BYTES,
    }
}

/// The defaults, but heap buffers from 256 KiB also go zero-copy (on the emulated
/// fabric they would not by default), so all three paths carry the gigabyte.
fn exchange_config() -> Config {
    Config::default().with_zero_copy_private_threshold(Some(256 << 10))
}

#[test]
fn two_processes_exchange_both_ways() {
    if role().is_some() {
        return;
    }
    let bytes = transfer_bytes();
    let dir = scratch_dir("two-process");
    let _cleanup = RemoveOnDrop(dir.clone());
    let (listener, address) = listen_for_child(&dir, exchange_config());
    // Deterministic content; RCH_TEST_SEED picks another stream.
    let seed: u64 = std::env::var("RCH_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x00C0_FFEE);
    let (seed_parent, seed_child) = (mix64(seed), mix64(seed ^ 1));
    println!(
        "two processes: {} MiB each way, seed {seed} (RCH_TEST_SEED)",
        bytes >> 20
    );
    let start = Instant::now();
    let deadline = start + child_limit();
    let mut child = spawn_peer(
        "two_process_child_peer",
        &[
            (ROLE, "peer".into()),
            (SOCKET, address),
            (BYTES, bytes.to_string()),
            (SEED_PARENT, seed_parent.to_string()),
            (SEED_CHILD, seed_child.to_string()),
        ],
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = (|| {
            let s = listener
                .accept()
                .map_err(|e| format!("accept: {}", ioe(&e)))?;
            exchange(s, "parent", seed_parent, seed_child, bytes)
        })();
        let _ = tx.send(r);
    });
    // Wait for our side, watching the child and the clock.
    let parent_result = loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(r) => break Some(r),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break Some(Err("parent side thread vanished".into()))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if child.exited() {
            // The child is done (or died): our side must finish promptly too (it has
            // all the data, or notices the lost peer).
            break rx.recv_timeout(limit(30)).ok();
        }
        if Instant::now() >= deadline {
            break None;
        }
    };
    let (status, out, err) = child.wait(deadline);
    let elapsed = start.elapsed();
    let child_report = format!("--- child stdout ---\n{out}\n--- child stderr ---\n{err}");
    match &parent_result {
        None => panic!("watchdog: the exchange did not finish within {:?} (child status {status:?})\n{child_report}", child_limit()),
        Some(Err(e)) => panic!("parent side failed: {e}\nchild status {status:?}\n{child_report}"),
        Some(Ok(_)) => {}
    }
    let status = status.unwrap_or_else(|| {
        panic!(
            "watchdog: child killed after {:?}\n{child_report}",
            child_limit()
        )
    });
    assert!(
        status.success(),
        "child failed with {status}\n{child_report}"
    );
    assert!(
        out.contains("child: sent") && out.contains("test result: ok. 1 passed"),
        "the child did not run the exchange (did the test filter match?)\n{child_report}"
    );
    let stats = parent_result.unwrap().unwrap();
    assert_eq!((stats.sent, stats.received), (bytes, bytes));
    let total = 2 * bytes;
    println!(
        "{}",
        out.lines()
            .filter_map(|l| l.find("child: sent").map(|i| &l[i..]))
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!(
        "two processes: {} MiB each way in {:.2} s, {:.0} MB/s aggregate (parent send {:.2} s, recv {:.2} s)",
        bytes >> 20,
        elapsed.as_secs_f64(),
        total as f64 / 1e6 / elapsed.as_secs_f64(),
        stats.send_secs,
        stats.recv_secs
    );
}

/// The child side of `two_processes_exchange_both_ways` (a no-op unless spawned by it).
#[test]
fn two_process_child_peer() {
    if role().as_deref() != Some("peer") {
        return;
    }
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("child: {k} not set"));
    let address = env(SOCKET);
    let bytes: u64 = env(BYTES).parse().unwrap();
    let seed_parent: u64 = env(SEED_PARENT).parse().unwrap();
    let seed_child: u64 = env(SEED_CHILD).parse().unwrap();
    let s = RdmaStream::connect_with(address.as_str(), exchange_config())
        .unwrap_or_else(|e| panic!("child: connect: {}", ioe(&e)));
    let stats = exchange(s, "child", seed_child, seed_parent, bytes)
        .unwrap_or_else(|e| panic!("child: {e}"));
    assert_eq!((stats.sent, stats.received), (bytes, bytes));
}

/// Which fabric this run tests (see `RCH_FABRIC`); shown with `--nocapture`.
#[test]
fn fabric_under_test() {
    if role().is_some() {
        return;
    }
    report_fabric();
}

// -------------------------------------------------------------------------------------
// Config::from_env in a child process (environment variables are process-global)
// -------------------------------------------------------------------------------------

/// Runs `Config::from_env`, `RdmaStream::pair` and `RdmaListener::bind` in a child whose
/// environment holds `vars`, and returns its report lines (`KEY: ok ...` or
/// `KEY: err <kind> <message>`).
fn from_env_in_child(vars: &[(&str, &str)]) -> Vec<String> {
    let mut envs: Vec<(&str, String)> = vars.iter().map(|(k, v)| (*k, v.to_string())).collect();
    envs.push((ROLE, "from_env".into()));
    let run = spawn_self("from_env_child", &envs);
    let (status, out, err) = run.wait(Instant::now() + limit(60));
    let status = status.unwrap_or_else(|| panic!("from_env child hung\n{out}\n{err}"));
    assert!(
        status.success(),
        "from_env child failed: {status}\n{out}\n{err}"
    );
    // (libtest may print "test from_env_child ... " in front of the first line.)
    let lines: Vec<String> = out
        .lines()
        .filter_map(|l| l.find("REPORT ").map(|i| l[i + 7..].to_string()))
        .collect();
    assert_eq!(lines.len(), 3, "child output:\n{out}\n{err}");
    lines
}

#[test]
fn from_env_child() {
    if role().as_deref() != Some("from_env") {
        return;
    }
    let fmt = |key: &str, r: io::Result<String>| match r {
        Ok(s) => println!("REPORT {key}: ok {s}"),
        Err(e) => println!(
            "REPORT {key}: err {:?} {}",
            e.kind(),
            e.to_string().replace('\n', " ")
        ),
    };
    fmt(
        "from_env",
        Config::from_env().map(|c| format!("ring={} chunk={}", c.ring_size(), c.chunk_size())),
    );
    fmt("pair", RdmaStream::pair().map(|_| String::new()));
    let dir = scratch_dir("from-env");
    let _cleanup = RemoveOnDrop(dir.clone());
    fmt(
        "bind",
        RdmaListener::bind(dir.join("sock")).map(|_| String::new()),
    );
}

#[test]
fn fabric_from_env_is_checked() {
    if role().is_some() {
        return;
    }
    // An unknown fabric: InvalidInput naming RCH_FABRIC and the allowed values, from
    // the constructors that open a fabric (Config::from_env does not read it).
    for bad in ["bogus", "emu", "rxe0"] {
        let lines = from_env_in_child(&[("RCH_FABRIC", bad)]);
        assert!(lines[0].starts_with("from_env: ok "), "{lines:?}");
        for line in &lines[1..] {
            assert!(
                line.contains(": err InvalidInput ")
                    && line.contains("RCH_FABRIC")
                    && line.contains("`emulated`")
                    && line.contains("`verbs`"),
                "RCH_FABRIC={bad:?}: {line}"
            );
        }
    }
    for ok in ["", "emulated"] {
        let lines = from_env_in_child(&[("RCH_FABRIC", ok)]);
        assert!(lines[1].starts_with("pair: ok"), "{ok:?}: {lines:?}");
        assert!(lines[2].starts_with("bind: ok"), "{ok:?}: {lines:?}");
    }
    // verbs: opens where a device exists, else says why.
    let lines = from_env_in_child(&[("RCH_FABRIC", "verbs")]);
    for line in &lines[1..] {
        let fine = if rdma_channel::fabric::FabricKind::Verbs.is_available() {
            line.contains(": ok") || line.contains("no RDMA device")
        } else {
            line.contains(": err Unsupported ") && line.contains("built without the verbs feature")
        };
        assert!(fine, "RCH_FABRIC=verbs: {line}");
        if std::env::var("SOFTROCE_VM").as_deref() == Ok("1") {
            assert!(line.contains(": ok"), "a device exists in the VM: {line}");
        }
    }
}

#[test]
fn config_from_env_rejects_bad_ring_size() {
    if role().is_some() {
        return;
    }
    // Malformed and out-of-range values: InvalidInput with a message naming the variable
    // (as `Config::from_env` documents), from every constructor that reads the environment.
    let mut failures = Vec::new();
    for bad in ["5000", "lots", "2048", "2g", "0", "-4096", "3m", "64kb"] {
        let lines = from_env_in_child(&[("RCH_RING_SIZE", bad)]);
        for line in &lines {
            let ok = line.contains(": err InvalidInput ") && line.contains("RCH_RING_SIZE");
            if !ok {
                failures.push(format!("RCH_RING_SIZE={bad:?}: {line}"));
            }
        }
    }
    // A good value is applied.
    let lines = from_env_in_child(&[("RCH_RING_SIZE", "64k")]);
    assert!(
        lines[0].starts_with("from_env: ok ring=65536 "),
        "{lines:?}"
    );
    assert!(lines[1].starts_with("pair: ok"), "{lines:?}");
    assert!(lines[2].starts_with("bind: ok"), "{lines:?}");
    // Empty means unset.
    let lines = from_env_in_child(&[("RCH_RING_SIZE", "")]);
    let default = format!(
        "from_env: ok ring={} ",
        rdma_channel::config::DEFAULT_RING_SIZE
    );
    assert!(lines[0].starts_with(&default), "{lines:?}");
    assert!(
        failures.is_empty(),
        "bad RCH_RING_SIZE not rejected with InvalidInput naming the variable:\n  {}",
        failures.join("\n  ")
    );
}

// -------------------------------------------------------------------------------------
// Listener tests inside one process
// -------------------------------------------------------------------------------------

fn bounded(name: &str, f: impl FnOnce() + Send + 'static) {
    with_watchdog(name, limit(120), f)
}

/// Exchanges `bytes` each way between two connected streams with blocking I/O.
fn blocking_exchange(a: RdmaStream, b: RdmaStream, bytes: u64) {
    let h = std::thread::spawn(move || exchange(b, "b", 2, 1, bytes));
    let ra = exchange(a, "a", 1, 2, bytes);
    let rb = join(h, "b");
    assert!(ra.is_ok() && rb.is_ok(), "a: {ra:?}\nb: {rb:?}");
}

fn connect_pair(path: &Path, server: Config, client: Config) -> (RdmaStream, RdmaStream) {
    let listener = RdmaListener::bind_with(path, server).expect("bind");
    let p = path.to_path_buf();
    let h = std::thread::spawn(move || RdmaStream::connect_with(&p, client));
    let s = listener.accept().expect("accept");
    let c = h.join().unwrap().expect("connect");
    (s, c)
}

#[test]
fn listener_with_mismatched_configurations() {
    if role().is_some() {
        return;
    }
    bounded("listener_with_mismatched_configurations", || {
        let dir = scratch_dir("mismatch");
        let _cleanup = RemoveOnDrop(dir.clone());
        let small = Config::default()
            .with_ring_size(4096)
            .with_chunk_size(128)
            .with_tail_threshold(1)
            .with_max_inline(64);
        let large = Config::default()
            .with_ring_size(1 << 20)
            .with_chunk_size(256 << 10)
            .with_tail_threshold((1 << 20) - 64);
        let (s, c) = connect_pair(&dir.join("a"), small.clone(), large.clone());
        blocking_exchange(s, c, 4 << 20);
        let (s, c) = connect_pair(&dir.join("b"), large, small);
        blocking_exchange(s, c, 4 << 20);
    });
}

#[test]
fn listener_accepts_sequential_connections_and_try_calls_work() {
    if role().is_some() {
        return;
    }
    bounded("listener_accepts_sequential_connections", || {
        let dir = scratch_dir("seq");
        let _cleanup = RemoveOnDrop(dir.clone());
        let path = dir.join("sock");
        let cfg = Config::default().with_ring_size(8192).with_chunk_size(1024);
        let listener = RdmaListener::bind_with(&path, cfg.clone()).unwrap();
        for i in 0..5u8 {
            let p = path.clone();
            let c2 = cfg.clone();
            let h = std::thread::spawn(move || {
                let mut c = RdmaStream::connect_with(&p, c2).unwrap();
                c.write_all(&[i; 10_000]).unwrap();
                let mut back = [0u8; 3];
                c.read_exact(&mut back).unwrap();
                back
            });
            let mut s = listener.accept().unwrap();
            let mut got = vec![0u8; 10_000];
            s.read_exact(&mut got).unwrap();
            assert!(got.iter().all(|&b| b == i));
            let mut off = 0;
            while off < 3 {
                off += s.put(&[io::IoSlice::new(&[i, i, i][off..])]).unwrap();
            }
            assert_eq!(h.join().unwrap(), [i, i, i]);
        }
    });
}

#[test]
fn connect_without_listener_fails_with_the_path() {
    if role().is_some() {
        return;
    }
    bounded("connect_without_listener", || {
        let dir = scratch_dir("nolisten");
        let _cleanup = RemoveOnDrop(dir.clone());
        let path = dir.join("nobody-here");
        let e = RdmaStream::connect_with(&path, Config::default())
            .expect_err("connect to nothing must fail");
        assert!(
            e.to_string().contains("nobody-here"),
            "message should name the path: {e}"
        );
        // A stale socket file (listener gone) is replaced by a new bind.
        let l = RdmaListener::bind_with(&path, Config::default()).unwrap();
        drop(l);
        let e = RdmaStream::connect_with(&path, Config::default()).expect_err("listener is gone");
        let _ = e;
        let _l = RdmaListener::bind_with(&path, Config::default())
            .expect("rebinding over a stale socket");
        // An invalid configuration is refused at bind time.
        let e = RdmaListener::bind_with(dir.join("x"), Config::default().with_ring_size(1000))
            .expect_err("bad config");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    });
}

// -------------------------------------------------------------------------------------
// A peer process that dies without closing anything
// -------------------------------------------------------------------------------------

/// The child side of `peer_process_death_is_an_error_not_a_hang`: connects, sends 100
/// bytes, waits until the parent has read them, then aborts (no destructor runs, so no
/// end-of-stream or reader-closed notice is ever written).
#[test]
fn crashing_child_peer() {
    if role().as_deref() != Some("crash") {
        return;
    }
    let address = std::env::var(SOCKET).unwrap();
    let mut s = RdmaStream::connect_with(address.as_str(), Config::default()).unwrap();
    s.write_all(&[7u8; 100]).unwrap();
    let mut go = [0u8; 1];
    s.read_exact(&mut go).unwrap();
    std::process::abort();
}

/// A peer process killed mid-stream: the parent's blocked reader and blocked writer
/// (the ring is full: the child never reads) both fail with `ConnectionReset` within
/// seconds, instead of waiting forever.
#[test]
fn peer_process_death_is_an_error_not_a_hang() {
    if role().is_some() {
        return;
    }
    let dir = scratch_dir("crash");
    let _cleanup = RemoveOnDrop(dir.clone());
    let (listener, address) = listen_for_child(&dir, Config::default());
    let child = spawn_peer(
        "crashing_child_peer",
        &[(ROLE, "crash".into()), (SOCKET, address)],
    );
    let mut s = listener.accept().unwrap();
    let mut first = [0u8; 100];
    s.read_exact(&mut first).unwrap();
    assert_eq!(first, [7u8; 100]);
    let (mut r, mut w) = s.split();
    // Start both blocking calls, then let the child die.
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let t = Instant::now();
        (r.read_exact(&mut buf), t.elapsed())
    });
    let writer = std::thread::spawn(move || {
        let t = Instant::now();
        let go = w.write_all(&[1u8]);
        let rest = w.write_all(&vec![0u8; 64 << 20]);
        (go.and(rest), t.elapsed())
    });
    let (status, out, err) = child.wait(Instant::now() + limit(60));
    assert!(
        status.as_ref().is_some_and(|s| !s.success()),
        "child should have aborted: {status:?}\n{out}\n{err}"
    );
    let (rres, rtime) = with_watchdog("reader after peer death", limit(30), move || {
        reader.join().unwrap()
    });
    let (wres, wtime) = with_watchdog("writer after peer death", limit(30), move || {
        writer.join().unwrap()
    });
    let re = rres.expect_err("read from a dead peer must fail");
    let we = wres.expect_err("write to a dead peer must fail");
    assert_eq!(re.kind(), io::ErrorKind::ConnectionReset, "reader: {re}");
    assert_eq!(we.kind(), io::ErrorKind::ConnectionReset, "writer: {we}");
    println!("reader failed after {rtime:?} ({re}); writer after {wtime:?} ({we})");
}

// -------------------------------------------------------------------------------------
// A selector woken from another process
// -------------------------------------------------------------------------------------

/// Rounds of `a_selector_sleeps_until_another_process_writes`.
const SELECT_ROUNDS: usize = 5;

/// The parent waits with a `Selector` on four connections from a child; each round
/// it sends the child "go" on the first and selects, and the child writes one byte on
/// a round-robin connection 300 ms later, while the parent sleeps. Every select must
/// name exactly that connection, and the child's sender must have woken the
/// selector through its eventfd (pidfd_getfd of the parent's descriptor) at least
/// once: a lost wake would end each sleep only by the selector's safety nap, with
/// no wake counted. On verbs (which also connects a peer on another host) the wake
/// comes through the connections' completion channels where `RCH_IB_WAKE` is
/// `select` or `1`;
/// without it the selector bounds its sleeps instead: the rounds must still name
/// the right connection.
#[test]
fn a_selector_sleeps_until_another_process_writes() {
    if role().is_some() {
        return;
    }
    use rdma_channel::select::{Interest, Select, Selector};
    let dir = scratch_dir("select");
    let _cleanup = RemoveOnDrop(dir.clone());
    let (listener, address) = listen_for_child(&dir, Config::default());
    let child = spawn_peer(
        "select_child_writer",
        &[(ROLE, "select".into()), (SOCKET, address)],
    );
    let mut streams: Vec<RdmaStream> = (0..4)
        .map(|_| {
            listener
                .accept()
                .unwrap_or_else(|e| panic!("accept: {}", ioe(&e)))
        })
        .collect();
    let mut selector = Selector::new().unwrap();
    for round in 0..SELECT_ROUNDS {
        streams[0].write_all(b"g").unwrap();
        streams[0].flush().unwrap();
        let (first, rest) = streams.split_at_mut(1);
        let mut items: Vec<Select<'_>> = std::iter::once(&mut first[0])
            .chain(rest.iter_mut())
            .map(|s| Select::new(s, Interest::READABLE))
            .collect();
        let n = selector
            .select(&mut items, Some(Duration::from_secs(60)))
            .unwrap();
        let which: Vec<usize> = (0..4).filter(|&i| items[i].ready().is_readable()).collect();
        drop(items);
        assert_eq!((n, which), (1, vec![round % 4]), "round {round}");
        let mut one = [0u8; 1];
        streams[round % 4].read_exact(&mut one).unwrap();
        assert_eq!(one[0], round as u8);
    }
    let wakes = selector.wakes();
    // The child ends (closing every stream) only after this.
    streams[0].write_all(b"d").unwrap();
    streams[0].flush().unwrap();
    drop(streams);
    let (status, out, err) = child.wait(Instant::now() + limit(60));
    assert!(
        status.as_ref().is_some_and(|s| s.success()),
        "child: {status:?}\n{out}\n{err}"
    );
    println!("selector: {wakes} wakes in {SELECT_ROUNDS} rounds");
    // A peer on another host is reached by verbs whatever RCH_FABRIC says; verbs
    // wakes through the completion channels where both ends turned wakes on
    // (RCH_IB_WAKE=select or 1, which the child inherits).
    let verbs = fabric_kind() != rdma_channel::fabric::FabricKind::Emulated || peer::across_hosts();
    let verbs_wakes =
        std::env::var("RCH_IB_WAKE").is_ok_and(|v| matches!(v.trim(), "1" | "select"));
    if !verbs || verbs_wakes {
        assert!(
            wakes >= 1,
            "no wake came through the eventfd or a completion channel"
        );
    }
}

/// The child side of `a_selector_sleeps_until_another_process_writes`.
#[test]
fn select_child_writer() {
    if role().as_deref() != Some("select") {
        return;
    }
    let address = std::env::var(SOCKET).unwrap();
    let mut streams: Vec<RdmaStream> = (0..4)
        .map(|_| RdmaStream::connect(address.as_str()).unwrap())
        .collect();
    for round in 0..SELECT_ROUNDS {
        let mut go = [0u8; 1];
        streams[0].read_exact(&mut go).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        streams[round % 4].write_all(&[round as u8]).unwrap();
        streams[round % 4].flush().unwrap();
    }
    let mut done = [0u8; 1];
    streams[0].read_exact(&mut done).unwrap();
}
