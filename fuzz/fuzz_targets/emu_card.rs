//! Emulated fabric cards: the peer's process, domain, queue pair and shared-memory
//! segments, which arrive with the segments' descriptors.
//!
//! The first input byte is how many descriptors arrived (0 ..= 255, past the
//! kernel's limit), the rest is the card. Checks that `EmuCard::new_checked`
//! refuses with `InvalidData` ("bad emulated fabric card: ...") whatever it refuses,
//! that it accepts only a card with one descriptor for the domain and one per
//! segment record, within the descriptor limit, of exactly the length its records
//! need, and that encoding the decoded fields gives back the input byte for byte
//! (reserved fields must be zero, so no byte goes unchecked).
#![no_main]

use std::io::ErrorKind;

use libfuzzer_sys::fuzz_target;
use rdma_channel::fuzzing::{emu_card, EMU_MAX_FDS};

/// Bytes before the segment records, and per record.
const HEAD: usize = 48;
const RECORD: usize = 16;

fuzz_target!(|data: &[u8]| {
    let Some((&fds, card)) = data.split_first() else {
        return;
    };
    let fds = usize::from(fds);
    match emu_card(card, fds) {
        Ok(again) => {
            assert!((1..=EMU_MAX_FDS).contains(&fds));
            assert!(card.len() >= HEAD && (card.len() - HEAD) % RECORD == 0);
            assert_eq!((card.len() - HEAD) / RECORD, fds - 1);
            assert_eq!(again, card);
        }
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidData);
            assert!(
                e.to_string().starts_with("bad emulated fabric card: "),
                "{e}"
            );
        }
    }
});
