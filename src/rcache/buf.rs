//! [`RdmaBuf`]: memory the registration cache allocated and registered.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use super::RegCache;
use crate::fabric::Fabric;

/// Registered memory from [`Channel::alloc_mem`](crate::Channel::alloc_mem): on the emulated fabric a shared
/// segment the peer reads with a plain copy, so sends from it go zero-copy from a
/// lower threshold than other memory. Dereferences to `[u8]`; dropping it frees it.
///
/// ```
/// use std::io::{Read, Write};
/// use rdma_channel::RdmaStream;
/// let (mut a, mut b) = RdmaStream::pair()?;
/// let mut buf = a.alloc_mem(1 << 20)?;
/// buf.fill(7);
/// let t = std::thread::spawn(move || {
///     a.write_all(&buf)?; // zero-copy: returns once b has pulled the bytes
///     Ok::<_, std::io::Error>(a)
/// });
/// let mut got = vec![0u8; 1 << 20];
/// b.read_exact(&mut got)?;
/// assert!(got.iter().all(|&x| x == 7));
/// t.join().unwrap()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct RdmaBuf<F: Fabric> {
    /// The cache that made the allocation, and will free it. It keeps the
    /// registration (and so the protection domain) alive, and nothing else: no queue
    /// pair, no ring.
    cache: Arc<RegCache<F>>,
    ptr: NonNull<u8>,
    len: usize,
}

impl<F: Fabric> RdmaBuf<F> {
    /// Allocates `len` bytes of zeroed memory registered in `fabric` through `cache`.
    ///
    /// # Errors
    ///
    /// As [`RegCache::alloc`].
    pub fn new(cache: &Arc<RegCache<F>>, fabric: &F, len: usize) -> io::Result<RdmaBuf<F>> {
        let ptr = cache.alloc(fabric, len)?;
        Ok(RdmaBuf {
            cache: cache.clone(),
            ptr,
            len,
        })
    }
}

// SAFETY: the buffer is plain memory owned by this value (the cache only keeps its
// registration); moving it between threads is as safe as moving a Vec<u8>.
unsafe impl<F: Fabric> Send for RdmaBuf<F> {}
// SAFETY: shared references only give out `&[u8]`.
unsafe impl<F: Fabric> Sync for RdmaBuf<F> {}

impl<F: Fabric> std::ops::Deref for RdmaBuf<F> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is the live, initialised (zeroed at allocation)
        // allocation this value owns until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<F: Fabric> std::ops::DerefMut for RdmaBuf<F> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref; `&mut self` makes the access exclusive, and no transfer
        // can be reading it: the safe send paths borrow the buffer until the peer
        // confirmed, and `put_nocopy`'s contract forbids touching it meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<F: Fabric> Drop for RdmaBuf<F> {
    fn drop(&mut self) {
        // SAFETY: ptr came from this cache's alloc and is freed once, here. If it is
        // still acquired (only possible after a broken `put_nocopy` contract) the
        // cache refuses and the memory is leaked rather than freed under the NIC.
        let _ = unsafe { self.cache.free(self.ptr.as_ptr()) };
    }
}
