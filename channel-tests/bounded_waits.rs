//! Bounded waits on the Unix-socket path: a handshake that does not finish in time
//! is an error (`TimedOut`), a silent client does not stop a listener from serving
//! the next one, and a live listener's path cannot be taken over.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_channel::{Config, RdmaListener, RdmaStream};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rch-waits-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn quick() -> Config {
    Config::default().with_connect_timeout(Duration::from_millis(800))
}

/// A server that accepts and then does `behave` with the connection, forever silent
/// afterwards; connecting to it must fail with `TimedOut` within the timeout.
fn connect_to_a_stalling_server(name: &str, behave: fn(&mut UnixStream)) {
    let dir = scratch(name);
    let path = dir.join("sock");
    let server = UnixListener::bind(&path).unwrap();
    let hold = std::thread::spawn(move || {
        let (mut s, _) = server.accept().unwrap();
        behave(&mut s);
        std::thread::sleep(Duration::from_secs(5));
        drop(s);
    });
    let start = Instant::now();
    let e = RdmaStream::connect_with(&path, quick())
        .map(|_| ())
        .unwrap_err();
    let took = start.elapsed();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    drop(hold);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn connect_to_a_silent_server_times_out() {
    connect_to_a_stalling_server("silent", |_| {});
}

#[test]
fn connect_to_a_server_that_stops_mid_frame_times_out() {
    // A length prefix announcing 100 bytes, then nothing.
    connect_to_a_stalling_server("midframe", |s| s.write_all(&100u32.to_le_bytes()).unwrap());
}

/// Accepts one connection on `listener` while `client` connects; fails (instead of
/// waiting forever in `accept`) if the client's connect fails. The accept runs on a
/// thread of its own, left behind on failure.
fn accept_while<T: Send + 'static>(
    listener: &Arc<RdmaListener>,
    client: std::thread::JoinHandle<std::io::Result<T>>,
) -> (RdmaStream, T) {
    let l = Arc::clone(listener);
    let accepted = std::thread::spawn(move || l.accept());
    let mut client = Some(client);
    let mut connected = None;
    while !accepted.is_finished() {
        if client.as_ref().is_some_and(|c| c.is_finished()) {
            match client.take().unwrap().join().unwrap() {
                Ok(c) => connected = Some(c),
                Err(e) => panic!("the client failed to connect: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = accepted.join().unwrap().unwrap();
    let c = match connected {
        Some(c) => c,
        None => client.unwrap().join().unwrap().unwrap(),
    };
    (s, c)
}

#[test]
fn a_silent_client_does_not_stop_the_listener_serving_a_good_one() {
    let dir = scratch("accept");
    let path = dir.join("sock");
    // 4 s each: long enough for a good client's handshake on a slow machine (a
    // Soft-RoCE VM under TCG, the host busy), short enough that handshakes served one
    // after another (the silent one's 4 s, then the half frame's 2 s) would break
    // the bound below.
    let cfg = Config::default().with_connect_timeout(Duration::from_secs(4));
    let listener = Arc::new(RdmaListener::bind_with(&path, cfg).unwrap());
    // First a client that connects and says nothing, then one that says half a frame.
    let _silent = UnixStream::connect(&path).unwrap();
    let mut half = UnixStream::connect(&path).unwrap();
    half.write_all(&64u32.to_le_bytes()).unwrap();
    let p = path.clone();
    let good = std::thread::spawn(move || {
        let mut s = RdmaStream::connect_with(&p, Config::default())?;
        s.write_all(b"served")?;
        Ok(s)
    });
    let start = Instant::now();
    let (mut s, _client) = accept_while(&listener, good);
    let took = start.elapsed();
    let mut got = [0u8; 6];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"served");
    assert!(
        took < Duration::from_secs(6),
        "the good client waited {took:?} behind two stalled ones"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_client_the_listener_drops_learns_why() {
    // The listener's handshakes time out at once: the client, whether its HELLO got
    // in before the drop or met a closed socket, hears the listener's reason.
    let dir = scratch("dropped");
    let path = dir.join("sock");
    let cfg = Config::default().with_connect_timeout(Duration::from_micros(1));
    let listener = Arc::new(RdmaListener::bind_with(&path, cfg).unwrap());
    let l = Arc::clone(&listener);
    // Serves (and drops) handshakes for the rest of the run; none succeeds.
    std::thread::spawn(move || l.accept());
    let e = RdmaStream::connect_with(&path, Config::default())
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    assert!(e.to_string().contains("handshake timed out"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn with_the_default_timeout_a_good_client_is_served_while_silent_ones_wait() {
    // Handshakes run side by side: with the default 10 s handshake bound, clients
    // that say nothing, or stop mid-frame, must not hold up one that connects
    // 100 ms after them (served one after another, it would wait 10 s or more).
    let dir = scratch("accept-default");
    let path = dir.join("sock");
    let listener = Arc::new(RdmaListener::bind_with(&path, Config::default()).unwrap());
    let _silent = UnixStream::connect(&path).unwrap();
    let mut half = UnixStream::connect(&path).unwrap();
    half.write_all(&64u32.to_le_bytes()).unwrap();
    let p = path.clone();
    let good = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let mut s = RdmaStream::connect_with(&p, Config::default())?;
        s.write_all(b"served")?;
        Ok(s)
    });
    let start = Instant::now();
    let (mut s, _client) = accept_while(&listener, good);
    let took = start.elapsed();
    let mut got = [0u8; 6];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"served");
    assert!(
        took < Duration::from_secs(5),
        "the good client waited {took:?} behind silent ones"
    );
    // The silent client is still waited for (its own 10 s have not passed): a
    // second good client is served meanwhile too.
    let p = path.clone();
    let second = std::thread::spawn(move || {
        let mut s = RdmaStream::connect_with(&p, Config::default())?;
        s.write_all(b"again")?;
        Ok(s)
    });
    let (mut s, _client) = accept_while(&listener, second);
    let mut got = [0u8; 5];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"again");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bind_refuses_a_live_listeners_path_and_replaces_a_stale_one() {
    let dir = scratch("bind");
    let path = dir.join("sock");
    let first = Arc::new(RdmaListener::bind(&path).unwrap());
    let e = RdmaListener::bind(&path).map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
    // The first listener still serves its path.
    let p = path.clone();
    let c = std::thread::spawn(move || RdmaStream::connect(&p));
    accept_while(&first, c);
    drop(first);
    // A socket file nobody listens on any more is stale: binding replaces it.
    let stale = UnixListener::bind(dir.join("stale")).unwrap();
    drop(stale);
    RdmaListener::bind(dir.join("stale")).unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn read_and_write_timeouts_fail_with_timed_out_and_leave_the_stream_usable() {
    let cfg = Config::default().with_ring_size(8192).with_chunk_size(1024);
    let (mut a, mut b) = RdmaStream::pair_with(cfg).unwrap();
    assert!(a.set_read_timeout(Some(Duration::ZERO)).is_err());
    a.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let start = Instant::now();
    let e = a.read(&mut [0u8; 16]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert!(start.elapsed() >= Duration::from_millis(50));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    // Fill the peer's ring: the next write times out, having written nothing.
    b.set_write_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut sent = 0;
    loop {
        match b.write(&[7u8; 4096]) {
            Ok(n) => sent += n,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
                break;
            }
        }
        assert!(
            sent < 1 << 20,
            "an 8 KiB ring took {sent} bytes without a reader"
        );
    }
    // Both still work: everything written arrives, in order.
    let mut got = vec![0u8; sent];
    a.set_read_timeout(None).unwrap();
    a.read_exact(&mut got).unwrap();
    assert!(got.iter().all(|&x| x == 7));
    b.write_all(b"after").unwrap();
    let mut five = [0u8; 5];
    a.read_exact(&mut five).unwrap();
    assert_eq!(&five, b"after");
}

#[test]
fn a_read_half_can_wait_for_data_and_times_out_without_it() {
    let (a, b) = RdmaStream::pair().unwrap();
    let (mut rx, _w) = b.split();
    let (_r, mut tx) = a.split();
    rx.set_read_timeout(Some(Duration::from_millis(30)))
        .unwrap();
    assert_eq!(rx.wait_readable().unwrap_err().kind(), ErrorKind::TimedOut);
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(10));
        tx.write_all(b"x").unwrap();
        tx
    });
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    rx.wait_readable().unwrap();
    let mut one = [0u8; 1];
    assert_eq!(
        rx.get(&mut [std::io::IoSliceMut::new(&mut one)]).unwrap(),
        1
    );
    let mut tx = t.join().unwrap();
    tx.shutdown().unwrap();
    assert_eq!(
        rx.wait_readable().unwrap_err().kind(),
        ErrorKind::UnexpectedEof
    );
}

#[test]
fn streams_and_listeners_have_debug() {
    let (a, _b) = RdmaStream::pair().unwrap();
    let text = format!("{a:?}");
    assert!(
        text.starts_with("RdmaStream") && text.contains("ring_size"),
        "{text}"
    );
    let (r, w) = a.split();
    assert!(format!("{r:?} {w:?}").contains("ReadHalf"));
    let dir = scratch("debug");
    let l = RdmaListener::bind(dir.join("sock")).unwrap();
    assert!(format!("{l:?}").contains("sock"), "{l:?}");
    let _ = std::fs::remove_dir_all(dir);
}
