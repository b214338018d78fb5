//! The sender's side of a zero-copy transfer: lending the caller's buffers.

use std::io::{self, IoSlice};
use std::sync::atomic::Ordering;

use super::receive::{MIN_PUSH, SPLIT_BY_ADVICE_MIN};
use super::{Lent, PushSource};
use crate::config::MAX_RAILS;
use crate::engine::{Announce, InFlightSeg, Lending, Link, PendingZc, Sender, ZeroCopy};
use crate::fabric::{Access, Fabric};
use crate::ring::wire::{
    PacketKind, Rendezvous, RndvSeg, MAX_RNDV_LEN, RNDV_BY_ADVICE, SMALL_RNDV,
};

impl<F: Fabric> Sender<F> {
    /// As [`put`](Sender::put), but buffers at or above the zero-copy threshold travel
    /// without a copy: the peer reads them straight from `iov` with RDMA READ.
    ///
    /// When `put_nocopy` reaches such a buffer it announces it to the peer and returns
    /// the bytes completed before it (possibly 0). The announced buffers are then in
    /// flight: call `put_nocopy` again with an `iov` that starts with the same buffers
    /// (same addresses and lengths) until it counts them, which it does once the peer
    /// has read them all. Eager and zero-copy bytes keep one FIFO order.
    ///
    /// The peer may lend part of its buffer for this end to push instead (its
    /// [`Config::with_zero_copy_push`](crate::Config::with_zero_copy_push)): that part
    /// moves only while this end calls into the connection (`put_nocopy`,
    /// [`poll_writable`](Sender::poll_writable), [`wait_zero_copy`](Sender::wait_zero_copy),
    /// or a `get` that finds nothing to read), as an MPI rendezvous does.
    ///
    /// ```
    /// use std::io::{IoSlice, IoSliceMut};
    /// let (mut a, mut b) = rdma_channel::RdmaStream::pair()?;
    /// let big = a.alloc_mem(256 << 10)?;
    /// let iov = [IoSlice::new(b"head"), IoSlice::new(&big)];
    /// // SAFETY: `big` and "head" stay untouched until put_nocopy has counted them.
    /// let n = unsafe { a.channel().sender().put_nocopy(&iov) }?;
    /// assert_eq!(n, 4); // the eager part; the big buffer is announced
    /// let mut out = vec![1u8; 4 + (256 << 10)];
    /// let mut got = 0;
    /// while got < out.len() {
    ///     got += b.get(&mut [IoSliceMut::new(&mut out[got..])])?;
    /// }
    /// assert_eq!(unsafe { a.channel().sender().put_nocopy(&iov[1..]) }?, 256 << 10);
    /// assert!(out[4..].iter().all(|&x| x == 0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Safety
    ///
    /// While a transfer is in flight (from the call that announced it until a call
    /// counts it, or the sender is dropped), the announced memory must stay mapped
    /// and unmodified. Dropping the sender with a transfer in flight deregisters the
    /// buffers, so the peer's read fails instead of reading freed memory.
    ///
    /// # Errors
    ///
    /// As [`put`](Sender::put); `InvalidInput` if a transfer is in flight and `iov`
    /// does not start with its buffers.
    pub unsafe fn put_nocopy(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        // A message below both zero-copy thresholds is copied whatever the memory: the
        // small-message path of `put`, which never leaves a transfer in flight.
        if iov.len() == 1 && self.below_zero_copy(iov[0].len()) {
            if let Some(r) = self.put_small_now(iov) {
                self.after_lane_put();
                return r;
            }
        }
        let r = self.put_inner(iov, ZeroCopy::Hold(Lent(())));
        self.after_zero_copy_put(r)
    }

    /// After a put that may announce: revokes every transfer in flight if the
    /// connection failed.
    fn after_zero_copy_put(&mut self, r: io::Result<usize>) -> io::Result<usize> {
        self.after_lane_put();
        if let Err(e) = &r {
            // A mismatched retry leaves the transfer in flight (the caller may retry
            // correctly); any other error ends the connection, so revoke the buffers.
            if e.kind() != io::ErrorKind::InvalidInput || self.link.error().is_some() {
                let _ = self.abort_pending();
            }
        }
        r
    }

    /// As [`put_nocopy`](Sender::put_nocopy), but a buffer announced for zero-copy
    /// is counted at once, and the call goes on with the buffers after it: the
    /// peer reads the announced ones in order, as their turn in the stream comes,
    /// while this end sends more. A window of large nonblocking sends is then read
    /// back to back instead of one announcement per round trip.
    ///
    /// The announced buffers are lent: they must stay mapped and unmodified until
    /// [`lends_released`](Sender::lends_released) returns at least the call's
    /// [`Lending::ticket`]. Tickets grow by one a transfer, and the peer releases
    /// them in order. At most 64 transfers are lent at a time; a call that meets the
    /// limit stops before the buffer it would lend (release some, then offer the
    /// rest again).
    ///
    /// ```
    /// use std::io::{IoSlice, IoSliceMut};
    /// let (mut a, mut b) = rdma_channel::RdmaStream::pair()?;
    /// let (x, y) = (a.alloc_mem(256 << 10)?, a.alloc_mem(256 << 10)?);
    /// let tx = a.channel().sender();
    /// // SAFETY: `x` and `y` stay untouched until lends_released passes their tickets.
    /// let first = unsafe { tx.put_lending(&[IoSlice::new(b"one"), IoSlice::new(&x)]) }?;
    /// let second = unsafe { tx.put_lending(&[IoSlice::new(&y)]) }?;
    /// assert_eq!((first.bytes, second.bytes), (3 + (256 << 10), 256 << 10));
    /// assert!(second.ticket > first.ticket);
    /// let mut out = vec![1u8; 3 + (512 << 10)];
    /// let mut got = 0;
    /// while got < out.len() {
    ///     got += b.get(&mut [IoSliceMut::new(&mut out[got..])])?;
    /// }
    /// while a.channel().sender().lends_released()? < second.ticket {}
    /// assert!(out[3..].iter().all(|&v| v == 0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Safety
    ///
    /// Every buffer the call lends (those it counts that go zero-copy) must stay
    /// mapped and unmodified until `lends_released` returns its ticket or more, or
    /// the sender is dropped. Dropping the sender with transfers in flight
    /// deregisters their buffers, so the peer's reads fail instead of reading freed
    /// memory.
    ///
    /// # Errors
    ///
    /// As [`put`](Sender::put); `InvalidInput` while a transfer `put_nocopy`
    /// announced is not counted yet and `iov` does not start with its buffers.
    pub unsafe fn put_lending(&mut self, iov: &[IoSlice<'_>]) -> io::Result<Lending> {
        let before = self.zc_next_id;
        let r = self.put_inner(iov, ZeroCopy::Lend(Lent(())));
        let bytes = self.after_zero_copy_put(r)?;
        let ticket = if self.zc_next_id != before {
            self.zc_next_id - 1
        } else {
            0
        };
        Ok(Lending { bytes, ticket })
    }

    /// Announces a zero-copy transfer of the buffers at the start of `iov` (the first
    /// is eligible; following eligible ones join it, up to the segment limit), which
    /// `put_nocopy`'s caller offers again until it is counted when `hold`.
    pub(crate) fn announce(
        &mut self,
        iov: &[IoSlice<'_>],
        _lent: Lent,
        hold: bool,
    ) -> io::Result<Announce> {
        let mut count = 1;
        while count < iov.len().min(self.max_rndv_segs) && self.zc_eligible(&iov[count]) {
            count += 1;
        }
        let need = Rendezvous::encoded_len_with_keys(count, self.link.rail_keys());
        if !self.make_room_for(need)? {
            return Ok(Announce::NoRoom);
        }
        let link = self.link.clone();
        let id = self.zc_next_id;
        // The segments go straight into the queue of those in flight and into the
        // announcement, no array of them made and moved on the way.
        let first = self.in_flight_segs.len();
        let first_rail_reg = self.in_flight_rail_regs.len();
        // Rails in protection domains of their own read from registrations there.
        let keys = link.rail_keys();
        // The common announcement (one segment, no rail keys) fits a small buffer:
        // zeroing the largest possible one costs more than writing it.
        let mut small = [0u8; SMALL_RNDV];
        let mut large;
        let desc: &mut [u8] = if need <= SMALL_RNDV {
            &mut small[..need]
        } else {
            large = [0u8; MAX_RNDV_LEN];
            &mut large[..need]
        };
        let mut total = 0u64;
        for buf in &iov[..count] {
            // SAFETY: `_lent` proves the caller of put_nocopy promised to keep these
            // buffers mapped until the transfer is counted (then the sender releases
            // the handles) or aborted (release and invalidate).
            let Ok(handle) = (unsafe {
                link.rcache
                    .acquire(&link.fabric, buf.as_ptr(), buf.len(), Access::REMOTE_READ)
            }) else {
                // Memory the fabric cannot register (read-only pages on verbs, say)
                // simply goes through the ring.
                break;
            };
            let mut rail_keys = [handle.rkey(); MAX_RAILS - 1];
            let before = self.in_flight_rail_regs.len();
            let mut registered = true;
            for (r, key) in rail_keys.iter_mut().enumerate().take(keys) {
                let Some(d) = link.rail_domain(r + 1) else {
                    continue;
                };
                // SAFETY: as above; these handles are released and invalidated with
                // the segment's.
                match unsafe {
                    d.rcache
                        .acquire(&d.fabric, buf.as_ptr(), buf.len(), Access::REMOTE_READ)
                } {
                    Ok(h) => {
                        *key = h.rkey();
                        self.in_flight_rail_regs.push_back((r + 1, h));
                    }
                    Err(_) => {
                        registered = false;
                        break;
                    }
                }
            }
            if !registered {
                for (rail, h) in self.in_flight_rail_regs.drain(before..) {
                    let d = link.rail_domain(rail).expect("a rail with a domain");
                    d.rcache.release(h);
                }
                link.rcache.release(handle);
                break;
            }
            let seg = RndvSeg {
                addr: buf.as_ptr() as u64,
                len: buf.len() as u64,
                rkey: handle.rkey(),
            };
            let i = self.in_flight_segs.len() - first;
            Rendezvous::encode_seg_with_keys(desc, i, &seg, &rail_keys[..keys]);
            total += seg.len;
            self.in_flight_segs.push_back(InFlightSeg { seg, handle });
        }
        let count = self.in_flight_segs.len() - first;
        if count == 0 {
            return Ok(Announce::Refused);
        }
        // The receiver splits a transfer it asked for the way it measured it.
        let by_advice = !self.zc_by_threshold(&iov[0]);
        let flags = if by_advice { RNDV_BY_ADVICE } else { 0 };
        // Recorded before the announcement goes out: the peer may lend part of its
        // buffer for us to push as soon as it has read it. Only where it may: the
        // record and its removal cost more than the rest of the announcement.
        let pushable = peer_may_lend(link.peer_lends, total, by_advice);
        if pushable {
            Link::add_push_source(
                &link,
                id,
                PushSource::new(
                    self.in_flight_segs
                        .range(first..)
                        .map(|s| (s.seg, s.handle.lkey())),
                    _lent,
                ),
            );
        }
        let n = Rendezvous::encode_fixed_with_keys(desc, id, total, count, flags, keys);
        let announcement = [IoSlice::new(&desc[..n])];
        let written = if self.stackable(n) {
            self.write_small_as(&announcement, 0, n, PacketKind::Rendezvous)
        } else {
            self.write_gathered(&announcement, 0, n, PacketKind::Rendezvous)
        };
        match written {
            Ok(_) => {
                self.zc_next_id += 1;
                self.zc_polls = 0;
                self.in_flight.push_back(PendingZc {
                    id,
                    count,
                    pushable,
                });
                self.publish_unconfirmed();
                // Relaxed: a hint (see `Link::exchanging`).
                if link.zc_receiving.load(Ordering::Relaxed) {
                    link.note_exchange();
                }
                self.held = hold;
                Ok(Announce::Sent {
                    slices: count,
                    bytes: total as usize,
                })
            }
            Err(e) => {
                // The newest source is this one (ids only grow): drop it alone.
                if pushable {
                    Link::drop_push_source(&link, id);
                }
                for s in self.in_flight_segs.drain(first..) {
                    link.rcache.release(s.handle);
                }
                for (rail, h) in self.in_flight_rail_regs.drain(first_rail_reg..) {
                    let d = link.rail_domain(rail).expect("a rail with a domain");
                    d.rcache.release(h);
                }
                Err(e)
            }
        }
    }
}

/// Whether the receiver of a transfer of `total` bytes may lend part of it for the
/// sender to push (`Receiver::start_reads`' rule, from what the sender knows): one
/// sent on its advice from [`SPLIT_BY_ADVICE_MIN`], one sent by threshold of at
/// least [`MIN_PUSH`] when its card says it lends (`peer_lends`).
pub(super) fn peer_may_lend(peer_lends: bool, total: u64, by_advice: bool) -> bool {
    if by_advice {
        total >= SPLIT_BY_ADVICE_MIN as u64
    } else {
        peer_lends && total >= MIN_PUSH as u64
    }
}
