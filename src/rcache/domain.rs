//! One registration cache per protection domain.
//!
//! Registrations belong to a domain, not to a connection: a buffer sent to N peers
//! over one domain needs one registration (one pinning on verbs), not N. Connections
//! look their domain's cache up here by [`Fabric::domain_id`]; the registry holds
//! only weak references, so a cache lives exactly as long as a connection or an
//! [`RdmaBuf`](super::RdmaBuf) of its domain.

use std::any::{Any, TypeId};
use std::sync::{Arc, Mutex, Weak};

use super::{CacheLimits, RegCache};
use crate::fabric::Fabric;

type Entry = (TypeId, usize, Weak<dyn Any + Send + Sync>);

static REGISTRY: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

impl<F: Fabric> RegCache<F> {
    /// The registration cache of `fabric`'s protection domain, made with `limits`
    /// (and the `RCH_RCACHE` policy, as [`RegCache::new`]) if the domain has none
    /// alive. An existing cache keeps the limits it was made with.
    ///
    /// ```
    /// use rdma_channel::fabric::emulated::EmuFabric;
    /// use rdma_channel::rcache::{CacheLimits, RegCache};
    /// use std::sync::Arc;
    /// let (a, b) = (EmuFabric::new()?, EmuFabric::new()?);
    /// let limits = CacheLimits::default();
    /// let c1 = RegCache::for_domain(&a, limits);
    /// assert!(Arc::ptr_eq(&c1, &RegCache::for_domain(&a.clone(), limits)));
    /// assert!(!Arc::ptr_eq(&c1, &RegCache::for_domain(&b, limits)));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn for_domain(fabric: &F, limits: CacheLimits) -> Arc<RegCache<F>> {
        let key = (TypeId::of::<F>(), fabric.domain_id());
        let mut registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        // Entries of dropped caches go first, so the list stays as long as the number
        // of live domains (and a reused address never finds a dead entry).
        registry.retain(|(_, _, weak)| weak.strong_count() > 0);
        let live = registry
            .iter()
            .filter(|(t, id, _)| (*t, *id) == key)
            .find_map(|(_, _, weak)| weak.upgrade()?.downcast::<RegCache<F>>().ok());
        if let Some(cache) = live {
            return cache;
        }
        let cache = Arc::new(RegCache::new(limits));
        let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(&cache) as _;
        registry.push((key.0, key.1, weak));
        cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::emulated::EmuFabric;

    #[test]
    fn a_dropped_domain_cache_is_made_anew() {
        let f = EmuFabric::new().unwrap();
        let limits = CacheLimits {
            max_entries: 3,
            max_bytes: 1 << 20,
        };
        let c = RegCache::for_domain(&f, limits);
        assert_eq!(c.limits(), limits);
        // A later request with other limits gets the live cache, limits unchanged.
        let same = RegCache::for_domain(&f, CacheLimits::default());
        assert!(Arc::ptr_eq(&c, &same));
        assert_eq!(same.limits(), limits);
        drop((c, same));
        let fresh = RegCache::for_domain(&f, CacheLimits::default());
        assert_eq!(fresh.limits(), CacheLimits::default());
    }
}
