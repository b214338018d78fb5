//! Zero-copy announcements (the payload of a rendezvous packet), which name the
//! sender's buffers the receiver then reads with RDMA READ.
//!
//! Checks `Rendezvous::new_checked` against an independent model of the format:
//! the same verdict and error for every buffer. An accepted view has 1 ..= 16
//! segments, exactly the length they need, no empty or wrapping segment, and
//! segments that add up to its total; its accessors cannot panic; and encoding its
//! id and segments gives back the input with only the reserved padding zeroed,
//! which parses to the same view.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_channel::ring::wire::{
    Rendezvous, RndvError, RndvSeg, MAX_RNDV_SEGS, RNDV_FIXED, RNDV_SEG,
};

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// The verdict the format's definition gives, computed without the parser.
fn model(b: &[u8]) -> Result<(u64, u64, Vec<RndvSeg>), RndvError> {
    if b.len() < RNDV_FIXED {
        return Err(RndvError::Truncated);
    }
    let count = u32_at(b, 16);
    if count == 0 || count as usize > MAX_RNDV_SEGS {
        return Err(RndvError::BadCount(count));
    }
    if b.len() != RNDV_FIXED + RNDV_SEG * count as usize {
        return Err(RndvError::Truncated);
    }
    let segs: Vec<RndvSeg> = b[RNDV_FIXED..]
        .chunks_exact(RNDV_SEG)
        .map(|s| RndvSeg {
            addr: u64_at(s, 0),
            len: u64_at(s, 8),
            rkey: u32_at(s, 16),
        })
        .collect();
    // Summed in u128: no overflow in the model itself.
    let mut sum = 0u128;
    for s in &segs {
        if s.len == 0 || u128::from(s.addr) + u128::from(s.len) > u128::from(u64::MAX) {
            return Err(RndvError::BadLength);
        }
        sum += u128::from(s.len);
    }
    if sum != u128::from(u64_at(b, 8)) {
        return Err(RndvError::BadLength);
    }
    Ok((u64_at(b, 0), u64_at(b, 8), segs))
}

fuzz_target!(|data: &[u8]| {
    let got = Rendezvous::new_checked(data);
    let want = model(data);
    let r = match (got, want) {
        (Err(e), Err(w)) => {
            assert_eq!(e, w);
            return;
        }
        (Ok(r), Ok(w)) => (r, w),
        (got, want) => panic!("parser says {got:?}, the format says {want:?}"),
    };
    let (r, (id, total, segs)) = r;
    assert_eq!((r.id(), r.total(), r.count()), (id, total, segs.len()));
    assert_eq!(data.len(), Rendezvous::encoded_len(r.count()));
    for (i, s) in segs.iter().enumerate() {
        assert_eq!(r.seg(i), *s);
    }
    let mut out = vec![0xffu8; data.len()];
    assert_eq!(Rendezvous::encode(&mut out, id, &segs), data.len());
    let mut expected = data.to_vec();
    expected[20..24].fill(0);
    for s in expected[RNDV_FIXED..].chunks_exact_mut(RNDV_SEG) {
        s[20..24].fill(0);
    }
    assert_eq!(out, expected);
    let again = Rendezvous::new_checked(&out[..]).expect("an encoded announcement parses");
    assert_eq!(
        (again.id(), again.total(), again.count()),
        (id, total, segs.len())
    );
});
