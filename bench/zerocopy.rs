//! The pipelined-copy path (the ring) against the zero-copy path (RDMA READ
//! rendezvous), two processes on CPUs 0 and 1, on the emulated fabric:
//!
//! * `ring`: `put` always copies through the ring (private buffers);
//! * `zc-private`: `put_nocopy` from private (heap) buffers: the peer reads them with
//!   `process_vm_readv`; warm registration cache;
//! * `zc-private-cold`: the same, with the registration invalidated before every
//!   message, so each one pays for registering (the cache's worth);
//! * `zc-alloc`: `put_nocopy` from `alloc_mem` buffers (shared segments): the peer
//!   reads them with a plain copy.
//!
//! Each row measures one-way latency (ping-pong) and bandwidth (16 messages back to
//! back, then a 4-byte acknowledgement), all modes side by side in one run. As in
//! osu_latency / osu_bw, each side sends from one buffer and receives into another
//! (in `zc-alloc` both come from `alloc_mem`, as with OSU's `MPI_Alloc_mem` option). The last
//! lines give the cache counters and the crossover sizes where zero-copy starts to win.
//!
//! ```text
//! cargo bench --bench zerocopy
//! cargo bench --bench zerocopy -- --sizes 65536,1048576
//! ```

#[path = "peer.rs"]
#[allow(dead_code)] // shared helpers this program does not all use
mod peer;

use std::io::{self, IoSlice};

use peer::{bandwidth_with, connect_pair, finish, latency_with, recv_all, Side};
use rdma_channel::RdmaStream;

const WINDOW: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Ring,
    ZcPrivate,
    ZcPrivateCold,
    ZcAlloc,
}

const MODES: [Mode; 4] = [
    Mode::Ring,
    Mode::ZcPrivate,
    Mode::ZcPrivateCold,
    Mode::ZcAlloc,
];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Ring => "ring",
            Mode::ZcPrivate => "zc-private",
            Mode::ZcPrivateCold => "zc-private-cold",
            Mode::ZcAlloc => "zc-alloc",
        }
    }
}

/// Sends all of `buf` in `mode`.
fn send(s: &mut RdmaStream, mode: Mode, buf: &[u8]) -> io::Result<()> {
    if mode == Mode::Ring {
        // `put` always copies through the ring.
        let mut at = 0;
        while at < buf.len() {
            at += s.put(&[IoSlice::new(&buf[at..])])?;
        }
        return Ok(());
    }
    if mode == Mode::ZcPrivateCold {
        s.registration_cache().invalidate(buf.as_ptr(), buf.len());
    }
    let mut at = 0;
    while at < buf.len() {
        // SAFETY: `buf` is borrowed (so unchanged and alive) until this loop has seen
        // every byte counted, which includes the end of any zero-copy transfer.
        at += unsafe { s.channel().sender().put_nocopy(&[IoSlice::new(&buf[at..])]) }?;
    }
    Ok(())
}

fn main() -> io::Result<()> {
    // Make every buffer eligible: the modes choose the path explicitly.
    std::env::set_var("RCH_ZCOPY_THRESHOLD", "1");
    std::env::set_var("RCH_ZCOPY_PRIVATE_THRESHOLD", "1");
    let sizes = peer::sizes_from_args(&[4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]);
    let (mut s, side) = connect_pair("zerocopy")?;
    let parent = matches!(side, Side::Parent(_));
    let max = sizes.iter().copied().max().unwrap_or(1);
    // Separate send and receive buffers, as osu_latency / osu_bw use.
    let private = vec![0x11u8; max];
    let mut shared = s.alloc_mem(max)?;
    shared.fill(0x22);
    let mut recv_private = vec![0u8; max];
    let mut recv_shared = s.alloc_mem(max)?;
    if parent {
        println!("# zero-copy vs ring, emulated fabric, two processes on CPUs 0 and 1");
        println!("# latency: one-way (half the ping-pong round trip); bandwidth: {WINDOW} messages then an ack");
        println!(
            "{:>9} {:>16} {:>11} {:>9}",
            "size", "mode", "latency_us", "GB/s"
        );
    }
    let mut crossover: Vec<(Mode, Option<usize>)> = MODES[1..].iter().map(|&m| (m, None)).collect();
    for &size in &sizes {
        let lat_iters = (40_000_000 / (size + 4000)).clamp(20, 5000);
        let bw_iters = (400_000_000 / (size * WINDOW + 10_000)).clamp(4, 500);
        let mut ring_lat = f64::MAX;
        for mode in MODES {
            let (sbuf, rbuf): (&[u8], &mut [u8]) = if mode == Mode::ZcAlloc {
                (&shared[..size], &mut recv_shared[..size])
            } else {
                (&private[..size], &mut recv_private[..size])
            };
            let mut by_mode = move |s: &mut RdmaStream, b: &[u8]| send(s, mode, b);
            let lat = latency_with(&mut s, &side, sbuf, rbuf, lat_iters, &mut by_mode)?;
            let lat = lat.as_secs_f64() * 1e6;
            let bw = bandwidth_with(
                &mut s,
                &side,
                (sbuf, rbuf),
                WINDOW,
                bw_iters,
                (&mut by_mode, &mut recv_all),
            )? / 1e9;
            if parent {
                println!("{size:>9} {:>16} {lat:>11.2} {bw:>9.2}", mode.name());
            }
            if mode == Mode::Ring {
                ring_lat = lat;
            } else if lat < ring_lat {
                for c in crossover.iter_mut() {
                    if c.0 == mode && c.1.is_none() {
                        c.1 = Some(size);
                    }
                }
            }
        }
    }
    if parent {
        let st = s.cache_stats();
        let lookups = (st.hits + st.misses).max(1);
        println!(
            "# registration cache (sender side of the parent): {} hits, {} misses, {} evictions, {} invalidations, hit rate {:.1}%",
            st.hits,
            st.misses,
            st.evictions,
            st.invalidations,
            100.0 * st.hits as f64 / lookups as f64
        );
        for (mode, size) in crossover {
            match size {
                Some(b) => println!("# {} beats the ring from {b} B", mode.name()),
                None => println!("# {} never beats the ring at these sizes", mode.name()),
            }
        }
    }
    drop(s);
    finish(side)
}
