//! Connection cards: what the peer tells us about its ring and control words.
//!
//! Checks that `ConnCard::new_checked` refuses with `InvalidData` ("bad connection
//! card: ...") whatever it refuses, and that an accepted card describes a ring of a
//! power of two in 4 KiB ..= 1 GiB and a control region, both 64-byte aligned, with
//! a fabric card of exactly the length it announces, followed only by a rails
//! section where its flag says so (rail cards whose lengths add up, or one byte
//! saying their cards follow in band); that encoding its fields gives back the
//! input byte for byte (every byte of the format is a checked field); and that the
//! card one byte shorter or longer is refused.
#![no_main]

use std::io::ErrorKind;

use libfuzzer_sys::fuzz_target;
use rdma_channel::engine::card::{CardFlags, ConnCard, CTRL_SIZE, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let card = match ConnCard::new_checked(data) {
        Ok(c) => c,
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidData);
            assert!(e.to_string().starts_with("bad connection card: "), "{e}");
            return;
        }
    };
    let (ring, ctrl, fabric) = (card.ring(), card.ctrl(), card.fabric_card());
    assert!(ring.len.is_power_of_two() && (1 << 12..=1 << 30).contains(&ring.len));
    assert_eq!(ring.addr % 64, 0);
    assert_eq!((ctrl.len, ctrl.addr % 64), (CTRL_SIZE as u64, 0));
    let announced = u16::from_le_bytes([data[6], data[7]]);
    assert_eq!(fabric.len(), usize::from(announced));
    assert_eq!(fabric, &data[HEADER_LEN..HEADER_LEN + fabric.len()]);
    let (rails, in_band) = (card.rails(), card.rails_in_band());
    let section: usize = if data[5] & 0x20 == 0 {
        0
    } else if in_band > 0 {
        assert!(rails.is_empty());
        1
    } else {
        assert!(!rails.is_empty() && rails.len() < 8);
        1 + rails.iter().map(|(c, _)| 3 + c.len()).sum::<usize>()
    };
    assert_eq!(data.len(), HEADER_LEN + fabric.len() + section);
    let flags = CardFlags {
        wakes: card.wakes(),
        lends: card.lends(),
    };
    let again = if in_band > 0 {
        ConnCard::encode_with_rails_in_band(ring, ctrl, flags, fabric, in_band)
    } else {
        ConnCard::encode_with_rails(ring, ctrl, flags, fabric, &rails)
    }
    .expect("an accepted card re-encodes");
    assert_eq!(again, data);
    assert!(ConnCard::new_checked(&data[..data.len() - 1]).is_err());
    let mut longer = data.to_vec();
    longer.push(0);
    assert!(ConnCard::new_checked(&longer[..]).is_err());
});
