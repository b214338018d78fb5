//! A gather list that can only name memory it borrows.
//!
//! [`Sge`] is a raw description (an address, a length, a key), so a safe function
//! cannot post one: nothing proves the memory is alive. A [`GatherList`] is built
//! only from borrowed slices and holds their lifetime, so posting it *inline* (the
//! fabric copies it before `post` returns) is safe:
//! [`QueuePair::post_inline_write`](super::QueuePair::post_inline_write).

use std::marker::PhantomData;
use std::mem::MaybeUninit;

use super::Sge;

/// Up to `N` borrowed pieces of memory, in order, as gather entries (lkey 0).
///
/// ```
/// use rdma_channel::fabric::GatherList;
/// let (head, body) = (*b"head", vec![7u8; 100]);
/// let mut list = GatherList::<4>::new();
/// assert!(list.push(&head) && list.push(&body));
/// assert_eq!((list.len(), list.bytes()), (2, 104));
/// assert_eq!(list.pieces().map(<[u8]>::len).collect::<Vec<_>>(), [4, 100]);
/// ```
pub struct GatherList<'a, const N: usize> {
    /// Entries `..len` are initialised, each from a slice borrowed for `'a`.
    /// Left uninitialised beyond: zeroing 32 entries would cost more than a small
    /// message's whole write.
    entries: [MaybeUninit<Sge>; N],
    len: usize,
    bytes: usize,
    _borrows: PhantomData<&'a [u8]>,
}

impl<'a, const N: usize> GatherList<'a, N> {
    /// An empty list.
    #[inline]
    pub fn new() -> Self {
        GatherList {
            entries: [const { MaybeUninit::uninit() }; N],
            len: 0,
            bytes: 0,
            _borrows: PhantomData,
        }
    }

    /// Appends `piece` (which may be empty); false when the list is full.
    #[inline]
    pub fn push(&mut self, piece: &'a [u8]) -> bool {
        if self.len == N {
            return false;
        }
        self.entries[self.len].write(Sge {
            addr: piece.as_ptr() as *mut u8,
            len: piece.len() as u32,
            lkey: 0,
        });
        self.len += 1;
        self.bytes += piece.len();
        true
    }

    /// Entries in the list.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the list has no entry.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Total bytes the list names.
    #[inline]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The entries, for a work request.
    #[inline]
    pub fn as_sges(&self) -> &[Sge] {
        // SAFETY: entries ..len were written by `push`, and MaybeUninit<Sge> has Sge's
        // layout.
        unsafe { std::slice::from_raw_parts(self.entries.as_ptr().cast::<Sge>(), self.len) }
    }

    /// The pieces again, as slices.
    pub fn pieces(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.as_sges().iter().map(|s| {
            // SAFETY: every entry was made by `push` from a slice borrowed for 'a, so
            // its address and length describe that live slice.
            unsafe { std::slice::from_raw_parts(s.addr.cast_const(), s.len as usize) }
        })
    }
}

impl<const N: usize> Default for GatherList<'_, N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_list_refuses_more_and_keeps_what_it_has() {
        let data = [1u8, 2, 3];
        let mut list = GatherList::<2>::new();
        assert!(list.is_empty());
        assert!(list.push(&data[..1]));
        assert!(list.push(&data[1..]));
        assert!(!list.push(&data));
        assert_eq!(list.bytes(), 3);
        let sges = list.as_sges();
        assert_eq!((sges[0].len, sges[1].len), (1, 2));
        assert_eq!(
            list.pieces().flatten().copied().collect::<Vec<_>>(),
            [1, 2, 3]
        );
    }
}
