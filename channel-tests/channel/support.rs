//! Helpers of the edge-case, flag-payload, credit and deadlock tests: bounded
//! runs, settled gets on fabrics where writes land later, standard configurations.

use super::*;

/// Runs a test body under a watchdog (a hang fails the test after two minutes, ten
/// where writes land later).
pub(crate) fn bounded(name: &str, f: impl FnOnce() + Send + 'static) {
    with_watchdog(name, limit(120), f)
}

/// One `get` into `buf`; where writes land later, more into the rest of `buf`
/// until `want` bytes arrived or [`SETTLE`] passed. Returns the bytes received.
pub(crate) fn get_settled(s: &mut RdmaStream, buf: &mut [u8], want: usize) -> io::Result<usize> {
    let mut got = s.get(&mut [IoSliceMut::new(buf)])?;
    if lands_later() {
        let start = Instant::now();
        while got < want && start.elapsed() < SETTLE {
            got += s.get(&mut [IoSliceMut::new(&mut buf[got..])])?;
        }
    }
    Ok(got)
}

/// Where writes land later, waits until `s` has something to read (at most
/// [`SETTLE`]); on the emulated fabric what was put is there already.
pub(crate) fn await_data(s: &mut RdmaStream) {
    if lands_later() {
        let start = Instant::now();
        while !s.channel().receiver().can_get().unwrap_or(true) && start.elapsed() < SETTLE {
            std::thread::yield_now();
        }
    }
}

/// The error of a `put` of `data` to a peer that is gone. On the emulated fabric
/// the first call must fail; where writes land later the peer's notice may still be
/// in flight, so calls may take bytes until it arrives (at most [`SETTLE`]).
pub(crate) fn put_error(w: &mut RdmaStream, data: &[u8]) -> io::Error {
    let start = Instant::now();
    loop {
        match w.put(&[IoSlice::new(data)]) {
            Err(e) => return e,
            Ok(_) if lands_later() && start.elapsed() < SETTLE => std::thread::yield_now(),
            Ok(n) => panic!("put took {n} bytes; the peer is gone, so it must fail"),
        }
    }
}

/// Polls `r` (which must have nothing to read) until a `put` of `data` on `w`
/// takes something: the first put must on the emulated fabric, where the receiver's
/// answer to a credit request is placed at once; where writes land later the request
/// and the answer may be in flight (at most [`SETTLE`]). Returns the bytes taken.
pub(crate) fn put_while_peer_polls(w: &mut RdmaStream, r: &mut RdmaStream, data: &[u8]) -> usize {
    let start = Instant::now();
    loop {
        let n = w.put(&[IoSlice::new(data)]).unwrap();
        if n > 0 || !lands_later() || start.elapsed() > SETTLE {
            return n;
        }
        let mut buf = [0u8; 64];
        assert_eq!(r.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
    }
}

/// Configurations for the edge tests: inline and staging paths, tiny and large chunks.
pub(crate) fn edge_configs() -> Vec<Tun> {
    vec![
        Tun::new(4096, 1024),
        Tun::new(4096, 1024).inline(64),
        Tun::new(4096, 128),
        Tun::new(4096, 2048).inline(200).threshold(4096 - 64),
        Tun::new(64 << 10, 16 << 10),
        Tun::new(64 << 10, 32 << 10).inline(1000).threshold(1),
        Tun::new(256 << 10, 16 << 10),
    ]
}

/// Moves `data` from `w` to `r` in one thread, putting with `shape` pieces and getting
/// with `get_cap`-byte buffers, and checks it arrived intact.
pub(crate) fn transfer(
    w: &mut RdmaStream,
    r: &mut RdmaStream,
    data: &[u8],
    shape: &[usize],
    get_cap: usize,
) -> Result<(), String> {
    assert_eq!(sum(shape), data.len());
    let mut off = 0usize;
    let mut got = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; get_cap];
    let mut stall = StallCheck::new(1000);
    while got.len() < data.len() {
        let mut progressed = false;
        if off < data.len() {
            let n = w
                .put(&iovecs(data, shape, off))
                .map_err(|e| format!("put: {}", ioe(&e)))?;
            if n > data.len() - off {
                return Err(format!("put took {n}, offered {}", data.len() - off));
            }
            off += n;
            progressed |= n > 0;
        }
        let m = r
            .get(&mut [IoSliceMut::new(&mut buf)])
            .map_err(|e| format!("get: {}", ioe(&e)))?;
        got.extend_from_slice(&buf[..m]);
        if got.len() > off {
            return Err(format!("received {} bytes, only {off} were put", got.len()));
        }
        progressed |= m > 0;
        if stall.stalled(progressed) {
            return Err(format!(
                "stalled: {off} put, {} received of {}",
                got.len(),
                data.len()
            ));
        }
    }
    compare_streams(data, &got, "transfer")
}
