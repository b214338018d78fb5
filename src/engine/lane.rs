//! The send lane: where a C caller writes a packet (up to 16 KiB of ring) into the
//! peer's ring itself, without a call into the library (`rch_lane_send` in
//! `ffi/rch.h`), on a fabric that maps the peer's ring into this process (the
//! emulated one; [`DirectTarget`]).
//!
//! The lane is the sender's own state, not a copy of it: the [`Sender`](super::Sender)
//! keeps its head (the next packet's position) and the doorbell count it answered in
//! the lane, so that a packet the caller wrote is the sender's packet, whichever code
//! looks next. After each library call that may change what the caller may write,
//! the sender publishes the rest ([`SendLane::end`] and the pointers): room up to the
//! tail it knows and the end of its lap, nothing while a transfer is pending, the
//! connection closes, the peer offered another ring or the fabric cannot be reached
//! directly. The caller writes only between the library's calls on the connection,
//! from one thread: the header's contract, and why the lane needs no atomics of its
//! own.

use std::cell::UnsafeCell;
use std::ptr;
use std::sync::atomic::AtomicU64;

use crate::fabric::DirectTarget;

/// The lane as the C header lays it out (`rch_send_lane`; `ffi/sys.rs` asserts that
/// the two agree). Positions are absolute stream positions, as the ring's.
#[repr(C)]
#[derive(Debug)]
pub struct SendLane {
    /// The peer's ring as mapped in this process; null: the caller must call the
    /// library.
    pub ring: *mut u64,
    /// Ring bytes - 1.
    pub mask: u64,
    /// Where the next packet starts (the sender's head).
    pub head: u64,
    /// Packets written through the lane end at or before this position.
    pub end: u64,
    /// Largest payload of one lane packet.
    pub max_payload: u64,
    /// This end's receive tail, piggybacked on each packet (`Link::rx_tail`).
    pub ack: *const AtomicU64,
    /// The highest tail piggybacked so far (`Link::rx_piggy`).
    pub acked: *const AtomicU64,
    /// The peer's count of requests to ring its doorbell (its `BellWanted` word), or a
    /// word that stays 0 while the peer has no doorbell.
    pub bell: *const AtomicU64,
    /// The last such request answered.
    pub bell_seen: u64,
    /// The peer's count of registration changes ([`DirectTarget::changes`](crate::fabric::DirectTarget::changes)).
    pub changes: *const AtomicU64,
    /// Its value when `ring` was found: while it holds, `ring` is still the peer's.
    pub changes_seen: u64,
    /// The connection's handle in the C interface, for the call that rings the bell.
    pub vc: *mut std::ffi::c_void,
}

/// A word that stays 0: the bell of a peer without a doorbell.
static NO_BELL: AtomicU64 = AtomicU64::new(0);

/// The lane's storage, shared by the sender and the C interface's handle table (so
/// that a pointer handed to C stays valid after the sender is gone; it is closed
/// then).
#[derive(Debug)]
pub(crate) struct LaneCell(UnsafeCell<SendLane>);

// SAFETY: the lane is read and written by the thread that holds the connection's
// sender (the library's lock in the C interface), and by the C caller only between
// library calls on the connection, from one thread (rch.h's contract for
// rch_lane_send). The pointers in it are to words that are themselves atomic.
unsafe impl Send for LaneCell {}
// SAFETY: as for Send; shared references only hand out copies and stores made under
// the same exclusion.
unsafe impl Sync for LaneCell {}

impl LaneCell {
    pub(crate) fn new() -> LaneCell {
        LaneCell(UnsafeCell::new(SendLane {
            ring: ptr::null_mut(),
            mask: 0,
            head: 0,
            end: 0,
            max_payload: 0,
            ack: ptr::null(),
            acked: ptr::null(),
            bell: &NO_BELL,
            bell_seen: 0,
            changes: ptr::null(),
            changes_seen: 0,
            vc: ptr::null_mut(),
        }))
    }

    /// The lane as C sees it.
    pub(crate) fn as_ptr(&self) -> *mut SendLane {
        self.0.get()
    }

    /// The sender's head.
    #[inline(always)]
    pub(crate) fn head(&self) -> u64 {
        // SAFETY: see `Send`: no lane write runs during a library call.
        unsafe { (*self.0.get()).head }
    }

    #[inline(always)]
    pub(crate) fn set_head(&self, head: u64) {
        // SAFETY: as in `head`.
        unsafe { (*self.0.get()).head = head }
    }

    /// The doorbell request last answered.
    #[inline(always)]
    pub(crate) fn bell_seen(&self) -> u64 {
        // SAFETY: as in `head`.
        unsafe { (*self.0.get()).bell_seen }
    }

    pub(crate) fn set_bell_seen(&self, n: u64) {
        // SAFETY: as in `head`.
        unsafe { (*self.0.get()).bell_seen = n }
    }

    /// Shuts the lane: the caller's next packet goes through the library.
    #[inline(always)]
    pub(crate) fn close(&self) {
        // SAFETY: as in `head`.
        unsafe {
            let l = &mut *self.0.get();
            l.ring = ptr::null_mut();
            l.end = l.head;
        }
    }

    /// Opens the lane onto `target` (a ring of `mask + 1` bytes) up to `end`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open(
        &self,
        target: DirectTarget,
        mask: u64,
        end: u64,
        max_payload: u64,
        ack: &AtomicU64,
        acked: &AtomicU64,
        bell: Option<&AtomicU64>,
    ) {
        // SAFETY: as in `head`.
        unsafe {
            let l = &mut *self.0.get();
            l.ring = target.base.cast::<u64>();
            l.mask = mask;
            l.end = end;
            l.max_payload = max_payload;
            l.ack = ack;
            l.acked = acked;
            l.bell = bell.unwrap_or(&NO_BELL);
            l.changes = target.changes;
            l.changes_seen = target.seen;
        }
    }

    /// Records the C handle that `rch_lane_send` passes to the library.
    pub(crate) fn set_vc(&self, vc: *mut std::ffi::c_void) {
        // SAFETY: as in `head`.
        unsafe { (*self.0.get()).vc = vc }
    }
}
