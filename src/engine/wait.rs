//! Waiting for progress without burning a core forever: spin, then yield, then sleep.
//!
//! Busy polling gives the lowest latency when every rank has a core; when there are
//! more ranks than cores a spinning rank steals the time its peer needs to make the
//! progress it waits for, so the wait yields and finally sleeps (seed 000, Liu, Wu,
//! Panda, *High Performance RDMA-Based MPI Implementation over InfiniBand*, ICS 2003,
//! sec. 4.7 discusses the same trade-off for polling sets).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// Longest typical wait for which a contended wait spins (see [`WaitHistory`]):
/// beyond it the peer is busy with something long (a window of large messages),
/// and a spinning waiter would only take the CPU that moves it.
const ADAPTIVE_SPIN_MAX: Duration = Duration::from_millis(3);

/// Whether a connection on `fabric` waits as a contended one: its fabric's work runs
/// on this host's CPUs, this process has only one of them, and the user chose no
/// policy. Such waits poll briefly and sleep, and spin adaptively ([`WaitHistory`]).
pub(crate) fn contended<F: Fabric>(fabric: &F, cfg: &Config) -> bool {
    !cfg.wait_policy_is_set() && fabric.uses_host_cpus() && available_cpus() == 1
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
    if !contended(fabric, cfg) {
        return p;
    }
    WaitPolicy {
        spin: p.spin.min(CONTENDED_SPIN),
        yields: 0,
        sleep_max: p.sleep_max.min(CONTENDED_SLEEP_MAX),
    }
}

/// How long a connection's receiver waited for data lately, from the first poll that
/// found nothing to the packet: an average over the last few waits (weight 1/8 for
/// the newest).
///
/// A contended waiter (one CPU shared with a software RDMA device) sleeps after a
/// few polls, so that the device gets the CPU, and so notices a message only when
/// its sleep ends. But where the waits are short, as in a request and its reply,
/// what it waits for is a message on the wire, not work on this CPU: there it
/// busy-polls up to twice its typical wait before it sleeps, as the block layer's
/// hybrid polling does. Between two one-CPU Soft-RoCE VMs this took 2 B latency
/// from 511 to 427 us and kept 64 KiB messages at 17.2 MB/s against 17.7 asleep and
/// 13.1 spinning (bench/README.md, 2026-11-26).
#[derive(Debug, Default)]
pub(crate) struct WaitHistory {
    /// Nanoseconds; 0 before the first wait.
    typical_ns: AtomicU64,
}

impl WaitHistory {
    /// Counts one finished wait.
    pub(crate) fn learn(&self, waited: Duration) {
        let w = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: a heuristic; a lost update between two waiters of one kind only
        // drops one sample.
        let t = self.typical_ns.load(Ordering::Relaxed);
        let next = if t == 0 { w } else { t - t / 8 + w / 8 };
        self.typical_ns.store(next.max(1), Ordering::Relaxed);
    }

    /// How long a wait may busy-poll before its policy's sleeps: twice the typical
    /// wait where that is shorter than [`ADAPTIVE_SPIN_MAX`], else not at all.
    pub(crate) fn spin_budget(&self) -> Duration {
        // Relaxed: as in learn.
        let t = Duration::from_nanos(self.typical_ns.load(Ordering::Relaxed));
        if t < ADAPTIVE_SPIN_MAX {
            t * 2
        } else {
            Duration::ZERO
        }
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
    /// When the adaptive part of this wait began (see `spin_adaptively`).
    started: Option<Instant>,
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
            started: None,
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
        self.started = None;
    }

    /// One step of an adaptive wait (see [`WaitHistory`]): busy-polls once and
    /// returns true while this wait is within `history`'s spin budget; false when
    /// the caller should snooze as usual.
    pub(crate) fn spin_adaptively(&mut self, history: &WaitHistory) -> bool {
        let start = *self.started.get_or_insert_with(Instant::now);
        if start.elapsed() < history.spin_budget() {
            std::hint::spin_loop();
            return true;
        }
        false
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
