//! Zero-copy announcements (the payload of a rendezvous packet), which name the
//! sender's buffers the receiver then reads with RDMA READ.
//!
//! Checks `Rendezvous::new_checked` against an independent model of the format:
//! the same verdict and error for every buffer. An accepted view has 1 ..= 16
//! segments, exactly the length they need, no empty or wrapping segment, and
//! segments that add up to its total, each entry carrying the rail keys its flags
//! name (bits 8-10); its accessors cannot panic; and encoding its id, flags,
//! segments and rail keys gives back the input with only the reserved padding
//! zeroed, which parses to the same view.
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
type Model = (u64, u64, Vec<RndvSeg>, Vec<Vec<u32>>);

fn model(b: &[u8]) -> Result<Model, RndvError> {
    if b.len() < RNDV_FIXED {
        return Err(RndvError::Truncated);
    }
    let count = u32_at(b, 16);
    if count == 0 || count as usize > MAX_RNDV_SEGS {
        return Err(RndvError::BadCount(count));
    }
    let keys = ((u32_at(b, 20) >> 8) & 7) as usize;
    let entry = RNDV_SEG + 4 * keys;
    if b.len() != RNDV_FIXED + entry * count as usize {
        return Err(RndvError::Truncated);
    }
    let segs: Vec<RndvSeg> = b[RNDV_FIXED..]
        .chunks_exact(entry)
        .map(|s| RndvSeg {
            addr: u64_at(s, 0),
            len: u64_at(s, 8),
            rkey: u32_at(s, 16),
        })
        .collect();
    let rail_keys: Vec<Vec<u32>> = b[RNDV_FIXED..]
        .chunks_exact(entry)
        .map(|s| (0..keys).map(|k| u32_at(s, RNDV_SEG + 4 * k)).collect())
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
    Ok((u64_at(b, 0), u64_at(b, 8), segs, rail_keys))
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
    let (r, (id, total, segs, rail_keys)) = r;
    let keys = r.rail_keys();
    assert_eq!((r.id(), r.total(), r.count()), (id, total, segs.len()));
    assert_eq!(data.len(), Rendezvous::encoded_len_with_keys(r.count(), keys));
    for (i, s) in segs.iter().enumerate() {
        assert_eq!(r.seg(i), *s);
        assert_eq!(r.rail_rkey(i, 0), s.rkey);
        for k in 0..keys {
            assert_eq!(r.rail_rkey(i, k + 1), rail_keys[i][k]);
        }
        // A rail beyond those with keys reads with the segment's own.
        assert_eq!(r.rail_rkey(i, keys + 1), s.rkey);
    }
    let mut out = vec![0xffu8; data.len()];
    for (i, s) in segs.iter().enumerate() {
        Rendezvous::encode_seg_with_keys(&mut out, i, s, &rail_keys[i]);
    }
    let n = Rendezvous::encode_fixed_with_keys(&mut out, id, total, segs.len(), r.flags(), keys);
    assert_eq!(n, data.len());
    let mut expected = data.to_vec();
    for s in expected[RNDV_FIXED..].chunks_exact_mut(RNDV_SEG + 4 * keys) {
        s[20..24].fill(0);
    }
    assert_eq!(out, expected);
    let again = Rendezvous::new_checked(&out[..]).expect("an encoded announcement parses");
    assert_eq!(
        (again.id(), again.total(), again.count(), again.rail_keys()),
        (id, total, segs.len(), keys)
    );
});
