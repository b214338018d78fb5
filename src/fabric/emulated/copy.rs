//! The emulated NIC's data movers for memory it can address directly (this process's
//! memory, or a peer segment mapped here).
//!
//! [`write_direct`] implements the placement-order guarantee: every byte of the target
//! range except the last 8-byte-aligned word is copied first, then that word is stored
//! with `Release`. A reader that loads the word with `Acquire` and sees the new value
//! therefore sees every other byte of the write.
//!
//! Copies use [`std::ptr::copy`] (memmove): on a loopback connection a gather list may
//! overlap the target, which would make `copy_nonoverlapping` undefined behaviour; in
//! glibc memmove and memcpy share one implementation, so bandwidth is the same.

use crate::fabric::Sge;
use std::sync::atomic::{AtomicU64, Ordering};

/// Offset (from `addr`) of the last 8-byte-aligned word lying entirely inside
/// `[addr, addr + n)`, or `None` when the range holds no aligned word.
pub(crate) fn last_word(addr: u64, n: u64) -> Option<u64> {
    let end = addr.checked_add(n)?;
    let word = (end & !7).checked_sub(8)?;
    (word >= addr).then(|| word - addr)
}

/// Calls `f(pointer, len, offset)` for the pieces of the gather/scatter list `sges` that
/// make up bytes `[from, to)` of the list's concatenation; `offset` is the piece's
/// position relative to `from`. Zero-length pieces are skipped.
pub(crate) fn for_each_chunk(
    sges: &[Sge],
    from: u64,
    to: u64,
    mut f: impl FnMut(*mut u8, usize, usize),
) {
    let mut pos = 0u64;
    for sge in sges {
        let start = pos;
        let end = pos + u64::from(sge.len);
        pos = end;
        let lo = start.max(from);
        let hi = end.min(to);
        if lo < hi {
            // wrapping_add: pointer arithmetic on a caller-described address; it is only
            // dereferenced by the callers, under post's safety contract.
            f(
                sge.addr.wrapping_add((lo - start) as usize),
                (hi - lo) as usize,
                (lo - from) as usize,
            );
        }
        if pos >= to {
            break;
        }
    }
}

/// Copies bytes `[from, to)` of the gather list to `out`.
///
/// # Safety
///
/// The gather list must describe readable memory, and `out` must be writable for
/// `to - from` bytes.
pub(crate) unsafe fn gather(sges: &[Sge], from: u64, to: u64, out: *mut u8) {
    for_each_chunk(sges, from, to, |src, len, off| {
        // SAFETY: src..src+len lies in a gather entry (caller contract) and
        // out+off..out+off+len inside the output (off + len <= to - from).
        unsafe { std::ptr::copy(src, out.add(off), len) }
    });
}

/// Places the `n` bytes of gather list `src` at `dst`, storing the last aligned word of
/// the target range last, with `Release`.
///
/// # Safety
///
/// `src` must describe at least `n` readable bytes and `dst..dst + n` must be writable
/// memory that nobody else accesses non-atomically during the call (other than with the
/// usual RDMA races the caller accepts, e.g. a reader polling the last word).
#[inline]
pub(crate) unsafe fn write_direct(dst: *mut u8, src: &[Sge], n: u64) {
    if let [sge] = src {
        if dst as usize % 8 == 0 && n % 8 == 0 && n >= 8 {
            // Whole aligned words from one buffer (the ring's small packets, assembled
            // on the stack): inlined into the caller, one copy for all but the last
            // word instead of the general loop over pieces; a short packet (16 bytes)
            // and one cell as constant-size copies the compiler expands in place.
            let body = (n - 8) as usize;
            if n == 16 {
                // SAFETY: the entry holds 16 readable bytes and dst..dst+16 is
                // writable (caller contract); the last word is stored below.
                unsafe { std::ptr::copy(sge.addr as *const [u8; 8], dst as *mut [u8; 8], 1) };
            } else if n == 64 {
                // SAFETY: the entry holds 64 readable bytes and dst..dst+64 is
                // writable (caller contract); the last word is stored below.
                unsafe { std::ptr::copy(sge.addr as *const [u8; 56], dst as *mut [u8; 56], 1) };
            } else {
                // SAFETY: the entry holds n readable bytes and dst..dst+n is writable
                // (caller contract); the last word is stored below.
                unsafe { std::ptr::copy(sge.addr, dst, body) };
            }
            // SAFETY: the entry's last 8 bytes; read unaligned, it is caller memory.
            let word = unsafe { std::ptr::read_unaligned(sge.addr.add(body) as *const u64) };
            // SAFETY: dst + body is 8-byte aligned (dst and n are) and is the target
            // range's last word.
            let slot = unsafe { AtomicU64::from_ptr(dst.add(body).cast::<u64>()) };
            // Release: the bytes above become visible before the word does.
            slot.store(word, Ordering::Release);
            return;
        }
    }
    // SAFETY: forwarded contract of this function.
    unsafe { write_gathered(dst, src, n) }
}

/// [`write_direct`]'s general case: any gather list, any alignment.
///
/// # Safety
///
/// As [`write_direct`].
#[inline(never)]
unsafe fn write_gathered(dst: *mut u8, src: &[Sge], n: u64) {
    let Some(w) = last_word(dst as u64, n) else {
        // SAFETY: forwarded contract of this function.
        unsafe { gather(src, 0, n, dst) };
        return;
    };
    // One pass over the gather list: bytes before and after the last word go straight
    // to `dst`; the bytes of the last word are collected and stored at the end.
    let (w, n) = (w as usize, n as usize);
    let mut word = [0u8; 8];
    let mut pos = 0usize;
    for sge in src {
        let (start, end) = (pos, (pos + sge.len as usize).min(n));
        pos = end;
        let piece = |lo: usize, hi: usize| (sge.addr.wrapping_add(lo - start), hi - lo);
        let before_hi = end.min(w);
        if start < before_hi {
            let (p, len) = piece(start, before_hi);
            // SAFETY: p..p+len lies in this gather entry (caller contract) and
            // dst+start..dst+before_hi inside the target range, before the word.
            unsafe { std::ptr::copy(p, dst.add(start), len) };
        }
        let (wlo, whi) = (start.max(w), end.min(w + 8));
        if wlo < whi {
            let (p, len) = piece(wlo, whi);
            // SAFETY: p..p+len lies in this gather entry; word[wlo - w..whi - w] is in
            // bounds because w <= wlo < whi <= w + 8.
            unsafe { std::ptr::copy(p, word.as_mut_ptr().add(wlo - w), len) };
        }
        let after_lo = start.max(w + 8);
        if after_lo < end {
            let (p, len) = piece(after_lo, end);
            // SAFETY: p..p+len lies in this gather entry and dst+after_lo..dst+end
            // inside the target range, after the word.
            unsafe { std::ptr::copy(p, dst.add(after_lo), len) };
        }
        if pos >= n {
            break;
        }
    }
    // SAFETY: dst + w is 8-byte aligned (last_word) and inside the writable target
    // range; readers access it atomically.
    let slot = unsafe { AtomicU64::from_ptr(dst.add(w).cast::<u64>()) };
    // Release: every byte copied above becomes visible before the word does.
    slot.store(u64::from_ne_bytes(word), Ordering::Release);
}

/// Copies `n` bytes from `src` into scatter list `dst`.
///
/// # Safety
///
/// `src..src + n` must be readable and the scatter list must describe at least `n`
/// writable bytes.
pub(crate) unsafe fn read_direct(src: *const u8, dst: &[Sge], n: u64) {
    for_each_chunk(dst, 0, n, |out, len, off| {
        // SAFETY: off + len <= n, so the source piece is readable; the destination piece
        // lies inside a scatter entry (caller contract).
        unsafe { std::ptr::copy(src.add(off), out, len) }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(buf: &mut [u8]) -> Sge {
        Sge::from_slice(buf, 0)
    }

    #[test]
    fn last_word_finds_the_last_aligned_word() {
        assert_eq!(last_word(0x1000, 16), Some(8));
        assert_eq!(last_word(0x1000, 8), Some(0));
        assert_eq!(last_word(0x1000, 7), None);
        assert_eq!(last_word(0x1001, 8), None);
        assert_eq!(last_word(0x1001, 15), Some(7));
        assert_eq!(last_word(0x1000, 13), Some(0));
        assert_eq!(last_word(0x1003, 20), Some(5));
        assert_eq!(last_word(0x1003, 29), Some(21));
        assert_eq!(last_word(0, 0), None);
        assert_eq!(last_word(u64::MAX - 3, 8), None);
    }

    #[test]
    fn write_gathers_across_entries_including_a_straddling_last_word() {
        // Target ends unaligned so there are tail bytes after the last word, and the
        // last word straddles the second and third gather entries.
        let mut a: Vec<u8> = (0..5).collect();
        let mut b: Vec<u8> = (5..14).collect();
        let mut c: Vec<u8> = (14..23).collect();
        let list = [sge(&mut a), sge(&mut b), sge(&mut c)];
        let mut target = vec![u64::from_ne_bytes([0xee; 8]); 8];
        let base = target.as_mut_ptr().cast::<u8>();
        // SAFETY: base + 3 .. base + 26 lies inside the 64-byte target.
        unsafe { write_direct(base.add(3), &list, 23) };
        // SAFETY: reading the target back as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(base, 64) };
        assert!(bytes[..3].iter().all(|&x| x == 0xee));
        assert_eq!(&bytes[3..26], &(0..23).collect::<Vec<u8>>()[..]);
        assert!(bytes[26..].iter().all(|&x| x == 0xee));
    }

    #[test]
    fn short_unaligned_writes_are_plain_copies() {
        let mut src = [1u8, 2, 3];
        let list = [sge(&mut src)];
        let mut target = [0u8; 16];
        // SAFETY: 3 bytes at offset 5 of a 16-byte buffer.
        unsafe { write_direct(target.as_mut_ptr().add(5), &list, 3) };
        assert_eq!(&target[5..8], &[1, 2, 3]);
        assert_eq!(target.iter().filter(|&&x| x != 0).count(), 3);
    }

    #[test]
    fn read_scatters_in_order() {
        let src: Vec<u8> = (0..20).collect();
        let mut a = [0u8; 7];
        let mut b = [0u8; 0];
        let mut c = [0u8; 13];
        let list = [sge(&mut a), sge(&mut b), sge(&mut c)];
        // SAFETY: 20 readable bytes into 20 bytes of scatter entries.
        unsafe { read_direct(src.as_ptr(), &list, 20) };
        assert_eq!(&a[..], &src[..7]);
        assert_eq!(&c[..], &src[7..]);
    }

    #[test]
    fn chunks_report_offsets_relative_to_the_range() {
        let mut a = [0u8; 4];
        let mut b = [0u8; 4];
        let list = [sge(&mut a), sge(&mut b)];
        let mut seen = Vec::new();
        for_each_chunk(&list, 2, 7, |_, len, off| seen.push((len, off)));
        assert_eq!(seen, vec![(2, 0), (3, 2)]);
    }
}
