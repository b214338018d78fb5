//! The CPUs the ranks of a group on one host may run on, for its contention rule
//! (`Contention` in `mod.rs`): the union of their affinity masks, which every hello
//! card carries. A process's own mask is not enough: a launcher that pins each rank
//! to a core of its own (`mpiexec -bind-to core`) leaves
//! every rank a one-CPU mask, and two such ranks would count as two ranks on one
//! CPU, outnumbered, when each has a CPU to itself.

use std::fmt::Write;

/// CPU numbers a set holds, at most (the kernel's `cpu_set_t` has 1024; a card
/// field is short anyway).
const CPU_LIMIT: usize = 4096;

/// Longest encoded set a card carries; a longer one (a mask full of holes on a
/// large host) is sent as unknown.
pub(crate) const ENCODED_MAX: usize = 100;

/// A set of CPU numbers below [`CPU_LIMIT`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CpuSet {
    words: Vec<u64>,
}

impl CpuSet {
    /// The CPUs this process may run on (`sched_getaffinity`), if the kernel says.
    pub(crate) fn of_this_process() -> Option<CpuSet> {
        // SAFETY: cpu_set_t is plain bits; all zeroes is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid cpu_set_t of the size passed, written by the call.
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        if rc != 0 {
            return None;
        }
        let mut cpus = CpuSet::default();
        for cpu in 0..libc::CPU_SETSIZE as usize {
            // SAFETY: cpu < CPU_SETSIZE, within the set; CPU_ISSET only reads it.
            if unsafe { libc::CPU_ISSET(cpu, &set) } {
                cpus.insert(cpu);
            }
        }
        (cpus.count() > 0).then_some(cpus)
    }

    fn insert(&mut self, cpu: usize) {
        debug_assert!(cpu < CPU_LIMIT);
        let w = cpu / 64;
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (cpu % 64);
    }

    fn contains(&self, cpu: usize) -> bool {
        self.words
            .get(cpu / 64)
            .is_some_and(|w| w & (1 << (cpu % 64)) != 0)
    }

    /// How many CPUs the set holds.
    pub(crate) fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The `n`th CPU of the set in increasing order, if it holds that many.
    pub(crate) fn nth(&self, n: usize) -> Option<usize> {
        (0..self.words.len() * 64)
            .filter(|&cpu| self.contains(cpu))
            .nth(n)
    }

    /// Restricts this thread to `cpu` (`sched_setaffinity`); threads it starts
    /// later inherit the mask.
    ///
    /// # Errors
    ///
    /// The system call's error.
    pub(crate) fn pin_this_thread(cpu: usize) -> std::io::Result<()> {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("CPU {cpu} is beyond the kernel's cpu_set_t"),
            ));
        }
        // SAFETY: cpu_set_t is plain bits; all zeroes is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: cpu < CPU_SETSIZE (checked above), within the set.
        unsafe { libc::CPU_SET(cpu, &mut set) };
        // SAFETY: `set` is a valid cpu_set_t of the size passed; the call only reads it.
        let rc =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Adds `other`'s CPUs to this set.
    pub(crate) fn union_with(&mut self, other: &CpuSet) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }

    /// Ranges joined by `.`, a range `a` or `a-b` in decimal (`0-3.8.10-11`): no
    /// `,`, `=` or space, as a card field needs. `None` when longer than
    /// [`ENCODED_MAX`] or empty.
    pub(crate) fn encode(&self) -> Option<String> {
        let mut out = String::new();
        let mut cpu = 0;
        let end = self.words.len() * 64;
        while cpu < end {
            if !self.contains(cpu) {
                cpu += 1;
                continue;
            }
            let first = cpu;
            while cpu + 1 < end && self.contains(cpu + 1) {
                cpu += 1;
            }
            if !out.is_empty() {
                out.push('.');
            }
            // Writing to a String cannot fail.
            let _ = if first == cpu {
                write!(out, "{first}")
            } else {
                write!(out, "{first}-{cpu}")
            };
            cpu += 1;
        }
        (!out.is_empty() && out.len() <= ENCODED_MAX).then_some(out)
    }

    /// The inverse of [`encode`](Self::encode): `None` for anything else (empty,
    /// a range backwards, a CPU at or above [`CPU_LIMIT`], longer than
    /// [`ENCODED_MAX`]).
    pub(crate) fn decode(s: &str) -> Option<CpuSet> {
        if s.is_empty() || s.len() > ENCODED_MAX {
            return None;
        }
        let mut set = CpuSet::default();
        for range in s.split('.') {
            let (a, b) = match range.split_once('-') {
                Some((a, b)) => (cpu_number(a)?, cpu_number(b)?),
                None => (cpu_number(range)?, cpu_number(range)?),
            };
            if a > b {
                return None;
            }
            for cpu in a..=b {
                set.insert(cpu);
            }
        }
        Some(set)
    }
}

/// A CPU number below [`CPU_LIMIT`], in decimal digits without a leading zero.
fn cpu_number(s: &str) -> Option<usize> {
    if s.is_empty() || s.len() > 4 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if s.len() > 1 && s.starts_with('0') {
        return None;
    }
    s.parse().ok().filter(|&n| n < CPU_LIMIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[usize]) -> CpuSet {
        let mut s = CpuSet::default();
        for &c in cpus {
            s.insert(c);
        }
        s
    }

    #[test]
    fn sets_encode_as_ranges_and_decode_back() {
        for (cpus, text) in [
            (&[0][..], "0"),
            (&[0, 1, 2, 3], "0-3"),
            (&[0, 1, 2, 3, 8, 10, 11], "0-3.8.10-11"),
            (&[63, 64], "63-64"),
            (&[5, 191], "5.191"),
        ] {
            let s = set(cpus);
            assert_eq!(s.encode().as_deref(), Some(text));
            assert_eq!(CpuSet::decode(text), Some(s.clone()));
            assert_eq!(s.count(), cpus.len());
        }
        assert_eq!(CpuSet::default().encode(), None);
        // Every other CPU of 192: too long for a card, sent as unknown.
        let holes: Vec<usize> = (0..192).step_by(2).collect();
        assert_eq!(set(&holes).encode(), None);
    }

    #[test]
    fn decode_refuses_what_encode_never_writes() {
        for bad in [
            "", "-", "3-1", "0-", "-3", "a", "1,2", "1..2", "1.", "4096", "0-4096", "+1", " 1",
            "01", "00001",
        ] {
            assert_eq!(CpuSet::decode(bad), None, "{bad:?}");
        }
        assert_eq!(
            CpuSet::decode(&"1.".repeat(60)),
            None,
            "longer than a card field"
        );
    }

    #[test]
    fn the_union_counts_each_cpu_once() {
        // Two ranks pinned to a core each: two CPUs. Two unpinned on four: four.
        let mut u = set(&[0]);
        u.union_with(&set(&[1]));
        assert_eq!(u.count(), 2);
        let mut u = set(&[0, 1, 2, 3]);
        u.union_with(&set(&[0, 1, 2, 3]));
        assert_eq!(u.count(), 4);
        let mut u = set(&[1]);
        u.union_with(&set(&[100]));
        assert_eq!((u.count(), u.contains(100)), (2, true));
    }

    #[test]
    fn this_process_has_at_least_one_cpu() {
        let mine = CpuSet::of_this_process().expect("sched_getaffinity");
        assert!(mine.count() >= 1);
        if let Some(text) = mine.encode() {
            assert_eq!(CpuSet::decode(&text), Some(mine));
        }
    }
}
