//! Choosing between the ring and zero-copy for large buffers in memory the fabric
//! reaches only at a cost (on the emulated fabric, heap memory read with
//! `process_vm_readv`), by measurement.
//!
//! Neither path wins on every host or in every phase of one: the ring's two copies
//! move each line between the cores twice and run at twice the kernel's single
//! copy when a cross-core hand-off is cheap, at half to two thirds of it when it is
//! dear, and when both ends send at once each core makes two copies per byte
//! instead of one (bench/notebook/2026-11.md, "the heap path's two regimes"). The
//! receiver makes the copies of both paths, so it measures them: each large copy
//! out of the ring, and each zero-copy read step, per byte. A zero-copy byte costs
//! its read. A ring byte costs our copy out and the sender's copy in, taken as dear
//! as ours (the same lines between the same cores): while only the peer sends, the
//! two copies run at once on two cores and the byte costs one copy's time; while
//! this end sends large data on the connection too, its core makes both kinds of
//! copy and the byte costs up to two ([`BOTH_WAYS_PCT`]). The receiver tells the
//! sender which path costs less in a control word ([`CtrlWord::PathAdvice`]), and the sender, which chooses
//! the path of each buffer, follows it for buffers from `Link::zc_adaptive_min` up.
//!
//! A path not taken is not measured, so the meter asks for it now and then: when
//! the other path's figure is missing or older than [`PROBE_AFTER`], the advice
//! names it until [`PROBE_BYTES`] went that way, the second half of them measured.
//!
//! [`CtrlWord::PathAdvice`]: crate::ring::memory::CtrlWord::PathAdvice

use std::time::{Duration, Instant};

/// Smallest copy timed: the clock reads (~20 ns each through the vDSO) stay under
/// a hundredth of the copy.
pub(crate) const MEASURE_MIN: usize = 32 << 10;

/// Age of the other path's figure after which it is measured again.
pub(crate) const PROBE_AFTER: Duration = Duration::from_millis(250);

/// Bytes a probe of a path moves: the first half warms it up, the second half is
/// measured. Every [`PROBE_AFTER`] this much goes by the slower path, under 1% of
/// what a stream of large messages moves meanwhile.
const PROBE_BYTES: u64 = 8 << 20;

/// This end counts as sending large data on the connection when its last large
/// put is at most this old.
pub(crate) const BOTH_WAYS_WITHIN: Duration = Duration::from_millis(1);

/// Bytes a path's figure covers before older samples weigh half.
const WINDOW_BYTES: u64 = 16 << 20;

/// Nanoseconds since this process first asked, for timestamps kept in atomics.
pub(crate) fn process_nanos() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    epoch.elapsed().as_nanos().min(u64::MAX as u128) as u64
}

/// Zero-copy steps at most this far apart count as one stream: the time between
/// them is the path's (see [`PathMeter::zero_copy_read`]).
const BACK_TO_BACK: Duration = Duration::from_millis(1);

/// A ring byte's cost while this end sends large data too, in percent of our copy
/// out: each core then makes the copy into its outgoing ring and the copy out of its
/// incoming one, but not back to back (a core waits for its peer now and then, and
/// the copies overlap it). 200 (no overlap) kept 1 MiB exchanges on single copy
/// where the ring was 1.2x faster; 150 is the middle (bench/notebook/2026-11.md).
const BOTH_WAYS_PCT: u32 = 150;

/// The advice word's bit that asks for zero-copy; the bits above count the advice
/// changes, so that every change is a new value.
pub(crate) const ADVICE_ZERO_COPY: u64 = 1;

/// A switch must save at least this share of the time (percent), so noise around
/// equal rates does not flip the advice back and forth.
const HYSTERESIS_PCT: u64 = 10;

/// One path's recent delivery: nanoseconds over bytes, the older half of them
/// halved whenever the bytes pass [`WINDOW_BYTES`].
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    nanos: u64,
    bytes: u64,
    at: Option<Instant>,
    /// Bytes seen by the probe under way on this path, if one is.
    probe: Option<u64>,
}

impl Cost {
    /// A sample; during a probe the first half of [`PROBE_BYTES`] is left out (the
    /// first transfers on a path not taken for a while register buffers, fault pages
    /// in, grow a ring: not what the path costs from then on).
    fn offer(&mut self, bytes: usize, took: Duration, now: Instant) {
        match self.probe {
            None => self.add(bytes, took, now),
            Some(seen) => {
                let seen = seen.saturating_add(bytes as u64);
                if seen > PROBE_BYTES / 2 {
                    self.add(bytes, took, now);
                }
                self.probe = (seen < PROBE_BYTES).then_some(seen);
            }
        }
    }

    fn add(&mut self, bytes: usize, took: Duration, now: Instant) {
        if self.bytes >= WINDOW_BYTES {
            self.nanos /= 2;
            self.bytes /= 2;
        }
        self.nanos = self
            .nanos
            .saturating_add(took.as_nanos().min(u64::MAX as u128) as u64);
        self.bytes = self.bytes.saturating_add(bytes as u64);
        self.at = Some(now);
    }

    /// Picoseconds per byte, once measured.
    fn ps_per_byte(&self) -> Option<u64> {
        (self.bytes > 0).then(|| self.nanos.saturating_mul(1000) / self.bytes)
    }

    fn stale(&self, now: Instant) -> bool {
        self.at
            .is_none_or(|at| now.saturating_duration_since(at) >= PROBE_AFTER)
    }
}

/// The receiver's measurements and the advice it last gave.
#[derive(Debug, Default)]
pub(crate) struct PathMeter {
    ring: Cost,
    zero_copy: Cost,
    /// When the last zero-copy step ended.
    zero_copy_end: Option<Instant>,
    /// Zero-copy delivered faster, by the figures so far (ring until measured so).
    zero_copy_faster: bool,
    /// The advice word last posted (0: none yet, which the sender reads as "ring").
    posted: u64,
}

impl PathMeter {
    /// A copy of `bytes` out of the ring took `took`; `both_ways` says this end
    /// sent large data on the connection meanwhile. Returns the advice word to post,
    /// if it changed.
    pub(crate) fn ring_copied(
        &mut self,
        bytes: usize,
        took: Duration,
        both_ways: bool,
    ) -> Option<u64> {
        let now = Instant::now();
        let cost = if both_ways {
            took.saturating_mul(BOTH_WAYS_PCT) / 100
        } else {
            took
        };
        self.ring.offer(bytes, cost, now);
        self.advise(now)
    }

    /// A zero-copy read step of `bytes` ran from `start` (its reads posted) to now
    /// (seen complete). Returns the advice word to post, if it changed.
    pub(crate) fn zero_copy_read(&mut self, bytes: usize, start: Instant) -> Option<u64> {
        let now = Instant::now();
        // Back to back, a transfer waits for the one before it to be confirmed and
        // the next announced (the ring pipelines instead): that wait is the path's.
        let from = match self.zero_copy_end {
            Some(end) if end <= start && start.duration_since(end) <= BACK_TO_BACK => end,
            _ => start,
        };
        self.zero_copy_end = Some(now);
        self.zero_copy
            .offer(bytes, now.saturating_duration_since(from), now);
        self.advise(now)
    }

    fn advise(&mut self, now: Instant) -> Option<u64> {
        if let (Some(ring), Some(zc)) = (self.ring.ps_per_byte(), self.zero_copy.ps_per_byte()) {
            let keep = 100 - HYSTERESIS_PCT;
            if self.zero_copy_faster && ring.saturating_mul(100) < zc.saturating_mul(keep) {
                self.zero_copy_faster = false;
            } else if !self.zero_copy_faster && zc.saturating_mul(100) < ring.saturating_mul(keep) {
                self.zero_copy_faster = true;
            }
        }
        // The path to take next: the one under probe, else the faster one, unless
        // the other is due a probe.
        let zero_copy = if self.zero_copy.probe.is_some() {
            true
        } else if self.ring.probe.is_some() {
            false
        } else {
            let other = if self.zero_copy_faster {
                &mut self.ring
            } else {
                &mut self.zero_copy
            };
            if other.stale(now) {
                other.probe = Some(0);
                !self.zero_copy_faster
            } else {
                self.zero_copy_faster
            }
        };
        let posted_zero_copy = self.posted & ADVICE_ZERO_COPY != 0;
        // Nothing new to say (the sender reads 0, no advice yet, as "ring").
        if posted_zero_copy == zero_copy {
            return None;
        }
        let changes = (self.posted >> 1) + 1;
        self.posted = (changes << 1) | u64::from(zero_copy);
        Some(self.posted)
    }

    /// The advice last posted asks for zero-copy.
    #[cfg(test)]
    fn advises_zero_copy(&self) -> bool {
        self.posted & ADVICE_ZERO_COPY != 0
    }

    /// Feeds a sample as if it had taken `took` with no idle gap before it.
    #[cfg(test)]
    fn sample(&mut self, zero_copy: bool, bytes: usize, took: Duration) -> Option<u64> {
        let now = Instant::now();
        let cost = if zero_copy {
            &mut self.zero_copy
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
    fn the_first_ring_figure_asks_for_a_zero_copy_probe() {
        let mut m = PathMeter::default();
        let w = m.feed(false, 30, 1).expect("zero-copy was never measured");
        assert_eq!(w & ADVICE_ZERO_COPY, ADVICE_ZERO_COPY);
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
        assert!(m.zero_copy.probe.is_none());
    }

    #[test]
    fn a_fast_ring_keeps_the_ring() {
        // Fast hand-off, one end sending: the ring delivers at 15 GB/s (both copies
        // overlap), the kernel's single copy at 8.
        let mut m = PathMeter::default();
        m.feed(false, 15, 1);
        let w = m.feed(true, 8, PROBE).expect("back to the ring");
        assert_eq!(w & ADVICE_ZERO_COPY, 0);
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
        m.ring.at = Some(Instant::now() - PROBE_AFTER);
        let w = m.feed(true, 12, 1).expect("a ring probe is due");
        assert_eq!(w & ADVICE_ZERO_COPY, 0);
        let w = m.feed(false, 6, PROBE).expect("zero-copy again");
        assert_eq!(w & ADVICE_ZERO_COPY, ADVICE_ZERO_COPY);
    }

    #[test]
    fn a_ring_byte_costs_more_while_this_end_sends_too() {
        // The ring copies out at 10 GB/s, zero-copy reads at 8: one way the ring
        // wins, both ways (1.5 copies' time per byte) zero-copy does.
        for (both_ways, zero_copy) in [(false, false), (true, true)] {
            let mut m = PathMeter::default();
            m.ring_copied(MIB, at(10, MIB), both_ways);
            m.feed(true, 8, PROBE);
            assert_eq!(m.advises_zero_copy(), zero_copy, "both ways: {both_ways}");
        }
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
