//! The types and declarations bindgen generated from `ffi/rch.h` (see `build.rs`),
//! and compile-time checks that every struct crossing the boundary has the layout the
//! Rust side relies on.
//!
//! The header documents every item; this module only re-exports what bindgen made of
//! it, so it carries no documentation of its own.

#![allow(
    missing_docs,
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::all
)]

include!(concat!(env!("OUT_DIR"), "/rch_sys.rs"));

use std::io::{IoSlice, IoSliceMut};
use std::mem::{align_of, size_of};

use memoffset::offset_of;
use static_assertions::{assert_eq_align, assert_eq_size, const_assert, const_assert_eq};

// `struct iovec` as the header sees it (through <sys/uio.h>) is the kernel's, libc's,
// and std's IoSlice / IoSliceMut (which std guarantees to be ABI compatible with
// iovec on Unix): the exports reinterpret a C iovec array as a slice of IoSlice.
assert_eq_size!(iovec, libc::iovec);
assert_eq_align!(iovec, libc::iovec);
const_assert_eq!(
    offset_of!(iovec, iov_base),
    offset_of!(libc::iovec, iov_base)
);
const_assert_eq!(offset_of!(iovec, iov_len), offset_of!(libc::iovec, iov_len));
assert_eq_size!(iovec, IoSlice<'static>);
assert_eq_align!(iovec, IoSlice<'static>);
assert_eq_size!(iovec, IoSliceMut<'static>);
assert_eq_align!(iovec, IoSliceMut<'static>);
const_assert_eq!(offset_of!(iovec, iov_base), 0);
const_assert_eq!(offset_of!(iovec, iov_len), size_of::<usize>());

// rch_exchange: a context pointer and three function pointers, in that order, with
// no padding (what a C compiler lays out for the header's declaration on LP64).
const_assert_eq!(size_of::<rch_exchange>(), 4 * size_of::<usize>());
const_assert_eq!(align_of::<rch_exchange>(), align_of::<usize>());
const_assert_eq!(offset_of!(rch_exchange, ctx), 0);
const_assert_eq!(offset_of!(rch_exchange, publish), size_of::<usize>());
const_assert_eq!(offset_of!(rch_exchange, lookup), 2 * size_of::<usize>());
const_assert_eq!(offset_of!(rch_exchange, fence), 3 * size_of::<usize>());
// The callbacks are nullable function pointers: Option<fn> is one pointer wide.
assert_eq_size!(
    Option<unsafe extern "C" fn(*mut std::os::raw::c_void) -> std::os::raw::c_int>,
    usize
);

// rch_stats: two ints, then a size_t (aligned after them on LP64).
const_assert_eq!(offset_of!(rch_stats, connections), 0);
const_assert_eq!(
    offset_of!(rch_stats, pending),
    size_of::<std::os::raw::c_int>()
);
const_assert_eq!(offset_of!(rch_stats, registered_bytes), 8);
const_assert_eq!(size_of::<rch_stats>(), 16);
const_assert_eq!(align_of::<rch_stats>(), align_of::<usize>());

// rch_watch_stats: three ints, padding, then three unsigned long longs.
const_assert_eq!(offset_of!(rch_watch_stats, busy), 0);
const_assert_eq!(offset_of!(rch_watch_stats, quiet), 4);
const_assert_eq!(offset_of!(rch_watch_stats, quiet_belled), 8);
const_assert_eq!(offset_of!(rch_watch_stats, rings), 16);
const_assert_eq!(offset_of!(rch_watch_stats, found_by_bell), 24);
const_assert_eq!(offset_of!(rch_watch_stats, found_in_turn), 32);
const_assert_eq!(size_of::<rch_watch_stats>(), 40);

// rch_rail_stats: two ints, then RCH_MAX_RAILS unsigned long longs, one a rail.
const_assert_eq!(RCH_MAX_RAILS as usize, crate::config::MAX_RAILS);
const_assert_eq!(offset_of!(rch_rail_stats, connections), 0);
const_assert_eq!(offset_of!(rch_rail_stats, rails), 4);
const_assert_eq!(offset_of!(rch_rail_stats, read_bytes), 8);
const_assert_eq!(size_of::<rch_rail_stats>(), 8 + 8 * RCH_MAX_RAILS as usize);

// rch_watch: RCH_WATCH_WORDS pointers, as many unsigned 64-bit values, two ints.
const W: usize = RCH_WATCH_WORDS as usize;
const_assert_eq!(offset_of!(rch_watch, word), 0);
const_assert_eq!(offset_of!(rch_watch, value), W * size_of::<usize>());
const_assert_eq!(offset_of!(rch_watch, count), W * (size_of::<usize>() + 8));
const_assert_eq!(
    offset_of!(rch_watch, tests_left),
    W * (size_of::<usize>() + 8) + 4
);
const_assert_eq!(size_of::<rch_watch>(), W * (size_of::<usize>() + 8) + 8);
// A quiet receiver's words all fit.
const_assert!(crate::engine::QUIET_WATCH_WORDS <= W);

// rch_lane: an rch_watch, a pointer, two unsigned 64-bit values, two ints.
const_assert_eq!(offset_of!(rch_lane, watch), 0);
const_assert_eq!(offset_of!(rch_lane, cell), size_of::<rch_watch>());
const_assert_eq!(
    offset_of!(rch_lane, pos),
    size_of::<rch_watch>() + size_of::<usize>()
);
const_assert_eq!(
    offset_of!(rch_lane, lent),
    size_of::<rch_watch>() + size_of::<usize>() + 16
);
// The packet format rch_lane_packet reads is the ring's (ring::wire).
const_assert_eq!(RCH_LANE_CELL as usize, crate::ring::wire::CELL);
const_assert_eq!(RCH_LANE_OVERHEAD as usize, crate::ring::wire::OVERHEAD);
const_assert_eq!(
    (RCH_LANE_FULL_TAG as u64) << 60,
    crate::ring::wire::header_match(0)
);
const_assert_eq!(
    (RCH_LANE_SHORT_TAG as u64) << 60,
    crate::ring::wire::ShortHeader::new(0, 0, 0).word()
);
const_assert_eq!(RCH_LANE_TRAILER_KEY as u64, crate::ring::wire::TRAILER_KEY);
const_assert_eq!(
    RCH_LANE_STAMP_MASK as u64 | (0xf << 60),
    crate::ring::wire::HEADER_MATCH_MASK
);

// rch_send_lane is the engine's SendLane (engine/lane.rs), field by field.
assert_eq_size!(rch_send_lane, crate::engine::lane::SendLane);
const_assert_eq!(
    offset_of!(rch_send_lane, ring),
    offset_of!(crate::engine::lane::SendLane, ring)
);
const_assert_eq!(
    offset_of!(rch_send_lane, mask),
    offset_of!(crate::engine::lane::SendLane, mask)
);
const_assert_eq!(
    offset_of!(rch_send_lane, head),
    offset_of!(crate::engine::lane::SendLane, head)
);
const_assert_eq!(
    offset_of!(rch_send_lane, end),
    offset_of!(crate::engine::lane::SendLane, end)
);
const_assert_eq!(
    offset_of!(rch_send_lane, max_payload),
    offset_of!(crate::engine::lane::SendLane, max_payload)
);
const_assert_eq!(
    offset_of!(rch_send_lane, ack),
    offset_of!(crate::engine::lane::SendLane, ack)
);
const_assert_eq!(
    offset_of!(rch_send_lane, acked),
    offset_of!(crate::engine::lane::SendLane, acked)
);
const_assert_eq!(
    offset_of!(rch_send_lane, bell),
    offset_of!(crate::engine::lane::SendLane, bell)
);
const_assert_eq!(
    offset_of!(rch_send_lane, bell_seen),
    offset_of!(crate::engine::lane::SendLane, bell_seen)
);
const_assert_eq!(
    offset_of!(rch_send_lane, changes),
    offset_of!(crate::engine::lane::SendLane, changes)
);
const_assert_eq!(
    offset_of!(rch_send_lane, changes_seen),
    offset_of!(crate::engine::lane::SendLane, changes_seen)
);
const_assert_eq!(
    offset_of!(rch_send_lane, vc),
    offset_of!(crate::engine::lane::SendLane, vc)
);
// The packet rch_lane_send writes: a data packet's kind (bits 56-59 of the header).
const_assert_eq!(
    crate::ring::wire::header_word(0, crate::ring::wire::PacketKind::Data, 0),
    ((RCH_LANE_FULL_TAG as u64) << 60) | (1 << 56)
);

// Status codes are C ints on the wire (the functions return `int`).
const_assert_eq!(rch_status::RCH_SUCCESS, 0);
assert_eq_size!(rch_status::Type, std::os::raw::c_int);

// The header's limits are what the Rust side enforces.
const_assert_eq!(RCH_IOV_MAX as usize, super::IOV_MAX);
const_assert_eq!(RCH_CARD_MAX as usize, crate::group::hello::CARD_MAX);
