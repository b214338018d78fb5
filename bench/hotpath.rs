//! The small-message path, one call at a time, for counting the instructions it
//! executes (`bench/instructions.sh` runs this under valgrind's callgrind): a
//! ping-pong of SIZE-byte messages between a pair of streams in one thread (the
//! default fabric, emulated, unless `RCH_FABRIC` says otherwise), where each end
//! puts, polls its empty ring once, and the other end gets; the put, the get and
//! the empty poll each go through a never-inlined function of their own.
//!
//! Timings on this shared two-CPU host swing by tens of percent; an instruction
//! count does not, and it is what a slow CPU multiplies: in a TCG guest with
//! Soft-RoCE an instruction of ours costs ~0.35 ns and a call with its return ~12 ns
//! (bench/notebook/2026-11.md, Soft-RoCE, "Where the rest of the latency goes").
//!
//! ```text
//! cargo bench --bench hotpath -- 100000 2     # iterations, payload bytes
//! bench/instructions.sh                       # instructions per call
//! ```

use std::hint::black_box;
use std::io::{self, IoSlice, IoSliceMut};

use rdma_channel::fabric::AnyFabric;
use rdma_channel::{RdmaStream, Receiver, Sender};

/// One put of `buf`, which the ring takes whole (it is drained after every put).
#[inline(never)]
fn hotpath_put(tx: &mut Sender<AnyFabric>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is borrowed for the call, and a ring put of a small message has
    // copied it before returning (zero-copy starts far above these sizes).
    unsafe { tx.put_nocopy(&[IoSlice::new(black_box(buf))]) }
}

/// One get of exactly `buf.len()` bytes that have landed.
#[inline(never)]
fn hotpath_get(rx: &mut Receiver<AnyFabric>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: no zero-copy transfer is in flight (small puts only), so nothing is
    // left to land in `buf` after the call.
    unsafe { rx.get_nowait(&mut [IoSliceMut::new(black_box(buf))]) }
}

/// One poll of an empty ring; true when it found nothing, as it should. (A result
/// of its own keeps the compiler from folding it into `hotpath_get`.)
#[inline(never)]
fn hotpath_empty(rx: &mut Receiver<AnyFabric>, buf: &mut [u8]) -> io::Result<bool> {
    // SAFETY: as in hotpath_get.
    Ok(unsafe { rx.get_nowait(&mut [IoSliceMut::new(black_box(buf))]) }? == 0)
}

/// `from` puts `out`, polls its own empty ring, and `to` gets the message.
fn one_way(
    from: &mut RdmaStream,
    to: &mut RdmaStream,
    out: &[u8],
    back: &mut [u8],
) -> io::Result<()> {
    let size = out.len();
    if hotpath_put(from.channel().sender(), out)? != size {
        return Err(io::Error::other(
            "hotpath: the ring did not take the message whole",
        ));
    }
    if !hotpath_empty(from.channel().receiver(), back)? {
        return Err(io::Error::other("hotpath: an empty ring returned data"));
    }
    if hotpath_get(to.channel().receiver(), back)? != size {
        return Err(io::Error::other("hotpath: the message did not land whole"));
    }
    Ok(())
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let parse = |i: usize, default: usize| -> io::Result<usize> {
        args.get(i).map_or(Ok(default), |v| {
            v.parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("hotpath: {v:?} is not a count"),
                )
            })
        })
    };
    let (iters, size) = (parse(0, 100_000)?, parse(1, 2)?);
    if size == 0 || size > 4096 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "hotpath: the payload is 1 to 4096 bytes (a small message)",
        ));
    }
    let (mut a, mut b) = RdmaStream::pair()?;
    let out = vec![0x5au8; size];
    let mut back = vec![0u8; size];
    // A ping-pong, as a latency test runs it: each end puts, then polls (empty) until
    // the reply lands, then gets it. Per iteration every function runs twice.
    for _ in 0..iters {
        one_way(&mut a, &mut b, &out, &mut back)?;
        one_way(&mut b, &mut a, &out, &mut back)?;
    }
    if back != out {
        return Err(io::Error::other("hotpath: the bytes arrived changed"));
    }
    println!("hotpath: {iters} round trips of {size} B (each end: put, empty poll, get)");
    Ok(())
}
