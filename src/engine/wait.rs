//! Waiting for progress without burning a core forever: spin, then yield, then sleep.
//!
//! Busy polling gives the lowest latency when every rank has a core; when there are
//! more ranks than cores a spinning rank steals the time its peer needs to make the
//! progress it waits for, so the wait yields and finally sleeps (seed 000, Liu, Wu,
//! Panda, *High Performance RDMA-Based MPI Implementation over InfiniBand*, ICS 2003,
//! sec. 4.7 discusses the same trade-off for polling sets).

use std::time::Duration;

use crate::config::{Config, WaitPolicy, SHORT_SLEEPS};
use crate::fabric::{Fabric, QueuePair};

/// Busy polls of a process group's wait whose spinning would take the CPU its
/// progress needs (more ranks than CPUs): then it sleeps without yielding.
pub(crate) const CONTENDED_SPIN: u32 = 100;
/// Busy polls of a connection's wait when the fabric's work needs this process's only
/// CPU: none. Each one only delays the sleep that lets that work run; 100 polls made
/// a 2 B one-way trip between two one-CPU Soft-RoCE VMs 20 us slower (bench/notebook/2026-11.md,
/// 2026-11-27).
const ONE_CPU_SPIN: u32 = 0;
/// Longest sleep of such a connection's young wait ([`WaitPolicy::short_sleep_max`]),
/// unless configured lower; a long wait goes on to the policy's `sleep_max`. The
/// sleeps are a stream of short gaps in which the kernel (and, in a VM, the host)
/// runs what the wait is for: with 5 us instead of 50 us the 2 B one-way trip between
/// two one-CPU Soft-RoCE VMs went from 375-384 to 316-321 us, bandwidth unchanged; 1
/// and 2 us did no better, one long first sleep did worse (bench/notebook/2026-11.md,
/// 2026-11-27).
const ONE_CPU_SLEEP_MAX: Duration = Duration::from_micros(5);
/// A backoff whose sleeps are all shorter than this sleeps with the thread's timer
/// slack at [`PRECISE_SLACK_NS`]: Linux lets a sleep run 50 us long by default
/// (`PR_SET_TIMERSLACK`), which would make the one-CPU policy's 5 us sleeps ten
/// times as long. Between two one-CPU Soft-RoCE VMs, with 50 us sleeps then, a 2 B
/// ping-pong's median went from 413 to 384 us (five rounds, bench/notebook/2026-11.md,
/// 2026-11-27).
const PRECISE_SLEEP_BELOW: Duration = Duration::from_micros(200);
/// Timer slack of a precise sleep, in nanoseconds.
const PRECISE_SLACK_NS: libc::c_ulong = 1_000;
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
/// sleeps at once, in steps of at most 5 us while the wait is young, unless
/// `RCH_SPIN` / `RCH_YIELD` or [`Config::with_wait_policy`] chose otherwise. Between
/// two such VMs sleeping moved 64 KiB messages at 17.8-18.9 MB/s against 10.5
/// spinning (bench/notebook/2026-11.md, 2026-11-25).
pub(crate) fn wait_policy_for<F: Fabric>(fabric: &F, cfg: &Config) -> WaitPolicy {
    let p = cfg.wait_policy();
    if cfg.wait_policy_is_set() || !fabric.uses_host_cpus() || available_cpus() > 1 {
        return p;
    }
    WaitPolicy {
        spin: ONE_CPU_SPIN,
        yields: 0,
        short_sleep_max: p.short_sleep_max.min(ONE_CPU_SLEEP_MAX),
        sleep_max: p.sleep_max,
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
#[derive(Debug)]
pub struct Backoff {
    spins: u32,
    yields: u32,
    /// Cap of the first [`SHORT_SLEEPS`] sleeps (at most `sleep_max`).
    short_sleep_max: Duration,
    sleep_max: Duration,
    step: u32,
    sleep: Duration,
    /// The token of a wake armed by the last step (see `snooze_on`).
    armed: Option<u64>,
    /// The thread's timer slack before this backoff's sleeps tightened it.
    slack: Option<SavedSlack>,
}

/// A thread's timer slack, saved while a backoff's short sleeps run with
/// [`PRECISE_SLACK_NS`], and put back when the wait ends.
#[derive(Debug)]
struct SavedSlack {
    nanos: libc::c_ulong,
    /// Only this thread's slack was changed (a backoff may move between threads).
    thread: std::thread::ThreadId,
}

impl SavedSlack {
    /// Tightens the calling thread's timer slack, returning what it was; `None`
    /// where the thread's slack cannot be read.
    fn tighten() -> Option<SavedSlack> {
        let nanos = timer_slack()?;
        if nanos > PRECISE_SLACK_NS {
            set_timer_slack(PRECISE_SLACK_NS);
        }
        Some(SavedSlack {
            nanos,
            thread: std::thread::current().id(),
        })
    }

    fn restore(self) {
        if self.nanos > PRECISE_SLACK_NS && std::thread::current().id() == self.thread {
            set_timer_slack(self.nanos);
        }
    }
}

/// The calling thread's timer slack in nanoseconds, if it can be read.
fn timer_slack() -> Option<libc::c_ulong> {
    // SAFETY: PR_GET_TIMERSLACK takes no pointer; it returns the calling thread's
    // slack or -1.
    let nanos = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    libc::c_ulong::try_from(nanos).ok()
}

/// Sets the calling thread's timer slack (a value of 0 would mean "the default").
fn set_timer_slack(nanos: libc::c_ulong) {
    // SAFETY: PR_SET_TIMERSLACK takes its value by value and touches no memory of
    // ours; a failure leaves the slack as it was, which only costs precision.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, nanos.max(1), 0, 0, 0) };
}

impl Drop for Backoff {
    fn drop(&mut self) {
        if let Some(s) = self.slack.take() {
            s.restore();
        }
    }
}

impl Clone for Backoff {
    /// A copy starts without the slack change: only the original puts it back.
    fn clone(&self) -> Backoff {
        Backoff {
            slack: None,
            ..*self
        }
    }
}

impl Backoff {
    /// A backoff following `p` (see [`WaitPolicy`]): as [`new`](Self::new), with the
    /// first [`SHORT_SLEEPS`] sleeps capped at `p.short_sleep_max`. Where that cap is
    /// under 200 us those sleeps run with the thread's timer slack at 1 us.
    pub fn with_policy(p: WaitPolicy) -> Backoff {
        let mut b = Backoff::new(p.spin, p.yields, p.sleep_max);
        b.short_sleep_max = p.short_sleep_max.min(p.sleep_max);
        b
    }

    /// `spins` busy polls, then `yields` calls to `sched_yield`, then sleeps doubling
    /// from 1 us to `sleep_max`. Where `sleep_max` is under 200 us the sleeps run
    /// with the thread's timer slack at 1 us (Linux's default of 50 us would stretch
    /// them), put back by [`reset`](Self::reset) or when the backoff is dropped.
    pub fn new(spins: u32, yields: u32, sleep_max: Duration) -> Backoff {
        Backoff {
            spins,
            yields,
            short_sleep_max: sleep_max,
            sleep_max,
            step: 0,
            sleep: Duration::from_micros(1),
            armed: None,
            slack: None,
        }
    }

    /// Waits a little; call once per unsuccessful poll.
    pub fn snooze(&mut self) {
        if self.step < self.spins {
            std::hint::spin_loop();
        } else if self.step < self.spins.saturating_add(self.yields) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.next_sleep());
        }
        self.step = self.step.saturating_add(1);
    }

    /// The length of the sleep this step takes (the backoff is in its sleeping
    /// phase), advancing the schedule.
    fn next_sleep(&mut self) -> Duration {
        if self.slack.is_none() && self.short_sleep_max < PRECISE_SLEEP_BELOW {
            self.slack = SavedSlack::tighten();
        }
        let young = self
            .step
            .saturating_sub(self.spins.saturating_add(self.yields))
            < SHORT_SLEEPS;
        let cap = if young {
            self.short_sleep_max
        } else {
            self.sleep_max
        };
        let now = self.sleep.min(cap);
        self.sleep = (self.sleep * 2).min(cap.max(Duration::from_micros(1)));
        now
    }

    /// For a caller that sleeps by itself (a selector's `ppoll`): how long the
    /// next sleep of this backoff's schedule lasts, skipping its spins and yields.
    /// The thread's timer slack is tightened as for [`snooze`](Self::snooze)'s
    /// short sleeps.
    pub(crate) fn next_nap(&mut self) -> Duration {
        self.step = self.step.max(self.spins.saturating_add(self.yields));
        let nap = self.next_sleep();
        self.step = self.step.saturating_add(1);
        nap
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

    /// How many busy polls the backoff makes before it yields or sleeps.
    pub fn spins(&self) -> u32 {
        self.spins
    }

    /// True once the backoff has stopped busy polling (it yields or sleeps).
    pub fn is_past_spinning(&self) -> bool {
        self.step >= self.spins
    }

    /// Starts over (after progress).
    pub fn reset(&mut self) {
        if let Some(s) = self.slack.take() {
            s.restore();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    const TIGHT: Option<libc::c_ulong> = Some(PRECISE_SLACK_NS);

    /// Short sleeps tighten the thread's timer slack while the wait lasts; reset and
    /// drop put it back, and a wait with long sleeps leaves it alone.
    #[test]
    fn short_sleeps_run_with_a_tight_timer_slack_until_the_wait_ends() {
        std::thread::spawn(|| {
            set_timer_slack(50_000);
            let mut b = Backoff::new(0, 0, Duration::from_micros(20));
            b.snooze();
            assert_eq!(timer_slack(), TIGHT);
            let copy = b.clone();
            drop(copy);
            assert_eq!(timer_slack(), TIGHT, "a clone restores nothing");
            b.reset();
            assert_eq!(timer_slack(), Some(50_000));
            b.snooze();
            assert_eq!(timer_slack(), TIGHT);
            drop(b);
            assert_eq!(timer_slack(), Some(50_000));
            let mut long = Backoff::new(0, 0, Duration::from_micros(500));
            long.snooze();
            assert_eq!(timer_slack(), Some(50_000));
        })
        .join()
        .unwrap();
    }

    /// A young wait's sleeps stop doubling at the short cap; after SHORT_SLEEPS of
    /// them they go on to sleep_max, and a reset makes the wait young again.
    #[test]
    fn a_long_wait_sleeps_longer_than_a_young_one() {
        let mut b = Backoff::with_policy(WaitPolicy {
            spin: 3,
            yields: 2,
            short_sleep_max: Duration::from_micros(2),
            sleep_max: Duration::from_micros(16),
        });
        for _ in 0..5 + SHORT_SLEEPS {
            b.snooze();
            assert!(b.sleep <= Duration::from_micros(2), "{:?}", b.sleep);
        }
        for _ in 0..4 {
            b.snooze();
        }
        assert_eq!(b.sleep, Duration::from_micros(16));
        b.reset();
        for _ in 0..10 {
            b.snooze();
        }
        assert_eq!(b.sleep, Duration::from_micros(2));
    }

    /// A backoff dropped on another thread than the one it tightened leaves that
    /// other thread's slack alone.
    #[test]
    fn a_backoff_moved_to_another_thread_restores_nothing_there() {
        std::thread::spawn(|| {
            set_timer_slack(50_000);
            let mut b = Backoff::new(0, 0, Duration::from_micros(20));
            b.snooze();
            std::thread::spawn(move || {
                set_timer_slack(70_000);
                drop(b);
                assert_eq!(timer_slack(), Some(70_000));
            })
            .join()
            .unwrap();
        })
        .join()
        .unwrap();
    }
}
