//! The receiver's side of a zero-copy transfer: RDMA READs into the caller's buffer.

use std::io::{self, IoSliceMut};

use super::Lent;
use crate::engine::{GetMode, Link, ReadsInFlight, Receiver, READ_PIECE};
use crate::fabric::{Access, Fabric, Opcode, QueuePair, Sge, WorkRequest};

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
        self.get_inner(iov, GetMode::NoWait(Lent(())))
    }

    /// Starts the reads of the announced transfer's next bytes into `dst`, a buffer
    /// whose caller (of `get_nowait`) promised to keep it untouched until they are
    /// counted, even after this borrow ends.
    pub(crate) fn start_reads_lent(
        &mut self,
        dst: &mut [u8],
        _lent: Lent,
    ) -> io::Result<ReadsInFlight> {
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

    /// Starts RDMA READs of the next bytes of the announced transfer into `dst`
    /// (`len` bytes at most, capped so that all of them fit the read window) and
    /// returns them as in flight.
    ///
    /// # Safety
    ///
    /// `dst..dst + len` must be writable memory that nothing else touches until
    /// [`finish_reads`](Receiver::finish_reads) has seen the reads complete.
    unsafe fn start_reads(&mut self, dst: *mut u8, len: usize) -> io::Result<ReadsInFlight> {
        let link = self.link.clone();
        let z = self
            .zc
            .as_mut()
            .expect("called with a transfer in progress");
        let n = (len as u64)
            .min(z.total - z.done)
            .min((self.max_reads * READ_PIECE) as u64) as usize;
        // SAFETY: forwarded from this function's contract; released in finish_reads.
        let h = unsafe {
            link.rcache
                .acquire(&link.fabric, dst, n, Access::LOCAL_WRITE)
        }?;
        let (mut posted, mut last) = (0usize, None);
        let mut seg = z.seg;
        let mut seg_off = z.seg_off;
        while posted < n {
            let s = z.segs[seg];
            let piece = ((s.len - seg_off) as usize).min(n - posted).min(READ_PIECE);
            let sge = [Sge {
                // SAFETY: posted + piece <= n, inside dst..dst + len.
                addr: unsafe { dst.add(posted) },
                len: piece as u32,
                lkey: h.lkey(),
            }];
            // SAFETY: the target lies in the registered dst, which the caller keeps
            // untouched until finish_reads has seen this read complete.
            match unsafe { post_read(&link, &sge, s.addr + seg_off, s.rkey) } {
                Ok(seq) => last = Some(seq),
                Err(e) => {
                    // Let what was posted land before the memory is handed back.
                    if let Some(seq) = last {
                        let _ = link.wait_completed(seq);
                    }
                    link.rcache.release(h);
                    return Err(e);
                }
            }
            posted += piece;
            seg_off += piece as u64;
            if seg_off == s.len {
                seg += 1;
                seg_off = 0;
            }
        }
        z.seg = seg;
        z.seg_off = seg_off;
        Ok(ReadsInFlight {
            dst: dst as usize,
            len: n,
            last: last.expect("n >= 1, so a read was posted"),
            handle: h,
        })
    }
}

/// Posts a signalled RDMA READ on the link and returns its sequence number.
///
/// # Safety
///
/// `local` must stay valid and unaliased until the link's completed count passes the
/// returned number (see `Link::wait_completed`).
unsafe fn post_read<F: Fabric>(
    link: &Link<F>,
    local: &[Sge],
    remote_addr: u64,
    rkey: u32,
) -> io::Result<u64> {
    link.post_numbered(true, |wr_id, signaled| {
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
        unsafe { link.qp.post(&wr) }
    })
}
