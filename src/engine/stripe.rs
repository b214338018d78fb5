//! Striping a zero-copy step across a connection's rails (seed 002, sec. 4.4-4.5):
//! how many bytes each rail reads, and, for adaptive striping, how the weights
//! follow the bandwidth each rail delivered.
//!
//! The receiver reads a step's stripes at the same time, one per rail, and notes
//! when each was posted and when its last read was seen complete. Adaptive striping
//! then applies the paper's equation 4 with the rails' measured rates: a rail that
//! moved `b` bytes in `t` delivered `b / t`, and its new weight is
//! `(1 - alpha) * w + alpha * (b / t) / sum(b_k / t_k)`. Stripes sized so by the
//! rails' rates finish together, which is what makes a striped step as short as it
//! can be. The first measured step replaces the starting weights outright (the
//! paper's equation 3: equal weights are a guess, not history). Seen completions are upper bounds (the poll may come late); when all are
//! late together the rates come out equal-ish and the weights barely move, never
//! worse than before (the paper's case 3). A weight never falls below
//! [`MIN_WEIGHT`], so that a rail that was slow goes on being measured and wins its
//! share back when it recovers (the paper's figure 20).
//!
//! A rail at that floor is *parked*: it reads nothing but every
//! [`PROBE_EVERY`]-th step's stripe. A rail whose stripes wait behind another
//! connection's traffic (a competing flow queued on the same link) takes that wait
//! however small its stripe is, and every step would wait for it; a probe now and
//! then is all the measuring such a rail needs to be taken back when it frees up.

use std::time::Duration;

use crate::config::{StripePolicy, MAX_RAILS};

/// The least weight adaptive striping leaves a rail: its stripes keep a measurable
/// size (1/32 of a 64 KiB step is 2 KiB).
pub const MIN_WEIGHT: f64 = 1.0 / 32.0;

/// A parked rail (at [`MIN_WEIGHT`]) reads one step in this many.
pub const PROBE_EVERY: u64 = 8;

/// The weights of a connection's rails and how they change.
#[derive(Clone, Debug)]
pub struct Striper {
    rails: usize,
    weights: [f64; MAX_RAILS],
    /// `Some(alpha)` for adaptive striping.
    alpha: Option<f64>,
    /// Steps whose measurements moved the weights.
    adjustments: u64,
    /// Steps split so far (parked rails read every [`PROBE_EVERY`]-th).
    splits: u64,
}

impl Striper {
    /// The weights `policy` starts `rails` rails with (1 ..= [`MAX_RAILS`]).
    ///
    /// ```
    /// use rdma_channel::config::StripePolicy;
    /// use rdma_channel::engine::stripe::Striper;
    /// let mut s = Striper::new(&StripePolicy::Weights(vec![4, 1]), 2);
    /// assert_eq!(s.weights(), &[0.8, 0.2]);
    /// let mut parts = [0; 8];
    /// s.split(1000, &mut parts);
    /// assert_eq!(&parts[..2], &[800, 200]);
    /// ```
    pub fn new(policy: &StripePolicy, rails: usize) -> Striper {
        let rails = rails.clamp(1, MAX_RAILS);
        let mut weights = [0.0; MAX_RAILS];
        let alpha = match policy {
            StripePolicy::Adaptive { alpha_percent } => {
                weights[..rails].fill(1.0 / rails as f64);
                Some(f64::from((*alpha_percent).clamp(1, 100)) / 100.0)
            }
            StripePolicy::Even => {
                weights[..rails].fill(1.0 / rails as f64);
                None
            }
            StripePolicy::Weights(w) => {
                for (i, slot) in weights[..rails].iter_mut().enumerate() {
                    *slot = f64::from(w.get(i).copied().unwrap_or(0));
                }
                let sum: f64 = weights[..rails].iter().sum();
                if sum > 0.0 {
                    weights[..rails].iter_mut().for_each(|w| *w /= sum);
                } else {
                    // Every weight of the rails in use is 0 (the list named others):
                    // rail 0 takes it all.
                    weights[0] = 1.0;
                }
                None
            }
        };
        Striper {
            rails,
            weights,
            alpha,
            adjustments: 0,
            splits: 0,
        }
    }

    /// The rails' weights (summing to 1).
    pub fn weights(&self) -> &[f64] {
        &self.weights[..self.rails]
    }

    /// How many steps moved the weights so far.
    pub fn adjustments(&self) -> u64 {
        self.adjustments
    }

    /// Splits `n` bytes by the weights into `parts` (one per rail; the rest are 0):
    /// each rail's share rounded down, the heaviest rail taking what rounding
    /// leaves, and a parked rail's share only on a probe step.
    pub fn split(&mut self, n: usize, parts: &mut [usize; MAX_RAILS]) {
        *parts = [0; MAX_RAILS];
        let probe = self.splits % PROBE_EVERY == PROBE_EVERY - 1;
        self.splits += 1;
        let heaviest = (0..self.rails)
            .max_by(|&a, &b| self.weights[a].total_cmp(&self.weights[b]))
            .unwrap_or(0);
        let mut given = 0;
        for r in (0..self.rails).filter(|&r| r != heaviest) {
            if self.alpha.is_some() && self.is_parked(r) && !probe {
                continue;
            }
            let share = (n as f64 * self.weights[r]) as usize;
            parts[r] = share.min(n - given);
            given += parts[r];
        }
        parts[heaviest] = n - given;
    }

    /// True for a rail adaptive striping holds at the least weight.
    fn is_parked(&self, rail: usize) -> bool {
        self.rails > 1 && self.weights[rail] <= MIN_WEIGHT.min(1.0 / self.rails as f64) + 1e-9
    }

    /// Feeds one striped step's measurements back (adaptive striping only): for
    /// each rail, the bytes it read and the time from posting its stripe to seeing
    /// it complete. A rail that read nothing keeps its weight's share; a step with
    /// fewer than two measured rails teaches nothing.
    pub fn feedback(&mut self, stripes: &[(usize, Duration)]) {
        let Some(alpha) = self.alpha else {
            return;
        };
        let mut rates = [0.0f64; MAX_RAILS];
        let mut measured = 0;
        let (mut rate_sum, mut weight_sum) = (0.0, 0.0);
        for (r, &(bytes, took)) in stripes.iter().enumerate().take(self.rails) {
            if bytes > 0 {
                rates[r] = bytes as f64 / took.as_secs_f64().max(1e-9);
                rate_sum += rates[r];
                weight_sum += self.weights[r];
                measured += 1;
            }
        }
        if measured < 2 || rate_sum <= 0.0 {
            return;
        }
        // The starting weights are a guess, not history: the first measured step
        // redistributes them completely (equation 3), later ones by alpha
        // (equation 4). Between two VMs, where a 4 MiB step took half a second,
        // halving the distance each step took four of them to come within 10%.
        let alpha = if self.adjustments == 0 { 1.0 } else { alpha };
        // The measured rails share what their weights held between them; an
        // unmeasured rail's weight stays as it is.
        for (r, rate) in rates.iter().enumerate().take(self.rails) {
            if *rate > 0.0 {
                let target = weight_sum * rate / rate_sum;
                self.weights[r] = (1.0 - alpha) * self.weights[r] + alpha * target;
            }
        }
        self.floor_and_normalise();
        self.adjustments += 1;
    }

    /// Raises weights below [`MIN_WEIGHT`] to it and scales the rest to sum to 1
    /// (repeated while the scaling takes another rail below the floor).
    fn floor_and_normalise(&mut self) {
        let w = &mut self.weights[..self.rails];
        let floor = MIN_WEIGHT.min(1.0 / w.len() as f64);
        let mut pinned = [false; MAX_RAILS];
        loop {
            let low = pinned.iter().filter(|&&p| p).count() as f64 * floor;
            let high: f64 = w
                .iter()
                .zip(&pinned)
                .filter(|(_, &p)| !p)
                .map(|(x, _)| *x)
                .sum();
            let scale = if high > 0.0 { (1.0 - low) / high } else { 0.0 };
            let mut more = false;
            for (x, p) in w.iter().zip(pinned.iter_mut()) {
                if !*p && *x * scale < floor {
                    *p = true;
                    more = true;
                }
            }
            if !more {
                for (x, p) in w.iter_mut().zip(&pinned) {
                    *x = if *p { floor } else { *x * scale };
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Simulated rails of the given rates (bytes a second): the time each stripe
    /// takes.
    fn step(s: &mut Striper, n: usize, rates: &[f64]) -> Vec<(usize, Duration)> {
        let mut parts = [0; MAX_RAILS];
        s.split(n, &mut parts);
        rates
            .iter()
            .enumerate()
            .map(|(r, rate)| (parts[r], Duration::from_secs_f64(parts[r] as f64 / rate)))
            .collect()
    }

    fn time_of(stripes: &[(usize, Duration)]) -> Duration {
        stripes.iter().map(|s| s.1).max().unwrap()
    }

    /// From equal weights, adaptive striping on a 4:1 pair reaches the best static
    /// split's step time within a few steps (the paper's figures 17-18).
    #[test]
    fn adaptive_weights_find_a_four_to_one_split() {
        let rates = [400e6, 100e6];
        let mut s = Striper::new(&StripePolicy::default(), 2);
        let best = time_of(&step(
            &mut Striper::new(&StripePolicy::Weights(vec![4, 1]), 2),
            4 << 20,
            &rates,
        ));
        let even = time_of(&step(&mut s, 4 << 20, &rates));
        for _ in 0..8 {
            let m = step(&mut s, 4 << 20, &rates);
            s.feedback(&m);
        }
        let now = time_of(&step(&mut s, 4 << 20, &rates));
        assert!((s.weights()[0] - 0.8).abs() < 0.01, "{:?}", s.weights());
        assert!(
            now.as_secs_f64() < best.as_secs_f64() * 1.02,
            "{now:?} vs best {best:?}"
        );
        assert!(even > best.mul_f64(2.0), "even striping is far off on 4:1");
        assert_eq!(s.adjustments(), 8);
        let mut parts = [0; MAX_RAILS];
        s.split(1000, &mut parts);
        assert_eq!(parts.iter().sum::<usize>(), 1000);
    }

    /// The first measured step replaces the equal starting weights outright.
    #[test]
    fn the_first_step_replaces_the_starting_guess() {
        let mut s = Striper::new(&StripePolicy::default(), 2);
        let m = step(&mut s, 4 << 20, &[400e6, 100e6]);
        s.feedback(&m);
        assert!((s.weights()[0] - 0.8).abs() < 1e-6, "{:?}", s.weights());
    }

    /// When one rail slows down (a competing flow takes half of it) the weights
    /// follow, and come back when it recovers (the paper's figure 20).
    #[test]
    fn adaptive_weights_follow_a_rail_that_slows_and_recovers() {
        let mut s = Striper::new(&StripePolicy::default(), 2);
        for rates in [[300e6, 300e6], [300e6, 150e6], [300e6, 300e6]] {
            for _ in 0..10 {
                let m = step(&mut s, 1 << 20, &rates);
                s.feedback(&m);
            }
            let want = rates[0] / (rates[0] + rates[1]);
            assert!(
                (s.weights()[0] - want).abs() < 0.01,
                "{:?} for {rates:?}",
                s.weights()
            );
        }
    }

    /// A rail that stalls keeps the least weight and is parked: it reads only on
    /// probe steps, and is taken back once a probe finds it fast again.
    #[test]
    fn a_stalled_rail_is_parked_and_probed_until_it_recovers() {
        let mut s = Striper::new(&StripePolicy::Adaptive { alpha_percent: 100 }, 3);
        for _ in 0..5 {
            let m = step(&mut s, 1 << 20, &[1e9, 1e9, 1e3]);
            s.feedback(&m);
        }
        assert!(
            (s.weights()[2] - MIN_WEIGHT).abs() < 1e-9,
            "{:?}",
            s.weights()
        );
        let mut reads = 0;
        for _ in 0..PROBE_EVERY {
            let mut parts = [0; MAX_RAILS];
            s.split(1 << 20, &mut parts);
            assert_eq!(parts.iter().sum::<usize>(), 1 << 20);
            reads += usize::from(parts[2] > 0);
        }
        assert_eq!(reads, 1, "one probe in {PROBE_EVERY} steps");
        // Fast again: the probes bring it back.
        for _ in 0..4 * PROBE_EVERY {
            let m = step(&mut s, 1 << 20, &[1e9, 1e9, 1e9]);
            s.feedback(&m);
        }
        assert!(s.weights()[2] > 0.3, "{:?}", s.weights());
    }

    #[test]
    fn static_policies_never_move() {
        for policy in [StripePolicy::Even, StripePolicy::Weights(vec![1, 3])] {
            let mut s = Striper::new(&policy, 2);
            let before = s.weights().to_vec();
            let m = step(&mut s, 1 << 20, &[1e9, 1e6]);
            s.feedback(&m);
            assert_eq!(s.weights(), &before[..]);
        }
        // Weights for rails not in use are dropped; all-zero ones leave it to rail 0.
        assert_eq!(
            Striper::new(&StripePolicy::Weights(vec![0, 5, 1]), 2).weights(),
            &[0.0, 1.0]
        );
        assert_eq!(
            Striper::new(&StripePolicy::Weights(vec![0, 0, 1]), 2).weights(),
            &[1.0, 0.0]
        );
    }

    proptest! {
        /// Whatever the measurements, the parts cover the step exactly and the
        /// weights stay a distribution with every rail at least at the floor.
        #[test]
        fn parts_cover_the_step_and_weights_stay_a_distribution(
            rails in 1usize..=MAX_RAILS,
            steps in proptest::collection::vec(
                (1usize..(64 << 20), proptest::collection::vec((0usize..(16 << 20), 0u64..10_000_000), MAX_RAILS)),
                1..20),
            alpha in 1u8..=100,
        ) {
            let mut s = Striper::new(&StripePolicy::Adaptive { alpha_percent: alpha }, rails);
            for (n, meas) in steps {
                let mut parts = [0; MAX_RAILS];
                s.split(n, &mut parts);
                prop_assert_eq!(parts.iter().sum::<usize>(), n);
                prop_assert!(parts[rails..].iter().all(|&p| p == 0));
                let m: Vec<(usize, Duration)> =
                    meas.iter().map(|&(b, ns)| (b, Duration::from_nanos(ns))).collect();
                s.feedback(&m);
                let sum: f64 = s.weights().iter().sum();
                prop_assert!((sum - 1.0).abs() < 1e-9, "{:?}", s.weights());
                let floor = MIN_WEIGHT.min(1.0 / rails as f64);
                prop_assert!(s.weights().iter().all(|&w| w >= floor - 1e-12 && w.is_finite()));
            }
        }
    }
}
