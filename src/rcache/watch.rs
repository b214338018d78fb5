//! The process-wide userfaultfd watcher behind [`RegCache`](super::RegCache).
//!
//! One userfaultfd per process, opened on first use, and one monitor thread
//! (`rch-uffd`) that reads it. A range is watched by registering it in write-protect
//! mode. No page is ever write-protected, so no fault is delivered, only the
//! non-cooperative events: `UNMAP` (munmap, brk shrink, `mmap(MAP_FIXED)` over the
//! range, the old part of an mremap), `REMOVE` (`madvise` DONTNEED, REMOVE, FREE) and
//! `REMAP` (mremap). The monitor copies each event into a fixed ring of 256 ranges and
//! bumps a sequence number; every cache compares it with the last one it processed.
//!
//! # Deadlock rules
//!
//! A thread that unmaps watched memory sleeps in the kernel until the monitor has read
//! the event. So the monitor must never wait for anything such a thread could hold. It
//! allocates nothing. It takes only the log mutex, whose holders copy a few words and
//! never free memory. On the fatal-error path it also takes the descriptor's write
//! lock, whose readers only make an ioctl. It never takes a cache's lock or the
//! watch-set lock, whose holders allocate and free.
//!
//! # No window between munmap returning and the event being logged
//!
//! The kernel wakes the unmapping thread when `read` *dequeues* the event, before the
//! monitor has written it to the log. Without care, `munmap`, `mmap(MAP_FIXED)` and an
//! acquire could all happen before the log shows anything. So the monitor raises `busy`
//! before every `read` and lowers it only after logging what it read, and readers wait
//! while `busy` is set before loading the sequence number. See [`Watcher::drain`].
//!
//! # Fork
//!
//! A userfaultfd acts on the address space that created it, and a child's mappings are
//! not registered with it. A `pthread_atfork` child handler raises a flag; a process
//! that sees it, and is not the one that opened the watcher, treats the watcher as
//! unusable. Its caches then see "events lost", drop what they cached and stop
//! caching.

use std::collections::BTreeMap;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, RwLock};

// Constants and structures of linux/userfaultfd.h (checked against the 6.18 header).

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;
const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const FEATURES: u64 =
    UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;
/// Bits of `uffdio_api.ioctls`: `_UFFDIO_REGISTER` (0) and `_UFFDIO_UNREGISTER` (1).
const NEEDED_IOCTLS: u64 = 1 << 0 | 1 << 1;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_EVENT_REMAP: u8 = 0x14;
const UFFD_EVENT_REMOVE: u8 = 0x15;
const UFFD_EVENT_UNMAP: u8 = 0x16;

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdioRange {
    start: u64,
    len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// `struct uffd_msg`: the C struct is packed, but every field is naturally aligned,
/// so `repr(C)` gives the same offsets (the union `arg` at 8, as three words).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    arg: [u64; 3],
}

const _: () = assert!(size_of::<UffdioApi>() == 24);
const _: () = assert!(size_of::<UffdioRange>() == 16);
const _: () = assert!(size_of::<UffdioRegister>() == 32);
const _: () = assert!(size_of::<UffdioWriteprotect>() == 24);
const _: () = assert!(size_of::<UffdMsg>() == 32);
const _: () = assert!(std::mem::offset_of!(UffdMsg, arg) == 8);

const UFFDIO_API: libc::Ioctl = libc::_IOWR::<UffdioApi>(0xAA, 0x3F);
const UFFDIO_REGISTER: libc::Ioctl = libc::_IOWR::<UffdioRegister>(0xAA, 0x00);
const UFFDIO_UNREGISTER: libc::Ioctl = libc::_IOR::<UffdioRange>(0xAA, 0x01);
const UFFDIO_WRITEPROTECT: libc::Ioctl = libc::_IOWR::<UffdioWriteprotect>(0xAA, 0x06);

// The numbers a C program built against the header prints on x86_64.
#[cfg(target_arch = "x86_64")]
const _: () = assert!(
    UFFDIO_API as u32 == 0xc018_aa3f
        && UFFDIO_REGISTER as u32 == 0xc020_aa00
        && UFFDIO_UNREGISTER as u32 == 0x8010_aa01
        && UFFDIO_WRITEPROTECT as u32 == 0xc018_aa06
);

/// What [`Watcher::check`] learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// No unmap, remap or discard of watched memory is under way in the process:
    /// every one that happened before the call is read by the monitor, and so in
    /// the log for the next [`Watcher::drain`].
    Clear,
    /// One is under way (its thread waits for the monitor): drain once the monitor
    /// has logged it, then check again.
    Changing,
    /// The kernel would not say (the watcher stopped, or an unexpected answer).
    Unknown,
}

/// Events the log keeps; a cache that falls further behind flushes everything.
pub(crate) const LOG_LEN: usize = 256;

/// An event as logged: the byte range `[start, end)` whose mapping changed.
type Span = (u64, u64);

/// What [`Watcher::drain`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drain {
    /// No event since the last call.
    Nothing,
    /// Every event since the last call was passed to the callback.
    Events,
    /// Events were lost (the log wrapped, or the watcher became unusable): treat
    /// every watched range as changed.
    Lost,
}

/// The process's userfaultfd and its event log.
pub(crate) struct Watcher {
    /// The descriptor; `None` once the monitor gave up. Readers of this lock only make
    /// an ioctl, so the monitor may take it for writing.
    fd: RwLock<Option<OwnedFd>>,
    /// Watched ranges `(start, len)` with the number of live cache entries that asked
    /// for each. The monitor never touches it (its holders allocate).
    watched: Mutex<BTreeMap<(usize, usize), u32>>,
    /// The last `LOG_LEN` events; event number `n` sits in slot `n % LOG_LEN`.
    log: Mutex<[Span; LOG_LEN]>,
    /// Number of events logged so far. Stored only by the monitor, with the log locked.
    seq: AtomicU64,
    /// Set while the monitor may hold an event it has dequeued but not logged.
    busy: AtomicBool,
    /// Set by the monitor thread once std's thread setup is behind it.
    ready: AtomicBool,
    /// The monitor gave up after this errno (0 while it runs).
    broken: AtomicI32,
    page: usize,
    /// The process that opened the descriptor.
    pid: u32,
}

/// Set in every child forked after the watcher started (async-signal-safe: one atomic
/// store). Only then is the pid compared, so the usual check is one load.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_in_child() {
    // Relaxed: the child has one thread at this point; later loads are in that thread
    // or in threads it spawns (spawning synchronises).
    FORKED.store(true, Ordering::Relaxed);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoning is ignored: every critical section leaves its data consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The process's watcher, started on first call, or why it cannot exist.
pub(crate) fn get() -> Result<&'static Watcher, String> {
    static WATCHER: OnceLock<Result<&'static Watcher, String>> = OnceLock::new();
    WATCHER.get_or_init(start).clone()
}

/// The system's page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 && (p as usize).is_power_of_two() {
        p as usize
    } else {
        4096
    }
}

/// Opens the userfaultfd, unprivileged flavour first (Linux 5.11+).
fn open_uffd() -> Result<OwnedFd, String> {
    let base = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let mut last = 0;
    for flags in [base | UFFD_USER_MODE_ONLY, base] {
        // SAFETY: userfaultfd takes one integer and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        if fd >= 0 {
            // SAFETY: the descriptor was just created and nothing else owns it.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        last = errno();
    }
    Err(format!(
        "userfaultfd: {} (it needs Linux 4.11 or later, and vm.unprivileged_userfaultfd=1 \
         or CAP_SYS_PTRACE before Linux 5.11)",
        io::Error::from_raw_os_error(last)
    ))
}

fn start() -> Result<&'static Watcher, String> {
    let fd = open_uffd()?;
    let mut api = UffdioApi {
        api: UFFD_API,
        features: FEATURES,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes one uffdio_api, which `api` is.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
        return Err(format!(
            "userfaultfd: the kernel lacks the unmap/remove/remap events ({})",
            io::Error::last_os_error()
        ));
    }
    if api.features & FEATURES != FEATURES || api.ioctls & NEEDED_IOCTLS != NEEDED_IOCTLS {
        return Err("userfaultfd: the kernel lacks the unmap/remove/remap events".into());
    }
    let page = page_size();
    probe_wp(&fd, page)?;
    let raw = fd.as_raw_fd();
    let w: &'static Watcher = Box::leak(Box::new(Watcher {
        fd: RwLock::new(Some(fd)),
        watched: Mutex::new(BTreeMap::new()),
        log: Mutex::new([(0, 0); LOG_LEN]),
        seq: AtomicU64::new(0),
        busy: AtomicBool::new(false),
        ready: AtomicBool::new(false),
        broken: AtomicI32::new(0),
        page,
        pid: std::process::id(),
    }));
    // Registered before anything is watched, so every later child sees the flag.
    // SAFETY: the handler is an `extern "C" fn()` that only stores an atomic.
    if unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) } != 0 {
        return Err("pthread_atfork failed".into());
    }
    // Wait until the monitor's thread is fully set up: std's thread start may
    // allocate, which must be over before any range is watched (a thread that trims
    // the heap under a watched range waits for the monitor with malloc's lock held).
    // The closure owns nothing that needs freeing.
    let spawned = std::thread::Builder::new()
        .name("rch-uffd".into())
        .spawn(move || {
            // Release: pairs with the Acquire load below.
            w.ready.store(true, Ordering::Release);
            monitor(w, raw)
        });
    if let Err(e) = spawned {
        // Nothing is registered yet, so closing cannot strand an unmapping thread.
        *w.fd.write().unwrap_or_else(|e| e.into_inner()) = None;
        return Err(format!("userfaultfd: cannot start the monitor thread: {e}"));
    }
    // Acquire: pairs with the monitor's Release store.
    while !w.ready.load(Ordering::Acquire) {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    Ok(w)
}

/// Checks that anonymous memory can be registered in write-protect mode (the kernel
/// needs `CONFIG_HAVE_ARCH_USERFAULTFD_WP`), before any monitor exists: the page is
/// unregistered again before it is unmapped, so no event is raised.
fn probe_wp(fd: &OwnedFd, page: usize) -> Result<(), String> {
    // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap: {}", io::Error::last_os_error()));
    }
    let range = UffdioRange {
        start: p as u64,
        len: page as u64,
    };
    let mut reg = UffdioRegister {
        range,
        mode: UFFDIO_REGISTER_MODE_WP,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_REGISTER reads and writes one uffdio_register, which `reg` is.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_REGISTER, &mut reg) };
    let err = io::Error::last_os_error();
    if r == 0 {
        let mut range = range;
        // SAFETY: UFFDIO_UNREGISTER reads one uffdio_range, which `range` is.
        unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_UNREGISTER, &mut range) };
    }
    // SAFETY: `p` is the page mapped above, used by nothing else.
    unsafe { libc::munmap(p, page) };
    if r != 0 {
        return Err(format!(
            "userfaultfd: write-protect registration of anonymous memory refused ({err})"
        ));
    }
    Ok(())
}

fn forked_reason() -> String {
    "userfaultfd: this process was forked from the one that opened it".into()
}

/// While set, the monitor leaves events unread (tests: an unmap still under way).
#[cfg(test)]
pub(crate) static HOLD_MONITOR: AtomicBool = AtomicBool::new(false);

/// The monitor thread: waits for events, logs them. Allocates nothing and takes no
/// lock an unmapping thread could hold (see the module documentation).
fn monitor(w: &'static Watcher, fd: RawFd) {
    let mut msgs = [UffdMsg::default(); 32];
    loop {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        if unsafe { libc::poll(&mut pfd, 1, -1) } < 0 {
            match errno() {
                libc::EINTR => continue,
                libc::ENOMEM => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
                e => return w.give_up(e),
            }
        }
        #[cfg(test)]
        while HOLD_MONITOR.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // SeqCst store and fence: `busy` must be visible before the kernel can dequeue
        // an event in `read` (and so wake the thread that unmapped), whatever ordering
        // the system call boundary itself gives.
        w.busy.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        // SAFETY: `msgs` is writable for its full size in bytes.
        let n = unsafe { libc::read(fd, msgs.as_mut_ptr().cast(), std::mem::size_of_val(&msgs)) };
        if n > 0 {
            for m in &msgs[..n as usize / size_of::<UffdMsg>()] {
                w.record(m, fd);
            }
        } else if n < 0 && !matches!(errno(), libc::EAGAIN | libc::EINTR) {
            return w.give_up(errno());
        }
        // Release: a reader whose Acquire load sees `false` here also sees every `seq`
        // store made while `busy` was set.
        w.busy.store(false, Ordering::Release);
    }
}

impl Watcher {
    /// Logs one message (monitor thread only).
    fn record(&self, m: &UffdMsg, fd: RawFd) {
        let [a0, a1, a2] = m.arg;
        match m.event {
            UFFD_EVENT_UNMAP | UFFD_EVENT_REMOVE => self.push((a0, a1)),
            UFFD_EVENT_REMAP => {
                // from, to, len (the length moved): both places changed.
                self.push((a0, a0.saturating_add(a2)));
                self.push((a1, a1.saturating_add(a2)));
            }
            UFFD_EVENT_PAGEFAULT => {
                // Never expected (nothing is write-protected), but a faulting thread
                // would sleep forever: unprotect its page, which wakes it.
                let page = a1 & !(self.page as u64 - 1);
                let mut wp = UffdioWriteprotect {
                    range: UffdioRange {
                        start: page,
                        len: self.page as u64,
                    },
                    mode: 0,
                };
                // SAFETY: UFFDIO_WRITEPROTECT reads one uffdio_writeprotect, `wp`.
                unsafe { libc::ioctl(fd, UFFDIO_WRITEPROTECT, &mut wp) };
                self.push((page, page.saturating_add(self.page as u64)));
            }
            _ => self.push((0, u64::MAX)),
        }
    }

    /// Appends an event (monitor thread only).
    fn push(&self, span: Span) {
        let mut log = lock(&self.log);
        // Relaxed: only this thread stores `seq`, and only with the log locked.
        let n = self.seq.load(Ordering::Relaxed);
        log[(n % LOG_LEN as u64) as usize] = span;
        // Release: pairs with the Acquire load in `drain`'s fast path, which then sees
        // the slot (the slow path reads it under the lock anyway).
        self.seq.store(n + 1, Ordering::Release);
    }

    /// Stops watching after an unexpected error. Closing the descriptor releases the
    /// kernel context: sleeping unmappers wake and every registration goes away.
    fn give_up(&self, errno: i32) {
        // Release: a reader that sees the errno sees everything logged before it.
        self.broken.store(errno.max(1), Ordering::Release);
        *self.fd.write().unwrap_or_else(|e| e.into_inner()) = None;
        self.busy.store(false, Ordering::Release);
    }

    /// `Err(reason)` when events can no longer be trusted in this process.
    pub(crate) fn usable(&self) -> Result<(), String> {
        if FORKED.load(Ordering::Relaxed) && std::process::id() != self.pid {
            return Err(forked_reason());
        }
        // Acquire: pairs with `give_up`'s Release store.
        match self.broken.load(Ordering::Acquire) {
            0 => Ok(()),
            e => Err(format!(
                "userfaultfd monitor stopped: {}",
                io::Error::from_raw_os_error(e)
            )),
        }
    }

    /// The current event count, where a new reader starts.
    pub(crate) fn seq(&self) -> u64 {
        // Acquire: as in `drain`.
        self.seq.load(Ordering::Acquire)
    }

    /// Passes every event logged since `*last` to `f` (as byte ranges `[start, end)`)
    /// and advances `*last`. Every unmap, remap or discard of watched memory that
    /// *returned* before this call began is included.
    ///
    /// That last promise needs the `busy` handshake. The unmapping thread returns only
    /// after the monitor's `read` dequeued the event, which the monitor begins only
    /// after storing `busy = true` (SeqCst). Our caller's acquire is ordered after that
    /// return, so the Acquire load below sees `true`, or the `false` stored after the
    /// event was logged, and then, through Release/Acquire, the new `seq`.
    pub(crate) fn drain(&self, last: &mut u64, mut f: impl FnMut(usize, usize)) -> Drain {
        if self.usable().is_err() {
            return Drain::Lost;
        }
        let mut spins = 0u32;
        // Acquire: pairs with the monitor's Release store of `false`.
        while self.busy.load(Ordering::Acquire) {
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            spins = spins.saturating_add(1);
        }
        // Acquire: pairs with `push`'s Release store (the fast path: nothing new).
        if self.seq.load(Ordering::Acquire) == *last {
            return Drain::Nothing;
        }
        let mut copy = [(0u64, 0u64); LOG_LEN];
        let (from, to) = {
            let log = lock(&self.log);
            // Relaxed: the lock orders this load after every `push` it can see.
            let now = self.seq.load(Ordering::Relaxed);
            if now.wrapping_sub(*last) > LOG_LEN as u64 {
                *last = now;
                return Drain::Lost;
            }
            for n in *last..now {
                copy[(n - *last) as usize] = log[(n % LOG_LEN as u64) as usize];
            }
            (*last, now)
        };
        *last = to;
        for &(s, e) in &copy[..(to - from) as usize] {
            f(
                usize::try_from(s).unwrap_or(usize::MAX),
                usize::try_from(e).unwrap_or(usize::MAX),
            );
        }
        Drain::Events
    }

    /// Whether an unmap, remap or discard of watched memory is under way.
    ///
    /// `drain` sees every change whose system call *returned*; it cannot see one
    /// still under way. The kernel removes the pages (and unlocks the address space)
    /// before it queues the event, so in that moment another thread can map new memory
    /// at the same address and acquire it, and the cache would hand out the old pages'
    /// registration (on verbs a warm-up read zeros so under a starved VM, issue #34).
    /// The kernel counts each such change, from before it unlocks until the monitor
    /// has read its event, and `UFFDIO_WRITEPROTECT` checks that count before anything
    /// else (Linux 5.7 on, which write-protect registration needs anyway): `EAGAIN`
    /// while it is not zero. Given no range, the ioctl then fails with `EINVAL`, having
    /// touched nothing: one system call, no lock, no page table. Call it before the
    /// drain it vouches for.
    pub(crate) fn check(&self) -> Check {
        if self.usable().is_err() {
            return Check::Unknown;
        }
        let fd = self.fd.read().unwrap_or_else(|e| e.into_inner());
        let Some(fd) = fd.as_ref() else {
            return Check::Unknown;
        };
        let mut wp = UffdioWriteprotect {
            range: UffdioRange { start: 0, len: 0 },
            mode: 0,
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads and writes one uffdio_writeprotect, `wp`.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_WRITEPROTECT, &mut wp) } == 0 {
            return Check::Unknown;
        }
        match errno() {
            libc::EAGAIN => Check::Changing,
            libc::EINVAL => Check::Clear,
            _ => Check::Unknown,
        }
    }

    /// Starts watching the page-aligned range `[start, start + len)`.
    ///
    /// # Errors
    ///
    /// The watcher is unusable, or the kernel refused the registration: `EINVAL` for
    /// memory it cannot write-protect (file-backed, device or `VM_PFNMAP` mappings, a
    /// hole, hugetlb ranges not aligned to the huge page), `EBUSY` when another
    /// userfaultfd already watches it.
    pub(crate) fn watch(&self, start: usize, len: usize) -> io::Result<()> {
        self.usable().map_err(io::Error::other)?;
        let mut set = lock(&self.watched);
        {
            let fd = self.fd.read().unwrap_or_else(|e| e.into_inner());
            let fd = fd
                .as_ref()
                .ok_or_else(|| io::Error::other("userfaultfd monitor stopped"))?;
            let mut reg = UffdioRegister {
                range: UffdioRange {
                    start: start as u64,
                    len: len as u64,
                },
                mode: UFFDIO_REGISTER_MODE_WP,
                ioctls: 0,
            };
            // SAFETY: UFFDIO_REGISTER reads and writes one uffdio_register, `reg`.
            if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_REGISTER, &mut reg) } != 0 {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(
                    e.kind(),
                    format!("userfaultfd cannot watch {start:#x}+{len:#x}: {e}"),
                ));
            }
        }
        *set.entry((start, len)).or_insert(0) += 1;
        Ok(())
    }

    /// Stops watching a range given to [`watch`](Self::watch), except pages another
    /// watched range still covers (unregistering those would blind their entries).
    /// Unwatching keeps the number of VMAs bounded: each registration may split a
    /// mapping in up to three, and `vm.max_map_count` is finite. The scan is linear in
    /// the number of watched ranges, on the eviction path only.
    pub(crate) fn unwatch(&self, start: usize, len: usize) {
        // First: in a forked child the lock may have been held by a thread that no
        // longer exists, and the registrations are the parent's anyway.
        if self.usable().is_err() {
            return;
        }
        let mut set = lock(&self.watched);
        match set.get_mut(&(start, len)) {
            Some(n) if *n > 1 => {
                *n -= 1;
                return;
            }
            Some(_) => {
                set.remove(&(start, len));
            }
            None => return,
        }
        let fd = self.fd.read().unwrap_or_else(|e| e.into_inner());
        let Some(fd) = fd.as_ref() else { return };
        let end = start + len;
        let unregister = |s: usize, e: usize| {
            let mut range = UffdioRange {
                start: s as u64,
                len: (e - s) as u64,
            };
            // SAFETY: UFFDIO_UNREGISTER reads one uffdio_range, `range`. A failure
            // (the memory is already gone) leaves nothing to undo.
            unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_UNREGISTER, &mut range) };
        };
        // Keys are ordered by start, so the overlapping ranges come in order.
        let mut cursor = start;
        for &(s, l) in set.range(..(end, 0)).map(|(k, _)| k) {
            let (s, e) = (s.max(start), (s + l).min(end));
            if e <= cursor {
                continue;
            }
            if s > cursor {
                unregister(cursor, s);
            }
            cursor = e;
        }
        if cursor < end {
            unregister(cursor, end);
        }
    }

    /// Number of watched ranges (for tests).
    #[cfg(test)]
    pub(crate) fn watched_count(&self, start: usize, len: usize) -> u32 {
        lock(&self.watched).get(&(start, len)).copied().unwrap_or(0)
    }
}
