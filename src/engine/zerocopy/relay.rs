//! Relay buffers: how a copying `put` of a large message uses the rails.
//!
//! The ring lives on rail 0, so bytes copied into it never touch the other rails
//! (seed 002 stripes only what its rendezvous moves). With rails, a copying put
//! (`Sender::put`, the stream's timed and async writes) copies each large piece
//! into a registered buffer of its own instead, a *relay slot*, and announces
//! that as a zero-copy transfer: the receiver reads it in stripes across the
//! rails like any lent buffer, and the slot is free again once the peer confirms
//! the read. The caller's bytes count as sent when copied, as they do when copied
//! into the ring; the slots are the window (while all are unread the put stops, as
//! it does at a full ring). The copy into slot k+1 overlaps the striped read of
//! slot k, which is the pipelining the ring gave these messages.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::time::{Duration, Instant};

use super::Lent;
use crate::engine::{Announce, Backoff, Sender};
use crate::fabric::Fabric;
use crate::rcache::RdmaBuf;

/// Relay slots a sender keeps at most (each allocated on first use): four let the
/// receiver read one while the sender fills the next with two to spare.
pub(crate) const RELAY_SLOTS: usize = 4;
/// Bytes of a slot, unless `Config::stripe_min` is larger: a striped step long
/// enough that each rail's part is measured over many packets.
pub(crate) const RELAY_SLOT_BYTES: usize = 1 << 20;
/// How long dropping a sender waits for the peer to read the relayed bytes it has
/// counted (as `SO_LINGER`): the connection's default patience.
pub(crate) const RELAY_LINGER: Duration = Duration::from_secs(10);

/// A sender's relay slots: allocated (registered) memory in the connection's
/// protection domain, each free or holding one announced transfer.
pub(crate) struct Relay<F: Fabric> {
    /// The slots made so far (`None` while a put borrows one).
    slots: Vec<Option<RdmaBuf<F>>>,
    free: Vec<usize>,
    /// Slots in flight with their transfer's number, oldest first.
    busy: VecDeque<(u64, usize)>,
    /// The last put stopped because every slot was in flight: the sender is
    /// writable again only once one is free.
    pub(crate) blocked: bool,
    /// Bytes counted through relay slots so far.
    pub(crate) bytes: u64,
}

impl<F: Fabric> Relay<F> {
    pub(crate) fn new() -> Relay<F> {
        Relay {
            slots: Vec::new(),
            free: Vec::new(),
            busy: VecDeque::new(),
            blocked: false,
            bytes: 0,
        }
    }

    /// Transfers in flight from relay slots.
    pub(crate) fn in_flight(&self) -> usize {
        self.busy.len()
    }

    /// The number of the newest relayed transfer still in flight.
    pub(crate) fn last_id(&self) -> Option<u64> {
        self.busy.back().map(|&(id, _)| id)
    }

    /// True when transfer `id` is one of the relay's.
    pub(crate) fn holds(&self, id: u64) -> bool {
        self.busy.iter().any(|&(i, _)| i == id)
    }

    /// True when a slot is free or can still be made.
    pub(crate) fn has_room(&self) -> bool {
        !self.free.is_empty() || self.slots.len() < RELAY_SLOTS
    }

    /// Frees the slots of the transfers numbered `upto` or lower (released).
    pub(crate) fn release_through(&mut self, upto: u64) {
        while let Some(&(id, slot)) = self.busy.front() {
            if id > upto {
                break;
            }
            self.busy.pop_front();
            self.free.push(slot);
            self.blocked = false;
        }
    }

    /// After the transfers were revoked: every slot is free (the peer can no
    /// longer read them).
    pub(crate) fn abort(&mut self) {
        self.free.extend(self.busy.drain(..).map(|(_, s)| s));
        self.blocked = false;
    }

    /// The address ranges of the slots made so far.
    pub(crate) fn ranges(&self) -> impl Iterator<Item = (*const u8, usize)> + '_ {
        self.slots.iter().flatten().map(|b| (b.as_ptr(), b.len()))
    }
}

/// What [`Sender::relay_put`] did.
pub(crate) enum Relayed {
    /// Copied and announced this many bytes.
    Sent(usize),
    /// Every slot is in flight, or the ring has no room for the announcement.
    Stopped,
    /// No slot could be made or registered: send through the ring.
    Refused,
}

impl<F: Fabric> Sender<F> {
    /// Whether the next `left` bytes of a copying put go through a relay slot:
    /// the connection has rails, and there is a striped step's worth.
    #[inline]
    pub(crate) fn relays(&self, left: usize) -> bool {
        left >= self.link.cfg.stripe_min() && !self.link.rails().is_empty()
    }

    /// The bytes of one relay slot.
    fn relay_slot_bytes(&self) -> usize {
        RELAY_SLOT_BYTES.max(self.link.cfg.stripe_min())
    }

    /// Copies up to a slot of `iov` from slice `idx`, byte `off`, at most `left`
    /// bytes, into a free relay slot and announces it.
    ///
    /// # Errors
    ///
    /// The connection's failure while announcing.
    pub(crate) fn relay_put(
        &mut self,
        iov: &[IoSlice<'_>],
        idx: usize,
        off: usize,
        left: usize,
    ) -> io::Result<Relayed> {
        self.release_confirmed(self.link.ctrl.zero_copy_done(), false);
        if !self.room_for_a_transfer() {
            self.relay.blocked = true;
            return Ok(Relayed::Stopped);
        }
        let slot = match self.relay.free.pop() {
            Some(s) => s,
            None if self.relay.slots.len() < RELAY_SLOTS => {
                let Ok(buf) = self.alloc_mem(self.relay_slot_bytes()) else {
                    return Ok(Relayed::Refused);
                };
                self.relay.slots.push(Some(buf));
                self.relay.slots.len() - 1
            }
            None => {
                self.relay.blocked = true;
                return Ok(Relayed::Stopped);
            }
        };
        let mut buf = self.relay.slots[slot].take().expect("a free slot is home");
        let n = left.min(buf.len());
        crate::engine::sender::gather_into(&mut buf[..n], &iov[idx..], off);
        // The slot stays in the relay, untouched, until its transfer is released
        // (`release_through`) or revoked (`abort`): the promise `Lent` stands for.
        let r = self.announce(&[IoSlice::new(&buf[..n])], Lent(()), false);
        self.relay.slots[slot] = Some(buf);
        match r {
            Ok(Announce::Sent { bytes, .. }) => {
                self.relay.busy.push_back((self.zc_next_id - 1, slot));
                self.relay.bytes += bytes as u64;
                Ok(Relayed::Sent(bytes))
            }
            Ok(Announce::NoRoom) => {
                self.relay.free.push(slot);
                Ok(Relayed::Stopped)
            }
            Ok(Announce::Refused) => {
                self.relay.free.push(slot);
                Ok(Relayed::Refused)
            }
            Err(e) => {
                self.relay.free.push(slot);
                Err(e)
            }
        }
    }

    /// Before a sender goes: waits, up to [`RELAY_LINGER`], for the peer to read
    /// the relayed transfers (their bytes were counted as sent), serving its
    /// pushes meanwhile. Gives up at once when the peer stopped reading or the
    /// connection failed; what is left is then revoked as any transfer in flight.
    pub(crate) fn linger_for_relays(&mut self) {
        let Some(last) = self.relay.last_id() else {
            return;
        };
        let deadline = Instant::now() + RELAY_LINGER;
        let mut b = Backoff::with_policy(self.link.wait);
        loop {
            match self.zc_confirmed(last) {
                Ok(true) => {
                    self.release_confirmed(last, false);
                    return;
                }
                Ok(false) if Instant::now() < deadline => {}
                _ => return,
            }
            if self.link.serve_credit().is_err() {
                return;
            }
            self.link.snooze(&mut b);
        }
    }
}
