//! Helpers shared by the channel test binaries: a deterministic PRNG, data generators
//! (plain, seekable streams, and adversarial payloads full of ring flag words), iovec
//! builders and time bounds (deadlines and a watchdog) so that a hang fails a test
//! instead of blocking CI.

#![allow(dead_code)]

use std::io::{self, IoSlice, IoSliceMut};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdma_channel::fabric::FabricKind;
use rdma_channel::ring::wire::{
    header_match, trailer_word, ShortHeader, CELL, SHORT_HEADER_OFFSET, SHORT_PAYLOAD,
};

// ---------------------------------------------------------------------------------
// The fabric under test and the size of the run
// ---------------------------------------------------------------------------------

/// The fabric `RCH_FABRIC` selects, which `RdmaStream::pair_with` and the listener
/// use (the emulated one unless it says `verbs`).
pub fn fabric_kind() -> FabricKind {
    FabricKind::from_env().unwrap_or_else(|e| panic!("{e}"))
}

/// Opens the fabric the stream constructors use in this run and says which it is
/// (with the device on verbs), so that a log shows what was tested.
pub fn report_fabric() {
    let f = rdma_channel::fabric::AnyFabric::from_env()
        .unwrap_or_else(|e| panic!("cannot open the fabric RCH_FABRIC selects: {e}"));
    assert_eq!(f.kind(), fabric_kind());
    println!("fabric under test (RCH_FABRIC): {f:?}");
}

/// True when a write may land in the peer's memory after `put` returned (verbs: the
/// NIC moves the bytes later). Single-threaded checks then poll for what was put
/// (for at most [`SETTLE`]) instead of expecting it at once, as they may on the
/// emulated fabric, which executes every write inside `post`.
pub fn lands_later() -> bool {
    fabric_kind() != FabricKind::Emulated || peer::across_hosts()
}

/// This host's IP address on the RDMA link, for peers to connect to: `RCH_TEST_IP`,
/// else the Soft-RoCE VM's `SOFTROCE_IP`.
pub fn my_ip() -> String {
    ["RCH_TEST_IP", "SOFTROCE_IP"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .expect("RCH_TEST_IP or SOFTROCE_IP must name this host's RDMA address")
}

/// True when an RDMA device with an IP address is there for rdma_cm tests (in the
/// Soft-RoCE VM, or where `RCH_TEST_IP` names one).
pub fn rdma_ip_available() -> bool {
    cfg!(feature = "verbs")
        && ["RCH_TEST_IP", "SOFTROCE_IP"]
            .iter()
            .any(|k| std::env::var(k).is_ok_and(|v| !v.is_empty()))
}

/// How long a single-threaded check waits for bytes or notices still in flight on a
/// fabric where writes land later (generous: rxe under emulation can be slow).
pub const SETTLE: Duration = Duration::from_secs(20);

/// A time bound of `secs` seconds for a watchdog or deadline, five times longer where
/// writes land later: rxe under emulation is about a hundred times slower than the
/// emulated fabric, and much slower still on a busy host. The bounds only turn hangs
/// into failures; no test asserts on speed.
pub fn limit(secs: u64) -> Duration {
    Duration::from_secs(if lands_later() { 5 * secs } else { secs })
}

/// `cases` scaled by `RCH_TEST_CASE_SCALE` (a positive float, default 1.0), at least
/// 1: for proptest configurations, so that slow fabrics (rxe under emulation moves
/// ~40 MB/s) run the same properties with fewer cases.
pub fn scaled(cases: u32) -> u32 {
    ((f64::from(cases) * case_scale()).round() as u32).max(1)
}

/// `bytes` scaled by `RCH_TEST_CASE_SCALE` as [`scaled`], but never below `floor` nor
/// above `bytes`: for exchanges whose length only buys more laps of the same ring
/// (the deadlock exchanges run 8 MiB through 4 KiB rings: 2,048 laps; on verbs in the
/// CI's VM, at scale 0.1, 1 MiB, still 256).
pub fn scaled_bytes(bytes: u64, floor: u64) -> u64 {
    ((bytes as f64 * case_scale()).round() as u64).clamp(floor.min(bytes), bytes)
}

fn case_scale() -> f64 {
    match std::env::var("RCH_TEST_CASE_SCALE") {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => x,
            _ => panic!("RCH_TEST_CASE_SCALE={v:?}: expected a positive number such as 0.1"),
        },
        _ => 1.0,
    }
}

/// Notices that a loop stopped making progress: after `sync_limit` idle rounds on a
/// fabric that places writes at once, after [`SETTLE`] without progress on one whose
/// writes land later (where idle rounds are expected while bytes are in flight).
#[derive(Debug)]
pub struct StallCheck {
    idle: u64,
    sync_limit: u64,
    lands_later: bool,
    last_progress: Instant,
}

impl StallCheck {
    pub fn new(sync_limit: u64) -> StallCheck {
        StallCheck {
            idle: 0,
            sync_limit,
            lands_later: lands_later(),
            last_progress: Instant::now(),
        }
    }

    /// Records one round; true once the loop counts as stalled.
    pub fn stalled(&mut self, progressed: bool) -> bool {
        if progressed {
            self.idle = 0;
            self.last_progress = Instant::now();
            return false;
        }
        self.idle += 1;
        if self.lands_later {
            if self.idle % 64 == 0 {
                std::thread::yield_now();
            }
            self.last_progress.elapsed() > SETTLE
        } else {
            self.idle > self.sync_limit
        }
    }
}

// ---------------------------------------------------------------------------------
// PRNG
// ---------------------------------------------------------------------------------

/// The splitmix64 finaliser: a good 64-bit mixing function.
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// splitmix64: tiny, fast, deterministic.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        assert!(lo <= hi);
        lo + self.below((hi - lo) as u64 + 1) as usize
    }

    /// True with probability `num/den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// Log-uniform in `lo..=hi` (`lo >= 1`): every power of two is equally likely.
    pub fn log_uniform(&mut self, lo: usize, hi: usize) -> usize {
        assert!(lo >= 1 && lo <= hi);
        let (a, b) = ((lo as f64).ln(), ((hi + 1) as f64).ln());
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let v = (a + u * (b - a)).exp() as usize;
        v.clamp(lo, hi)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let w = self.next_u64().to_le_bytes();
            rest.copy_from_slice(&w[..rest.len()]);
        }
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }
}

// ---------------------------------------------------------------------------------
// Seekable pseudo-random streams: byte i of stream `seed` is a pure function of
// (seed, i), so a receiver can regenerate exactly what a sender produced no matter how
// the sender cut it into messages.
// ---------------------------------------------------------------------------------

fn stream_word(seed: u64, index: u64) -> u64 {
    mix64(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Fills `buf` with bytes `offset .. offset + buf.len()` of stream `seed`.
pub fn stream_fill(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut pos = offset;
    let mut i = 0;
    // Unaligned head.
    while i < buf.len() && pos % 8 != 0 {
        buf[i] = stream_word(seed, pos / 8).to_le_bytes()[(pos % 8) as usize];
        i += 1;
        pos += 1;
    }
    let mut chunks = buf[i..].chunks_exact_mut(8);
    let mut w = pos / 8;
    for c in &mut chunks {
        c.copy_from_slice(&stream_word(seed, w).to_le_bytes());
        w += 1;
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let b = stream_word(seed, w).to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&b[..n]);
    }
}

pub fn stream_vec(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    stream_fill(seed, offset, &mut v);
    v
}

/// Checks `got` against bytes `offset..` of stream `seed`; on mismatch describes the
/// first differing byte.
pub fn stream_check(
    seed: u64,
    offset: u64,
    got: &[u8],
    scratch: &mut Vec<u8>,
) -> Result<(), String> {
    scratch.resize(got.len(), 0);
    stream_fill(seed, offset, scratch);
    if scratch[..] == *got {
        return Ok(());
    }
    let i = got
        .iter()
        .zip(scratch.iter())
        .position(|(a, b)| a != b)
        .unwrap();
    Err(format!(
        "stream {seed:#x}: byte {} differs: got {:#04x}, expected {:#04x} (chunk of {} bytes at offset {offset})",
        offset + i as u64,
        got[i],
        scratch[i],
        got.len()
    ))
}

/// 64-bit FNV-1a, for summaries in messages.
pub fn fnv1a(h: u64, data: &[u8]) -> u64 {
    let mut h = if h == 0 { 0xcbf2_9ce4_8422_2325 } else { h };
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

// ---------------------------------------------------------------------------------
// Adversarial payloads: words equal to ring flag values.
// ---------------------------------------------------------------------------------

/// Header/trailer overhead of a packet (header 8 + ack 8 + trailer 8).
pub const OVERHEAD: usize = 24;
/// Payload offset inside a packet.
pub const PAYLOAD_AT: u64 = 16;

/// A word the receiver could take for a header of a packet at `q`: the match bits of
/// `header_match(q)` with (mostly valid, sometimes invalid) kind and length bits.
pub fn fake_header(rng: &mut Rng, q: u64) -> u64 {
    let kind: u64 = match rng.below(8) {
        0..=3 => 1, // data
        4 | 5 => 2, // pad
        6 => 0,
        _ => rng.below(16),
    };
    let len: u64 = match rng.below(4) {
        0 => rng.below(41),
        1 => rng.below(200),
        2 => rng.below(1 << 16),
        _ => rng.below(1 << 24),
    };
    header_match(q) | (kind << 56) | (len << 32)
}

/// What kind of flag words an adversarial payload carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flags {
    Trailer,
    Header,
    Both,
}

/// A payload that makes a correct sender cut *every* packet to one cell: for a packet
/// starting at `head + 64 k` (payload byte `40 k` onwards), the word at payload offset
/// 40 equals the trailer (and/or the word at offset 48 the header) that the ring will
/// hold at the next cell boundary `lap` laps later. With `lap == 1` a sender that did
/// not cut would leave exactly the stale words a receiver could mistake for a future
/// packet; other laps must be harmless. The chain stays in phase when a `put` takes
/// only part of the payload and the rest is offered again.
pub fn cut_chain(
    rng: &mut Rng,
    head: u64,
    ring: u64,
    lap: u64,
    flags: Flags,
    len: usize,
) -> Vec<u8> {
    let mut v = rng.bytes(len);
    let one = (CELL - OVERHEAD) as u64; // 40
    let mut k = 0u64;
    loop {
        let t_at = (one * k + one) as usize;
        let boundary = head + CELL as u64 * (k + 1) + lap * ring;
        if t_at + 8 > len {
            break;
        }
        if flags != Flags::Header {
            v[t_at..t_at + 8].copy_from_slice(&trailer_word(boundary).to_le_bytes());
        }
        let h_at = t_at + 8;
        if flags != Flags::Trailer && h_at + 8 <= len {
            let w = fake_header(rng, boundary);
            v[h_at..h_at + 8].copy_from_slice(&w.to_le_bytes());
        }
        k += 1;
    }
    v
}

/// A payload laid out for a sender that writes it as one uncut packet from `head`:
/// every word that would land on a cell boundary holds the header of `lap` laps later,
/// and every word that would land just before a boundary holds that lap's trailer, or
/// in a cell's second word, that lap's short header (a short packet's last word).
pub fn aligned_flags(
    rng: &mut Rng,
    head: u64,
    ring: u64,
    lap: u64,
    flags: Flags,
    len: usize,
) -> Vec<u8> {
    let mut v = rng.bytes(len);
    // Payload byte o lands at absolute head + 16 + o.
    let mut o = 0usize;
    // First payload offset that lands on an 8-aligned absolute position: head is
    // cell-aligned, so all 8-multiples are.
    while o + 8 <= len {
        let abs = head + PAYLOAD_AT + o as u64;
        let in_cell = abs % CELL as u64;
        if in_cell == 0 && flags != Flags::Trailer {
            let w = fake_header(rng, abs + lap * ring);
            v[o..o + 8].copy_from_slice(&w.to_le_bytes());
        } else if in_cell == CELL as u64 - 8 && flags != Flags::Header {
            v[o..o + 8].copy_from_slice(&trailer_word(abs + 8 + lap * ring).to_le_bytes());
        } else if in_cell == SHORT_HEADER_OFFSET as u64 && flags != Flags::Header {
            // Where a short packet's header stands: that of this word's cell.
            let len = 1 + rng.below(SHORT_PAYLOAD as u64) as usize;
            let at = abs - in_cell + lap * ring;
            let w = ShortHeader::new(at, len, rng.below(1 << 20) * CELL as u64).word();
            v[o..o + 8].copy_from_slice(&w.to_le_bytes());
        }
        o += 8;
    }
    v
}

/// A "soup" of flag words: about `density`/16 of the words (at byte offsets of a random
/// phase, or anywhere) are header or trailer values for positions near where the byte
/// might land (`est_head` + offset + a drift of a few cells), for laps 0..=3, plus
/// values for the first cells of the first four laps.
pub fn flag_soup(rng: &mut Rng, est_head: u64, ring: u64, density: u64, len: usize) -> Vec<u8> {
    let mut v = rng.bytes(len);
    let phase = rng.below(8) as usize;
    let mut o = phase;
    while o + 8 <= len {
        if rng.below(16) < density {
            let at = if rng.chance(1, 4) {
                // Anywhere (any alignment), within the next 8 bytes.
                (o + rng.below(8) as usize).min(len - 8)
            } else {
                o
            };
            let lap = rng.below(4);
            let q = if rng.chance(1, 8) {
                // Absolute low positions of the first laps.
                rng.below(4 * ring / CELL as u64) * CELL as u64
            } else {
                let est = est_head + PAYLOAD_AT + at as u64;
                let drift = rng.below(9) as i64 - 2; // -2..=6 cells
                let base = (est / CELL as u64) as i64 + drift;
                base.max(0) as u64 * CELL as u64 + lap * ring
            };
            let w = match rng.below(4) {
                0 | 1 => fake_header(rng, q),
                2 => ShortHeader::new(q, rng.below(16) as usize, rng.below(1 << 20) * 64).word(),
                _ => trailer_word(q + if rng.chance(1, 2) { CELL as u64 } else { 0 }),
            };
            v[at..at + 8].copy_from_slice(&w.to_le_bytes());
        }
        o += 8;
    }
    v
}

// ---------------------------------------------------------------------------------
// iovecs
// ---------------------------------------------------------------------------------

/// Slices of `data` (whose length is the sum of `shape`) from byte `skip` on, cut as
/// `shape` says (the first piece is shortened by whatever `skip` covers).
pub fn iovecs<'a>(data: &'a [u8], shape: &[usize], skip: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::with_capacity(shape.len());
    let mut at = 0usize;
    for &len in shape {
        let (s, e) = (at, at + len);
        at = e;
        if e <= skip {
            continue;
        }
        out.push(IoSlice::new(&data[s.max(skip)..e]));
    }
    out
}

/// Mutable slices of `buf` cut as `shape` says.
pub fn iovecs_mut<'a>(buf: &'a mut [u8], shape: &[usize]) -> Vec<IoSliceMut<'a>> {
    iovecs_mut_from(buf, shape, 0)
}

/// Mutable slices of `buf` cut as `shape` says, from byte `skip` on (the piece
/// holding `skip` is shortened, the ones before it left out).
pub fn iovecs_mut_from<'a>(
    mut buf: &'a mut [u8],
    shape: &[usize],
    skip: usize,
) -> Vec<IoSliceMut<'a>> {
    let mut out = Vec::with_capacity(shape.len());
    let mut at = 0usize;
    for &len in shape {
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(len);
        buf = tail;
        let (s, e) = (at, at + len);
        at = e;
        if skip > 0 && e <= skip {
            continue;
        }
        out.push(IoSliceMut::new(&mut head[skip.saturating_sub(s)..]));
    }
    out
}

/// Writes all of `data` cut as `shape` with `write_vectored` (stable `write_all_vectored`
/// does not exist yet).
pub fn write_all_vectored<W: io::Write>(w: &mut W, data: &[u8], shape: &[usize]) -> io::Result<()> {
    let mut done = 0usize;
    while done < data.len() {
        let iov = iovecs(data, shape, done);
        let n = w.write_vectored(&iov)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "write_vectored wrote nothing",
            ));
        }
        assert!(
            n <= data.len() - done,
            "write_vectored claims {n} bytes, only {} offered",
            data.len() - done
        );
        done += n;
    }
    Ok(())
}

/// One read of a random size (log-uniform up to `buf.len()`) into `buf`, vectored
/// into up to 6 random pieces one time in four, as a varied application would read.
/// Returns the bytes read and the bytes asked for.
pub fn read_random(
    r: &mut impl std::io::Read,
    buf: &mut [u8],
    rng: &mut Rng,
) -> std::io::Result<(usize, usize)> {
    let cap = rng.log_uniform(1, buf.len());
    let n = if rng.chance(1, 4) {
        let shape = random_shape(rng, cap, 6);
        r.read_vectored(&mut iovecs_mut(&mut buf[..cap], &shape))
    } else {
        r.read(&mut buf[..cap])
    }?;
    Ok((n, cap))
}

/// Cuts `total` bytes into 1..=max_pieces random pieces (some possibly empty).
pub fn random_shape(rng: &mut Rng, total: usize, max_pieces: usize) -> Vec<usize> {
    let pieces = rng.range(1, max_pieces.max(1));
    let mut cuts: Vec<usize> = (0..pieces - 1).map(|_| rng.range(0, total)).collect();
    cuts.push(0);
    cuts.push(total);
    cuts.sort_unstable();
    cuts.windows(2).map(|w| w[1] - w[0]).collect()
}

// ---------------------------------------------------------------------------------
// Time bounds
// ---------------------------------------------------------------------------------

/// A deadline for loops that poll: `check` fails once it has passed. Not a timing
/// assertion: the limits are generous and only turn hangs into failures.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    end: Instant,
    limit: Duration,
}

impl Deadline {
    pub fn after(limit: Duration) -> Deadline {
        Deadline {
            end: Instant::now() + limit,
            limit,
        }
    }

    pub fn passed(&self) -> bool {
        Instant::now() >= self.end
    }

    /// `Err` with a description once the deadline passed.
    pub fn check(&self, what: impl FnOnce() -> String) -> Result<(), String> {
        if self.passed() {
            Err(format!(
                "no progress within {:?} (hang?): {}",
                self.limit,
                what()
            ))
        } else {
            Ok(())
        }
    }
}

/// Runs `f` on its own thread and fails (panics) if it does not finish within `limit`
/// (the thread is then left behind; the test fails instead of hanging). A panic in `f`
/// is propagated.
pub fn with_watchdog<T, F>(name: &str, limit: Duration, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("watched-{name}"))
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(r);
        })
        .expect("spawn watched thread");
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => {
            let _ = handle.join();
            v
        }
        Ok(Err(p)) => {
            let _ = handle.join();
            std::panic::resume_unwind(p)
        }
        Err(_) => panic!("watchdog: {name} did not finish within {limit:?} (hang/deadlock)"),
    }
}

/// Like [`with_watchdog`] but for a function returning `Result<T, String>`: a timeout
/// or a panic becomes an `Err` (for property tests, whose runner wants an error value).
pub fn watched<T, F>(name: &str, limit: Duration, f: F) -> Result<T, String>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, String> + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("watched-{name}"))
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(r);
        })
        .map_err(|e| format!("spawn: {e}"))?;
    match rx.recv_timeout(limit) {
        Ok(Ok(r)) => {
            let _ = handle.join();
            r
        }
        Ok(Err(p)) => {
            let _ = handle.join();
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "<non-string panic>".into());
            Err(format!("{name} panicked: {msg}"))
        }
        Err(_) => Err(format!(
            "{name} did not finish within {limit:?} (hang/deadlock)"
        )),
    }
}

/// Joins a thread that returns `Result<T, String>`, turning a panic into an `Err`.
pub fn join<T>(h: std::thread::JoinHandle<Result<T, String>>, who: &str) -> Result<T, String> {
    match h.join() {
        Ok(r) => r.map_err(|e| format!("{who}: {e}")),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "<non-string panic>".into());
            Err(format!("{who} panicked: {msg}"))
        }
    }
}

/// Short textual form of an io error for messages.
pub fn ioe(e: &io::Error) -> String {
    format!("{:?}: {}", e.kind(), e)
}
pub mod exchange;
pub mod peer;
pub mod zc;
