//! Choosing between the ring and zero-copy for large buffers in memory the fabric
//! reaches only at a cost (on the emulated fabric, heap memory read with
//! `process_vm_readv`), by measurement.
//!
//! Neither path wins on every host or in every phase of one: the ring's two copies
//! move each line between the cores twice and run at twice the kernel's single
//! copy when a cross-core hand-off is cheap, at half to two thirds of it when it is
//! dear, and when both ends send at once each core makes two copies per byte
//! (bench/notebook/2026-11.md, "the heap path's two regimes"). The receiver sees
//! both paths deliver, so it measures them: for each large copy out of the ring and
//! each zero-copy read step, the time since the previous one ended (or since it
//! started, after an idle gap) per byte. That is the rate the connection delivers
//! at, whatever holds it back: the sender's copies into the ring (overlapping ours
//! when it has a core to itself, adding to ours when both ends send at once), a
//! transfer's rendezvous, our own copies. It tells the sender which path delivered
//! faster in a control word ([`CtrlWord::PathAdvice`]), and the sender, which
//! chooses the path of each buffer, follows it for buffers from
//! `Link::zc_adaptive_min` up.
//!
//! A path not taken is not measured, so the meter asks for it now and then: when
//! the other path's figure is missing or older than [`PROBE_AFTER`], the advice
//! names it until one transfer on it was timed.
//!
//! [`CtrlWord::PathAdvice`]: crate::ring::memory::CtrlWord::PathAdvice

use std::time::{Duration, Instant};

/// Smallest copy timed: the clock reads (~20 ns each through the vDSO) stay under
/// a hundredth of the copy.
pub(crate) const MEASURE_MIN: usize = 32 << 10;

/// Age of the other path's figure after which it is measured again.
pub(crate) const PROBE_AFTER: Duration = Duration::from_millis(250);

/// A pause longer than this between two timed copies is the application's, not the
/// path's: the next sample counts from its own start.
const IDLE_GAP: Duration = Duration::from_micros(200);

/// Bytes a path's figure covers before older samples weigh half.
const WINDOW_BYTES: u64 = 16 << 20;

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
}

impl Cost {
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
    /// When the last timed copy ended.
    last_end: Option<Instant>,
    /// Zero-copy delivered faster, by the figures so far (ring until measured so).
    zero_copy_faster: bool,
    /// The advice word last posted (0: none yet, which the sender reads as "ring").
    posted: u64,
}

impl PathMeter {
    /// A copy of `bytes` out of the ring ran from `start` to now. Returns the advice
    /// word to post, if it changed.
    pub(crate) fn ring_copied(&mut self, bytes: usize, start: Instant) -> Option<u64> {
        let (took, now) = self.interval(start);
        self.ring.add(bytes, took, now);
        self.advise(now)
    }

    /// A zero-copy read step of `bytes` ran from `start` (its reads posted) to now
    /// (seen complete). Returns the advice word to post, if it changed.
    pub(crate) fn zero_copy_read(&mut self, bytes: usize, start: Instant) -> Option<u64> {
        let (took, now) = self.interval(start);
        self.zero_copy.add(bytes, took, now);
        self.advise(now)
    }

    /// The time a copy that started at `start` accounts for: since the previous
    /// timed copy ended, unless that was before `start` by more than an idle gap.
    fn interval(&mut self, start: Instant) -> (Duration, Instant) {
        self.interval_at(start, Instant::now())
    }

    fn interval_at(&mut self, start: Instant, now: Instant) -> (Duration, Instant) {
        let from = match self.last_end {
            Some(end) if end <= start && start.duration_since(end) < IDLE_GAP => end,
            _ => start,
        };
        self.last_end = Some(now);
        (now.saturating_duration_since(from), now)
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
        // The path to take next: the faster one, unless the other is due a sample.
        let other_stale = if self.zero_copy_faster {
            self.ring.stale(now)
        } else {
            self.zero_copy.stale(now)
        };
        let zero_copy = self.zero_copy_faster != other_stale;
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
        self.last_end = None;
        let cost = if zero_copy {
            &mut self.zero_copy
        } else {
            &mut self.ring
        };
        cost.add(bytes, took, now);
        self.advise(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// Nanoseconds to copy `bytes` at `gbps` GB/s.
    fn at(gbps: u64, bytes: usize) -> Duration {
        Duration::from_nanos(bytes as u64 / gbps)
    }

    #[test]
    fn the_first_ring_figure_asks_for_a_zero_copy_sample() {
        let mut m = PathMeter::default();
        let w = m
            .sample(false, MIB, at(30, MIB))
            .expect("zero-copy was never measured");
        assert_eq!(w & ADVICE_ZERO_COPY, ADVICE_ZERO_COPY);
        // Further ring figures do not repeat the request.
        assert_eq!(m.sample(false, MIB, at(30, MIB)), None);
    }

    #[test]
    fn a_fast_ring_keeps_the_ring() {
        // Fast hand-off, one end sending: the ring delivers at 15 GB/s (both copies
        // overlap), the kernel's single copy at 8.
        let mut m = PathMeter::default();
        m.sample(false, MIB, at(15, MIB));
        let w = m.sample(true, MIB, at(8, MIB)).expect("back to the ring");
        assert_eq!(w & ADVICE_ZERO_COPY, 0);
        assert!(!m.advises_zero_copy());
        for _ in 0..20 {
            assert_eq!(m.sample(false, MIB, at(15, MIB)), None);
        }
    }

    #[test]
    fn a_slow_ring_switches_to_zero_copy_and_probes_the_ring_later() {
        // Slow hand-off (or both ends sending): the ring delivers at 6 GB/s.
        let mut m = PathMeter::default();
        m.sample(false, MIB, at(6, MIB));
        assert!(m.advises_zero_copy());
        assert_eq!(m.sample(true, MIB, at(12, MIB)), None);
        assert!(m.advises_zero_copy());
        // The ring's figure ages: a zero-copy sample after PROBE_AFTER asks for a
        // ring sample, and the ring, still slow, hands back to zero-copy.
        m.ring.at = Some(Instant::now() - PROBE_AFTER);
        let w = m
            .sample(true, MIB, at(12, MIB))
            .expect("a ring sample is due");
        assert_eq!(w & ADVICE_ZERO_COPY, 0);
        let w = m.sample(false, MIB, at(6, MIB)).expect("zero-copy again");
        assert_eq!(w & ADVICE_ZERO_COPY, ADVICE_ZERO_COPY);
    }

    #[test]
    fn near_equal_costs_do_not_flip_the_advice() {
        let mut m = PathMeter::default();
        m.sample(false, MIB, at(12, MIB));
        m.sample(true, MIB, at(12, MIB));
        let first = m.advises_zero_copy();
        // 8% either way stays inside the hysteresis.
        for gbps in [11, 13, 12, 11, 13] {
            m.sample(false, MIB, at(gbps, MIB));
            assert_eq!(m.advises_zero_copy(), first);
        }
    }

    #[test]
    fn a_sample_counts_from_the_last_copy_unless_the_application_paused() {
        let mut m = PathMeter::default();
        let t0 = Instant::now();
        let us = Duration::from_micros;
        assert_eq!(m.interval_at(t0, t0 + us(10)).0, us(10));
        // The next copy starts 50 us after the last ended: the wait is the path's
        // (for the sender's bytes, say).
        assert_eq!(m.interval_at(t0 + us(60), t0 + us(70)).0, us(60));
        // After an idle gap the sample counts from its own start.
        let start = t0 + us(70) + IDLE_GAP * 2;
        assert_eq!(m.interval_at(start, start + us(10)).0, us(10));
    }

    #[test]
    fn every_posted_word_differs_from_the_last() {
        let mut m = PathMeter::default();
        let mut last = 0;
        for round in 0..6 {
            let (ring, zc) = if round % 2 == 0 { (40, 12) } else { (4, 12) };
            for _ in 0..64 {
                if let Some(w) = m.sample(false, MIB, at(ring, MIB)) {
                    assert_ne!(w, last);
                    last = w;
                }
                if let Some(w) = m.sample(true, MIB, at(zc, MIB)) {
                    assert_ne!(w, last);
                    last = w;
                }
            }
        }
        assert!(
            last >> 1 >= 6,
            "the advice follows the regime: {} changes",
            last >> 1
        );
    }
}
