//! The ring: packet format and placement rules, as pure logic with no I/O.
//!
//! One ring exists per connection and direction. It lives in the receiver's memory
//! and the sender writes into it with RDMA WRITE (seed 001 sec. 4.2). Positions are
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
//! * every packet starts on a cell boundary and covers whole cells, all of whose bytes
//!   it writes (padding included), so every cell boundary word is rewritten each lap;
//! * a packet never crosses the physical end of the ring (a long message is simply
//!   cut there and continues in the next packet);
//! * a packet never holds, at a word where a future header or trailer could stand, a
//!   payload word equal to what that future header or trailer will be
//!   ([`first_conflict`] cuts the packet just before such a word).
//!
//! Together these mean the receiver only ever accepts a header and trailer written in
//! the current lap: stale bytes and payload bytes equal to flag values cannot fool it.

pub mod wire;

use std::io::IoSlice;

use wire::{header_match, trailer_word, CELL, HEADER_LEN, HEADER_MATCH_MASK, OVERHEAD};

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

/// Reads the 8 bytes at offset `off` of the concatenation of `slices`, joining slices
/// where the word straddles them. `idx`/`base` is a cursor (slice index and the offset
/// of its first byte) that only moves forward; the updated cursor is returned.
fn word_at(
    slices: &[IoSlice<'_>],
    mut idx: usize,
    mut base: usize,
    off: usize,
) -> (u64, usize, usize) {
    // Advance to the slice holding byte `off` (`base` = payload offset of slices[idx][0]).
    while off >= base + slices[idx].len() {
        base += slices[idx].len();
        idx += 1;
    }
    let s = &slices[idx];
    let start = off - base;
    if start + 8 <= s.len() {
        let w = u64::from_le_bytes(s[start..start + 8].try_into().unwrap());
        return (w, idx, base);
    }
    let mut bytes = [0u8; 8];
    let (mut i, mut at) = (idx, start);
    for byte in bytes.iter_mut() {
        while at >= slices[i].len() {
            at -= slices[i].len();
            i += 1;
        }
        *byte = slices[i][at];
        at += 1;
    }
    (u64::from_le_bytes(bytes), idx, base)
}

/// Finds the first payload word that would impersonate a future header or trailer.
///
/// The packet starts at `head` in a ring of `size` bytes; its payload is the first
/// `len` bytes of `slices` after skipping `skip` bytes. Returns the payload length to
/// cut the packet to (it then ends on the cell boundary just before the offending
/// word), or `len` when no word offends. The result is never below
/// [`wire::ONE_CELL_PAYLOAD`] when `len` is at least that, so every packet progresses.
///
/// ```
/// use std::io::IoSlice;
/// use rdma_channel::ring::{first_conflict, wire::{header_match, trailer_word}};
/// let size = 4096u64;
/// // Payload that holds, at the first cell boundary (payload offset 48), the header the
/// // next lap would write there.
/// let mut data = vec![0u8; 200];
/// data[48..56].copy_from_slice(&header_match(64 + size).to_le_bytes());
/// assert_eq!(first_conflict(&[IoSlice::new(&data)], 0, 200, 0, size), 40);
/// // The same bytes are harmless elsewhere.
/// assert_eq!(first_conflict(&[IoSlice::new(&data)], 0, 200, 128, size), 200);
/// // A trailer value at the word before a cell boundary (payload offset 40).
/// let mut data = vec![0u8; 200];
/// data[40..48].copy_from_slice(&trailer_word(64 + size).to_le_bytes());
/// assert_eq!(first_conflict(&[IoSlice::new(&data)], 0, 200, 0, size), 40);
/// ```
#[inline]
pub fn first_conflict(
    slices: &[IoSlice<'_>],
    skip: usize,
    len: usize,
    head: u64,
    size: u64,
) -> usize {
    // A one-cell packet has no inner boundary to inspect: the common small message.
    if len < CELL - OVERHEAD + 8 {
        return len;
    }
    scan_boundaries(slices, skip, len, head, size)
}

fn scan_boundaries(slices: &[IoSlice<'_>], skip: usize, len: usize, head: u64, size: u64) -> usize {
    // Payload offset 0 is byte `skip` of the concatenated slices. For each cell boundary
    // k >= 1 of the packet, two payload words matter: at offset 64k - 24 (just before
    // the boundary: a trailer could stand there) and at 64k - 16 (on the boundary: a
    // header could stand there). Both are compared with what the next lap writes there.
    let (mut idx, mut base) = (0usize, 0usize);
    let mut k = 1usize;
    loop {
        let before = k * CELL - OVERHEAD;
        if before + 8 > len {
            return len;
        }
        let abs = skip + before;
        while abs >= base + slices[idx].len() {
            base += slices[idx].len();
            idx += 1;
        }
        let s: &[u8] = &slices[idx];
        let start = abs - base;
        // Fast path: as many boundaries as have both words inside this slice and inside
        // the payload, read straight from the slice.
        let in_slice = if start + 16 <= s.len() {
            (s.len() - start - 16) / CELL + 1
        } else {
            0
        };
        let in_payload = if before + 16 <= len {
            (len - before - 16) / CELL + 1
        } else {
            0
        };
        let run = in_slice.min(in_payload);
        if run > 0 {
            let mut boundary = head + (k * CELL) as u64 + size;
            for (i, pair) in s[start..].chunks(CELL).take(run).enumerate() {
                let w0 = u64::from_le_bytes(pair[0..8].try_into().unwrap());
                let w1 = u64::from_le_bytes(pair[8..16].try_into().unwrap());
                if w0 == trailer_word(boundary) || w1 & HEADER_MATCH_MASK == header_match(boundary)
                {
                    return (k + i) * CELL - OVERHEAD;
                }
                boundary += CELL as u64;
            }
            k += run;
            continue;
        }
        // Slow path: a word straddles slices, or only the first word is in the payload.
        let boundary = head + (k * CELL) as u64 + size;
        let w;
        (w, idx, base) = word_at(slices, idx, base, abs);
        if w == trailer_word(boundary) {
            return before;
        }
        if before + 16 <= len {
            let w;
            (w, idx, base) = word_at(slices, idx, base, abs + 8);
            if w & HEADER_MATCH_MASK == header_match(boundary) {
                return before;
            }
        }
        k += 1;
    }
}

/// Payload offset inside a packet starting at a cell boundary.
pub const PAYLOAD_OFFSET: usize = HEADER_LEN;

#[cfg(test)]
mod tests {
    use super::*;
    use wire::cells_for;

    fn slices_of(parts: &[Vec<u8>]) -> Vec<IoSlice<'_>> {
        parts.iter().map(|p| IoSlice::new(p)).collect()
    }

    #[test]
    fn conflict_found_across_slice_boundaries() {
        let size = 1 << 16;
        let head = 64 * 10;
        let mut data = vec![0u8; 300];
        // Word at payload offset 64*2 - 16 = 112 (boundary 2) is the next lap's header.
        let boundary = head + 128 + size;
        data[112..120].copy_from_slice(&header_match(boundary).to_le_bytes());
        // Split so that the word straddles slices, with a skip in front.
        let mut first = vec![9u8; 5];
        first.extend_from_slice(&data[..115]);
        let parts = vec![first, data[115..200].to_vec(), data[200..].to_vec()];
        let s = slices_of(&parts);
        assert_eq!(first_conflict(&s, 5, 300, head, size), 128 - 24);
    }

    #[test]
    fn no_conflict_when_words_do_not_match_this_position() {
        let size = 1 << 12;
        let mut data = vec![0u8; 1000];
        for c in data.chunks_mut(8) {
            if c.len() == 8 {
                c.copy_from_slice(&header_match(64).to_le_bytes());
            }
        }
        assert_eq!(
            first_conflict(&[IoSlice::new(&data)], 0, 1000, 64 * 7, size),
            1000
        );
    }

    #[test]
    fn cut_lengths_always_end_on_cell_boundaries() {
        for k in 1..20usize {
            let cut = k * CELL - OVERHEAD;
            assert_eq!((cut + OVERHEAD) % CELL, 0);
            assert_eq!(cells_for(cut), k);
        }
    }

    /// The obvious definition: walk the concatenated payload cell by cell.
    fn reference_conflict(data: &[u8], len: usize, head: u64, size: u64) -> usize {
        let word = |o: usize| u64::from_le_bytes(data[o..o + 8].try_into().unwrap());
        let mut k = 1;
        loop {
            let before = k * CELL - OVERHEAD;
            if before + 8 > len {
                return len;
            }
            let boundary = head + (k * CELL) as u64 + size;
            if word(before) == trailer_word(boundary) {
                return before;
            }
            if before + 16 <= len && word(before + 8) & HEADER_MATCH_MASK == header_match(boundary)
            {
                return before;
            }
            k += 1;
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn scan_matches_reference(
            cuts in proptest::collection::vec(0usize..300, 0..6),
            skip in 0usize..20,
            len in 0usize..1200,
            head_cells in 0u64..100,
            plant in proptest::collection::vec((1usize..20, 0u64..3, proptest::bool::ANY, -2isize..3), 0..6),
        ) {
            let size = 4096u64;
            let head = head_cells * CELL as u64;
            let mut data: Vec<u8> = (0..skip + len).map(|i| (i * 7) as u8).collect();
            // Plant flag values of laps 0..3 at (or near) the words that matter.
            for (k, lap, trailer, shift) in plant {
                let pos = head + (k * CELL) as u64 + size * lap;
                let (w, at) = if trailer {
                    (trailer_word(pos), k * CELL - OVERHEAD)
                } else {
                    (header_match(pos) | (5 << 32), k * CELL - 16)
                };
                let at = (at as isize + shift * 8) as usize;
                if skip + at + 8 <= data.len() {
                    data[skip + at..skip + at + 8].copy_from_slice(&w.to_le_bytes());
                }
            }
            let mut parts = Vec::new();
            let mut rest = &data[..];
            for c in cuts {
                let c = c.min(rest.len());
                parts.push(&rest[..c]);
                rest = &rest[c..];
            }
            parts.push(rest);
            let slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
            let want = reference_conflict(&data[skip..], len, head, size);
            proptest::prop_assert_eq!(first_conflict(&slices, skip, len, head, size), want);
        }
    }

    #[test]
    fn packets_never_cross_the_physical_end() {
        let size = 4096u64;
        for head in (0..3 * size).step_by(CELL) {
            let p = max_payload_now(size, head, head.saturating_sub(1024), 1 << 20);
            if p > 0 {
                let end = head % size + (cells_for(p) * CELL) as u64;
                assert!(end <= size, "head {head} payload {p}");
            }
        }
    }
}
