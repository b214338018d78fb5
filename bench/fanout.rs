//! One heap buffer sent zero-copy to 8 peers over one protection domain: how many
//! bytes the sender's registration caches hold, and how many the process has pinned
//! (`VmPin`, verbs only: the emulated fabric pins nothing).
//!
//! ```text
//! cargo bench --bench fanout                                   # emulated fabric
//! scripts/softroce-vm -- env RCH_FABRIC=verbs target/release/deps/fanout-<hash>
//! ```
//!
//! The 8 receivers run in this process too, each in a domain of its own, reading into
//! their own buffers; their registrations are in `VmPin` but not in the sender's
//! caches. Prints one table; asserts nothing about speed.

use std::io::{IoSlice, IoSliceMut};
use std::thread;

use rdma_channel::fabric::any::AnyFabric;
use rdma_channel::fabric::Fabric;
use rdma_channel::{Config, Prepared};

const PEERS: usize = 8;
const LEN: usize = 4 << 20;

/// `VmPin` of this process in KiB (0 where the kernel does not report it).
fn vm_pin_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmPin:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> std::io::Result<()> {
    let hub = AnyFabric::from_env()?;
    let cfg = Config::default().with_zero_copy_private_threshold(Some(64 << 10));
    let pin_before = vm_pin_kib();
    let mut senders = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..PEERS {
        // The sending ends share the hub's domain; each receiver has its own.
        let a = Prepared::new(hub.clone(), cfg.clone())?;
        let b = Prepared::new(hub.for_connection()?, cfg.clone())?;
        let (ca, cb) = (a.card()?, b.card()?);
        senders.push(a.connect(cb)?);
        let mut rx = b.connect(ca)?;
        readers.push(thread::spawn(move || -> std::io::Result<Vec<u8>> {
            let mut got = vec![0u8; LEN];
            let mut n = 0;
            while n < LEN {
                n += rx.get(&mut [IoSliceMut::new(&mut got[n..])])?;
            }
            Ok(got)
        }));
    }
    let buf: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    for ch in &mut senders {
        let iov = [IoSlice::new(&buf)];
        loop {
            // SAFETY: `buf` is neither moved nor written until every peer has it.
            let n = unsafe { ch.sender().put_nocopy(&iov) }?;
            if n == LEN {
                break;
            }
            ch.sender().wait_zero_copy()?;
        }
    }
    for r in readers {
        let got = r.join().expect("reader thread")?;
        assert!(got == buf, "a peer received other bytes");
    }
    // Distinct caches only: connections that share a cache report the same one.
    let mut caches: Vec<*const ()> = Vec::new();
    let (mut entries, mut bytes) = (0, 0);
    for ch in &senders {
        let cache = ch.registration_cache() as *const _ as *const ();
        if !caches.contains(&cache) {
            caches.push(cache);
            let s = ch.cache_stats();
            entries += s.entries;
            bytes += s.bytes;
        }
    }
    let pinned = vm_pin_kib().saturating_sub(pin_before);
    println!(
        "fabric {}, one {} MiB heap buffer sent zero-copy to {PEERS} peers",
        hub.name(),
        LEN >> 20
    );
    println!("| sender caches | cached registrations | registered bytes | VmPin growth (KiB, both sides) |");
    println!("| --- | --- | --- | --- |");
    println!("| {} | {entries} | {bytes} | {pinned} |", caches.len());
    Ok(())
}
