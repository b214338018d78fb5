//! The emulated fabric: an RDMA NIC in software, between threads of one process or
//! between processes of one machine, through shared memory.
//!
//! # Model
//!
//! An [`EmuFabric`] is a protection domain. Its bookkeeping lives in a *domain segment*
//! (a sealed `memfd`) that peers map: a header, a registration table (8192 entries), a
//! segment table (1024) and a queue-pair table (4096). Memory from [`alloc_region`]
//! lives in *data segments* (one sealed memfd each) that a peer maps too, so it reaches
//! them with a plain `memcpy`. Memory passed to [`register`] that lies inside one of the
//! domain's own data segments is reached the same way; any other memory is *private*:
//! an in-process peer copies to the owner's address directly, a peer process uses
//! `process_vm_readv`/`process_vm_writev`.
//!
//! [`EmuPending::card`] describes the domain and the queue pair (bytes plus the segment
//! descriptors, for `SCM_RIGHTS`; see [`crate::oob`]). [`PendingQp::connect`] with the
//! peer's card maps the peer's domain segment or, when the peer domain lives in this
//! process, uses it directly. Each queue pair reaches the peer's data segments through
//! its own mapping of each, made on first use (from the card's descriptors, from the
//! in-process domain, or from `/proc/<pid>/fd` for segments created after the card), so
//! its copies never depend on the owner keeping its mapping.
//!
//! # What the emulated NIC guarantees
//!
//! * **Execution.** A work request is executed synchronously, on the posting thread,
//!   inside [`QueuePair::post`]: when `post` returns, a write has been placed in the
//!   peer's memory and a read has been scattered into local memory. Requests retire at
//!   once ([`Caps::max_send_wr`] is `usize::MAX`), `post` never returns
//!   [`FabricError::QueueFull`], and writes posted on one queue pair are placed in
//!   posting order.
//! * **Placement order within a write.** Every byte of the target range except the last
//!   8-byte-aligned word lying entirely inside it is stored first; then that word is
//!   stored with one `Release` store (assembled from the gather list even when it
//!   straddles entries). A reader that loads the word with `Acquire` and sees the new
//!   value sees every other byte of the write. A range with no aligned word is a plain
//!   copy. The word is aligned, so it is never seen torn. On the private-memory path
//!   across processes the word goes in a second `process_vm_writev` after the bulk; the
//!   kernel stores an aligned word in one access on the architectures we know of, but
//!   does not promise it.
//! * **Access checks.** The remote key must name a live registration of the peer
//!   (key = `generation << 16 | index`, lkey = rkey; key 0 is never valid and a
//!   recycled entry gets a new generation), carry [`Access::REMOTE_WRITE`] (writes) or
//!   [`Access::REMOTE_READ`] (reads), and `[remote_addr, remote_addr + len)` must lie
//!   inside it (overflow counts as outside). Every non-empty local entry of a non-inline
//!   write or of a read must lie inside a live registration of this domain under its
//!   `lkey`; reads also need [`Access::LOCAL_WRITE`]. The remote checks apply to
//!   zero-length requests too. A failed check touches no memory and yields
//!   [`CompletionStatus::RemoteAccessError`] or
//!   [`CompletionStatus::LocalProtectionError`].
//! * **Limits.** More than [`Caps::max_sge`] (30) entries, or an inline write longer
//!   than [`Caps::max_inline`] (4 MiB), is refused by `post` with
//!   [`FabricError::InvalidRequest`] and nothing happens. Since the emulated NIC copies
//!   at post time anyway, inline costs nothing extra: it only waives the local-key
//!   check, and the gather list need only be valid during the call.
//! * **Completions and errors.** A signalled success produces a
//!   [`CompletionStatus::Success`] completion with the byte count. Any failure produces
//!   an error completion, signalled or not, and moves the queue pair to
//!   [`QpState::Error`]; from then on every post produces a
//!   [`CompletionStatus::Flushed`] completion and does nothing. [`EmuQp::last_error`]
//!   says why, in words.
//! * **Deregistration.** Dropping a region clears its key first; later requests with
//!   the old key fail. For *private* memory, drop then waits until every copy that
//!   passed the key check has finished (each such copy holds an in-use count in the
//!   entry), so no byte lands after `drop` returns. For *segment-backed* memory there is
//!   no such fence (it would cost two atomic read-modify-writes per request): a request
//!   that passed the key check just before the drop may still complete into the segment
//!   while `drop` runs. That is memory-safe: a peer's view of a segment stays mapped as
//!   long as the peer's queue pair exists. If a peer dies in the middle of a private
//!   copy, drop stops waiting after 5 seconds and retires the entry for good.
//! * **Peer death.** Before each request the queue pair checks that the peer queue pair
//!   and the peer domain still exist (two `Acquire` loads from the peer's domain
//!   segment). Dropping a queue pair clears its flag; a domain's flag is cleared when
//!   its [`EmuFabric`] handles and every region and queue pair made from it are gone.
//!   If either is gone, the request fails with [`CompletionStatus::TransportError`]. A
//!   peer *process* that dies without cleaning up is noticed by [`QueuePair::state`],
//!   which polls a `pidfd` of the peer at most once per millisecond and then reports
//!   [`QpState::Error`] (until then, writes into its segments still "succeed").
//! * **Hot path.** On the in-process and mapped-segment paths a request takes no lock,
//!   allocates nothing and makes no system call (after a peer segment's first use),
//!   except that a completion is queued behind a mutex for signalled requests and for
//!   errors. Private memory of an in-process peer costs two atomic read-modify-writes
//!   more; private memory of another process costs one or two system calls.
//! * **Robustness.** Everything read from a peer's shared memory is checked before use:
//!   table indices, and offsets against this process's own mapping of the segment.
//!   Received memory files must be sealed against shrinking, so a peer cannot make us
//!   fault. A malformed card is refused with [`io::ErrorKind::InvalidData`].
//!
//! # Peer identity across processes
//!
//! The card carries the owner's pid. At connect time the queue pair checks that
//! `/proc/<pid>/fd/<n>` is the very domain segment it received; only then does it use
//! the pid (for `process_vm_*`, for opening segments created after the card, and for
//! the liveness check). If the check fails (another pid namespace, no permission), the
//! connection still works for segments sent with the card, and the other accesses fail
//! with a remote-access-error completion that says why. `process_vm_*` itself needs
//! ptrace permission over the peer (under Yama `ptrace_scope = 1`, only over
//! descendants); a refusal is a remote-access-error completion as well.
//!
//! [`alloc_region`]: crate::fabric::Fabric::alloc_region
//! [`register`]: crate::fabric::Fabric::register
//! [`PendingQp::connect`]: crate::fabric::PendingQp::connect
//! [`QueuePair::post`]: crate::fabric::QueuePair::post
//! [`QueuePair::state`]: crate::fabric::QueuePair::state
//! [`Caps::max_send_wr`]: crate::fabric::Caps::max_send_wr
//! [`Caps::max_sge`]: crate::fabric::Caps::max_sge
//! [`Caps::max_inline`]: crate::fabric::Caps::max_inline
//! [`FabricError::QueueFull`]: crate::fabric::FabricError::QueueFull
//! [`FabricError::InvalidRequest`]: crate::fabric::FabricError::InvalidRequest
//! [`Access::REMOTE_WRITE`]: crate::fabric::Access::REMOTE_WRITE
//! [`Access::REMOTE_READ`]: crate::fabric::Access::REMOTE_READ
//! [`Access::LOCAL_WRITE`]: crate::fabric::Access::LOCAL_WRITE
//! [`CompletionStatus::RemoteAccessError`]: crate::fabric::CompletionStatus::RemoteAccessError
//! [`CompletionStatus::LocalProtectionError`]: crate::fabric::CompletionStatus::LocalProtectionError
//! [`CompletionStatus::Success`]: crate::fabric::CompletionStatus::Success
//! [`CompletionStatus::Flushed`]: crate::fabric::CompletionStatus::Flushed
//! [`CompletionStatus::TransportError`]: crate::fabric::CompletionStatus::TransportError
//! [`QpState::Error`]: crate::fabric::QpState::Error
//!
//! # Example
//!
//! ```
//! use rdma_channel::fabric::emulated::EmuFabric;
//! use rdma_channel::fabric::{Access, Fabric, MemoryRegion, Opcode, PendingQp, QueuePair, Sge, WorkRequest};
//!
//! let a = EmuFabric::new()?;
//! let b = EmuFabric::new()?;
//! let (pa, pb) = (a.create_qp()?, b.create_qp()?);
//! let (ca, cb) = (pa.card()?, pb.card()?);
//! let qa = pa.connect(cb)?;
//! let _qb = pb.connect(ca)?;
//!
//! let target = b.alloc_region(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! let source = a.alloc_region(64, Access::LOCAL_WRITE)?;
//! // SAFETY: the region is 64 bytes long and nothing else uses it yet.
//! unsafe { source.addr().write_bytes(7, 64) };
//! let sge = [Sge { addr: source.addr(), len: 64, lkey: source.lkey() }];
//! let wr = WorkRequest {
//!     wr_id: 1,
//!     opcode: Opcode::Write { local: &sge, remote_addr: target.remote().addr, rkey: target.rkey(), inline: false },
//!     signaled: true,
//! };
//! // SAFETY: the gather list lies in `source`, which outlives the request.
//! unsafe { qa.post(&wr)? };
//! let mut done = [rdma_channel::fabric::Completion {
//!     wr_id: 0, status: rdma_channel::fabric::CompletionStatus::Flushed,
//!     op: rdma_channel::fabric::CompletedOp::Read, byte_len: 0,
//! }; 1];
//! assert_eq!(qa.poll(&mut done), 1);
//! assert!(done[0].status.is_ok());
//! // SAFETY: the write has completed; the region is 64 bytes long.
//! assert!(unsafe { std::slice::from_raw_parts(target.addr(), 64) }.iter().all(|&x| x == 7));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub(crate) mod card;
mod copy;
mod pace;
mod peer;
mod qp;
mod remote;
mod shm;
mod table;

pub use pace::Pacer;
pub use qp::EmuQp;

/// The emulated fabric's one rail device: a rail on it gets a protection domain of
/// its own (`RCH_RAILS=@400m,domain@100m`).
pub const RAIL_DOMAIN_DEVICE: &str = "domain";

/// Send queue depth of a rail with a rate (`create_rail_qp`) when no depth was set.
pub const PACED_SEND_QUEUE: usize = 256;

use self::card::{CardInfo, CardSegment};
use self::shm::Shm;
use self::table::{
    RegSnapshot, Table, LAYOUT_SIZE, NO_SEGMENT, QP_CAPACITY, REG_CAPACITY, SEG_CAPACITY,
};
use super::{Access, Caps, Card, Fabric, MemoryRegion, PendingQp};
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

/// The emulated NIC's limits (see the module documentation for why they are what they
/// are).
///
/// ```
/// use rdma_channel::fabric::emulated::CAPS;
/// assert_eq!(CAPS.max_inline, 4 << 20);
/// assert_eq!(CAPS.max_send_wr, usize::MAX);
/// ```
pub const CAPS: Caps = Caps {
    max_inline: 4 << 20,
    max_sge: 30,
    max_send_wr: usize::MAX,
    max_rd_atomic: 16,
};

/// How long deregistration waits for in-flight copies into private memory.
const DEREG_TIMEOUT: Duration = Duration::from_secs(5);

/// Locks a mutex, ignoring poisoning: every critical section here leaves its data
/// consistent before anything that could panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// This process's id.
fn current_pid() -> u32 {
    std::process::id()
}

/// Domains of this process by id, for in-process connections.
fn registry() -> &'static Mutex<HashMap<u64, Weak<DomainInner>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<u64, Weak<DomainInner>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Allocator of table entries with per-entry 16-bit generations.
#[derive(Debug)]
struct SlotAlloc {
    free: Vec<u32>,
    gens: Vec<u16>,
    capacity: u32,
}

impl SlotAlloc {
    fn new(capacity: u32) -> SlotAlloc {
        SlotAlloc {
            free: Vec::new(),
            gens: Vec::new(),
            capacity,
        }
    }

    /// A free entry's new key, `generation << 16 | index` (never 0: generations start
    /// at 1 and skip 0 when they wrap). Freed entries are reused last-in first-out.
    fn alloc(&mut self) -> Option<u32> {
        let index = match self.free.pop() {
            Some(i) => i,
            None if (self.gens.len() as u32) < self.capacity => {
                self.gens.push(0);
                self.gens.len() as u32 - 1
            }
            None => return None,
        };
        let gen = &mut self.gens[index as usize];
        *gen = gen.wrapping_add(1).max(1);
        Some(u32::from(*gen) << 16 | index)
    }

    fn release(&mut self, index: u32) {
        self.free.push(index);
    }
}

/// This process's record of one of its data segments.
#[derive(Debug)]
struct SegInfo {
    seg: Weak<Segment>,
    base: usize,
    len: usize,
    gen: u32,
}

#[derive(Debug)]
struct SegSlots {
    slots: Vec<Option<SegInfo>>,
    next_gen: u32,
}

/// A protection domain: the shared domain segment plus this process's allocators.
pub(crate) struct DomainInner {
    id: u64,
    pid: u32,
    shm: Shm,
    table: Table,
    regs: Mutex<SlotAlloc>,
    qps: Mutex<SlotAlloc>,
    segs: Mutex<SegSlots>,
}

impl fmt::Debug for DomainInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DomainInner")
            .field("id", &format_args!("{:#x}", self.id))
            .field("pid", &self.pid)
            .finish()
    }
}

impl DomainInner {
    fn create() -> io::Result<Arc<DomainInner>> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let pid = current_pid();
        // Relaxed: only uniqueness matters, not ordering with other memory.
        let id = u64::from(pid) << 32 | (NEXT.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff);
        let shm = Shm::create(&format!("rdmaemu-{id:016x}-domain"), LAYOUT_SIZE)?;
        // SAFETY: the mapping is page-aligned, at least LAYOUT_SIZE bytes, and owned by
        // the DomainInner next to the view, so it outlives every use of the view.
        let table = unsafe { Table::new(shm.mapping().ptr()) };
        table.init(id, pid);
        let inner = Arc::new(DomainInner {
            id,
            pid,
            shm,
            table,
            regs: Mutex::new(SlotAlloc::new(REG_CAPACITY)),
            qps: Mutex::new(SlotAlloc::new(QP_CAPACITY)),
            segs: Mutex::new(SegSlots {
                slots: Vec::new(),
                next_gen: 1,
            }),
        });
        lock(registry()).insert(id, Arc::downgrade(&inner));
        Ok(inner)
    }

    /// The domain of this process with id `id`, if it still exists and its segment is
    /// the file behind `fd`.
    fn find_local(id: u64, fd: &OwnedFd) -> Option<Arc<DomainInner>> {
        let d = lock(registry()).get(&id).and_then(Weak::upgrade)?;
        let mine = shm::fd_identity(d.shm.fd().as_raw_fd()).ok()?;
        let theirs = shm::fd_identity(fd.as_raw_fd()).ok()?;
        (mine.0 == theirs.0 && mine.1 == theirs.1).then_some(d)
    }

    /// Creates a data segment of at least `len` bytes and enters it in the segment table.
    fn new_segment(self: &Arc<Self>, len: usize) -> io::Result<Arc<Segment>> {
        let (slot, gen) = {
            let mut segs = lock(&self.segs);
            // The table grows as segments are made (a connection has a handful), so
            // an idle domain does not carry room for all SEG_CAPACITY of them.
            let slot = match segs.slots.iter().position(Option::is_none) {
                Some(free) => free,
                None if segs.slots.len() < SEG_CAPACITY as usize => {
                    segs.slots.push(None);
                    segs.slots.len() - 1
                }
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::OutOfMemory,
                        format!("segment table full ({SEG_CAPACITY} live segments)"),
                    ))
                }
            };
            let gen = segs.next_gen;
            segs.next_gen = gen.wrapping_add(1).max(1);
            // Reserve the slot; base/len 0 match no registration until it is filled.
            segs.slots[slot] = Some(SegInfo {
                seg: Weak::new(),
                base: 0,
                len: 0,
                gen,
            });
            (slot as u32, gen)
        };
        let name = format!("rdmaemu-{:016x}-{slot}-{gen}", self.id);
        let shm = match Shm::create(&name, len) {
            Ok(shm) => shm,
            Err(e) => {
                lock(&self.segs).slots[slot as usize] = None;
                return Err(e);
            }
        };
        let seg = Arc::new(Segment {
            domain: Arc::clone(self),
            slot,
            gen,
            shm,
        });
        let map = seg.shm.mapping();
        if let Some(entry) = self.table.seg(slot) {
            entry.publish(gen, seg.shm.fd().as_raw_fd() as u32, map.len() as u64);
        }
        lock(&self.segs).slots[slot as usize] = Some(SegInfo {
            seg: Arc::downgrade(&seg),
            base: map.ptr() as usize,
            len: map.len(),
            gen,
        });
        Ok(seg)
    }

    /// The live data segment that contains `[addr, addr + len)`, and the offset.
    fn find_segment(&self, addr: usize, len: usize) -> Option<(Arc<Segment>, u64)> {
        let end = addr.checked_add(len)?;
        let segs = lock(&self.segs);
        segs.slots.iter().flatten().find_map(|s| {
            if addr >= s.base && end <= s.base + s.len {
                Some((s.seg.upgrade()?, (addr - s.base) as u64))
            } else {
                None
            }
        })
    }

    /// A new descriptor for live segment `(slot, gen)` (in-process peers use it).
    fn segment_fd(&self, slot: u32, gen: u32) -> io::Result<OwnedFd> {
        let seg = lock(&self.segs)
            .slots
            .get(slot as usize)
            .and_then(Option::as_ref)
            .filter(|s| s.gen == gen)
            .and_then(|s| s.seg.upgrade())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "segment no longer exists"))?;
        seg.shm.fd().try_clone()
    }

    /// Up to `max` live segments with fresh descriptors, for a card.
    fn card_segments(&self, max: usize) -> io::Result<Vec<(CardSegment, OwnedFd)>> {
        let live: Vec<Arc<Segment>> = lock(&self.segs)
            .slots
            .iter()
            .flatten()
            .filter_map(|s| s.seg.upgrade())
            .take(max)
            .collect();
        live.iter()
            .map(|s| {
                let rec = CardSegment {
                    slot: s.slot,
                    gen: s.gen,
                    len: s.shm.mapping().len() as u64,
                };
                Ok((rec, s.shm.fd().try_clone()?))
            })
            .collect()
    }

    /// Enters a registration in the table and returns its key.
    fn register_entry(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
        seg: Option<(&Segment, u64)>,
    ) -> io::Result<u32> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot register zero bytes",
            ));
        }
        if addr.is_null() || (addr as usize).checked_add(len).is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "registration range is not valid memory",
            ));
        }
        let key = lock(&self.regs).alloc().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("registration table full ({REG_CAPACITY} live registrations)"),
            )
        })?;
        let snap = RegSnapshot {
            access: access.bits(),
            va: addr as u64,
            len: len as u64,
            seg_slot: seg.map_or(NO_SEGMENT, |(s, _)| s.slot),
            seg_gen: seg.map_or(0, |(s, _)| s.gen),
            seg_off: seg.map_or(0, |(_, off)| off),
        };
        match self.table.reg(key & 0xffff) {
            Some(entry) => {
                entry.publish(key, &snap);
                Ok(key)
            }
            None => Err(io::Error::other("registration index out of range")),
        }
    }
}

impl Drop for DomainInner {
    fn drop(&mut self) {
        self.table.set_dead();
        // Ids are never reused, so the entry is ours.
        lock(registry()).remove(&self.id);
    }
}

/// A data segment of a domain; dropping the last reference frees its table slot and
/// unmaps and closes it.
#[derive(Debug)]
pub(crate) struct Segment {
    domain: Arc<DomainInner>,
    slot: u32,
    gen: u32,
    shm: Shm,
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let Some(entry) = self.domain.table.seg(self.slot) {
            entry.clear();
            self.domain.table.note_change();
        }
        lock(&self.domain.segs).slots[self.slot as usize] = None;
        // Peers that mapped the segment keep their views until their queue pair
        // goes: give the pages back now, for every mapping, so that a ring left
        // behind (a grown or shrunk one) costs nothing from here on.
        self.shm.release_pages();
    }
}

/// The emulated fabric's protection domain. Cloning is cheap and yields another handle
/// to the same domain.
///
/// ```
/// use rdma_channel::fabric::emulated::EmuFabric;
/// use rdma_channel::fabric::Fabric;
/// let fabric = EmuFabric::new()?;
/// assert_eq!(fabric.name(), "emulated");
/// assert_eq!(fabric.caps().max_sge, 30);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct EmuFabric {
    inner: Arc<DomainInner>,
    /// Send queue depth of the queue pairs made here (`usize::MAX`: unbounded).
    send_queue_depth: usize,
}

impl EmuFabric {
    /// Creates a protection domain (a shared domain segment of about 550 KiB of address
    /// space, mostly untouched).
    ///
    /// ```
    /// use rdma_channel::fabric::emulated::EmuFabric;
    /// use rdma_channel::fabric::{Access, Fabric, MemoryRegion};
    /// let fabric = EmuFabric::new()?;
    /// let other_handle = fabric.clone();
    /// let region = other_handle.alloc_region(4096, Access::LOCAL_WRITE)?;
    /// drop(fabric); // the domain lives on while any handle or region does
    /// assert_eq!(region.len(), 4096);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// The send queue is unbounded (requests retire as they are posted) unless
    /// `RCH_EMU_SEND_QUEUE` names a depth: see [`with_send_queue_depth`](Self::with_send_queue_depth).
    ///
    /// # Errors
    ///
    /// The kernel refused to create or map the memory file.
    pub fn new() -> io::Result<EmuFabric> {
        // A testing knob: a malformed value leaves the queue unbounded.
        let depth = crate::settings::EMU_SEND_QUEUE
            .number::<usize>()
            .ok()
            .flatten()
            .filter(|&d| d >= 2)
            .unwrap_or(usize::MAX);
        // So that a selector in a peer's process can order our writes before its
        // last look (see `select`).
        crate::sync::register_barrier();
        Ok(EmuFabric {
            inner: DomainInner::create()?,
            send_queue_depth: depth,
        })
    }

    /// Makes the queue pairs created from now on model a finite send queue of
    /// `depth` requests, as an RC queue pair on a NIC has: a request holds its slot
    /// until its completion, or a later signalled one's, has been polled, and a post
    /// to a full queue fails with [`FabricError::QueueFull`](super::FabricError::QueueFull)
    /// as `ibv_post_send` does. Work still executes inside `post`; only the
    /// accounting is the NIC's. This is how the engine's send-queue discipline (both
    /// halves post) is tested without RDMA hardware. Depths below 2 count as 2.
    ///
    /// ```
    /// use rdma_channel::fabric::emulated::EmuFabric;
    /// use rdma_channel::fabric::Fabric;
    /// let f = EmuFabric::new()?.with_send_queue_depth(8);
    /// assert_eq!(f.caps().max_send_wr, 8);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn with_send_queue_depth(mut self, depth: usize) -> EmuFabric {
        self.send_queue_depth = depth.max(2);
        self
    }
}

impl Fabric for EmuFabric {
    type Region = EmuRegion;
    type Qp = EmuQp;
    type Pending = EmuPending;

    /// Both ends' processes copy through shared memory: short laps pay (bench/notebook/2026-11.md,
    /// "Laps that fit the messages").
    fn shares_caches(&self) -> bool {
        true
    }

    /// Remote access goes by address (a copy in this process, `process_vm_readv` or
    /// `process_vm_writev` in another), so it always meets the current mapping.
    fn registrations_pin_pages(&self) -> bool {
        false
    }

    fn alloc_region(&self, len: usize, access: Access) -> io::Result<EmuRegion> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot allocate zero bytes",
            ));
        }
        let seg = self.inner.new_segment(len)?;
        let addr = seg.shm.mapping().ptr();
        let key = self
            .inner
            .register_entry(addr, len, access, Some((&seg, 0)))?;
        Ok(EmuRegion {
            domain: Arc::clone(&self.inner),
            key,
            addr,
            len,
            access,
            _segment: Some(seg),
        })
    }

    unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> io::Result<EmuRegion> {
        let seg = self.inner.find_segment(addr as usize, len);
        let key = self.inner.register_entry(
            addr,
            len,
            access,
            seg.as_ref().map(|(s, off)| (&**s, *off)),
        )?;
        Ok(EmuRegion {
            domain: Arc::clone(&self.inner),
            key,
            addr,
            len,
            access,
            _segment: seg.map(|(s, _)| s),
        })
    }

    fn caps(&self) -> Caps {
        Caps {
            max_send_wr: self.send_queue_depth,
            ..CAPS
        }
    }

    fn create_qp(&self) -> io::Result<EmuPending> {
        Ok(EmuPending {
            slot: QpSlot::new(&self.inner)?,
            send_queue_depth: self.send_queue_depth,
            pacer: None,
        })
    }

    /// A rail on the device `domain` gets a protection domain of its own, as a rail
    /// on a second HCA would (its registrations and keys are not this domain's):
    /// how the per-domain keys of multirail are tested without hardware. Any other
    /// device is refused.
    fn rail_domain(&self, spec: &crate::config::RailSpec) -> io::Result<Option<EmuFabric>> {
        match (spec.device.as_deref(), spec.port) {
            (None, None) => Ok(None),
            (Some(RAIL_DOMAIN_DEVICE), None) => Ok(Some(EmuFabric {
                inner: DomainInner::create()?,
                send_queue_depth: self.send_queue_depth,
            })),
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "rail {spec}: the emulated fabric has no devices; its rails take a \
                     rate (@100m) and, for a protection domain of their own, the device \
                     {RAIL_DOMAIN_DEVICE:?}"
                ),
            )),
        }
    }

    /// A rail with a rate (`@rate`, `@rate/link`) is a queue pair whose
    /// completions a [`Pacer`] holds back; it models a finite send queue
    /// ([`PACED_SEND_QUEUE`] deep unless a depth was set), so that the engine
    /// waits for completions as on a NIC. A rail naming a device is refused: the
    /// emulated fabric has none.
    fn create_rail_qp(&self, spec: &crate::config::RailSpec) -> io::Result<EmuPending> {
        if spec.device.is_some() || spec.port.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("rail {spec}: a queue pair is made on its device's domain (rail_domain)"),
            ));
        }
        let mut pending = self.create_qp()?;
        if let Some(rate) = spec.rate {
            pending.pacer = Some(match &spec.link {
                Some(name) => Pacer::shared(name, rate),
                None => Arc::new(Pacer::new(rate)),
            });
            if pending.send_queue_depth == usize::MAX {
                pending.send_queue_depth = PACED_SEND_QUEUE;
            }
        }
        Ok(pending)
    }

    fn name(&self) -> &'static str {
        "emulated"
    }

    fn domain_id(&self) -> usize {
        // The shared state's address: stable while any clone lives, and a live
        // domain's address is never another's.
        Arc::as_ptr(&self.inner) as usize
    }

    /// Memory from `alloc_region` is a shared segment the reader copies from directly,
    /// so a read beats the ring's two copies early; other memory is reached through
    /// `process_vm_readv`, which on the machines measured never beat the ring (see
    /// `cargo bench --bench zerocopy` and the README), so it never goes zero-copy by
    /// default.
    fn zero_copy_defaults(&self) -> ZeroCopyThresholds {
        ZeroCopyThresholds {
            alloc_mem: ZERO_COPY_SHARED_DEFAULT,
            other: usize::MAX,
        }
    }

    /// Heap memory through `process_vm_readv`/`process_vm_writev` (one kernel copy,
    /// split between the two cores) against the ring's two copies: the ring wins by
    /// 2x when a cross-core hand-off is cheap and loses by 2x when it is dear, or
    /// when both ends send at once (bench/notebook/2026-11.md, "the heap path's two
    /// regimes"; 2026-12.md, "split by advice"), from 64 KiB up on this host, where
    /// the split one-way time in the slow phase was 10-11 us against the ring's 17.
    /// Below that the rendezvous round trip outweighs the copy saved.
    fn zero_copy_adaptive_default(&self) -> Option<usize> {
        Some(ZERO_COPY_ADAPTIVE_DEFAULT)
    }

    /// With more ranks than CPUs the CPUs are the limit, and `process_vm_readv`'s one
    /// copy spends half the CPU time of the ring's two: NPB IS class A at 4 ranks on 2
    /// CPUs 0.40-0.46 -> 0.38-0.43 s with heap buffers from 1 MiB zero-copy (Open MPI,
    /// which reads them so, 0.38-0.44), FT, MG and CG level (bench/notebook/2026-12.md).
    /// From 64 KiB, FT lost (1.11-1.16 s against 1.05-1.10, bench/notebook/2026-11.md).
    fn zero_copy_outnumbered_default(&self) -> Option<usize> {
        Some(ZERO_COPY_OUTNUMBERED_DEFAULT)
    }

    /// Half pushed: the sender's core writes half of a heap message with
    /// `process_vm_writev` while ours reads the other half, each a single copy of
    /// lines its own cache holds. In the slow hand-off regime that ran 1 MiB
    /// ping-pongs 2-2.5x faster than the ring and 1.5-2x faster than a read alone;
    /// in the fast one the ring wins and the receiver's measurements keep it
    /// (bench/notebook/2026-12.md, "split by advice").
    fn zero_copy_adaptive_push_default(&self, _loopback: bool) -> u8 {
        50
    }
}

/// Smallest shared-segment buffer sent zero-copy by default (measured crossover).
use crate::fabric::ZeroCopyThresholds;

const ZERO_COPY_SHARED_DEFAULT: usize = 16 << 10;
/// Smallest heap buffer sent zero-copy in a group outnumbering its CPUs.
const ZERO_COPY_OUTNUMBERED_DEFAULT: usize = 1 << 20;

/// Smallest heap buffer whose path follows the receiver's advice by default. From
/// 16 KiB: measured from 32 KiB, and below that zero-copy unless the ring was
/// faster at 32 KiB (`zerocopy/choose.rs`, BELOW). Zero-copy's exchange got lean
/// enough by 2026-12-05 to win 16 KiB in the fast hand-off phase (IMB PingPong 1.94
/// us against the ring's 2.89, PingPing 2.60 against 2.75); in the slow phase of
/// 2026-12-03, with a heavier exchange, IMB PingPing 16 KiB lost by it (7.9-9.0
/// against 5.8-6.6), which the ring's verdict at 32 KiB now guards against where a
/// program sends such sizes too (bench/notebook/2026-12.md).
const ZERO_COPY_ADAPTIVE_DEFAULT: usize = 16 << 10;

/// Memory registered with an [`EmuFabric`]. Dropping it deregisters the memory (see the
/// module documentation for the fence) and, for [`alloc_region`](Fabric::alloc_region)
/// memory, releases the segment once nothing else registered inside it remains.
///
/// ```
/// use rdma_channel::fabric::emulated::EmuFabric;
/// use rdma_channel::fabric::{Access, Fabric, MemoryRegion};
/// let fabric = EmuFabric::new()?;
/// let r = fabric.alloc_region(100, Access::REMOTE_READ)?;
/// assert_eq!(r.len(), 100);
/// assert_eq!(r.lkey(), r.rkey());
/// assert_ne!(r.rkey(), 0);
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct EmuRegion {
    domain: Arc<DomainInner>,
    key: u32,
    addr: *mut u8,
    len: usize,
    access: Access,
    /// Keeps a segment-backed region's segment mapped while the region exists.
    _segment: Option<Arc<Segment>>,
}

// SAFETY: the raw pointer is only reported, never dereferenced by the region; all shared
// state is behind atomics or mutexes.
unsafe impl Send for EmuRegion {}
// SAFETY: as above.
unsafe impl Sync for EmuRegion {}

impl fmt::Debug for EmuRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmuRegion")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("key", &format_args!("{:#x}", self.key))
            .field("access", &self.access)
            .field("segment_backed", &self._segment.is_some())
            .finish()
    }
}

impl MemoryRegion for EmuRegion {
    fn addr(&self) -> *mut u8 {
        self.addr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn lkey(&self) -> u32 {
        self.key
    }

    fn rkey(&self) -> u32 {
        self.key
    }

    fn access(&self) -> Access {
        self.access
    }

    /// Faults in the region's pages in one pass, when it is memory of this fabric's
    /// own (from `alloc_region`); memory registered by the caller is left as it is.
    fn make_resident(&self) {
        if self._segment.is_some() {
            // SAFETY: [addr, addr + len) is the start of the segment's live mapping,
            // which `_segment` keeps alive while `self` lives.
            unsafe { shm::populate(self.addr, self.len) };
        }
    }
}

impl Drop for EmuRegion {
    fn drop(&mut self) {
        let index = self.key & 0xffff;
        if let Some(entry) = self.domain.table.reg(index) {
            entry.retire();
            self.domain.table.note_change();
            if entry.wait_idle(DEREG_TIMEOUT) {
                lock(&self.domain.regs).release(index);
            }
            // Otherwise a peer stopped in the middle of a copy and the entry's in-use
            // count will never drop: the entry stays retired (key 0) for good.
        }
    }
}

/// A queue-pair table entry, live from creation until the queue pair is dropped.
#[derive(Debug)]
struct QpSlot {
    domain: Arc<DomainInner>,
    key: u32,
}

impl QpSlot {
    fn new(domain: &Arc<DomainInner>) -> io::Result<QpSlot> {
        let key = lock(&domain.qps).alloc().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("queue-pair table full ({QP_CAPACITY} live queue pairs)"),
            )
        })?;
        let cell = domain
            .table
            .qp(key & 0xffff)
            .ok_or_else(|| io::Error::other("queue-pair index out of range"))?;
        // Release: like every store of this flag, against the peers' Acquire loads (the
        // descriptor exchange orders it before any peer looks anyway).
        cell.store(key, Ordering::Release);
        Ok(QpSlot {
            domain: Arc::clone(domain),
            key,
        })
    }
}

impl Drop for QpSlot {
    fn drop(&mut self) {
        if let Some(cell) = self.domain.table.qp(self.key & 0xffff) {
            // Release: a peer that sees the queue pair gone also sees everything this
            // side did before dropping it.
            cell.store(0, Ordering::Release);
            self.domain.table.note_change();
        }
        lock(&self.domain.qps).release(self.key & 0xffff);
    }
}

/// A queue pair of the emulated fabric that is not connected yet.
///
/// ```
/// use rdma_channel::fabric::emulated::EmuFabric;
/// use rdma_channel::fabric::{Fabric, PendingQp, QueuePair, QpState};
/// let (a, b) = (EmuFabric::new()?, EmuFabric::new()?);
/// let (pa, pb) = (a.create_qp()?, b.create_qp()?);
/// let (ca, cb) = (pa.card()?, pb.card()?);
/// let (qa, qb) = (pa.connect(cb)?, pb.connect(ca)?);
/// assert_eq!(qa.state(), QpState::ReadyToSend);
/// drop(qb);
/// assert_eq!(qa.state(), QpState::Error, "the peer queue pair is gone");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct EmuPending {
    slot: QpSlot,
    send_queue_depth: usize,
    /// The link a rail with a rate runs on.
    pacer: Option<Arc<Pacer>>,
}

impl PendingQp for EmuPending {
    type Qp = EmuQp;

    fn card(&self) -> io::Result<Card> {
        let domain = &self.slot.domain;
        let segs = domain.card_segments(crate::fabric::MAX_CARD_FDS - 1)?;
        let mut fds = Vec::with_capacity(segs.len() + 1);
        fds.push(domain.shm.fd().try_clone()?);
        let mut segments = Vec::with_capacity(segs.len());
        for (rec, fd) in segs {
            segments.push(rec);
            fds.push(fd);
        }
        let info = CardInfo {
            pid: domain.pid,
            domain_id: domain.id,
            qp_key: self.slot.key,
            domain_fd: domain.shm.fd().as_raw_fd() as u32,
            segments,
        };
        Ok(Card {
            bytes: info.encode(),
            fds,
        })
    }

    fn connect(self, peer: Card) -> io::Result<EmuQp> {
        let peer = peer::Peer::connect(peer)?;
        Ok(EmuQp::new(
            self.slot,
            peer,
            self.send_queue_depth,
            self.pacer,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{CompletionStatus, Opcode, QueuePair, RemoteRegion, Sge, WorkRequest};

    /// Pages of `[addr, addr + len)` in memory (mincore: for shared memory, in the
    /// page cache, whichever process faulted them in).
    fn resident_pages(addr: *mut u8, len: usize) -> usize {
        let page = shm::page_size();
        let mut vec = vec![0u8; len.div_ceil(page)];
        // SAFETY: the range is a live mapping of the caller's; mincore only reads the
        // kernel's page tables into `vec`, which has a byte per page.
        let r = unsafe { libc::mincore(addr.cast(), len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn make_resident_faults_in_every_page_and_changes_no_byte() {
        let f = EmuFabric::new().unwrap();
        let len = 1 << 20;
        let r = f
            .alloc_region(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(
            resident_pages(r.addr(), len),
            0,
            "nothing is faulted in at first"
        );
        // SAFETY: the region is ours, `len` bytes long, and nobody else writes it.
        unsafe { r.addr().add(5000).write(0x5a) };
        assert_eq!(resident_pages(r.addr(), len), 1);
        r.make_resident();
        assert_eq!(resident_pages(r.addr(), len), len / shm::page_size());
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(r.addr(), len) };
        assert!(bytes
            .iter()
            .enumerate()
            .all(|(i, &b)| b == if i == 5000 { 0x5a } else { 0 }));
    }

    #[test]
    fn prepare_remote_faults_in_the_peer_region_through_our_view() {
        let (a, b) = (EmuFabric::new().unwrap(), EmuFabric::new().unwrap());
        let (qa, _qb) = pair(&a, &b);
        let len = 1 << 20;
        let r = b
            .alloc_region(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(resident_pages(r.addr(), len), 0);
        // A region that is not all the peer's, or a wrong key, is left alone.
        let mut beyond = r.remote();
        beyond.len += 1;
        qa.prepare_remote(beyond);
        qa.prepare_remote(RemoteRegion {
            rkey: r.rkey() ^ 0x10000,
            ..r.remote()
        });
        assert_eq!(resident_pages(r.addr(), len), 0);
        qa.prepare_remote(r.remote());
        assert_eq!(resident_pages(r.addr(), len), len / shm::page_size());
        // SAFETY: the region is b's, `len` bytes, and nobody writes it now.
        let bytes = unsafe { std::slice::from_raw_parts(r.addr(), len) };
        assert!(bytes.iter().all(|&b| b == 0));
    }

    fn pair(a: &EmuFabric, b: &EmuFabric) -> (EmuQp, EmuQp) {
        let (pa, pb) = (a.create_qp().unwrap(), b.create_qp().unwrap());
        let (ca, cb) = (pa.card().unwrap(), pb.card().unwrap());
        (pa.connect(cb).unwrap(), pb.connect(ca).unwrap())
    }

    /// Writes `data` inline at `addr` and returns the completion status.
    fn write(qp: &EmuQp, data: &[u8], addr: u64, rkey: u32) -> CompletionStatus {
        let sge = [Sge {
            addr: data.as_ptr() as *mut u8,
            len: data.len() as u32,
            lkey: 0,
        }];
        let wr = WorkRequest {
            wr_id: 1,
            opcode: Opcode::Write {
                local: &sge,
                remote_addr: addr,
                rkey,
                inline: true,
            },
            signaled: true,
        };
        // SAFETY: inline data is valid during the call.
        unsafe { qp.post(&wr).unwrap() };
        let mut c = [crate::fabric::Completion {
            wr_id: 0,
            status: CompletionStatus::Flushed,
            op: crate::fabric::CompletedOp::Read,
            byte_len: 0,
        }];
        assert_eq!(qp.poll(&mut c), 1);
        c[0].status
    }

    #[test]
    fn keys_are_never_zero_and_change_when_an_entry_is_reused() {
        let mut a = SlotAlloc::new(4);
        let k0 = a.alloc().unwrap();
        assert_eq!(k0, 1 << 16);
        a.release(0);
        let k1 = a.alloc().unwrap();
        assert_eq!(k1 & 0xffff, 0, "freed entries are reused first");
        assert_ne!(k1, k0);
        a.gens[0] = u16::MAX;
        a.release(0);
        assert_eq!(
            a.alloc().unwrap(),
            1 << 16,
            "generation 0 is skipped on wrap"
        );
        for _ in 0..3 {
            assert!(a.alloc().is_some());
        }
        assert_eq!(a.alloc(), None, "capacity is enforced");
    }

    #[test]
    fn registration_inside_a_segment_is_segment_backed_and_elsewhere_private() {
        let f = EmuFabric::new().unwrap();
        let r = f.alloc_region(8192, Access::REMOTE_WRITE).unwrap();
        // SAFETY: a sub-range of the live region.
        let sub = unsafe { f.register(r.addr().add(100), 200, Access::REMOTE_WRITE) }.unwrap();
        let mut heap = vec![0u8; 64];
        // SAFETY: the vector outlives the region.
        let private = unsafe { f.register(heap.as_mut_ptr(), 64, Access::REMOTE_WRITE) }.unwrap();
        let entry = |k: u32| f.inner.table.reg(k & 0xffff).unwrap().snapshot(k).unwrap();
        let (whole, part, priv_) = (entry(r.rkey()), entry(sub.rkey()), entry(private.rkey()));
        assert_ne!(whole.seg_slot, NO_SEGMENT);
        assert_eq!(
            (part.seg_slot, part.seg_gen, part.seg_off),
            (whole.seg_slot, whole.seg_gen, 100)
        );
        assert_eq!(priv_.seg_slot, NO_SEGMENT);
        // SAFETY: a range straddling the end of the segment's page is not inside it.
        let straddle = unsafe { f.register(r.addr().add(8000), 400, Access::NONE) }.unwrap();
        assert_eq!(entry(straddle.rkey()).seg_slot, NO_SEGMENT);
    }

    #[test]
    fn zero_length_and_null_registrations_are_refused() {
        let f = EmuFabric::new().unwrap();
        assert_eq!(
            f.alloc_region(0, Access::NONE).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let mut x = 0u8;
        // SAFETY: refused before any use.
        let e = unsafe { f.register(&mut x, 0, Access::NONE) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // SAFETY: refused before any use.
        let e = unsafe { f.register(std::ptr::null_mut(), 8, Access::NONE) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_reused_registration_slot_gets_a_new_key() {
        let f = EmuFabric::new().unwrap();
        let r = f.alloc_region(64, Access::REMOTE_WRITE).unwrap();
        let old = r.rkey();
        drop(r);
        let r2 = f.alloc_region(64, Access::REMOTE_WRITE).unwrap();
        assert_eq!(r2.rkey() & 0xffff, old & 0xffff, "LIFO reuse of the entry");
        assert_ne!(r2.rkey(), old);
    }

    #[test]
    fn a_reused_segment_slot_is_reached_through_a_fresh_view() {
        let (a, b) = (EmuFabric::new().unwrap(), EmuFabric::new().unwrap());
        let (qa, _qb) = pair(&a, &b);
        let first = b.alloc_region(4096, Access::REMOTE_WRITE).unwrap();
        assert_eq!(
            write(&qa, &[1; 16], first.addr() as u64, first.rkey()),
            CompletionStatus::Success
        );
        // SAFETY: the region is live and the write completed.
        assert_eq!(unsafe { first.addr().read() }, 1);
        let slot = first._segment.as_ref().unwrap().slot;
        drop(first);
        let second = b.alloc_region(4096, Access::REMOTE_WRITE).unwrap();
        assert_eq!(
            second._segment.as_ref().unwrap().slot,
            slot,
            "the slot is reused"
        );
        assert_eq!(
            write(&qa, &[2; 16], second.addr() as u64 + 8, second.rkey()),
            CompletionStatus::Success
        );
        // SAFETY: the region is live and the write completed.
        let got = unsafe { std::slice::from_raw_parts(second.addr(), 32) };
        assert_eq!(&got[..8], &[0; 8]);
        assert_eq!(&got[8..24], &[2; 16]);
    }

    #[test]
    fn cards_carry_the_domain_and_every_live_segment() {
        let f = EmuFabric::new().unwrap();
        let _r1 = f.alloc_region(10, Access::NONE).unwrap();
        let _r2 = f.alloc_region(10, Access::NONE).unwrap();
        let p = f.create_qp().unwrap();
        let card = p.card().unwrap();
        assert_eq!(card.fds.len(), 3);
        let info = CardInfo::decode(&card.bytes, 3).unwrap();
        assert_eq!(info.pid, std::process::id());
        assert_eq!(info.segments.len(), 2);
    }

    #[test]
    fn a_dropped_domain_is_reported_dead_to_peers_holding_its_segment() {
        let f = EmuFabric::new().unwrap();
        let card = f.create_qp().unwrap().card().unwrap();
        drop(f);
        let p = EmuFabric::new().unwrap().create_qp().unwrap();
        let e = p.connect(card).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    }
}
