//! The memory a connection's peer writes, and the sender's staging copy: the only raw
//! memory the engine touches, behind four small types.
//!
//! * [`RingMemory`]: the incoming ring. Words are polled atomically (the peer's fabric
//!   writes them like a NIC's DMA, never torn: fabric guarantee 3), payload is copied
//!   out, and consumed boundary words are cleared.
//! * [`ControlWords`]: the control region, one named accessor per word, each with the
//!   memory ordering the protocol needs and why.
//! * [`StagingBuffer`]: the registered copy of the outgoing ring that packets are
//!   assembled in when the fabric cannot write them inline.
//! * [`Doorbell`]: one per process, not per connection: a word per peer that its
//!   sender sets when asked, so quiet connections cost one load per poll.
//!
//! Every access is bounds-checked against the region (positions are reduced with the
//! ring's mask; copies are checked), so the safety of this file does not depend on the
//! engine's arithmetic. What the bytes *mean* is the engine's business: a peer that
//! writes garbage yields garbage values here, never an access outside the region.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

use super::wire::{CELL, SHORT_HEADER_OFFSET};
use crate::fabric::{
    FabricError, GatherList, MemoryRegion, Opcode, QueuePair, RemoteRegion, Sge, WorkRequest,
};

/// A region and its start address, cached because the data path reads it on every
/// access. The one place where a raw pointer into registered memory is kept.
struct RegionPtr<R: MemoryRegion> {
    base: NonNull<u8>,
    region: R,
}

// SAFETY: `base` points into `region`, which this value owns and which is Send + Sync
// (the MemoryRegion bound). The types below access memory through `base` only
// atomically or by copies whose ranges they check, as they would through the region.
unsafe impl<R: MemoryRegion> Send for RegionPtr<R> {}
// SAFETY: as above.
unsafe impl<R: MemoryRegion> Sync for RegionPtr<R> {}

impl<R: MemoryRegion> RegionPtr<R> {
    /// `None` for a null region, or one whose start is not 64-byte aligned when
    /// `aligned` asks for it.
    fn new(region: R, aligned: bool) -> Option<RegionPtr<R>> {
        let base = NonNull::new(region.addr())?;
        if aligned && base.as_ptr() as usize % 64 != 0 {
            return None;
        }
        Some(RegionPtr { base, region })
    }

    /// The region's length.
    fn len(&self) -> usize {
        self.region.len()
    }
}

/// The incoming ring: registered memory the peer writes with RDMA WRITE.
///
/// ```
/// use std::sync::atomic::Ordering;
/// use rdma_channel::fabric::{emulated::EmuFabric, Access, Fabric};
/// use rdma_channel::ring::memory::RingMemory;
/// let fabric = EmuFabric::new()?;
/// let ring = RingMemory::new(fabric.alloc_region(4096, Access::LOCAL_WRITE)?)?;
/// assert_eq!(ring.load_word(4096 + 8, Ordering::Relaxed), 0); // positions wrap
/// let mut out = [1u8; 16];
/// ring.copy_out(4096 - 16, &mut out);
/// assert_eq!(out, [0; 16]);
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// Clones share the region (it is deregistered when the last one is dropped), so
/// the receiving half can keep the ring's address and mask in its own fields rather
/// than behind the connection's shared state.
pub struct RingMemory<R: MemoryRegion> {
    /// Copy of `owner.base`, so that reads need no indirection.
    base: NonNull<u8>,
    mask: u64,
    owner: Arc<RegionPtr<R>>,
}

// SAFETY: `base` points into the region that `owner` keeps alive (Send + Sync, see
// RegionPtr); every access through it is atomic or a bounds-checked copy.
unsafe impl<R: MemoryRegion> Send for RingMemory<R> {}
// SAFETY: as above; shared access loads words atomically or copies bytes out.
unsafe impl<R: MemoryRegion> Sync for RingMemory<R> {}

impl<R: MemoryRegion> Clone for RingMemory<R> {
    fn clone(&self) -> Self {
        RingMemory {
            base: self.base,
            mask: self.mask,
            owner: self.owner.clone(),
        }
    }
}

/// Copies `dst.len()` bytes (`W` to `2 * W`) from `src` as two `W`-byte moves that
/// may overlap: a few instructions, where a `memcpy` call is a call through the PLT.
///
/// # Safety
///
/// `src..src + dst.len()` must be readable and must not overlap `dst`, and
/// `W <= dst.len()`.
#[inline(always)]
unsafe fn copy_two_overlapping<const W: usize>(src: *const u8, dst: &mut [u8]) {
    let n = dst.len();
    // SAFETY: the caller's contract: both W-byte reads lie in [src, src + n).
    let (head, tail) = unsafe {
        (
            std::ptr::read_unaligned(src.cast::<[u8; W]>()),
            std::ptr::read_unaligned(src.add(n - W).cast::<[u8; W]>()),
        )
    };
    dst[..W].copy_from_slice(&head);
    dst[n - W..].copy_from_slice(&tail);
}

impl<R: MemoryRegion> RingMemory<R> {
    /// Takes over `region` as a ring.
    ///
    /// # Errors
    ///
    /// `InvalidInput` unless the region's length is a power of two of at least 64
    /// bytes and its start is 64-byte aligned.
    pub fn new(region: R) -> io::Result<RingMemory<R>> {
        let len = region.len();
        RegionPtr::new(region, true)
            .filter(|_| len.is_power_of_two() && len >= 64)
            .map(|mem| RingMemory {
                base: mem.base,
                mask: len as u64 - 1,
                owner: Arc::new(mem),
            })
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a ring needs a 64-byte aligned power-of-two region, got {len} bytes"),
                )
            })
    }

    /// The region, for the connection card.
    pub fn region(&self) -> &R {
        &self.owner.region
    }

    /// The ring's size in bytes.
    #[inline]
    pub fn size(&self) -> u64 {
        self.mask + 1
    }

    /// Offset in the ring of absolute position `pos`.
    #[inline]
    pub fn offset(&self, pos: u64) -> usize {
        (pos & self.mask) as usize
    }

    #[inline]
    fn word(&self, pos: u64) -> &AtomicU64 {
        let off = self.offset(pos) & !7;
        // SAFETY: `off` is 8-aligned and at most size - 8, so the word lies inside the
        // region, which lives as long as `self`. The peer's fabric writes ring memory
        // only as whole aligned words or byte copies that never tear an aligned word
        // (fabric guarantee 3), and we access these words only atomically.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// Loads the 8-byte word at position `pos` (rounded down to a word) with `order`.
    #[inline]
    pub fn load_word(&self, pos: u64, order: Ordering) -> u64 {
        self.word(pos).load(order)
    }

    /// The first two words of the cell at position `pos` (a cell boundary), where a
    /// packet's header stands (ring::wire docs): the second is loaded first, with
    /// Acquire (a short packet's header, which orders the payload word before it),
    /// then the first, Relaxed. One address computation for both.
    ///
    /// ```
    /// use rdma_channel::fabric::{emulated::EmuFabric, Access, Fabric};
    /// use rdma_channel::ring::memory::RingMemory;
    /// let fabric = EmuFabric::new()?;
    /// let ring = RingMemory::new(fabric.alloc_region(4096, Access::LOCAL_WRITE)?)?;
    /// assert_eq!(ring.head_words(4096 + 64), [0, 0]); // positions wrap
    /// # Ok::<(), std::io::Error>(())
    /// ```
    #[inline]
    pub fn head_words(&self, pos: u64) -> [u64; 2] {
        let [first, second] = self.head_word_refs(pos);
        let second = second.load(Ordering::Acquire);
        [first.load(Ordering::Relaxed), second]
    }

    /// The two words [`head_words`](Self::head_words) loads at cell boundary `pos`,
    /// also for a caller that watches them from outside
    /// ([`crate::engine::QuietWatch`]): they stay where they are as long as this
    /// ring's memory does.
    #[inline(always)]
    pub(crate) fn head_word_refs(&self, pos: u64) -> [&AtomicU64; 2] {
        debug_assert_eq!(pos % CELL as u64, 0);
        let first = self.word(pos);
        // SAFETY: `pos` is a cell boundary, so its word's offset is at most
        // size - CELL and the word SHORT_HEADER_OFFSET (8) bytes on lies in the same
        // cell, inside the region, which lives as long as `self`; it is accessed only
        // atomically, as in `word`.
        let second = unsafe { &*(first as *const AtomicU64).add(SHORT_HEADER_OFFSET / 8) };
        [first, second]
    }

    /// Zeroes the word at position `pos` (rounded down to a word). Relaxed: the caller
    /// publishes the consumed range with a Release store afterwards, which orders this.
    #[inline]
    pub fn clear_word(&self, pos: u64) {
        self.word(pos).store(0, Ordering::Relaxed);
    }

    /// Zeroes the boundary words of `cells` consumed cells from ring offset `start`
    /// ([`boundary_offsets`](super::boundary_offsets)), in one pass: the range is
    /// checked once, and the base address stays in a register (a 64 KiB packet has
    /// 2,048 such words). Relaxed, as [`clear_word`](Self::clear_word).
    ///
    /// # Panics
    ///
    /// If `start` is not a cell boundary or the cells run past the ring's end.
    #[inline]
    pub fn clear_boundaries(&self, start: usize, cells: usize) {
        let size = self.size() as usize;
        assert!(
            start % CELL == 0 && cells <= (size - start.min(size)) / CELL,
            "{cells} cells at ring offset {start} run past the end"
        );
        let base = self.base.as_ptr();
        for off in super::boundary_offsets(start, cells) {
            // SAFETY: `off` is 8-aligned and inside [start, start + cells * CELL),
            // which lies in the region (checked above); atomic access as in `word`.
            unsafe { (*base.add(off).cast::<AtomicU64>()).store(0, Ordering::Relaxed) };
        }
    }

    /// Copies `dst.len()` bytes starting at position `pos` out of the ring.
    ///
    /// # Panics
    ///
    /// If the range runs past the ring's physical end (packets never do).
    #[inline]
    pub fn copy_out(&self, pos: u64, dst: &mut [u8]) {
        let off = self.offset(pos);
        assert!(
            dst.len() <= self.size() as usize - off,
            "copy of {} bytes at ring offset {off} runs past the end",
            dst.len()
        );
        // Both copies below read [off, off + len), which lies inside the region
        // (checked above), into `dst`, an exclusive borrow, so the ranges do not
        // overlap. The engine copies only packets whose trailer it has seen (so the
        // peer has finished writing them); a misbehaving peer could still be writing,
        // which changes the bytes we get but never what memory we touch.
        // SAFETY: off <= size (checked above), so the pointer stays in the region.
        let src = unsafe { self.base.as_ptr().add(off) };
        let n = dst.len();
        // A short payload as at most two fixed-size moves that may overlap (or three
        // single bytes): a `memcpy` call of run-time length costs a small message
        // more than its bytes.
        match n {
            // SAFETY: as said above ([src, src + n) readable, no overlap); n >= 8.
            8..=16 => unsafe { copy_two_overlapping::<8>(src, dst) },
            // SAFETY: as said above ([src, src + n) readable, no overlap); n >= 4.
            4..=7 => unsafe { copy_two_overlapping::<4>(src, dst) },
            1..=3 => {
                // First, middle and last byte: for 1 to 3 bytes together they are all.
                // SAFETY: as said above; the three offsets are below n.
                let (first, middle, last) =
                    unsafe { (src.read(), src.add(n / 2).read(), src.add(n - 1).read()) };
                dst[0] = first;
                dst[n / 2] = middle;
                dst[n - 1] = last;
            }
            // SAFETY: as said above: in the region, no overlap.
            _ => unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), n) },
        }
    }

    /// Lends `len` bytes starting at position `pos` in place, for a reader that looks
    /// at them without copying them out ([`Receiver::peek`](crate::Receiver::peek)).
    ///
    /// # Panics
    ///
    /// If the range runs past the ring's physical end (packets never do).
    #[inline]
    pub fn lend(&self, pos: u64, len: usize) -> &[u8] {
        let off = self.offset(pos);
        assert!(
            len <= self.size() as usize - off,
            "lend of {len} bytes at ring offset {off} runs past the end"
        );
        // SAFETY: [off, off + len) lies inside the region (checked above), which lives
        // as long as `self`. The engine lends only the payload of a packet whose trailer
        // it has seen, and frees those cells only through `&mut` access that ends this
        // borrow, so a peer that keeps to the protocol does not write them meanwhile.
        // The region is the peer's to write, like any receive buffer of RDMA: a peer
        // that breaks the protocol can change these bytes, but cannot move or free them.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(off), len) }
    }
}

/// Bit of the `EndOfStream` word set by a sender that went away (dropped) with a
/// zero-copy transfer unconfirmed: it revoked the transfer's buffers and will not push
/// a lend of it. Heads stay far below it.
pub const EOS_ABORTED: u64 = 1 << 63;

/// A word of the control region, each written only by the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtrlWord {
    /// From the receiver of our outgoing ring: its tail (explicit, delayed update).
    Tail,
    /// From the receiver of our outgoing ring: nonzero once it stopped reading.
    ReceiverClosed,
    /// From the receiver of our outgoing ring: the number of the last zero-copy
    /// announcement it has read in full.
    ZeroCopyDone,
    /// From the receiver of our outgoing ring: which path it measured cheaper for
    /// large buffers that may go either way (bits 0-8: zero-copy for size classes
    /// below 32 KiB, 64 KiB, ... 4 MiB, and above; the bits from 16 count its
    /// changes).
    /// See `engine::zerocopy::choose`.
    PathAdvice,
    /// From the receiver of our outgoing ring: the number of its last request to
    /// ring its [`Doorbell`] when we next write (it stopped looking at the ring).
    BellWanted,
    /// From the receiver of our outgoing ring: the number, plus one, of the eventfd
    /// in its process that a selector sleeps on (low 32 bits; 0: none), which bit of
    /// the eventfd's count to add (bits 32-36: the selector's hint of where this
    /// connection is among its items), and which eventfd that number names (bits
    /// 40-63: its instance, so that a number reused by a newer eventfd is taken
    /// again); when a bell request comes we wake it through [`QueuePair::notify`]
    /// after our next write. Written before the request it goes with.
    WakeFd,
    /// From the sender into our ring: credit request, the tail it knows + 1.
    CreditRequest,
    /// From the sender into our ring: end of stream, its final head + 1.
    EndOfStream,
    /// From the sender into our ring: the number of the last lend ([`LEND_SLOT`]) it
    /// has pushed in full.
    LendLanded,
    /// From the sender into our ring: the number of the [`RingOffer`] it asks for
    /// (one more than it has taken), when it found our ring full.
    RingWanted,
    /// From the sender into our ring: the number of the last [`RingOffer`] it
    /// declined (it could not allocate the staging copy the ring needs); that ring
    /// will never be written.
    RingDeclined,
    /// From the sender into our ring: the eventfd a selector in its process sleeps on
    /// while it waits for room (as [`CtrlWord::WakeFd`] encodes it; 0: none); when we
    /// answer a credit request we wake it through [`QueuePair::notify`].
    RoomWakeFd,
    /// From the peer, once, on a connection whose rails' cards could not travel with
    /// its own (rdma_cm): the length, plus one, of the rail cards it wrote into the
    /// slot at [`RAIL_CARDS_SLOT`] before this word (0: none yet).
    RailCards,
    /// From the peer, once: its extra rails are connected and may be read from (their
    /// count, plus one).
    RailsReady,
}

impl CtrlWord {
    /// Byte offset in the control region. The sender's words and the receiver's sit
    /// on different cache lines, as two threads may poll them; `BellWanted`, which
    /// our sender loads after every put, has a line of its own, away from `Tail`,
    /// which the peer rewrites every few packets.
    pub const fn offset(self) -> u64 {
        match self {
            CtrlWord::Tail => 0,
            CtrlWord::ReceiverClosed => 8,
            CtrlWord::ZeroCopyDone => 16,
            CtrlWord::PathAdvice => 24,
            CtrlWord::BellWanted => 256,
            CtrlWord::WakeFd => 264,
            CtrlWord::CreditRequest => 64,
            CtrlWord::EndOfStream => 72,
            CtrlWord::LendLanded => 80,
            CtrlWord::RingWanted => 88,
            CtrlWord::RingDeclined => 96,
            CtrlWord::RoomWakeFd => 104,
            CtrlWord::RailCards => 112,
            CtrlWord::RailsReady => 120,
        }
    }
}

/// A wake word ([`CtrlWord::WakeFd`], [`CtrlWord::RoomWakeFd`]): the eventfd's
/// number in the peer's process, its instance, and the value its wake adds.
fn decode_wake(v: u64) -> Option<(u32, u32, u32)> {
    let fd = (v as u32).checked_sub(1)?;
    Some((fd, (v >> 40) as u32, 1 << ((v >> 32) & 31)))
}

/// The wake word for eventfd `fd` of `instance`, whose wake adds bit `hint`.
pub(crate) fn encode_wake(fd: u32, instance: u32, hint: u32) -> u64 {
    u64::from(fd.wrapping_add(1))
        | u64::from(hint & 31) << 32
        | u64::from(instance & 0xff_ffff) << 40
}

/// Where the peer writes its rail cards in our control region
/// ([`CtrlWord::RailCards`]), and the most bytes they take.
pub const RAIL_CARDS_SLOT: u64 = 1024;
/// See [`RAIL_CARDS_SLOT`].
pub const RAIL_CARDS_MAX: usize = 1024;
const _: () = assert!(RAIL_CARDS_SLOT as usize + RAIL_CARDS_MAX <= CTRL_SIZE);
const _: () = assert!(RAIL_CARDS_SLOT % 8 == 0 && RAIL_CARDS_MAX % 8 == 0);

/// Words of the lend slot ([`Lend::to_words`]); the last is the lend's number.
pub const LEND_WORDS: usize = 5;
const LEND_NUMBER_WORD: usize = LEND_WORDS - 1;
const _: () = assert!(LEND_SLOT + 8 * LEND_WORDS as u64 <= RING_OFFER_SLOT);

/// Byte offset of the lend slot: five words from the receiver of our outgoing ring
/// naming part of its buffer for us to RDMA WRITE a zero-copy transfer's bytes into
/// (see [`Lend`]), on a cache line of its own.
pub const LEND_SLOT: u64 = 128;

/// Byte offset of the ring offer slot: four words from the receiver of our outgoing
/// ring naming the ring to write into after a [`Switch`](super::wire::PacketKind::Switch)
/// packet (see [`RingOffer`]), on a cache line of its own.
pub const RING_OFFER_SLOT: u64 = 192;

/// Bytes of a connection's control region.
pub const CTRL_SIZE: usize = 4096;

/// The control region: words the peer writes with 8-byte RDMA WRITEs.
///
/// ```
/// use rdma_channel::fabric::{emulated::EmuFabric, Access, Fabric};
/// use rdma_channel::ring::memory::{ControlWords, CTRL_SIZE};
/// let fabric = EmuFabric::new()?;
/// let ctrl = ControlWords::new(fabric.alloc_region(CTRL_SIZE, Access::REMOTE_WRITE)?)?;
/// assert_eq!((ctrl.tail(), ctrl.receiver_closed(), ctrl.end_of_stream()), (0, false, 0));
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct ControlWords<R: MemoryRegion> {
    mem: RegionPtr<R>,
}

impl<R: MemoryRegion> ControlWords<R> {
    /// Takes over `region` as a control region.
    ///
    /// # Errors
    ///
    /// `InvalidInput` unless the region is [`CTRL_SIZE`] bytes and 64-byte aligned.
    pub fn new(region: R) -> io::Result<ControlWords<R>> {
        RegionPtr::new(region, true)
            .filter(|mem| mem.len() == CTRL_SIZE)
            .map(|mem| ControlWords { mem })
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a control region is 4096 bytes, 64-byte aligned",
                )
            })
    }

    /// The region, for the connection card.
    pub fn region(&self) -> &R {
        &self.mem.region
    }

    #[inline]
    fn word(&self, w: CtrlWord) -> &AtomicU64 {
        let at = w.offset() as usize;
        // SAFETY: every offset is 8-aligned and below CTRL_SIZE, the region's length
        // (checked in `new`); the region lives as long as `self`; the peer's fabric
        // writes these words whole (fabric guarantee 3) and we only access them
        // atomically.
        unsafe { &*self.mem.base.as_ptr().add(at).cast::<AtomicU64>() }
    }

    /// The tail of our outgoing ring that the peer announced explicitly. Acquire:
    /// pairs with the fabric's Release store of the word; the peer had finished
    /// reading the space before it announced it, so our next writes cannot overtake
    /// its reads.
    #[inline]
    pub fn tail(&self) -> u64 {
        self.word(CtrlWord::Tail).load(Ordering::Acquire)
    }

    /// True once the peer's receiver stopped reading. Relaxed: a flag only; nothing
    /// is read on its strength.
    #[inline]
    pub fn receiver_closed(&self) -> bool {
        self.word(CtrlWord::ReceiverClosed).load(Ordering::Relaxed) != 0
    }

    /// The last zero-copy announcement the peer has read in full. Acquire: the
    /// peer's RDMA READs completed before it wrote the number, and the buffers may be
    /// handed back to the caller once we see it.
    #[inline]
    pub fn zero_copy_done(&self) -> u64 {
        self.word(CtrlWord::ZeroCopyDone).load(Ordering::Acquire)
    }

    /// The peer receiver's path advice for large buffers that may go either way
    /// ([`CtrlWord::PathAdvice`]; 0 until it gave one). Relaxed: a hint that picks a
    /// path; nothing is read on its strength.
    #[inline]
    pub fn path_advice(&self) -> u64 {
        self.word(CtrlWord::PathAdvice).load(Ordering::Relaxed)
    }

    /// The number of the peer receiver's last request to be rung
    /// ([`CtrlWord::BellWanted`]), 0 before the first. Relaxed: a request only; the
    /// bell it leads to orders nothing (the receiver reads the ring with its own
    /// Acquire loads).
    #[inline]
    pub fn bell_wanted(&self) -> u64 {
        self.word(CtrlWord::BellWanted).load(Ordering::Relaxed)
    }

    /// The eventfd the peer's selector named for wakes ([`CtrlWord::WakeFd`]): its
    /// number in the peer's process, its instance, and the value to add to it (one
    /// bit), or `None`. Relaxed: the bell request it goes with was loaded first, and
    /// the receiver wrote this word before it on the same queue pair (fabric
    /// guarantee 1).
    #[inline]
    pub fn wake_fd(&self) -> Option<(u32, u32, u32)> {
        decode_wake(self.word(CtrlWord::WakeFd).load(Ordering::Relaxed))
    }

    /// The eventfd the peer's sender named for a wake when we answer its credit
    /// request ([`CtrlWord::RoomWakeFd`]), decoded as [`wake_fd`](Self::wake_fd)'s.
    /// Relaxed: the request it goes with was loaded first (fabric guarantee 1).
    #[inline]
    pub fn room_wake_fd(&self) -> Option<(u32, u32, u32)> {
        decode_wake(self.word(CtrlWord::RoomWakeFd).load(Ordering::Relaxed))
    }

    /// The word [`bell_wanted`](Self::bell_wanted) loads, for the send lane, which
    /// compares it after each packet it writes (`engine/lane.rs`).
    pub(crate) fn bell_word(&self) -> &AtomicU64 {
        self.word(CtrlWord::BellWanted)
    }

    /// The peer sender's credit request (the tail it knows + 1), 0 before the first.
    /// Relaxed: only the value matters; the tail update that answers it orders the
    /// data itself.
    #[inline]
    pub fn credit_request(&self) -> u64 {
        self.word(CtrlWord::CreditRequest).load(Ordering::Relaxed)
    }

    /// The peer sender's end of stream (its final head + 1), 0 while it is open.
    /// Acquire: pairs with the fabric's Release store; the peer posted it after all
    /// its packets.
    #[inline]
    pub fn end_of_stream(&self) -> u64 {
        self.word(CtrlWord::EndOfStream).load(Ordering::Acquire) & !EOS_ABORTED
    }

    /// True when the peer's sender ended its stream by going away with a zero-copy
    /// transfer unconfirmed ([`EOS_ABORTED`]): it revoked the transfer and serves no
    /// lend of it any more. A sender that merely closed keeps serving until the
    /// transfer is read. Acquire: as [`end_of_stream`](Self::end_of_stream).
    #[inline]
    pub fn zero_copy_aborted(&self) -> bool {
        self.word(CtrlWord::EndOfStream).load(Ordering::Acquire) & EOS_ABORTED != 0
    }

    /// The number of the last lend the peer's sender pushed in full. Acquire: pairs
    /// with the fabric's Release store; the peer posted it after the pushed bytes, on
    /// the same queue pair, so they landed first (fabric guarantees 1 and 2).
    #[inline]
    pub fn lend_landed(&self) -> u64 {
        self.word(CtrlWord::LendLanded).load(Ordering::Acquire)
    }

    /// The number of the last lend the peer wrote into the lend slot, 0 before the
    /// first. Relaxed: a cheap check for news; [`lend`](Self::lend) orders the rest.
    #[inline]
    pub fn lend_number(&self) -> u64 {
        self.slot_word(LEND_NUMBER_WORD).load(Ordering::Relaxed)
    }

    /// The words a quiet receiver's watch compares ([`crate::engine::QuietWatch`]):
    /// the credit request, the end of stream and the lend slot's number.
    #[inline]
    pub(crate) fn quiet_words(&self) -> [&AtomicU64; 3] {
        [
            self.word(CtrlWord::CreditRequest),
            self.word(CtrlWord::EndOfStream),
            self.slot_word(LEND_NUMBER_WORD),
        ]
    }

    /// The lend slot as the peer last wrote it.
    pub fn lend(&self) -> Lend {
        // Acquire on the number, the slot's last word: the peer writes the five words
        // in one request, so the others are visible once it is (fabric guarantee 2).
        let number = self.slot_word(LEND_NUMBER_WORD).load(Ordering::Acquire);
        // Relaxed: ordered by the Acquire above.
        let w = |i| self.slot_word(i).load(Ordering::Relaxed);
        Lend::from_words([w(0), w(1), w(2), w(3), number])
    }

    /// The offer the peer's sender last asked for ([`CtrlWord::RingWanted`]), 0
    /// before the first. Relaxed: a request only; the offer it leads to is ordered
    /// by its own slot.
    #[inline]
    pub fn ring_wanted(&self) -> u64 {
        self.word(CtrlWord::RingWanted).load(Ordering::Relaxed)
    }

    /// The last ring offer the peer's sender declined, 0 before any. Relaxed: a
    /// number only; the declined ring is ours to free.
    #[inline]
    pub fn ring_declined(&self) -> u64 {
        self.word(CtrlWord::RingDeclined).load(Ordering::Relaxed)
    }

    /// The number of the last ring offer the peer wrote into the offer slot, 0
    /// before the first. Relaxed: a cheap check for news on the send path;
    /// [`ring_offer`](Self::ring_offer) orders the rest.
    #[inline]
    pub fn ring_offer_number(&self) -> u64 {
        self.offer_word(3).load(Ordering::Relaxed)
    }

    /// The ring offer slot as the peer last wrote it.
    pub fn ring_offer(&self) -> RingOffer {
        // Acquire on the number, the slot's last word: the peer writes the four words
        // in one request, so the others are visible once it is (fabric guarantee 2).
        let number = self.offer_word(3).load(Ordering::Acquire);
        // Relaxed: ordered by the Acquire above.
        let w = |i| self.offer_word(i).load(Ordering::Relaxed);
        RingOffer::from_words([w(0), w(1), w(2), number])
    }

    /// The rail cards the peer wrote ([`CtrlWord::RailCards`]), once it did: at most
    /// [`RAIL_CARDS_MAX`] bytes (a longer length is cut there; the cards' own
    /// format then finds them cut short).
    pub fn rail_cards(&self) -> Option<Vec<u8>> {
        // Acquire: the peer wrote the cards in an earlier request on the same queue
        // pair, placed before this word (fabric guarantee 1).
        let len = self.word(CtrlWord::RailCards).load(Ordering::Acquire);
        let len = (len.checked_sub(1)? as usize).min(RAIL_CARDS_MAX);
        let mut out = Vec::with_capacity(len.next_multiple_of(8));
        for i in 0..len.div_ceil(8) {
            let at = RAIL_CARDS_SLOT as usize + 8 * i;
            // SAFETY: i < RAIL_CARDS_MAX / 8, so the word lies 8-aligned inside
            // CTRL_SIZE (asserted above); as in `word`. Relaxed: ordered by the
            // Acquire above.
            let w = unsafe { &*self.mem.base.as_ptr().add(at).cast::<AtomicU64>() }
                .load(Ordering::Relaxed);
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.truncate(len);
        Some(out)
    }

    /// The peer's extra rails are connected: their count + 1 (0: not yet). Acquire:
    /// what the peer did before (connecting them) is done.
    pub fn rails_ready(&self) -> u64 {
        self.word(CtrlWord::RailsReady).load(Ordering::Acquire)
    }

    #[inline]
    fn slot_word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < LEND_WORDS);
        let at = LEND_SLOT as usize + 8 * i;
        // SAFETY: i < LEND_WORDS, so the word lies 8-aligned inside CTRL_SIZE (the
        // slot's line, before RING_OFFER_SLOT); as in `word`.
        unsafe { &*self.mem.base.as_ptr().add(at).cast::<AtomicU64>() }
    }

    #[inline]
    fn offer_word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < 4);
        let at = RING_OFFER_SLOT as usize + 8 * i;
        // SAFETY: i < 4, so the word lies 8-aligned inside CTRL_SIZE; as in `word`.
        unsafe { &*self.mem.base.as_ptr().add(at).cast::<AtomicU64>() }
    }
}

/// A ring offer: the receiver's next ring for our outgoing direction, `len` bytes
/// (a power of two) at `addr`, writable with `rkey`. `number` counts the receiver's
/// offers from 1 and is written last. The sender takes it by writing a
/// [`Switch`](super::wire::PacketKind::Switch) packet as the last packet of the ring
/// it leaves.
///
/// ```
/// use rdma_channel::ring::memory::RingOffer;
/// let o = RingOffer { addr: 0x7000, rkey: 5, len: 1 << 16, number: 2 };
/// assert_eq!(RingOffer::from_words(o.to_words()), o);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingOffer {
    /// The ring's start in the receiver's memory.
    pub addr: u64,
    /// Remote key of the ring.
    pub rkey: u32,
    /// The ring's size in bytes.
    pub len: u64,
    /// The offer's number (from 1).
    pub number: u64,
}

impl RingOffer {
    /// The slot's four words: `addr`, `rkey`, `len`, `number`.
    pub fn to_words(&self) -> [u64; 4] {
        [self.addr, u64::from(self.rkey), self.len, self.number]
    }

    /// The offer the four words describe.
    pub fn from_words(w: [u64; 4]) -> RingOffer {
        RingOffer {
            addr: w[0],
            rkey: w[1] as u32,
            len: w[2],
            number: w[3],
        }
    }
}

/// A lend: `len` bytes of the receiver's buffer at `addr` (writable with `rkey`, a
/// registration of exactly those bytes that the receiver revokes once they landed),
/// which take the bytes from `offset` on of the announced transfer numbered
/// `transfer` (a sender may have several announced). `number` counts the receiver's
/// lends from 1 and is written last.
///
/// ```
/// use rdma_channel::ring::memory::Lend;
/// let l = Lend { addr: 0x7000, rkey: 5, len: 4096, offset: 8192, transfer: 9, number: 3 };
/// assert_eq!(Lend::from_words(l.to_words()), l);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lend {
    /// Where the bytes go in the receiver's memory.
    pub addr: u64,
    /// Remote key of the lent bytes.
    pub rkey: u32,
    /// How many bytes.
    pub len: u32,
    /// Offset in the announced transfer of the first byte.
    pub offset: u64,
    /// The number of the announcement the bytes belong to.
    pub transfer: u64,
    /// The lend's number (from 1).
    pub number: u64,
}

impl Lend {
    /// The slot's five words: `addr`, `rkey | len << 32`, `offset`, `transfer`,
    /// `number`.
    pub fn to_words(&self) -> [u64; LEND_WORDS] {
        [
            self.addr,
            u64::from(self.rkey) | u64::from(self.len) << 32,
            self.offset,
            self.transfer,
            self.number,
        ]
    }

    /// The lend the five words describe.
    pub fn from_words(w: [u64; LEND_WORDS]) -> Lend {
        Lend {
            addr: w[0],
            rkey: w[1] as u32,
            len: (w[1] >> 32) as u32,
            offset: w[2],
            transfer: w[3],
            number: w[4],
        }
    }
}

/// A registered copy of the outgoing ring: packets are assembled here, at the offset
/// they will have in the peer's ring, and written from here (seed 001 sec. 4.2's,
/// the MPICH2 RDMA Channel paper's,
/// pre-registered send buffer), for fabrics whose inline limit is small.
pub struct StagingBuffer<R: MemoryRegion> {
    mem: RegionPtr<R>,
}

impl<R: MemoryRegion> StagingBuffer<R> {
    /// Takes over `region` (registered with local access at least).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a null region.
    pub fn new(region: R) -> io::Result<StagingBuffer<R>> {
        RegionPtr::new(region, false)
            .map(|mem| StagingBuffer { mem })
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "null staging region"))
    }

    /// Its size in bytes.
    pub fn size(&self) -> usize {
        self.mem.len()
    }

    /// Copies the pieces of `list` to offset `at` and writes them from there to the
    /// same offset of the peer's ring with one non-inline RDMA WRITE on `qp`.
    ///
    /// The caller keeps `[at, at + list.bytes())` for this write until the peer has
    /// consumed it (the sender only reuses ring space the peer freed, and the peer
    /// frees it after the write landed), so the bytes stay as posted while the fabric
    /// reads them.
    ///
    /// # Errors
    ///
    /// As [`QueuePair::post`].
    ///
    /// # Panics
    ///
    /// If the range runs past the buffer.
    pub fn post_write<Q: QueuePair, const N: usize>(
        &self,
        qp: &Q,
        wr_id: u64,
        signaled: bool,
        at: usize,
        list: &GatherList<'_, N>,
        peer_ring: &RemoteRegion,
    ) -> Result<(), FabricError> {
        let bytes = list.bytes();
        assert!(
            bytes <= self.mem.len() && at <= self.mem.len() - bytes,
            "staging {bytes} bytes at {at} runs past the buffer"
        );
        let mut dst = at;
        for piece in list.pieces() {
            // SAFETY: [dst, dst + len) lies inside the region (the pieces add up to
            // `bytes`, checked above); `piece` is borrowed memory of the list, which
            // never points into this registered buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    self.mem.base.as_ptr().add(dst),
                    piece.len(),
                )
            };
            dst += piece.len();
        }
        let sge = [Sge {
            // SAFETY: `at` is inside the region (checked above).
            addr: unsafe { self.mem.base.as_ptr().add(at) },
            len: bytes as u32,
            lkey: self.mem.region.lkey(),
        }];
        let wr = WorkRequest {
            wr_id,
            opcode: Opcode::Write {
                local: &sge,
                remote_addr: peer_ring.addr + at as u64,
                rkey: peer_ring.rkey,
                inline: false,
            },
            signaled,
        };
        // SAFETY: the entry lies in this registered region. It stays valid until the
        // write completes: the link that owns this buffer declares its queue pair
        // first, so the queue pair is dropped (and reads nothing more) before the
        // region is; and the bytes stay unchanged meanwhile (see above).
        unsafe { qp.post(&wr) }
    }
}

/// Bytes before a [`Doorbell`]'s slots: its summary word, on a cache line of its own.
pub const BELL_SLOTS: u64 = 64;

/// A process's doorbell: one word per peer, which that peer's sender sets (an 8-byte
/// RDMA WRITE of 1) when this process asked it to ([`CtrlWord::BellWanted`]), then
/// the summary word the same way. A process with many quiet connections looks at
/// the summary on each poll instead of at every ring (MPICH nemesis and Open MPI
/// keep one receive queue per process for the same reason; seed 003, figure 6).
///
/// Layout: bytes 0..8, the summary (nonzero: some slot was set since the last
/// [`take`](Self::take)); bytes `BELL_SLOTS + 8 i ..`, peer `i`'s slot.
///
/// ```
/// use rdma_channel::fabric::{emulated::EmuFabric, Access, Fabric};
/// use rdma_channel::ring::memory::Doorbell;
/// let fabric = EmuFabric::new()?;
/// let len = Doorbell::<<EmuFabric as Fabric>::Region>::bytes_for(4);
/// let bell = Doorbell::new(fabric.alloc_region(len, Access::REMOTE_WRITE)?, 4)?;
/// assert!(!bell.rung());
/// let target = Doorbell::<<EmuFabric as Fabric>::Region>::target(bell.remote(), 2).unwrap();
/// assert_eq!(target.slot - target.summary, 64 + 2 * 8);
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Doorbell<R: MemoryRegion> {
    mem: RegionPtr<R>,
    slots: usize,
}

/// Where a sender rings a peer's [`Doorbell`]: its own slot and the summary word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BellTarget {
    /// Address of the sender's slot in the peer's doorbell.
    pub slot: u64,
    /// Address of the doorbell's summary word.
    pub summary: u64,
    /// Remote key of the doorbell.
    pub rkey: u32,
}

impl<R: MemoryRegion> Doorbell<R> {
    /// Bytes of a doorbell for `slots` peers.
    pub const fn bytes_for(slots: usize) -> usize {
        BELL_SLOTS as usize + 8 * slots
    }

    /// Takes over `region` as the doorbell of `slots` peers.
    ///
    /// # Errors
    ///
    /// `InvalidInput` unless the region is 64-byte aligned and holds
    /// [`bytes_for`](Self::bytes_for)`(slots)` bytes.
    pub fn new(region: R, slots: usize) -> io::Result<Doorbell<R>> {
        RegionPtr::new(region, true)
            .filter(|mem| mem.len() >= Self::bytes_for(slots))
            .map(|mem| Doorbell { mem, slots })
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "a doorbell of {slots} slots is {} bytes, 64-byte aligned",
                        Self::bytes_for(slots)
                    ),
                )
            })
    }

    /// Where peers write, for the process's hello card.
    pub fn remote(&self) -> RemoteRegion {
        self.mem.region.remote()
    }

    /// The bytes this doorbell holds registered.
    pub fn registered_bytes(&self) -> usize {
        self.mem.len()
    }

    /// Where the peer in `slot` rings the doorbell published as `remote`; `None`
    /// when the slot lies outside it (a peer's card that does not fit its group).
    pub fn target(remote: RemoteRegion, slot: usize) -> Option<BellTarget> {
        let end = (slot as u64).checked_mul(8)?.checked_add(BELL_SLOTS + 8)?;
        (end <= remote.len && remote.addr % 64 == 0).then(|| BellTarget {
            slot: remote.addr + end - 8,
            summary: remote.addr,
            rkey: remote.rkey,
        })
    }

    #[inline]
    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i <= self.slots);
        let at = if i == 0 {
            0
        } else {
            BELL_SLOTS as usize + 8 * (i - 1)
        };
        // SAFETY: word 0 is the summary and word i > 0 slot i - 1 < slots, so it lies
        // 8-aligned (the region is 64-aligned) inside the region, whose length `new`
        // checked; the region lives as long as `self`; peers' fabrics write these
        // words whole (fabric guarantee 3) and we only access them atomically.
        unsafe { &*self.mem.base.as_ptr().add(at).cast::<AtomicU64>() }
    }

    /// True when some peer rang since the last [`take`](Self::take): one load.
    /// Relaxed: a hint to look; `take` orders what it finds.
    #[inline]
    pub fn rung(&self) -> bool {
        self.word(0).load(Ordering::Relaxed) != 0
    }

    /// Clears the summary, then calls `found` with each slot that is set, clearing
    /// it. A peer that rings during the call is seen by this call or sets the
    /// summary again for the next.
    pub fn take(&self, mut found: impl FnMut(usize)) {
        self.word(0).store(0, Ordering::Relaxed);
        // SeqCst: the clear above must be visible before the slots below are read
        // (a store then loads: only a full fence orders them, even on x86). A peer
        // sets its slot before the summary, so a slot this scan misses was set
        // after the clear, and its summary write comes after that too.
        fence(Ordering::SeqCst);
        for i in 0..self.slots {
            let w = self.word(i + 1);
            if w.load(Ordering::Relaxed) != 0 {
                w.store(0, Ordering::Relaxed);
                found(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Plain-memory tests of the four types (they run under Miri: no syscalls).

    use super::*;
    use crate::fabric::{Access, Caps, Completion, QpState};
    use std::alloc::{alloc_zeroed, dealloc, Layout};
    use std::sync::Mutex;

    /// A "registered" region in ordinary heap memory, 64-byte aligned.
    struct HeapRegion {
        ptr: NonNull<u8>,
        layout: Layout,
        /// Bytes from `ptr` at which the region starts (to test misalignment).
        skew: usize,
        len: usize,
    }

    // SAFETY: the allocation is owned by the value and only reached through it (and
    // through the types under test, which the tests keep within its lifetime).
    unsafe impl Send for HeapRegion {}
    // SAFETY: as above.
    unsafe impl Sync for HeapRegion {}

    impl HeapRegion {
        fn new(len: usize, skew: usize) -> HeapRegion {
            let layout = Layout::from_size_align(len + skew, 64).unwrap();
            // SAFETY: the layout has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
            HeapRegion {
                ptr,
                layout,
                skew,
                len,
            }
        }
    }

    impl Drop for HeapRegion {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
        }
    }

    impl MemoryRegion for HeapRegion {
        fn addr(&self) -> *mut u8 {
            // SAFETY: skew < the allocation's size.
            unsafe { self.ptr.as_ptr().add(self.skew) }
        }
        fn len(&self) -> usize {
            self.len
        }
        fn lkey(&self) -> u32 {
            7
        }
        fn rkey(&self) -> u32 {
            8
        }
        fn access(&self) -> Access {
            Access::LOCAL_WRITE | Access::REMOTE_WRITE
        }
    }

    /// Writes `v` at byte `off` of a region, as the peer's fabric would.
    fn poke(addr: *mut u8, off: usize, v: u64) {
        // SAFETY: callers pass offsets of aligned words inside a live region.
        unsafe { (*addr.add(off).cast::<AtomicU64>()).store(v, Ordering::Release) };
    }

    #[test]
    fn a_doorbell_reports_each_rung_slot_once_and_refuses_a_short_region() {
        type Bell = Doorbell<HeapRegion>;
        assert!(Bell::new(HeapRegion::new(Bell::bytes_for(5) - 8, 0), 5).is_err());
        assert!(Bell::new(HeapRegion::new(Bell::bytes_for(5), 8), 5).is_err());
        let bell = Bell::new(HeapRegion::new(Bell::bytes_for(5), 0), 5).unwrap();
        let remote = bell.remote();
        assert_eq!(Bell::target(remote, 5), None, "slot 5 of 0..5");
        assert_eq!(Bell::target(remote, usize::MAX), None);
        let base = bell.mem.base.as_ptr();
        let ring = |slot: usize| {
            let t = Bell::target(remote, slot).unwrap();
            poke(base, (t.slot - remote.addr) as usize, 1);
            poke(base, (t.summary - remote.addr) as usize, 1);
        };
        assert!(!bell.rung());
        ring(4);
        ring(1);
        assert!(bell.rung());
        let mut found = Vec::new();
        bell.take(|i| found.push(i));
        assert_eq!(found, [1, 4]);
        assert!(!bell.rung());
        bell.take(|i| panic!("slot {i} reported twice"));
        ring(0);
        bell.take(|i| found.push(i));
        assert_eq!(found, [1, 4, 0]);
    }

    #[test]
    fn ring_words_wrap_and_clear() {
        let region = HeapRegion::new(4096, 0);
        let addr = region.addr();
        let ring = RingMemory::new(region).unwrap();
        assert_eq!(ring.size(), 4096);
        poke(addr, 64, 0xabcd);
        // Positions wrap and round down to a word.
        assert_eq!(ring.load_word(64, Ordering::Acquire), 0xabcd);
        assert_eq!(ring.load_word(4096 * 3 + 64 + 5, Ordering::Acquire), 0xabcd);
        ring.clear_word(4096 + 64);
        assert_eq!(ring.load_word(64, Ordering::Acquire), 0);
        // A clone reads the same memory, and keeps it alive alone.
        let clone = ring.clone();
        drop(ring);
        poke(addr, 8, 5);
        assert_eq!(clone.load_word(8, Ordering::Acquire), 5);
    }

    #[test]
    fn clear_boundaries_zeroes_the_boundary_words_of_each_cell_only() {
        let region = HeapRegion::new(4096, 0);
        let addr = region.addr();
        let ring = RingMemory::new(region).unwrap();
        for off in (0..4096).step_by(8) {
            poke(addr, off, 1);
        }
        ring.clear_boundaries(128, 2);
        for off in (0..4096).step_by(8) {
            let boundary =
                (128..256).contains(&off) && (off % 64 == 0 || off % 64 == 8 || off % 64 == 56);
            assert_eq!(
                ring.load_word(off as u64, Ordering::Relaxed),
                u64::from(!boundary)
            );
        }
    }

    #[test]
    #[should_panic(expected = "run past the end")]
    fn clear_boundaries_past_the_end_panics() {
        RingMemory::new(HeapRegion::new(4096, 0))
            .unwrap()
            .clear_boundaries(4096 - 64, 2);
    }

    #[test]
    fn copy_out_reads_the_bytes_at_a_position() {
        let region = HeapRegion::new(4096, 0);
        let addr = region.addr();
        let ring = RingMemory::new(region).unwrap();
        poke(addr, 4096 - 8, u64::from_le_bytes(*b"ABCDEFGH"));
        let mut out = [0u8; 8];
        ring.copy_out(2 * 4096 - 8, &mut out);
        assert_eq!(&out, b"ABCDEFGH");
    }

    #[test]
    fn copy_out_copies_every_short_length_exactly() {
        let region = HeapRegion::new(4096, 0);
        let addr = region.addr();
        let ring = RingMemory::new(region).unwrap();
        for off in (0..64).step_by(8) {
            poke(
                addr,
                off,
                u64::from_le_bytes(std::array::from_fn(|i| (off + i) as u8)),
            );
        }
        for n in 1..=24 {
            for at in [0usize, 3, 8, 13] {
                let mut out = [0xffu8; 26];
                ring.copy_out(at as u64, &mut out[1..1 + n]);
                let want: Vec<u8> = (at..at + n).map(|i| i as u8).collect();
                assert_eq!(&out[1..1 + n], &want[..], "{n} bytes at {at}");
                assert!(out[0] == 0xff && out[1 + n..].iter().all(|&b| b == 0xff));
            }
        }
    }

    #[test]
    #[should_panic(expected = "runs past the end")]
    fn copy_out_past_the_end_panics() {
        let ring = RingMemory::new(HeapRegion::new(4096, 0)).unwrap();
        ring.copy_out(4096 - 8, &mut [0u8; 9]);
    }

    #[test]
    fn lend_shows_the_bytes_at_a_position_in_place() {
        let region = HeapRegion::new(4096, 0);
        let addr = region.addr();
        let ring = RingMemory::new(region).unwrap();
        poke(addr, 64, u64::from_le_bytes(*b"ABCDEFGH"));
        let lent = ring.lend(4096 + 66, 6);
        assert_eq!(lent, b"CDEFGH");
        assert_eq!(
            lent.as_ptr(),
            addr.wrapping_add(66).cast_const(),
            "in place, not a copy"
        );
        assert!(ring.lend(4096 - 8, 8).iter().all(|&b| b == 0));
        assert!(ring.lend(4096, 0).is_empty());
    }

    #[test]
    #[should_panic(expected = "runs past the end")]
    fn lend_past_the_end_panics() {
        let ring = RingMemory::new(HeapRegion::new(4096, 0)).unwrap();
        ring.lend(4096 - 8, 9);
    }

    #[test]
    fn regions_of_the_wrong_shape_are_refused() {
        assert!(RingMemory::new(HeapRegion::new(4000, 0)).is_err());
        assert!(RingMemory::new(HeapRegion::new(4096, 8)).is_err());
        assert!(RingMemory::new(HeapRegion::new(32, 0)).is_err());
        assert!(ControlWords::new(HeapRegion::new(CTRL_SIZE * 2, 0)).is_err());
        assert!(ControlWords::new(HeapRegion::new(CTRL_SIZE, 8)).is_err());
        assert!(StagingBuffer::new(HeapRegion::new(100, 3)).is_ok());
    }

    #[test]
    fn each_control_word_reads_its_own_offset() {
        let region = HeapRegion::new(CTRL_SIZE, 0);
        let addr = region.addr();
        let ctrl = ControlWords::new(region).unwrap();
        assert_eq!(
            (ctrl.tail(), ctrl.receiver_closed(), ctrl.zero_copy_done()),
            (0, false, 0)
        );
        for (i, w) in [
            CtrlWord::Tail,
            CtrlWord::ReceiverClosed,
            CtrlWord::ZeroCopyDone,
            CtrlWord::CreditRequest,
            CtrlWord::EndOfStream,
            CtrlWord::LendLanded,
            CtrlWord::PathAdvice,
        ]
        .into_iter()
        .enumerate()
        {
            poke(addr, w.offset() as usize, 10 + i as u64);
        }
        assert_eq!(ctrl.tail(), 10);
        assert!(ctrl.receiver_closed());
        assert_eq!(ctrl.zero_copy_done(), 12);
        assert_eq!(ctrl.credit_request(), 13);
        assert_eq!(ctrl.end_of_stream(), 14);
        assert_eq!(ctrl.lend_landed(), 15);
        assert_eq!(ctrl.path_advice(), 16);
        let lend = Lend {
            addr: 0xabc0,
            rkey: 77,
            len: 9000,
            offset: 1 << 40,
            transfer: 11,
            number: 6,
        };
        for (i, v) in lend.to_words().into_iter().enumerate() {
            poke(addr, LEND_SLOT as usize + 8 * i, v);
        }
        assert_eq!((ctrl.lend_number(), ctrl.lend()), (6, lend));
    }

    /// What a write named: its first gather entry (address, length, lkey), the
    /// target (address, rkey) and whether it was inline.
    type Posted = (usize, u32, u32, u64, u32, bool);

    /// A queue pair that records the writes it was given.
    #[derive(Default)]
    struct RecordingQp {
        posted: Mutex<Vec<Posted>>,
    }

    impl QueuePair for RecordingQp {
        unsafe fn post(&self, wr: &WorkRequest<'_>) -> Result<(), FabricError> {
            let Opcode::Write {
                local,
                remote_addr,
                rkey,
                inline,
            } = wr.opcode
            else {
                return Err(FabricError::InvalidRequest("not a write"));
            };
            let s = local[0];
            self.posted.lock().unwrap().push((
                s.addr as usize,
                s.len,
                s.lkey,
                remote_addr,
                rkey,
                inline,
            ));
            Ok(())
        }
        fn poll(&self, _out: &mut [Completion]) -> usize {
            0
        }
        fn state(&self) -> QpState {
            QpState::ReadyToSend
        }
        fn caps(&self) -> Caps {
            Caps {
                max_inline: 0,
                max_sge: 4,
                max_send_wr: usize::MAX,
                max_rd_atomic: 1,
            }
        }
    }

    #[test]
    fn staging_copies_the_pieces_to_the_packets_offset_and_writes_them_from_there() {
        let region = HeapRegion::new(4096, 0);
        let base = region.addr();
        let addr = base as usize;
        let staging = StagingBuffer::new(region).unwrap();
        let qp = RecordingQp::default();
        let (head, body) = (*b"header..", [9u8; 100]);
        let mut list = GatherList::<4>::new();
        list.push(&head);
        list.push(&body);
        let peer = RemoteRegion {
            addr: 0x10_0000,
            len: 4096,
            rkey: 3,
        };
        staging
            .post_write(&qp, 1, false, 256, &list, &peer)
            .unwrap();
        let posted = qp.posted.lock().unwrap();
        assert_eq!(posted[..], [(addr + 256, 108, 7, 0x10_0100, 3, false)]);
        let mut copied = [0u8; 108];
        // SAFETY: the staging region is alive (owned by `staging`) and 256 + 108
        // bytes long at least; nothing writes it meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(base.add(256), copied.as_mut_ptr(), 108) };
        assert_eq!(&copied[..8], b"header..");
        assert!(copied[8..].iter().all(|&b| b == 9));
    }

    #[test]
    #[should_panic(expected = "runs past the buffer")]
    fn staging_past_the_end_panics() {
        let staging = StagingBuffer::new(HeapRegion::new(128, 0)).unwrap();
        let body = [0u8; 100];
        let mut list = GatherList::<1>::new();
        list.push(&body);
        let peer = RemoteRegion {
            addr: 0,
            len: 128,
            rkey: 0,
        };
        let _ = staging.post_write(&RecordingQp::default(), 0, false, 64, &list, &peer);
    }
}
