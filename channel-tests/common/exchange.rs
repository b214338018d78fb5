//! The checksummed exchange both ways over one stream, shared by the two-process and
//! the cross-host tests.

use std::io::Write;
use std::time::Instant;

use super::*;
use rdma_channel::RdmaStream;

#[derive(Debug)]
pub struct SideStats {
    pub sent: u64,
    pub received: u64,
    pub send_secs: f64,
    pub recv_secs: f64,
}

/// One side of the exchange: a writer thread sends `bytes` of stream `my_seed` in
/// random messages (log-uniform 1 B ..= 1 MiB, a quarter of them vectored, a third
/// from `alloc_mem`: ring, and zero-copy from shared and from heap memory), then shuts
/// down; this thread reads (random sizes, some vectored) and checks every byte against
/// stream `peer_seed` until end of stream.
pub fn exchange(
    stream: RdmaStream,
    name: &str,
    my_seed: u64,
    peer_seed: u64,
    bytes: u64,
) -> Result<SideStats, String> {
    let (mut r, mut w) = stream.split();
    let wname = name.to_string();
    let writer = std::thread::spawn(move || -> Result<(u64, f64), String> {
        let start = Instant::now();
        let mut rng = Rng::new(my_seed ^ 0x3141_5926);
        let mut heap = vec![0u8; 1 << 20];
        // A third of the messages come from alloc_mem memory, which goes zero-copy
        // from the fabric's threshold (16 KiB emulated); heap messages go zero-copy
        // from exchange_config's private threshold.
        let mut shared = w
            .alloc_mem(1 << 20)
            .map_err(|e| format!("{wname} writer: alloc_mem: {}", ioe(&e)))?;
        let mut off = 0u64;
        let mut messages = 0u64;
        while off < bytes {
            let n = (rng.log_uniform(1, 1 << 20) as u64).min(bytes - off) as usize;
            let buf: &mut [u8] = if rng.chance(1, 3) {
                &mut shared
            } else {
                &mut heap
            };
            stream_fill(my_seed, off, &mut buf[..n]);
            let r = if rng.chance(1, 4) {
                let shape = random_shape(&mut rng, n, 8);
                write_all_vectored(&mut w, &buf[..n], &shape)
            } else {
                w.write_all(&buf[..n])
            };
            r.map_err(|e| {
                format!(
                    "{wname} writer: after {off} bytes ({messages} messages): {}",
                    ioe(&e)
                )
            })?;
            off += n as u64;
            messages += 1;
        }
        w.shutdown()
            .map_err(|e| format!("{wname} writer: shutdown: {}", ioe(&e)))?;
        // Every zero-copy message looked its buffer up in the cache.
        let st = w.registration_cache().stats();
        println!(
            "{wname} writer: {messages} messages, {} zero-copy registrations looked up ({} hits)",
            st.hits + st.misses,
            st.hits
        );
        if bytes >= 64 << 20 && st.hits + st.misses == 0 {
            return Err(format!("{wname} writer: no message went zero-copy"));
        }
        Ok((off, start.elapsed().as_secs_f64()))
    });
    let start = Instant::now();
    let mut rng = Rng::new(my_seed ^ 0x2718_2818);
    let mut buf = vec![0u8; 1 << 20];
    let mut scratch = Vec::with_capacity(1 << 20);
    let mut got = 0u64;
    let read_result: Result<(), String> = loop {
        let (n, cap) = match read_random(&mut r, &mut buf, &mut rng) {
            Ok(read) => read,
            Err(e) => break Err(format!("{name} reader: after {got} bytes: {}", ioe(&e))),
        };
        if n == 0 {
            break if got == bytes {
                Ok(())
            } else {
                Err(format!(
                    "{name} reader: end of stream after {got} of {bytes} bytes"
                ))
            };
        }
        if n > cap {
            break Err(format!("{name} reader: read returned {n} > {cap}"));
        }
        if let Err(e) = stream_check(peer_seed, got, &buf[..n], &mut scratch) {
            break Err(format!("{name} reader: {e}"));
        }
        got += n as u64;
        if got > bytes {
            break Err(format!("{name} reader: received more than {bytes} bytes"));
        }
    };
    let recv_secs = start.elapsed().as_secs_f64();
    let wres = join(writer, &format!("{name} writer"));
    let (sent, send_secs) = match (read_result, wres) {
        (Ok(()), Ok(w)) => w,
        (r, w) => return Err(format!("{:?} / {:?}", r.err(), w.err())),
    };
    let mb = |b: u64, s: f64| b as f64 / 1e6 / s.max(1e-9);
    println!(
        "{name}: sent {} MiB in {send_secs:.2} s ({:.0} MB/s), received {} MiB in {recv_secs:.2} s ({:.0} MB/s), all bytes checked",
        sent >> 20,
        mb(sent, send_secs),
        got >> 20,
        mb(got, recv_secs)
    );
    Ok(SideStats {
        sent,
        received: got,
        send_secs,
        recv_secs,
    })
}
