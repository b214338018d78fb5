//! Choosing between the ring and zero-copy for large buffers in memory the fabric
//! reaches only at a cost (on the emulated fabric, heap memory reached with
//! `process_vm_readv`/`process_vm_writev`), by measurement.
//!
//! Neither path wins on every host or in every phase of one: the ring's two copies
//! move each line between the cores twice and run at twice the kernel's single
//! copy when a cross-core hand-off is cheap, at half to two thirds of it when it is
//! dear, and when both ends send at once each core makes two copies per byte
//! instead of one (bench/notebook/2026-11.md, "the heap path's two regimes"). The
//! receiver sees both paths' bytes arrive, so it measures them: each large copy out
//! of the ring, and each zero-copy step (its reads and the part the sender pushed,
//! [`RNDV_BY_ADVICE`]), per byte, as delivered: in a stream the wait between two
//! pieces on one path counts ([`PathMeter::span`]). While this end sends large data
//! between its copies out, its core makes both kinds of copy and a ring byte costs
//! its copy into a ring as well, as its sender times it ([`CopyInMeter`]).
//! Zero-copy's cost falls with the transfer's size (a round trip each), so it has a
//! figure per size class ([`CLASSES`]), and faster for one class it holds for the
//! larger ones (see CARRIED below). The receiver tells
//! the sender which path costs less for each class in a control word
//! ([`CtrlWord::PathAdvice`]), and the sender, which chooses the path of each
//! buffer, follows it for buffers from `Link::zc_adaptive_min` up.
//!
//! A path not taken is not measured, so the meter asks for it now and then: when
//! the other path's figure is missing or older than [`PROBE_AFTER`], the advice
//! names it until [`PROBE_BYTES`] went that way, the second half of them measured.
//!
//! [`CtrlWord::PathAdvice`]: crate::ring::memory::CtrlWord::PathAdvice
//! [`RNDV_BY_ADVICE`]: crate::ring::wire::RNDV_BY_ADVICE

use std::time::{Duration, Instant};

/// Smallest copy timed, the adaptive choice's smallest size by default: the clock
/// reads (~20 ns each through the vDSO) stay under a fiftieth of the copy.
pub(crate) const MEASURE_MIN: usize = 32 << 10;

/// Age of the other path's figure after which it is measured again.
pub(crate) const PROBE_AFTER: Duration = Duration::from_millis(250);

/// Bytes a probe of a path moves: the first half warms it up, the second half is
/// measured. Every [`PROBE_AFTER`] this much goes by the slower path, under 1% of
/// what a stream of large messages moves meanwhile.
const PROBE_BYTES: u64 = 8 << 20;

/// Fewest samples a probe takes (the first left out): at 4 MiB, [`PROBE_BYTES`]
/// alone made one transfer, the second use of a buffer, decide (IMB PingPing 4 MiB
/// read it at 290 ps a byte; steady reads ran at ~180).
const PROBE_SAMPLES: u32 = 4;

/// This end counts as sending large data on the connection when its last large
/// put is at most this old.
const BOTH_WAYS_WITHIN: Duration = Duration::from_millis(1);

/// Samples a path's figure is the median of: one copy stalled by a preemption, a
/// page fault or a late push does not swing the choice (a mean over 16 MiB went
/// from 58 to 263 ps a byte on one such 1 MiB step in the slow hand-off phase).
const SAMPLES: usize = 9;

/// Nanoseconds since this process first asked, for timestamps kept in atomics.
pub(crate) fn process_nanos() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    epoch.elapsed().as_nanos().min(u64::MAX as u128) as u64
}

/// Samples on one path at most this far apart count as one stream: the time
/// between them is the path's (see [`PathMeter::span`]).
const BACK_TO_BACK: Duration = Duration::from_millis(1);

/// Ring copies out whose gap, with this end's large puts in it, is at most this
/// many times the copy's own time belong to one stream in both directions (see
/// [`PathMeter::span`]); a ping-pong's round trip before a reply is a whole message
/// each way, several copies at least.
const INTERLEAVED_GAPS: u32 = 2;

/// A ring byte's cost while this end sends large data too, in percent of our copy
/// out: each core then makes the copy into its outgoing ring and the copy out of its
/// incoming one, but not back to back (a core waits for its peer now and then, and
/// the copies overlap it). 200 (no overlap) kept 1 MiB exchanges on single copy
/// where the ring was 1.2x faster; 150 is the middle (bench/notebook/2026-11.md).
const BOTH_WAYS_PCT: u32 = 150;

/// Size classes of large buffers, each with its own zero-copy figure and advice
/// bit: a zero-copy transfer pays a round trip and two system calls whatever its
/// size, so its cost a byte falls with the size, where a ring byte's does not
/// (a 64 KiB stream read at 144 ps a byte, a 1 MiB one at 64, the ring at 110-125
/// for both; bench/notebook/2026-12.md, "split by advice"), fastest where the
/// transfer is small: osu_latency read 16 KiB at ~330 ps a byte and 32 KiB at ~220
/// in the slow hand-off phase, so a class spans a power of two. Classes: below
/// 32 KiB, below 64 KiB, ... below 4 MiB, and from 4 MiB.
pub(crate) const CLASSES: usize = 9;

/// Bits of the advice word that name a path per size class; the bits above count
/// the advice changes, so that every change is a new value.
const CLASS_BITS: u32 = 16;

/// The size class of a buffer or transfer of `len` bytes.
fn class_of(len: usize) -> usize {
    let log2 = (usize::BITS - 1).saturating_sub(len.max(1).leading_zeros()) as usize;
    log2.saturating_sub(14).min(CLASSES - 1)
}

/// The advice word's bit that asks for zero-copy for buffers of `len` bytes, from
/// [`MEASURE_MIN`] up.
fn advice_bit(len: usize) -> u64 {
    1 << class_of(len)
}

/// Whether an advice word asks for zero-copy for a buffer of `len` bytes.
///
/// Below [`MEASURE_MIN`] (class 0) nothing is timed, and the bit means the
/// opposite: the ring, because the smallest measured class found the ring faster
/// (see BELOW). Clear, as before any advice, zero-copy: its fixed cost is small
/// against the ring's second copy of 16-32 KiB on this kind of host (IMB PingPong
/// 16 KiB 1.94 us against the ring's 2.89, PingPing 2.60 against 2.75,
/// bench/notebook/2026-12.md).
pub(crate) fn advises_zero_copy(advice: u64, len: usize) -> bool {
    let bit = advice & advice_bit(len) != 0;
    if class_of(len) == 0 {
        !bit
    } else {
        bit
    }
}

// CARRIED: a zero-copy byte costs less the larger the transfer (its round trip and
// system calls are shared by more bytes) and a ring byte does not, so zero-copy
// measured faster for a size class holds for the larger ones. Their own figures are
// taken from few, early transfers in a short run (IMB PingPing 4 MiB runs 10: its
// probe read 330 ps a byte where 1 and 2 MiB read 221-226 and steady reads ~170, and
// kept the ring at ~1.1-1.4 ms a step against the reads' ~0.7). Only while the
// smaller class's figure is fresh ([`PROBE_AFTER`]): a stale one may be of another
// regime.

// BELOW: a ring byte costs what it costs at any size and a zero-copy byte more the
// smaller the transfer, so the ring faster for the smallest measured class (from
// MEASURE_MIN) is faster below it too: those sizes then take the ring, else
// zero-copy. Carried down from that class's last verdict, whatever its age: the
// class is probed again every PROBE_AFTER while it sees traffic.

/// A switch must save at least this share of the time (percent), so noise around
/// equal rates does not flip the advice back and forth.
const HYSTERESIS_PCT: u64 = 10;

/// One path's recent delivery: the cost a byte of its last [`SAMPLES`] samples.
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    /// Picoseconds a byte, oldest overwritten first.
    recent: [u32; SAMPLES],
    /// Samples held (at most [`SAMPLES`]).
    held: usize,
    /// The samples held, in ascending order (the first `held`): kept as each sample
    /// comes, so that the median is read, not sorted for (the advice reads every
    /// class's figure after each sample; sorting for each was ~1.5% of a 64 KiB
    /// zero-copy receiver's time).
    sorted: [u32; SAMPLES],
    /// Where the next sample goes.
    next: usize,
    /// When the figure goes stale ([`PROBE_AFTER`] after its last sample): kept as a
    /// deadline so that the advice's checks of every class after each sample are
    /// comparisons, not clock arithmetic.
    fresh_until: Option<Instant>,
    /// Bytes seen by the probe under way on this path, if one is.
    probe: Option<u64>,
    /// Samples seen by the probe under way.
    probe_samples: u32,
}

impl Cost {
    /// A sample; during a probe the first half of [`PROBE_BYTES`], and at least the
    /// first sample, are left out (the first transfers on a path not taken for a
    /// while register buffers, fault pages in, grow a ring: not what the path costs
    /// from then on). A probe lasts [`PROBE_BYTES`] and at least
    /// [`PROBE_SAMPLES`] samples, so a large transfer's is not one sample.
    fn offer(&mut self, bytes: usize, took: Duration, now: Instant) {
        match self.probe {
            None => self.add(bytes, took, now),
            Some(seen) => {
                let seen = seen.saturating_add(bytes as u64);
                self.probe_samples += 1;
                if seen > PROBE_BYTES / 2 && self.probe_samples > 1 {
                    self.add(bytes, took, now);
                }
                let done = seen >= PROBE_BYTES && self.probe_samples >= PROBE_SAMPLES;
                self.probe = (!done).then_some(seen);
            }
        }
    }

    fn start_probe(&mut self) {
        self.probe = Some(0);
        self.probe_samples = 0;
    }

    fn add(&mut self, bytes: usize, took: Duration, now: Instant) {
        self.record(bytes, took);
        self.fresh_until = Some(now + PROBE_AFTER);
    }

    fn record(&mut self, bytes: usize, took: Duration) {
        // In u64: a copy's nanoseconds times 1000 stay far below 2^64, and a u128
        // division is a library call.
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let ps = (nanos.saturating_mul(1000) / bytes.max(1) as u64).min(u64::from(u32::MAX)) as u32;
        if self.held == SAMPLES {
            // The oldest sample leaves the ordered copy.
            let oldest = self.recent[self.next];
            let i = self
                .sorted
                .iter()
                .position(|&x| x == oldest)
                .expect("every sample held is in the ordered copy");
            self.sorted.copy_within(i + 1..SAMPLES, i);
            self.held -= 1;
        }
        let at = self.sorted[..self.held].partition_point(|&x| x <= ps);
        self.sorted.copy_within(at..self.held, at + 1);
        self.sorted[at] = ps;
        self.held += 1;
        self.recent[self.next] = ps;
        self.next = (self.next + 1) % SAMPLES;
    }

    /// Picoseconds per byte (the median of the samples held), once measured.
    fn ps_per_byte(&self) -> Option<u64> {
        (self.held > 0).then(|| u64::from(self.sorted[self.held / 2]))
    }

    fn stale(&self, now: Instant) -> bool {
        self.fresh_until.is_none_or(|until| now >= until)
    }
}

/// This end's copies into the peer's ring, timed by its sender: while both ends
/// send, a ring byte costs a core that copy as well as its copy out.
#[derive(Debug, Default)]
pub(crate) struct CopyInMeter(Cost);

impl CopyInMeter {
    /// A copy of `bytes` into the ring took `took`; returns the median cost a byte
    /// of the last [`SAMPLES`] (picoseconds).
    pub(crate) fn offer(&mut self, bytes: usize, took: Duration) -> u64 {
        self.0.record(bytes, took);
        self.0.ps_per_byte().unwrap_or(0)
    }
}

/// What this end's sender did lately on the connection ([`process_nanos`]
/// timestamps, 0: never): the path meter weighs ring copies by it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OwnPuts {
    /// The last large put, by either path.
    pub(crate) large_at: u64,
    /// The last timed large copy into the peer's ring.
    pub(crate) ring_copy_at: u64,
    /// The median cost a byte of the recent ones (picoseconds).
    pub(crate) ring_copy_ps: u64,
}

/// The two paths a large buffer may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Ring,
    ZeroCopy,
}

/// The receiver's measurements and the advice it last gave.
#[derive(Debug, Default)]
pub(crate) struct PathMeter {
    ring: Cost,
    /// Zero-copy's figure per size class.
    zero_copy: [Cost; CLASSES],
    /// When the last sample ended, and on which path.
    last_end: Option<(Instant, Path)>,
    /// Per size class: zero-copy delivered faster, by the figures so far (ring until
    /// measured so).
    zero_copy_faster: [bool; CLASSES],
    /// When the last sample ended ([`process_nanos`]): a large put of this end's after
    /// it ran between two samples.
    last_sample_at: u64,
    /// The advice word last posted (0: none yet, which the sender reads as "ring").
    posted: u64,
}

impl PathMeter {
    /// A copy of `bytes` out of the ring ran from `start` to now; `own` is what this
    /// end's sender did lately. Returns the advice word to post, if it changed.
    ///
    /// The byte costs both copies only when this end's large puts run between the
    /// copies out, as when both ends send at once (a put before a reply's first copy,
    /// a ping-pong, shares no time with the copies): the copy out plus a copy into
    /// a ring at the cost this end's sender measured, or [`BOTH_WAYS_PCT`] of the copy
    /// out before it measured one. Its own puts may go zero-copy meanwhile; a ring
    /// copy in then still costs the peer's core about as much.
    pub(crate) fn ring_copied(
        &mut self,
        bytes: usize,
        start: Instant,
        own: OwnPuts,
    ) -> Option<u64> {
        self.ring_copied_until(bytes, start, Instant::now(), own)
    }

    /// [`ring_copied`](Self::ring_copied) of a copy that ended at `now`.
    fn ring_copied_until(
        &mut self,
        bytes: usize,
        start: Instant,
        now: Instant,
        own: OwnPuts,
    ) -> Option<u64> {
        let (from, put_between) = self.span(Path::Ring, start, now, own.large_at);
        let both_ways = put_between
            && process_nanos().saturating_sub(own.large_at) <= BOTH_WAYS_WITHIN.as_nanos() as u64;
        let took = now.saturating_duration_since(from);
        let cost = if !both_ways {
            took
        } else if own.ring_copy_at != 0 {
            let copy_in = own.ring_copy_ps.saturating_mul(bytes as u64) / 1000;
            took.saturating_add(Duration::from_nanos(copy_in))
        } else {
            took.saturating_mul(BOTH_WAYS_PCT) / 100
        };
        self.ring.offer(bytes, cost, now);
        self.advise(now)
    }

    /// A zero-copy read step of `bytes` of a `transfer`-byte transfer ran from
    /// `start` (its reads posted) to now (seen complete); `put_at` is when this end
    /// last put a large buffer ([`OwnPuts::large_at`]). Returns the advice word to
    /// post, if it changed.
    pub(crate) fn zero_copy_read(
        &mut self,
        bytes: usize,
        transfer: usize,
        start: Instant,
        put_at: u64,
    ) -> Option<u64> {
        let now = Instant::now();
        let (from, _) = self.span(Path::ZeroCopy, start, now, put_at);
        self.zero_copy[class_of(transfer)].offer(bytes, now.saturating_duration_since(from), now);
        self.advise(now)
    }

    /// The time a sample on `path` that ran from `start` to `now` counts from, and
    /// whether this end put large data since the last sample without that time
    /// being counted.
    ///
    /// A sample right after one on the same path (within [`BACK_TO_BACK`]) counts
    /// from that one's end: in a stream the wait between two pieces is the path's
    /// (the ring's sender copying in, zero-copy's confirmation and next
    /// announcement), so each figure is what the path delivers. Not when this end
    /// put large data in between (a ping-pong's reply: the gap is a round trip, no
    /// cost of the path) or the last sample was on the other path, except for ring
    /// copies whose gap is at most [`INTERLEAVED_GAPS`] copies long: pieces of one
    /// incoming message with this end's own copies in between, as when both ends
    /// stream at once. The gap then holds this core's copy into the peer's ring and
    /// the waits for room, which is what a ring byte costs both ways.
    fn span(&mut self, path: Path, start: Instant, now: Instant, put_at: u64) -> (Instant, bool) {
        let put_between = put_at != 0 && put_at >= self.last_sample_at;
        let (from, chained) = match self.last_end {
            Some((end, last)) if last == path && end <= start => {
                let gap = start.duration_since(end);
                let interleaved = path == Path::Ring
                    && gap <= now.saturating_duration_since(start) * INTERLEAVED_GAPS;
                if gap <= BACK_TO_BACK && (!put_between || interleaved) {
                    (end, true)
                } else {
                    (start, false)
                }
            }
            _ => (start, false),
        };
        self.last_end = Some((now, path));
        self.last_sample_at = process_nanos();
        (from, put_between && !chained)
    }

    fn advise(&mut self, now: Instant) -> Option<u64> {
        let keep = 100 - HYSTERESIS_PCT;
        let ring = self.ring.ps_per_byte();
        for (faster, zc) in self.zero_copy_faster.iter_mut().zip(&self.zero_copy) {
            if let (Some(ring), Some(zc)) = (ring, zc.ps_per_byte()) {
                if *faster && ring.saturating_mul(100) < zc.saturating_mul(keep) {
                    *faster = false;
                } else if !*faster && zc.saturating_mul(100) < ring.saturating_mul(keep) {
                    *faster = true;
                }
            }
        }
        // The path each class takes next: the one under probe, else the faster one,
        // unless the other is due a probe. A ring probe (its figure serves every
        // class) sends every class by the ring, pausing any zero-copy probe of a
        // class that may see no traffic for long. Zero-copy faster for a smaller
        // class, by a fresh figure, holds for every larger one whatever its own
        // figure says (see CARRIED).
        // Class 0 is never timed, and its bit says "ring" (see BELOW): a ring
        // probe leaves it as it is.
        let below =
            u64::from(self.zero_copy[1].ps_per_byte().is_some() && !self.zero_copy_faster[1]);
        let wants = if self.ring.probe.is_some() {
            below
        } else {
            let ring_stale = self.ring.stale(now);
            let mut bits = below;
            let mut ring_due = false;
            let mut carried = false;
            for (k, zc) in self.zero_copy.iter_mut().enumerate().skip(1) {
                let zero_copy = if zc.probe.is_some() {
                    true
                } else if self.zero_copy_faster[k] || carried {
                    ring_due |= ring_stale;
                    true
                } else if zc.stale(now) {
                    zc.start_probe();
                    true
                } else {
                    false
                };
                carried |= self.zero_copy_faster[k] && !zc.stale(now);
                bits |= u64::from(zero_copy) << k;
            }
            if ring_due {
                self.ring.start_probe();
                below
            } else {
                bits
            }
        };
        // Nothing new to say (the sender reads 0, no advice yet, as "ring" from
        // MEASURE_MIN and zero-copy below it).
        if self.posted & ((1 << CLASS_BITS) - 1) == wants {
            return None;
        }
        let changes = (self.posted >> CLASS_BITS) + 1;
        self.posted = (changes << CLASS_BITS) | wants;
        Some(self.posted)
    }

    /// The advice last posted asks for zero-copy for a MiB.
    #[cfg(test)]
    fn advises_zero_copy(&self) -> bool {
        self.posted & advice_bit(1 << 20) != 0
    }

    /// Feeds a sample as if it had taken `took` with no idle gap before it.
    #[cfg(test)]
    fn sample(&mut self, zero_copy: bool, bytes: usize, took: Duration) -> Option<u64> {
        let now = Instant::now();
        let cost = if zero_copy {
            &mut self.zero_copy[class_of(bytes)]
        } else {
            &mut self.ring
        };
        cost.offer(bytes, took, now);
        self.advise(now)
    }

    /// Feeds `count` samples of a MiB each at `gbps` GB/s; returns the last word
    /// posted meanwhile.
    #[cfg(test)]
    fn feed(&mut self, zero_copy: bool, gbps: u64, count: usize) -> Option<u64> {
        let mib = 1 << 20;
        let mut last = None;
        for _ in 0..count {
            let took = Duration::from_nanos(mib as u64 / gbps);
            last = self.sample(zero_copy, mib, took).or(last);
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;
    /// Samples of a MiB that complete a probe.
    const PROBE: usize = (PROBE_BYTES >> 20) as usize;

    /// Nanoseconds to copy `bytes` at `gbps` GB/s.
    fn at(gbps: u64, bytes: usize) -> Duration {
        Duration::from_nanos(bytes as u64 / gbps)
    }

    #[test]
    fn a_figure_is_the_median_of_its_last_samples_as_they_come() {
        let mut c = Cost::default();
        assert_eq!(c.ps_per_byte(), None);
        // Repeats and a run of equal values included: the ordered copy must drop
        // exactly the oldest sample each time.
        let mut x: u64 = 7;
        for i in 0..200u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let ps = if (40..60).contains(&i) {
                500
            } else {
                100 + (x >> 58) * 50
            };
            c.record(1000, Duration::from_nanos(ps));
            let mut held = c.recent[..c.held].to_vec();
            held.sort_unstable();
            assert_eq!(
                c.ps_per_byte(),
                Some(u64::from(held[held.len() / 2])),
                "sample {i}"
            );
            assert_eq!(c.held, (i as usize + 1).min(SAMPLES));
        }
    }

    /// Below MEASURE_MIN the path follows the smallest measured class's verdict
    /// (BELOW): zero-copy before any, the ring once the ring won there, zero-copy
    /// again once zero-copy wins.
    #[test]
    fn sizes_below_the_meter_follow_the_smallest_measured_class() {
        let (small, measured) = (16 << 10, 48 << 10);
        assert_eq!(class_of(measured), 1);
        assert!(
            advises_zero_copy(0, small),
            "no advice yet: zero-copy below"
        );
        assert!(
            !advises_zero_copy(0, measured),
            "no advice yet: the ring above"
        );
        let mut m = PathMeter::default();
        // The ring at 20 GB/s, zero-copy at 5 for the class: the ring wins there,
        // and below it.
        for _ in 0..400 {
            m.sample(false, measured, at(20, measured));
            m.sample(true, measured, at(5, measured));
        }
        assert!(!m.zero_copy_faster[1]);
        assert!(!advises_zero_copy(m.posted, measured));
        assert!(
            !advises_zero_copy(m.posted, small),
            "the ring's verdict carried down"
        );
        // Zero-copy turns faster at 48 KiB: 16 KiB follows.
        for _ in 0..400 {
            m.sample(false, measured, at(5, measured));
            m.sample(true, measured, at(20, measured));
        }
        assert!(m.zero_copy_faster[1]);
        assert!(advises_zero_copy(m.posted, measured));
        assert!(advises_zero_copy(m.posted, small));
    }

    #[test]
    fn the_first_ring_figure_asks_for_a_zero_copy_probe() {
        let mut m = PathMeter::default();
        let w = m.feed(false, 30, 1).expect("zero-copy was never measured");
        assert_eq!(w & advice_bit(MIB), advice_bit(MIB));
        // Further ring figures do not repeat the request.
        assert_eq!(m.feed(false, 30, 4), None);
    }

    #[test]
    fn a_probe_lasts_its_bytes_and_measures_only_their_second_half() {
        let mut m = PathMeter::default();
        m.feed(false, 10, 1);
        assert!(m.advises_zero_copy());
        // Cold first transfers, slow enough to lose, are left out.
        assert_eq!(m.feed(true, 1, PROBE / 2), None);
        assert!(m.advises_zero_copy(), "the probe is still under way");
        // The warm half is faster than the ring: zero-copy stays.
        assert_eq!(m.feed(true, 20, PROBE / 2), None);
        assert!(m.advises_zero_copy());
        assert!(m.zero_copy[class_of(MIB)].probe.is_none());
    }

    #[test]
    fn a_probe_of_large_transfers_takes_several_samples() {
        let mut m = PathMeter::default();
        m.feed(false, 10, 1);
        let big = 4 * MIB;
        let class = class_of(big);
        // The first transfer (cold) is left out; the probe needs PROBE_SAMPLES.
        m.sample(true, big, at(1, big));
        assert_eq!(m.zero_copy[class].held, 0);
        for i in 2..=PROBE_SAMPLES {
            assert!(
                m.zero_copy[class].probe.is_some(),
                "sample {i}: probe ended"
            );
            m.sample(true, big, at(20, big));
        }
        assert!(m.zero_copy[class].probe.is_none());
        assert_eq!(m.zero_copy[class].held, PROBE_SAMPLES as usize - 1);
        assert!(m.posted & advice_bit(big) != 0, "the warm reads win");
    }

    #[test]
    fn a_fast_ring_keeps_the_ring() {
        // Fast hand-off, one end sending: the ring delivers at 15 GB/s (both copies
        // overlap), the kernel's single copy at 8.
        let mut m = PathMeter::default();
        m.feed(false, 15, 1);
        let w = m.feed(true, 8, PROBE).expect("back to the ring");
        assert_eq!(w & advice_bit(MIB), 0);
        assert_eq!(m.feed(false, 15, 20), None);
    }

    #[test]
    fn a_slow_ring_switches_to_zero_copy_and_probes_the_ring_later() {
        // Slow hand-off: the ring delivers at 6 GB/s, the single copy at 12.
        let mut m = PathMeter::default();
        m.feed(false, 6, 1);
        assert_eq!(m.feed(true, 12, PROBE), None);
        assert!(m.advises_zero_copy());
        // The ring's figure ages: the next zero-copy sample asks for a ring probe,
        // and the ring, still slow, hands back to zero-copy when it is done.
        m.ring.fresh_until = Some(Instant::now());
        let w = m.feed(true, 12, 1).expect("a ring probe is due");
        assert_eq!(w & advice_bit(MIB), 0);
        let w = m.feed(false, 6, PROBE).expect("zero-copy again");
        assert_eq!(w & advice_bit(MIB), advice_bit(MIB));
    }

    /// What this end's sender did: a large put just now (when `put`), and its ring
    /// copies in at `copy_in_ps` a byte (0: none timed yet).
    fn own(put: bool, copy_in_ps: u64) -> OwnPuts {
        let now = process_nanos().max(1);
        OwnPuts {
            large_at: if put { now } else { 0 },
            ring_copy_at: if copy_in_ps > 0 { now } else { 0 },
            ring_copy_ps: copy_in_ps,
        }
    }

    #[test]
    fn a_ring_byte_costs_more_while_this_end_sends_too() {
        // The ring copies out at 10 GB/s (100 ps a byte), zero-copy reads at 8 (125):
        // one way the ring wins; both ways a ring byte costs its copy in too, at
        // 150% of the copy out before the sender timed one, else as timed: 10 ps a
        // byte keeps the ring, 60 does not.
        for (both_ways, copy_in_ps, zero_copy) in [
            (false, 0, false),
            (false, 60, false),
            (true, 0, true),
            (true, 10, false),
            (true, 60, true),
        ] {
            let mut m = PathMeter::default();
            for _ in 0..4 {
                // Both ways: this end puts between every two copies out.
                m.ring_copied(
                    MIB,
                    Instant::now() - at(10, MIB),
                    own(both_ways, copy_in_ps),
                );
            }
            m.feed(true, 8, PROBE);
            assert_eq!(
                m.advises_zero_copy(),
                zero_copy,
                "both ways: {both_ways}, copy in {copy_in_ps} ps a byte"
            );
        }
    }

    #[test]
    fn a_ring_stream_both_ways_counts_the_own_copies_between() {
        // Copies out of 1 MiB taking 200 us, this end putting between them; the
        // sender timed its copies in at 10 ps a byte.
        let copy = Duration::from_micros(200);
        let ps = |d: Duration| (d.as_nanos() * 1000 / MIB as u128) as u32;
        // 100 us gaps: one stream both ways, the gaps count. 600 us gaps (within
        // BACK_TO_BACK), longer than two copies: a ping-pong's round trip, not
        // counted; the copy costs its time and the timed copy in.
        assert!(copy * 3 <= BACK_TO_BACK);
        for (gap, expect) in [
            (copy / 2, ps(copy + copy / 2)),
            (
                copy * 3,
                ps(copy + Duration::from_nanos(10 * MIB as u64 / 1000)),
            ),
        ] {
            let mut m = PathMeter::default();
            let mut t = Instant::now();
            for i in 0..3 {
                let start = t + gap;
                let end = start + copy;
                m.ring_copied_until(MIB, start, end, own(true, 10));
                if i > 0 {
                    let got = m.ring.recent[i];
                    assert!(
                        got.abs_diff(expect) <= 2,
                        "gap {gap:?}: {got} ps, not {expect}"
                    );
                }
                t = end;
            }
        }
    }

    #[test]
    fn the_copy_in_meter_reports_the_median() {
        // A million bytes in 100 us: 100 ps a byte.
        let (bytes, took) = (1_000_000, Duration::from_micros(100));
        let mut c = CopyInMeter::default();
        assert_eq!(c.offer(bytes, took), 100);
        // One stalled copy does not move the figure.
        c.offer(bytes, took);
        assert_eq!(c.offer(bytes, Duration::from_millis(5)), 100);
    }

    #[test]
    fn a_put_before_a_reply_weighs_only_its_first_copy() {
        // A ping-pong: this end put its message, then copies out the reply in
        // pieces; the put shares no time with the copies after the first.
        with_short_gaps(|| {
            let mut m = PathMeter::default();
            let put = own(true, 0);
            for _ in 0..4 {
                let t = Instant::now();
                m.ring_copied(MIB, t - at(10, MIB), put);
                // The meter reads the clock itself: a preemption inside the call
                // would lengthen the copy it measures.
                if !quick(t) {
                    return false;
                }
            }
            // The first copy at BOTH_WAYS_PCT, the three after it at their own time.
            let one_way = at(10, MIB).as_nanos() as u64 * 1000 / MIB as u64;
            let both = one_way * u64::from(BOTH_WAYS_PCT) / 100;
            for (i, ps) in m.ring.recent[..4].iter().enumerate() {
                let expect = if i == 0 { both } else { one_way };
                assert!(
                    u64::from(*ps).abs_diff(expect) <= 2 + QUICK_PS,
                    "copy {i}: {ps} ps a byte, not {expect}"
                );
            }
            true
        });
    }

    /// Sleeps the 300 us that stand for a gap between two samples; false when the
    /// sleep overran half of [`BACK_TO_BACK`] (a loaded host), so that the samples
    /// around it would not count as one stream and the case must be run again.
    fn gap() -> bool {
        let t = Instant::now();
        std::thread::sleep(Duration::from_micros(300));
        t.elapsed() < BACK_TO_BACK / 2
    }

    /// Most a call into the meter may take for its figure to be checked: the meter
    /// reads the clock itself, and each microsecond past the `Instant` the test
    /// handed it adds ~1 ps a byte to a MiB's figure ([`QUICK_PS`]).
    const QUICK: Duration = Duration::from_micros(5);
    /// What [`QUICK`] can add to a MiB's figure, in ps a byte.
    const QUICK_PS: u64 = 5;

    /// True when a call into the meter that began at `t` took under [`QUICK`].
    fn quick(t: Instant) -> bool {
        t.elapsed() < QUICK
    }

    /// Runs `case` until one run had only short gaps and quick calls (it returns
    /// [`gap`]'s and [`quick`]'s verdicts and-ed), at most 1000 times: a loaded
    /// host's preemptions stretch sleeps and calls, and the figures with them.
    fn with_short_gaps(mut case: impl FnMut() -> bool) {
        assert!(
            (0..1000).any(|_| case()),
            "no run of 1000 kept its 300 us sleeps under {BACK_TO_BACK:?}"
        );
    }

    #[test]
    fn a_gap_counts_only_after_a_sample_on_the_same_path() {
        with_short_gaps(|| {
            let mut m = PathMeter::default();
            m.zero_copy_read(MIB, MIB, Instant::now(), 0);
            let short = gap();
            // A ring copy after a zero-copy step: the gap was zero-copy's.
            let t = Instant::now();
            m.ring_copied(MIB, t, OwnPuts::default());
            if !(short && quick(t)) {
                return false;
            }
            // (Counted from the zero-copy step's end, it would be 286 or more.)
            assert!(
                u64::from(m.ring.recent[0]) <= QUICK_PS,
                "{:?}",
                m.ring.recent
            );
            if !gap() {
                return false;
            }
            // A ring copy after a ring copy: the wait for the sender is the ring's
            // (300 us over a MiB is 286 ps a byte).
            m.ring_copied(MIB, Instant::now(), OwnPuts::default());
            assert!(m.ring.recent[1] >= 286, "{:?}", m.ring.recent);
            true
        });
    }

    #[test]
    fn zero_copy_counts_the_gap_before_a_step_only_in_a_stream() {
        for put_between in [false, true] {
            with_short_gaps(|| {
                let mut m = PathMeter::default();
                let first = Instant::now();
                m.zero_copy_read(MIB, MIB, first, 0);
                // 300 us pass before the next step starts; it then takes ~nothing.
                if !gap() {
                    return false;
                }
                let put_at = if put_between {
                    process_nanos().max(1)
                } else {
                    0
                };
                m.zero_copy_read(MIB, MIB, Instant::now(), put_at);
                // The second sample (300 us over a MiB is 286 ps a byte).
                let ps = m.zero_copy[class_of(MIB)].recent[1];
                if put_between {
                    assert!(ps < 286, "{ps} ps a byte counted a ping-pong's round trip");
                } else {
                    assert!(ps >= 286, "{ps} ps a byte left out a stream's wait");
                }
                true
            });
        }
    }

    #[test]
    fn size_classes_split_at_each_power_of_two_from_32_kib_to_4_mib() {
        for (len, class) in [
            (1, 0),
            (16 << 10, 0),
            ((32 << 10) - 1, 0),
            (32 << 10, 1),
            ((64 << 10) - 1, 1),
            (64 << 10, 2),
            (256 << 10, 4),
            (MIB - 1, 5),
            (MIB, 6),
            ((4 * MIB) - 1, 7),
            (4 * MIB, 8),
            (usize::MAX, 8),
        ] {
            assert_eq!(class_of(len), class, "{len} bytes");
        }
    }

    #[test]
    fn each_size_class_follows_its_own_zero_copy_figure() {
        // The ring at 8 GB/s for every size; zero-copy at 6 GB/s for 64 KiB
        // transfers (a round trip each) and at 16 for 1 MiB.
        let mut m = PathMeter::default();
        let small = 64 << 10;
        m.feed(false, 8, 1);
        for _ in 0..2 * PROBE * 16 {
            m.sample(true, small, at(6, small));
        }
        m.feed(true, 16, PROBE);
        assert_eq!(m.posted & advice_bit(small), 0, "64 KiB stays on the ring");
        assert!(m.advises_zero_copy(), "1 MiB goes zero-copy");
        assert!(!m.zero_copy_faster[class_of(small)] && m.zero_copy_faster[class_of(MIB)]);
    }

    #[test]
    fn zero_copy_faster_for_a_smaller_class_holds_for_the_larger_ones_while_fresh() {
        // The ring at 8 GB/s; 1 MiB transfers read at 16 GB/s; then 4 MiB ones
        // probe at 4 GB/s (a short run's first transfers): zero-copy still, carried
        // from 1 MiB. Once the 1 MiB figure is stale, 4 MiB's own figure decides.
        let big = 4 * MIB;
        let mut m = PathMeter::default();
        m.feed(false, 8, 1);
        m.feed(true, 16, PROBE);
        assert!(m.zero_copy_faster[class_of(MIB)]);
        for _ in 0..PROBE_SAMPLES + 1 {
            m.sample(true, big, at(4, big));
        }
        assert!(
            !m.zero_copy_faster[class_of(big)],
            "its own figure says ring"
        );
        assert!(m.posted & advice_bit(big) != 0, "carried from 1 MiB");
        m.zero_copy[class_of(MIB)].fresh_until = Some(Instant::now());
        m.ring.fresh_until = Some(Instant::now() + PROBE_AFTER);
        m.sample(true, big, at(4, big));
        assert_eq!(m.posted & advice_bit(big), 0, "the 1 MiB figure went stale");
    }

    #[test]
    fn near_equal_costs_do_not_flip_the_advice() {
        let mut m = PathMeter::default();
        m.feed(false, 12, 1);
        m.feed(true, 12, PROBE);
        let first = m.advises_zero_copy();
        // 8% either way stays inside the hysteresis.
        for gbps in [11, 13, 12, 11, 13] {
            m.feed(first, gbps, 1);
            assert_eq!(m.advises_zero_copy(), first);
        }
    }

    #[test]
    fn every_posted_word_differs_from_the_last_and_the_advice_follows_the_regime() {
        let mut m = PathMeter::default();
        let mut last = 0;
        for round in 0..6 {
            let (ring, zc) = if round % 2 == 0 { (40, 12) } else { (4, 12) };
            for _ in 0..64 {
                for (zero_copy, gbps) in [(false, ring), (true, zc)] {
                    if let Some(w) = m.feed(zero_copy, gbps, 1) {
                        assert_ne!(w, last);
                        last = w;
                    }
                }
            }
            assert_eq!(m.advises_zero_copy(), ring < zc, "round {round}");
        }
    }
}
