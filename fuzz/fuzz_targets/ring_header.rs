//! Ring packet headers, as the receiver reads them from the ring the peer writes.
//!
//! Checks: `Header::new_checked` refuses exactly the buffers shorter than a header;
//! the accessors of an accepted view agree with the raw words (length within the
//! 24-bit field, kind known or reported with its value, `is_at` true exactly at the
//! positions of the header's stamp); a header that names a packet re-encodes to the
//! same word through `header_word` and `Header::fill`; and at the position it names
//! in a ring of any size, `packet_cells` accepts it only if the whole packet (header,
//! payload, trailer) lies inside the ring, refusing exactly the ones that would run
//! past the physical end, while every packet a sender places there is accepted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_channel::ring::wire::{
    cells_for, header_match, header_word, trailer_offset, Header, WireError, ACK_MARK, CELL,
    HEADER_LEN, HEADER_MATCH_MASK, MAX_PAYLOAD, OVERHEAD,
};
use rdma_channel::ring::{max_payload_now, packet_cells};

const STAMP_MASK: u64 = 0xffff_ffff;

fuzz_target!(|data: &[u8]| {
    let h = match Header::new_checked(data) {
        Ok(h) => h,
        Err(e) => {
            assert!(data.len() < HEADER_LEN);
            assert_eq!(e, WireError::Truncated);
            return;
        }
    };
    assert!(data.len() >= HEADER_LEN);
    let word = u64::from_le_bytes(data[0..8].try_into().unwrap());
    let ack = u64::from_le_bytes(data[8..16].try_into().unwrap());
    assert_eq!((h.word(), h.ack_word(), h.ack()), (word, ack, ack & !ACK_MARK));
    let len = h.len();
    assert!(len as usize <= MAX_PAYLOAD);
    assert_eq!(u64::from(len), (word >> 32) & 0xff_ffff);
    let kind_bits = (word >> 56) & 0xf;
    let kind = match h.kind() {
        Ok(k) => {
            assert_eq!(k as u64, kind_bits);
            Some(k)
        }
        Err(WireError::UnknownKind(k)) => {
            assert_eq!(u64::from(k), kind_bits);
            assert!(!(1..=4).contains(&k));
            None
        }
        Err(e) => panic!("kind() failed with {e:?}"),
    };

    // The one cell position of each 2^32-cell lap that the stamp names.
    let laps = data.get(16).map_or(0, |&b| u64::from(b));
    let pos = ((word & STAMP_MASK) + (laps << 32)) * CELL as u64;
    let tagged = word & !STAMP_MASK & HEADER_MATCH_MASK == header_match(0);
    assert_eq!(h.is_at(pos), tagged);
    // Another cell of the same lap, or the same cell a lap earlier or later of any
    // ring of up to 2^32 cells, is never a match.
    assert!(!h.is_at(pos + CELL as u64));
    assert!(!h.is_at(pos.wrapping_sub(CELL as u64)));
    if !tagged {
        return;
    }

    if let Some(kind) = kind {
        assert_eq!(header_word(pos, kind, len), word);
        let mut again = [0u8; HEADER_LEN];
        Header::new_unchecked(&mut again[..]).fill(pos, kind, len, h.ack());
        // The ack goes back marked: equal to the input's when that carried the mark.
        assert_eq!(again[..8], data[..8]);
        assert_eq!(again[8..16], (ack | ACK_MARK).to_le_bytes());
    }

    // Where the receiver would take it: any ring of 4 KiB ..= 1 GiB.
    let log2 = 12 + u32::from(data.get(17).copied().unwrap_or(0) % 19);
    let size = 1u64 << log2;
    let off = pos & (size - 1);
    let need = (cells_for(len as usize) * CELL) as u64;
    match packet_cells(size, pos, len as usize) {
        Some(cells) => {
            assert_eq!(cells, cells_for(len as usize));
            let bytes = (cells * CELL) as u64;
            assert!(len as usize + OVERHEAD <= cells * CELL);
            assert!(off + bytes <= size, "packet past the ring's end accepted");
            // The trailer word the receiver polls (the last word of the write, inside
            // the packet's cells, before or at their end), and the payload it copies
            // out, are inside the ring without wrapping, and the payload ends before
            // the trailer starts.
            let t_off = trailer_offset(len as usize) as u64;
            assert!(t_off + 8 <= bytes && t_off % 8 == 0);
            assert!(HEADER_LEN as u64 + u64::from(len) <= t_off);
            let trailer = pos + t_off;
            assert_eq!(trailer & (size - 1), off + t_off);
            assert!(off + HEADER_LEN as u64 + u64::from(len) <= size);
        }
        None => assert!(off + need > size, "packet inside the ring refused"),
    }
    // Whatever a sender with an empty ring places at this position is accepted.
    let chunk = u64::from(len) + OVERHEAD as u64;
    let p = max_payload_now(size, pos, pos, chunk);
    if p > 0 {
        assert_eq!(packet_cells(size, pos, p), Some(cells_for(p)));
    }
});
