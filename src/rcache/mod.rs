//! A registration cache that never hands out a stale registration.
//!
//! Zero-copy transfers register user buffers, and on verbs registering pins pages, which
//! is slow. So registrations are cached by address range. The classic bug of such
//! caches goes like this: the user frees a buffer, a new mapping lands at the same
//! address, the cache hits the old registration, and the NIC moves the *old* pinned
//! pages (libfabric #1000/#1350, Open MPI #4509).
//!
//! Here every cached range is watched with a userfaultfd (`watch.rs`). The kernel
//! then reports every way the mapping can go away: `munmap`, including glibc's own
//! munmap inside `free()` and a shrinking `brk`; `mmap(MAP_FIXED)` over it; `mremap`;
//! and `madvise(DONTNEED/REMOVE/FREE)`. Interposing `munmap` (UCX's ucm) misses the calls
//! glibc makes internally unless malloc itself is patched. And the unmapping thread
//! sleeps until our monitor has read the event. The kernel wakes it at the read, a
//! moment before the event reaches our log; a handshake with the monitor covers that
//! moment (see `watch.rs`). So once `munmap` returns, the next acquire sees the change.
//! (Without the handshake, the remap tests below do hit stale entries.) An unmap in
//! another thread that has not returned yet is the remaining window: the kernel
//! removes the pages before it queues the event, so memory mapped at the same address
//! meanwhile could be acquired before any event shows. So where a stale registration
//! would move the old pages ([`Fabric::registrations_pin_pages`]: verbs), every hit on
//! a cached entry is first confirmed with the kernel (`Watcher::check` in `watch.rs`:
//! one ioctl that fails while such a change awaits the monitor); the acquire then
//! waits for the event, drains it, and looks again.
//!
//! Without userfaultfd (`ENOSYS`, `EPERM` from seccomp or `vm.unprivileged_userfaultfd`,
//! kernels before 4.11, `RCH_RCACHE=off`, a forked child) user memory is not cached at
//! all. Every acquire registers and every release deregisters, which is slow but
//! never stale. Memory from [`RegCache::alloc`] is the cache's own and is always
//! reused.
//!
//! Limits, stated honestly:
//! * A cached registration can outlive its memory until the next call that processes
//!   events ([`RegCache::acquire`], [`RegCache::stats`]). Nothing uses it meanwhile:
//!   the channel names a registration to its peer only between acquire and release.
//!   Verbs keeps the old pages pinned, and the emulated fabric touches registered
//!   memory only when a request names its key.
//! * Registrations cover whole pages. The peer gets rights over the bytes that share
//!   a page with the buffer; the channel trusts its peer to stay inside the buffer it
//!   was told about, as every MPI registration cache does.
//! * Shared file mappings whose file is truncated through another descriptor raise no
//!   event. Regular file mappings cannot be watched at all and stay uncached; shmem can.
//! * Memory that another userfaultfd already watches (the application's own, say)
//!   cannot be watched and stays uncached.

mod buf;
mod domain;
mod watch;

pub use buf::RdmaBuf;

use std::collections::BTreeMap;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::fabric::{Access, Fabric, MemoryRegion};
use watch::{Check, Drain, Watcher};

// Defined with the settings that carry it (config is the bottom layer).
pub use crate::config::CacheLimits;

/// Counters of a [`RegCache`].
///
/// `misses` counts every acquire that registered memory; `uncached` counts those among
/// them whose registration was not kept (no room, no watcher, or the range cannot be
/// watched) and is dropped on release.
///
/// ```
/// assert_eq!(rdma_channel::rcache::CacheStats::default().hits, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Acquires served by an existing registration.
    pub hits: u64,
    /// Acquires that registered memory.
    pub misses: u64,
    /// Unused registrations dropped to stay within [`CacheLimits`].
    pub evictions: u64,
    /// Registrations dropped or retired because their memory changed (an event of the
    /// watcher, lost events, or [`RegCache::invalidate`]).
    pub invalidations: u64,
    /// Misses whose registration was not cached.
    pub uncached: u64,
    /// Cached registrations now (not counting [`RegCache::alloc`] memory).
    pub entries: usize,
    /// Bytes they cover.
    pub bytes: usize,
}

/// Whether a cache can safely keep registrations of user memory.
///
/// ```
/// use rdma_channel::rcache::{CacheLimits, RegCache, WatchMode, WatchPolicy};
/// use rdma_channel::fabric::emulated::EmuFabric;
/// let c = RegCache::<EmuFabric>::with_policy(CacheLimits::default(), WatchPolicy::Off);
/// assert!(matches!(c.watch_mode(), WatchMode::Unavailable(_)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchMode {
    /// Unmaps are reported by userfaultfd; user memory is cached.
    Userfaultfd,
    /// No watcher (the reason says why); user memory is registered per acquire.
    Unavailable(String),
}

/// Whether to watch memory at all, normally from `RCH_RCACHE`.
///
/// ```
/// use rdma_channel::rcache::WatchPolicy;
/// assert_eq!(WatchPolicy::parse("off")?, WatchPolicy::Off);
/// assert!(WatchPolicy::parse("sometimes").is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WatchPolicy {
    /// Use userfaultfd when the kernel allows it (the default).
    #[default]
    Auto,
    /// Never cache user memory.
    Off,
}

impl WatchPolicy {
    /// Parses `auto` or `off` (ASCII case ignored; the empty string means `auto`).
    ///
    /// ```
    /// use rdma_channel::rcache::WatchPolicy;
    /// assert_eq!(WatchPolicy::parse("AUTO")?, WatchPolicy::Auto);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `InvalidInput` for anything else, naming `RCH_RCACHE`.
    pub fn parse(value: &str) -> io::Result<WatchPolicy> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(WatchPolicy::Auto),
            "off" => Ok(WatchPolicy::Off),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("RCH_RCACHE={value:?}: expected `auto` or `off`"),
            )),
        }
    }

    /// The policy in `RCH_RCACHE` (unset means `auto`).
    ///
    /// ```
    /// use rdma_channel::rcache::WatchPolicy;
    /// if rdma_channel::settings::RCACHE.value()?.is_none() {
    ///     assert_eq!(WatchPolicy::from_env()?, WatchPolicy::Auto);
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`parse`](Self::parse); a value that is not Unicode is refused the same way.
    pub fn from_env() -> io::Result<WatchPolicy> {
        match crate::settings::RCACHE.value()? {
            None => Ok(WatchPolicy::Auto),
            Some(v) => WatchPolicy::parse(&v),
        }
    }
}

/// A registration lent out by [`RegCache::acquire`]; give it back with
/// [`RegCache::release`], exactly once.
#[derive(Clone, Copy, Debug)]
pub struct RegHandle {
    lkey: u32,
    rkey: u32,
    start: usize,
    end: usize,
    owned: bool,
    slot: u32,
    id: u64,
}

impl RegHandle {
    /// Local key, for gather/scatter lists.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key, for the peer.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// True when the memory came from [`RegCache::alloc`].
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// The whole registered range (page-aligned for user memory), which contains the
    /// acquired one.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.start..self.end
    }
}

/// Where an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// In the lookup index, counted against the limits.
    Cached,
    /// Memory from `alloc`: in the `owned` map, never evicted or invalidated.
    Owned,
    /// Invalidated while in use, or never cached: dropped on the last release.
    Retired,
}

struct Entry<R> {
    region: R,
    id: u64,
    start: usize,
    end: usize,
    access: Access,
    refs: u32,
    last_use: u64,
    kind: Kind,
    /// Registered with the watcher (unwatched when the entry dies).
    watched: bool,
}

/// A registration to drop, and a range to unwatch, once the cache lock is released.
struct Doomed<R> {
    region: R,
    watched: Option<(usize, usize)>,
}

struct Inner<R> {
    slots: Vec<Option<Entry<R>>>,
    free_slots: Vec<u32>,
    /// Cached entries by (start, id). Entries may overlap.
    index: BTreeMap<(usize, u64), u32>,
    /// Owned allocations by start (distinct mappings, so disjoint).
    owned: BTreeMap<usize, u32>,
    /// At least the length of every indexed entry: bounds the backward scans.
    max_len: usize,
    bytes: usize,
    next_id: u64,
    tick: u64,
    /// Last watcher event processed.
    last_seq: u64,
    stats: CacheStats,
}

/// A registration cache for one protection domain (pass the same fabric to every
/// call), shared by every connection of that domain ([`RegCache::for_domain`]).
///
/// ```
/// use rdma_channel::fabric::{emulated::EmuFabric, Access};
/// use rdma_channel::rcache::{CacheLimits, RegCache, WatchMode};
///
/// let fabric = EmuFabric::new()?;
/// let cache = RegCache::new(CacheLimits::default());
/// let buf = vec![7u8; 1 << 16];
/// for _ in 0..2 {
///     // SAFETY: `buf` stays allocated until the handle is released.
///     let h = unsafe { cache.acquire(&fabric, buf.as_ptr(), buf.len(), Access::REMOTE_READ)? };
///     cache.release(h);
/// }
/// let s = cache.stats();
/// if cache.watch_mode() == WatchMode::Userfaultfd {
///     assert_eq!((s.misses, s.hits), (1, 1));
/// } else {
///     assert_eq!((s.misses, s.uncached), (2, 2)); // never cached without a watcher
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct RegCache<F: Fabric> {
    inner: Mutex<Inner<F::Region>>,
    /// The lowest start and highest end of the memory from [`alloc`](Self::alloc)
    /// (`usize::MAX` and 0 while there is none), so that [`is_owned`](Self::is_owned),
    /// asked for every large buffer a sender puts, answers for ordinary memory
    /// without the lock. Written under the lock.
    owned_hull: [AtomicUsize; 2],
    limits: CacheLimits,
    /// The watcher, or why there is none.
    watcher: Result<&'static Watcher, String>,
    page: usize,
}

// Locking: cache lock, then the watcher's watch-set lock, then its descriptor lock;
// the monitor thread takes none of the first two. A thread may block inside the cache
// lock while unmapping watched memory (a region's drop, or free() trimming the heap
// under a registration): it waits for the monitor, which never waits for us.

/// How long an acquire waits for a change under way ([`Check::Changing`]) to reach the
/// log before it registers the memory afresh instead: a moment normally (the monitor
/// reads events within microseconds), bounded so that a process unmapping watched
/// memory without pause cannot hold an acquire up.
struct Patience {
    tries: u32,
    since: Option<std::time::Instant>,
}

impl Patience {
    const SPINS: u32 = 64;
    const LIMIT: std::time::Duration = std::time::Duration::from_millis(10);

    fn new() -> Patience {
        Patience {
            tries: 0,
            since: None,
        }
    }

    /// Waits a little; false once the limit has passed.
    fn wait(&mut self) -> bool {
        self.tries += 1;
        if self.tries <= Self::SPINS {
            std::hint::spin_loop();
            return true;
        }
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() > Self::LIMIT {
            return false;
        }
        // The monitor needs a CPU (a starved VM may have one for everything).
        std::thread::sleep(std::time::Duration::from_micros(20));
        true
    }
}

impl<F: Fabric> RegCache<F> {
    /// A cache under `RCH_RCACHE` (`auto`, the default, or `off`). An invalid value
    /// disables caching of user memory and [`watch_mode`](Self::watch_mode) names it;
    /// [`WatchPolicy::from_env`] reports it as an error instead.
    ///
    /// ```
    /// use rdma_channel::rcache::{CacheLimits, RegCache};
    /// let c = RegCache::<rdma_channel::fabric::emulated::EmuFabric>::new(CacheLimits::default());
    /// assert_eq!(c.limits(), CacheLimits::default());
    /// ```
    pub fn new(limits: CacheLimits) -> RegCache<F> {
        match WatchPolicy::from_env() {
            Ok(p) => RegCache::with_policy(limits, p),
            Err(e) => RegCache::build(limits, Err(format!("{e}; caching disabled"))),
        }
    }

    /// A cache with an explicit policy (ignores the environment).
    ///
    /// ```
    /// use rdma_channel::rcache::{CacheLimits, RegCache, WatchPolicy};
    /// let c = RegCache::<rdma_channel::fabric::emulated::EmuFabric>::with_policy(
    ///     CacheLimits { max_entries: 4, max_bytes: 1 << 20 },
    ///     WatchPolicy::Auto,
    /// );
    /// assert_eq!(c.limits().max_entries, 4);
    /// ```
    pub fn with_policy(limits: CacheLimits, policy: WatchPolicy) -> RegCache<F> {
        let watcher = match policy {
            WatchPolicy::Auto => watch::get(),
            WatchPolicy::Off => {
                Err("caching of user memory is off (WatchPolicy::Off, RCH_RCACHE=off)".into())
            }
        };
        RegCache::build(limits, watcher)
    }

    fn build(limits: CacheLimits, watcher: Result<&'static Watcher, String>) -> RegCache<F> {
        let last_seq = watcher.as_ref().map_or(0, |w| w.seq());
        RegCache {
            owned_hull: [AtomicUsize::new(usize::MAX), AtomicUsize::new(0)],
            inner: Mutex::new(Inner {
                slots: Vec::new(),
                free_slots: Vec::new(),
                index: BTreeMap::new(),
                owned: BTreeMap::new(),
                max_len: 0,
                bytes: 0,
                next_id: 1,
                tick: 0,
                last_seq,
                stats: CacheStats::default(),
            }),
            limits,
            watcher,
            page: watch::page_size(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<F::Region>> {
        // Poisoning is ignored: no critical section panics with the state half-updated
        // (short of allocation failure, which aborts).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns a registration covering `[addr, addr + len)` with at least `access`,
    /// reusing a cached one when possible. On a miss it registers the page-aligned
    /// superset of the range and caches it if it can be watched and fits the limits.
    /// Cost: four uncontended atomic loads to learn that no memory changed, a lookup
    /// in O(log n + k), where k counts the entries starting within the longest
    /// entry's length before `addr`, and on a hit of user memory one ioctl that
    /// confirms the entry's mapping (see the module documentation). The registration
    /// itself is done with the cache lock held.
    ///
    /// # Safety
    ///
    /// `[addr, addr + len)` must be mapped in this process from now until the handle
    /// is released.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a null, empty or wrapping range; any error of
    /// [`Fabric::register`] (e.g. verbs refusing to pin read-only memory). Callers
    /// fall back to copying.
    pub unsafe fn acquire(
        &self,
        fabric: &F,
        addr: *const u8,
        len: usize,
        access: Access,
    ) -> io::Result<RegHandle> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.acquire_with(fabric, addr, len, access, fabric.registrations_pin_pages()) }
    }

    /// [`acquire`](Self::acquire), with each hit of user memory confirmed with the
    /// kernel when `confirm` (see the module documentation).
    ///
    /// # Safety
    ///
    /// As [`acquire`](Self::acquire).
    unsafe fn acquire_with(
        &self,
        fabric: &F,
        addr: *const u8,
        len: usize,
        access: Access,
        confirm: bool,
    ) -> io::Result<RegHandle> {
        let a = addr as usize;
        let end = match a.checked_add(len) {
            Some(end) if len > 0 && a != 0 => end,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "cannot register a null, empty or wrapping range",
                ))
            }
        };
        let mut doomed = Vec::new();
        let result = {
            let mut g = self.lock();
            let mut changing = Patience::new();
            loop {
                self.process_events(&mut g, &mut doomed);
                let Some(slot) = g.lookup(a, end, access) else {
                    // SAFETY: forwarded from this function's contract.
                    break unsafe { self.miss(&mut g, fabric, a, end, access, &mut doomed, true) };
                };
                if g.is_owned(slot) || !confirm {
                    break Ok(g.take_ref(slot, true));
                }
                // A cached entry: its mapping may have gone in a change still under
                // way, which no drain shows yet (Watcher::check). Checked first, then
                // drained again: unchanged, nothing before the check escaped the log.
                let check = self.watcher.as_ref().map_or(Check::Unknown, |w| w.check());
                match check {
                    Check::Clear => {
                        let seen = g.last_seq;
                        self.process_events(&mut g, &mut doomed);
                        if g.last_seq == seen {
                            break Ok(g.take_ref(slot, true));
                        }
                    }
                    Check::Changing if changing.wait() => {}
                    Check::Changing | Check::Unknown => {
                        // Changes keep coming, or the kernel would not say: register
                        // afresh, uncached.
                        // SAFETY: forwarded from this function's contract.
                        break unsafe {
                            self.miss(&mut g, fabric, a, end, access, &mut doomed, false)
                        };
                    }
                }
            }
        };
        self.finish(doomed);
        result
    }

    /// Registers `[a, end)` for a miss and enters it: cached when `cache` and the
    /// range can be watched and fits the limits, else for this use only (dropped at
    /// its release).
    ///
    /// # Safety
    ///
    /// As [`acquire`](Self::acquire).
    #[allow(clippy::too_many_arguments)]
    unsafe fn miss(
        &self,
        g: &mut Inner<F::Region>,
        fabric: &F,
        a: usize,
        end: usize,
        access: Access,
        doomed: &mut Vec<Doomed<F::Region>>,
        cache: bool,
    ) -> io::Result<RegHandle> {
        g.stats.misses += 1;
        let ps = a & !(self.page - 1);
        let pe = end.checked_add(self.page - 1).map(|e| e & !(self.page - 1));
        // Watch before registering: any change after the watch is reported, so the
        // registration, made later, cannot silently describe older pages.
        let mut watched = None;
        if let (true, Ok(w), Some(pe)) = (cache, self.watcher.as_ref(), pe) {
            let plen = pe - ps;
            if plen <= self.limits.max_bytes
                && self.limits.max_entries > 0
                && w.watch(ps, plen).is_ok()
            {
                if g.make_room(plen, self.limits, doomed) {
                    watched = Some((ps, pe));
                } else {
                    w.unwatch(ps, plen);
                }
            }
        }
        // Uncached registrations cover only the requested bytes.
        let (rs, re) = watched.unwrap_or((a, end));
        let register = || {
            // SAFETY: the caller keeps [a, end) mapped until release, and [rs, re) adds
            // only the rest of the pages holding those bytes, mapped with them. After
            // release a cached entry may outlive its mapping until the watcher's event
            // is processed; no request names its keys meanwhile (module docs).
            unsafe { fabric.register(rs as *mut u8, re - rs, access) }
        };
        let region = match register() {
            Ok(r) => Ok(r),
            // A full registration table: give back what this cache holds unused.
            Err(e) if e.kind() == io::ErrorKind::OutOfMemory && g.evictable() => {
                while g.evict_one(doomed) {}
                self.finish(std::mem::take(doomed));
                register()
            }
            Err(e) => Err(e),
        };
        let region = match region {
            Ok(r) => r,
            Err(e) => {
                if let (Some((s, e2)), Ok(w)) = (watched, self.watcher.as_ref()) {
                    w.unwatch(s, e2 - s);
                }
                return Err(e);
            }
        };
        let kind = if watched.is_some() {
            Kind::Cached
        } else {
            g.stats.uncached += 1;
            Kind::Retired
        };
        let slot = g.insert(region, rs, re, access, kind, watched.is_some());
        Ok(g.take_ref(slot, false))
    }

    /// Gives a handle back. The last release of a retired (invalidated or uncached)
    /// registration deregisters it. A handle of another cache, or one already
    /// released, is ignored when it can be told apart.
    pub fn release(&self, h: RegHandle) {
        let doomed = {
            let mut g = self.lock();
            let slot = h.slot as usize;
            match g.slots.get_mut(slot).and_then(Option::as_mut) {
                Some(e) if e.id == h.id && e.refs > 0 => {
                    e.refs -= 1;
                    if e.refs == 0 && e.kind == Kind::Retired {
                        g.remove(h.slot)
                    } else {
                        None
                    }
                }
                _ => None,
            }
        };
        self.finish(doomed.into_iter().collect());
    }

    /// Allocates `len` bytes of zeroed, registered memory (like `MPI_Alloc_mem` or
    /// `ucp_mem_map`) with [`Fabric::alloc_region`]: on the emulated fabric a shared
    /// segment the peer reads with a plain copy. Rights: local write, remote read and
    /// write. The cache keeps it as an owned entry: any acquire inside it hits, and it
    /// is never evicted or invalidated (nor counted against the limits) until
    /// [`free`](Self::free).
    ///
    /// ```
    /// use rdma_channel::fabric::{emulated::EmuFabric, Access};
    /// use rdma_channel::rcache::{CacheLimits, RegCache};
    /// let fabric = EmuFabric::new()?;
    /// let cache = RegCache::new(CacheLimits::default());
    /// let p = cache.alloc(&fabric, 8192)?;
    /// // SAFETY: inside the live allocation, released before free.
    /// let h = unsafe { cache.acquire(&fabric, p.as_ptr().add(100), 1000, Access::REMOTE_READ)? };
    /// assert!(h.is_owned());
    /// cache.release(h);
    /// // SAFETY: `p` came from alloc and is not used afterwards.
    /// unsafe { cache.free(p.as_ptr())? };
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `InvalidInput` for 0 bytes; any error of [`Fabric::alloc_region`].
    pub fn alloc(&self, fabric: &F, len: usize) -> io::Result<NonNull<u8>> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot allocate zero bytes",
            ));
        }
        let rights = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let region = fabric.alloc_region(len, rights)?;
        let ptr = NonNull::new(region.addr())
            .ok_or_else(|| io::Error::other("the fabric returned a null region"))?;
        let (start, end) = (
            region.addr() as usize,
            region.addr() as usize + region.len(),
        );
        let mut g = self.lock();
        let slot = g.insert(region, start, end, rights, Kind::Owned, false);
        g.owned.insert(start, slot);
        self.set_owned_hull(&g);
        Ok(ptr)
    }

    /// Frees memory from [`alloc`](Self::alloc) and deregisters it.
    ///
    /// # Safety
    ///
    /// Nothing may use the memory after this returns `Ok` (it is unmapped).
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `ptr` is not the start of a live allocation of this cache;
    /// `WouldBlock` if a handle inside it is still acquired (release it, then free
    /// again). Nothing is freed on error.
    pub unsafe fn free(&self, ptr: *mut u8) -> io::Result<()> {
        let doomed = {
            let mut g = self.lock();
            let Some(&slot) = g.owned.get(&(ptr as usize)) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not the start of memory from RegCache::alloc",
                ));
            };
            if g.slots[slot as usize].as_ref().is_some_and(|e| e.refs > 0) {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "the memory is still acquired: release its handles first",
                ));
            }
            g.owned.remove(&(ptr as usize));
            let doomed = g.remove(slot);
            self.set_owned_hull(&g);
            doomed
        };
        // Deregistering (and unmapping) outside the lock.
        drop(doomed);
        Ok(())
    }

    /// True when `[ptr, ptr + len)` lies inside memory from [`alloc`](Self::alloc).
    ///
    /// ```
    /// use rdma_channel::rcache::{CacheLimits, RegCache};
    /// let fabric = rdma_channel::fabric::emulated::EmuFabric::new()?;
    /// let cache = RegCache::new(CacheLimits::default());
    /// let p = cache.alloc(&fabric, 100)?;
    /// assert!(cache.is_owned(p.as_ptr(), 100));
    /// assert!(!cache.is_owned(p.as_ptr(), 101));
    /// # unsafe { cache.free(p.as_ptr())? };
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_owned(&self, ptr: *const u8, len: usize) -> bool {
        let a = ptr as usize;
        let Some(end) = a.checked_add(len) else {
            return false;
        };
        // Relaxed: memory from alloc reached the caller after its hull was stored
        // (the pointer came back from alloc, in this thread or through a hand-over
        // that orders the two), so a range inside it is never outside the hull read
        // here; memory outside every allocation needs no ordering at all.
        if a < self.owned_hull[0].load(Ordering::Relaxed)
            || end > self.owned_hull[1].load(Ordering::Relaxed)
        {
            return false;
        }
        self.lock().owned_containing(a, end).is_some()
    }

    /// Stores the hull of the owned memory in `g` (called with the lock held).
    fn set_owned_hull(&self, g: &Inner<F::Region>) {
        let (lo, hi) = match (g.owned.first_key_value(), g.owned.last_key_value()) {
            // Allocations do not overlap: the last to start ends last.
            (Some((&lo, _)), Some((_, &last))) => {
                let end = g.slots[last as usize]
                    .as_ref()
                    .map_or(usize::MAX, |e| e.end);
                (lo, end)
            }
            _ => (usize::MAX, 0),
        };
        self.owned_hull[0].store(lo, Ordering::Relaxed);
        self.owned_hull[1].store(hi, Ordering::Relaxed);
    }

    /// Drops cached registrations overlapping `[addr, addr + len)`. Those in use are
    /// retired: never handed out again, deregistered on their last release. Memory
    /// from [`alloc`](Self::alloc) is not affected.
    ///
    /// ```
    /// use rdma_channel::fabric::{emulated::EmuFabric, Access};
    /// use rdma_channel::rcache::{CacheLimits, RegCache};
    /// let fabric = EmuFabric::new()?;
    /// let cache = RegCache::new(CacheLimits::default());
    /// let buf = vec![0u8; 4096];
    /// // SAFETY: `buf` outlives the handle.
    /// let h = unsafe { cache.acquire(&fabric, buf.as_ptr(), 4096, Access::REMOTE_READ)? };
    /// cache.release(h);
    /// cache.invalidate(buf.as_ptr(), buf.len());
    /// assert_eq!(cache.stats().entries, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn invalidate(&self, addr: *const u8, len: usize) {
        let a = addr as usize;
        let mut doomed = Vec::new();
        self.lock()
            .invalidate_range(a, a.saturating_add(len), &mut doomed);
        self.finish(doomed);
    }

    /// Counters, after processing pending watcher events.
    pub fn stats(&self) -> CacheStats {
        let mut doomed = Vec::new();
        let s = {
            let mut g = self.lock();
            self.process_events(&mut g, &mut doomed);
            CacheStats {
                entries: g.index.len(),
                bytes: g.bytes,
                ..g.stats
            }
        };
        self.finish(doomed);
        s
    }

    /// Whether user memory is cached now (it stops when the watcher fails or the
    /// process forked).
    pub fn watch_mode(&self) -> WatchMode {
        match self.watcher.as_ref().map(|w| w.usable()) {
            Ok(Ok(())) => WatchMode::Userfaultfd,
            Ok(Err(why)) => WatchMode::Unavailable(why),
            Err(why) => WatchMode::Unavailable(why.clone()),
        }
    }

    /// The limits given at construction.
    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    /// Deregisters, then unwatches (so registered memory is always watched). Called
    /// with no cache lock held, except on the registration-table-full retry.
    fn finish(&self, doomed: Vec<Doomed<F::Region>>) {
        for d in doomed {
            drop(d.region);
            if let (Some((s, e)), Ok(w)) = (d.watched, self.watcher.as_ref()) {
                w.unwatch(s, e - s);
            }
        }
    }

    /// Applies the watcher's events since the last call.
    fn process_events(&self, g: &mut Inner<F::Region>, doomed: &mut Vec<Doomed<F::Region>>) {
        let Ok(w) = self.watcher.as_ref() else { return };
        let mut last = g.last_seq;
        let drained = w.drain(&mut last, |s, e| g.invalidate_range(s, e, doomed));
        g.last_seq = last;
        if drained == Drain::Lost {
            g.invalidate_range(0, usize::MAX, doomed);
        }
    }
}

impl<R: MemoryRegion> Inner<R> {
    fn insert(
        &mut self,
        region: R,
        start: usize,
        end: usize,
        access: Access,
        kind: Kind,
        watched: bool,
    ) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.tick += 1;
        let entry = Entry {
            region,
            id,
            start,
            end,
            access,
            refs: 0,
            last_use: self.tick,
            kind,
            watched,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(entry);
                s
            }
            None => {
                self.slots.push(Some(entry));
                (self.slots.len() - 1) as u32
            }
        };
        if kind == Kind::Cached {
            self.index.insert((start, id), slot);
            self.bytes += end - start;
            self.max_len = self.max_len.max(end - start);
        }
        slot
    }

    /// One more reference to a live entry, as a handle.
    fn take_ref(&mut self, slot: u32, hit: bool) -> RegHandle {
        self.tick += 1;
        let tick = self.tick;
        if hit {
            self.stats.hits += 1;
        }
        let e = self.slots[slot as usize]
            .as_mut()
            .expect("slot of a live entry");
        e.refs += 1;
        e.last_use = tick;
        RegHandle {
            lkey: e.region.lkey(),
            rkey: e.region.rkey(),
            start: e.start,
            end: e.end,
            owned: e.kind == Kind::Owned,
            slot,
            id: e.id,
        }
    }

    fn owned_containing(&self, a: usize, end: usize) -> Option<u32> {
        let (_, &slot) = self.owned.range(..=a).next_back()?;
        let e = self.slots[slot as usize].as_ref()?;
        (e.end >= end).then_some(slot)
    }

    /// An owned or cached entry containing `[a, end)` with at least `access`.
    fn lookup(&self, a: usize, end: usize, access: Access) -> Option<u32> {
        if let Some(slot) = self.owned_containing(a, end) {
            let e = self.slots[slot as usize].as_ref()?;
            if e.access.contains(access) {
                return Some(slot);
            }
        }
        let lowest = a.saturating_sub(self.max_len);
        for (&(start, _), &slot) in self.index.range(..=(a, u64::MAX)).rev() {
            if start < lowest {
                break;
            }
            let e = self.slots[slot as usize].as_ref()?;
            if e.end >= end && e.access.contains(access) {
                return Some(slot);
            }
        }
        None
    }

    /// Takes an entry out of every structure; returns what to drop.
    fn remove(&mut self, slot: u32) -> Option<Doomed<R>> {
        let e = self.slots.get_mut(slot as usize)?.take()?;
        self.free_slots.push(slot);
        if e.kind == Kind::Cached {
            self.unindex(&e);
        }
        Some(Doomed {
            region: e.region,
            watched: e.watched.then_some((e.start, e.end)),
        })
    }

    fn unindex(&mut self, e: &Entry<R>) {
        self.index.remove(&(e.start, e.id));
        self.bytes -= e.end - e.start;
        if e.end - e.start == self.max_len {
            let slots = &self.slots;
            self.max_len = self
                .index
                .values()
                .filter_map(|&s| slots[s as usize].as_ref())
                .map(|x| x.end - x.start)
                .max()
                .unwrap_or(0);
        }
    }

    fn is_owned(&self, slot: u32) -> bool {
        self.slots[slot as usize]
            .as_ref()
            .is_some_and(|e| e.kind == Kind::Owned)
    }

    /// Invalidates one cached entry: retired while in use, else removed.
    fn invalidate_slot(&mut self, slot: u32, doomed: &mut Vec<Doomed<R>>) {
        self.stats.invalidations += 1;
        let in_use = self.slots[slot as usize]
            .as_ref()
            .is_some_and(|x| x.refs > 0);
        if in_use {
            let x = self.slots[slot as usize].take().expect("indexed entry");
            self.unindex(&x);
            self.slots[slot as usize] = Some(Entry {
                kind: Kind::Retired,
                ..x
            });
        } else {
            doomed.extend(self.remove(slot));
        }
    }

    /// Invalidates cached entries overlapping `[s, e)`.
    fn invalidate_range(&mut self, s: usize, e: usize, doomed: &mut Vec<Doomed<R>>) {
        if s >= e {
            return;
        }
        let lowest = s.saturating_sub(self.max_len);
        let hit: Vec<u32> = self
            .index
            .range(..(e, 0))
            .rev()
            .take_while(|(&(start, _), _)| start >= lowest)
            .map(|(_, &slot)| slot)
            .filter(|&slot| {
                self.slots[slot as usize]
                    .as_ref()
                    .is_some_and(|x| x.end > s)
            })
            .collect();
        for slot in hit {
            self.invalidate_slot(slot, doomed);
        }
    }

    fn evictable(&self) -> bool {
        self.index
            .values()
            .any(|&s| self.slots[s as usize].as_ref().is_some_and(|e| e.refs == 0))
    }

    /// Evicts the least recently used unreferenced cached entry, if any.
    fn evict_one(&mut self, doomed: &mut Vec<Doomed<R>>) -> bool {
        let victim = self
            .index
            .values()
            .filter_map(|&s| Some((s, self.slots[s as usize].as_ref()?)))
            .filter(|(_, e)| e.refs == 0)
            .min_by_key(|(_, e)| e.last_use)
            .map(|(s, _)| s);
        match victim {
            Some(slot) => {
                self.stats.evictions += 1;
                doomed.extend(self.remove(slot));
                true
            }
            None => false,
        }
    }

    /// Evicts until one more entry of `len` bytes fits; false if it cannot.
    fn make_room(&mut self, len: usize, limits: CacheLimits, doomed: &mut Vec<Doomed<R>>) -> bool {
        while self.index.len() + 1 > limits.max_entries || self.bytes + len > limits.max_bytes {
            if !self.evict_one(doomed) {
                return false;
            }
        }
        true
    }
}

impl<F: Fabric> Drop for RegCache<F> {
    fn drop(&mut self) {
        let g = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        let doomed: Vec<Doomed<F::Region>> = (0..g.slots.len() as u32)
            .filter_map(|s| g.remove(s))
            .collect();
        self.finish(doomed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::emulated::EmuFabric;
    use std::sync::atomic::Ordering;
    use std::sync::mpsc;

    const PAGE: usize = 4096;
    const RD: Access = Access::REMOTE_READ;

    /// Anonymous memory at an address reserved for one test, so that no other test's
    /// unmap (whose event may be logged a little later) can ever touch it: every
    /// count asserted on such memory is exact.
    struct Area {
        ptr: *mut u8,
        len: usize,
    }

    impl Area {
        fn new(test: usize, pages: usize) -> Area {
            let want = 0x2000_0000_0000usize + test * (1 << 32);
            let len = pages * PAGE;
            // SAFETY: MAP_FIXED_NOREPLACE fails rather than replace an existing mapping.
            let p = unsafe {
                libc::mmap(
                    want as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            assert_eq!(p as usize, want, "{}", io::Error::last_os_error());
            Area { ptr: p.cast(), len }
        }

        fn at(&self, off: usize) -> *mut u8 {
            assert!(off < self.len);
            // SAFETY: inside the mapping.
            unsafe { self.ptr.add(off) }
        }

        /// Replaces pages `[first, first + n)` by a fresh mapping filled with `fill`.
        fn remap(&self, first: usize, n: usize, fill: u8) {
            // SAFETY: replaces part of our own mapping; nothing borrows it.
            let p = unsafe {
                libc::mmap(
                    self.at(first * PAGE).cast(),
                    n * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            assert_eq!(p.cast(), self.at(first * PAGE));
            // SAFETY: the fresh mapping is n pages long.
            unsafe { self.at(first * PAGE).write_bytes(fill, n * PAGE) };
        }
    }

    impl Drop for Area {
        fn drop(&mut self) {
            // SAFETY: our mapping, unused from now on.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }

    /// A cache with userfaultfd, or `None` after saying why the test is skipped
    /// (set RCH_TEST_REQUIRE_UFFD=1 to make that a failure).
    fn uffd_cache(test: &str, limits: CacheLimits) -> Option<RegCache<EmuFabric>> {
        let c = RegCache::with_policy(limits, WatchPolicy::Auto);
        match c.watch_mode() {
            WatchMode::Userfaultfd => Some(c),
            WatchMode::Unavailable(why) => {
                assert!(
                    std::env::var_os("RCH_TEST_REQUIRE_UFFD").is_none(),
                    "{test}: userfaultfd required but unavailable: {why}"
                );
                // Straight to the handle: libtest captures print macros only.
                let note = format!("SKIPPED {test}: userfaultfd unavailable: {why}\n");
                let _ = std::io::Write::write_all(&mut std::io::stderr(), note.as_bytes());
                None
            }
        }
    }

    fn acq(c: &RegCache<EmuFabric>, f: &EmuFabric, p: *const u8, len: usize) -> RegHandle {
        // SAFETY: every caller passes memory of a live Area, released before unmapping.
        unsafe { c.acquire(f, p, len, RD) }.unwrap()
    }

    /// As `acq`, with hits confirmed as on verbs (the emulated fabric's access follows
    /// the address and needs no confirmation).
    fn acq_confirmed(
        c: &RegCache<EmuFabric>,
        f: &EmuFabric,
        p: *const u8,
        len: usize,
    ) -> RegHandle {
        // SAFETY: as acq's.
        unsafe { c.acquire_with(f, p, len, RD, true) }.unwrap()
    }

    fn limits(max_entries: usize, max_bytes: usize) -> CacheLimits {
        CacheLimits {
            max_entries,
            max_bytes,
        }
    }

    #[test]
    fn the_cache_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<RegCache<EmuFabric>>();
        check::<RegHandle>();
    }

    #[test]
    fn hits_misses_and_refcounts() {
        let Some(c) = uffd_cache("hits_misses_and_refcounts", CacheLimits::default()) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(1, 4);
        let h1 = acq(&c, &f, a.at(100), 1000);
        assert_eq!(
            h1.range(),
            a.ptr as usize..a.ptr as usize + PAGE,
            "whole page"
        );
        let h2 = acq(&c, &f, a.at(100), 1000);
        let h3 = acq(&c, &f, a.at(2000), 50); // a neighbour on the same page
        assert_eq!((h2.rkey(), h3.rkey()), (h1.rkey(), h1.rkey()));
        assert_eq!(h1.lkey(), h1.rkey());
        assert!(!h1.is_owned());
        // SAFETY: inside the Area.
        let h4 = unsafe { c.acquire(&f, a.at(100), 1000, Access::REMOTE_WRITE) }.unwrap();
        assert_ne!(h4.rkey(), h1.rkey(), "missing right: a new registration");
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.uncached), (2, 2, 0));
        assert_eq!((s.entries, s.bytes), (2, 2 * PAGE));
        // A registration spanning two pages is not inside the one-page entries.
        let h5 = acq(&c, &f, a.at(PAGE - 10), 20);
        assert_eq!(h5.range().len(), 2 * PAGE);
        assert_eq!(c.stats().misses, 3);
        for h in [h1, h2, h3, h4, h5] {
            c.release(h);
        }
        c.release(h1); // a second release of a handle whose entry is unreferenced: ignored
        assert_eq!(c.stats().entries, 3, "released entries stay cached");
        let h = acq(&c, &f, a.at(0), PAGE);
        assert!([h1.rkey(), h5.rkey()].contains(&h.rkey()));
        assert_eq!(c.stats().hits, 3);
        c.release(h);
    }

    #[test]
    fn lru_eviction_by_entry_count() {
        let Some(c) = uffd_cache("lru_eviction_by_entry_count", limits(2, 1 << 30)) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(2, 6);
        let page = |i: usize| a.at(i * 2 * PAGE); // pages apart, so entries never merge
        for i in [0, 1, 0] {
            let h = acq(&c, &f, page(i), 8);
            c.release(h);
        }
        let h = acq(&c, &f, page(2), 8); // evicts page 1, the least recently used
        c.release(h);
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.evictions, s.entries), (1, 3, 1, 2));
        let h = acq(&c, &f, page(0), 8);
        c.release(h);
        assert_eq!(c.stats().hits, 2, "page 0 was used recently and stayed");
        let h = acq(&c, &f, page(1), 8);
        c.release(h);
        let s = c.stats();
        assert_eq!(
            (s.misses, s.evictions, s.entries),
            (4, 2, 2),
            "page 1 was evicted"
        );
    }

    #[test]
    fn lru_eviction_by_bytes() {
        let Some(c) = uffd_cache("lru_eviction_by_bytes", limits(100, 3 * PAGE)) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(3, 8);
        let h = acq(&c, &f, a.at(0), 2 * PAGE);
        c.release(h);
        let h = acq(&c, &f, a.at(4 * PAGE), PAGE);
        c.release(h);
        assert_eq!(c.stats().bytes, 3 * PAGE);
        let h = acq(&c, &f, a.at(6 * PAGE), PAGE); // needs the 2-page entry's room
        c.release(h);
        let s = c.stats();
        assert_eq!((s.evictions, s.entries, s.bytes), (1, 2, 2 * PAGE));
        let h = acq(&c, &f, a.at(4 * PAGE), PAGE);
        c.release(h);
        assert_eq!(c.stats().hits, 1);
    }

    #[test]
    fn an_entry_in_use_is_never_evicted() {
        let Some(c) = uffd_cache("an_entry_in_use_is_never_evicted", limits(1, 1 << 30)) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(4, 4);
        let held = acq(&c, &f, a.at(0), 8);
        let other = acq(&c, &f, a.at(2 * PAGE), 8);
        let s = c.stats();
        assert_eq!((s.evictions, s.uncached, s.entries), (0, 1, 1));
        let again = acq(&c, &f, a.at(0), 8);
        assert_eq!(
            again.rkey(),
            held.rkey(),
            "the entry in use is still cached"
        );
        c.release(other);
        let h = acq(&c, &f, a.at(2 * PAGE), 8);
        assert_ne!(h.rkey(), other.rkey(), "the uncached one was deregistered");
        for h in [held, again, h] {
            c.release(h);
        }
    }

    #[test]
    fn a_request_larger_than_max_bytes_is_registered_uncached() {
        let Some(c) = uffd_cache("oversize", limits(10, PAGE)) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(5, 4);
        for _ in 0..2 {
            let h = acq(&c, &f, a.at(10), PAGE + 100);
            assert_eq!(h.range(), a.at(10) as usize..a.at(10) as usize + PAGE + 100);
            c.release(h);
        }
        let s = c.stats();
        assert_eq!((s.misses, s.uncached, s.hits, s.entries), (2, 2, 0, 0));
    }

    #[test]
    fn explicit_invalidation() {
        let Some(c) = uffd_cache("explicit_invalidation", CacheLimits::default()) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(6, 4);
        let h = acq(&c, &f, a.at(0), 64);
        c.release(h);
        c.invalidate(a.at(8), 1);
        let s = c.stats();
        assert_eq!((s.invalidations, s.entries), (1, 0));
        let h2 = acq(&c, &f, a.at(0), 64);
        assert_ne!(h2.rkey(), h.rkey());
        // In use: retired, never handed out again, deregistered on release.
        c.invalidate(a.at(0), PAGE);
        let h3 = acq(&c, &f, a.at(0), 64);
        assert_ne!(h3.rkey(), h2.rkey());
        assert_eq!(c.stats().invalidations, 2);
        c.release(h2);
        c.release(h3);
        let s = c.stats();
        assert_eq!((s.entries, s.misses, s.hits), (1, 3, 0));
        let h4 = acq(&c, &f, a.at(0), 64);
        assert_eq!(h4.rkey(), h3.rkey());
        c.release(h4);
        c.invalidate(a.at(PAGE), PAGE); // no overlap
        assert_eq!(c.stats().invalidations, 2);
    }

    #[test]
    fn munmap_and_map_fixed_at_the_same_address_always_miss() {
        let Some(c) = uffd_cache("munmap_and_map_fixed", CacheLimits::default()) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(7, 4);
        let mut stale = 0;
        let mut before = c.stats();
        for i in 0..200u32 {
            let h = acq(&c, &f, a.at(0), 3 * PAGE);
            let s = c.stats();
            assert_eq!(s.misses, before.misses + 1, "round {i}: stale hit");
            assert_eq!(s.invalidations, before.invalidations + u64::from(i > 0));
            assert_ne!(h.rkey(), stale, "round {i}: the stale key");
            stale = h.rkey();
            c.release(h);
            let h = acq(&c, &f, a.at(PAGE), 10);
            assert_eq!(h.rkey(), stale, "cached while the mapping lives");
            c.release(h);
            // Taken now: stats() itself processes events.
            before = c.stats();
            if i % 2 == 0 {
                a.remap(0, 3, i as u8);
            } else {
                // SAFETY: part of our Area, replaced right below.
                assert_eq!(unsafe { libc::munmap(a.ptr.cast(), 3 * PAGE) }, 0);
                a.remap(0, 3, i as u8);
            }
        }
    }

    #[test]
    fn an_unmap_in_another_thread_is_seen_as_soon_as_it_returns() {
        let Some(c) = uffd_cache("cross_thread", CacheLimits::default()) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(8, 2);
        let base = a.ptr as usize;
        let (go, go_rx) = mpsc::channel::<()>();
        let (done_tx, done) = mpsc::channel::<()>();
        let remapper = std::thread::spawn(move || {
            let a = Area {
                ptr: base as *mut u8,
                len: 2 * PAGE,
            };
            while go_rx.recv().is_ok() {
                a.remap(0, 2, 1);
                done_tx.send(()).unwrap();
            }
            std::mem::forget(a); // the test's Area unmaps it
        });
        let mut stale = 0;
        for i in 0..300 {
            let misses = c.stats().misses;
            let h = acq(&c, &f, a.at(0), 2 * PAGE);
            assert_eq!(c.stats().misses, misses + 1, "round {i}: stale hit");
            assert_ne!(h.rkey(), stale);
            stale = h.rkey();
            c.release(h);
            go.send(()).unwrap();
            done.recv().unwrap();
        }
        drop(go);
        remapper.join().unwrap();
    }

    /// True in a child process that runs only the test `name`, which this call
    /// starts (and checks) when it is not that child: for tests that need the
    /// process's memory to themselves.
    fn in_a_process_of_its_own(name: &str) -> bool {
        if std::env::var_os("RCH_RCACHE_TEST_CHILD").is_some() {
            return true;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env("RCH_RCACHE_TEST_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "the child failed:\n{text}");
        assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
        false
    }

    /// `uffd_cache` for the test `name`, run in a process of its own: `None` in the
    /// test binary's own process, which runs the child and checks it.
    fn uffd_cache_alone(name: &str) -> Option<RegCache<EmuFabric>> {
        if !in_a_process_of_its_own(name) {
            return None;
        }
        uffd_cache(name, CacheLimits::default())
    }

    /// An unmap in another thread removes the pages at once but waits in the kernel
    /// until the monitor reads its event; memory mapped at the same address meanwhile
    /// must not hit the old entry (the verbs warm-up's wrong bytes, issue #34). Run in
    /// a child process of its own: the monitor is held still meanwhile, and any other
    /// test's unmap (inside malloc, say, with its lock held) would wait for it too.
    #[test]
    fn memory_mapped_while_an_unmap_is_under_way_never_hits_the_old_entry() {
        let Some(c) = uffd_cache_alone(
            "rcache::tests::memory_mapped_while_an_unmap_is_under_way_never_hits_the_old_entry",
        ) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(16, 2);
        let base = a.ptr as usize;
        std::mem::forget(a); // unmapped by the thread below
        let h = acq(&c, &f, base as *const u8, 2 * PAGE);
        let old_key = h.rkey();
        c.release(h);
        let (go, go_rx) = mpsc::channel::<()>();
        let unmapper = std::thread::spawn(move || {
            go_rx.recv().unwrap();
            // SAFETY: the test's own mapping, which nothing uses any more.
            unsafe { libc::munmap(base as *mut libc::c_void, 2 * PAGE) }
        });
        watch::HOLD_MONITOR.store(true, Ordering::Release);
        go.send(()).unwrap();
        // The pages are gone once a new mapping fits at their address.
        let fresh = loop {
            // SAFETY: MAP_FIXED_NOREPLACE fails rather than replace a mapping.
            let p = unsafe {
                libc::mmap(
                    base as *mut libc::c_void,
                    2 * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p as usize == base {
                break Area {
                    ptr: p.cast(),
                    len: 2 * PAGE,
                };
            }
            assert_eq!(p, libc::MAP_FAILED, "mapped elsewhere");
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        let before = c.stats();
        // The unmap's event is still unread: a drain shows nothing.
        let h = acq_confirmed(&c, &f, fresh.at(0), 2 * PAGE);
        let after = c.stats();
        watch::HOLD_MONITOR.store(false, Ordering::Release);
        assert_eq!(unmapper.join().unwrap(), 0);
        assert_eq!(
            after.hits, before.hits,
            "a stale hit: the old pages' registration"
        );
        assert_eq!(after.misses, before.misses + 1);
        assert_ne!(h.rkey(), old_key);
        c.release(h);
        // With the event logged, the same memory is cached again as usual.
        let h = acq_confirmed(&c, &f, fresh.at(0), 2 * PAGE);
        c.release(h);
        let h = acq_confirmed(&c, &f, fresh.at(0), 2 * PAGE);
        assert_eq!(c.stats().hits, after.hits + 1);
        c.release(h);
    }

    /// With no change of watched memory under way the kernel's answer is "clear", so
    /// confirmed hits stay hits (on verbs every one is confirmed).
    #[test]
    fn a_quiet_process_checks_clear_and_confirmed_hits_stay_hits() {
        // Other tests' unmaps would make the check say "changing" now and then.
        let Some(c) = uffd_cache_alone(
            "rcache::tests::a_quiet_process_checks_clear_and_confirmed_hits_stay_hits",
        ) else {
            return;
        };
        let w = c.watcher.as_ref().expect("uffd_cache has a watcher");
        assert_eq!(w.check(), Check::Clear);
        let f = EmuFabric::new().unwrap();
        let a = Area::new(17, 2);
        let h = acq(&c, &f, a.at(0), 2 * PAGE);
        c.release(h);
        let before = c.stats();
        for _ in 0..100 {
            let h = acq_confirmed(&c, &f, a.at(0), 2 * PAGE);
            c.release(h);
        }
        let after = c.stats();
        assert_eq!(
            (after.hits, after.misses),
            (before.hits + 100, before.misses)
        );
    }

    #[test]
    fn madvise_dontneed_invalidates() {
        let Some(c) = uffd_cache("madvise_dontneed_invalidates", CacheLimits::default()) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(9, 4);
        let h = acq(&c, &f, a.at(0), 4 * PAGE);
        c.release(h);
        // SAFETY: our own mapping; its contents are not borrowed.
        let r = unsafe { libc::madvise(a.at(PAGE).cast(), PAGE, libc::MADV_DONTNEED) };
        assert_eq!(r, 0);
        let h2 = acq(&c, &f, a.at(0), 4 * PAGE);
        let s = c.stats();
        assert_eq!((s.misses, s.invalidations), (2, 1));
        assert_ne!(h2.rkey(), h.rkey());
        c.release(h2);
    }

    #[test]
    fn mremap_invalidates_the_old_place() {
        let Some(c) = uffd_cache("mremap_invalidates", CacheLimits::default()) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(10, 8);
        let h = acq(&c, &f, a.at(0), 2 * PAGE);
        c.release(h);
        // SAFETY: moves pages 0..2 of our Area onto its pages 4..6.
        let moved = unsafe {
            libc::mremap(
                a.at(0).cast(),
                2 * PAGE,
                2 * PAGE,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                a.at(4 * PAGE).cast::<libc::c_void>(),
            )
        };
        assert_eq!(moved.cast(), a.at(4 * PAGE));
        a.remap(0, 2, 9);
        let h2 = acq(&c, &f, a.at(0), 2 * PAGE);
        let s = c.stats();
        assert_eq!(s.misses, 2);
        assert!(s.invalidations >= 1);
        assert_ne!(h2.rkey(), h.rkey());
        c.release(h2);
    }

    #[test]
    fn a_large_vec_freed_and_reallocated_is_invalidated() {
        let Some(c) = uffd_cache("large_vec", CacheLimits::default()) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        // Above glibc's largest dynamic mmap threshold (32 MiB), so always mmapped.
        let len = 48 << 20;
        let mut stale = 0;
        let mut before = c.stats();
        for round in 0..4 {
            let v = vec![round as u8; len];
            let h = acq(&c, &f, v.as_ptr(), len);
            let s = c.stats();
            assert_eq!(s.misses, before.misses + 1, "round {round}");
            if round > 0 {
                assert!(
                    s.invalidations > before.invalidations,
                    "round {round}: free unseen"
                );
            }
            assert_ne!(h.rkey(), stale);
            stale = h.rkey();
            c.release(h);
            before = c.stats();
            drop(v);
        }
    }

    #[test]
    fn owned_memory_alloc_acquire_free() {
        // Owned memory is cached whatever the watcher.
        for policy in [WatchPolicy::Auto, WatchPolicy::Off] {
            let c = RegCache::<EmuFabric>::with_policy(limits(1, PAGE), policy);
            let f = EmuFabric::new().unwrap();
            let p = c.alloc(&f, 3 * PAGE).unwrap();
            assert!(c.is_owned(p.as_ptr(), 3 * PAGE));
            assert!(!c.is_owned(p.as_ptr(), 3 * PAGE + 1));
            // SAFETY: inside the allocation.
            let h = unsafe { c.acquire(&f, p.as_ptr().add(PAGE + 3), 2 * PAGE - 3, RD) }.unwrap();
            // SAFETY: as above.
            let h2 = unsafe { c.acquire(&f, p.as_ptr(), 1, Access::LOCAL_WRITE) }.unwrap();
            assert!(h.is_owned() && h2.is_owned());
            assert_eq!(h.rkey(), h2.rkey());
            let s = c.stats();
            assert_eq!(
                (s.hits, s.misses, s.entries, s.bytes),
                (2, 0, 0, 0),
                "{policy:?}"
            );
            // SAFETY: refused while acquired.
            let e = unsafe { c.free(p.as_ptr()) }.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
            c.invalidate(p.as_ptr(), PAGE); // owned memory is not affected
            c.release(h);
            c.release(h2);
            // SAFETY: not the start of an allocation: refused.
            let e = unsafe { c.free(p.as_ptr().add(1)) }.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            // SAFETY: unused from here on.
            unsafe { c.free(p.as_ptr()) }.unwrap();
            // SAFETY: already freed: refused.
            let e = unsafe { c.free(p.as_ptr()) }.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(!c.is_owned(p.as_ptr(), 1));
            assert_eq!(
                c.alloc(&f, 0).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
        }
    }

    #[test]
    fn policy_off_never_caches_user_memory() {
        let c = RegCache::<EmuFabric>::with_policy(CacheLimits::default(), WatchPolicy::Off);
        assert!(
            matches!(c.watch_mode(), WatchMode::Unavailable(ref w) if w.contains("RCH_RCACHE"))
        );
        let f = EmuFabric::new().unwrap();
        let buf = vec![0u8; 3 * PAGE];
        let mut keys = Vec::new();
        for _ in 0..3 {
            let h = acq(&c, &f, buf.as_ptr(), buf.len());
            assert_eq!(
                h.range(),
                buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len()
            );
            keys.push(h.rkey());
            c.release(h);
        }
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.uncached, s.entries), (0, 3, 3, 0));
        assert!(
            keys[0] != keys[1] && keys[1] != keys[2],
            "each release deregistered"
        );
        // In use twice: two registrations.
        let (h1, h2) = (acq(&c, &f, buf.as_ptr(), 8), acq(&c, &f, buf.as_ptr(), 8));
        assert_ne!(h1.rkey(), h2.rkey());
        c.release(h1);
        c.release(h2);
    }

    #[test]
    fn policy_values() {
        assert_eq!(WatchPolicy::parse("auto").unwrap(), WatchPolicy::Auto);
        assert_eq!(WatchPolicy::parse("").unwrap(), WatchPolicy::Auto);
        assert_eq!(WatchPolicy::parse(" Off ").unwrap(), WatchPolicy::Off);
        let e = WatchPolicy::parse("on").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("RCH_RCACHE"), "{e}");
    }

    #[test]
    fn bad_ranges_are_refused() {
        let c = RegCache::<EmuFabric>::with_policy(CacheLimits::default(), WatchPolicy::Off);
        let f = EmuFabric::new().unwrap();
        let x = [0u8; 8];
        for (p, len) in [
            (x.as_ptr(), 0),
            (std::ptr::null(), 8),
            (usize::MAX as *const u8, 2),
        ] {
            // SAFETY: refused before any use.
            let e = unsafe { c.acquire(&f, p, len, RD) }.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        }
        assert_eq!(c.stats(), CacheStats::default());
    }

    #[test]
    fn unwatching_one_entry_keeps_watching_pages_another_shares() {
        let Some(c) = uffd_cache("unwatch_overlap", CacheLimits::default()) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(11, 4);
        let left = acq(&c, &f, a.at(100), PAGE); // pages 0-1
        let right = acq(&c, &f, a.at(PAGE + 100), PAGE); // pages 1-2
        assert_ne!(left.rkey(), right.rkey());
        c.release(left);
        c.release(right);
        c.invalidate(a.at(0), 1); // drops `left` only, and unwatches page 0 only
        assert_eq!(c.stats().entries, 1);
        a.remap(1, 1, 5); // page 1 is still watched for `right`
        let h = acq(&c, &f, a.at(PAGE + 100), PAGE);
        assert_ne!(h.rkey(), right.rkey(), "stale hit: page 1 lost its watch");
        assert_eq!(c.stats().invalidations, 2);
        c.release(h);
    }

    #[test]
    fn caches_share_the_watcher_without_blinding_each_other() {
        let Some(c1) = uffd_cache("two_caches", CacheLimits::default()) else {
            return;
        };
        let c2 = RegCache::<EmuFabric>::with_policy(CacheLimits::default(), WatchPolicy::Auto);
        let f = EmuFabric::new().unwrap();
        let a = Area::new(12, 2);
        let w = watch::get().unwrap();
        let h1 = acq(&c1, &f, a.at(0), PAGE);
        let h2 = acq(&c2, &f, a.at(0), PAGE);
        assert_eq!(w.watched_count(a.ptr as usize, PAGE), 2);
        c1.release(h1);
        c2.release(h2);
        drop(c1); // unwatches its entry
        assert_eq!(w.watched_count(a.ptr as usize, PAGE), 1);
        a.remap(0, 1, 3);
        let h = acq(&c2, &f, a.at(0), PAGE);
        assert_ne!(h.rkey(), h2.rkey(), "c2 still saw the unmap");
        c2.release(h);
        drop(c2);
        assert_eq!(w.watched_count(a.ptr as usize, PAGE), 0);
    }

    #[test]
    fn a_full_registration_table_evicts_and_retries_then_reports() {
        let Some(c) = uffd_cache("table_full", CacheLimits::default()) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(13, 16);
        for i in 0..5 {
            let h = acq(&c, &f, a.at(i * 2 * PAGE), 8);
            c.release(h);
        }
        // Fill the rest of the domain's table directly.
        let mut held = Vec::new();
        let spare = [0u8; 8];
        loop {
            // SAFETY: `spare` outlives every region in `held`.
            match unsafe { f.register(spare.as_ptr() as *mut u8, 8, RD) } {
                Ok(r) => held.push(r),
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
                    break;
                }
            }
        }
        let h = acq(&c, &f, a.at(12 * PAGE), 8);
        assert_eq!(
            c.stats().evictions,
            5,
            "evicted the unused entries, then retried"
        );
        // SAFETY: as above.
        while let Ok(r) = unsafe { f.register(spare.as_ptr() as *mut u8, 8, RD) } {
            held.push(r);
        }
        // Table full again and nothing left to evict: the error comes back.
        // SAFETY: inside the Area.
        let e = unsafe { c.acquire(&f, a.at(14 * PAGE), 8, RD) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
        let w = watch::get().unwrap();
        assert_eq!(
            w.watched_count(a.at(14 * PAGE) as usize, PAGE),
            0,
            "unwatched"
        );
        c.release(h);
        drop(held);
    }

    #[test]
    fn dropping_the_cache_unwatches_everything() {
        let Some(c) = uffd_cache("drop_unwatches", CacheLimits::default()) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(14, 4);
        let held = acq(&c, &f, a.at(0), 8);
        let h = acq(&c, &f, a.at(2 * PAGE), 8);
        c.release(h);
        let w = watch::get().unwrap();
        assert_eq!(w.watched_count(a.ptr as usize, PAGE), 1);
        drop(c); // `held` is never released: the drop deregisters it anyway
        let _ = held;
        assert_eq!(w.watched_count(a.ptr as usize, PAGE), 0);
        assert_eq!(w.watched_count(a.at(2 * PAGE) as usize, PAGE), 0);
    }

    #[test]
    fn a_forked_child_stops_caching() {
        let Some(c) = uffd_cache("forked_child", CacheLimits::default()) else {
            return;
        };
        let f = EmuFabric::new().unwrap();
        let a = Area::new(15, 2);
        let h = acq(&c, &f, a.at(0), 8);
        c.release(h);
        // SAFETY: the child only uses this test's own cache, fabric and memory (no
        // lock another thread could hold at the fork), then leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = (|| {
                if c.watch_mode() == WatchMode::Userfaultfd {
                    return 2;
                }
                // SAFETY: the Area is mapped in the child too.
                let Ok(h) = (unsafe { c.acquire(&f, a.at(0), 8, RD) }) else {
                    return 3;
                };
                let s = c.stats();
                c.release(h);
                if (s.misses, s.uncached, s.invalidations, s.entries) != (2, 1, 1, 0) {
                    return 4;
                }
                0
            })();
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "child failed check");
        assert_eq!(
            c.watch_mode(),
            WatchMode::Userfaultfd,
            "the parent is unaffected"
        );
        let h = acq(&c, &f, a.at(0), 8);
        assert_eq!(c.stats().hits, 1);
        c.release(h);
    }
}
