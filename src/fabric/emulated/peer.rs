//! The far end of a connection, as the emulated NIC sees it: the peer's tables, the way
//! to reach its memory, and its liveness.
//!
//! A peer domain in this process is used through its own mapping (an `Arc` keeps it).
//! A peer domain in another process is mapped from the descriptor in its card.
//!
//! Data segments of the peer are reached through *this queue pair's own view* of each
//! segment (mapped on first use from the card's descriptor, from the in-process domain,
//! or from `/proc/<pid>/fd`). Owning the view decouples our accesses from the owner's
//! lifetime without any read-modify-write on the hot path: the owner may free a segment
//! while a copy runs; the copy then lands in memory nobody reads any more. Views live in
//! a per-slot array of `AtomicPtr`s; when a slot's generation changes, the old view's
//! pages are swapped for anonymous memory (its addresses stay valid for a copy still in
//! flight) and the address range is unmapped when the queue pair is dropped.

use super::card::CardInfo;
use super::copy;
use super::remote;
use super::shm::{self, Mapping};
use super::table::{RegEntry, RegSnapshot, Table, LAYOUT_SIZE, NO_SEGMENT, SEG_CAPACITY};
use super::{current_pid, lock, DomainInner};
use crate::fabric::{Access, Card, CompletionStatus, DirectTarget, Sge};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Why a work request failed: the completion status and words for
/// [`EmuQp::last_error`](super::EmuQp::last_error).
#[derive(Debug)]
pub(crate) struct Fault {
    /// Completion status to report.
    pub(crate) status: CompletionStatus,
    /// Explanation.
    pub(crate) reason: Cow<'static, str>,
}

impl Fault {
    /// A remote access error.
    pub(crate) fn remote(reason: impl Into<Cow<'static, str>>) -> Fault {
        Fault {
            status: CompletionStatus::RemoteAccessError,
            reason: reason.into(),
        }
    }

    /// A local protection error.
    pub(crate) fn local(reason: impl Into<Cow<'static, str>>) -> Fault {
        Fault {
            status: CompletionStatus::LocalProtectionError,
            reason: reason.into(),
        }
    }

    /// A transport error (peer gone).
    pub(crate) fn transport(reason: impl Into<Cow<'static, str>>) -> Fault {
        Fault {
            status: CompletionStatus::TransportError,
            reason: reason.into(),
        }
    }
}

/// How often, at most, [`Peer::process_gone`] asks the kernel.
const LIVENESS_PERIOD_NS: u64 = 1_000_000;

/// Nanoseconds since the first call in this process (a cheap monotonic clock).
fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// How the liveness of a peer process is watched.
#[derive(Debug)]
enum Watch {
    /// A pidfd: readable once the process has exited.
    Pidfd(OwnedFd),
    /// No pidfd support: `kill(pid, 0)`.
    Kill,
}

impl Watch {
    fn open(pid: i32) -> Watch {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd >= 0 {
            // SAFETY: the kernel just returned this descriptor; nobody else owns it.
            Watch::Pidfd(unsafe { OwnedFd::from_raw_fd(fd as i32) })
        } else {
            Watch::Kill
        }
    }

    fn exited(&self, pid: i32) -> bool {
        match self {
            Watch::Pidfd(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, zero timeout.
                let r = unsafe { libc::poll(&mut p, 1, 0) };
                r > 0 && p.revents != 0
            }
            Watch::Kill => {
                // SAFETY: signal 0 only checks that the process exists.
                let r = unsafe { libc::kill(pid, 0) };
                r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
            }
        }
    }
}

/// A peer in another process.
#[derive(Debug)]
struct RemoteProc {
    /// Our mapping of the peer's domain segment (the `Table` points into it).
    _domain: Mapping,
    pid: i32,
    /// Whether `pid` was shown to be the peer; the reason if not.
    trusted: Result<(), String>,
    /// Liveness watch (only with a trusted pid).
    watch: Option<Watch>,
    last_check: AtomicU64,
}

impl RemoteProc {
    fn new(domain: Mapping, pid: u32, owner_fd: u32, domain_fd: &OwnedFd) -> RemoteProc {
        let pid = pid as i32;
        // Open the pidfd before verifying: if the verification succeeds, the pid named
        // the peer when the pidfd was taken, so the pidfd watches the right process.
        let watch = Watch::open(pid);
        let trusted = verify_pid(pid, owner_fd, domain_fd);
        RemoteProc {
            _domain: domain,
            pid,
            watch: trusted.is_ok().then_some(watch),
            trusted,
            last_check: AtomicU64::new(0),
        }
    }
}

/// Checks that descriptor `owner_fd` of process `pid` (as this process sees pids) is the
/// domain segment we received, i.e. that `pid` is the peer.
fn verify_pid(pid: i32, owner_fd: u32, received: &OwnedFd) -> Result<(), String> {
    let path = format!("/proc/{pid}/fd/{owner_fd}");
    let meta = std::fs::metadata(&path)
        .map_err(|e| format!("cannot check that pid {pid} is the peer ({path}: {e})"))?;
    let (dev, ino, _) = shm::fd_identity(received.as_raw_fd()).map_err(|e| e.to_string())?;
    if meta.dev() == dev && meta.ino() == ino {
        Ok(())
    } else {
        Err(format!(
            "pid {pid} as seen from this process is not the peer (different pid namespace?)"
        ))
    }
}

#[derive(Debug)]
enum Kind {
    /// The peer domain lives in this process.
    Local(Arc<DomainInner>),
    /// The peer domain lives in another process.
    Remote(RemoteProc),
}

/// Our view of one peer segment.
#[derive(Debug)]
struct SegView {
    gen: u32,
    map: Mapping,
}

#[derive(Debug)]
struct SegSlow {
    /// Every view ever installed (owned here, freed when the peer is dropped).
    views: Vec<*mut SegView>,
    /// Descriptors that came with the card, by slot: (generation, descriptor).
    card_fds: HashMap<u32, (u32, OwnedFd)>,
}

// SAFETY: the raw pointers are Box allocations owned exclusively by this struct (shared
// read-only with the fast path, which never frees them).
unsafe impl Send for SegSlow {}

#[derive(Debug)]
struct SegCache {
    /// Current view per slot (null until first use).
    cells: Box<[AtomicPtr<SegView>]>,
    slow: Mutex<SegSlow>,
}

impl Drop for SegCache {
    fn drop(&mut self) {
        let slow = self.slow.get_mut().unwrap_or_else(|e| e.into_inner());
        for &v in &slow.views {
            // SAFETY: each pointer came from Box::into_raw and is freed once, here; with
            // `&mut self` no fast-path reader can hold it any more.
            drop(unsafe { Box::from_raw(v) });
        }
    }
}

/// Where a peer registration that fast writes go to lies in this process, taken from
/// a full check (`Peer::fast_write_target`) so that later writes to it repeat only
/// one: that the owner's table counted no change since (no registration retired, no
/// queue pair or segment gone, the domain not dropped: `DomainTable::changes`).
#[derive(Debug, Clone, Copy)]
struct FastTarget {
    rkey: u32,
    /// The registration's start in the owner's address space, and how many bytes
    /// from there both the registration and our mapping of its segment hold.
    va: u64,
    len: u64,
    /// Where `va` is in this process, inside our view of its segment. Views stay
    /// mapped while the peer lives, so this address stays ours even if the owner
    /// never counts a change.
    base: *mut u8,
    /// The owner's change count read before the full check.
    changes: u64,
}

/// The one-entry cache of a [`FastTarget`]: the target the last remembered write went
/// to, behind a sequence lock. Rewritten in place, so it costs no memory however
/// often the target changes (a ring that grows and shrinks is a new registration
/// each time); a reader that raced a rewrite takes the full check. A stale target is
/// harmless: [`Peer::cached_target`] checks that it is still live before using it.
#[derive(Debug, Default)]
struct FastCache {
    /// Odd while a target is being written. Before the first, every field is zero:
    /// a target of no bytes, which no write fits.
    seq: AtomicU64,
    rkey: AtomicU32,
    va: AtomicU64,
    len: AtomicU64,
    base: AtomicPtr<u8>,
    changes: AtomicU64,
    /// Serialises writers.
    write: Mutex<()>,
}

impl FastCache {
    /// Where `[addr, addr + n)` of registration `rkey` lies in this process, with the
    /// owner's change count of the full check, if the cached target holds it and no
    /// write raced this read. The caller checks that the count is still current.
    #[inline(always)]
    fn find(&self, rkey: u32, addr: u64, n: u64) -> Option<(*mut u8, u64)> {
        // Acquire: the fields loaded below are at least those of this sequence
        // number's write.
        let before = self.seq.load(Ordering::Acquire);
        // Relaxed: the sequence check below tells whether they belong together (an
        // early `None` from a torn read is only a full check more).
        if self.rkey.load(Ordering::Relaxed) != rkey {
            return None;
        }
        let off = addr.checked_sub(self.va.load(Ordering::Relaxed))?;
        let len = self.len.load(Ordering::Relaxed);
        if off > len || n > len - off {
            return None;
        }
        let base = self.base.load(Ordering::Relaxed);
        let changes = self.changes.load(Ordering::Relaxed);
        // Acquire fence: the field loads above happen before the second sequence
        // load, so a write that began meanwhile shows as a changed number.
        std::sync::atomic::fence(Ordering::Acquire);
        if before % 2 == 1 || self.seq.load(Ordering::Relaxed) != before {
            return None;
        }
        // wrapping_add: off + n <= len, which lies inside the view's mapping.
        Some((base.wrapping_add(off as usize), changes))
    }

    /// Replaces the cached target.
    fn write(&self, t: FastTarget) {
        let _g = lock(&self.write);
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq + 1, Ordering::Relaxed);
        // Release fence: a reader that sees any field stored below also sees the odd
        // number stored above, and retries.
        std::sync::atomic::fence(Ordering::Release);
        self.rkey.store(t.rkey, Ordering::Relaxed);
        self.va.store(t.va, Ordering::Relaxed);
        self.len.store(t.len, Ordering::Relaxed);
        self.base.store(t.base, Ordering::Relaxed);
        self.changes.store(t.changes, Ordering::Relaxed);
        // Release: the fields are visible to a reader that loads this number.
        self.seq.store(seq + 2, Ordering::Release);
    }
}

/// The far end of a connection.
#[derive(Debug)]
pub(crate) struct Peer {
    table: Table,
    pid: u32,
    domain_id: u64,
    qp_key: u32,
    kind: Kind,
    segs: SegCache,
    fast: FastCache,
}

impl Peer {
    /// Validates `card` and sets up access to the peer it describes.
    ///
    /// # Errors
    ///
    /// `InvalidData` for a malformed card or domain segment; `ConnectionRefused` when the
    /// peer domain or queue pair no longer exists; system errors from mapping.
    pub(crate) fn connect(card: Card) -> io::Result<Peer> {
        let info = CardInfo::decode(&card.bytes, card.fds.len())?;
        let mut fds = card.fds.into_iter();
        let domain_fd = fds.next().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "emulated fabric card without descriptors",
            )
        })?;
        let card_fds: HashMap<u32, (u32, OwnedFd)> = info
            .segments
            .iter()
            .zip(fds)
            .map(|(s, fd)| (s.slot, (s.gen, fd)))
            .collect();
        let local = if info.pid == current_pid() {
            DomainInner::find_local(info.domain_id, &domain_fd)
        } else {
            None
        };
        let (table, kind) = match local {
            Some(d) => (d.table, Kind::Local(d)),
            None => {
                let map = Mapping::map_shared_fd(&domain_fd, LAYOUT_SIZE)?;
                // SAFETY: the mapping is page-aligned, at least LAYOUT_SIZE bytes (checked
                // by map_shared_fd), shared, and kept in the RemoteProc next to the view
                // for as long as the Peer exists.
                let table = unsafe { Table::new(map.ptr()) };
                table.validate(info.domain_id, info.pid).map_err(|m| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("emulated fabric card: {m}"),
                    )
                })?;
                (
                    table,
                    Kind::Remote(RemoteProc::new(map, info.pid, info.domain_fd, &domain_fd)),
                )
            }
        };
        let peer = Peer {
            table,
            pid: info.pid,
            domain_id: info.domain_id,
            qp_key: info.qp_key,
            kind,
            segs: SegCache {
                cells: (0..SEG_CAPACITY)
                    .map(|_| AtomicPtr::new(ptr::null_mut()))
                    .collect(),
                slow: Mutex::new(SegSlow {
                    views: Vec::new(),
                    card_fds,
                }),
            },
            fast: FastCache::default(),
        };
        if let Err(f) = peer.check_alive() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                f.reason.into_owned(),
            ));
        }
        Ok(peer)
    }

    /// The peer's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Duplicates descriptor `fd` of the peer's process into this one, when it is an
    /// eventfd: what the peer named for us to wake it by (a selector's). Only from a
    /// peer whose pid was verified (its pidfd, `pidfd_getfd`), or from this process.
    ///
    /// # Errors
    ///
    /// `PermissionDenied` for a peer whose pid is not trusted; `InvalidInput` when the
    /// descriptor is not an eventfd; the system call's error otherwise (no such
    /// descriptor, no `pidfd_getfd` in this kernel).
    pub(crate) fn take_eventfd(&self, fd: u32) -> io::Result<OwnedFd> {
        let fd = i32::try_from(fd)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad descriptor number"))?;
        let dup = match &self.kind {
            Kind::Local(_) => {
                // SAFETY: F_DUPFD_CLOEXEC takes a descriptor number and returns a new
                // descriptor or -1; a number that names nothing fails with EBADF.
                let r = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
                if r < 0 {
                    return Err(io::Error::last_os_error());
                }
                r
            }
            Kind::Remote(r) => {
                let (Ok(()), Some(Watch::Pidfd(pidfd))) = (&r.trusted, &r.watch) else {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        "the peer's process is not verified: no wake through its descriptors",
                    ));
                };
                // SAFETY: pidfd_getfd takes a pidfd, a descriptor number of that
                // process and flags, and returns a new descriptor or -1.
                let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
                if r < 0 {
                    return Err(io::Error::last_os_error());
                }
                r as i32
            }
        };
        // SAFETY: the kernel just returned this descriptor; nobody else owns it.
        let owned = unsafe { OwnedFd::from_raw_fd(dup) };
        let link = std::fs::read_link(format!("/proc/self/fd/{dup}"))?;
        if link.as_os_str() != "anon_inode:[eventfd]" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the peer's descriptor {fd} is {link:?}, not an eventfd"),
            ));
        }
        Ok(owned)
    }

    /// True when the peer domain lives in this process.
    pub(crate) fn is_local(&self) -> bool {
        matches!(self.kind, Kind::Local(_))
    }

    /// The checks of [`check_alive`](Self::check_alive), [`lookup`](Self::lookup) and
    /// [`segment_target`](Self::segment_target) for a write into a segment-backed peer
    /// region, with no error reporting: `None` means "take the slow path", which repeats
    /// the checks and says what failed.
    #[inline(always)]
    pub(crate) fn fast_write_target(&self, rkey: u32, addr: u64, n: u64) -> Option<*mut u8> {
        self.cached_target(rkey, addr, n)
            .or_else(|| self.checked_target(rkey, addr, n).map(|(dst, _)| dst))
    }

    /// [`fast_write_target`](Self::fast_write_target) for the data path's small
    /// writes, which go to one registration: a full check also remembers where that
    /// registration lies, so that the next write to it takes the short check.
    #[inline(always)]
    pub(crate) fn fast_write_target_remembered(
        &self,
        rkey: u32,
        addr: u64,
        n: u64,
    ) -> Option<*mut u8> {
        if let Some(dst) = self.cached_target(rkey, addr, n) {
            return Some(dst);
        }
        let (dst, target) = self.checked_target(rkey, addr, n)?;
        self.remember(target);
        Some(dst)
    }

    /// Where `[addr, addr + n)` of registration `rkey` lies in our view of the peer's
    /// memory, after the full check, with the change count that check saw and the
    /// word that counts (see [`QueuePair::direct_target`](crate::fabric::QueuePair::direct_target)).
    pub(crate) fn direct_target(&self, rkey: u32, addr: u64, n: u64) -> Option<DirectTarget> {
        let (base, target) = self.checked_target(rkey, addr, n)?;
        Some(DirectTarget {
            base,
            changes: self.table.changes_word(),
            seen: target.changes,
        })
    }

    /// The short check: the remembered target is `rkey`'s and holds
    /// `[addr, addr + n)`, and the owner's table counted no change since it was
    /// checked in full, so the peer domain and our queue pair at it exist, the key
    /// still names a live registration and its segment is the one we mapped. (A
    /// change the owner makes after this load races the write as it raced the four
    /// loads this one replaces; a peer that changes its table without counting only
    /// misdirects writes into its own memory: our view of a segment stays mapped.)
    #[inline(always)]
    fn cached_target(&self, rkey: u32, addr: u64, n: u64) -> Option<*mut u8> {
        let (dst, changes) = self.fast.find(rkey, addr, n)?;
        if self.table.changes() != changes {
            return None;
        }
        Some(dst)
    }

    /// Makes `target` the one [`cached_target`](Self::cached_target) checks.
    #[cold]
    #[inline(never)]
    fn remember(&self, target: FastTarget) {
        self.fast.write(target);
    }

    /// The full check behind [`fast_write_target`](Self::fast_write_target): where
    /// `[addr, addr + n)` is, and the registration's whole target.
    #[inline(always)]
    fn checked_target(&self, rkey: u32, addr: u64, n: u64) -> Option<(*mut u8, FastTarget)> {
        // Read first: a change counted after it makes the remembered target fail the
        // short check, whether or not the checks below saw the change.
        let changes = self.table.changes();
        if !self.table.alive() {
            return None;
        }
        // Acquire: as in check_alive.
        if self.table.qp(self.qp_key & 0xffff)?.load(Ordering::Acquire) != self.qp_key {
            return None;
        }
        let snap = self.table.reg(rkey & 0xffff)?.snapshot(rkey)?;
        if !Access::from_bits_truncate(snap.access).contains(Access::REMOTE_WRITE)
            || !snap.contains(addr, n)
            || snap.seg_slot == NO_SEGMENT
        {
            return None;
        }
        let cell = self.segs.cells.get(snap.seg_slot as usize)?;
        // Acquire: as in `segment`.
        let p = cell.load(Ordering::Acquire);
        // SAFETY: as in `segment`: non-null cell pointers stay valid while `self` lives.
        let view = unsafe { p.as_ref() }?;
        if view.gen != snap.seg_gen {
            return None;
        }
        let off = snap.seg_off.checked_add(addr - snap.va)?;
        if off.checked_add(n)? > view.map.len() as u64 {
            return None;
        }
        // The registration's bytes that our mapping holds (seg_off <= off, checked).
        let len = snap.len.min(view.map.len() as u64 - snap.seg_off);
        let target = FastTarget {
            rkey,
            va: snap.va,
            len,
            // wrapping_add: seg_off <= off < len of the mapping.
            base: view.map.ptr().wrapping_add(snap.seg_off as usize),
            changes,
        };
        // wrapping_add: off + n <= len, so the result lies inside the mapping.
        Some((view.map.ptr().wrapping_add(off as usize), target))
    }

    /// Fails when the peer domain or queue pair no longer exists (two Acquire loads).
    #[inline]
    pub(crate) fn check_alive(&self) -> Result<(), Fault> {
        if !self.table.alive() {
            return Err(Fault::transport(
                "the peer's protection domain no longer exists",
            ));
        }
        let qp = self
            .table
            .qp(self.qp_key & 0xffff)
            .ok_or_else(|| Fault::transport("bad peer queue-pair index"))?;
        // Acquire: pairs with the Release clear when the peer queue pair is dropped.
        if qp.load(Ordering::Acquire) != self.qp_key {
            return Err(Fault::transport("the peer queue pair no longer exists"));
        }
        Ok(())
    }

    /// Rate-limited (once per millisecond) check that the peer process still runs;
    /// `Some(reason)` once it has exited.
    pub(crate) fn process_gone(&self) -> Option<String> {
        let Kind::Remote(r) = &self.kind else {
            return None;
        };
        let watch = r.watch.as_ref()?;
        let now = now_ns();
        // Relaxed: the timestamp only rate-limits the check; it publishes nothing.
        let last = r.last_check.load(Ordering::Relaxed);
        if now.saturating_sub(last) < LIVENESS_PERIOD_NS {
            return None;
        }
        // Relaxed as above; losing the race just means another thread checks now.
        if r.last_check
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        watch
            .exited(r.pid)
            .then(|| format!("the peer process {} has exited", r.pid))
    }

    /// The registration entry for `rkey` and a consistent snapshot of it.
    #[inline]
    pub(crate) fn lookup(&self, rkey: u32) -> Result<(&RegEntry, RegSnapshot), Fault> {
        let entry = self.table.reg(rkey & 0xffff);
        match entry.and_then(|e| e.snapshot(rkey).map(|s| (e, s))) {
            Some(found) => Ok(found),
            None => Err(Fault::remote(format!(
                "rkey {rkey:#x} does not name a live registration of the peer"
            ))),
        }
    }

    /// Where `[addr, addr + n)` of segment-backed registration `snap` is in this process.
    #[inline]
    pub(crate) fn segment_target(
        &self,
        snap: &RegSnapshot,
        addr: u64,
        n: u64,
    ) -> Result<*mut u8, Fault> {
        let (base, len) = self.segment(snap.seg_slot, snap.seg_gen)?;
        // `addr >= snap.va` was checked by the caller; the rest is checked here against
        // our own mapping, since the peer's table is not trusted.
        let off = snap
            .seg_off
            .checked_add(addr - snap.va)
            .filter(|off| off.checked_add(n).is_some_and(|end| end <= len as u64))
            .ok_or_else(|| Fault::remote("peer registration points outside its segment"))?;
        // wrapping_add: `off + n <= len`, so the result lies inside the mapping.
        Ok(base.wrapping_add(off as usize))
    }

    /// Our view of peer segment `(slot, gen)`: base and length.
    #[inline]
    fn segment(&self, slot: u32, gen: u32) -> Result<(*mut u8, usize), Fault> {
        let cell =
            self.segs.cells.get(slot as usize).ok_or_else(|| {
                Fault::remote("peer registration names a segment slot out of range")
            })?;
        // Acquire: pairs with the Release half of the swap in `segment_slow`, so the
        // view behind the pointer is fully initialised.
        let p = cell.load(Ordering::Acquire);
        // SAFETY: non-null pointers in the cells come from Box::into_raw and are freed
        // only when the Peer is dropped, which cannot happen during `&self`.
        if let Some(v) = unsafe { p.as_ref() } {
            if v.gen == gen {
                return Ok((v.map.ptr(), v.map.len()));
            }
        }
        self.segment_slow(slot, gen)
    }

    #[cold]
    fn segment_slow(&self, slot: u32, gen: u32) -> Result<(*mut u8, usize), Fault> {
        let cell = &self.segs.cells[slot as usize];
        let mut slow = lock(&self.segs.slow);
        // Acquire: as in `segment` (another thread may have installed it meanwhile).
        let cur = cell.load(Ordering::Acquire);
        // SAFETY: as in `segment`.
        if let Some(v) = unsafe { cur.as_ref() } {
            if v.gen == gen {
                return Ok((v.map.ptr(), v.map.len()));
            }
        }
        // Map only a generation the owner still has: a stale request must not bring a
        // dead segment back (and the old view below is dead only because of this).
        let live = self
            .table
            .seg(slot)
            .and_then(|e| e.snapshot(gen))
            .ok_or_else(|| Fault::remote("the peer segment behind this key no longer exists"))?;
        let fd = match slow.card_fds.remove(&slot) {
            Some((g, fd)) if g == gen => fd,
            _ => self.open_segment(slot, gen, live.fd).map_err(|e| {
                Fault::remote(format!(
                    "cannot reach peer segment {slot} (generation {gen}): {e}"
                ))
            })?,
        };
        let map = Mapping::map_shared_fd(&fd, usize::try_from(live.len).unwrap_or(usize::MAX))
            .map_err(|e| Fault::remote(format!("cannot map peer segment {slot}: {e}")))?;
        let (base, len) = (map.ptr(), map.len());
        let view = Box::into_raw(Box::new(SegView { gen, map }));
        slow.views.push(view);
        // AcqRel: Release publishes the new view to fast-path Acquire loads; Acquire
        // makes the old view (published the same way) safe to read here.
        let old = cell.swap(view, Ordering::AcqRel);
        // SAFETY: as in `segment`; the old view stays allocated (in `views`).
        if let Some(old) = unsafe { old.as_ref() } {
            // The slot moved to a new generation, so the old segment is dead: give its
            // pages back, keeping the addresses valid for any copy still using them.
            old.map.release_pages();
        }
        Ok((base, len))
    }

    /// A descriptor for live peer segment `(slot, gen)` that did not come with the card.
    fn open_segment(&self, slot: u32, gen: u32, owner_fd: u32) -> io::Result<OwnedFd> {
        match &self.kind {
            Kind::Local(d) => d.segment_fd(slot, gen),
            Kind::Remote(r) => {
                if let Err(why) = &r.trusted {
                    return Err(io::Error::new(io::ErrorKind::PermissionDenied, why.clone()));
                }
                let path = format!("/proc/{}/fd/{owner_fd}", r.pid);
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
                let fd = OwnedFd::from(file);
                // The descriptor number may have been reused by the owner since it read
                // its table: check by name that we opened the segment we meant.
                let expected = format!(
                    "/memfd:rdmaemu-{:016x}-{slot}-{gen} (deleted)",
                    self.domain_id
                );
                let got = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
                if got.as_os_str() != expected.as_str() {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{path} is {}, not the segment", got.display()),
                    ));
                }
                Ok(fd)
            }
        }
    }

    /// Writes into private (not segment-backed) peer memory, under the entry's in-use
    /// fence.
    ///
    /// # Safety
    ///
    /// `src` must describe `n` readable bytes; `[addr, addr + n)` must have passed the
    /// bounds check against the snapshot taken with `rkey`.
    pub(crate) unsafe fn write_private(
        &self,
        entry: &RegEntry,
        rkey: u32,
        addr: u64,
        src: &[Sge],
        n: u64,
    ) -> Result<(), Fault> {
        self.private_access(entry, rkey, |kind| match kind {
            Kind::Local(_) => {
                // SAFETY: in this process the owner's address is ours; the fence keeps the
                // registration (hence the memory, by register's contract) alive, and the
                // range passed the bounds check (caller contract).
                unsafe { copy::write_direct(addr as usize as *mut u8, src, n) };
                Ok(())
            }
            // SAFETY: src is readable (caller contract); the kernel checks the peer side.
            Kind::Remote(r) => unsafe { remote::write(r.pid, addr, src, n) }
                .map_err(|e| os_fault("process_vm_writev", r.pid, e)),
        })
    }

    /// Reads private (not segment-backed) peer memory, under the entry's in-use fence.
    ///
    /// # Safety
    ///
    /// `dst` must describe `n` writable bytes; `[addr, addr + n)` must have passed the
    /// bounds check against the snapshot taken with `rkey`.
    pub(crate) unsafe fn read_private(
        &self,
        entry: &RegEntry,
        rkey: u32,
        addr: u64,
        dst: &[Sge],
        n: u64,
    ) -> Result<(), Fault> {
        self.private_access(entry, rkey, |kind| match kind {
            Kind::Local(_) => {
                // SAFETY: as in `write_private`; dst is writable (caller contract).
                unsafe { copy::read_direct(addr as usize as *const u8, dst, n) };
                Ok(())
            }
            // SAFETY: dst is writable (caller contract); the kernel checks the peer side.
            Kind::Remote(r) => unsafe { remote::read(r.pid, addr, dst, n) }
                .map_err(|e| os_fault("process_vm_readv", r.pid, e)),
        })
    }

    fn private_access(
        &self,
        entry: &RegEntry,
        rkey: u32,
        copy: impl FnOnce(&Kind) -> Result<(), Fault>,
    ) -> Result<(), Fault> {
        if let Kind::Remote(RemoteProc {
            trusted: Err(why), ..
        }) = &self.kind
        {
            return Err(Fault::remote(format!(
                "cannot reach the peer's private memory: {why}"
            )));
        }
        if !entry.enter(rkey) {
            return Err(Fault::remote(format!("rkey {rkey:#x} was deregistered")));
        }
        let r = copy(&self.kind);
        entry.leave();
        r
    }
}

/// Maps a `process_vm_*` failure to a completion status.
fn os_fault(call: &str, pid: i32, e: io::Error) -> Fault {
    if e.raw_os_error() == Some(libc::ESRCH) {
        Fault::transport(format!("{call}: the peer process {pid} is gone"))
    } else {
        Fault::remote(format!("{call} on the peer process {pid} failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(rkey: u32, va: u64, base: *mut u8) -> FastTarget {
        FastTarget {
            rkey,
            va,
            len: 4096,
            base,
            changes: u64::from(rkey),
        }
    }

    #[test]
    fn the_fast_cache_holds_the_last_target_however_often_it_changes() {
        let cache = FastCache::default();
        let mut mem = [0u8; 4096];
        let base = mem.as_mut_ptr();
        // Empty: no write fits the zero-length target.
        assert!(cache.find(0, 0, 1).is_none());
        // Far more targets than a connection has rings in a day of growing and
        // shrinking (the boxed cache this replaced stopped remembering after 16).
        for k in 1..=1000u32 {
            cache.write(target(k, 1 << 20, base));
            let (dst, changes) = cache.find(k, (1 << 20) + 64, 8).expect("cached");
            assert_eq!(dst, base.wrapping_add(64));
            assert_eq!(changes, u64::from(k));
            // Another key, or bytes outside the target, take the full check.
            assert!(cache.find(k + 1, (1 << 20) + 64, 8).is_none());
            assert!(cache.find(k, (1 << 20) + 4090, 8).is_none());
            assert!(cache.find(k, (1 << 20) - 8, 8).is_none());
        }
    }

    #[test]
    fn a_read_that_races_a_write_takes_the_full_check() {
        let cache = FastCache::default();
        let mut mem = [0u8; 4096];
        cache.write(target(7, 0, mem.as_mut_ptr()));
        // A writer between its two sequence stores: the number is odd.
        cache.seq.fetch_add(1, Ordering::Relaxed);
        assert!(cache.find(7, 0, 8).is_none());
        cache.seq.fetch_add(1, Ordering::Relaxed);
        assert!(cache.find(7, 0, 8).is_some());
    }

    #[test]
    fn concurrent_reads_never_mix_two_targets() {
        let cache = std::sync::Arc::new(FastCache::default());
        let writer = {
            let cache = std::sync::Arc::clone(&cache);
            std::thread::spawn(move || {
                for k in 1..=20_000u32 {
                    // Each target's fields all name k.
                    let base = ptr::null_mut::<u8>().wrapping_add(k as usize * 4096);
                    cache.write(target(k, u64::from(k) << 20, base));
                }
            })
        };
        let mut seen = 0;
        while !writer.is_finished() {
            for k in [1u32, 5_000, 10_000, 15_000, 20_000] {
                if let Some((dst, changes)) = cache.find(k, u64::from(k) << 20, 8) {
                    assert_eq!(changes, u64::from(k));
                    assert_eq!(dst as usize, k as usize * 4096);
                    seen += 1;
                }
            }
        }
        writer.join().unwrap();
        assert!(
            cache.find(20_000, 20_000u64 << 20, 8).is_some(),
            "seen {seen}"
        );
    }
}
