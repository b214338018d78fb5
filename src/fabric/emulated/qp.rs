//! The emulated queue pair: executes work requests at post time.

use super::copy;
use super::pace::Pacer;
use super::peer::{Fault, Peer};
use super::shm;
use super::table::NO_SEGMENT;
use super::{lock, QpSlot, CAPS};
use crate::fabric::{
    Access, Caps, CompletedOp, Completion, CompletionStatus, DirectTarget, FabricError, GatherList,
    Opcode, QpState, QueuePair, RemoteRegion, Sge, WorkRequest,
};
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// [`QpState::ReadyToSend`] in the state word.
const RTS: u32 = 0;
/// [`QpState::Error`] in the state word.
const ERR: u32 = 1;

/// A connected queue pair of the emulated fabric. Work requests execute inside
/// [`post`](QueuePair::post), on the calling thread (see the [module
/// documentation](super) for the guarantees).
///
/// ```
/// use rdma_channel::fabric::emulated::EmuFabric;
/// use rdma_channel::fabric::{Access, Fabric, MemoryRegion, Opcode, PendingQp, QueuePair, QpState, Sge, WorkRequest};
/// let (a, b) = (EmuFabric::new()?, EmuFabric::new()?);
/// let (pa, pb) = (a.create_qp()?, b.create_qp()?);
/// let (ca, cb) = (pa.card()?, pb.card()?);
/// let (qa, _qb) = (pa.connect(cb)?, pb.connect(ca)?);
/// assert!(qa.peer_in_process());
///
/// // A write with a key the peer never handed out fails, and the queue pair stops.
/// let data = [1u8; 8];
/// let sge = [Sge { addr: data.as_ptr() as *mut u8, len: 8, lkey: 0 }];
/// let wr = WorkRequest {
///     wr_id: 9,
///     opcode: Opcode::Write { local: &sge, remote_addr: 0x1000, rkey: 0x1234_5678, inline: true },
///     signaled: false,
/// };
/// // SAFETY: inline data only needs to be valid during the call.
/// unsafe { qa.post(&wr)? };
/// assert_eq!(qa.state(), QpState::Error);
/// assert!(qa.last_error().unwrap().contains("rkey"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct EmuQp {
    slot: QpSlot,
    peer: Peer,
    state: AtomicU32,
    /// Completions, each with the posting index of its request (see `SendSlots`)
    /// and, on a paced queue pair, when it may be polled.
    cq: Mutex<VecDeque<(Completion, u64, Option<Instant>)>>,
    /// Length of `cq`, written under its lock, read without it by `poll`.
    cq_len: AtomicUsize,
    last_error: Mutex<Option<String>>,
    /// A finite send queue's accounting; `None` when requests retire as posted.
    send_slots: Option<Mutex<SendSlots>>,
    /// The peer's eventfd taken for `notify`, with its number and instance there.
    wake: Mutex<Option<(u32, u32, OwnedFd)>>,
    /// The link of a rail with a rate: completions wait until it carried the bytes
    /// (always with `send_slots`, so that every request is counted).
    pacer: Option<Arc<Pacer>>,
}

/// The slots of a finite send queue, counted as a NIC does: every posted request
/// holds one until a completion of it or of a later request has been polled
/// (completions come in posting order, so polling one retires all before it).
struct SendSlots {
    depth: u64,
    /// Requests posted so far (the next request's posting index).
    posted: u64,
    /// One past the highest posting index whose completion was polled.
    freed: u64,
}

impl fmt::Debug for EmuQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmuQp")
            .field("key", &format_args!("{:#x}", self.slot.key))
            .field("peer_pid", &self.peer.pid())
            .field("peer_in_process", &self.peer.is_local())
            .field("state", &self.state())
            .finish()
    }
}

impl EmuQp {
    pub(super) fn new(
        slot: QpSlot,
        peer: Peer,
        send_queue_depth: usize,
        pacer: Option<Arc<Pacer>>,
    ) -> EmuQp {
        debug_assert!(pacer.is_none() || send_queue_depth != usize::MAX);
        EmuQp {
            slot,
            peer,
            state: AtomicU32::new(RTS),
            cq: Mutex::new(VecDeque::with_capacity(64)),
            cq_len: AtomicUsize::new(0),
            last_error: Mutex::new(None),
            send_slots: (send_queue_depth != usize::MAX).then(|| {
                Mutex::new(SendSlots {
                    depth: send_queue_depth as u64,
                    posted: 0,
                    freed: 0,
                })
            }),
            wake: Mutex::new(None),
            pacer,
        }
    }

    /// Why the queue pair went to the error state, in words (`None` while it has not).
    ///
    /// ```
    /// # use rdma_channel::fabric::emulated::EmuFabric;
    /// # use rdma_channel::fabric::{Fabric, PendingQp};
    /// # let f = EmuFabric::new()?;
    /// # let (p1, p2) = (f.create_qp()?, f.create_qp()?);
    /// # let (c1, c2) = (p1.card()?, p2.card()?);
    /// # let (q1, _q2) = (p1.connect(c2)?, p2.connect(c1)?);
    /// assert_eq!(q1.last_error(), None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// The peer's process id, as its card stated it.
    ///
    /// ```
    /// # use rdma_channel::fabric::emulated::EmuFabric;
    /// # use rdma_channel::fabric::{Fabric, PendingQp};
    /// # let f = EmuFabric::new()?;
    /// # let (p1, p2) = (f.create_qp()?, f.create_qp()?);
    /// # let (c1, c2) = (p1.card()?, p2.card()?);
    /// # let (q1, _q2) = (p1.connect(c2)?, p2.connect(c1)?);
    /// assert_eq!(q1.peer_pid(), std::process::id());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn peer_pid(&self) -> u32 {
        self.peer.pid()
    }

    /// True when the peer domain lives in this process (its memory is reached directly
    /// rather than through a second mapping or `process_vm_*`).
    ///
    /// ```
    /// # use rdma_channel::fabric::emulated::EmuFabric;
    /// # use rdma_channel::fabric::{Fabric, PendingQp};
    /// # let f = EmuFabric::new()?;
    /// # let (p1, p2) = (f.create_qp()?, f.create_qp()?);
    /// # let (c1, c2) = (p1.card()?, p2.card()?);
    /// # let (q1, _q2) = (p1.connect(c2)?, p2.connect(c1)?);
    /// assert!(q1.peer_in_process());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn peer_in_process(&self) -> bool {
        self.peer.is_local()
    }

    fn complete(&self, c: Completion, index: u64, due: Option<Instant>) {
        let mut cq = lock(&self.cq);
        cq.push_back((c, index, due));
        // Release (under the lock, so the count is exact): `poll` seeing a non-zero
        // count then takes the lock and finds the entry.
        self.cq_len.store(cq.len(), Ordering::Release);
    }

    fn fail(&self, reason: String) {
        *lock(&self.last_error) = Some(reason);
        // Release: a thread that sees the error state also sees the reason.
        self.state.store(ERR, Ordering::Release);
    }

    /// Checks that every non-empty local entry lies in a live registration of this
    /// domain under its `lkey`, with rights `need`.
    fn check_local(&self, sges: &[Sge], need: Access) -> Result<(), Fault> {
        let table = &self.slot.domain.table;
        for (i, s) in sges.iter().enumerate() {
            if s.len == 0 {
                continue;
            }
            let ok = table
                .reg(s.lkey & 0xffff)
                .and_then(|e| e.snapshot(s.lkey))
                .is_some_and(|r| {
                    Access::from_bits_truncate(r.access).contains(need)
                        && r.contains(s.addr as u64, u64::from(s.len))
                });
            if !ok {
                return Err(Fault::local(format!(
                    "local entry {i} ({} bytes at {:p}, lkey {:#x}) is not inside a registered region with {need:?}",
                    s.len, s.addr, s.lkey
                )));
            }
        }
        Ok(())
    }

    /// Executes an RDMA WRITE of the `n` bytes of `local`.
    ///
    /// # Safety
    ///
    /// `post`'s contract for `local`.
    unsafe fn write(
        &self,
        local: &[Sge],
        remote_addr: u64,
        rkey: u32,
        inline: bool,
        n: u64,
    ) -> Result<(), Fault> {
        self.peer.check_alive()?;
        let (entry, snap) = self.peer.lookup(rkey)?;
        if !Access::from_bits_truncate(snap.access).contains(Access::REMOTE_WRITE) {
            return Err(Fault::remote(format!(
                "the peer region with rkey {rkey:#x} does not allow REMOTE_WRITE"
            )));
        }
        if !snap.contains(remote_addr, n) {
            return Err(Fault::remote(format!(
                "write of {n} bytes at {remote_addr:#x} is outside the peer region {:#x}..+{:#x}",
                snap.va, snap.len
            )));
        }
        if !inline {
            self.check_local(local, Access::NONE)?;
        }
        if n == 0 {
            return Ok(());
        }
        if snap.seg_slot == NO_SEGMENT {
            // SAFETY: forwarded contract; bounds checked above against this snapshot.
            return unsafe { self.peer.write_private(entry, rkey, remote_addr, local, n) };
        }
        let dst = self.peer.segment_target(&snap, remote_addr, n)?;
        // SAFETY: dst..dst + n lies inside our live view of the peer segment
        // (segment_target), and `local` is readable (post's contract).
        unsafe { copy::write_direct(dst, local, n) };
        Ok(())
    }

    /// Executes an RDMA READ of `n` bytes into `local`.
    ///
    /// # Safety
    ///
    /// `post`'s contract for `local`.
    unsafe fn read(&self, local: &[Sge], remote_addr: u64, rkey: u32, n: u64) -> Result<(), Fault> {
        self.peer.check_alive()?;
        let (entry, snap) = self.peer.lookup(rkey)?;
        if !Access::from_bits_truncate(snap.access).contains(Access::REMOTE_READ) {
            return Err(Fault::remote(format!(
                "the peer region with rkey {rkey:#x} does not allow REMOTE_READ"
            )));
        }
        if !snap.contains(remote_addr, n) {
            return Err(Fault::remote(format!(
                "read of {n} bytes at {remote_addr:#x} is outside the peer region {:#x}..+{:#x}",
                snap.va, snap.len
            )));
        }
        self.check_local(local, Access::LOCAL_WRITE)?;
        if n == 0 {
            return Ok(());
        }
        if snap.seg_slot == NO_SEGMENT {
            // SAFETY: forwarded contract; bounds checked above against this snapshot.
            return unsafe { self.peer.read_private(entry, rkey, remote_addr, local, n) };
        }
        let src = self.peer.segment_target(&snap, remote_addr, n)?;
        // SAFETY: src..src + n lies inside our live view of the peer segment, and
        // `local` is writable registered memory (post's contract, checked above).
        unsafe { copy::read_direct(src, local, n) };
        Ok(())
    }
}

impl EmuQp {
    /// The ring's traffic: an unsignalled inline write into a mapped peer segment,
    /// with every check of the general path. True when it was done here; anything
    /// else, including any failed check, goes the general way ([`execute`]), which
    /// reports it. Kept small and inlined into `post`: it is the data path.
    ///
    /// # Safety
    ///
    /// As [`QueuePair::post`].
    #[inline(always)]
    unsafe fn fast_write(&self, wr: &WorkRequest<'_>) -> bool {
        if let WorkRequest {
            opcode:
                Opcode::Write {
                    local,
                    remote_addr,
                    rkey,
                    inline: true,
                },
            signaled: false,
            ..
        } = *wr
        {
            if local.len() <= CAPS.max_sge {
                let n: u64 = local.iter().map(|s| u64::from(s.len)).sum();
                // Acquire: as in `execute`.
                if n <= CAPS.max_inline as u64 && n > 0 && self.state.load(Ordering::Acquire) == RTS
                {
                    if let Some(dst) = self.peer.fast_write_target(rkey, remote_addr, n) {
                        // SAFETY: dst..dst + n lies inside our live view of the peer
                        // segment (fast_write_target), and `local` is readable for this
                        // call (post's contract for inline writes).
                        unsafe { copy::write_direct(dst, local, n) };
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Executes `wr` the general way, its completion (if any) queued for `poll` with
    /// posting index `index`.
    ///
    /// # Safety
    ///
    /// As [`QueuePair::post`].
    #[inline(never)]
    unsafe fn execute(
        &self,
        wr: &WorkRequest<'_>,
        index: u64,
        due: Option<Instant>,
    ) -> Result<(), FabricError> {
        // SAFETY: forwarded from this function's contract.
        if let Some(c) = unsafe { self.execute_now(wr) }? {
            self.complete(c, index, due);
        }
        Ok(())
    }

    /// Executes `wr` the general way and returns its completion, if it has one (it
    /// was signalled, or it failed), for the caller to report.
    ///
    /// # Safety
    ///
    /// As [`QueuePair::post`].
    unsafe fn execute_now(&self, wr: &WorkRequest<'_>) -> Result<Option<Completion>, FabricError> {
        let (local, op) = match wr.opcode {
            Opcode::Write { local, .. } => (local, CompletedOp::Write),
            Opcode::Read { local, .. } => (local, CompletedOp::Read),
        };
        if local.len() > CAPS.max_sge {
            return Err(FabricError::InvalidRequest(
                "more gather/scatter entries than max_sge",
            ));
        }
        let n: u64 = local.iter().map(|s| u64::from(s.len)).sum();
        if matches!(wr.opcode, Opcode::Write { inline: true, .. }) && n > CAPS.max_inline as u64 {
            return Err(FabricError::InvalidRequest(
                "inline write longer than max_inline",
            ));
        }
        let done = |status, byte_len| Completion {
            wr_id: wr.wr_id,
            status,
            op,
            byte_len,
        };
        // Acquire: pairs with the Release in `fail`, so an error set by another thread
        // is seen together with its reason.
        if self.state.load(Ordering::Acquire) != RTS {
            return Ok(Some(done(CompletionStatus::Flushed, 0)));
        }
        let result = match wr.opcode {
            Opcode::Write {
                local,
                remote_addr,
                rkey,
                inline,
            } => {
                // SAFETY: post's contract covers `local`.
                unsafe { self.write(local, remote_addr, rkey, inline, n) }
            }
            Opcode::Read {
                local,
                remote_addr,
                rkey,
            } => {
                // SAFETY: post's contract covers `local`.
                unsafe { self.read(local, remote_addr, rkey, n) }
            }
        };
        match result {
            Ok(()) => Ok(wr.signaled.then(|| done(CompletionStatus::Success, n))),
            Err(fault) => {
                let what = match op {
                    CompletedOp::Write => "RDMA WRITE",
                    CompletedOp::Read => "RDMA READ",
                };
                self.fail(format!("{what} wr_id {}: {}", wr.wr_id, fault.reason));
                Ok(Some(done(fault.status, 0)))
            }
        }
    }
}

impl QueuePair for EmuQp {
    #[inline]
    unsafe fn post(&self, wr: &WorkRequest<'_>) -> Result<(), FabricError> {
        let Some(slots) = &self.send_slots else {
            // SAFETY: forwarded from this function's contract.
            if unsafe { self.fast_write(wr) } {
                return Ok(());
            }
            // SAFETY: forwarded from this function's contract.
            return unsafe { self.execute(wr, 0, None) };
        };
        // Held through the execution, so completions enter the queue in posting order.
        let mut slots = lock(slots);
        if slots.posted - slots.freed >= slots.depth {
            return Err(FabricError::QueueFull);
        }
        let index = slots.posted;
        // A paced request's bytes take their turn on the link whether or not it is
        // signalled: its completion, and every later one, wait for that.
        let due = self.pacer.as_ref().map(|p| p.reserve(wr.bytes()));
        // SAFETY: forwarded from this function's contract.
        let result = if due.is_none() && unsafe { self.fast_write(wr) } {
            Ok(())
        } else {
            // SAFETY: forwarded from this function's contract.
            unsafe { self.execute(wr, index, due) }
        };
        if result.is_ok() {
            slots.posted += 1;
        }
        result
    }

    /// An unbounded queue (no send slots) carries the request out before returning,
    /// so its completion is handed back here instead of through the completion
    /// queue's lock twice (a zero-copy step's ~100 ns).
    #[inline]
    unsafe fn post_completing(
        &self,
        wr: &WorkRequest<'_>,
    ) -> Result<Option<Completion>, FabricError> {
        if self.send_slots.is_some() {
            // SAFETY: forwarded from this function's contract.
            return unsafe { self.post(wr) }.map(|()| None);
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { self.execute_now(wr) }
    }

    #[inline]
    fn write_inline(&self, bytes: &[u8], remote_addr: u64, rkey: u32) -> Result<(), FabricError> {
        let n = bytes.len() as u64;
        // The checks and copy of `fast_write`, straight from the slice; anything it
        // would not take (a finite send queue, which counts the request, a failed
        // queue pair, a bad key or range) goes through `post`, which says what failed.
        // Acquire: as in `execute`.
        if self.send_slots.is_none()
            && n <= CAPS.max_inline as u64
            && n > 0
            && self.state.load(Ordering::Acquire) == RTS
        {
            if let Some(dst) = self.peer.fast_write_target_remembered(rkey, remote_addr, n) {
                let piece = [Sge {
                    addr: bytes.as_ptr().cast_mut(),
                    len: n as u32,
                    lkey: 0,
                }];
                // SAFETY: dst..dst + n lies inside our live view of the peer segment
                // (fast_write_target), and `bytes` is borrowed for this call.
                unsafe { copy::write_direct(dst, &piece, n) };
                return Ok(());
            }
        }
        let mut list = GatherList::<1>::new();
        list.push(bytes);
        self.post_inline_write(0, &list, remote_addr, rkey, false)
    }

    fn can_notify(&self) -> bool {
        true
    }

    fn notify(&self, fd: u32, instance: u32, value: u32) -> io::Result<bool> {
        let mut wake = lock(&self.wake);
        if !matches!(&*wake, Some((n, i, _)) if *n == fd && *i == instance) {
            *wake = Some((fd, instance, self.peer.take_eventfd(fd)?));
        }
        let Some((_, _, efd)) = &*wake else {
            unreachable!("filled above")
        };
        let add = u64::from(value.max(1)).to_ne_bytes();
        // SAFETY: an eventfd we own, and 8 readable bytes: an eventfd write adds them.
        let r = unsafe { libc::write(efd.as_raw_fd(), add.as_ptr().cast(), add.len()) };
        // EAGAIN: the counter is at its limit, so the sleeper is woken already.
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN) {
            return Err(io::Error::last_os_error());
        }
        Ok(true)
    }

    fn direct_target(&self, region: RemoteRegion) -> Option<DirectTarget> {
        // As write_inline's direct path: a finite send queue counts every write, and
        // only a connected queue pair writes. Acquire: as in `execute`.
        if self.send_slots.is_some() || self.state.load(Ordering::Acquire) != RTS {
            return None;
        }
        self.peer
            .direct_target(region.rkey, region.addr, region.len)
    }

    /// Maps the peer's segment (if this end had not yet) and faults in its view of
    /// `region`'s pages in one pass, so the first writes into a grown ring do not
    /// stop at every page.
    fn prepare_remote(&self, region: RemoteRegion) {
        if self.peer.check_alive().is_err() {
            return;
        }
        let Ok((_, snap)) = self.peer.lookup(region.rkey) else {
            return;
        };
        if snap.seg_slot == NO_SEGMENT || !snap.contains(region.addr, region.len) {
            return;
        }
        if let Ok(dst) = self.peer.segment_target(&snap, region.addr, region.len) {
            // SAFETY: segment_target checked that [dst, dst + len) lies inside our live
            // view of the peer's segment, which starts on a page boundary before it.
            unsafe { shm::populate(dst, region.len as usize) };
        }
    }

    fn poll(&self, out: &mut [Completion]) -> usize {
        // Acquire: pairs with the Release store in `complete`; a zero lets the common
        // empty poll skip the lock.
        if out.is_empty() || self.cq_len.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut cq = lock(&self.cq);
        let mut k = out.len().min(cq.len());
        if self.pacer.is_some() {
            // Due times rise along the queue (one link, taken in posting order).
            let now = Instant::now();
            k = cq
                .iter()
                .take(k)
                .take_while(|e| e.2.is_none_or(|d| d <= now))
                .count();
        }
        let mut freed = 0;
        for (slot, (c, index, _)) in out.iter_mut().zip(cq.drain(..k)) {
            *slot = c;
            freed = index + 1;
        }
        // Release, under the lock, as in `complete`.
        self.cq_len.store(cq.len(), Ordering::Release);
        drop(cq);
        // After the queue's lock, never inside it: `post` takes the slots, then the
        // queue.
        if let Some(slots) = &self.send_slots {
            let mut slots = lock(slots);
            slots.freed = slots.freed.max(freed);
        }
        k
    }

    fn state(&self) -> QpState {
        // Acquire: as in `post`.
        if self.state.load(Ordering::Acquire) != RTS {
            return QpState::Error;
        }
        let gone = match self.peer.check_alive() {
            Err(f) => Some(f.reason.into_owned()),
            Ok(()) => self.peer.process_gone(),
        };
        match gone {
            Some(reason) => {
                self.fail(reason);
                QpState::Error
            }
            None => QpState::ReadyToSend,
        }
    }

    fn error_reason(&self) -> Option<String> {
        self.last_error()
    }

    fn caps(&self) -> Caps {
        Caps {
            max_send_wr: self
                .send_slots
                .as_ref()
                .map_or(usize::MAX, |s| lock(s).depth as usize),
            ..CAPS
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use crate::fabric::emulated::EmuFabric;
    use crate::fabric::{Fabric, PendingQp, QueuePair};

    fn eventfd() -> OwnedFd {
        // SAFETY: eventfd takes a count and flags and returns a descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: the kernel just returned it; nobody else owns it.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    fn count(fd: &OwnedFd) -> u64 {
        let mut v = [0u8; 8];
        // SAFETY: a nonblocking eventfd we own, and 8 writable bytes.
        let r = unsafe { libc::read(fd.as_raw_fd(), v.as_mut_ptr().cast(), 8) };
        if r == 8 {
            u64::from_ne_bytes(v)
        } else {
            0
        }
    }

    /// `notify` adds its value to the eventfd the peer named, and takes the
    /// descriptor again when the peer names a new instance under a number it
    /// reused: a wake must reach the newer eventfd, not the one taken before.
    #[test]
    fn notify_follows_a_reused_descriptor_number_to_its_new_eventfd() {
        let f = EmuFabric::new().unwrap();
        let (p1, p2) = (f.create_qp().unwrap(), f.create_qp().unwrap());
        let (c1, c2) = (p1.card().unwrap(), p2.card().unwrap());
        let (q1, _q2) = (p1.connect(c2).unwrap(), p2.connect(c1).unwrap());
        assert!(q1.can_notify());
        let first = eventfd();
        let n = first.as_raw_fd() as u32;
        assert!(q1.notify(n, 1, 4).unwrap());
        assert_eq!(count(&first), 4);
        // The same number now names another eventfd (dup2 replaces it atomically).
        let second = eventfd();
        // SAFETY: dup2 of two descriptors we own; `n` now names the second eventfd
        // and `first` owns it from here on.
        assert!(unsafe { libc::dup2(second.as_raw_fd(), n as i32) } >= 0);
        assert!(q1.notify(n, 2, 8).unwrap());
        assert_eq!(count(&second), 8, "the wake reached the newer eventfd");
        // A descriptor that is no eventfd is refused.
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let err = q1.notify(file.as_raw_fd() as u32, 3, 1).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }
}
