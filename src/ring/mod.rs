//! The ring: packet format and placement rules, as pure logic with no I/O.
//!
//! One ring exists per connection and direction. It lives in the receiver's memory
//! and the sender writes into it with RDMA WRITE (seed 001 sec. 4.2: Liu et al.,
//! *Design and Implementation of MPICH2 over InfiniBand with RDMA Support*, IPDPS 2004).
//! Positions are
//! absolute byte counts (`u64`, never wrapping in practice); the physical offset is
//! `pos % ring_size`.
//!
//! Pointers are replicated, as in seed 001 sec. 4.2: the sender owns the master *head*
//! and keeps a cached copy of the receiver's *tail*, which may lag behind the real one
//! (that only makes the sender see less free space than there is); the receiver owns
//! the master tail and learns the head from the packets themselves (the header stamp
//! is the piggybacked head update of sec. 4.3).
//!
//! Placement rules (checked by the tests below and relied on by the engine):
//! * every packet starts on a cell boundary and covers whole cells;
//! * a packet never crosses the physical end of the ring (a long message is simply
//!   cut there and continues in the next packet);
//! * before the receiver announces a tail that frees a packet's cells, it zeroes the
//!   three *boundary words* of each of them: the first word of the cell (where a
//!   header may stand next lap), the second (where a short packet's header may
//!   stand) and the last (where a full packet's trailer may stand); see
//!   [`boundary_offsets`].
//!
//! So whenever the sender may write a region, each boundary word in it holds zero or
//! something the sender wrote since that clearing. The word at the receiver's read
//! position is then zero or the real header, and the trailer word at the end the
//! header names is zero or the real trailer: stale bytes from an earlier lap, and
//! payload bytes equal to flag values (which never sit at the read position or at
//! their own packet's trailer), cannot fool it. Zero is neither a valid header (its
//! tag is non-zero) nor a valid trailer.
//!
//! Clearing costs the receiver three stores per 64 bytes into lines it has just read;
//! an earlier design had the sender inspect those words in the payload instead, which
//! took 27% of the sender's time, and the sender is the bottleneck side.

pub mod memory;
pub mod wire;

use wire::{CELL, HEADER_LEN, OVERHEAD};

/// Free bytes in a ring of `size` bytes, from the sender's view.
///
/// ```
/// assert_eq!(rdma_channel::ring::free_space(4096, 640, 128), 4096 - 512);
/// ```
pub const fn free_space(size: u64, head: u64, tail: u64) -> u64 {
    size - (head - tail)
}

/// The longest packet payload the sender may write now.
///
/// `head` and `tail` are the sender's positions, `size` the ring size (a power of
/// two: positions are reduced with a mask, not a division), `chunk` the
/// largest packet in bytes (cells included). Returns 0 when not even one cell is free.
///
/// ```
/// use rdma_channel::ring::max_payload_now;
/// // An empty 4 KiB ring with 1 KiB chunks: one chunk minus the 24-byte overhead.
/// assert_eq!(max_payload_now(4096, 0, 0, 1024), 1000);
/// // Three cells before the physical end: the packet stops there.
/// assert_eq!(max_payload_now(4096, 4096 - 192, 0 + 192, 1024), 192 - 24);
/// // Full ring.
/// assert_eq!(max_payload_now(4096, 4096, 0, 1024), 0);
/// ```
pub fn max_payload_now(size: u64, head: u64, tail: u64, chunk: u64) -> usize {
    let free = free_space(size, head, tail);
    debug_assert!(size.is_power_of_two());
    let to_end = size - (head & (size - 1));
    let room = free.min(to_end).min(chunk);
    let cells = room / CELL as u64;
    if cells == 0 {
        0
    } else {
        (cells as usize * CELL) - OVERHEAD
    }
}

/// True when the sender should end the lap early with a one-cell
/// [`Wrap`](wire::PacketKind::Wrap) packet and write its next packet, of `next`
/// bytes (cells included), at the ring's offset 0.
///
/// It does so once its offset is at or past `working_set` (the lap's end,
/// [`lap_end`]) and what the receiver has
/// not yet consumed (`head - tail`, as far as the sender knows) leaves room for it:
/// the skipped rest of the lap counts as in flight until the receiver passes it, so
/// the offset must exceed the bytes in flight plus the next packet and the wrap
/// cell. Then the packet at offset 0 always finds room and the wrap cell fits at
/// the head. With `working_set` at the ring size it never wraps (the offset never
/// reaches it).
///
/// Why: a ring larger than the caches cycles every byte through memory, while
/// traffic kept in its first bytes hits the lines both cores touched last time.
///
/// ```
/// use rdma_channel::ring::wrap_early;
/// // 256 KiB ring, 64 KiB working set, receiver caught up at offset 64 KiB: wrap.
/// assert!(wrap_early(1 << 18, 1 << 16, 1 << 16, 64, 1 << 16));
/// // Before the working set's end: no.
/// assert!(!wrap_early(1 << 18, (1 << 16) - 64, (1 << 16) - 64, 64, 1 << 16));
/// // 48 KiB still unread: the 64 KiB offset cannot cover it plus a 16 KiB packet.
/// assert!(!wrap_early(1 << 18, 1 << 16, 1 << 14, 16 << 10, 1 << 16));
/// ```
pub fn wrap_early(size: u64, head: u64, tail: u64, next: u64, working_set: u64) -> bool {
    debug_assert!(size.is_power_of_two() && tail <= head);
    let offset = head & (size - 1);
    offset >= working_set && offset >= (head - tail) + next + CELL as u64
}

/// The shortest lap: a sender ends a lap early ([`wrap_early`]) no sooner than this
/// many bytes into it.
pub const SHORT_LAP: u64 = 8 << 10;

/// A lap held at least this many packets of the size being sent. Laps no longer
/// scale with the packet: under [`LONG_LAP_PACKET`] two packets never reach
/// [`SHORT_LAP`], and from it the lap is the working set.
#[deprecated(
    since = "0.1.0",
    note = "laps no longer scale with the packet; see `lap_end`"
)]
pub const LAP_PACKETS: u64 = 2;

/// Packets of this many ring bytes or more (a 4 KiB message's and up) get laps of the
/// whole working set.
pub const LONG_LAP_PACKET: u64 = 4 << 10;

/// The ring offset past which a sender about to write a packet of `packet` bytes
/// (cells included) ends the lap early when it can ([`wrap_early`]), on a fabric
/// that shares caches ([`Fabric::shares_caches`](crate::fabric::Fabric::shares_caches);
/// on others the lap is the working set): [`SHORT_LAP`] for packets under
/// [`LONG_LAP_PACKET`], `working_set` for larger ones, and at most `working_set`. A
/// working set of the whole ring turns early wraps off.
///
/// Why short laps for small packets: a ping-pong of 512 B to 2 KiB messages kept in a
/// few packets' room reuses lines both cores touched a moment ago, and on the
/// machine this was measured on its latency dropped 12-23% against the same traffic
/// spread over 256 KiB (bench/notebook/2026-11.md, "Laps that fit the messages").
/// Streams of small messages gain too (a window of them lands in the same 8 KiB).
/// Laps much shorter cost more in wrap packets than they save.
///
/// Why not for 4 KiB packets and more: on a host whose cores hand lines over slowly
/// (probe 65-95 ns), a writer that finds its lines in the reader's cache waits for
/// each, and a window of messages waits for the wrap. There MPI `osu_bw` 4 KiB went
/// from 5.1-6.0 GB/s with two-packet laps to 7.3-9.2 with laps of the working set,
/// 8 KiB from 6.2-7.1 to 8.4-10.2, `osu_latency` 8 KiB from 2.41-2.62 us to
/// 2.06-2.24 and 16 KiB from 4.02-4.24 to 3.39-3.64; 4 KiB latency stayed level
/// (bench/notebook/2026-12.md, "... long laps from 4 KiB packets"). The machine of the
/// short laps measured 4 KiB latency 0.68x with them, and 16 KiB bandwidth 0.81x.
///
/// ```
/// use rdma_channel::ring::lap_end;
/// let ring = 4 << 20;
/// assert_eq!(lap_end(ring, 256 << 10, 64), 8 << 10); // small packets: the shortest lap
/// assert_eq!(lap_end(ring, 256 << 10, 3072), 8 << 10); // 3 KiB packets: still the shortest
/// assert_eq!(lap_end(ring, 256 << 10, 4160), 256 << 10); // 4 KiB packets: the working set
/// assert_eq!(lap_end(ring, 64 << 10, 65600), 64 << 10); // at most the working set
/// assert_eq!(lap_end(ring, ring, 64), ring); // working set off: never early
/// ```
#[inline]
pub fn lap_end(ring_size: u64, working_set: u64, packet: u64) -> u64 {
    if working_set >= ring_size || packet >= LONG_LAP_PACKET {
        working_set.min(ring_size)
    } else {
        SHORT_LAP.min(working_set)
    }
}

/// Where a [`Wrap`](wire::PacketKind::Wrap) packet at `pos` sends the reader and
/// writer: the start of the next lap.
///
/// ```
/// use rdma_channel::ring::after_wrap;
/// assert_eq!(after_wrap(4096, 4096 + 640), 8192);
/// assert_eq!(after_wrap(4096, 4096 - 64), 4096);
/// ```
pub const fn after_wrap(size: u64, pos: u64) -> u64 {
    (pos + CELL as u64).next_multiple_of(size)
}

/// Ring offsets of the boundary words of `cells` cells starting at ring offset
/// `start` (a multiple of 64): the first (a header), the second (a short packet's
/// header) and the last 8-byte word (a trailer) of each cell. The receiver zeroes them before it frees the
/// cells (see the module docs).
///
/// ```
/// let words: Vec<usize> = rdma_channel::ring::boundary_offsets(128, 2).collect();
/// assert_eq!(words, [128, 136, 184, 192, 200, 248]);
/// ```
pub fn boundary_offsets(start: usize, cells: usize) -> impl Iterator<Item = usize> {
    debug_assert_eq!(start % CELL, 0);
    (0..cells).flat_map(move |c| {
        let cell = start + c * CELL;
        [cell, cell + wire::SHORT_HEADER_OFFSET, cell + CELL - 8]
    })
}

/// Cells of a packet with `len` payload bytes starting at absolute position `pos`
/// of a ring of `size` bytes (a power of two), or `None` when the packet would run
/// past the ring's physical end: no correct sender writes that
/// ([`max_payload_now`]), so the receiver takes such a header as a protocol error
/// before it reads the trailer word the header points at.
///
/// ```
/// use rdma_channel::ring::packet_cells;
/// assert_eq!(packet_cells(4096, 4096 + 4096 - 128, 100), Some(2));
/// assert_eq!(packet_cells(4096, 4096 - 64, 100), None);
/// ```
pub fn packet_cells(size: u64, pos: u64, len: usize) -> Option<usize> {
    let cells = wire::cells_for(len);
    ((pos & (size - 1)) + (cells * CELL) as u64 <= size).then_some(cells)
}

/// True when `tail`, announced by the peer (its control word or a piggybacked
/// ack), can be the tail of a correct receiver of a sender at `head`: a cell
/// boundary the sender has reached. A tail beyond the head would let the sender
/// overwrite packets the peer has not read, so it is a protocol error.
///
/// ```
/// use rdma_channel::ring::tail_ok;
/// assert!(tail_ok(640, 640) && tail_ok(0, 640));
/// assert!(!tail_ok(704, 640) && !tail_ok(100, 640));
/// ```
pub const fn tail_ok(tail: u64, head: u64) -> bool {
    tail <= head && tail % CELL as u64 == 0
}

/// Payload offset inside a packet starting at a cell boundary.
pub const PAYLOAD_OFFSET: usize = HEADER_LEN;

#[cfg(all(test, loom))]
mod loom_model;

#[cfg(test)]
mod tests {
    use super::*;
    use wire::cells_for;

    #[test]
    fn boundary_words_are_where_headers_and_trailers_go() {
        // A full packet's header sits on a cell's first word and its trailer on a
        // cell's last word; a short packet's header (its last word) on the second.
        // Clearing those words of every consumed cell covers all of them.
        for payload in [0usize, 1, 8, 9, 40, 41, 100, 1000, 4000] {
            let cells = cells_for(payload);
            let words: Vec<usize> = boundary_offsets(0, cells).collect();
            assert!(words.contains(&0), "header of a {payload}-byte packet");
            assert!(
                words.contains(&wire::trailer_offset(payload)),
                "trailer of a {payload}-byte packet"
            );
            if wire::fits_short(payload) {
                assert!(words.contains(&wire::SHORT_HEADER_OFFSET));
                assert_eq!(cells, 1);
                assert_eq!(wire::SHORT_HEADER_OFFSET + 8, wire::SHORT_WRITE);
            }
            assert_eq!(words.len(), 3 * cells);
        }
    }

    #[test]
    fn an_early_wrap_always_leaves_room_at_offset_zero() {
        // Every state where wrap_early says yes: the wrap cell fits at the head, and
        // the next packet fits at the next lap's start without passing the tail.
        let size = 4096u64;
        for tail in (0..2 * size).step_by(CELL) {
            for head in (tail..=tail + size).step_by(CELL) {
                for next in [64u64, 128, 1024, 2048] {
                    for ws in [64u64, 1024, 2048, 4096] {
                        if !wrap_early(size, head, tail, next, ws) {
                            continue;
                        }
                        assert!(free_space(size, head, tail) >= CELL as u64);
                        let lap = after_wrap(size, head);
                        assert_eq!(lap & (size - 1), 0);
                        assert!(lap + next - tail <= size, "{head} {tail} {next} {ws}");
                        assert!(head & (size - 1) >= ws);
                    }
                }
            }
        }
        assert!(
            !wrap_early(size, 4032, 4032, 64, size),
            "off at the ring size"
        );
    }

    #[test]
    fn packets_never_cross_the_physical_end() {
        let size = 4096u64;
        for head in (0..3 * size).step_by(CELL) {
            let p = max_payload_now(size, head, head.saturating_sub(1024), 1 << 20);
            if p > 0 {
                let end = (head & (size - 1)) + (cells_for(p) * CELL) as u64;
                assert!(end <= size, "head {head} payload {p}");
            }
        }
    }

    #[test]
    fn room_is_bounded_by_free_space_end_and_chunk() {
        assert_eq!(max_payload_now(4096, 0, 0, 4096), 4096 - OVERHEAD);
        assert_eq!(max_payload_now(4096, 64, 0, 4096), 4096 - 64 - OVERHEAD);
        assert_eq!(
            max_payload_now(4096, 4096 + 64, 4096, 1024),
            1024 - OVERHEAD
        );
        assert_eq!(
            max_payload_now(4096, 4096 + 4032, 4096 + 4032, 1024),
            64 - OVERHEAD
        );
    }
}
