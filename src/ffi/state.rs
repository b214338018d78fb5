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
            // Every connection every FULL_LOOK_EVERY polls and before each sleep;
            // the sockets (system calls, one per connection for its liveness) then
            // only as often as rch_poll_ready looks at them, and before each sleep.
            let full = i % FULL_LOOK_EVERY == 0 || b.is_sleeping();
            let sockets = b.is_sleeping() || i == 0 || (full && g.sockets_due());
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
