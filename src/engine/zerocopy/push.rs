//! Push: the sender's side of a lend. The receiver of a zero-copy transfer may lend
//! part of its buffer ([`Lend`], in the sender's control region) instead of reading
//! that part; the sender then RDMA WRITEs those bytes of the announced buffers into
//! it and posts the lend's number as `LendLanded` behind them. Either half of the
//! sending end serves a lend when it polls, so a sender that is blocked reading from
//! the same connection still makes progress.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::{process_nanos, Lent};
use crate::engine::Link;
use crate::fabric::{Fabric, Opcode, QueuePair, Sge, WorkRequest};
use crate::ring::memory::{CtrlWord, Lend, LEND_SLOT, LEND_WORDS};
use crate::ring::wire::{RndvSeg, MAX_RNDV_SEGS};

/// The links of this process that have had a transfer lends may be served from
/// since [`serve_all_lends`] last looked (by address, which the weak reference keeps
/// from being reused). A link joins with its first source and stays while it sends
/// zero-copy, so the data path takes only the link's own lock: joining and leaving
/// with every transfer took this process-wide one twice a message (in a 16 KiB
/// exchange the source's bookkeeping went from 88 + 110 ns to 69 + 83). The rare
/// path, a wait for a push, drops the idle ones.
static PUSHERS: Mutex<Vec<(usize, Weak<dyn ServeLend>)>> = Mutex::new(Vec::new());

/// A link whose lends can be served, whatever its fabric.
trait ServeLend: Send + Sync {
    /// Serves its waiting lend, if any; false when it has no source left (and is
    /// taken off the list).
    fn serve_or_leave(&self) -> bool;
}

impl<F: Fabric> ServeLend for Link<F> {
    fn serve_or_leave(&self) -> bool {
        // Errors are the connection's own: it fails on its own.
        let _ = self.serve_lend();
        match self.push.try_lock() {
            Ok(mut g) if g.srcs.is_empty() => {
                g.listed = None;
                false
            }
            // Busy (the other half is serving) or still a source: stays.
            _ => true,
        }
    }
}

/// Serves the waiting lends of every connection of this process, for a thread that
/// is about to wait for a push itself: both ends of a connection may be driven by
/// one thread, or the sender may be blocked on another connection, and a push needs
/// its sender to poll. Skipped when another thread is at it. Errors belong to the
/// other connections (each fails on its own), so they are not returned here. Links
/// gone or with no source left leave the list.
pub(crate) fn serve_all_lends() {
    let Ok(mut all) = PUSHERS.try_lock() else {
        return;
    };
    all.retain(|(_, weak)| weak.upgrade().is_some_and(|link| link.serve_or_leave()));
}

/// How long an overlap of the two ends' zero-copy transfers marks the connection as
/// an exchange ([`Link::exchanging`]): several rounds of one of 4 MiB (~0.5 ms).
const EXCHANGE_WITHIN: std::time::Duration = std::time::Duration::from_millis(10);

/// Largest single RDMA WRITE of a push (as the READs' pieces).
const PUSH_PIECE: u64 = 1 << 20;

/// The announced buffers as a push needs them: where they are and their local keys.
/// Made only from buffers whose caller lent them (`put_nocopy`, `put_lending`), and
/// dropped before their registrations are given back.
#[derive(Clone, Copy)]
pub(crate) struct PushSource {
    segs: [RndvSeg; MAX_RNDV_SEGS],
    lkeys: [u32; MAX_RNDV_SEGS],
    total: u64,
}

impl PushSource {
    /// The announced segments with their local keys (at most [`MAX_RNDV_SEGS`]).
    pub(crate) fn new(segs: impl Iterator<Item = (RndvSeg, u32)>, _lent: Lent) -> PushSource {
        let mut s = PushSource {
            segs: [RndvSeg::default(); MAX_RNDV_SEGS],
            lkeys: [0; MAX_RNDV_SEGS],
            total: 0,
        };
        for (i, (seg, lkey)) in segs.take(MAX_RNDV_SEGS).enumerate() {
            s.segs[i] = seg;
            s.lkeys[i] = lkey;
            s.total += seg.len;
        }
        s
    }
}

/// What both halves share about pushing: the announced transfers that may be
/// pushed from (by number, oldest first), and the number of the last lend served.
#[derive(Default)]
pub(crate) struct PushState {
    srcs: VecDeque<(u64, PushSource)>,
    served: u64,
    /// The link's address while it is in [`PUSHERS`].
    listed: Option<usize>,
}

impl Drop for PushState {
    /// A link that goes takes its entry with it, unless the list is busy (then the
    /// next look at the list drops it: its weak reference no longer upgrades).
    fn drop(&mut self) {
        if let Some(id) = self.listed {
            if let Ok(mut all) = PUSHERS.try_lock() {
                all.retain(|(other, _)| *other != id);
            }
        }
    }
}

impl<F: Fabric> Link<F> {
    /// Serves the peer's lend if a new one is waiting and this end has an announced
    /// transfer: writes the lent bytes, then the lend's number. Cheap when there is
    /// nothing to do (one load of a word the peer rarely writes); returns at once if
    /// the other half is serving.
    ///
    /// # Errors
    ///
    /// `InvalidData` (and the connection fails) for a lend that skips a number or
    /// names bytes outside the transfer; the fabric's errors.
    pub(crate) fn serve_lend(&self) -> io::Result<()> {
        // Relaxed: a hint only; the lock and `ControlWords::lend` order the rest.
        if self.ctrl.lend_number() == self.lends_served.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut g = match self.push.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        self.serve_locked(&mut g)
    }

    fn serve_locked(&self, g: &mut MutexGuard<'_, PushState>) -> io::Result<()> {
        let lend = self.ctrl.lend();
        if lend.number == g.served {
            return Ok(());
        }
        if lend.number != g.served + 1 {
            return Err(self.fail(
                io::ErrorKind::InvalidData,
                format!(
                    "protocol error: lend {} where {} was due",
                    lend.number,
                    g.served + 1
                ),
            ));
        }
        // A lend arrives only after the announcement it belongs to, which recorded
        // the source first; without one (the transfer was abandoned) it is left alone.
        let Some(&(_, src)) = g.srcs.iter().find(|(id, _)| *id == lend.transfer) else {
            return Ok(());
        };
        let end = lend.offset.checked_add(u64::from(lend.len));
        if lend.len == 0 || end.is_none_or(|e| e > src.total) {
            return Err(self.fail(
                io::ErrorKind::InvalidData,
                format!(
                    "protocol error: lend of {} bytes at {} of a {}-byte transfer",
                    lend.len, lend.offset, src.total
                ),
            ));
        }
        self.push_lent(&src, &lend)?;
        self.post_ctrl(CtrlWord::LendLanded, lend.number)?;
        g.served = lend.number;
        // Relaxed: only read as a hint by serve_lend.
        self.lends_served.store(lend.number, Ordering::Relaxed);
        Ok(())
    }

    /// Posts the RDMA WRITEs of `lend`'s bytes of `src` into the peer's buffer.
    fn push_lent(&self, src: &PushSource, lend: &Lend) -> io::Result<()> {
        // Find the segment holding the lend's first byte.
        let (mut seg, mut seg_off) = (0, lend.offset);
        while seg_off >= src.segs[seg].len {
            seg_off -= src.segs[seg].len;
            seg += 1;
        }
        let (mut done, len) = (0u64, u64::from(lend.len));
        while done < len {
            let s = src.segs[seg];
            let piece = (s.len - seg_off).min(len - done).min(PUSH_PIECE);
            let sge = [Sge {
                addr: (s.addr + seg_off) as *mut u8,
                len: piece as u32,
                lkey: src.lkeys[seg],
            }];
            self.post_numbered(false, |wr_id, signaled| {
                let wr = WorkRequest {
                    wr_id,
                    opcode: Opcode::Write {
                        local: &sge,
                        remote_addr: lend.addr + done,
                        rkey: lend.rkey,
                        inline: false,
                    },
                    signaled,
                };
                // SAFETY: the bytes lie in an announced buffer (offset + len <= total,
                // checked by the caller), registered under `lkeys` and lent by the
                // caller of put_nocopy: mapped and untouched until the transfer is
                // counted, which happens only after the peer saw these bytes land, or
                // aborted, which clears the source under the lock this runs under
                // before the registrations are given back.
                unsafe { self.qp.post(&wr) }
            })?;
            done += piece;
            seg_off += piece;
            if seg_off == s.len {
                seg += 1;
                seg_off = 0;
            }
        }
        Ok(())
    }

    /// Records announced transfer `transfer` as one lends may be served from, and
    /// enters the link in this process's list of [`serve_all_lends`] if it is not
    /// there.
    pub(crate) fn add_push_source(link: &Arc<Link<F>>, transfer: u64, src: PushSource) {
        let mut g = link.push.lock().unwrap_or_else(|p| p.into_inner());
        if g.listed.is_none() {
            let id = Arc::as_ptr(link) as usize;
            let weak: Weak<dyn ServeLend> = Arc::downgrade(link) as Weak<dyn ServeLend>;
            let mut all = PUSHERS.lock().unwrap_or_else(|p| p.into_inner());
            // Entries of links gone whose drop found the list busy.
            all.retain(|(_, w)| w.strong_count() > 0);
            all.push((id, weak));
            g.listed = Some(id);
        }
        g.srcs.push_back((transfer, src));
    }

    /// Forgets the transfers numbered up to `upto` (all with `u64::MAX`) as sources
    /// of pushes (the link stays in the list of [`serve_all_lends`], which drops it
    /// when it finds it idle). Waits for a push in progress to be posted, so the
    /// caller may give their registrations back after it.
    pub(crate) fn drop_push_sources(link: &Arc<Link<F>>, upto: u64) {
        let mut g = link.push.lock().unwrap_or_else(|p| p.into_inner());
        if g.srcs.is_empty() {
            return;
        }
        while g.srcs.front().is_some_and(|(id, _)| *id <= upto) {
            g.srcs.pop_front();
        }
    }

    /// Forgets transfer `transfer` alone as a source of pushes (an announcement that
    /// failed to go out), as [`drop_push_sources`](Self::drop_push_sources) does.
    pub(crate) fn drop_push_source(link: &Arc<Link<F>>, transfer: u64) {
        let mut g = link.push.lock().unwrap_or_else(|p| p.into_inner());
        g.srcs.retain(|(id, _)| *id != transfer);
    }

    /// True while this end's sender has an announced zero-copy transfer the peer has
    /// not confirmed: the peer is reading it, and would serve a lend of ours only
    /// after that.
    pub(crate) fn sending_zero_copy(&self) -> bool {
        // Relaxed: a hint (see `Sender::publish_unconfirmed`).
        self.zc_unconfirmed.load(Ordering::Relaxed) != 0
    }

    /// Notes that the two ends' zero-copy transfers overlap now.
    pub(crate) fn note_exchange(&self) {
        // Relaxed: a timestamp read as a hint by the other half.
        self.zc_exchange_at
            .store(process_nanos().max(1), Ordering::Relaxed);
    }

    /// True while the two ends exchange zero-copy transfers: they overlapped within
    /// [`EXCHANGE_WITHIN`]. A receiver then reads the peer's transfers whole, even
    /// before its own of the round is announced: the peer's core is busy with our
    /// transfer, so a push gains it nothing (IMB PingPing 1 MiB, split 98 us against
    /// 83 read whole; with CH3's rendezvous a rank often takes the peer's
    /// announcement before its own goes out, so `sending_zero_copy` alone missed it).
    pub(crate) fn exchanging(&self) -> bool {
        // Relaxed: see note_exchange.
        let at = self.zc_exchange_at.load(Ordering::Relaxed);
        at != 0 && process_nanos().saturating_sub(at) <= EXCHANGE_WITHIN.as_nanos() as u64
    }

    /// Writes `lend` into the peer's lend slot (one request, so its number, the last
    /// word, becomes visible last).
    pub(crate) fn post_lend(&self, lend: &Lend) -> io::Result<()> {
        let mut bytes = [0u8; 8 * LEND_WORDS];
        for (chunk, w) in bytes.chunks_exact_mut(8).zip(lend.to_words()) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        self.post_ctrl_bytes(LEND_SLOT, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{IoSlice, IoSliceMut};
    use std::sync::Arc;

    use super::{serve_all_lends, PUSHERS};
    use crate::{Config, RdmaStream};

    fn listed(id: usize) -> bool {
        let all = PUSHERS.lock().unwrap_or_else(|p| p.into_inner());
        all.iter().any(|(other, _)| *other == id)
    }

    /// Whether `id` is still listed after a wait for a push looked at the list
    /// (which skips a look while another test's is under way: so a few tries).
    fn listed_after_a_look(id: usize) -> bool {
        for _ in 0..1000 {
            serve_all_lends();
            if !listed(id) {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    /// A link is in the list of links to serve whenever it has a transfer announced
    /// (other tests' waits for a push may look at the list at any time); a wait for
    /// a push drops it once it is idle, and one that is gone as well.
    #[test]
    fn a_link_with_a_transfer_is_listed_and_leaves_when_idle_or_gone() {
        let cfg = Config::default()
            .with_zero_copy_private_threshold(Some(16 << 10))
            .with_zero_copy_push(Some(50));
        let (mut a, mut b) = RdmaStream::pair_with(cfg).unwrap();
        let id = Arc::as_ptr(&a.channel().sender().link) as usize;
        let msg = vec![7u8; 256 << 10];
        let mut out = vec![0u8; msg.len()];
        for round in 0..3 {
            // SAFETY: `msg` is untouched until put_nocopy counts it.
            let announce = |a: &mut RdmaStream| unsafe {
                a.channel().sender().put_nocopy(&[IoSlice::new(&msg)])
            };
            assert_eq!(announce(&mut a).unwrap(), 0, "round {round}: announced");
            assert!(listed(id), "round {round}: a source not listed");
            let mut got = 0;
            while got < out.len() {
                got += b.get(&mut [IoSliceMut::new(&mut out[got..])]).unwrap();
            }
            while announce(&mut a).unwrap() == 0 {}
            assert!(out == msg, "round {round}");
        }
        // Idle: a wait for a push (ours, or another test's) drops it.
        assert!(!listed_after_a_look(id));
        // Listed again, then gone with its stream: its drop takes the entry, or
        // the next look at the list does.
        // SAFETY: `msg` outlives `a`, whose drop revokes the transfer.
        let announced = unsafe { a.channel().sender().put_nocopy(&[IoSlice::new(&msg)]) };
        assert_eq!(announced.unwrap(), 0);
        assert!(listed(id));
        drop(a);
        assert!(!listed_after_a_look(id));
    }

    /// Two ends whose zero-copy transfers overlap are marked as exchanging, from
    /// either side: the one that takes the peer's announcement while its own is
    /// unconfirmed, and the one that announces while it takes the peer's. A
    /// ping-pong (each transfer read whole before the reply) marks neither.
    #[test]
    fn overlapping_transfers_mark_an_exchange_and_a_ping_pong_does_not() {
        let cfg = Config::default().with_zero_copy_private_threshold(Some(16 << 10));
        let msg = vec![5u8; 256 << 10];
        let announce = |s: &mut RdmaStream| {
            // SAFETY: `msg` outlives the streams, whose drop revokes any transfer
            // still announced.
            unsafe { s.channel().sender().put_nocopy(&[IoSlice::new(&msg)]) }
        };
        let read_all = |s: &mut RdmaStream| {
            let mut out = vec![0u8; msg.len()];
            let mut got = 0;
            while got < out.len() {
                got += s.get(&mut [IoSliceMut::new(&mut out[got..])]).unwrap();
            }
            assert!(out == msg);
        };
        let exchanging = |s: &mut RdmaStream| s.channel().sender().link.exchanging();

        // A ping-pong, twice each way.
        let (mut a, mut b) = RdmaStream::pair_with(cfg.clone()).unwrap();
        for _ in 0..2 {
            assert_eq!(announce(&mut a).unwrap(), 0);
            read_all(&mut b);
            while announce(&mut a).unwrap() == 0 {}
            assert_eq!(announce(&mut b).unwrap(), 0);
            read_all(&mut a);
            while announce(&mut b).unwrap() == 0 {}
        }
        assert!(!exchanging(&mut a) && !exchanging(&mut b), "a ping-pong");

        // An exchange: a announces; b starts taking it (one byte), then announces
        // its own; a takes b's while its own is unconfirmed.
        let (mut a, mut b) = RdmaStream::pair_with(cfg).unwrap();
        assert_eq!(announce(&mut a).unwrap(), 0);
        let mut one = [0u8; 1];
        while b.get(&mut [IoSliceMut::new(&mut one)]).unwrap() == 0 {}
        assert!(
            !exchanging(&mut b),
            "b took a's transfer with none of its own"
        );
        assert_eq!(announce(&mut b).unwrap(), 0);
        assert!(exchanging(&mut b), "b announced while taking a's transfer");
        while a.get(&mut [IoSliceMut::new(&mut one)]).unwrap() == 0 {}
        assert!(
            exchanging(&mut a),
            "a took b's transfer while its own was out"
        );
        // The mark lapses.
        std::thread::sleep(super::EXCHANGE_WITHIN + std::time::Duration::from_millis(5));
        assert!(!exchanging(&mut a) && !exchanging(&mut b));
    }

    /// A peer that never lends (the emulated fabric's default push share, 0) gets
    /// transfers by threshold with no push source kept for them, and a transfer on
    /// its advice below the size it splits neither; the sender still counts as
    /// sending zero-copy while one is unconfirmed.
    #[test]
    fn no_push_source_where_the_peer_cannot_lend() {
        let cfg = Config::default().with_zero_copy_private_threshold(Some(16 << 10));
        let (mut a, mut b) = RdmaStream::pair_with(cfg).unwrap();
        let link = Arc::clone(&a.channel().sender().link);
        assert!(!link.peer_lends);
        let id = Arc::as_ptr(&link) as usize;
        let msg = vec![3u8; 64 << 10];
        let mut out = vec![0u8; msg.len()];
        // SAFETY: `msg` is untouched until put_nocopy counts it.
        let announce =
            |a: &mut RdmaStream| unsafe { a.channel().sender().put_nocopy(&[IoSlice::new(&msg)]) };
        assert_eq!(announce(&mut a).unwrap(), 0);
        assert!(!listed(id), "a push source for a peer that cannot lend");
        assert!(link.sending_zero_copy());
        let mut got = 0;
        while got < out.len() {
            got += b.get(&mut [IoSliceMut::new(&mut out[got..])]).unwrap();
        }
        while announce(&mut a).unwrap() == 0 {}
        assert!(out == msg);
        assert!(!link.sending_zero_copy());
        assert!(super::super::send::peer_may_lend(false, 128 << 10, true));
        assert!(!super::super::send::peer_may_lend(
            false,
            (128 << 10) - 1,
            true
        ));
        assert!(!super::super::send::peer_may_lend(false, 1 << 20, false));
        assert!(super::super::send::peer_may_lend(true, 4096, false));
        assert!(!super::super::send::peer_may_lend(true, 4095, false));
    }
}
