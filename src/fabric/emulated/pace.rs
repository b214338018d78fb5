//! Rails with a rate: a queue pair whose requests complete no sooner than a link
//! of that many bytes a second would carry them, for testing and measuring
//! multirail striping without a second NIC.
//!
//! The copy itself still happens inside `post` (at memory speed); what the pacer
//! holds back is the completion, which is all a reader of an RDMA READ's buffer or
//! the poster of a signalled write may go by. Requests on one link queue behind
//! each other, as frames on a wire do: a request of `n` bytes completes `n / rate`
//! after the later of its post and the previous request's completion. A pacer
//! shared by several queue pairs (a named link) is a port shared by several
//! connections: a competing flow slows the others down.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A link of a fixed rate: when the requests queued on it finish.
#[derive(Debug)]
pub struct Pacer {
    /// Picoseconds a byte takes.
    ps_per_byte: u64,
    /// When the last request queued finishes.
    busy_until: Mutex<Option<Instant>>,
}

impl Pacer {
    /// A link moving `bytes_per_sec` (at least 1).
    ///
    /// ```
    /// use rdma_channel::fabric::emulated::Pacer;
    /// let p = Pacer::new(1_000_000); // 1 MB/s: a byte takes 1 us
    /// let a = p.reserve(1000);
    /// let b = p.reserve(1000);
    /// assert!(b.duration_since(a) >= std::time::Duration::from_millis(1));
    /// ```
    pub fn new(bytes_per_sec: u64) -> Pacer {
        Pacer {
            ps_per_byte: (1_000_000_000_000 / bytes_per_sec.max(1)).max(1),
            busy_until: Mutex::new(None),
        }
    }

    /// The pacer of the link named `name` at `bytes_per_sec` in this process: the
    /// same one for every caller while any of them holds it (a link's rate is its
    /// first user's).
    pub fn shared(name: &str, bytes_per_sec: u64) -> Arc<Pacer> {
        static LINKS: Mutex<Option<HashMap<String, Weak<Pacer>>>> = Mutex::new(None);
        let mut links = LINKS.lock().unwrap_or_else(|p| p.into_inner());
        let links = links.get_or_insert_with(HashMap::new);
        links.retain(|_, p| p.strong_count() > 0);
        if let Some(p) = links.get(name).and_then(Weak::upgrade) {
            return p;
        }
        let p = Arc::new(Pacer::new(bytes_per_sec));
        links.insert(name.to_string(), Arc::downgrade(&p));
        p
    }

    /// Queues `bytes` on the link and returns when they will have crossed it.
    pub fn reserve(&self, bytes: u64) -> Instant {
        let now = Instant::now();
        let mut busy = self.busy_until.lock().unwrap_or_else(|p| p.into_inner());
        let start = busy.filter(|&b| b > now).unwrap_or(now);
        let took = Duration::from_nanos(bytes.saturating_mul(self.ps_per_byte) / 1000);
        let done = start + took;
        *busy = Some(done);
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_link_is_shared_while_held() {
        let a = Pacer::shared("pace-test-link", 1000);
        let b = Pacer::shared("pace-test-link", 5);
        assert!(Arc::ptr_eq(&a, &b), "one link, one pacer");
        assert_eq!(b.ps_per_byte, 1_000_000_000, "the first user's rate");
        drop((a, b));
        let c = Pacer::shared("pace-test-link", 5);
        assert_eq!(
            c.ps_per_byte, 200_000_000_000,
            "a new link once nobody held it"
        );
    }

    #[test]
    fn requests_queue_behind_each_other() {
        let p = Pacer::new(1_000_000_000); // 1 ns a byte
        let t0 = Instant::now();
        let a = p.reserve(1_000_000);
        let b = p.reserve(1_000_000);
        assert!(a >= t0 + Duration::from_millis(1));
        assert!(b >= a + Duration::from_millis(1));
    }
}
