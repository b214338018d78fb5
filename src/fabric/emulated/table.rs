//! The shared layout of a domain segment: header, registration table, segment table and
//! queue-pair table.
//!
//! The owner process writes this memory; peers (other threads, other processes) read it
//! concurrently through their own mapping. Every field is therefore an atomic, and every
//! multi-field record is published seqlock-style under a key that is zero while the
//! record is being (re)written:
//!
//! * the writer clears the key, issues a release fence, writes the fields (relaxed), then
//!   stores the new non-zero key with `Release`;
//! * a reader loads the key (`Acquire`), reads the fields (relaxed), issues an acquire
//!   fence and reloads the key; the snapshot is valid only if both loads returned the key
//!   it expected. Keys carry a generation, so a recycled record has a different key.
//!
//! A peer must treat everything it reads here as untrusted: it bounds-checks slots and,
//! for segment-backed memory, checks offsets against *its own* mapping's length.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Magic number at the start of a domain segment and of a card: "RDMAEMU1".
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"RDMAEMU1");
/// Layout version; bumped on any incompatible change of this file or of the card.
pub(crate) const VERSION: u32 = 2;
/// Registration-table entries per domain.
pub(crate) const REG_CAPACITY: u32 = 8192;
/// Segment-table entries per domain.
pub(crate) const SEG_CAPACITY: u32 = 1024;
/// Queue-pair-table entries per domain.
pub(crate) const QP_CAPACITY: u32 = 4096;
/// "No segment": the registration is private memory of the owner.
pub(crate) const NO_SEGMENT: u32 = u32::MAX;

/// The domain header (one cache line at offset 0).
#[repr(C, align(64))]
pub(crate) struct Header {
    /// [`MAGIC`].
    pub(crate) magic: AtomicU64,
    /// Process-unique domain identifier (pid in the high half).
    pub(crate) domain_id: AtomicU64,
    /// [`VERSION`].
    pub(crate) version: AtomicU32,
    /// Owner's process id.
    pub(crate) pid: AtomicU32,
    /// 1 while the owner's domain exists, 0 after it was dropped.
    pub(crate) alive: AtomicU32,
    /// [`REG_CAPACITY`].
    pub(crate) reg_capacity: AtomicU32,
    /// [`SEG_CAPACITY`].
    pub(crate) seg_capacity: AtomicU32,
    /// [`QP_CAPACITY`].
    pub(crate) qp_capacity: AtomicU32,
    /// Bumped by the owner after every change that can make a peer's remembered
    /// write target stale (a registration retired, a queue pair or segment gone, the
    /// domain dropped), so a peer re-checks that target in one load
    /// ([`DomainTable::changes`]).
    pub(crate) changes: AtomicU64,
}

/// One registration. Each entry has its own cache line so that the `inuse` counter of
/// one region does not bounce the line that holds another region's key.
#[repr(C, align(64))]
#[cfg_attr(test, derive(Default))]
pub(crate) struct RegEntry {
    /// `(generation << 16) | index`, 0 while free or being rewritten.
    key: AtomicU32,
    /// [`crate::fabric::Access`] bits.
    access: AtomicU32,
    /// Start address in the owner's address space.
    va: AtomicU64,
    /// Length in bytes.
    len: AtomicU64,
    /// Segment slot, or [`NO_SEGMENT`] for private memory.
    seg_slot: AtomicU32,
    /// Generation of the segment in `seg_slot`.
    seg_gen: AtomicU32,
    /// Offset of `va` inside the segment.
    seg_off: AtomicU64,
    /// Accesses to private memory in progress (the deregistration fence).
    inuse: AtomicU32,
}

/// One data segment of the owner.
#[repr(C)]
#[cfg_attr(test, derive(Default))]
pub(crate) struct SegEntry {
    /// Generation of the segment, 0 while the slot is free or being rewritten.
    gen: AtomicU32,
    /// The owner's descriptor number for the segment's memfd.
    fd: AtomicU32,
    /// Segment length in bytes.
    len: AtomicU64,
}

const HEADER_SIZE: usize = std::mem::size_of::<Header>();
const REG_OFFSET: usize = HEADER_SIZE;
const SEG_OFFSET: usize = REG_OFFSET + REG_CAPACITY as usize * std::mem::size_of::<RegEntry>();
const QP_OFFSET: usize = SEG_OFFSET + SEG_CAPACITY as usize * std::mem::size_of::<SegEntry>();
/// Bytes a domain segment needs (before page rounding).
pub(crate) const LAYOUT_SIZE: usize =
    QP_OFFSET + QP_CAPACITY as usize * std::mem::size_of::<AtomicU32>();

// The layout is shared between processes built from the same source; pin it down so an
// accidental change is a compile error rather than silent corruption.
const _: () = assert!(std::mem::size_of::<Header>() == 64);
const _: () = assert!(std::mem::size_of::<RegEntry>() == 64);
const _: () = assert!(std::mem::size_of::<SegEntry>() == 16);
const _: () = assert!(REG_OFFSET % std::mem::align_of::<RegEntry>() == 0);
const _: () = assert!(SEG_OFFSET % std::mem::align_of::<SegEntry>() == 0);
const _: () = assert!(QP_OFFSET % std::mem::align_of::<AtomicU32>() == 0);
const _: () = assert!(LAYOUT_SIZE == 64 + 8192 * 64 + 1024 * 16 + 4096 * 4);
// Keys keep the index in 16 bits.
const _: () = assert!(REG_CAPACITY <= 1 << 16 && QP_CAPACITY <= 1 << 16);

/// What a reader learns from a registration entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RegSnapshot {
    /// Access bits.
    pub(crate) access: u32,
    /// Start address in the owner's address space.
    pub(crate) va: u64,
    /// Length.
    pub(crate) len: u64,
    /// Segment slot or [`NO_SEGMENT`].
    pub(crate) seg_slot: u32,
    /// Segment generation.
    pub(crate) seg_gen: u32,
    /// Offset of `va` in the segment.
    pub(crate) seg_off: u64,
}

impl RegSnapshot {
    /// True when `[addr, addr + len)` lies inside the registration (overflow = outside).
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        let Some(reg_end) = self.va.checked_add(self.len) else {
            return false;
        };
        addr >= self.va && end <= reg_end
    }
}

impl RegEntry {
    /// Publishes a registration under `key` (owner only, entry must be free).
    pub(crate) fn publish(&self, key: u32, snap: &RegSnapshot) {
        // Release fence: a reader that sees any of the relaxed field stores below and
        // then fences with Acquire also sees the key cleared by the previous owner of
        // this entry, so its second key load fails (seqlock writer side).
        fence(Ordering::Release);
        // Relaxed field stores: ordered by the fence above and the key's Release below.
        self.access.store(snap.access, Ordering::Relaxed);
        self.va.store(snap.va, Ordering::Relaxed);
        self.len.store(snap.len, Ordering::Relaxed);
        self.seg_slot.store(snap.seg_slot, Ordering::Relaxed);
        self.seg_gen.store(snap.seg_gen, Ordering::Relaxed);
        self.seg_off.store(snap.seg_off, Ordering::Relaxed);
        // Release: a reader that loads this key with Acquire sees all the fields above.
        self.key.store(key, Ordering::Release);
    }

    /// Reads the entry if its key is `key`; `None` for a stale or invalid key.
    pub(crate) fn snapshot(&self, key: u32) -> Option<RegSnapshot> {
        if key == 0 {
            return None;
        }
        // Acquire: pairs with the Release store in `publish`, so the fields read below
        // are at least those published with this key.
        if self.key.load(Ordering::Acquire) != key {
            return None;
        }
        // Relaxed field loads: ordered by the key's Acquire above and the fence below.
        let snap = RegSnapshot {
            access: self.access.load(Ordering::Relaxed),
            va: self.va.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed),
            seg_slot: self.seg_slot.load(Ordering::Relaxed),
            seg_gen: self.seg_gen.load(Ordering::Relaxed),
            seg_off: self.seg_off.load(Ordering::Relaxed),
        };
        // Acquire fence: if any field read above came from a later re-publication, the
        // key reload below sees that the key changed (pairs with the Release fence at
        // the top of `publish`).
        fence(Ordering::Acquire);
        (self.key.load(Ordering::Relaxed) == key).then_some(snap)
    }

    /// Starts an access to the private memory registered under `key`. Returns false
    /// (and leaves no trace) if the key is no longer valid; on true the caller must call
    /// [`leave`](Self::leave) once its copy is done.
    pub(crate) fn enter(&self, key: u32) -> bool {
        // SeqCst increment and SeqCst key reload, against the SeqCst key clear and
        // SeqCst `inuse` load in `retire`/`wait_idle` (Dekker): either we see the key
        // cleared, or the deregistering thread sees our increment and waits.
        self.inuse.fetch_add(1, Ordering::SeqCst);
        if self.key.load(Ordering::SeqCst) == key {
            true
        } else {
            self.leave();
            false
        }
    }

    /// Ends an access begun by a successful [`enter`](Self::enter).
    pub(crate) fn leave(&self) {
        // Release: the copy into or out of the memory happens-before the deregistering
        // thread's load that sees the counter drop, so it is complete when dereg returns.
        self.inuse.fetch_sub(1, Ordering::Release);
    }

    /// Invalidates the key (owner only). New accesses fail from here on.
    pub(crate) fn retire(&self) {
        // SeqCst: one side of the Dekker handshake with `enter`.
        self.key.store(0, Ordering::SeqCst);
    }

    /// Waits until no access begun before [`retire`](Self::retire) is in progress.
    /// Spins briefly, then sleeps 50 us at a time; gives up after `timeout` and returns
    /// false (a peer process that died in the middle of a copy never finishes it).
    pub(crate) fn wait_idle(&self, timeout: Duration) -> bool {
        // SeqCst: the other side of the Dekker handshake (see `enter`); it is also an
        // Acquire load, pairing with the Release decrement in `leave`.
        if self.inuse.load(Ordering::SeqCst) == 0 {
            return true;
        }
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            // SeqCst as above.
            if self.inuse.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if spins < 1000 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                if start.elapsed() > timeout {
                    return false;
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

/// What a reader learns from a segment-table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegSnapshot {
    /// The owner's descriptor number.
    pub(crate) fd: u32,
    /// Segment length.
    pub(crate) len: u64,
}

impl SegEntry {
    /// Publishes a live segment (owner only, entry must be free).
    pub(crate) fn publish(&self, gen: u32, fd: u32, len: u64) {
        // Release fence: seqlock writer side, as in `RegEntry::publish`.
        fence(Ordering::Release);
        // Relaxed field stores: ordered by the fence above and the Release below.
        self.fd.store(fd, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        // Release: readers that see `gen` see the fields above.
        self.gen.store(gen, Ordering::Release);
    }

    /// Marks the slot free (owner only).
    pub(crate) fn clear(&self) {
        // Release: orders the clear after everything the owner did with the segment;
        // readers only use the value to decide that the segment is gone.
        self.gen.store(0, Ordering::Release);
    }

    /// Reads the entry if it holds generation `gen`.
    pub(crate) fn snapshot(&self, gen: u32) -> Option<SegSnapshot> {
        if gen == 0 {
            return None;
        }
        // Acquire: pairs with the Release store of `gen` in `publish`.
        if self.gen.load(Ordering::Acquire) != gen {
            return None;
        }
        // Relaxed field loads: ordered by the Acquire above and the fence below.
        let snap = SegSnapshot {
            fd: self.fd.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed),
        };
        // Acquire fence: seqlock reader side, as in `RegEntry::snapshot`.
        fence(Ordering::Acquire);
        (self.gen.load(Ordering::Relaxed) == gen).then_some(snap)
    }
}

/// A view of a domain segment's layout. `Copy`: it is a base pointer; whoever holds one
/// keeps the mapping alive (the domain or a peer mapping next to it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Table {
    base: *const u8,
}

// SAFETY: the view only hands out references to atomics, which are Sync; the mapping's
// lifetime is guaranteed by whoever holds the view (see `Table::new`).
unsafe impl Send for Table {}
// SAFETY: as above.
unsafe impl Sync for Table {}

impl Table {
    /// A view of the layout at `base`.
    ///
    /// # Safety
    ///
    /// `base` must be page-aligned, point at least [`LAYOUT_SIZE`] bytes of shared,
    /// readable and writable memory, and stay mapped while the view (or any reference
    /// obtained from it) is used.
    pub(crate) unsafe fn new(base: *const u8) -> Table {
        Table { base }
    }

    /// The header.
    pub(crate) fn header(&self) -> &Header {
        // SAFETY: offset 0 is inside the mapping (Table::new contract) and page-aligned;
        // Header is made of atomics, valid for any bit pattern.
        unsafe { &*self.base.cast::<Header>() }
    }

    /// Registration entry `index`, `None` past the table.
    pub(crate) fn reg(&self, index: u32) -> Option<&RegEntry> {
        if index >= REG_CAPACITY {
            return None;
        }
        // SAFETY: index is in bounds, so the entry lies inside the mapping; REG_OFFSET
        // and the entry size keep it 64-byte aligned; atomics accept any bit pattern.
        Some(unsafe {
            &*self
                .base
                .add(REG_OFFSET)
                .cast::<RegEntry>()
                .add(index as usize)
        })
    }

    /// Segment entry `slot`, `None` past the table.
    pub(crate) fn seg(&self, slot: u32) -> Option<&SegEntry> {
        if slot >= SEG_CAPACITY {
            return None;
        }
        // SAFETY: as in `reg`, for the segment table.
        Some(unsafe {
            &*self
                .base
                .add(SEG_OFFSET)
                .cast::<SegEntry>()
                .add(slot as usize)
        })
    }

    /// Queue-pair entry `index` (holds the queue pair's key while it exists).
    pub(crate) fn qp(&self, index: u32) -> Option<&AtomicU32> {
        if index >= QP_CAPACITY {
            return None;
        }
        // SAFETY: as in `reg`, for the queue-pair table.
        Some(unsafe {
            &*self
                .base
                .add(QP_OFFSET)
                .cast::<AtomicU32>()
                .add(index as usize)
        })
    }

    /// Writes the header of a fresh (zeroed) domain segment (owner only, before the
    /// segment is shared).
    pub(crate) fn init(&self, domain_id: u64, pid: u32) {
        let h = self.header();
        // Relaxed: the segment is not shared yet; handing its descriptor to a peer (a
        // system call) orders these stores before anything the peer reads.
        h.domain_id.store(domain_id, Ordering::Relaxed);
        h.version.store(VERSION, Ordering::Relaxed);
        h.pid.store(pid, Ordering::Relaxed);
        h.reg_capacity.store(REG_CAPACITY, Ordering::Relaxed);
        h.seg_capacity.store(SEG_CAPACITY, Ordering::Relaxed);
        h.qp_capacity.store(QP_CAPACITY, Ordering::Relaxed);
        h.alive.store(1, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Relaxed);
    }

    /// Checks a peer's header: magic, version, capacities, identity.
    ///
    /// # Errors
    ///
    /// A message naming the first field that does not match.
    pub(crate) fn validate(&self, domain_id: u64, pid: u32) -> Result<(), String> {
        let h = self.header();
        // Acquire on every load: cheap, and orders them after the peer's initialisation
        // for any reader that did not get the segment through a system call.
        let magic = h.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(format!(
                "domain segment has magic {magic:#x}, expected {MAGIC:#x}"
            ));
        }
        let version = h.version.load(Ordering::Acquire);
        if version != VERSION {
            return Err(format!(
                "domain segment has layout version {version}, expected {VERSION}"
            ));
        }
        let caps = (
            h.reg_capacity.load(Ordering::Acquire),
            h.seg_capacity.load(Ordering::Acquire),
            h.qp_capacity.load(Ordering::Acquire),
        );
        if caps != (REG_CAPACITY, SEG_CAPACITY, QP_CAPACITY) {
            return Err(format!("domain segment has table capacities {caps:?}, expected ({REG_CAPACITY}, {SEG_CAPACITY}, {QP_CAPACITY})"));
        }
        let id = h.domain_id.load(Ordering::Acquire);
        let owner = h.pid.load(Ordering::Acquire);
        if id != domain_id || owner != pid {
            return Err(format!(
                "domain segment belongs to domain {id:#x} of pid {owner}, the card names domain {domain_id:#x} of pid {pid}"
            ));
        }
        Ok(())
    }

    /// True while the owner's domain exists.
    pub(crate) fn alive(&self) -> bool {
        // Acquire: pairs with the Release clear in `set_dead`; cheap on the hot path.
        self.header().alive.load(Ordering::Acquire) != 0
    }

    /// Marks the domain gone (owner only, when it is dropped).
    pub(crate) fn set_dead(&self) {
        // Release: everything the owner did before dropping is visible to a peer that
        // observes the flag cleared.
        self.header().alive.store(0, Ordering::Release);
        self.note_change();
    }

    /// How many changes [`note_change`](Self::note_change) counted: a peer that saw
    /// this number when it checked a write target in full, and sees it again, knows
    /// that no registration, queue pair or segment of this domain went since.
    #[inline(always)]
    pub(crate) fn changes(&self) -> u64 {
        // Acquire: pairs with the Release in `note_change`, so a peer that sees the
        // new count also sees the change it counts (a cleared key, queue pair,
        // segment or alive flag).
        self.header().changes.load(Ordering::Acquire)
    }

    /// The word [`changes`](Self::changes) loads, for a writer outside this crate's
    /// code (the send lane, `engine/lane.rs`) that checks it before each write.
    pub(crate) fn changes_word(&self) -> &AtomicU64 {
        &self.header().changes
    }

    /// Counts a change that can make a peer's remembered write target stale (owner
    /// only): called after the change itself is stored.
    pub(crate) fn note_change(&self) {
        // Release: see `changes`.
        self.header().changes.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(va: u64, len: u64) -> RegSnapshot {
        RegSnapshot {
            access: 6,
            va,
            len,
            seg_slot: NO_SEGMENT,
            seg_gen: 0,
            seg_off: 0,
        }
    }

    #[test]
    fn snapshot_requires_the_exact_key() {
        let e = RegEntry::default();
        assert_eq!(e.snapshot(0), None);
        e.publish(0x1_0005, &snap(0x1000, 64));
        assert_eq!(e.snapshot(0x1_0005), Some(snap(0x1000, 64)));
        assert_eq!(e.snapshot(0x2_0005), None);
        e.retire();
        assert_eq!(e.snapshot(0x1_0005), None);
        assert!(!e.enter(0x1_0005));
        assert!(e.wait_idle(Duration::from_millis(1)));
    }

    #[test]
    fn wait_idle_times_out_while_an_access_is_open() {
        let e = RegEntry::default();
        e.publish(0x1_0001, &snap(0, 8));
        assert!(e.enter(0x1_0001));
        e.retire();
        assert!(!e.wait_idle(Duration::from_millis(5)));
        e.leave();
        assert!(e.wait_idle(Duration::from_millis(5)));
    }

    #[test]
    fn contains_checks_both_ends_and_overflow() {
        let s = snap(0x1000, 0x100);
        assert!(s.contains(0x1000, 0x100));
        assert!(s.contains(0x10ff, 1));
        assert!(!s.contains(0x10ff, 2));
        assert!(!s.contains(0xfff, 1));
        assert!(!s.contains(u64::MAX, 2));
        assert!(s.contains(0x1100, 0));
        let top = snap(u64::MAX - 7, 16);
        assert!(
            !top.contains(u64::MAX - 7, 1),
            "a registration that overflows contains nothing"
        );
    }

    #[test]
    fn segment_snapshot_checks_generation() {
        let s = SegEntry::default();
        assert_eq!(s.snapshot(1), None);
        s.publish(3, 17, 4096);
        assert_eq!(s.snapshot(3), Some(SegSnapshot { fd: 17, len: 4096 }));
        assert_eq!(s.snapshot(4), None);
        s.clear();
        assert_eq!(s.snapshot(3), None);
    }
}
