//! The link: the state both halves of one connection share (queue pair, the rings'
//! memory, replicated positions, send-queue accounting, the first error), and the
//! writes of control words.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::wait::Backoff;
use super::zerocopy::{process_nanos, OwnPuts, PushState};
use crate::config::{Config, WaitPolicy};
use crate::fabric::{
    CompletedOp, Completion, CompletionStatus, Fabric, FabricError, GatherList, QpState, QueuePair,
    RemoteRegion, ZeroCopyThresholds,
};
use crate::rcache::RegCache;
use crate::ring::memory::{ControlWords, CtrlWord, RingMemory, StagingBuffer};
use crate::sync;

/// Empty polls between two checks of the queue pair's health.
pub(super) const HEALTH_EVERY: u32 = 1024;

/// State both halves of a connection share.
pub(crate) struct Link<F: Fabric> {
    /// Declared first, so dropped first: once it is gone no request reads the
    /// staging buffer or writes a caller's buffer (`StagingBuffer::post_write`).
    pub(crate) qp: F::Qp,
    /// The connection's other rails (rail 1 first; empty for one rail): queue pairs
    /// that only carry stripes of zero-copy reads ([`crate::engine::stripe`]).
    /// Dropped right after rail 0, for the same reason. Set when the connection is
    /// made, or, where the rails' cards follow over rail 0 (rdma_cm), once they are
    /// connected ([`Channel::connect_rails`](super::Channel::connect_rails)): empty
    /// until then.
    pub(crate) rails: std::sync::OnceLock<Vec<Rail<F>>>,
    /// The rails whose cards follow over rail 0: their queue pairs, with their own
    /// domains, until `step_rails` connects them, and how far that got.
    pub(crate) rails_setup: Mutex<super::connect::RailsSetup<F>>,
    /// The incoming rings the peer may write: kept here, not only by the receiving
    /// half, so that they outlive it as long as the queue pair may take writes.
    pub(super) incoming: Mutex<IncomingRings<F::Region>>,
    /// Staging copies a dropped sending half left behind: requests it posted may
    /// still read them (a verbs queue pair reads its source at send time, after the
    /// post returned), so they live until the queue pair above is gone.
    pub(super) left_staging: Mutex<Vec<StagingBuffer<F::Region>>>,
    /// Control words the peer writes.
    pub(crate) ctrl: ControlWords<F::Region>,
    pub(crate) peer_ctrl: RemoteRegion,
    /// Master tail of the incoming ring (bytes fully consumed).
    pub(super) rx_tail: AtomicU64,
    /// Highest incoming tail sent to the peer in an explicit update.
    pub(super) rx_explicit: AtomicU64,
    /// Highest incoming tail sent to the peer piggybacked on a packet.
    pub(super) rx_piggy: AtomicU64,
    /// The sender's head as last noted for the receiver's stream backoff
    /// ([`Sender::note_lane_sends`](super::Sender::note_lane_sends)): packets a C
    /// caller wrote through the send lane piggyback a tail that has not moved while
    /// the packets it read in place wait to be consumed, so `rx_piggy` alone missed
    /// those sends.
    pub(super) tx_lane_head: AtomicU64,
    /// How many times the head was noted so (0: never, no lane): the receiver counts
    /// at most one arrival per note, since a library call may consume several packets
    /// the lane read in place, and which of them came before our last send it cannot
    /// tell.
    pub(super) tx_lane_notes: AtomicU64,
    /// Credit request value last answered.
    pub(super) credit_served: AtomicU64,
    /// When this end's sender last put a large buffer (`zerocopy::process_nanos`,
    /// 0: never), kept where the adaptive path choice is on: the receiver's path
    /// meter weighs ring copies by it.
    pub(crate) large_put_at: AtomicU64,
    /// When this end's sender last timed a large copy into the peer's ring
    /// (`zerocopy::process_nanos`, 0: never), and the median cost a byte of its
    /// recent ones (picoseconds): what a ring byte costs this core on top of its copy
    /// out while both ends send.
    pub(crate) ring_copy_in_at: AtomicU64,
    pub(crate) ring_copy_in_ps: AtomicU64,
    /// Highest tail of the outgoing ring seen piggybacked on incoming packets.
    pub(super) tx_tail_piggy: AtomicU64,
    /// Serialises explicit control writes so that they reach the peer in value order.
    pub(super) publish: Mutex<()>,
    /// Send queue accounting, for fabrics whose queue needs signalled completions.
    pub(crate) sq: SendQueue,
    /// First error seen, after which every call fails.
    pub(super) broken: Mutex<Option<(io::ErrorKind, String)>>,
    pub(super) is_broken: AtomicBool,
    /// Zero-copy thresholds in force.
    pub(super) zc_thresholds: ZeroCopyThresholds,
    /// Smallest buffer (other than `alloc_mem`'s, below `zc_thresholds.other`) whose
    /// path follows the peer receiver's advice; `usize::MAX`: none.
    pub(crate) zc_adaptive_min: usize,
    /// Percent of each zero-copy transfer this end, as receiver, lends to the peer to
    /// push instead of reading it.
    pub(crate) zc_push: u8,
    /// As `zc_push`, for a transfer the peer sent zero-copy only because this end's
    /// path advice asked for it ([`RNDV_BY_ADVICE`](crate::ring::wire::RNDV_BY_ADVICE)).
    pub(crate) zc_adaptive_push: u8,
    /// The announced transfer lends are served from, and the last lend served.
    pub(crate) push: Mutex<PushState>,
    /// The peer may lend part of a transfer we send by threshold (its card's lends
    /// flag): only then, or for a transfer sent on its advice that it may split,
    /// does an announcement record what a push needs.
    pub(crate) peer_lends: bool,
    /// Zero-copy transfers this end's sender announced that the peer has not
    /// confirmed yet (the sender stores it; the receiving half reads it as a hint).
    pub(crate) zc_unconfirmed: AtomicU64,
    /// This end's receiver is taking a zero-copy transfer (from its announcement to
    /// its confirmation; the sending half reads it as a hint).
    pub(crate) zc_receiving: AtomicBool,
    /// When ([`process_nanos`](super::zerocopy::process_nanos), 0: never) the two
    /// ends' zero-copy transfers last overlapped: one of ours announced while one of
    /// the peer's was being taken, or the other way round.
    pub(crate) zc_exchange_at: AtomicU64,
    /// Copy of the last lend served, read without the lock to see there is no news.
    pub(crate) lends_served: AtomicU64,
    /// Registrations of user buffers for the zero-copy path (dropped before the fabric).
    pub(crate) rcache: Arc<RegCache<F>>,
    pub(super) cfg: Config,
    /// The wait policy in force (`wait::wait_policy_for`).
    pub(crate) wait: WaitPolicy,
    /// The queue pair takes wakes and blocking waits use them
    /// (`Fabric::blocking_waits_take_wakes`): a wait past its busy polls blocks until
    /// the peer writes (`QueuePair::arm_wake`) instead of sleeping on a timer.
    pub(crate) wakes: bool,
    /// A number no other connection of this process had ([`next_serial`]): a
    /// selector tells its connections apart by it, where a descriptor number of
    /// theirs may be reused by a newer one.
    pub(crate) serial: u64,
    pub(crate) fabric: F,
}

/// A rail other than rail 0: its queue pair and that queue's accounting, and the
/// protection domain it is in where that is not the connection's (a rail on
/// another device: memory it reads or is read from is registered there too).
pub(crate) struct Rail<F: Fabric> {
    pub(crate) qp: F::Qp,
    pub(crate) sq: SendQueue,
    pub(crate) domain: Option<RailDomain<F>>,
}

/// A rail's own protection domain and its registration cache.
pub(crate) struct RailDomain<F: Fabric> {
    pub(crate) rcache: Arc<RegCache<F>>,
    pub(crate) fabric: F,
}

/// The incoming rings of a connection: the one being read, and the one offered to
/// the peer and not yet switched to ([`RingOffer`](crate::ring::memory::RingOffer)).
pub(crate) struct IncomingRings<R: crate::fabric::MemoryRegion> {
    pub(super) current: RingMemory<R>,
    pub(super) offered: Option<RingMemory<R>>,
}

/// The incoming rings, locked (a panic elsewhere leaves them usable).
pub(super) fn lock_incoming<F: Fabric>(
    link: &Link<F>,
) -> std::sync::MutexGuard<'_, IncomingRings<F::Region>> {
    link.incoming.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts posted and retired work requests where the fabric's queue is finite.
///
/// Work request ids are sequence numbers from `posted` (writes take one only when the
/// queue is finite; reads always do, as they are always signalled). Completions of an
/// RC queue pair arrive in posting order, so `completed` > n means request n is done.
///
/// Its atomics and lock come from [`crate::sync`], so that `scripts/loom` checks this
/// code itself (`link_loom.rs`).
pub(crate) struct SendQueue {
    depth: u64,
    interval: u64,
    posted: sync::atomic::AtomicU64,
    /// One past the highest request retired by a successful signalled completion.
    retired: sync::atomic::AtomicU64,
    /// One past the highest request with any completion (success, error or flush).
    completed: sync::atomic::AtomicU64,
    /// Serialises the slot check, numbering and posting on a finite queue (see
    /// [`post_numbered`](Self::post_numbered)).
    order: sync::Mutex<()>,
}

impl SendQueue {
    /// A queue of `depth` requests, every `interval`-th write signalled; `u64::MAX`
    /// for both when the fabric's queue never fills.
    pub(crate) fn new(depth: u64, interval: u64) -> SendQueue {
        SendQueue {
            depth,
            interval,
            posted: sync::atomic::AtomicU64::new(0),
            retired: sync::atomic::AtomicU64::new(0),
            completed: sync::atomic::AtomicU64::new(0),
            order: sync::Mutex::new(()),
        }
    }

    /// Numbers and posts one request through `post(wr_id, signaled)`, calling `wait`
    /// while a finite queue is full. Returns the request's number.
    ///
    /// On a finite queue both halves post (the sender its packets, the receiver its
    /// control words and RDMA READs), and completions arrive in posting order: so the
    /// slot check, the numbering and the post happen under one lock, or a request
    /// numbered later but posted first would retire (or count as completed) the one
    /// numbered before it while that one is still in the NIC's hands (loom finds
    /// that interleaving in the lock-free version: `link_loom.rs`). Reads are always
    /// signalled; writes every `interval`-th, so completions keep retiring the others.
    #[inline]
    pub(crate) fn post_numbered<E>(
        &self,
        read: bool,
        mut wait: impl FnMut() -> Result<(), E>,
        post: impl FnOnce(u64, bool) -> Result<(), E>,
    ) -> Result<u64, E> {
        if self.is_unbounded() {
            // An unbounded queue (the emulated fabric) retires requests as they are
            // posted: only reads are numbered, and only the receiving half posts
            // them. AcqRel: numbers are handed out once each.
            let wr_id = if read {
                self.posted.fetch_add(1, Ordering::AcqRel)
            } else {
                0
            };
            post(wr_id, read)?;
            return Ok(wr_id);
        }
        let _in_order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        while self.is_full() {
            wait()?;
        }
        // Numbers are handed out under the lock, so a load and a store do what a
        // fetch_add would, without a read-modify-write on the data path. Acquire and
        // Release: pair with the completion counters' updates (see `complete`) and
        // `is_full`'s loads.
        let wr_id = self.posted.load(Ordering::Acquire);
        self.posted.store(wr_id + 1, Ordering::Release);
        let signaled = read || wr_id % self.interval == self.interval - 1;
        post(wr_id, signaled)?;
        Ok(wr_id)
    }

    /// True for a queue that retires requests as they are posted (the emulated
    /// fabric's default): writes need no number and no signal.
    #[inline]
    pub(crate) fn is_unbounded(&self) -> bool {
        self.depth == u64::MAX
    }

    /// True while the requests posted and not yet retired by a signalled completion
    /// fill the queue.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        // Acquire: pairs with the AcqRel updates of both counters (a slot counts as
        // free only after the completion that freed it was processed).
        self.posted.load(Ordering::Acquire) - self.retired.load(Ordering::Acquire) >= self.depth
    }

    /// Counts a completion of request `wr_id` as [`complete`](Self::complete), a
    /// failed one after `record_failure` has run: a thread waiting for the request
    /// looks for the connection's error only once it sees the count
    /// ([`Link::wait_completed`]), so the failure must be there first, or the waiter
    /// takes a failed READ's untouched buffer for data (peer_death's zero-copy stage
    /// did, on a busy host: the other half drained the completion meanwhile).
    #[inline]
    pub(crate) fn complete_with(&self, wr_id: u64, success: bool, record_failure: impl FnOnce()) {
        if !success {
            record_failure();
        }
        self.complete(wr_id, success);
    }

    /// Counts a completion of request `wr_id`, successful or not.
    #[inline]
    pub(crate) fn complete(&self, wr_id: u64, success: bool) {
        // AcqRel on both counters: a waiter that sees the new value also sees what
        // the request did (the bytes a read placed).
        self.completed.fetch_max(wr_id + 1, Ordering::AcqRel);
        if success {
            // A signalled success retires it and every unsignalled request before it.
            self.retired.fetch_max(wr_id + 1, Ordering::AcqRel);
        }
    }

    /// The number the next request will get: every request numbered before it was
    /// posted already.
    #[inline]
    pub(crate) fn next_number(&self) -> u64 {
        // Acquire: pairs with post_numbered's Release store.
        self.posted.load(Ordering::Acquire)
    }

    /// True once request `seq` has a completion, successful or not.
    #[inline]
    pub(crate) fn is_completed(&self, seq: u64) -> bool {
        // Acquire: pairs with `complete`'s AcqRel, so the bytes a read placed are
        // visible once its completion is counted.
        self.completed.load(Ordering::Acquire) > seq
    }
}

impl<F: Fabric> Link<F> {
    /// `Err(BrokenPipe)` once the peer's receiver has stopped reading.
    pub(super) fn check_peer_reading(&self) -> io::Result<()> {
        if self.ctrl.receiver_closed() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the peer closed its reading side",
            ));
        }
        Ok(())
    }

    pub(crate) fn fail(&self, kind: io::ErrorKind, msg: String) -> io::Error {
        let mut b = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        if b.is_none() {
            *b = Some((kind, msg));
        }
        // Release: publishes the message stored above to `error`'s Acquire load.
        self.is_broken.store(true, Ordering::Release);
        let (k, m) = b.as_ref().unwrap();
        io::Error::new(*k, m.clone())
    }

    #[inline]
    pub(crate) fn error(&self) -> Option<io::Error> {
        // Acquire: pairs with the Release in `fail`, so the message is there to read.
        if !self.is_broken.load(Ordering::Acquire) {
            return None;
        }
        self.stored_error()
    }

    #[cold]
    fn stored_error(&self) -> Option<io::Error> {
        let b = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        b.as_ref().map(|(k, m)| io::Error::new(*k, m.clone()))
    }

    /// Drains completions and turns an error completion or an error state into a
    /// permanent connection error.
    pub(crate) fn check_health(&self) -> io::Result<()> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        self.drain_completions()?;
        let qps = std::iter::once(&self.qp).chain(self.rails().iter().map(|r| &r.qp));
        for (rail, qp) in qps.enumerate() {
            if rail > 0 {
                self.drain_rail(rail)?;
            }
            if qp.state() == QpState::Error {
                let why = qp
                    .error_reason()
                    .map_or_else(String::new, |r| format!(" ({r})"));
                let which = if rail > 0 {
                    format!(" on rail {rail}")
                } else {
                    String::new()
                };
                return Err(self.fail(
                    io::ErrorKind::ConnectionReset,
                    format!(
                        "connection broken: the peer is gone or the queue pair failed{which}{why}"
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn drain_completions(&self) -> io::Result<()> {
        self.drain_queue(&self.qp, &self.sq)
    }

    /// Drains the completions of rail `rail` (0: the connection's queue pair).
    pub(crate) fn drain_rail(&self, rail: usize) -> io::Result<()> {
        match rail {
            0 => self.drain_completions(),
            r => {
                let rail = &self.rails()[r - 1];
                self.drain_queue(&rail.qp, &rail.sq)
            }
        }
    }

    fn drain_queue(&self, qp: &F::Qp, sq: &SendQueue) -> io::Result<()> {
        let mut wcs = [Completion {
            wr_id: 0,
            status: CompletionStatus::Success,
            op: CompletedOp::Write,
            byte_len: 0,
        }; 16];
        let mut failure = None;
        loop {
            let n = qp.poll(&mut wcs);
            for wc in &wcs[..n] {
                self.count_completion_on(sq, wc, &mut failure);
            }
            if n < wcs.len() {
                return failure.map_or(Ok(()), Err);
            }
        }
    }

    /// The extra rails whose keys announcements carry: all of them where any is in
    /// a protection domain of its own on this end, else none (every rail reads with
    /// rail 0's keys).
    #[inline]
    pub(crate) fn rail_keys(&self) -> usize {
        if self.rails().iter().any(|r| r.domain.is_some()) {
            self.rails().len()
        } else {
            0
        }
    }

    /// The connection's rails after rail 0 (empty for one, or while their cards are
    /// on their way over rail 0).
    #[inline]
    pub(crate) fn rails(&self) -> &[Rail<F>] {
        self.rails.get().map_or(&[], Vec::as_slice)
    }

    /// How many rails have a protection domain of their own on this end.
    #[inline]
    pub(crate) fn foreign_rails(&self) -> usize {
        self.rails().iter().filter(|r| r.domain.is_some()).count()
    }

    /// The protection domain of rail `rail` when it is not the connection's.
    #[inline]
    pub(crate) fn rail_domain(&self, rail: usize) -> Option<&RailDomain<F>> {
        match rail {
            0 => None,
            r => self.rails()[r - 1].domain.as_ref(),
        }
    }

    /// True once request `seq` of rail `rail` has a completion, successful or not.
    #[inline]
    pub(crate) fn rail_completed(&self, rail: usize, seq: u64) -> bool {
        match rail {
            0 => self.sq.is_completed(seq),
            r => self.rails()[r - 1].sq.is_completed(seq),
        }
    }

    /// Counts one completion of rail `rail` (0: the connection's queue pair),
    /// polled or handed back by the fabric at post time
    /// ([`QueuePair::post_completing`]); a failed one breaks the connection first and
    /// leaves its error in `failure` unless one is there already.
    #[inline]
    pub(crate) fn count_completion(
        &self,
        rail: usize,
        wc: &Completion,
        failure: &mut Option<io::Error>,
    ) {
        let sq = if rail == 0 {
            &self.sq
        } else {
            &self.rails()[rail - 1].sq
        };
        self.count_completion_on(sq, wc, failure);
    }

    /// [`count_completion`](Self::count_completion) of a request of the queue
    /// counted by `sq` (a rail's).
    #[inline]
    fn count_completion_on(
        &self,
        sq: &SendQueue,
        wc: &Completion,
        failure: &mut Option<io::Error>,
    ) {
        let success = wc.status == CompletionStatus::Success;
        sq.complete_with(wc.wr_id, success, || {
            // The peer's memory refusing us (RemoteAccessError) is what a peer that
            // exited or died looks like from here: its regions are gone with it.
            // Local errors are ours.
            let (kind, what) = match wc.status {
                CompletionStatus::TransportError
                | CompletionStatus::Flushed
                | CompletionStatus::RemoteAccessError => (
                    io::ErrorKind::ConnectionReset,
                    "connection broken: the peer is gone or the queue pair failed",
                ),
                _ => (io::ErrorKind::Other, "local RDMA error"),
            };
            let e = self.fail(kind, format!("{what} ({:?})", wc.status));
            failure.get_or_insert(e);
        });
    }

    /// Numbers and posts one request through `post(wr_id, signaled)`, keeping a
    /// finite send queue within its depth ([`SendQueue::post_numbered`]): while it is
    /// full, drains completions, and while that frees nothing, checks the
    /// connection's health and backs off. Returns the request's number.
    pub(crate) fn post_numbered(
        &self,
        read: bool,
        post: impl FnOnce(u64, bool) -> Result<(), FabricError>,
    ) -> io::Result<u64> {
        let mut backoff = Backoff::new(1000, 100, std::time::Duration::from_micros(100));
        self.sq.post_numbered(
            read,
            || {
                // Completions already there free slots without a health verdict: a
                // peer that closed and left after our last request completed must
                // not fail a post that has room once they are counted.
                self.drain_completions()?;
                if !self.sq.is_full() {
                    return Ok(());
                }
                self.check_health()?;
                backoff.snooze();
                Ok(())
            },
            |wr_id, signaled| post(wr_id, signaled).map_err(io::Error::from),
        )
    }

    /// [`post_inline`](Self::post_inline) of one contiguous buffer, through
    /// [`QueuePair::write_inline`] where the send queue needs no accounting.
    #[inline(always)]
    pub(crate) fn write_inline(&self, bytes: &[u8], remote_addr: u64, rkey: u32) -> io::Result<()> {
        if self.sq.is_unbounded() {
            return self
                .qp
                .write_inline(bytes, remote_addr, rkey)
                .map_err(io::Error::from);
        }
        let mut list = GatherList::<1>::new();
        list.push(bytes);
        self.post_inline(&list, remote_addr, rkey)
    }

    /// Readies this end for writing through the peer's `region` (see
    /// [`QueuePair::prepare_remote`]).
    pub(super) fn prepare_remote(&self, region: RemoteRegion) {
        self.qp.prepare_remote(region);
    }

    /// Writes `list` inline to `remote_addr` in the peer's memory.
    #[inline(always)]
    pub(crate) fn post_inline<const N: usize>(
        &self,
        list: &GatherList<'_, N>,
        remote_addr: u64,
        rkey: u32,
    ) -> io::Result<()> {
        if self.sq.is_unbounded() {
            // What post_numbered does for an unbounded queue (an unnumbered,
            // unsignalled write), without its closures and backoff: the small-message
            // path comes through here once per message.
            return self
                .qp
                .post_inline_write(0, list, remote_addr, rkey, false)
                .map_err(io::Error::from);
        }
        self.post_numbered(false, |wr_id, signaled| {
            self.qp
                .post_inline_write(wr_id, list, remote_addr, rkey, signaled)
        })
        .map(drop)
    }

    /// Writes `list` to offset `at` of the peer's ring `peer_ring` through `staging`,
    /// the registered copy of that ring.
    pub(super) fn post_staged<const N: usize>(
        &self,
        staging: &StagingBuffer<F::Region>,
        peer_ring: &RemoteRegion,
        at: usize,
        list: &GatherList<'_, N>,
    ) -> io::Result<()> {
        self.post_numbered(false, |wr_id, signaled| {
            staging.post_write(&self.qp, wr_id, signaled, at, list, peer_ring)
        })
        .map(drop)
    }

    /// Numbers and posts one signalled request on rail `rail` (0: the connection's
    /// queue pair, [`post_numbered`](Self::post_numbered)), keeping its send queue
    /// within its depth. Returns the request's number on that rail.
    pub(crate) fn post_numbered_on(
        &self,
        rail: usize,
        post: impl FnOnce(&F::Qp, u64, bool) -> Result<(), FabricError>,
    ) -> io::Result<u64> {
        if rail == 0 {
            return self.post_numbered(true, |wr_id, signaled| post(&self.qp, wr_id, signaled));
        }
        let r = &self.rails()[rail - 1];
        let mut backoff = Backoff::new(1000, 100, std::time::Duration::from_micros(100));
        r.sq.post_numbered(
            true,
            || {
                self.drain_rail(rail)?;
                if !r.sq.is_full() {
                    return Ok(());
                }
                self.check_health()?;
                backoff.snooze();
                Ok(())
            },
            |wr_id, signaled| post(&r.qp, wr_id, signaled).map_err(io::Error::from),
        )
    }

    /// Waits until request `seq` has a completion, successful or not. Never gives up
    /// early: the memory a read targets must not be handed back while the NIC may
    /// still write it, and an RC queue pair completes (or flushes) every request.
    ///
    /// # Errors
    ///
    /// The connection's error if any completion failed.
    pub(crate) fn wait_completed(&self, seq: u64) -> io::Result<()> {
        self.wait_rail_completed(0, seq)
    }

    /// [`wait_completed`](Self::wait_completed) for request `seq` of rail `rail`.
    pub(crate) fn wait_rail_completed(&self, rail: usize, seq: u64) -> io::Result<()> {
        let mut backoff = Backoff::new(20_000, 1000, std::time::Duration::from_micros(50));
        let mut failure = None;
        while !self.rail_completed(rail, seq) {
            if let Err(e) = self.drain_rail(rail) {
                failure.get_or_insert(e);
            }
            if self.rail_completed(rail, seq) {
                break;
            }
            backoff.snooze();
        }
        match failure.or_else(|| self.error()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// One step of a wait that found nothing: `b.snooze()`, except that where the
    /// queue pair takes wakes a wait past its polls and yields blocks until the peer
    /// writes (or a completion of ours arrives) instead of sleeping.
    #[inline]
    pub(crate) fn snooze(&self, b: &mut Backoff) {
        if self.wakes {
            b.snooze_on(&self.qp);
        } else {
            b.snooze();
        }
    }

    /// Writes one 8-byte control word into the peer's control region.
    pub(crate) fn post_ctrl(&self, word: CtrlWord, value: u64) -> io::Result<()> {
        self.post_ctrl_bytes(word.offset(), &value.to_le_bytes())
    }

    /// Writes `bytes` at `offset` of the peer's control region, in one inline
    /// request (so its last word becomes visible last: a slot's number).
    pub(crate) fn post_ctrl_bytes(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let mut list = GatherList::<1>::new();
        list.push(bytes);
        self.post_inline(&list, self.peer_ctrl.addr + offset, self.peer_ctrl.rkey)
    }

    /// Notes that this end's sender puts a large buffer now (for the path meter).
    #[inline]
    pub(crate) fn note_large_put(&self) {
        // Relaxed: a timestamp read as a hint by this process's receiver half.
        self.large_put_at
            .store(process_nanos().max(1), Ordering::Relaxed);
    }

    /// Notes that this end's sender copied a large piece into the peer's ring at
    /// `ps_per_byte` (the median of its recent such copies; for the path meter).
    #[inline]
    pub(crate) fn note_ring_copy_in(&self, ps_per_byte: u64) {
        // Relaxed: hints read by this process's receiver half; a figure paired with
        // the neighbouring timestamp is as good as its own.
        self.ring_copy_in_ps.store(ps_per_byte, Ordering::Relaxed);
        self.ring_copy_in_at
            .store(process_nanos().max(1), Ordering::Relaxed);
    }

    /// What this end's sender did lately, for the path meter.
    pub(crate) fn own_puts(&self) -> OwnPuts {
        // Relaxed: see note_large_put and note_ring_copy_in.
        OwnPuts {
            large_at: self.large_put_at.load(Ordering::Relaxed),
            ring_copy_at: self.ring_copy_in_at.load(Ordering::Relaxed),
            ring_copy_ps: self.ring_copy_in_ps.load(Ordering::Relaxed),
        }
    }

    /// Sends the incoming ring's tail explicitly if it moved since the last explicit
    /// update. Serialised so that updates reach the peer in increasing order.
    pub(super) fn publish_tail(&self) -> io::Result<()> {
        let _g = self.publish.lock().unwrap_or_else(|p| p.into_inner());
        // Acquire pairs with the receiver's Release store after it finished copying out
        // of the ring: the peer may reuse the space as soon as it sees this value.
        let tail = self.rx_tail.load(Ordering::Acquire);
        // Relaxed: rx_explicit is only touched under the `publish` lock held here.
        if tail > self.rx_explicit.load(Ordering::Relaxed) {
            self.post_ctrl(CtrlWord::Tail, tail)?;
            self.rx_explicit.store(tail, Ordering::Relaxed);
        }
        Ok(())
    }

    /// True while the peer's sender waits for a credit answer (a stall it reported
    /// and nobody answered yet); the answer itself may still have to wait for our
    /// tail (see [`serve_credit`](Self::serve_credit)).
    #[inline]
    pub(super) fn credit_wanted(&self) -> bool {
        // Relaxed: as in serve_credit; a request that lands just after this look is
        // the next call's to answer, as it would be had it landed after this call.
        self.ctrl.credit_request() != self.credit_served.load(Ordering::Relaxed)
    }

    /// Answers a pending credit request from the peer's sender (see module docs).
    ///
    /// A request carries the tail the sender already knows, plus one. It is answered
    /// only once our tail has moved past that value, so the answer always frees room;
    /// until then it stays pending, however many tails we piggyback meanwhile (the
    /// stalled sender may not be reading them).
    #[inline]
    pub(super) fn serve_credit(&self) -> io::Result<()> {
        self.serve_credit_asked().map(|_| ())
    }

    /// Arms the fabric's own wake of this connection, where it has one (verbs with
    /// wakes on: every write of the peer's, and every completion of ours, fires it)
    /// and returns the descriptor it makes readable ([`QueuePair::wake_fd`]); `None`
    /// where the fabric wakes through [`QueuePair::notify`] or not at all, or the
    /// connection failed. Look once more after it: what landed before the arm
    /// raises no event.
    pub(crate) fn arm_wake_fd(&self) -> Option<std::os::fd::RawFd> {
        if self.error().is_some() {
            return None;
        }
        let fd = self.qp.wake_fd()?;
        self.qp.arm_wake()?;
        Some(fd)
    }

    /// The descriptor of the fabric's own wake, without arming it
    /// ([`QueuePair::wake_fd`]).
    pub(crate) fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        self.qp.wake_fd()
    }

    /// After `poll(2)` found [`arm_wake_fd`](Self::arm_wake_fd)'s descriptor
    /// readable ([`QueuePair::wake_fired`]).
    pub(crate) fn wake_fired(&self) {
        self.qp.wake_fired();
    }

    /// Names eventfd `fd` of `instance` (whose wake adds bit `hint`) in control word
    /// `which` of the peer's region (`WakeFd`, `RoomWakeFd`), unless `named` says it
    /// was named already; false, naming nothing, where the fabric has no wake
    /// ([`QueuePair::can_notify`]) or the connection failed.
    ///
    /// # Errors
    ///
    /// A fabric failure while writing the word.
    pub(crate) fn name_wake(
        &self,
        which: CtrlWord,
        named: &mut u64,
        fd: u32,
        instance: u32,
        hint: u32,
    ) -> io::Result<bool> {
        if !self.qp.can_notify() || self.error().is_some() {
            return Ok(false);
        }
        let word = crate::ring::memory::encode_wake(fd, instance, hint);
        if *named != word {
            self.post_ctrl(which, word)?;
            *named = word;
        }
        Ok(true)
    }

    /// [`serve_credit`](Self::serve_credit), and whether a request was pending
    /// (answered now or not).
    #[inline]
    pub(super) fn serve_credit_asked(&self) -> io::Result<bool> {
        let req = self.ctrl.credit_request();
        // Relaxed on credit_served: two halves racing here at worst publish the same
        // tail twice (publish_tail is serialised and idempotent).
        if req == self.credit_served.load(Ordering::Relaxed) {
            return Ok(false);
        }
        // Acquire on rx_tail: as in publish_tail.
        if self.rx_tail.load(Ordering::Acquire) >= req {
            self.publish_tail()?;
            // Relaxed: as the load above.
            self.credit_served.store(req, Ordering::Relaxed);
            // A selector of the peer's may sleep until room comes (select): wake it.
            // The word is loaded after the tail went out (the sleeper's membarrier
            // orders the rest); a failed wake leaves it to its bounded nap.
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
            self.wake_room_waiter();
        }
        Ok(true)
    }

    /// Wakes the peer's selector that sleeps until its sender can go on, if it named
    /// one (`CtrlWord::RoomWakeFd`): after room in our ring, or after a zero-copy
    /// read it may wait for (a relay slot or a held buffer is then free again).
    /// A failed wake leaves the sleeper to its bounded nap.
    pub(super) fn wake_room_waiter(&self) {
        if let Some((fd, instance, value)) = self.ctrl.room_wake_fd() {
            let _ = self.qp.notify(fd, instance, value);
        }
    }
}

#[cfg(all(test, loom))]
#[path = "link_loom.rs"]
mod loom_model;

/// The next [`Link::serial`].
pub(crate) fn next_serial() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // Relaxed: a counter; uniqueness is all that matters.
    NEXT.fetch_add(1, Ordering::Relaxed)
}
