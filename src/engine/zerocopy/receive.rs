//! The receiver's side of a zero-copy transfer: RDMA READs into the caller's buffer.

use std::io::{self, IoSliceMut};

use super::Lent;
use crate::config::MAX_RAILS;
use crate::engine::{GetMode, LentPart, Link, ReadsInFlight, Receiver, Stripe, READ_PIECE};
use crate::fabric::{Access, Fabric, MemoryRegion, Opcode, QueuePair, Sge, WorkRequest};
use crate::rcache::RegHandle;
use crate::ring::memory::Lend;
use crate::ring::wire::RndvSeg;
use std::time::Instant;

impl<F: Fabric> Receiver<F> {
    /// As [`get`](Self::get), but never waits for the RDMA READs of a zero-copy
    /// transfer (the `get` of seed 001
    /// sec. 5, the MPICH2 RDMA Channel paper): when it reaches one it starts the reads into
    /// `iov` and returns the bytes completed before them (possibly 0). While reads are
    /// in flight, call it again with an `iov` that starts with the same buffer; it
    /// returns 0 until they have landed, then counts them.
    ///
    /// ```
    /// use std::io::{IoSlice, IoSliceMut};
    /// let (mut a, mut b) = rdma_channel::RdmaStream::pair()?;
    /// let big = a.alloc_mem(64 << 10)?;
    /// // SAFETY: `big` stays untouched until put_nocopy counts it.
    /// assert_eq!(unsafe { a.channel().sender().put_nocopy(&[IoSlice::new(&big)]) }?, 0);
    /// let mut out = vec![1u8; 64 << 10];
    /// let mut got = 0;
    /// while got < out.len() {
    ///     let rx = b.channel().receiver();
    ///     // SAFETY: `out` is neither moved nor touched while reads are in flight.
    ///     got += unsafe { rx.get_nowait(&mut [IoSliceMut::new(&mut out[got..])]) }?;
    /// }
    /// assert!(out.iter().all(|&x| x == 0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Safety
    ///
    /// While reads are in flight (from a call that returned without counting them
    /// until one that counts them), the buffer they target must stay allocated and
    /// untouched: the fabric writes into it.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get); `InvalidInput` if reads are in flight and `iov` does not
    /// start with their buffer.
    pub unsafe fn get_nowait(&mut self, iov: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        // The common small message (and an empty poll) takes `get`'s straight path:
        // it declines whenever reads are in flight or a transfer is announced, the
        // only states in which the two calls differ.
        if let [buf] = iov {
            if let Some(n) = self.get_first_packet(buf, GetMode::NoWait(Lent(())))? {
                return Ok(n);
            }
        }
        self.get_inner(iov, GetMode::NoWait(Lent(())))
    }

    /// Starts the reads of the announced transfer's next bytes into `dst`, a buffer
    /// whose caller (of `get_nowait`) promised to keep it untouched until they are
    /// counted, even after this borrow ends.
    pub(crate) fn start_reads_lent(
        &mut self,
        dst: &mut [u8],
        _lent: Lent,
    ) -> io::Result<ReadsInFlight<F::Region>> {
        // SAFETY: `_lent` proves get_nowait's contract: the buffer stays allocated and
        // untouched while the reads are in flight.
        unsafe { self.start_reads(dst.as_mut_ptr(), dst.len()) }
    }

    /// Pulls the next bytes of the announced transfer into `dst` and returns how many
    /// (at least one), once every read into `dst` has completed, so the caller's
    /// buffer is never written after this borrow ends.
    pub(crate) fn read_zero_copy(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `dst` is exclusively borrowed for this call, and finish_reads waits
        // for the reads (even on error) before we return.
        let r = unsafe { self.start_reads(dst.as_mut_ptr(), dst.len()) }?;
        Ok(self
            .finish_reads(r, true)?
            .expect("a waiting finish completes"))
    }

    /// Starts the next step of the announced transfer into `dst` (`len` bytes at
    /// most, capped so that the reads fit the read window): RDMA READs of its first
    /// part, and its last part lent to the peer to push (`Link::zc_push` percent of
    /// it, `Link::zc_adaptive_push` for a transfer sent on our advice), and returns
    /// them as in flight.
    ///
    /// # Safety
    ///
    /// `dst..dst + len` must be writable memory that nothing else touches until
    /// [`finish_reads`](Receiver::finish_reads) has seen the reads complete and the
    /// lent part land, or dropped the lent part.
    unsafe fn start_reads(
        &mut self,
        dst: *mut u8,
        len: usize,
    ) -> io::Result<ReadsInFlight<F::Region>> {
        let link = self.link.clone();
        // Rails connected after the channel was made (`Channel::connect_rails`).
        if self.striper.is_none() && !link.rails().is_empty() {
            self.striper = Some(crate::engine::stripe::Striper::new(
                link.cfg.stripe_policy(),
                1 + link.rails().len(),
            ));
        }
        let z = self
            .zc
            .as_ref()
            .expect("called with a transfer in progress");
        // A transfer on our advice is split unless this end is sending zero-copy
        // too: the peer then reads our buffer first and would serve our lend only
        // after it (IMB PingPing 4 MiB, split: 400 ps a byte a step; read: ~180);
        // nor while the two ends exchange transfers, though ours of this round is
        // not out yet (`Link::exchanging`). The sender records a push source
        // without knowing either: an unused one costs it only the record.
        // One below SPLIT_BY_ADVICE_MIN is read whole too: the lend's registration and
        // the sender's extra system call cost more than half a read saves. The
        // sender keeps what a push needs by the same rule (`send::peer_may_lend`):
        // a change here goes there too.
        // A step read in stripes across several rails is read whole: the stripes'
        // completion times are what adaptive striping learns from.
        let window = self.max_reads * READ_PIECE * (1 + link.rails().len());
        let striped = self.striper.is_some()
            && (len as u64).min(z.total - z.done) >= link.cfg.stripe_min() as u64;
        let share = if striped {
            0
        } else if !z.by_advice {
            link.zc_push
        } else if z.total < SPLIT_BY_ADVICE_MIN as u64
            || link.sending_zero_copy()
            || link.exchanging()
        {
            0
        } else {
            link.zc_adaptive_push
        };
        let n = (len as u64).min(z.total - z.done).min(if striped {
            window
        } else {
            self.max_reads * READ_PIECE
        } as u64) as usize;
        let done = z.done;
        let started = self.times_copy(n).then(std::time::Instant::now);
        // Once the peer's sender closed, pushing needs its process to call us again
        // for nothing else: read it all.
        let push = if link.ctrl.end_of_stream() != 0 {
            0
        } else {
            push_share(n, share)
        };
        // The lend goes out first, so the peer pushes while we read.
        let lent = if push > 0 {
            // SAFETY: dst + (n - push) .. dst + n lies in the caller's buffer, which
            // it keeps untouched until finish_reads (forwarded contract).
            unsafe { self.lend(dst.add(n - push), push, done + (n - push) as u64) }?
        } else {
            None
        };
        let pull = if lent.is_some() { n - push } else { n };
        let mut step = ReadsInFlight {
            dst: dst as usize,
            len: n,
            last: None,
            handle: None,
            lent,
            started,
            stripes: None,
        };
        if pull > 0 && striped {
            let mut parts = [0; MAX_RAILS];
            self.striper
                .as_mut()
                .expect("striped only with rails")
                .split(pull, &mut parts);
            let mut stripes = Box::new([Stripe::default(); MAX_RAILS]);
            // SAFETY: forwarded from this function's contract.
            let h = unsafe { self.post_reads(&link, dst, &parts, &mut stripes, true) }?;
            (step.last, step.handle) = (stripes[0].last, Some(h));
            step.stripes = Some(stripes);
        } else if pull > 0 {
            let mut parts = [0; MAX_RAILS];
            parts[0] = pull;
            let mut stripes = [Stripe::default(); MAX_RAILS];
            // SAFETY: forwarded from this function's contract. On error, dropping
            // `step` revokes a lent part.
            let h = unsafe { self.post_reads(&link, dst, &parts, &mut stripes, false) }?;
            (step.last, step.handle) = (stripes[0].last, Some(h));
        }
        // Both parts are under way: move the cursor past them.
        let z = self.zc.as_mut().expect("checked above");
        let mut left = n as u64;
        while left > 0 {
            let here = (self.zc_segs[z.seg].len - z.seg_off).min(left);
            left -= here;
            z.seg_off += here;
            if z.seg_off == self.zc_segs[z.seg].len {
                z.seg += 1;
                z.seg_off = 0;
            }
        }
        Ok(step)
    }

    /// Lends `len` bytes at `at` to the peer for the transfer's bytes from `offset`:
    /// registers exactly those bytes for remote writing and tells the peer. `None`
    /// when they cannot be registered (they are read instead).
    ///
    /// # Safety
    ///
    /// As [`start_reads`](Self::start_reads), for `at..at + len`.
    unsafe fn lend(
        &mut self,
        at: *mut u8,
        len: usize,
        offset: u64,
    ) -> io::Result<Option<LentPart<F::Region>>> {
        let link = &*self.link;
        // Not through the registration cache: a cached registration would leave the
        // peer able to write here after the get returned.
        // SAFETY: forwarded from this function's contract; the registration is
        // dropped before the caller gets its buffer back (finish_reads, or on error).
        let region = match unsafe {
            link.fabric
                .register(at, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        } {
            Ok(r) => r,
            Err(_) => return Ok(None),
        };
        let number = self.lends_sent + 1;
        let transfer = self.zc.as_ref().map_or(0, |z| z.id);
        link.post_lend(&Lend {
            addr: at as u64,
            rkey: region.rkey(),
            len: len as u32,
            offset,
            transfer,
            number,
        })?;
        self.lends_sent = number;
        Ok(Some(LentPart {
            number,
            _region: region,
        }))
    }

    /// Posts RDMA READs of the transfer's next bytes (from the cursor) into `dst`:
    /// `parts[r]` bytes on rail `r`, each rail's following the one before it.
    /// Fills each rail's stripe in `stripes` (its last read's number, and when it
    /// was posted if `timed`) and returns the registration of `dst` over all of them.
    ///
    /// # Safety
    ///
    /// As [`start_reads`](Self::start_reads), for `dst..dst + parts.sum()`.
    unsafe fn post_reads(
        &mut self,
        link: &Link<F>,
        dst: *mut u8,
        parts: &[usize; MAX_RAILS],
        stripes: &mut [Stripe; MAX_RAILS],
        timed: bool,
    ) -> io::Result<RegHandle> {
        let z = self
            .zc
            .as_ref()
            .expect("called with a transfer in progress");
        let n: usize = parts.iter().sum();
        // SAFETY: forwarded from this function's contract; released in finish_reads.
        let h = unsafe {
            link.rcache
                .acquire(&link.fabric, dst, n, Access::LOCAL_WRITE)
        }?;
        let mut cursor = (z.seg, z.seg_off);
        let mut at = 0usize;
        for (rail, &bytes) in parts.iter().enumerate() {
            if bytes == 0 {
                continue;
            }
            stripes[rail].bytes = bytes;
            // A rail in a protection domain of its own writes through a
            // registration there.
            let lkey = match link.rail_domain(rail) {
                None => Ok(h.lkey()),
                // SAFETY: at + bytes <= n: inside the caller's buffer, which it keeps
                // untouched until finish_reads, where this is released.
                Some(d) => unsafe {
                    d.rcache
                        .acquire(&d.fabric, dst.add(at), bytes, Access::LOCAL_WRITE)
                }
                .map(|r| {
                    stripes[rail].reg = Some(r);
                    r.lkey()
                }),
            };
            // Only adaptive striping reads the time (a clock read a step otherwise).
            if timed {
                stripes[rail].posted = Some(Instant::now());
            }
            let posted = lkey.and_then(|lkey| {
                // SAFETY: at + bytes <= n, inside the registered dst..dst + n, which
                // the caller keeps untouched until finish_reads (forwarded contract).
                unsafe {
                    self.post_range(
                        link,
                        rail,
                        lkey,
                        dst.add(at),
                        cursor,
                        bytes,
                        &mut stripes[rail].last,
                    )
                }
            });
            if let Err(e) = posted {
                // Let what was posted land before the memory is handed back.
                for (r, s) in stripes.iter().enumerate() {
                    if let Some(seq) = s.last {
                        let _ = link.wait_rail_completed(r, seq);
                    }
                }
                crate::engine::receiver::release_stripe_regs(link, stripes);
                link.rcache.release(h);
                return Err(e);
            }
            self.rail_read[rail] += bytes as u64;
            cursor = advance(&self.zc_segs, cursor, bytes as u64);
            at += bytes;
        }
        Ok(h)
    }

    /// Posts the reads of `n` bytes of the transfer from `cursor` (segment, offset
    /// in it) into `dst` on rail `rail`, leaving the last one's number in `last`.
    ///
    /// # Safety
    ///
    /// `dst..dst + n` lies in memory registered with `lkey` that stays untouched
    /// until the reads completed.
    #[allow(clippy::too_many_arguments)]
    unsafe fn post_range(
        &self,
        link: &Link<F>,
        rail: usize,
        lkey: u32,
        dst: *mut u8,
        cursor: (usize, u64),
        n: usize,
        last: &mut Option<u64>,
    ) -> io::Result<()> {
        let (mut seg, mut seg_off) = cursor;
        // Pieces let a NIC pipeline reads on the wire. A queue that carries each read
        // out inside its post (the emulated fabric: one process_vm_readv) gains
        // nothing from them, and one call per segment runs faster: 4 MiB read in one
        // call 420-436 us, in four 1 MiB calls 486-522 (two pinned processes, this
        // host; 1 MiB level either way), and IMB PingPing 4 MiB 497 -> 425 us.
        let unbounded = match rail {
            0 => link.sq.is_unbounded(),
            r => link.rails()[r - 1].sq.is_unbounded(),
        };
        let max_piece = if unbounded { n } else { READ_PIECE };
        let mut posted = 0usize;
        while posted < n {
            let s = self.zc_segs[seg];
            let piece = ((s.len - seg_off) as usize).min(n - posted).min(max_piece);
            let sge = [Sge {
                // SAFETY: posted + piece <= n, inside dst..dst + n.
                addr: unsafe { dst.add(posted) },
                len: piece as u32,
                lkey,
            }];
            // The sender's key for this rail: its own where the sender's rail has a
            // protection domain of its own.
            let rkey = if rail > 0 && rail <= self.zc_keys {
                self.zc_rail_keys[seg][rail]
            } else {
                s.rkey
            };
            // SAFETY: the target lies in the registered dst, which the caller keeps
            // untouched until the read completed.
            *last = Some(unsafe { post_read(link, rail, &sge, s.addr + seg_off, rkey) }?);
            posted += piece;
            seg_off += piece as u64;
            if seg_off == s.len {
                seg += 1;
                seg_off = 0;
            }
        }
        Ok(())
    }
}

/// The cursor (segment, offset in it) `k` bytes after `cursor`.
fn advance(segs: &[RndvSeg], cursor: (usize, u64), mut k: u64) -> (usize, u64) {
    let (mut seg, mut off) = cursor;
    while k > 0 {
        let here = (segs[seg].len - off).min(k);
        k -= here;
        off += here;
        if off == segs[seg].len {
            seg += 1;
            off = 0;
        }
    }
    (seg, off)
}

/// Bytes of an `n`-byte step the peer pushes at `percent`: none when that would be
/// under [`MIN_PUSH`] (a registration costs more than reading so little), all of
/// it at 100.
fn push_share(n: usize, percent: u8) -> usize {
    let push = (n as u128 * u128::from(percent.min(100)) / 100) as usize;
    if push < MIN_PUSH {
        0
    } else {
        push
    }
}

/// Smallest transfer sent on the receiver's advice that it splits with the sender
/// (osu_latency, slow hand-off phase: 16-64 KiB read 4.4-8.5 us, split 7.3-11.4;
/// from 128 KiB split ahead).
pub(super) const SPLIT_BY_ADVICE_MIN: usize = 128 << 10;

/// Smallest part of a step lent to the peer to push.
pub(super) const MIN_PUSH: usize = 4096;

/// Posts a signalled RDMA READ on the link and returns its sequence number.
///
/// # Safety
///
/// `local` must stay valid and unaliased until the link's completed count passes the
/// returned number (see `Link::wait_completed`).
unsafe fn post_read<F: Fabric>(
    link: &Link<F>,
    rail: usize,
    local: &[Sge],
    remote_addr: u64,
    rkey: u32,
) -> io::Result<u64> {
    link.post_numbered_on(rail, |qp, wr_id, signaled| {
        let wr = WorkRequest {
            wr_id,
            opcode: Opcode::Read {
                local,
                remote_addr,
                rkey,
            },
            signaled,
        };
        // SAFETY: forwarded from this function's contract.
        let handed_back = unsafe { qp.post_completing(&wr) }?;
        // A read the fabric finished in the call (the emulated fabric) is counted
        // here, as a polled one would be; a failure is the connection's error, which
        // the wait for this read's number reports.
        if let Some(wc) = handed_back {
            link.count_completion(rail, &wc, &mut None);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::io::{IoSlice, IoSliceMut};

    use super::READ_PIECE;
    use crate::{Config, RdmaStream};

    /// A queue that carries reads out inside the post (the emulated fabric's
    /// default) reads a transfer's segment in one request, however many pieces a
    /// NIC would take: fewer `process_vm_readv` calls. Every byte lands.
    #[test]
    fn an_unbounded_queue_reads_a_segment_in_one_request() {
        let cfg = Config::default().with_zero_copy_private_threshold(Some(16 << 10));
        let (mut a, mut b) = RdmaStream::pair_with(cfg).unwrap();
        let len = 3 * READ_PIECE + 12345;
        let msg: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        // SAFETY: `msg` is untouched until put_nocopy counts it.
        let announce =
            |a: &mut RdmaStream| unsafe { a.channel().sender().put_nocopy(&[IoSlice::new(&msg)]) };
        let link = std::sync::Arc::clone(&b.channel().receiver().link);
        assert!(link.sq.is_unbounded());
        let reads_before = link.sq.next_number();
        assert_eq!(announce(&mut a).unwrap(), 0);
        let mut out = vec![0u8; len];
        let mut got = 0;
        while got < len {
            got += b.get(&mut [IoSliceMut::new(&mut out[got..])]).unwrap();
        }
        while announce(&mut a).unwrap() == 0 {}
        assert!(out == msg);
        assert_eq!(link.sq.next_number() - reads_before, 1, "one read request");
    }
}
