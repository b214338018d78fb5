//! Connections by IP address: `RdmaListener::bind("ip:port")` and
//! `RdmaStream::connect("ip:port")` through rdma_cm on the verbs fabric.
//!
//! * Without RDMA (the host's `cargo test`): an IP address is a clear error, never a
//!   hang (`Unsupported` without the `verbs` feature, `NotFound` without a device).
//! * With an RDMA device that has an IP address (the Soft-RoCE VM: `SOFTROCE_IP`; or
//!   `RCH_TEST_IP`): the peer is a child process (this binary, one role) that
//!   connects to our address; in a test cluster (`RCH_TEST_PEER_AGENT`, see
//!   `common::peer`) that child runs on the other host, so every byte crosses the link.
//!
//! The role tests (`*_role`) return at once unless `RCH_TEST_CHILD_ROLE` names them.

mod common;

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use common::exchange::exchange;
use common::peer::{across_hosts, spawn_peer, PeerRun};
use common::*;
use rdma_channel::{Address, Config, RdmaListener, RdmaStream};

const ROLE: &str = "RCH_TEST_CHILD_ROLE";
const TARGET: &str = "RCH_TEST_TARGET";
const BYTES: &str = "RCH_TEST_BYTES";

fn role() -> Option<String> {
    std::env::var(ROLE).ok().filter(|r| !r.is_empty())
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("role: {k} not set"))
}

/// Skips (returns true, with a note) where no RDMA device with an address is there.
fn no_rdma(test: &str) -> bool {
    if role().is_some() {
        return true;
    }
    if !rdma_ip_available() {
        println!("{test}: skipped (no RDMA device with an IP address: run it in the Soft-RoCE VM)");
        return true;
    }
    false
}

/// A listener on all addresses, port picked by the system; and the address a peer
/// connects to (`my_ip():port`).
fn listen(cfg: Config) -> (RdmaListener, String) {
    let l = RdmaListener::bind_with("0.0.0.0:0", cfg).expect("bind 0.0.0.0:0");
    let Address::Inet(a) = l.local_addr().expect("local_addr") else {
        panic!("an IP listener reports a path");
    };
    assert_ne!(a.port(), 0, "the listener must report the port it got");
    (l, format!("{}:{}", my_ip(), a.port()))
}

/// Accepts one connection, failing the test if none arrives in time or the peer
/// process ended first.
fn accept_from(l: RdmaListener, peer: &mut PeerRun) -> RdmaStream {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(l.accept());
    });
    let deadline = Instant::now() + limit(60);
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(r) => return r.expect("accept"),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(e) => panic!("accept thread: {e}"),
        }
        assert!(!peer.exited(), "the peer ended before connecting");
        assert!(
            Instant::now() < deadline,
            "no connection within {:?}",
            limit(60)
        );
    }
}

fn finish(peer: PeerRun, what: &str) -> String {
    let (status, out, err) = peer.wait(Instant::now() + limit(120));
    let report = format!("--- peer stdout ---\n{out}\n--- peer stderr ---\n{err}");
    let status = status.unwrap_or_else(|| panic!("{what}: the peer hung\n{report}"));
    assert!(status.success(), "{what}: peer failed: {status}\n{report}");
    assert!(
        out.contains("1 passed"),
        "{what}: the peer's role did not run\n{report}"
    );
    out
}

// -------------------------------------------------------------------------------------
// Without RDMA
// -------------------------------------------------------------------------------------

#[test]
fn ip_address_without_rdma_is_a_clear_error() {
    if role().is_some() || rdma_ip_available() {
        return;
    }
    let started = Instant::now();
    let bind = RdmaListener::bind("127.0.0.1:0").expect_err("no RDMA: bind must fail");
    let connect = RdmaStream::connect("127.0.0.1:7471").expect_err("no RDMA: connect must fail");
    for e in [&bind, &connect] {
        if cfg!(feature = "verbs") {
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::Unsupported
                ),
                "{}",
                ioe(e)
            );
            assert!(
                e.to_string().contains("RDMA") || e.to_string().contains("rdma"),
                "{e}"
            );
        } else {
            assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{}", ioe(e));
            assert!(e.to_string().contains("--features verbs"), "{e}");
        }
        assert!(
            e.to_string().contains("127.0.0.1"),
            "names the address: {e}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(5), "fails fast");
    // A path still works as before.
    let dir = std::env::temp_dir().join(format!("rch-inet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let l = RdmaListener::bind(dir.join("sock")).expect("a path needs no RDMA");
    assert_eq!(l.local_addr().unwrap(), Address::Unix(dir.join("sock")));
    drop(l);
    let _ = std::fs::remove_dir_all(&dir);
}

// -------------------------------------------------------------------------------------
// A connection by address, both directions checked byte for byte
// -------------------------------------------------------------------------------------

fn exchange_bytes() -> u64 {
    std::env::var(BYTES)
        .ok()
        .and_then(|v| rdma_channel::config::parse_size(&v).ok())
        .map_or(32 << 20, |b| b as u64)
}

#[test]
fn connect_by_address_and_exchange() {
    if no_rdma("connect_by_address_and_exchange") {
        return;
    }
    let bytes = exchange_bytes();
    let (l, target) = listen(Config::default());
    let mut peer = spawn_peer(
        "exchange_role",
        &[
            (ROLE, "exchange".into()),
            (TARGET, target.clone()),
            (BYTES, bytes.to_string()),
        ],
    );
    let s = accept_from(l, &mut peer);
    let Some(Address::Inet(peer_addr)) = s.peer_addr().cloned() else {
        panic!("an accepted IP stream knows its peer's address");
    };
    assert!(s.local_addr().is_some());
    println!(
        "inet: accepted {peer_addr} on {} ({})",
        s.local_addr().unwrap(),
        if across_hosts() {
            "other host"
        } else {
            "this host"
        }
    );
    let t = Instant::now();
    let stats = with_watchdog("exchange by address", limit(600), move || {
        exchange(s, "listener", 11, 22, bytes)
    })
    .unwrap_or_else(|e| panic!("listener side: {e}"));
    assert_eq!((stats.sent, stats.received), (bytes, bytes));
    let out = finish(peer, "exchange");
    println!(
        "inet: {} MiB each way in {:.1} s",
        bytes >> 20,
        t.elapsed().as_secs_f64()
    );
    assert!(out.contains("connector: sent"), "{out}");
}

#[test]
fn exchange_role() {
    if role().as_deref() != Some("exchange") {
        return;
    }
    let target = env(TARGET);
    let bytes: u64 = env(BYTES).parse().unwrap();
    let s = RdmaStream::connect(target.as_str())
        .unwrap_or_else(|e| panic!("connect {target}: {}", ioe(&e)));
    assert_eq!(s.peer_addr(), Some(&Address::Inet(target.parse().unwrap())));
    let stats = exchange(s, "connector", 22, 11, bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((stats.sent, stats.received), (bytes, bytes));
}

/// The channel's contract across hosts, as the channel suite's model checks it in
/// one process: one thread interleaves non-blocking `put`s (random sizes up to
/// 256 KiB, random iovec shapes, offered again from where the last one stopped)
/// and `get`s (random buffer sizes and shapes) in a random order, against a peer
/// that echoes every byte; every byte comes back, in order, exactly once.
#[test]
fn nonblocking_put_get_model_across_hosts() {
    if no_rdma("nonblocking_put_get_model_across_hosts") {
        return;
    }
    for seed in 0..u64::from(scaled(4)) {
        let cfg = Config::default()
            .with_ring_size(64 << 10)
            .with_chunk_size(8 << 10);
        let (l, target) = listen(cfg.clone());
        let mut peer = spawn_peer("echo_role", &[(ROLE, "echo".into()), (TARGET, target)]);
        let s = accept_from(l, &mut peer);
        let total: u64 = 8 << 20;
        let report = watched("put/get model", limit(300), move || {
            let mut s = s;
            let mut rng = Rng::new(0xec40 ^ seed);
            let (mut put, mut got) = (0u64, 0u64);
            let mut out = Vec::new();
            let mut inb = vec![0u8; 256 << 10];
            let mut scratch = Vec::new();
            let mut stall = StallCheck::new(u64::MAX);
            let (mut puts, mut gets) = (0u64, 0u64);
            while got < total {
                let before = (put, got);
                if put < total && rng.chance(1, 2) {
                    // The next message, offered (again) from where the last put stopped.
                    let n = (rng.log_uniform(1, 256 << 10) as u64).min(total - put) as usize;
                    out.resize(n, 0);
                    stream_fill(seed, put, &mut out);
                    let shape = random_shape(&mut rng, n, 6);
                    let k = s
                        .put(&iovecs(&out, &shape, 0))
                        .map_err(|e| format!("put after {put} bytes: {}", ioe(&e)))?;
                    if k > n {
                        return Err(format!("put took {k} of {n} bytes"));
                    }
                    put += k as u64;
                    puts += 1;
                } else {
                    let cap = rng.log_uniform(1, inb.len());
                    let shape = random_shape(&mut rng, cap, 6);
                    let k = s
                        .get(&mut iovecs_mut(&mut inb[..cap], &shape))
                        .map_err(|e| format!("get after {got} bytes: {}", ioe(&e)))?;
                    if got + k as u64 > put {
                        return Err(format!("got {} bytes back of {put} put", got + k as u64));
                    }
                    stream_check(seed, got, &inb[..k], &mut scratch)?;
                    got += k as u64;
                    gets += 1;
                }
                if stall.stalled((put, got) != before) {
                    return Err(format!("no progress at put {put}, got {got} (hang?)"));
                }
            }
            s.shutdown_write().map_err(|e| ioe(&e))?;
            Ok(format!(
                "{} MiB echoed: {puts} puts, {gets} gets",
                total >> 20
            ))
        });
        match report {
            Ok(r) => println!("inet: model seed {seed}: {r}"),
            Err(e) => {
                let (status, out, err) = peer.wait(Instant::now() + limit(30));
                panic!("seed {seed}: {e}\npeer: {status:?}\n{out}\n{err}");
            }
        }
        finish(peer, "put/get model");
    }
}

#[test]
fn echo_role() {
    if role().as_deref() != Some("echo") {
        return;
    }
    let cfg = Config::default()
        .with_ring_size(64 << 10)
        .with_chunk_size(8 << 10);
    let s = RdmaStream::connect_with(env(TARGET).as_str(), cfg).expect("connect");
    let (mut r, mut w) = s.split();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = r.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        w.write_all(&buf[..n]).expect("echo");
    }
    w.shutdown().expect("shutdown");
}

// -------------------------------------------------------------------------------------
// Failing connects: refused, absent host
// -------------------------------------------------------------------------------------

#[test]
fn connect_where_nothing_listens_is_refused_fast() {
    if no_rdma("connect_where_nothing_listens_is_refused_fast") {
        return;
    }
    // A port of our own address where nobody listens (bound and dropped).
    let (l, target) = listen(Config::default());
    drop(l);
    let t = Instant::now();
    let e = RdmaStream::connect(target.as_str()).expect_err("nothing listens: connect must fail");
    let took = t.elapsed();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{}", ioe(&e));
    assert!(e.to_string().contains(&target), "names the address: {e}");
    assert!(took < Duration::from_secs(5), "refused after {took:?}");
    println!("inet: refused in {took:?}: {e}");
}

#[test]
fn connect_to_an_absent_host_fails_within_the_timeout() {
    if no_rdma("connect_to_an_absent_host_fails_within_the_timeout") {
        return;
    }
    // An address on our own private link where no host is (the link exists only
    // between the test VMs).
    let ip: std::net::Ipv4Addr = my_ip().parse().expect("an IPv4 address");
    let o = ip.octets();
    let absent = format!("{}.{}.{}.{}:7471", o[0], o[1], o[2], 250);
    let cfg = Config::default().with_connect_timeout(Duration::from_secs(3));
    let t = Instant::now();
    let e = RdmaStream::connect_with(absent.as_str(), cfg)
        .expect_err("no host there: connect must fail");
    let took = t.elapsed();
    assert!(
        matches!(
            e.kind(),
            io::ErrorKind::TimedOut | io::ErrorKind::HostUnreachable
        ),
        "{}",
        ioe(&e)
    );
    assert!(e.to_string().contains(&absent), "names the address: {e}");
    assert!(took < Duration::from_secs(8), "gave up after {took:?}");
    println!("inet: absent host: {took:?}: {e}");
}

// -------------------------------------------------------------------------------------
// Several connections at once; close and death of the peer
// -------------------------------------------------------------------------------------

const CONNECTIONS: usize = 4;

#[test]
fn listener_serves_concurrent_connects() {
    if no_rdma("listener_serves_concurrent_connects") {
        return;
    }
    let (l, target) = listen(
        Config::default()
            .with_ring_size(64 << 10)
            .with_chunk_size(8 << 10),
    );
    let peer = spawn_peer("many_role", &[(ROLE, "many".into()), (TARGET, target)]);
    let l = std::sync::Arc::new(l);
    let mut servers = Vec::new();
    for _ in 0..CONNECTIONS {
        let l = l.clone();
        servers.push(std::thread::spawn(move || -> Result<u8, String> {
            let mut s = l.accept().map_err(|e| ioe(&e))?;
            let mut tag = [0u8; 1];
            s.read_exact(&mut tag).map_err(|e| ioe(&e))?;
            let data = stream_vec(u64::from(tag[0]), 0, 1 << 20);
            s.write_all(&data).map_err(|e| ioe(&e))?;
            let mut back = vec![0u8; 1 << 20];
            s.read_exact(&mut back).map_err(|e| ioe(&e))?;
            if back != data {
                return Err(format!("connection {}: echo differs", tag[0]));
            }
            Ok(tag[0])
        }));
    }
    let served: Result<Vec<u8>, String> = watched("concurrent connects", limit(300), move || {
        servers.into_iter().map(|h| join(h, "server")).collect()
    });
    let mut tags = match served {
        Ok(t) => t,
        Err(e) => {
            let (status, out, err) = peer.wait(Instant::now() + limit(30));
            panic!("{e}\npeer: {status:?}\n--- peer stdout ---\n{out}\n--- peer stderr ---\n{err}");
        }
    };
    tags.sort_unstable();
    assert_eq!(tags, (0..CONNECTIONS as u8).collect::<Vec<_>>());
    finish(peer, "concurrent connects");
}

#[test]
fn many_role() {
    if role().as_deref() != Some("many") {
        return;
    }
    let target = env(TARGET);
    let cfg = Config::default()
        .with_ring_size(64 << 10)
        .with_chunk_size(8 << 10);
    let clients: Vec<_> = (0..CONNECTIONS as u8)
        .map(|i| {
            let (t, c) = (target.clone(), cfg.clone());
            std::thread::spawn(move || {
                let mut s = RdmaStream::connect_with(t.as_str(), c).expect("connect");
                s.write_all(&[i]).expect("write the tag");
                let mut got = vec![0u8; 1 << 20];
                s.read_exact(&mut got).expect("read the data");
                s.write_all(&got).expect("echo the data");
                // Wait for the listener's side to finish reading before dropping.
                let mut end = [0u8; 1];
                let n = s
                    .read(&mut end)
                    .expect("wait for the listener's end of stream");
                assert_eq!(n, 0, "end of stream");
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
}

/// A connection nobody uses for a while (so keepalives go out) still works, and a
/// reader blocked for that long is not woken by anything but data.
#[test]
fn idle_connection_survives_keepalives() {
    if no_rdma("idle_connection_survives_keepalives") {
        return;
    }
    let (l, target) = listen(Config::default());
    let mut peer = spawn_peer("idle_role", &[(ROLE, "idle".into()), (TARGET, target)]);
    let mut s = accept_from(l, &mut peer);
    let t = Instant::now();
    let mut buf = [0u8; 5];
    with_watchdog("read after idling", limit(60), move || {
        s.read_exact(&mut buf).map(|()| (buf, s))
    })
    .map(|(buf, mut s)| {
        assert_eq!(&buf, b"later");
        s.write_all(b"ok").unwrap();
        let mut end = [0u8; 1];
        assert_eq!(
            s.read(&mut end).unwrap(),
            0,
            "end of stream after the peer closed"
        );
    })
    .expect("the idle connection must still work");
    assert!(t.elapsed() >= Duration::from_secs(3), "the peer idled");
    finish(peer, "idle connection");
}

#[test]
fn idle_role() {
    if role().as_deref() != Some("idle") {
        return;
    }
    let mut s = RdmaStream::connect(env(TARGET).as_str()).expect("connect");
    // Several keepalive periods (1 s) of silence on both sides.
    std::thread::sleep(Duration::from_secs(4));
    s.write_all(b"later").unwrap();
    let mut ok = [0u8; 2];
    s.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"ok");
}

#[test]
fn graceful_close_delivers_everything_then_end_of_stream() {
    if no_rdma("graceful_close_delivers_everything_then_end_of_stream") {
        return;
    }
    let (l, target) = listen(Config::default());
    let mut peer = spawn_peer("close_role", &[(ROLE, "close".into()), (TARGET, target)]);
    let mut s = accept_from(l, &mut peer);
    // The peer wrote everything, shut down and dropped its stream (and exited)
    // without waiting for us: every byte must still arrive, then end of stream.
    let got = with_watchdog("read until end of stream", limit(120), move || {
        let mut all = Vec::new();
        s.read_to_end(&mut all).map(|_| all)
    })
    .expect("read to end");
    assert_eq!(got.len(), 3 << 20);
    assert!(got == stream_vec(5, 0, 3 << 20), "bytes differ");
    finish(peer, "graceful close");
}

/// A stream whose peer closed first is dropped without waiting: the queue pair's
/// linger (up to 2 s for its last writes to be acknowledged) ends when the peer's
/// disconnect arrives, since a peer that disconnected acknowledges nothing more.
/// (Between the Soft-RoCE VMs every such drop took the whole 2 s.)
#[test]
fn dropping_a_stream_whose_peer_closed_first_does_not_wait_out_the_linger() {
    if no_rdma("dropping_a_stream_whose_peer_closed_first_does_not_wait_out_the_linger") {
        return;
    }
    // Two rails, as where this was seen (the rails' queue pairs close with rail 0's).
    let two =
        Config::default().with_rails(rdma_channel::config::RailSpec::parse_list("2").unwrap());
    let (l, target) = listen(two);
    let mut peer = spawn_peer("reader_role", &[(ROLE, "reader".into()), (TARGET, target)]);
    let mut w = accept_from(l, &mut peer);
    w.write_all(&stream_vec(9, 0, 1 << 20)).unwrap();
    w.shutdown_write().unwrap();
    // Returns once the peer read everything and dropped its end.
    let mut b = [0u8; 1];
    let _ = w.read(&mut b);
    // Its disconnect follows its drop; give the event a moment to arrive.
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    drop(w);
    let took = t.elapsed();
    let out = finish(peer, "reader");
    assert!(out.contains("reader: 1048576 bytes"), "{out}");
    assert!(
        took < Duration::from_millis(1500),
        "dropping took {took:?}: the 2 s linger ran out instead of ending at the disconnect"
    );
}

#[test]
fn reader_role() {
    if role().as_deref() != Some("reader") {
        return;
    }
    let target = env(TARGET);
    let two =
        Config::default().with_rails(rdma_channel::config::RailSpec::parse_list("2").unwrap());
    let mut s = RdmaStream::connect_with(target.as_str(), two).expect("connect");
    let mut all = Vec::new();
    s.read_to_end(&mut all).expect("read to end");
    assert!(all == stream_vec(9, 0, 1 << 20), "bytes differ");
    drop(s);
    println!("reader: {} bytes", all.len());
}

#[test]
fn close_role() {
    if role().as_deref() != Some("close") {
        return;
    }
    let target = env(TARGET);
    let mut s = RdmaStream::connect(target.as_str()).expect("connect");
    s.write_all(&stream_vec(5, 0, 3 << 20)).unwrap();
    s.shutdown_write().unwrap();
    drop(s);
}

/// The peer process killed with SIGKILL while we read and write: both fail with
/// `ConnectionReset` naming the peer, within seconds (rdma_cm's disconnect, sent by
/// the peer's kernel, or our keepalive), and no byte arrives that was not sent.
#[test]
fn peer_killed_mid_transfer_is_an_error_naming_no_false_bytes() {
    if no_rdma("peer_killed_mid_transfer_is_an_error_naming_no_false_bytes") {
        return;
    }
    let (l, target) = listen(Config::default());
    let mut peer = spawn_peer("crash_role", &[(ROLE, "crash".into()), (TARGET, target)]);
    let s = accept_from(l, &mut peer);
    let (mut r, mut w) = s.split();
    let mut first = vec![0u8; 1 << 20];
    r.read_exact(&mut first).unwrap();
    assert!(first == stream_vec(9, 0, 1 << 20), "the first MiB differs");
    // A reader that only reads (it must notice by itself) and a writer whose ring
    // fills (the peer stops reading), then the peer kills itself.
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let r = r.read(&mut buf);
        (r, Instant::now())
    });
    let go = Instant::now();
    let writer = std::thread::spawn(move || {
        let r = w
            .write_all(&[1u8])
            .and_then(|()| w.write_all(&vec![0u8; 64 << 20]));
        (r, Instant::now())
    });
    let (rres, rat) = with_watchdog("reader after the peer's death", limit(60), move || {
        reader.join().unwrap()
    });
    let (wres, wat) = with_watchdog("writer after the peer's death", limit(60), move || {
        writer.join().unwrap()
    });
    let re = match rres {
        Ok(n) => panic!("read {n} bytes the peer never sent"),
        Err(e) => e,
    };
    let we = wres.expect_err("writing to a dead peer must fail");
    for e in [&re, &we] {
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{}", ioe(e));
    }
    let (status, out, err) = peer.wait(Instant::now() + limit(60));
    assert!(
        status.as_ref().is_some_and(|s| !s.success()),
        "the peer should have been killed: {status:?}\n{out}\n{err}"
    );
    println!(
        "inet: fault SIGKILL ({}): reader failed {} ms, writer {} ms after the kill was requested: {re}",
        if across_hosts() { "other host" } else { "this host" },
        rat.duration_since(go).as_millis(),
        wat.duration_since(go).as_millis()
    );
}

#[test]
fn crash_role() {
    if role().as_deref() != Some("crash") {
        return;
    }
    let target = env(TARGET);
    let mut s = RdmaStream::connect(target.as_str()).expect("connect");
    s.write_all(&stream_vec(9, 0, 1 << 20)).unwrap();
    let mut go = [0u8; 1];
    s.read_exact(&mut go).unwrap();
    // SAFETY: getpid/kill have no memory effects; the process ends here, at once, as
    // if killed from outside (no destructor runs, nothing is closed in order).
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL ends the process");
}

/// The peer host's link taken down in the middle of a transfer both ways (only in a
/// test cluster that allows it: `RCH_TEST_LINK_DOWN=1`; `scripts/softroce-cluster-test`
/// runs it last and brings the link back after 15 s): our blocked reader and writer
/// fail with `ConnectionReset` in bounded time (the keepalive and the transport
/// retries: nothing else reaches us), every byte received is checked, and nothing
/// hangs.
#[test]
fn peer_link_down_is_detected() {
    if role().is_some()
        || !across_hosts()
        || std::env::var("RCH_TEST_LINK_DOWN").as_deref() != Ok("1")
    {
        println!(
            "peer_link_down_is_detected: needs a test cluster with RCH_TEST_LINK_DOWN=1: skipped"
        );
        return;
    }
    let (l, target) = listen(Config::default());
    let mut peer = spawn_peer("flow_role", &[(ROLE, "flow".into()), (TARGET, target)]);
    let s = accept_from(l, &mut peer);
    let (mut r, mut w) = s.split();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 << 10];
        let mut scratch = Vec::new();
        let mut got = 0u64;
        loop {
            match r.read(&mut buf) {
                Ok(0) => {
                    return (
                        Err(format!("end of stream after {got} bytes")),
                        got,
                        Instant::now(),
                    )
                }
                Ok(n) => {
                    if let Err(e) = stream_check(31, got, &buf[..n], &mut scratch) {
                        return (Err(e), got, Instant::now());
                    }
                    got += n as u64;
                }
                Err(e) => return (Ok(e), got, Instant::now()),
            }
        }
    });
    let writer = std::thread::spawn(move || {
        let chunk = vec![3u8; 256 << 10];
        loop {
            if let Err(e) = w.write_all(&chunk) {
                return (e, Instant::now());
            }
        }
    });
    // Let data flow both ways, then take the peer's link down (and back up later,
    // so that the cluster can end in order).
    std::thread::sleep(Duration::from_secs(3));
    let shell = std::env::var(common::peer::REMOTE_SHELL_ENV).unwrap_or_else(|_| "ssh".into());
    let host = common::peer::peer_host().unwrap();
    let down = Instant::now();
    let st = std::process::Command::new(&shell)
        .arg(&host)
        .arg("setsid sh -c 'ip link set $SOFTROCE_NETDEV down; sleep 15; ip link set $SOFTROCE_NETDEV up' </dev/null >/dev/null 2>&1 &")
        .status()
        .expect("run the link-down command on the peer host");
    assert!(st.success(), "link-down command: {st}");
    let (rres, got, rat) = with_watchdog(
        "reader after the link went down",
        Duration::from_secs(120),
        move || reader.join().unwrap(),
    );
    let (we, wat) = with_watchdog(
        "writer after the link went down",
        Duration::from_secs(120),
        move || writer.join().unwrap(),
    );
    let re = rres.unwrap_or_else(|e| panic!("reader: {e}"));
    assert!(got > 0, "no data flowed before the link went down");
    for e in [&re, &we] {
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{}", ioe(e));
    }
    println!(
        "inet: fault link down: reader failed {} ms, writer {} ms after the link went down ({} MiB received and checked): {re}",
        rat.saturating_duration_since(down).as_millis(),
        wat.saturating_duration_since(down).as_millis(),
        got >> 20
    );
    // The peer fails too (its port went down); its report arrives once the link is
    // back.
    let (status, _, _) = peer.wait(Instant::now() + Duration::from_secs(120));
    println!("inet: the peer ended with {status:?}");
}

#[test]
fn flow_role() {
    if role().as_deref() != Some("flow") {
        return;
    }
    let s = RdmaStream::connect(env(TARGET).as_str()).expect("connect");
    let (mut r, mut w) = s.split();
    let sink = std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 << 10];
        while matches!(r.read(&mut buf), Ok(n) if n > 0) {}
    });
    let mut off = 0u64;
    let mut chunk = vec![0u8; 256 << 10];
    loop {
        stream_fill(31, off, &mut chunk);
        if w.write_all(&chunk).is_err() {
            break;
        }
        off += chunk.len() as u64;
    }
    let _ = sink.join();
    std::process::exit(3);
}
