//! Tests of the channel through its public API, on the fabric `RCH_FABRIC` selects
//! (the in-process emulated fabric by default; `verbs` in the Soft-RoCE VM, see
//! `scripts/softroce-test --fabric verbs`):
//!
//! * model-based property tests (proptest): random put/get sequences, single-threaded
//!   (deterministic interleaving) and multi-threaded, one or both directions, against a
//!   `VecDeque<u8>` model per direction, with payloads that are sometimes full of words
//!   equal to ring header/trailer values for current and future laps;
//! * edge cases: empty puts/gets, tiny iovec pieces, boundary sizes, EOF and peer loss;
//! * "both rings full" deadlock tests, non-blocking and blocking.
//!
//! Every test is bounded in time: polling loops carry generous deadlines and blocking
//! calls run under a watchdog, so a hang fails instead of blocking CI. No assertion is
//! about speed.
//!
//! On the emulated fabric a write is in the peer's ring when `put` returns, and the
//! single-threaded checks rely on that (a `get` right after a `put` must deliver it
//! all). On verbs the NIC places the bytes later, so there those checks poll for at
//! most `common::SETTLE` for what is still in flight (see `common::lands_later`);
//! the properties checked are the same. `RCH_TEST_CASE_SCALE` scales every proptest
//! case count (for slow fabrics).

mod common;

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use common::Rng;
use common::*;
use rdma_channel::ring::wire::{header_match, trailer_word, CELL, ONE_CELL_PAYLOAD};
use rdma_channel::{Config, RdmaStream};

// =====================================================================================
// Configurations
// =====================================================================================

/// The tunables a case runs with (kept apart from `Config` for readable failure output).
#[derive(Clone, Debug)]
struct Tun {
    ring: usize,
    chunk: usize,
    threshold: usize,
    max_inline: Option<usize>,
}

impl Tun {
    fn new(ring: usize, chunk: usize) -> Tun {
        Tun {
            ring,
            chunk,
            threshold: ring / 4,
            max_inline: None,
        }
    }

    fn threshold(mut self, t: usize) -> Tun {
        self.threshold = t;
        self
    }

    fn inline(mut self, i: usize) -> Tun {
        self.max_inline = Some(i);
        self
    }

    fn config(&self) -> Config {
        let c = Config::default()
            .with_ring_size(self.ring)
            .with_chunk_size(self.chunk)
            .with_tail_threshold(self.threshold)
            // Blocking waits (only the blocking tests use them) poll briefly, then sleep.
            .with_wait_policy(rdma_channel::config::WaitPolicy {
                spin: 200,
                yields: 20,
                sleep_max: Duration::from_micros(200),
            });
        match self.max_inline {
            Some(i) => c.with_max_inline(i),
            None => c,
        }
    }

    fn pair(&self) -> (RdmaStream, RdmaStream) {
        RdmaStream::pair_with(self.config())
            .unwrap_or_else(|e| panic!("pair_with({self:?}): {}", ioe(&e)))
    }
}

fn tun_strategy() -> impl Strategy<Value = Tun> {
    (12u32..=16)
        .prop_flat_map(|log| {
            let ring = 1usize << log;
            let max_units = ring / 2 / 64;
            let chunk = prop_oneof![
                2 => Just(128usize),
                2 => Just(ring / 2),
                1 => Just(1024usize.min(ring / 2)),
                4 => (2..=max_units).prop_map(|u| u * 64),
            ];
            let threshold = prop_oneof![
                1 => Just(1usize),
                2 => Just(ring - 64),
                1 => Just(ring / 4),
                3 => 1..=ring - 64,
            ];
            let max_inline = prop_oneof![
                3 => Just(None),
                1 => Just(Some(64usize)),
                2 => (64usize..=1024).prop_map(Some),
                1 => (1025usize..=70_000).prop_map(Some),
            ];
            (Just(ring), chunk, threshold, max_inline)
        })
        .prop_map(|(ring, chunk, threshold, max_inline)| Tun {
            ring,
            chunk,
            threshold,
            max_inline,
        })
}

// =====================================================================================
// Operations and data
// =====================================================================================

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    /// A writes, B reads.
    AB,
    /// B writes, A reads.
    BA,
}

impl Dir {
    fn idx(self) -> usize {
        match self {
            Dir::AB => 0,
            Dir::BA => 1,
        }
    }
    /// (writer, reader) stream indices.
    fn ends(self) -> (usize, usize) {
        match self {
            Dir::AB => (0, 1),
            Dir::BA => (1, 0),
        }
    }
}

/// How a put's payload is made.
#[derive(Clone, Copy, Debug)]
enum Data {
    Random,
    Zeros,
    /// Flag words placed so that a correct sender must cut every packet (see
    /// `common::cut_chain`); positions taken from the sender's real head when known.
    Chain {
        lap: u64,
        flags: Flags,
    },
    /// Flag words placed for a sender that would not cut (`common::aligned_flags`).
    Aligned {
        lap: u64,
        flags: Flags,
    },
    /// Random flag words near the estimated positions (`common::flag_soup`).
    Soup {
        density: u64,
    },
}

fn data_strategy() -> impl Strategy<Value = Data> {
    let flags = prop_oneof![Just(Flags::Trailer), Just(Flags::Header), Just(Flags::Both)];
    let lap = prop_oneof![4 => Just(1u64), 1 => 0u64..=3];
    prop_oneof![
        3 => Just(Data::Random),
        1 => Just(Data::Zeros),
        2 => (lap.clone(), flags.clone()).prop_map(|(lap, flags)| Data::Chain { lap, flags }),
        2 => (lap, flags).prop_map(|(lap, flags)| Data::Aligned { lap, flags }),
        2 => (1u64..=16).prop_map(|density| Data::Soup { density }),
    ]
}

/// Payload of `len` bytes for a put at (real or estimated) sender position `head`.
/// Only the first `gen_limit` bytes are generated with the chosen pattern (a single put
/// can never take more than a ring's worth); the rest is zero.
fn gen_data(
    data: Data,
    seed: u64,
    head: u64,
    ring: usize,
    len: usize,
    gen_limit: usize,
) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let g = len.min(gen_limit);
    let ring = ring as u64;
    let mut v = match data {
        Data::Random => rng.bytes(g),
        Data::Zeros => vec![0u8; g],
        Data::Chain { lap, flags } => cut_chain(&mut rng, head, ring, lap, flags, g),
        Data::Aligned { lap, flags } => aligned_flags(&mut rng, head, ring, lap, flags, g),
        Data::Soup { density } => flag_soup(&mut rng, head, ring, density, g),
    };
    v.resize(len, 0);
    v
}

/// Interesting lengths for a configuration.
fn special_lengths(t: &Tun) -> Vec<usize> {
    let (r, c) = (t.ring, t.chunk);
    let o = ONE_CELL_PAYLOAD;
    let mut v = vec![
        0,
        1,
        7,
        8,
        9,
        o - 1,
        o,
        o + 1,
        63,
        64,
        65,
        2 * CELL - 24,
        2 * CELL - 23,
        c - 25,
        c - 24,
        c - 23,
        c,
        c + 1,
        2 * c - 48,
        2 * c - 47,
        r - 65,
        r - 64,
        r - 63,
        r - 24,
        r,
        r + 1,
        r + 64,
        2 * r,
    ];
    v.sort_unstable();
    v.dedup();
    v
}

fn len_strategy(t: &Tun) -> BoxedStrategy<usize> {
    let specials = special_lengths(t);
    prop_oneof![
        4 => 0usize..=64,
        3 => 0usize..=2048,
        2 => proptest::sample::select(specials),
        1 => 0usize..=3 * t.ring,
    ]
    .boxed()
}

/// An iovec shape: piece lengths. Includes empty lists, empty pieces and many tiny
/// pieces (more than the fabric's gather limit).
fn shape_strategy(t: &Tun) -> BoxedStrategy<Vec<usize>> {
    let len = len_strategy(t);
    prop_oneof![
        12 => vec(len.clone(), 1..=3),
        4 => vec(len, 0..=8),
        1 => vec(0usize..=3, 30..=120),
        1 => vec(Just(1usize), 100..=100),
    ]
    .boxed()
}

#[derive(Clone, Debug)]
enum Op {
    Put {
        dir: Dir,
        shape: Vec<usize>,
        data: Data,
        seed: u64,
    },
    Get {
        dir: Dir,
        shape: Vec<usize>,
    },
}

/// How a single-threaded case ends.
#[derive(Clone, Copy, Debug)]
enum End {
    /// Drain both directions, check nothing more arrives and both can still send.
    Drain,
    /// The writer of `Dir` calls `shutdown_write`.
    Shutdown(Dir),
    /// The writer of `Dir` drops its whole stream.
    Drop(Dir),
}

fn dir_strategy(bidir: bool) -> BoxedStrategy<Dir> {
    if bidir {
        prop_oneof![Just(Dir::AB), Just(Dir::BA)].boxed()
    } else {
        Just(Dir::AB).boxed()
    }
}

fn op_strategy(t: &Tun, bidir: bool) -> BoxedStrategy<Op> {
    let put = (
        dir_strategy(bidir),
        shape_strategy(t),
        data_strategy(),
        any::<u64>(),
    )
        .prop_map(|(dir, shape, data, seed)| Op::Put {
            dir,
            shape,
            data,
            seed,
        });
    let get =
        (dir_strategy(bidir), shape_strategy(t)).prop_map(|(dir, shape)| Op::Get { dir, shape });
    prop_oneof![put, get].boxed()
}

fn end_strategy(bidir: bool) -> BoxedStrategy<End> {
    let d = dir_strategy(bidir);
    prop_oneof![
        2 => Just(End::Drain),
        1 => d.clone().prop_map(End::Shutdown),
        1 => d.prop_map(End::Drop),
    ]
    .boxed()
}

fn single_case(bidir: bool, max_ops: usize) -> impl Strategy<Value = (Tun, Vec<Op>, End)> {
    tun_strategy().prop_flat_map(move |t| {
        let ops = vec(op_strategy(&t, bidir), 1..=max_ops);
        (Just(t), ops, end_strategy(bidir))
    })
}

// =====================================================================================
// Single-threaded model execution
// =====================================================================================

fn sum(shape: &[usize]) -> usize {
    shape.iter().sum()
}

/// Pops `m` bytes from the model and compares them with `got`.
fn check_against_model(model: &mut VecDeque<u8>, got: &[u8], what: &str) -> Result<(), String> {
    if got.len() > model.len() {
        return Err(format!(
            "{what}: got {} bytes but only {} were put",
            got.len(),
            model.len()
        ));
    }
    let (s1, s2) = model.as_slices();
    let n1 = s1.len().min(got.len());
    let ok = s1[..n1] == got[..n1] && s2[..got.len() - n1] == got[n1..];
    if !ok {
        let exp: Vec<u8> = model.iter().take(got.len()).copied().collect();
        let i = exp.iter().zip(got).position(|(a, b)| a != b).unwrap();
        return Err(format!(
            "{what}: data differs at byte {i} of {}: got {:#04x}, expected {:#04x}; got[{}..] = {:02x?}, expected {:02x?}",
            got.len(),
            got[i],
            exp[i],
            i.saturating_sub(8) / 8 * 8,
            &got[i.saturating_sub(8) / 8 * 8..(i + 16).min(got.len())],
            &exp[i.saturating_sub(8) / 8 * 8..(i + 16).min(got.len())],
        ));
    }
    model.drain(..got.len());
    Ok(())
}

/// Where a direction stands with respect to flow control, for the liveness check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stall {
    /// The last put took everything offered.
    None,
    /// The last put was cut short: the sender found the ring full and asked for credit.
    Short,
    /// ... and the receiver has polled since.
    Polled,
}

struct SingleState {
    s: [Option<RdmaStream>; 2],
    model: [VecDeque<u8>; 2],
    /// Per direction. Liveness rule: once a put was cut short (the sender asked for
    /// credit) and the receiver then polled, a put must make progress as soon as
    /// everything sent has been read. (Before the first stall a put may legitimately
    /// find the ring full because tail updates are delayed; the stall is what asks
    /// for the update.)
    stall: [Stall; 2],
    ring: usize,
    log: Vec<String>,
}

impl SingleState {
    fn stream(&mut self, i: usize) -> &mut RdmaStream {
        self.s[i].as_mut().expect("stream still open")
    }

    fn put(&mut self, dir: Dir, shape: &[usize], data: Data, seed: u64) -> Result<usize, String> {
        let (w, _) = dir.ends();
        let d = dir.idx();
        let total = sum(shape);
        let ring = self.ring;
        let head = self.stream(w).channel().sender().position();
        let bytes = gen_data(data, seed, head, ring, total, ring + 64);
        let iov = iovecs(&bytes, shape, 0);
        let put_err = |e: io::Error| {
            format!(
                "put({dir:?}, {} pieces, {total} B) failed: {}",
                shape.len(),
                ioe(&e)
            )
        };
        let mut n = self.stream(w).put(&iov).map_err(put_err)?;
        let live_now = |st: &SingleState, n: usize| {
            !(total > 0
                && n == 0
                && st.model[d].is_empty()
                && st.stall[d] == Stall::Polled
                && liveness_checked())
        };
        if !live_now(self, n) && lands_later() {
            // The credit request, or the answer to it, may still be in flight: the
            // rule then is that the put goes through while the receiver keeps polling.
            let start = Instant::now();
            let mut polls = 0;
            while n == 0 && start.elapsed() < SETTLE {
                self.get(dir, &[1])?;
                polls += 1;
                n = self.stream(w).put(&iov).map_err(put_err)?;
            }
            self.log.push(format!(
                "  (put retried while the receiver polled {polls} times)"
            ));
        }
        self.log.push(format!(
            "put {dir:?} {total} B ({} pieces, {data:?}) at head {head} -> {n}",
            shape.len()
        ));
        if n > total {
            return Err(format!("put took {n} bytes but only {total} were offered"));
        }
        if !live_now(self, n) {
            return Err(format!(
                "liveness: put({dir:?}) of {total} B took nothing although the receiver has read \
                 everything and polled since the sender's last stall (sender position {head})"
            ));
        }
        if total > 0 {
            self.stall[d] = if n < total { Stall::Short } else { Stall::None };
        }
        self.model[d].extend(&bytes[..n]);
        Ok(n)
    }

    fn get(&mut self, dir: Dir, shape: &[usize]) -> Result<usize, String> {
        let (_, r) = dir.ends();
        let d = dir.idx();
        let cap = sum(shape);
        let mut buf = vec![0u8; cap];
        let want = cap.min(self.model[d].len());
        let get_err = |e: io::Error| {
            format!(
                "get({dir:?}, {} pieces, {cap} B) failed: {}",
                shape.len(),
                ioe(&e)
            )
        };
        let mut m = {
            let mut iov = iovecs_mut(&mut buf, shape);
            self.stream(r).get(&mut iov)
        }
        .map_err(get_err)?;
        let mut polls = 1;
        if m < want && lands_later() {
            // Bytes still in flight: keep polling into the rest of the buffers.
            let start = Instant::now();
            while m < want && m <= cap && start.elapsed() < SETTLE {
                let mut iov = iovecs_mut_from(&mut buf, shape, m);
                m += self.stream(r).get(&mut iov).map_err(get_err)?;
                polls += 1;
            }
        }
        self.log.push(format!(
            "get {dir:?} cap {cap} ({} pieces) -> {m}{}",
            shape.len(),
            if polls > 1 {
                format!(" ({polls} polls)")
            } else {
                String::new()
            }
        ));
        if m > cap {
            return Err(format!("get returned {m} bytes into buffers of {cap}"));
        }
        // Single-threaded, every put has placed its bytes in the peer's ring when it
        // returns on the emulated fabric (it writes synchronously), so a get must
        // deliver everything that fits; where writes land later, the polls above must
        // have delivered it within SETTLE.
        if m != want {
            return Err(format!(
                "get({dir:?}) returned {m} bytes; {} were put and not yet read, buffers hold {cap}",
                self.model[d].len()
            ));
        }
        check_against_model(&mut self.model[d], &buf[..m], &format!("get {dir:?}"))?;
        if self.stall[d] == Stall::Short {
            self.stall[d] = Stall::Polled;
        }
        Ok(m)
    }

    /// Reads until the model of `dir` is empty.
    fn drain(&mut self, dir: Dir, rng: &mut Rng) -> Result<(), String> {
        let mut iters = 0;
        while !self.model[dir.idx()].is_empty() {
            iters += 1;
            if iters > 100_000 {
                return Err(format!(
                    "drain {dir:?}: {} bytes never arrived",
                    self.model[dir.idx()].len()
                ));
            }
            let cap = rng.range(1, 3 * self.ring);
            let shape = random_shape(rng, cap, 4);
            self.get(dir, &shape)?;
        }
        Ok(())
    }

    /// After a shutdown or drop of `dir`'s writer: the reader gets the rest, then end of
    /// stream, repeatedly; `read` says 0.
    fn drain_to_eof(&mut self, dir: Dir, rng: &mut Rng) -> Result<(), String> {
        let (_, r) = dir.ends();
        let d = dir.idx();
        let mut iters = 0;
        let waiting = Instant::now();
        loop {
            iters += 1;
            if iters > 100_000 {
                return Err(format!(
                    "{dir:?}: no end of stream after close ({} bytes left)",
                    self.model[d].len()
                ));
            }
            let cap = rng.range(1, 2 * self.ring);
            let mut buf = vec![0u8; cap];
            match self.stream(r).get(&mut [IoSliceMut::new(&mut buf)]) {
                // The rest of the data or the end-of-stream notice is still in flight.
                Ok(0) if lands_later() && waiting.elapsed() < SETTLE => {
                    iters -= 1;
                    std::thread::yield_now();
                }
                Ok(0) => {
                    if self.model[d].is_empty() {
                        // Allowed only transiently; the close notice is written before
                        // shutdown_write returns, so it should not happen at all here.
                        return Err(format!(
                            "{dir:?}: get returned Ok(0) after close instead of UnexpectedEof"
                        ));
                    }
                    return Err(format!(
                        "{dir:?}: get returned 0 with {} bytes outstanding",
                        self.model[d].len()
                    ));
                }
                Ok(m) => check_against_model(
                    &mut self.model[d],
                    &buf[..m],
                    &format!("drain {dir:?} after close"),
                )?,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    if !self.model[d].is_empty() {
                        return Err(format!(
                            "{dir:?}: end of stream with {} bytes unread",
                            self.model[d].len()
                        ));
                    }
                    break;
                }
                Err(e) => return Err(format!("{dir:?}: get after close: {}", ioe(&e))),
            }
        }
        for _ in 0..3 {
            match self.stream(r).get(&mut [IoSliceMut::new(&mut [0u8; 16])]) {
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
                other => return Err(format!("{dir:?}: get after end of stream: {other:?}")),
            }
        }
        match self.stream(r).read(&mut [0u8; 16]) {
            Ok(0) => {}
            other => {
                return Err(format!(
                    "{dir:?}: read after end of stream: {other:?} (expected Ok(0))"
                ))
            }
        }
        Ok(())
    }

    /// A put/get round trip in `dir` must still work.
    fn round_trip(&mut self, dir: Dir, rng: &mut Rng, what: &str) -> Result<(), String> {
        // The receiver polls (serving any credit request); a small put may still find
        // the ring full once (delayed tail updates: the stall asks for credit), but
        // after one more poll it must go through, and come back intact. (Where writes
        // land later, the request and its answer may be in flight: poll until SETTLE.)
        let start = Instant::now();
        let mut attempt = 0;
        loop {
            self.get(dir, &[64])?;
            let n = self.put(dir, &[100], Data::Random, rng.next_u64())?;
            if n > 0 {
                return self.drain(dir, rng);
            }
            if lands_later() && start.elapsed() < SETTLE {
                continue;
            }
            if attempt >= 1 {
                if !liveness_checked() {
                    // Exploration mode: let the sender read its own incoming ring (it
                    // may learn piggybacked tails there) and try once more.
                    let (w, _) = dir.ends();
                    let _ = self.stream(w).get(&mut [IoSliceMut::new(&mut [])]);
                    let back = if dir == Dir::AB { Dir::BA } else { Dir::AB };
                    self.drain(back, rng)?;
                    let n = self.put(dir, &[100], Data::Random, rng.next_u64())?;
                    if n > 0 {
                        return self.drain(dir, rng);
                    }
                }
                return Err(format!(
                    "{what}: {dir:?} accepts nothing after the receiver drained and polled twice"
                ));
            }
            attempt += 1;
        }
    }
}

/// The liveness checks of the single-threaded model are on unless
/// `RCH_TEST_NO_LIVENESS=1` (for exploring other properties while a liveness bug is
/// open; never set it in CI).
fn liveness_checked() -> bool {
    std::env::var("RCH_TEST_NO_LIVENESS").map_or(true, |v| v.is_empty() || v == "0")
}

/// Runs a single-threaded case under a watchdog (the case only makes non-blocking
/// calls and bounded loops, apart from one `read` at end of stream; this bounds it all).
fn run_single(t: &Tun, ops: &[Op], end: End) -> Result<(), String> {
    let (t, ops) = (t.clone(), ops.to_vec());
    watched("single-threaded case", case_limit(), move || {
        run_single_unwatched(&t, &ops, end)
    })
}

fn run_single_unwatched(t: &Tun, ops: &[Op], end: End) -> Result<(), String> {
    let (a, b) =
        RdmaStream::pair_with(t.config()).map_err(|e| format!("pair_with: {}", ioe(&e)))?;
    let mut st = SingleState {
        s: [Some(a), Some(b)],
        model: [VecDeque::new(), VecDeque::new()],
        stall: [Stall::None, Stall::None],
        ring: t.ring,
        log: Vec::new(),
    };
    let r = run_single_inner(&mut st, ops, end);
    r.map_err(|e| {
        let tail: Vec<&String> = st
            .log
            .iter()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!(
            "{e}\n  last operations:\n    {}",
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n    ")
        )
    })
}

fn run_single_inner(st: &mut SingleState, ops: &[Op], end: End) -> Result<(), String> {
    for op in ops {
        match op {
            Op::Put {
                dir,
                shape,
                data,
                seed,
            } => {
                st.put(*dir, shape, *data, *seed)?;
            }
            Op::Get { dir, shape } => {
                st.get(*dir, shape)?;
            }
        }
    }
    let mut rng = Rng::new(ops.len() as u64 * 7919 + st.ring as u64);
    match end {
        End::Drain => {
            st.drain(Dir::AB, &mut rng)?;
            st.drain(Dir::BA, &mut rng)?;
            // Nothing stale may be taken for a packet now that the rings are empty.
            st.get(Dir::AB, &[3 * st.ring])?;
            st.get(Dir::BA, &[3 * st.ring])?;
            st.round_trip(Dir::AB, &mut rng, "after drain")?;
            st.round_trip(Dir::BA, &mut rng, "after drain")?;
        }
        End::Shutdown(dir) => {
            let (w, _) = dir.ends();
            st.stream(w)
                .shutdown_write()
                .map_err(|e| format!("shutdown_write: {}", ioe(&e)))?;
            st.drain_to_eof(dir, &mut rng)?;
            match st.stream(w).put(&[IoSlice::new(b"late")]) {
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
                other => {
                    return Err(format!(
                        "put after shutdown_write: {other:?} (expected BrokenPipe)"
                    ))
                }
            }
            // The other direction is unaffected (half close).
            let other = if dir == Dir::AB { Dir::BA } else { Dir::AB };
            st.drain(other, &mut rng)?;
            st.round_trip(other, &mut rng, "after the other direction was shut down")?;
        }
        End::Drop(dir) => {
            let (w, r) = dir.ends();
            drop(st.s[w].take());
            st.drain_to_eof(dir, &mut rng)?;
            match st.stream(r).put(&[IoSlice::new(b"to nobody")]) {
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
                other => {
                    return Err(format!(
                        "put to a dropped peer: {other:?} (expected BrokenPipe)"
                    ))
                }
            }
        }
    }
    Ok(())
}

// =====================================================================================
// Multi-threaded model execution
// =====================================================================================

#[derive(Clone, Debug)]
struct PutSpec {
    shape: Vec<usize>,
    data: Data,
    seed: u64,
}

fn put_spec_strategy(t: &Tun) -> BoxedStrategy<PutSpec> {
    (shape_strategy(t), data_strategy(), any::<u64>())
        .prop_map(|(shape, data, seed)| PutSpec { shape, data, seed })
        .boxed()
}

/// How the writer thread ends its stream.
#[derive(Clone, Copy, Debug)]
enum WriterEnd {
    Shutdown,
    Drop,
}

#[derive(Clone, Debug)]
struct Flow {
    puts: Vec<PutSpec>,
    gets: Vec<Vec<usize>>,
    end: WriterEnd,
}

fn flow_strategy(t: &Tun, max_puts: usize) -> BoxedStrategy<Flow> {
    (
        vec(put_spec_strategy(t), 0..=max_puts),
        vec(shape_strategy(t), 1..=8),
        prop_oneof![Just(WriterEnd::Shutdown), Just(WriterEnd::Drop)],
    )
        .prop_map(|(puts, mut gets, end)| {
            // At least one shape with room, so the reader always makes progress.
            gets.push(vec![1000]);
            Flow { puts, gets, end }
        })
        .boxed()
}

/// Time bound of one property case (a hang fails the case).
fn case_limit() -> Duration {
    limit(30)
}

/// Does every put of `flow`, retrying the rest until all was taken; returns the bytes
/// sent. `put` is the non-blocking put, `position` the sender's head (real, or an
/// estimate when the half does not expose it).
fn writer_loop(
    flow: &Flow,
    ring: usize,
    mut put: impl FnMut(&[IoSlice<'_>]) -> io::Result<usize>,
    mut position: impl FnMut(u64) -> u64,
    abort: &AtomicBool,
    deadline: Deadline,
) -> Result<Vec<u8>, String> {
    let mut sent = Vec::new();
    for (i, p) in flow.puts.iter().enumerate() {
        let total = sum(&p.shape);
        let head = position(sent.len() as u64);
        let bytes = gen_data(p.data, p.seed, head, ring, total, usize::MAX);
        let mut off = 0;
        let mut spins = 0u64;
        loop {
            let iov = iovecs(&bytes, &p.shape, off);
            let n =
                put(&iov).map_err(|e| format!("put #{i} ({total} B, {off} done): {}", ioe(&e)))?;
            if n > total - off {
                return Err(format!(
                    "put #{i} took {n} bytes, only {} offered",
                    total - off
                ));
            }
            off += n;
            if off == total {
                break;
            }
            if n == 0 {
                spins += 1;
                if spins % 64 == 0 {
                    if abort.load(Ordering::Relaxed) {
                        return Err("aborted (other thread failed)".into());
                    }
                    deadline.check(|| {
                        format!(
                            "writer stuck in put #{i}: {off} of {total} B, {} B sent before",
                            sent.len()
                        )
                    })?;
                }
                std::thread::yield_now();
            }
        }
        sent.extend_from_slice(&bytes);
    }
    Ok(sent)
}

/// Gets with the shapes of `flow` in turn until end of stream; returns what arrived.
fn reader_loop(
    gets: &[Vec<usize>],
    expected_len: usize,
    mut get: impl FnMut(&mut [IoSliceMut<'_>]) -> io::Result<usize>,
    abort: &AtomicBool,
    deadline: Deadline,
) -> Result<Vec<u8>, String> {
    let mut got = Vec::with_capacity(expected_len);
    let mut buf = Vec::new();
    let mut spins = 0u64;
    let mut k = 0usize;
    loop {
        let shape = &gets[k % gets.len()];
        k += 1;
        let cap = sum(shape);
        buf.resize(cap, 0);
        let r = {
            let mut iov = iovecs_mut(&mut buf, shape);
            get(&mut iov)
        };
        match r {
            Ok(m) => {
                if m > cap {
                    return Err(format!("get returned {m} bytes into {cap}"));
                }
                got.extend_from_slice(&buf[..m]);
                if got.len() > expected_len {
                    return Err(format!(
                        "received {} bytes, more than the {expected_len} sent",
                        got.len()
                    ));
                }
                if m == 0 {
                    spins += 1;
                    if spins % 64 == 0 {
                        if abort.load(Ordering::Relaxed) {
                            return Err("aborted (other thread failed)".into());
                        }
                        deadline.check(|| {
                            format!(
                                "reader: {} of {expected_len} B received, no end of stream",
                                got.len()
                            )
                        })?;
                    }
                    std::thread::yield_now();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                if got.len() != expected_len {
                    return Err(format!(
                        "end of stream after {} of {expected_len} bytes",
                        got.len()
                    ));
                }
                return Ok(got);
            }
            Err(e) => return Err(format!("get after {} B: {}", got.len(), ioe(&e))),
        }
    }
}

fn compare_streams(sent: &[u8], got: &[u8], what: &str) -> Result<(), String> {
    if sent == got {
        return Ok(());
    }
    if sent.len() != got.len() {
        return Err(format!(
            "{what}: sent {} bytes, received {}",
            sent.len(),
            got.len()
        ));
    }
    let i = sent.iter().zip(got).position(|(a, b)| a != b).unwrap();
    Err(format!(
        "{what}: byte {i} of {} differs: sent {:#04x}, received {:#04x}; around: sent {:02x?} received {:02x?}",
        sent.len(),
        sent[i],
        got[i],
        &sent[i.saturating_sub(8)..(i + 8).min(sent.len())],
        &got[i.saturating_sub(8)..(i + 8).min(got.len())]
    ))
}

fn flow_total(f: &Flow) -> usize {
    f.puts.iter().map(|p| sum(&p.shape)).sum()
}

/// Collects the results of several threads; reports every real failure (threads that
/// only stopped because another one failed are left out unless nothing else failed).
fn all_ok(results: Vec<(&str, Result<(), String>)>) -> Result<(), String> {
    let errs: Vec<String> = results
        .iter()
        .filter_map(|(who, r)| r.as_ref().err().map(|e| format!("{who}: {e}")))
        .collect();
    if errs.is_empty() {
        return Ok(());
    }
    let real: Vec<&String> = errs.iter().filter(|e| !e.contains("aborted (")).collect();
    if real.is_empty() {
        Err(errs.join("\n  "))
    } else {
        Err(real
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  "))
    }
}

/// A rough guess at the sender position after `sent` payload bytes (for halves, which
/// do not expose it): chunk-sized packets plus overhead, rounded to cells.
fn estimate_position(chunk: usize) -> impl FnMut(u64) -> u64 + Send + Copy {
    move |sent: u64| {
        let packets = sent / (chunk as u64 - 24) + 1;
        (sent + packets * 40) / 64 * 64
    }
}

fn spawn_half_writer(
    mut w: rdma_channel::WriteHalf,
    flow: Flow,
    t: &Tun,
    abort: Arc<AtomicBool>,
    deadline: Deadline,
) -> std::thread::JoinHandle<Result<Vec<u8>, String>> {
    let (ring, chunk) = (t.ring, t.chunk);
    std::thread::spawn(move || {
        let r = writer_loop(
            &flow,
            ring,
            |iov| w.put(iov),
            estimate_position(chunk),
            &abort,
            deadline,
        )
        .and_then(|sent| match flow.end {
            WriterEnd::Shutdown => w
                .shutdown()
                .map(|_| sent)
                .map_err(|e| format!("shutdown: {}", ioe(&e))),
            WriterEnd::Drop => {
                drop(w);
                Ok(sent)
            }
        });
        if r.is_err() {
            abort.store(true, Ordering::Relaxed);
        }
        r
    })
}

fn spawn_half_reader(
    mut r: rdma_channel::ReadHalf,
    flow: &Flow,
    abort: Arc<AtomicBool>,
    deadline: Deadline,
) -> std::thread::JoinHandle<Result<Vec<u8>, String>> {
    let (gets, expected) = (flow.gets.clone(), flow_total(flow));
    std::thread::spawn(move || {
        let res = reader_loop(&gets, expected, |iov| r.get(iov), &abort, deadline);
        if res.is_err() {
            abort.store(true, Ordering::Relaxed);
        }
        res
    })
}

fn check_flow(
    sent: Result<Vec<u8>, String>,
    got: Result<Vec<u8>, String>,
    what: &str,
) -> Vec<(String, Result<(), String>)> {
    match (sent, got) {
        (Ok(s), Ok(g)) => vec![(what.to_string(), compare_streams(&s, &g, what))],
        (s, g) => vec![
            (format!("{what} writer"), s.map(|_| ())),
            (format!("{what} reader"), g.map(|_| ())),
        ],
    }
}

fn report(results: Vec<(String, Result<(), String>)>) -> Result<(), String> {
    all_ok(
        results
            .iter()
            .map(|(w, r)| (w.as_str(), r.clone()))
            .collect(),
    )
}

/// One direction, split halves: a writer thread with A's write half, a reader thread
/// with B's read half (A's read half and B's write half stay idle in this thread).
fn run_two_threads_one_way(t: &Tun, flow: &Flow) -> Result<(), String> {
    let (a, b) =
        RdmaStream::pair_with(t.config()).map_err(|e| format!("pair_with: {}", ioe(&e)))?;
    let (_ra, wa) = a.split();
    let (rb, _wb) = b.split();
    let abort = Arc::new(AtomicBool::new(false));
    let deadline = Deadline::after(case_limit());
    let w = spawn_half_writer(wa, flow.clone(), t, abort.clone(), deadline);
    let r = spawn_half_reader(rb, flow, abort, deadline);
    let (sent, got) = (join(w, "writer"), join(r, "reader"));
    report(check_flow(sent, got, "A->B"))
}

/// One direction, two threads each owning a whole stream, so the writer knows its real
/// position and the flag-word payloads are exact.
fn run_two_threads_one_way_exact(t: &Tun, flow: &Flow) -> Result<(), String> {
    let (a, mut b) =
        RdmaStream::pair_with(t.config()).map_err(|e| format!("pair_with: {}", ioe(&e)))?;
    let abort = Arc::new(AtomicBool::new(false));
    let deadline = Deadline::after(case_limit());
    let expected = flow_total(flow);
    let ring = t.ring;
    let w = {
        let (flow, abort) = (flow.clone(), abort.clone());
        std::thread::spawn(move || {
            let a = std::cell::RefCell::new(a);
            let r = writer_loop(
                &flow,
                ring,
                |iov| a.borrow_mut().put(iov),
                |_| a.borrow_mut().channel().sender().position(),
                &abort,
                deadline,
            );
            let mut a = a.into_inner();
            let r = r.and_then(|sent| match flow.end {
                WriterEnd::Shutdown => a
                    .shutdown_write()
                    .map(|_| sent)
                    .map_err(|e| format!("shutdown_write: {}", ioe(&e))),
                WriterEnd::Drop => {
                    drop(a);
                    Ok(sent)
                }
            });
            if r.is_err() {
                abort.store(true, Ordering::Relaxed);
            }
            r
        })
    };
    let rd = {
        let (gets, abort) = (flow.gets.clone(), abort.clone());
        std::thread::spawn(move || {
            let r = reader_loop(&gets, expected, |iov| b.get(iov), &abort, deadline);
            if r.is_err() {
                abort.store(true, Ordering::Relaxed);
            }
            r
        })
    };
    let (sent, got) = (join(w, "writer"), join(rd, "reader"));
    report(check_flow(sent, got, "A->B"))
}

/// Both directions at once with split halves: four threads.
fn run_two_threads_both_ways(t: &Tun, ab: &Flow, ba: &Flow) -> Result<(), String> {
    let (a, b) =
        RdmaStream::pair_with(t.config()).map_err(|e| format!("pair_with: {}", ioe(&e)))?;
    let (ra, wa) = a.split();
    let (rb, wb) = b.split();
    let abort = Arc::new(AtomicBool::new(false));
    let deadline = Deadline::after(case_limit());
    let w1 = spawn_half_writer(wa, ab.clone(), t, abort.clone(), deadline);
    let w2 = spawn_half_writer(wb, ba.clone(), t, abort.clone(), deadline);
    let r1 = spawn_half_reader(rb, ab, abort.clone(), deadline);
    let r2 = spawn_half_reader(ra, ba, abort, deadline);
    let (s1, s2, g1, g2) = (
        join(w1, "writer A->B"),
        join(w2, "writer B->A"),
        join(r1, "reader A->B"),
        join(r2, "reader B->A"),
    );
    let mut res = check_flow(s1, g1, "A->B");
    res.extend(check_flow(s2, g2, "B->A"));
    report(res)
}

// =====================================================================================
// Property tests
// =====================================================================================

// Case counts (explicit, independent of PROPTEST_CASES; each multiplied by
// RCH_TEST_CASE_SCALE, default 1):
//   single-threaded one way 3000 + both ways 4000 + two threads one way 1500
//   + one way exact-position 500 + both ways (4 threads) 1200  = 10,200 cases.

proptest! {
    #![proptest_config(ProptestConfig { cases: scaled(3000), max_shrink_iters: 2000, max_shrink_time: 60_000, ..ProptestConfig::default() })]
    #[test]
    fn model_single_thread_one_way((t, ops, end) in single_case(false, 40)) {
        run_single(&t, &ops, end).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: scaled(4000), max_shrink_iters: 2000, max_shrink_time: 60_000, ..ProptestConfig::default() })]
    #[test]
    fn model_single_thread_both_ways((t, ops, end) in single_case(true, 60)) {
        run_single(&t, &ops, end).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: scaled(1500), max_shrink_iters: 500, max_shrink_time: 60_000, ..ProptestConfig::default() })]
    #[test]
    fn model_two_threads_one_way((t, flow) in tun_strategy().prop_flat_map(|t| { let f = flow_strategy(&t, 20); (Just(t), f) })) {
        run_two_threads_one_way(&t, &flow).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: scaled(500), max_shrink_iters: 500, max_shrink_time: 60_000, ..ProptestConfig::default() })]
    #[test]
    fn model_two_threads_one_way_exact_flags((t, flow) in tun_strategy().prop_flat_map(|t| { let f = flow_strategy(&t, 20); (Just(t), f) })) {
        run_two_threads_one_way_exact(&t, &flow).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: scaled(1200), max_shrink_iters: 500, max_shrink_time: 60_000, ..ProptestConfig::default() })]
    #[test]
    fn model_four_threads_both_ways((t, ab, ba) in tun_strategy().prop_flat_map(|t| {
        let (f1, f2) = (flow_strategy(&t, 16), flow_strategy(&t, 16));
        (Just(t), f1, f2)
    })) {
        run_two_threads_both_ways(&t, &ab, &ba).map_err(TestCaseError::fail)?;
    }
}

/// Which fabric this run tests (see `RCH_FABRIC`); shown with `--nocapture`.
#[test]
fn fabric_under_test() {
    report_fabric();
}

// =====================================================================================
// Edge cases
// =====================================================================================

/// Runs a test body under a watchdog (a hang fails the test after two minutes, ten
/// where writes land later).
fn bounded(name: &str, f: impl FnOnce() + Send + 'static) {
    with_watchdog(name, limit(120), f)
}

/// One `get` into `buf`; where writes land later, more into the rest of `buf`
/// until `want` bytes arrived or [`SETTLE`] passed. Returns the bytes received.
fn get_settled(s: &mut RdmaStream, buf: &mut [u8], want: usize) -> io::Result<usize> {
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
fn await_data(s: &mut RdmaStream) {
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
fn put_error(w: &mut RdmaStream, data: &[u8]) -> io::Error {
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
fn put_while_peer_polls(w: &mut RdmaStream, r: &mut RdmaStream, data: &[u8]) -> usize {
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
fn edge_configs() -> Vec<Tun> {
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
fn transfer(
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

#[test]
fn zero_length_puts_and_gets() {
    bounded("zero_length_puts_and_gets", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            // Empty iovec lists and empty pieces take and give nothing.
            assert_eq!(a.put(&[]).unwrap(), 0, "{t:?}");
            assert_eq!(a.put(&[IoSlice::new(&[])]).unwrap(), 0, "{t:?}");
            assert_eq!(a.put(&[IoSlice::new(&[]); 50]).unwrap(), 0, "{t:?}");
            assert_eq!(b.get(&mut []).unwrap(), 0, "{t:?}");
            assert_eq!(b.get(&mut [IoSliceMut::new(&mut [])]).unwrap(), 0, "{t:?}");
            let mut one = [0u8; 1];
            assert_eq!(
                b.get(&mut [IoSliceMut::new(&mut one)]).unwrap(),
                0,
                "nothing was sent: {t:?}"
            );
            // Blocking calls with empty buffers return at once.
            assert_eq!(a.write(&[]).unwrap(), 0);
            assert_eq!(a.write_vectored(&[]).unwrap(), 0);
            assert_eq!(b.read(&mut []).unwrap(), 0);
            assert_eq!(b.read_vectored(&mut []).unwrap(), 0);
            // Data surrounded by empty pieces.
            let e: [u8; 0] = [];
            let n = a
                .put(&[
                    IoSlice::new(&e),
                    IoSlice::new(b"ab"),
                    IoSlice::new(&e),
                    IoSlice::new(&e),
                    IoSlice::new(b"c"),
                    IoSlice::new(&e),
                ])
                .unwrap();
            assert_eq!(n, 3, "{t:?}");
            await_data(&mut b);
            // A get with only empty buffers takes nothing even though data waits.
            assert_eq!(b.get(&mut []).unwrap(), 0);
            assert_eq!(
                b.get(&mut [IoSliceMut::new(&mut []), IoSliceMut::new(&mut [])])
                    .unwrap(),
                0
            );
            let (mut x, mut y) = ([0u8; 0], [0u8; 2]);
            let mut z = [0u8; 5];
            let m = b
                .get(&mut [
                    IoSliceMut::new(&mut x),
                    IoSliceMut::new(&mut y),
                    IoSliceMut::new(&mut []),
                    IoSliceMut::new(&mut z),
                ])
                .unwrap();
            assert_eq!(m, 3, "{t:?}");
            assert_eq!(&y, b"ab");
            assert_eq!(z[0], b'c');
            // Empty calls in between never disturb the stream.
            for i in 0..200u32 {
                let payload = i.to_le_bytes();
                assert_eq!(
                    a.put(&[IoSlice::new(&[]), IoSlice::new(&payload)]).unwrap(),
                    4
                );
                assert_eq!(a.put(&[]).unwrap(), 0);
                assert_eq!(b.get(&mut []).unwrap(), 0);
                let mut g = [0u8; 4];
                assert_eq!(get_settled(&mut b, &mut g, 4).unwrap(), 4);
                assert_eq!(g, payload);
            }
        }
    });
}

#[test]
fn many_tiny_pieces_beyond_the_gather_limit() {
    bounded("many_tiny_pieces_beyond_the_gather_limit", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            let mut rng = Rng::new(t.ring as u64 ^ t.chunk as u64);
            for pieces in [29usize, 30, 31, 100, 1000] {
                let data = rng.bytes(pieces);
                let iov: Vec<IoSlice> = data.chunks(1).map(IoSlice::new).collect();
                let mut off = 0;
                let mut got = Vec::new();
                let mut stall = StallCheck::new(10_000);
                while got.len() < pieces {
                    // Offer the rest, still one byte per piece.
                    let n = a.put(&iov[off..]).unwrap();
                    off += n;
                    // Get with 1-byte pieces too (100 of them).
                    let mut bufs = [[0u8; 1]; 100];
                    let mut sl: Vec<IoSliceMut> =
                        bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
                    let m = b.get(&mut sl).unwrap();
                    drop(sl);
                    got.extend(bufs[..m].iter().map(|b| b[0]));
                    assert!(!stall.stalled(n + m > 0), "stalled {t:?}");
                }
                assert_eq!(got, data, "{t:?} pieces {pieces}");
            }
            // Mixed empty and one-byte pieces.
            let data = rng.bytes(300);
            let mut iov = Vec::new();
            for c in data.chunks(1) {
                iov.push(IoSlice::new(&[]));
                iov.push(IoSlice::new(c));
            }
            let shape: Vec<usize> = iov.iter().map(|s| s.len()).collect();
            transfer(&mut a, &mut b, &data, &shape, 77).unwrap_or_else(|e| panic!("{t:?}: {e}"));
        }
    });
}

#[test]
fn boundary_message_sizes() {
    bounded("boundary_message_sizes", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            let mut rng = Rng::new(99);
            let c = t.chunk;
            let r = t.ring;
            let o = ONE_CELL_PAYLOAD;
            let sizes = [
                1,
                o - 1,
                o,
                o + 1,
                2 * CELL - 24,
                c - 25,
                c - 24,
                c - 23,
                c,
                c + 1,
                r - 65,
                r - 64,
                r - 63,
                r - 24,
                r,
                r + 63,
                r + 64,
                r + 65,
                3 * r + 7,
            ];
            for &n in &sizes {
                // Several times each, so that the sizes meet the ring end at many offsets.
                for rep in 0..5 {
                    let data = rng.bytes(n);
                    let shape = if rep % 2 == 0 {
                        vec![n]
                    } else {
                        random_shape(&mut rng, n, 5)
                    };
                    let cap = [n, 1 + n / 3, r, 4 * r, 41][rep];
                    transfer(&mut a, &mut b, &data, &shape, cap.max(1))
                        .unwrap_or_else(|e| panic!("{t:?} size {n} rep {rep}: {e}"));
                    transfer(&mut b, &mut a, &data, &shape, cap.max(1))
                        .unwrap_or_else(|e| panic!("{t:?} size {n} rep {rep} (B->A): {e}"));
                }
            }
        }
    });
}

#[test]
fn exact_size_put_into_empty_ring_is_taken_whole() {
    bounded("exact_size_put_into_empty_ring_is_taken_whole", || {
        // Sizes that fit in a fresh, empty ring in one put: a put must take all of them.
        for t in edge_configs() {
            for n in [
                1,
                ONE_CELL_PAYLOAD - 1,
                ONE_CELL_PAYLOAD,
                ONE_CELL_PAYLOAD + 1,
                t.chunk - 24,
                t.chunk - 23,
                t.chunk,
            ] {
                let (mut a, mut b) = t.pair();
                let data = Rng::new(n as u64).bytes(n);
                let took = a.put(&[IoSlice::new(&data)]).unwrap();
                assert_eq!(
                    took, n,
                    "{t:?}: an empty ring must take {n} bytes in one put"
                );
                let mut got = vec![0u8; n + 10];
                let m = get_settled(&mut b, &mut got, n).unwrap();
                assert_eq!(m, n, "{t:?}");
                assert_eq!(&got[..n], &data[..]);
            }
        }
    });
}

#[test]
fn one_byte_gets_walk_through_a_large_message() {
    bounded("one_byte_gets_walk_through_a_large_message", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            let n = 3 * t.ring + 123;
            let data = Rng::new(5).bytes(n.min(1 << 20));
            let n = data.len();
            let mut off = 0;
            let mut got = Vec::with_capacity(n);
            let mut stall = StallCheck::new(1000);
            while got.len() < n {
                if off < n {
                    off += a.put(&[IoSlice::new(&data[off..])]).unwrap();
                }
                let mut one = [0u8; 1];
                let m = b.get(&mut [IoSliceMut::new(&mut one)]).unwrap();
                assert!(m <= 1);
                if m == 1 {
                    got.push(one[0]);
                }
                assert!(
                    !stall.stalled(m == 1),
                    "{t:?}: stalled at {} of {n}",
                    got.len()
                );
            }
            assert!(got == data, "{t:?}: data differs");
        }
    });
}

#[test]
fn shutdown_write_gives_eof_after_the_data() {
    bounded("shutdown_write_gives_eof_after_the_data", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            let data = Rng::new(1).bytes(t.ring / 2);
            assert_eq!(a.put(&[IoSlice::new(&data)]).unwrap(), data.len());
            a.shutdown_write().unwrap();
            a.shutdown_write()
                .expect("a second shutdown_write is harmless");
            // Put after shutdown fails.
            let e = a.put(&[IoSlice::new(b"x")]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
            let e = a.write(b"x").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
            // The reader gets everything with `read`, then Ok(0) repeatedly.
            let mut got = Vec::new();
            let mut buf = vec![0u8; 1000];
            loop {
                let n = b.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got == data, "{t:?}");
            assert_eq!(b.read(&mut buf).unwrap(), 0);
            assert_eq!(
                b.read_vectored(&mut [IoSliceMut::new(&mut buf)]).unwrap(),
                0
            );
            let e = b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{t:?}: {e}");
            let e = b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{t:?}: {e}");
            // read_to_end works too (already at end).
            let mut rest = Vec::new();
            assert_eq!(b.read_to_end(&mut rest).unwrap(), 0);
            // The other direction still works.
            b.write_all(b"still open").unwrap();
            let mut g = [0u8; 10];
            a.read_exact(&mut g).unwrap();
            assert_eq!(&g, b"still open");
        }
    });
}

#[test]
fn try_get_reports_eof_only_after_all_data() {
    bounded("try_get_reports_eof_only_after_all_data", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            let data = Rng::new(2).bytes(3 * t.ring);
            let mut off = 0;
            let mut got = Vec::new();
            let mut closed = false;
            let mut stall = StallCheck::new(100_000);
            loop {
                let mut progressed = false;
                if off < data.len() {
                    let n = a.put(&[IoSlice::new(&data[off..])]).unwrap();
                    off += n;
                    progressed = n > 0;
                } else if !closed {
                    a.shutdown_write().unwrap();
                    closed = true;
                    progressed = true;
                }
                let mut buf = [0u8; 333];
                match b.get(&mut [IoSliceMut::new(&mut buf)]) {
                    Ok(m) => {
                        got.extend_from_slice(&buf[..m]);
                        assert!(
                            !stall.stalled(progressed || m > 0),
                            "{t:?}: no end of stream"
                        );
                    }
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        assert!(closed, "{t:?}: end of stream before the writer closed");
                        break;
                    }
                    Err(e) => panic!("{t:?}: {e}"),
                }
            }
            assert!(got == data, "{t:?}: {} of {} bytes", got.len(), data.len());
        }
    });
}

#[test]
fn write_half_shutdown_gives_eof() {
    bounded("write_half_shutdown_gives_eof", || {
        let t = Tun::new(4096, 1024);
        let (a, mut b) = t.pair();
        let (_ra, mut wa) = a.split();
        wa.write_all(b"last words").unwrap();
        wa.shutdown().unwrap();
        assert_eq!(
            wa.put(&[IoSlice::new(b"x")]).unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
        let mut s = String::new();
        with_watchdog("read_to_string", limit(30), move || {
            b.read_to_string(&mut s).unwrap();
            assert_eq!(s, "last words");
        });
    });
}

#[test]
fn put_after_peer_dropped_is_broken_pipe() {
    bounded("put_after_peer_dropped_is_broken_pipe", || {
        for t in edge_configs() {
            let (mut a, b) = t.pair();
            a.write_all(b"before").unwrap();
            drop(b);
            let e = put_error(&mut a, b"after");
            assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
            let e = a.put(&[IoSlice::new(b"again")]).unwrap_err();
            assert!(
                matches!(e.kind(), io::ErrorKind::BrokenPipe),
                "{t:?}: second put after peer drop: {e}"
            );
            // Blocking write fails too, without hanging.
            let e = with_watchdog("write_all to dropped peer", limit(30), move || {
                a.write_all(&vec![1u8; 1 << 20]).unwrap_err()
            });
            assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
        }
    });
}

#[test]
fn put_into_full_ring_after_peer_dropped_is_broken_pipe() {
    bounded(
        "put_into_full_ring_after_peer_dropped_is_broken_pipe",
        || {
            for t in edge_configs() {
                let (mut a, b) = t.pair();
                // Fill the ring.
                let data = vec![7u8; 4 * t.ring];
                let mut n = 0;
                loop {
                    let k = a.put(&[IoSlice::new(&data)]).unwrap();
                    if k == 0 {
                        break;
                    }
                    n += k;
                    assert!(n <= t.ring, "{t:?}: ring took {n} bytes without a reader");
                }
                drop(b);
                let e = put_error(&mut a, b"x");
                assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
            }
        },
    );
}

#[test]
fn blocked_writer_fails_when_the_peer_drops() {
    bounded("blocked_writer_fails_when_the_peer_drops", || {
        for t in [Tun::new(4096, 1024), Tun::new(4096, 1024).inline(64)] {
            let (mut a, b) = t.pair();
            let r = with_watchdog("blocked writer", limit(60), move || {
                let w = std::thread::spawn(move || a.write_all(&vec![3u8; 1 << 20]));
                // Give the writer a moment to fill the ring and block (not required for
                // correctness: either way the write must end with BrokenPipe).
                std::thread::sleep(Duration::from_millis(50));
                drop(b);
                w.join().unwrap()
            });
            let e = r.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{t:?}: {e}");
        }
    });
}

#[test]
fn read_after_peer_dropped_gets_data_then_eof() {
    bounded("read_after_peer_dropped_gets_data_then_eof", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            // Fill the ring without reading.
            let mut data = Rng::new(3).bytes(2 * t.ring);
            let mut off = 0;
            loop {
                let n = a.put(&[IoSlice::new(&data[off..])]).unwrap();
                if n == 0 {
                    break;
                }
                off += n;
            }
            assert!(off > 100, "{t:?}");
            data.truncate(off);
            drop(a);
            // With 1-byte reads first, then larger ones.
            let mut got = Vec::new();
            for _ in 0..100 {
                let mut one = [0u8; 1];
                assert_eq!(b.read(&mut one).unwrap(), 1, "{t:?}");
                got.push(one[0]);
            }
            let got = with_watchdog("read_to_end after peer drop", limit(30), move || {
                b.read_to_end(&mut got).unwrap();
                let e = b.get(&mut [IoSliceMut::new(&mut [0u8; 8])]).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
                // Writing back to the dropped peer fails (its notice that it stopped
                // reading follows the end of stream).
                let e = put_error(&mut b, b"x");
                assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{e}");
                got
            });
            assert!(got == data, "{t:?}: {} of {} bytes", got.len(), data.len());
        }
    });
}

#[test]
fn dropping_both_ends_in_any_order_is_quiet() {
    bounded("dropping_both_ends_in_any_order_is_quiet", || {
        for t in edge_configs() {
            let (mut a, mut b) = t.pair();
            a.write_all(b"pending").unwrap();
            b.write_all(b"pending").unwrap();
            drop(b);
            drop(a);
            let (a, b) = t.pair();
            drop(a);
            drop(b);
            let (a, b) = t.pair();
            let (ra, wa) = a.split();
            drop(wa);
            drop(b);
            drop(ra);
        }
    });
}

#[test]
fn reunite_accepts_own_halves_only() {
    bounded("reunite_accepts_own_halves_only", || {
        let t = Tun::new(4096, 1024);
        let (a, b) = t.pair();
        let (ra, wa) = a.split();
        let (rb, wb) = b.split();
        let (ra, wb) = match RdmaStream::reunite(ra, wb) {
            Ok(_) => panic!("halves of different streams were reunited"),
            Err(halves) => halves,
        };
        let (rb, wa) = match RdmaStream::reunite(rb, wa) {
            Ok(_) => panic!("halves of different streams were reunited"),
            Err(halves) => halves,
        };
        let mut a = RdmaStream::reunite(ra, wa).unwrap_or_else(|_| panic!("own halves refused"));
        let mut b = RdmaStream::reunite(rb, wb).unwrap_or_else(|_| panic!("own halves refused"));
        a.write_all(b"ping").unwrap();
        let mut g = [0u8; 4];
        b.read_exact(&mut g).unwrap();
        assert_eq!(&g, b"ping");
    });
}

#[test]
fn vectored_blocking_io_round_trip() {
    bounded("vectored_blocking_io_round_trip", || {
        let t = Tun::new(4096, 512).inline(64);
        let (mut a, mut b) = t.pair();
        let data = Rng::new(4).bytes(200_000);
        let d2 = data.clone();
        let w = std::thread::spawn(move || {
            let mut rng = Rng::new(8);
            let mut off = 0;
            while off < d2.len() {
                let n = rng.range(1, 20_000).min(d2.len() - off);
                let shape = random_shape(&mut rng, n, 40);
                write_all_vectored(&mut a, &d2[off..off + n], &shape).unwrap();
                off += n;
            }
            a
        });
        let got = with_watchdog("vectored reader", limit(60), move || {
            let mut rng = Rng::new(9);
            let mut got = Vec::new();
            while got.len() < 200_000 {
                let cap = rng.range(1, 9000);
                let mut buf = vec![0u8; cap];
                let shape = random_shape(&mut rng, cap, 40);
                let n = b.read_vectored(&mut iovecs_mut(&mut buf, &shape)).unwrap();
                assert!(n > 0 && n <= cap);
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
        let _a = w.join().unwrap();
        assert!(got == data);
    });
}

#[test]
fn invalid_configurations_are_rejected() {
    bounded("invalid_configurations_are_rejected", || {
        let bad = [
            Config::default().with_ring_size(5000),
            Config::default().with_ring_size(2048).with_chunk_size(1024),
            Config::default().with_ring_size(2 << 30),
            Config::default().with_ring_size(4096).with_chunk_size(64),
            Config::default().with_ring_size(4096).with_chunk_size(200),
            Config::default().with_ring_size(4096).with_chunk_size(4096),
            Config::default()
                .with_ring_size(4096)
                .with_chunk_size(1024)
                .with_tail_threshold(0),
            Config::default()
                .with_ring_size(4096)
                .with_chunk_size(1024)
                .with_tail_threshold(4096 - 63),
            Config::default()
                .with_ring_size(4096)
                .with_chunk_size(1024)
                .with_max_inline(63),
        ];
        for cfg in bad {
            match RdmaStream::pair_with(cfg.clone()) {
                Ok(_) => panic!("accepted invalid config {cfg:?}"),
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{cfg:?}: {e}"),
            }
        }
        let good = [
            Config::default()
                .with_ring_size(4096)
                .with_chunk_size(128)
                .with_tail_threshold(1)
                .with_max_inline(64),
            Config::default()
                .with_ring_size(4096)
                .with_chunk_size(2048)
                .with_tail_threshold(4096 - 64),
        ];
        for cfg in good {
            let (mut a, mut b) =
                RdmaStream::pair_with(cfg.clone()).unwrap_or_else(|e| panic!("{cfg:?}: {e}"));
            transfer(&mut a, &mut b, &[5u8; 10_000], &[10_000], 1000).unwrap();
        }
    });
}

// -------------------------------------------------------------------------------------
// Flag-value payloads
// -------------------------------------------------------------------------------------

/// Payload words equal to the header or trailer a later lap will write at a cell
/// boundary need no special treatment from the sender (the receiver clears boundary
/// words before freeing cells, ring module docs): such a packet takes exactly the
/// cells a plain one does, and arrives intact.
#[test]
fn flag_words_in_payload_cost_no_extra_cells() {
    bounded("flag_words_in_payload_cost_no_extra_cells", || {
        for t in [Tun::new(4096, 1024), Tun::new(4096, 1024).inline(64)] {
            let ring = t.ring as u64;
            let mut evil = vec![0x11u8; 104];
            // Payload offset 48 lands on the boundary at 64, offset 40 just before it.
            evil[48..56].copy_from_slice(&header_match(64 + ring).to_le_bytes());
            evil[40..48].copy_from_slice(&trailer_word(64 + ring).to_le_bytes());
            let (mut a, mut b) = t.pair();
            assert_eq!(a.put(&[IoSlice::new(&evil)]).unwrap(), 104);
            assert_eq!(
                a.channel().sender().position(),
                128,
                "{t:?}: 104 bytes are one 2-cell packet, flag words or not"
            );
            let mut got = vec![0u8; 104];
            assert_eq!(get_settled(&mut b, &mut got, 104).unwrap(), 104);
            assert_eq!(got, evil, "{t:?}");
        }
    });
}

/// For every starting cell over three laps, payloads made of next-lap flag words (for a
/// cutting sender and for a non-cutting one) go through intact, and the drained ring
/// never yields a phantom packet.
#[test]
fn flag_payloads_at_every_start_cell() {
    bounded("flag_payloads_at_every_start_cell", || {
        let configs = [
            Tun::new(4096, 128),
            Tun::new(4096, 1024),
            Tun::new(4096, 2048).inline(64),
            Tun::new(4096, 1024).inline(300).threshold(4096 - 64),
            Tun::new(8192, 4096).threshold(1),
        ];
        for t in configs {
            let (mut a, mut b) = t.pair();
            let ring = t.ring as u64;
            let mut rng = Rng::new(t.chunk as u64);
            let cells = (t.ring / CELL) as u64;
            for step in 0..3 * cells {
                for lap in [1u64, 1, 2, 0] {
                    let head = a.channel().sender().position();
                    let len = rng.range(41, 2 * t.ring);
                    let kind = rng.below(6);
                    let flags = [Flags::Trailer, Flags::Header, Flags::Both][(kind % 3) as usize];
                    let data = if kind < 3 {
                        cut_chain(&mut rng, head, ring, lap, flags, len)
                    } else {
                        aligned_flags(&mut rng, head, ring, lap, flags, len)
                    };
                    let shape = if rng.chance(1, 3) {
                        random_shape(&mut rng, len, 6)
                    } else {
                        vec![len]
                    };
                    transfer(&mut a, &mut b, &data, &shape, rng.range(1, t.ring)).unwrap_or_else(
                        |e| {
                            panic!(
                                "{t:?} step {step} lap {lap} head {head} len {len} {flags:?}: {e}"
                            )
                        },
                    );
                    // The ring is drained: a poll must find nothing.
                    let mut buf = vec![0u8; t.ring];
                    assert_eq!(
                        b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(),
                        0,
                        "{t:?}: phantom data after step {step}"
                    );
                }
                // Move the start by one cell.
                transfer(&mut a, &mut b, b"x", &[1], 1).unwrap();
            }
        }
    });
}

// -------------------------------------------------------------------------------------
// Credit requests and delayed tail updates
// -------------------------------------------------------------------------------------

/// Common start of the credit scenarios: A sends one 1000-byte packet that B reads
/// whole (B's tail moves but is not announced, being below the threshold), B answers
/// with 3 bytes that A reads (so A learns B's tail through the piggyback), then A fills
/// the ring until `put` takes nothing (and asks for credit). Returns A, B, and the
/// bytes A has sent.
fn stall_sender_with_known_tail(t: &Tun, fill: u8) -> (RdmaStream, RdmaStream, usize) {
    let (mut a, mut b) = t.pair();
    let pkt = vec![fill; 1000]; // one chunk = one 1024-byte packet
    let mut buf = vec![0u8; 1000];
    assert_eq!(a.put(&[IoSlice::new(&pkt)]).unwrap(), 1000);
    assert_eq!(get_settled(&mut b, &mut buf, 1000).unwrap(), 1000);
    assert_eq!(b.put(&[IoSlice::new(b"ack")]).unwrap(), 3);
    let mut g = [0u8; 3];
    assert_eq!(get_settled(&mut a, &mut g, 3).unwrap(), 3);
    let mut sent = 1000usize;
    loop {
        let n = a.put(&[IoSlice::new(&pkt)]).unwrap();
        if n == 0 {
            break;
        }
        sent += n;
    }
    // Where writes land later, give the credit request time to arrive, so that the
    // scenarios below run as on the emulated fabric (the properties they check hold
    // whenever it arrives).
    settle_in_flight();
    (a, b, sent)
}

/// Where writes land later, waits a moment for writes still in flight (no reader can
/// tell when a control word has landed); nothing to wait for on the emulated fabric.
fn settle_in_flight() {
    if lands_later() {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Deterministic scenario: the sender already knows (through a piggybacked ack) the
/// tail the receiver will answer its credit request with, so that answer frees nothing;
/// the receiver then reads everything without reaching the threshold. The sender must
/// still be able to send without reading its own incoming ring (as a blocking
/// `write_all` does).
#[test]
fn credit_answer_that_frees_nothing_does_not_strand_the_sender() {
    bounded(
        "credit_answer_that_frees_nothing_does_not_strand_the_sender",
        || {
            let t = Tun::new(4096, 1024).threshold(4096 - 64);
            // 1.-3. A's packet read by B, B's ack read by A, A fills the ring.
            let (mut a, mut b, sent) = stall_sender_with_known_tail(&t, 0xAB);
            let pkt = vec![0xABu8; 1000];
            let mut one = [0u8; 1];
            let mut buf = vec![0u8; 1000];
            // 4. B reads one byte: no packet completes, but B answers the credit request with
            //    its tail, which A already knows.
            assert_eq!(get_settled(&mut b, &mut one, 1).unwrap(), 1);
            let mut got = 1001usize;
            // 5. B finishes that packet and piggybacks its new tail on a packet A will not read.
            let m = b.get(&mut [IoSliceMut::new(&mut buf[..999])]).unwrap();
            got += m;
            assert_eq!(b.put(&[IoSlice::new(b"unread")]).unwrap(), 6);
            // 6. B reads everything A sent.
            let start = Instant::now();
            loop {
                let m = b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap();
                if m == 0 {
                    if got < sent && lands_later() && start.elapsed() < SETTLE {
                        continue;
                    }
                    break;
                }
                got += m;
            }
            assert_eq!(got, sent, "B read everything A sent");
            // 7. A (which only sends now, like a blocking write) must be able to continue once B
            //    has polled again.
            for _ in 0..10 {
                assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
            }
            let n = put_while_peer_polls(&mut a, &mut b, &pkt);
            assert!(
            n > 0,
            "sender stranded: B consumed all {sent} bytes and polled, but A's put still finds the ring full \
             (B answered A's credit request with a tail A already knew; the tail it sent later travels \
             piggybacked on a packet A has not read, and the threshold {} was not reached)",
            t.threshold
        );
        },
    );
}

/// The shrunk case proptest found for the same liveness rule: here B's *put* (even an
/// empty one, which runs `serve_credit`) answers A's credit request with a tail A
/// already knows.
#[test]
fn credit_answered_by_an_empty_put_does_not_strand_the_sender() {
    bounded("credit_answered_by_an_empty_put", || {
        let t = Tun::new(4096, 768).threshold(2432);
        let (mut a, mut b) = t.pair();
        let mut buf = vec![0u8; 4096];
        let data = Rng::new(1).bytes(4031);
        // A -> B 1 byte, read; B -> A 1 byte (ack 64), read: A knows tail 64.
        assert_eq!(a.put(&[IoSlice::new(&data[..1])]).unwrap(), 1);
        assert_eq!(get_settled(&mut b, &mut buf[..1], 1).unwrap(), 1);
        assert_eq!(b.put(&[IoSlice::new(b"y")]).unwrap(), 1);
        assert_eq!(get_settled(&mut a, &mut buf[..1], 1).unwrap(), 1);
        // A fills the ring: 3928 of 4031 bytes, head 4160, credit requested.
        let n = a.put(&[IoSlice::new(&data)]).unwrap();
        assert_eq!(n, 3928, "fill");
        settle_in_flight();
        // B's empty put runs serve_credit: it answers with tail 64, which A knows.
        assert_eq!(b.put(&[IoSlice::new(&[])]).unwrap(), 0);
        // B reads 2232 bytes, piggybacks its tail (2368) on a packet A never reads,
        // then reads the rest (tail 4160; 4160 - 2368 < threshold 2432: no update).
        assert_eq!(get_settled(&mut b, &mut buf[..2232], 2232).unwrap(), 2232);
        assert_eq!(b.put(&[IoSlice::new(b"z")]).unwrap(), 1);
        assert_eq!(get_settled(&mut b, &mut buf[..1696], 1696).unwrap(), 1696);
        for _ in 0..10 {
            assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
        }
        let n = put_while_peer_polls(&mut a, &mut b, b"x");
        assert!(n > 0, "sender stranded: B read all 3929 bytes and polled 10 times, A's put still takes nothing");
    });
}

/// The same situation with a blocking writer: must finish (watchdog).
#[test]
fn blocking_writer_with_unread_incoming_data_finishes() {
    bounded("blocking_writer_with_unread_incoming_data_finishes", || {
        let t = Tun::new(4096, 1024).threshold(4096 - 64);
        let (mut a, mut b, sent) = stall_sender_with_known_tail(&t, 0xCD);
        let mut buf = vec![0u8; 1000];
        let mut one = [0u8; 1];
        assert_eq!(get_settled(&mut b, &mut one, 1).unwrap(), 1);
        assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf[..999])]).unwrap(), 999);
        assert_eq!(b.put(&[IoSlice::new(b"unread")]).unwrap(), 6);
        // B has read 2000 of the `sent` bytes.
        let total_extra = 64 << 10;
        let writer = std::thread::spawn(move || {
            // A blocking write of more data; A does not read (its incoming data waits).
            a.write_all(&vec![0xEFu8; total_extra]).map(|_| a)
        });
        let r = with_watchdog("reader of blocking writer", limit(30), move || {
            let mut left = sent - 2000 + total_extra;
            let mut buf = vec![0u8; 4096];
            while left > 0 {
                let n = b.read(&mut buf).unwrap();
                assert!(n > 0);
                left -= n;
            }
            b
        });
        let _a = writer.join().unwrap().unwrap();
        drop(r);
    });
}

// =====================================================================================
// Both rings full: deadlock tests
// =====================================================================================

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    /// Put as much as possible, then get as much as possible, repeat.
    Interleave,
    /// Only put until the first stall, then only get until all the peer's data arrived,
    /// then finish sending (interleaving).
    PutThenGet,
    /// Interleave for the first quarter (so piggybacked acks arrive), then only put
    /// (like a blocking write) until everything is sent, then only get.
    SendOnlyPhase,
    /// Like Interleave but each get phase stops at the first empty get and puts and gets
    /// use tiny random sizes.
    Nibble,
}

struct SideReport {
    sent: u64,
    received: u64,
}

/// One side of a non-blocking exchange: sends `total` bytes of stream `my_seed` and
/// checks it receives `total` bytes of stream `peer_seed`, then end of stream.
// Test plumbing: each argument is one knob of the scenario; a struct would only rename them.
#[allow(clippy::too_many_arguments)]
fn exchange_side(
    mut s: RdmaStream,
    name: &'static str,
    my_seed: u64,
    peer_seed: u64,
    total: u64,
    style: Style,
    abort: Arc<AtomicBool>,
    deadline: Deadline,
) -> Result<SideReport, String> {
    let mut rng = Rng::new(my_seed ^ 0xFEED);
    let mut sent = 0u64;
    let mut recvd = 0u64;
    let mut eof = false;
    let mut shut = false;
    let mut msg: Vec<u8> = Vec::new(); // bytes [sent, sent + msg.len() - msg_off) pending
    let mut msg_off = 0usize;
    let mut shape: Vec<usize> = Vec::new();
    let mut rbuf = vec![0u8; 1 << 16];
    let mut scratch = Vec::new();
    let mut stalled_once = false;
    let mut iter = 0u64;
    let state = |sent: u64, recvd: u64, eof: bool| {
        format!("{name}: sent {sent}/{total}, received {recvd}/{total}, eof {eof}")
    };
    loop {
        iter += 1;
        if iter % 256 == 0 {
            if abort.load(Ordering::Relaxed) {
                return Err(format!(
                    "{}: aborted (peer failed)",
                    state(sent, recvd, eof)
                ));
            }
            deadline.check(|| state(sent, recvd, eof))?;
        }
        if sent == total && eof {
            return Ok(SideReport {
                sent,
                received: recvd,
            });
        }
        let phase_put_only = match style {
            Style::PutThenGet => !stalled_once,
            Style::SendOnlyPhase => sent >= total / 4 && sent < total,
            _ => false,
        };
        let phase_get_only = match style {
            Style::PutThenGet => stalled_once && recvd < total,
            Style::SendOnlyPhase => sent == total,
            _ => false,
        };
        // Put phase.
        if !phase_get_only {
            let mut puts = 0;
            while sent < total {
                if msg_off == msg.len() {
                    let max = if style == Style::Nibble {
                        300
                    } else {
                        64 << 10
                    };
                    let n = (rng.log_uniform(1, max) as u64).min(total - sent) as usize;
                    msg.resize(n, 0);
                    stream_fill(my_seed, sent, &mut msg);
                    msg_off = 0;
                    let maxp = if rng.chance(1, 8) { 40 } else { 3 };
                    shape = random_shape(&mut rng, n, maxp);
                }
                // Offer the rest of the message (cut as `shape`, from msg_off).
                let n = s
                    .put(&iovecs(&msg, &shape, msg_off))
                    .map_err(|e| format!("{}: put: {}", state(sent, recvd, eof), ioe(&e)))?;
                if n > msg.len() - msg_off {
                    return Err(format!(
                        "{name}: put took {n}, offered {}",
                        msg.len() - msg_off
                    ));
                }
                msg_off += n;
                sent += n as u64;
                if n == 0 {
                    stalled_once = true;
                    break;
                }
                puts += 1;
                if style == Style::Nibble && puts > 3 {
                    break;
                }
            }
            if sent == total && !shut {
                s.shutdown_write()
                    .map_err(|e| format!("{name}: shutdown_write: {}", ioe(&e)))?;
                shut = true;
            }
        }
        // Get phase.
        if !phase_put_only && !eof {
            loop {
                let cap = if style == Style::Nibble {
                    rng.range(1, 200)
                } else {
                    rng.range(1, rbuf.len())
                };
                match s.get(&mut [IoSliceMut::new(&mut rbuf[..cap])]) {
                    Ok(0) => break,
                    Ok(m) => {
                        if recvd + m as u64 > total {
                            return Err(format!("{name}: received more than {total} bytes"));
                        }
                        stream_check(peer_seed, recvd, &rbuf[..m], &mut scratch)
                            .map_err(|e| format!("{name}: {e}"))?;
                        recvd += m as u64;
                        if style == Style::Nibble {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        if recvd != total {
                            return Err(format!(
                                "{}: premature end of stream",
                                state(sent, recvd, eof)
                            ));
                        }
                        eof = true;
                        break;
                    }
                    Err(e) => return Err(format!("{}: get: {}", state(sent, recvd, eof), ioe(&e))),
                }
            }
        }
        if phase_put_only || phase_get_only {
            std::thread::yield_now();
        }
    }
}

fn run_exchange(t: &Tun, total: u64, style_a: Style, style_b: Style) {
    let (a, b) = t.pair();
    let abort = Arc::new(AtomicBool::new(false));
    let deadline = Deadline::after(limit(90));
    let start = Instant::now();
    let spawn = |s: RdmaStream, name: &'static str, mine: u64, peer: u64, style: Style| {
        let abort = abort.clone();
        std::thread::spawn(move || {
            let r = exchange_side(s, name, mine, peer, total, style, abort.clone(), deadline);
            if r.is_err() {
                abort.store(true, Ordering::Relaxed);
            }
            r
        })
    };
    let ha = spawn(a, "A", 0xA11CE, 0xB0B, style_a);
    let hb = spawn(b, "B", 0xB0B, 0xA11CE, style_b);
    let (ra, rb) = (join(ha, "side A"), join(hb, "side B"));
    let (ra, rb) = match (ra, rb) {
        (Ok(a), Ok(b)) => (a, b),
        (ra, rb) => panic!(
            "{t:?} {style_a:?}/{style_b:?}:\n  A: {:?}\n  B: {:?}",
            ra.err(),
            rb.err()
        ),
    };
    assert_eq!(
        (ra.sent, ra.received, rb.sent, rb.received),
        (total, total, total, total)
    );
    eprintln!(
        "exchange {t:?} {style_a:?}/{style_b:?}: 2 x {} MiB in {:?}",
        total >> 20,
        start.elapsed()
    );
}

const EXCHANGE_BYTES: u64 = 8 << 20;

#[test]
fn both_rings_full_nonblocking_interleaved() {
    bounded("both_rings_full_nonblocking_interleaved", || {
        run_exchange(
            &Tun::new(4096, 1024),
            EXCHANGE_BYTES,
            Style::Interleave,
            Style::Interleave,
        );
    });
}

#[test]
fn both_rings_full_nonblocking_large_threshold() {
    bounded("both_rings_full_nonblocking_large_threshold", || {
        run_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64),
            EXCHANGE_BYTES,
            Style::Interleave,
            Style::Interleave,
        );
    });
}

#[test]
fn both_rings_full_tiny_chunks_threshold_one_staging() {
    bounded("both_rings_full_tiny_chunks_threshold_one_staging", || {
        run_exchange(
            &Tun::new(4096, 128).threshold(1).inline(64),
            EXCHANGE_BYTES / 4,
            Style::Interleave,
            Style::Nibble,
        );
    });
}

#[test]
fn one_side_puts_until_stall_then_only_gets() {
    bounded("one_side_puts_until_stall_then_only_gets", || {
        run_exchange(
            &Tun::new(4096, 1024),
            EXCHANGE_BYTES,
            Style::PutThenGet,
            Style::Interleave,
        );
        run_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64),
            EXCHANGE_BYTES,
            Style::PutThenGet,
            Style::Interleave,
        );
        run_exchange(
            &Tun::new(4096, 1024).inline(64),
            EXCHANGE_BYTES,
            Style::Interleave,
            Style::PutThenGet,
        );
    });
}

#[test]
fn one_side_only_sends_for_a_while_large_threshold() {
    bounded("one_side_only_sends_for_a_while_large_threshold", || {
        run_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64),
            EXCHANGE_BYTES,
            Style::SendOnlyPhase,
            Style::Interleave,
        );
        run_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64).inline(64),
            EXCHANGE_BYTES,
            Style::SendOnlyPhase,
            Style::Nibble,
        );
    });
}

#[test]
fn both_rings_full_nibbling() {
    bounded("both_rings_full_nibbling", || {
        run_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64),
            EXCHANGE_BYTES / 4,
            Style::Nibble,
            Style::Nibble,
        );
        run_exchange(
            &Tun::new(8192, 4096).threshold(100),
            EXCHANGE_BYTES / 4,
            Style::Nibble,
            Style::Interleave,
        );
    });
}

/// Blocking variant: each side splits its stream; a writer thread `write_all`s (some
/// vectored) while a reader thread reads and checks. Four threads in all.
fn run_blocking_exchange(t: &Tun, total: u64) {
    let (a, b) = t.pair();
    let t2 = t.clone();
    with_watchdog("blocking exchange", limit(120), move || {
        let start = Instant::now();
        let (ra, wa) = a.split();
        let (rb, wb) = b.split();
        let writer = |mut w: rdma_channel::WriteHalf, seed: u64| {
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = Rng::new(seed ^ 77);
                let mut off = 0u64;
                let mut msg = Vec::new();
                while off < total {
                    let n = (rng.log_uniform(1, 256 << 10) as u64).min(total - off) as usize;
                    msg.resize(n, 0);
                    stream_fill(seed, off, &mut msg);
                    if rng.chance(1, 3) {
                        let shape = random_shape(&mut rng, n, 8);
                        write_all_vectored(&mut w, &msg, &shape).map_err(|e| ioe(&e))?;
                    } else {
                        w.write_all(&msg).map_err(|e| ioe(&e))?;
                    }
                    off += n as u64;
                }
                w.shutdown().map_err(|e| ioe(&e))
            })
        };
        let reader = |mut r: rdma_channel::ReadHalf, seed: u64| {
            std::thread::spawn(move || -> Result<u64, String> {
                let mut rng = Rng::new(seed ^ 99);
                let mut buf = vec![0u8; 128 << 10];
                let mut scratch = Vec::new();
                let mut got = 0u64;
                loop {
                    let cap = rng.log_uniform(1, buf.len());
                    let n = if rng.chance(1, 4) {
                        let shape = random_shape(&mut rng, cap, 6);
                        r.read_vectored(&mut iovecs_mut(&mut buf[..cap], &shape))
                    } else {
                        r.read(&mut buf[..cap])
                    }
                    .map_err(|e| ioe(&e))?;
                    if n == 0 {
                        return Ok(got);
                    }
                    stream_check(seed, got, &buf[..n], &mut scratch)?;
                    got += n as u64;
                }
            })
        };
        let w1 = writer(wa, 0x1111);
        let w2 = writer(wb, 0x2222);
        let r1 = reader(rb, 0x1111);
        let r2 = reader(ra, 0x2222);
        let res = (
            join(w1, "writer A"),
            join(w2, "writer B"),
            join(r1, "reader B"),
            join(r2, "reader A"),
        );
        match res {
            (Ok(()), Ok(()), Ok(g1), Ok(g2)) => {
                assert_eq!((g1, g2), (total, total), "{t2:?}: lengths");
            }
            other => panic!("{t2:?}: {other:?}"),
        }
        eprintln!(
            "blocking exchange {t2:?}: 2 x {} MiB in {:?}",
            total >> 20,
            start.elapsed()
        );
    });
}

#[test]
fn both_rings_full_blocking_split_halves() {
    bounded("both_rings_full_blocking_split_halves", || {
        run_blocking_exchange(&Tun::new(4096, 1024), EXCHANGE_BYTES);
    });
}

#[test]
fn both_rings_full_blocking_large_threshold_staging() {
    bounded("both_rings_full_blocking_large_threshold_staging", || {
        run_blocking_exchange(
            &Tun::new(4096, 1024).threshold(4096 - 64).inline(64),
            EXCHANGE_BYTES,
        );
    });
}

#[test]
fn blocking_exchange_default_config() {
    bounded("blocking_exchange_default_config", || {
        let (a, b) = RdmaStream::pair_with(Config::default()).unwrap();
        // Default wait policy (long spins) with four threads.
        let total = 32u64 << 20;
        with_watchdog("default-config exchange", limit(120), move || {
            let (mut ra, mut wa) = a.split();
            let (mut rb, mut wb) = b.split();
            let w1 = std::thread::spawn(move || {
                let data = stream_vec(1, 0, total as usize);
                wa.write_all(&data).unwrap();
            });
            let w2 = std::thread::spawn(move || {
                let data = stream_vec(2, 0, total as usize);
                wb.write_all(&data).unwrap();
            });
            let r1 = std::thread::spawn(move || {
                let mut v = Vec::new();
                rb.read_to_end(&mut v).unwrap();
                v
            });
            let mut v = Vec::new();
            ra.read_to_end(&mut v).unwrap();
            w1.join().unwrap();
            w2.join().unwrap();
            let v1 = r1.join().unwrap();
            assert!(v1 == stream_vec(1, 0, total as usize), "A->B data differs");
            assert!(v == stream_vec(2, 0, total as usize), "B->A data differs");
        });
    });
}
