//! Control words and piggybacked acks: the tails a peer announces to a sender, and
//! the packet headers a sender's own placement produces for the receiver.
//!
//! Drives the sender's ring arithmetic through a sequence of operations read from
//! the input: packets of any size, tails announced by the peer (any 64-bit value,
//! or values near the real positions so that the accepted ones are explored too),
//! in rings of 4 KiB ..= 1 GiB and chunk sizes of any value. Checks that
//! `tail_ok` accepts exactly the cell-aligned tails the sender has reached, and
//! that with only such tails accepted the sender never has more than a ring of
//! bytes outstanding, never places a packet past the free space, the chunk or the
//! ring's physical end, and that the receiver's `packet_cells` accepts every packet
//! so placed with the same cell count.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_channel::ring::wire::{cells_for, CELL, OVERHEAD};
use rdma_channel::ring::{free_space, max_payload_now, packet_cells, tail_ok};

/// Reads the input as a stream of integers (zeros once it runs out).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let n = N.min(self.0.len());
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        b
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let size = 1u64 << (12 + input.u8() % 19);
    // Any chunk, including ones below a cell (the sender then never fits a packet).
    let chunk = u64::from(input.u32()) % (2 * size);
    // Start anywhere, so that laps and the physical end come early.
    let start = u64::from(input.u32()) * CELL as u64;
    let (mut head, mut tail) = (start, start);
    // What a correct receiver has really read: never beyond the head.
    let mut read = start;
    while !input.0.is_empty() {
        match input.u8() % 4 {
            0 => {
                // The sender puts up to `want` bytes.
                let want = usize::from(input.u16()) * 37;
                let room = max_payload_now(size, head, tail, chunk);
                if room == 0 {
                    continue;
                }
                let cells = cells_for(room) as u64 * CELL as u64;
                assert_eq!(room + OVERHEAD, cells as usize, "room is whole cells");
                assert!(cells <= free_space(size, head, tail), "past the free space");
                assert!(cells <= chunk, "past the chunk");
                assert!((head & (size - 1)) + cells <= size, "past the ring's end");
                let n = want.min(room);
                let used = packet_cells(size, head, n).expect("the receiver accepts it");
                assert_eq!(used, cells_for(n));
                head += (used * CELL) as u64;
            }
            1 => {
                // A correct receiver reads some packets and announces its tail.
                let cells = u64::from(input.u16());
                read = (read + cells * CELL as u64).min(head);
                assert!(tail_ok(read, head));
                tail = tail.max(read);
            }
            op => {
                // A peer announces anything: a raw word, or one near the real tail.
                let t = if op == 2 {
                    input.u64()
                } else {
                    let delta = i64::from(input.u32() as i32);
                    tail.wrapping_add_signed(delta)
                };
                let ok = tail_ok(t, head);
                assert_eq!(ok, t <= head && t % CELL as u64 == 0);
                if ok {
                    // The sender takes the larger of what it knew and what it is told.
                    tail = tail.max(t);
                }
            }
        }
        assert!(tail <= head);
        assert!(head - tail <= size, "more than a ring outstanding");
        assert!(free_space(size, head, tail) <= size);
        assert_eq!(tail % CELL as u64, 0);
        assert_eq!(head % CELL as u64, 0);
    }
});
