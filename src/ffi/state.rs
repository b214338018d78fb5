//! The C library's global state: where it is in its life cycle, behind one lock, and
//! the waits of `rch_wait` and the per-connection waits, which poll the process group
//! under the lock and snooze outside it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::error::Error;
use super::lock::{Guard, SpinLock};
use super::sys::rch_status;
use crate::engine::Backoff;
use crate::group::Group;

/// Where the library is in its life cycle.
pub(crate) enum Phase {
    Uninit,
    /// After an init_process_group: rank, size and the card are known.
    Group(Group),
    /// After rch_init: connections can be used.
    Ready(Group),
    Finalized,
}

pub(crate) static LIB: SpinLock<Phase> = SpinLock::new(Phase::Uninit);

/// Locks the library; a poisoned lock (a panic inside a call) makes it unusable.
#[inline]
pub(crate) fn lock() -> Result<Guard<'static, Phase>, Error> {
    LIB.lock().map_err(|_| {
        Error::new(
            rch_status::RCH_ERR_INTERNAL,
            "an earlier call failed with an internal error; the library is unusable",
        )
    })
}

impl Phase {
    /// The group, once rch_init has run.
    #[inline]
    pub(crate) fn ready(&mut self) -> Result<&mut Group, Error> {
        match self {
            Phase::Ready(g) => Ok(g),
            Phase::Uninit | Phase::Group(_) => Err(Error::new(
                rch_status::RCH_ERR_NOT_INITIALIZED,
                "rch_init has not been called",
            )),
            Phase::Finalized => Err(finalized()),
        }
    }

    /// The group, after an init_process_group (before or after rch_init).
    pub(crate) fn group(&mut self) -> Result<&mut Group, Error> {
        match self {
            Phase::Ready(g) | Phase::Group(g) => Ok(g),
            Phase::Uninit => Err(Error::new(
                rch_status::RCH_ERR_NOT_INITIALIZED,
                "rch_init_process_group has not been called",
            )),
            Phase::Finalized => Err(finalized()),
        }
    }
}

#[cold]
pub(crate) fn finalized() -> Error {
    Error::new(
        rch_status::RCH_ERR_FINALIZED,
        "rch_finalize has been called",
    )
}

/// Bumped by rch_wakeup; a wait that sees it change since it started returns.
static WAKEUPS: AtomicU64 = AtomicU64::new(0);

/// rch_wakeup: ends the waits sleeping now.
pub(crate) fn wake_waiters() {
    // Relaxed: the counter only tells a sleeper to look again; whatever the waker
    // wants seen is published by the caller's own synchronisation (MPICH's lock).
    WAKEUPS.fetch_add(1, Ordering::Relaxed);
}

/// Polls of a spinning rch_wait between two looks at every connection. The others
/// look at the watched ones (`Group::poll_watched`), which is where a message is;
/// a full look catches the rest (a write that raced a request to ring, a blocked
/// put on a quiet connection). Every 64 polls, a message to a rank waiting with 63
/// quiet peers took 2.4 us against 1.6 us alone (bench/scale.sh, quiet pattern).
const FULL_LOOK_EVERY: u32 = 1024;

/// What poll `i` of a wait in phase `b` looks at: (every connection, the sockets).
///
/// Every connection every [`FULL_LOOK_EVERY`] polls and before each sleep; the
/// sockets (system calls, one per connection for its liveness) then only as often
/// as rch_poll_ready looks at them (`sockets_due`), and before each sleep. A wait
/// past its spins (yielding, as outnumbered ranks do at once) also asks at every
/// poll whether the sockets are due: a yield on a loaded host can take a time
/// slice, so 1024 of them outlast rch_wait(10), and counting alone left a rank
/// that called it in a loop blind to the listener, a peer's HELLO unanswered for
/// seconds (up to 47 s, t_lend at 3 ranks beside two busy loops on 2 CPUs).
fn looks(i: u32, b: &Backoff, mut sockets_due: impl FnMut() -> bool) -> (bool, bool) {
    let counted = i % FULL_LOOK_EVERY == 0;
    let due = (counted || b.is_past_spinning()) && sockets_due();
    let full = counted || b.is_sleeping() || due;
    let sockets = b.is_sleeping() || i == 0 || due;
    (full, sockets)
}

/// rch_wait and the per-connection waits: polls under the lock, snoozes without it.
pub(crate) fn wait(
    timeout_ms: i32,
    only: Option<usize>,
    read: bool,
    write: bool,
) -> Result<(), Error> {
    let start = Instant::now();
    let limit = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
    let mut backoff = None;
    // The sockets (listener, handshakes, rdma_cm events, each connection's liveness)
    // cost system calls: look at them while sleeping and now and then while
    // spinning (`Group::sockets_due`), not on entry, so that an upper layer calling
    // rch_wait once per message (MPI's blocking progress) pays nothing extra when
    // data is already there. A single poll (timeout 0) looks.
    let mut i: u32 = if timeout_ms == 0 { 0 } else { 1 };
    // Relaxed, as in wake_waiters: a stale read costs one more nap at most.
    let woken_at = WAKEUPS.load(Ordering::Relaxed);
    // Connections looked at since the last snooze, and how many make one (a full
    // look's worth).
    let mut spent = 0usize;
    let mut charge: usize;
    loop {
        {
            let mut lib = lock()?;
            let g = lib.ready()?;
            if let Some(r) = only {
                g.check_rank(r)?;
            }
            let b = backoff
                .get_or_insert_with(|| g.idle_backoff.take().unwrap_or_else(|| g.wait_policy()));
            let (full, sockets) = looks(i, b, || g.sockets_due());
            let (ready, looked) = g.poll(only, read, write, full, sockets);
            if ready {
                return Ok(());
            }
            // The backoff's spins count full looks (one connection each, as when
            // every poll looked at every connection): a look at a few watched
            // connections spends a fraction of one. Counted in polls, a wait over
            // 30 quiet connections went to sleep after 5 us instead of ~150 us, and
            // a pair's zero-byte MPI latency with them went from 0.3 to 4 us.
            spent += looked;
            charge = if only.is_some() { 1 } else { g.size as usize };
        }
        i = i.wrapping_add(1);
        if WAKEUPS.load(Ordering::Relaxed) != woken_at {
            return Ok(());
        }
        // Reading the clock costs as much as a poll: while spinning, look now and then.
        let check_clock = i % 16 == 0 || backoff.as_ref().is_some_and(Backoff::is_past_spinning);
        if check_clock && limit.is_some_and(|l| start.elapsed() >= l) {
            // Nothing happened: the next wait goes on from this phase of the backoff.
            if let Ok(mut lib) = lock() {
                if let Ok(g) = lib.ready() {
                    g.idle_backoff = backoff;
                }
            }
            return Err(Error::new(
                rch_status::RCH_ERR_TIMEOUT,
                format!("no progress within {timeout_ms} ms"),
            ));
        }
        if spent < charge {
            std::hint::spin_loop();
            continue;
        }
        spent = 0;
        backoff.as_mut().expect("set above").snooze();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait that yields from its first poll (an outnumbered rank's) looks at the
    /// listener whenever a look is due, whatever its poll count; a spinning one
    /// only on its counted full looks, without reading the clock in between.
    #[test]
    fn a_yielding_wait_looks_at_the_sockets_when_due_a_spinning_one_when_counted() {
        let yielding = Backoff::new(0, 50_000, Duration::from_millis(1));
        assert_eq!(looks(5, &yielding, || true), (true, true));
        assert_eq!(looks(5, &yielding, || false), (false, false));

        let spinning = Backoff::new(2_000, 0, Duration::from_millis(1));
        let mut asked = 0;
        assert_eq!(
            looks(5, &spinning, || {
                asked += 1;
                true
            }),
            (false, false)
        );
        assert_eq!(
            asked, 0,
            "a spinning poll between full looks reads no clock"
        );
        assert_eq!(looks(FULL_LOOK_EVERY, &spinning, || true), (true, true));
        assert_eq!(looks(FULL_LOOK_EVERY, &spinning, || false), (true, false));
        // A single poll (rch_wait(0)) looks at the sockets.
        assert_eq!(looks(0, &spinning, || false), (true, true));

        let mut sleeping = Backoff::new(0, 0, Duration::from_micros(1));
        sleeping.snooze();
        sleeping.snooze();
        assert!(sleeping.is_sleeping());
        assert_eq!(looks(5, &sleeping, || false), (true, true));
    }
}
