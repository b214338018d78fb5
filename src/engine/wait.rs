//! Waiting for progress without burning a core forever: spin, then yield, then sleep.
//!
//! Busy polling gives the lowest latency when every rank has a core; when there are
//! more ranks than cores a spinning rank steals the time its peer needs to make the
//! progress it waits for, so the wait yields and finally sleeps (seed 000, Liu, Wu,
//! Panda, *High Performance RDMA-Based MPI Implementation over InfiniBand*, ICS 2003,
//! sec. 4.7 discusses the same trade-off for polling sets).

use std::time::Duration;

use crate::config::{Config, WaitPolicy};
use crate::fabric::{Fabric, QueuePair};

/// Busy polls of a wait whose spinning would take the CPU its progress needs: then it
/// sleeps without yielding.
pub(crate) const CONTENDED_SPIN: u32 = 100;
/// Longest sleep of such a wait, unless configured lower: a message that lands
/// mid-sleep waits this long at most.
const CONTENDED_SLEEP_MAX: Duration = Duration::from_micros(50);
/// Longest block of a wait on wakes: bounds what no wake announces (the peer's
/// death seen by rdma_cm, a deadline), and the rare wake another thread took.
const WAKE_BLOCK_MAX: Duration = Duration::from_millis(1);

/// The CPUs this process may run on (its affinity mask and CPU quota).
pub(crate) fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The wait policy a connection on `fabric` uses: the configured one, except where
/// the fabric's work runs on this host's CPUs and this process has only one (a
/// one-CPU VM on Soft-RoCE): a spinning waiter would take it from the device, so it
/// polls briefly and sleeps, unless `RCH_SPIN` / `RCH_YIELD` or
/// [`Config::with_wait_policy`] chose otherwise. Between two such VMs this moved
/// 64 KiB messages at 17.8-18.9 MB/s against 10.5 spinning (bench/README.md,
/// 2026-11-25).
pub(crate) fn wait_policy_for<F: Fabric>(fabric: &F, cfg: &Config) -> WaitPolicy {
    let p = cfg.wait_policy();
    if cfg.wait_policy_is_set() || !fabric.uses_host_cpus() || available_cpus() > 1 {
        return p;
    }
    WaitPolicy {
        spin: p.spin.min(CONTENDED_SPIN),
        yields: 0,
        sleep_max: p.sleep_max.min(CONTENDED_SLEEP_MAX),
    }
}

/// A backoff that escalates from spinning to yielding to sleeping.
///
/// ```
/// use std::time::Duration;
/// use rdma_channel::engine::Backoff;
/// let mut b = Backoff::new(2, 1, Duration::from_micros(10));
/// for _ in 0..5 {
///     b.snooze();
/// }
/// assert!(b.is_sleeping());
/// b.reset();
/// assert!(!b.is_sleeping());
/// ```
#[derive(Clone, Debug)]
pub struct Backoff {
    spins: u32,
    yields: u32,
    sleep_max: Duration,
    step: u32,
    sleep: Duration,
    /// The token of a wake armed by the last step (see `snooze_on`).
    armed: Option<u64>,
}

impl Backoff {
    /// A backoff following `p` (see [`WaitPolicy`]).
    pub fn with_policy(p: WaitPolicy) -> Backoff {
        Backoff::new(p.spin, p.yields, p.sleep_max)
    }

    /// `spins` busy polls, then `yields` calls to `sched_yield`, then sleeps doubling
    /// from 1 us to `sleep_max`.
    pub fn new(spins: u32, yields: u32, sleep_max: Duration) -> Backoff {
        Backoff {
            spins,
            yields,
            sleep_max,
            step: 0,
            sleep: Duration::from_micros(1),
            armed: None,
        }
    }

    /// Waits a little; call once per unsuccessful poll.
    pub fn snooze(&mut self) {
        if self.step < self.spins {
            std::hint::spin_loop();
        } else if self.step < self.spins.saturating_add(self.yields) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.sleep.min(self.sleep_max));
            self.sleep = (self.sleep * 2).min(self.sleep_max.max(Duration::from_micros(1)));
        }
        self.step = self.step.saturating_add(1);
    }

    /// As [`snooze`](Self::snooze), but where it would sleep, waits for a wake of
    /// `qp` instead: one step arms it ([`QueuePair::arm_wake`]) and returns at once,
    /// so that the caller looks once more; the next blocks until something arrives
    /// ([`QueuePair::block_wake`]). A queue pair that takes no wakes sleeps.
    pub(crate) fn snooze_on<Q: QueuePair>(&mut self, qp: &Q) {
        if self.step < self.spins.saturating_add(self.yields) {
            return self.snooze();
        }
        match self.armed.take() {
            None => match qp.arm_wake() {
                Some(token) => self.armed = Some(token),
                None => return self.snooze(),
            },
            Some(token) => qp.block_wake(token, WAKE_BLOCK_MAX),
        }
        self.step = self.step.saturating_add(1);
    }

    /// True once the backoff has reached the sleeping phase.
    pub fn is_sleeping(&self) -> bool {
        self.step > self.spins.saturating_add(self.yields)
    }

    /// True once the backoff has stopped busy polling (it yields or sleeps).
    pub fn is_past_spinning(&self) -> bool {
        self.step >= self.spins
    }

    /// Starts over (after progress).
    pub fn reset(&mut self) {
        self.step = 0;
        self.sleep = Duration::from_micros(1);
        self.armed = None;
    }
}

/// `TimedOut` ("`what` timed out") once `deadline` has passed; `Ok` without one.
pub(crate) fn past(deadline: Option<std::time::Instant>, what: &str) -> std::io::Result<()> {
    match deadline {
        Some(d) if std::time::Instant::now() >= d => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{what} timed out"),
        )),
        _ => Ok(()),
    }
}
