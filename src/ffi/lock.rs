//! The library's one lock: a test-and-set lock that spins, then yields, with
//! poisoning. Uncontended it costs one atomic exchange to take and a plain store to
//! release, against two atomic read-modify-writes for `std::sync::Mutex`: the data
//! calls take it once each, and they are the MPI-level latency.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// A value behind the lock.
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    poisoned: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through a guard, and at most one guard exists at
// a time (the exchange in `lock` hands it to one thread); T: Send is enough, as for
// std's Mutex.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub(crate) const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock; `Err` if a thread panicked while holding it.
    #[inline]
    pub(crate) fn lock(&self) -> Result<Guard<'_, T>, ()> {
        // Acquire: pairs with the Release store in Guard::drop, so the previous
        // holder's writes to the value are visible.
        if self.locked.swap(true, Ordering::Acquire) {
            self.lock_contended();
        }
        let g = Guard { lock: self };
        // Relaxed: set by a holder before its release, which the Acquire above saw.
        if self.poisoned.load(Ordering::Relaxed) {
            return Err(());
        }
        Ok(g)
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            // Relaxed: only a hint; the exchange below is what acquires.
            while self.locked.load(Ordering::Relaxed) {
                if spins < 100 {
                    std::hint::spin_loop();
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            if !self.locked.swap(true, Ordering::Acquire) {
                return;
            }
        }
    }
}

/// Exclusive access to the value until dropped.
pub(crate) struct Guard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard is the only one (see `Sync` above).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard is the only one, and `&mut self` makes the access unique.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Relaxed: published by the Release store below.
            self.lock.poisoned.store(true, Ordering::Relaxed);
        }
        // Release: our writes to the value happen before the next holder's Acquire.
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_many_threads_and_poisons_on_panic() {
        static L: SpinLock<u64> = SpinLock::new(0);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..10_000 {
                        *L.lock().unwrap() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*L.lock().unwrap(), 40_000);
        let r = std::panic::catch_unwind(|| {
            let _g = L.lock().unwrap();
            panic!("inside");
        });
        assert!(r.is_err());
        assert!(L.lock().is_err(), "poisoned after a panic");
    }
}
