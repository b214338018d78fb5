//! Tests of the verbs fabric on a real RDMA device (Soft-RoCE `rxe0` inside
//! `softroce-vm`). Without a device each test prints "no RDMA device: skipped" and
//! passes, unless `SOFTROCE_VM=1` says a device must be there, in which case it fails.

mod common;

use common::Rng;
use rdma_channel::fabric::verbs::{
    device_names, software_device_present, VerbsConfig, VerbsFabric, VerbsQp, VerbsRegion,
};
use rdma_channel::fabric::{
    Access, CompletedOp, Completion, CompletionStatus, Fabric, FabricError, MemoryRegion, Opcode,
    PendingQp, QpState, QueuePair, Sge, WorkRequest,
};
use rdma_channel::{Config, Prepared, RdmaStream};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(120);

/// Opens the fabric, or returns `None` (after saying so) on a host without RDMA.
fn fabric() -> Option<VerbsFabric> {
    match VerbsFabric::open() {
        Ok(f) => Some(f),
        Err(e)
            if e.kind() == io::ErrorKind::NotFound && e.to_string().contains("no RDMA device") =>
        {
            if std::env::var("SOFTROCE_VM").as_deref() == Ok("1") {
                panic!("SOFTROCE_VM=1 but there is no RDMA device: {e}");
            }
            println!("no RDMA device: skipped ({e})");
            None
        }
        Err(e) => panic!("opening the verbs fabric failed: {e}"),
    }
}

macro_rules! fabric_or_skip {
    () => {
        match fabric() {
            Some(f) => f,
            None => return,
        }
    };
}

fn connect(a: &VerbsFabric, b: &VerbsFabric) -> (VerbsQp, VerbsQp) {
    let (pa, pb) = (a.create_qp().unwrap(), b.create_qp().unwrap());
    let (ca, cb) = (pa.card().unwrap(), pb.card().unwrap());
    assert!(ca.fds.is_empty() && cb.fds.is_empty());
    (pa.connect(cb).unwrap(), pb.connect(ca).unwrap())
}

fn sge_of(r: &VerbsRegion, off: usize, len: usize) -> Sge {
    assert!(off + len <= r.len());
    Sge {
        // SAFETY: inside the region (asserted above).
        addr: unsafe { r.addr().add(off) },
        len: len as u32,
        lkey: r.lkey(),
    }
}

fn bytes(r: &VerbsRegion) -> &[u8] {
    // SAFETY: the region is mapped for its length; tests read it only when no request
    // targeting it is in flight.
    unsafe { std::slice::from_raw_parts(r.addr(), r.len()) }
}

fn fill(r: &VerbsRegion, seed: u64) {
    let mut rng = Rng::new(seed);
    // SAFETY: as in `bytes`, and nothing else writes the region meanwhile.
    let s = unsafe { std::slice::from_raw_parts_mut(r.addr(), r.len()) };
    for b in s {
        *b = rng.next_u64() as u8;
    }
}

const EMPTY: Completion = Completion {
    wr_id: u64::MAX,
    status: CompletionStatus::Success,
    op: CompletedOp::Write,
    byte_len: 0,
};

/// Polls until one completion arrives.
fn wait_one(qp: &VerbsQp) -> Completion {
    let start = Instant::now();
    let mut out = [EMPTY; 1];
    loop {
        if qp.poll(&mut out) == 1 {
            return out[0];
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no completion within {DEADLINE:?}"
        );
        std::thread::yield_now();
    }
}

fn write_wr<'a>(
    wr_id: u64,
    local: &'a [Sge],
    remote: &VerbsRegion,
    off: u64,
    inline: bool,
) -> WorkRequest<'a> {
    WorkRequest {
        wr_id,
        opcode: Opcode::Write {
            local,
            remote_addr: remote.remote().addr + off,
            rkey: remote.rkey(),
            inline,
        },
        signaled: true,
    }
}

/// Soft-RoCE devices (the VM's rxe) are recognised as software: the process group
/// then counts a CPU for the kernel's protocol work when it chooses its wait policy.
#[test]
fn soft_roce_is_a_software_device() {
    let _f = fabric_or_skip!();
    let names = device_names().expect("device names");
    let soft = names
        .iter()
        .any(|n| n.starts_with("rxe") || n.starts_with("siw"));
    assert_eq!(
        software_device_present(),
        soft,
        "devices {names:?}: software_device_present() disagrees"
    );
}

#[test]
fn open_and_caps() {
    let f = fabric_or_skip!();
    let caps = f.caps();
    println!(
        "device {} port {} gid[{}] = {:02x?} roce={} caps {caps:?}",
        f.device_name(),
        f.port(),
        f.gid_index(),
        f.gid(),
        f.is_roce()
    );
    assert_eq!(f.name(), "verbs");
    assert!(device_names().unwrap().iter().any(|n| n == f.device_name()));
    assert!(caps.max_send_wr >= 2 && caps.max_send_wr < usize::MAX);
    assert!(caps.max_sge >= 4 && caps.max_sge <= 30, "{caps:?}");
    assert!(caps.max_rd_atomic >= 1);
    if let Ok(i) = std::env::var("SOFTROCE_GID_INDEX") {
        assert_eq!(f.gid_index().to_string(), i);
    }
    // Inside the VM the GID in use (given or chosen automatically) holds SOFTROCE_IP.
    if let Some(ip) = std::env::var("SOFTROCE_IP")
        .ok()
        .and_then(|s| s.parse::<std::net::Ipv4Addr>().ok())
    {
        assert_eq!(f.gid(), ip.to_ipv6_mapped().octets(), "GID of {ip}");
    }

    // Clear errors for a device or port that does not exist.
    let e = VerbsFabric::open_with(VerbsConfig {
        device: Some("no-such-dev9".into()),
        ..VerbsConfig::default()
    })
    .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(e.to_string().contains("no-such-dev9"), "{e}");
    assert!(e.to_string().contains(f.device_name()), "{e}");
    let e = VerbsFabric::open_with(VerbsConfig {
        device: Some(f.device_name().into()),
        port: 9,
        ..VerbsConfig::default()
    })
    .unwrap_err();
    println!("port 9: {e}");
    assert!(e.to_string().contains("ibv_query_port"), "{e}");

    let r = f
        .alloc_region(10_000, Access::REMOTE_WRITE)
        .expect("alloc_region");
    assert_eq!(r.len(), 10_000);
    assert_eq!(r.addr() as usize % 4096, 0, "page aligned");
    assert!(bytes(&r).iter().all(|&b| b == 0), "zeroed");
    assert!(r
        .access()
        .contains(Access::REMOTE_WRITE | Access::LOCAL_WRITE));
    assert_ne!(r.rkey(), 0);
    let e = f.alloc_region(0, Access::LOCAL_WRITE).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);

    // A queue pair reports the same caps as the fabric (it asked for the same).
    let (qa, _qb) = connect(&f, &f);
    assert_eq!(qa.caps().max_inline, caps.max_inline);
    assert_eq!(qa.caps().max_send_wr, caps.max_send_wr);
    assert_eq!(qa.state(), QpState::ReadyToSend);

    // A card from another fabric is refused with InvalidData.
    let p = f.create_qp().unwrap();
    let e = p
        .connect(rdma_channel::fabric::Card {
            bytes: b"EMUL-not-a-verbs-card".to_vec(),
            fds: Vec::new(),
        })
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
}

#[test]
fn write_and_read_round_trip() {
    let a = fabric_or_skip!();
    let b = VerbsFabric::open().unwrap();
    let (qa, _qb) = connect(&a, &b);
    let max_inline = qa.caps().max_inline;

    // Source: caller memory registered with `register`.
    let mut src = vec![0u8; 256 << 10];
    let mut rng = Rng::new(1);
    src.iter_mut().for_each(|x| *x = rng.next_u64() as u8);
    // SAFETY: `src` outlives the region (dropped at the end of the test, after it).
    let src_mr = unsafe { a.register(src.as_mut_ptr(), src.len(), Access::LOCAL_WRITE) }.unwrap();
    let target = b
        .alloc_region(512 << 10, Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();

    // Gather write of three pieces, signalled.
    let sges = [
        sge_of(&src_mr, 0, 1000),
        sge_of(&src_mr, 5000, 100_000),
        sge_of(&src_mr, 200_000, 56_000),
    ];
    // SAFETY: the gather list lies in `src_mr`, which outlives the request.
    unsafe { qa.post(&write_wr(7, &sges, &target, 64, false)) }.unwrap();
    let c = wait_one(&qa);
    assert_eq!(
        (c.wr_id, c.status, c.op),
        (7, CompletionStatus::Success, CompletedOp::Write)
    );
    assert_eq!(c.byte_len, 157_000);
    let t = bytes(&target);
    assert_eq!(&t[64..1064], &src[0..1000]);
    assert_eq!(&t[1064..101_064], &src[5000..105_000]);
    assert_eq!(&t[101_064..157_064], &src[200_000..256_000]);
    assert!(t[..64].iter().all(|&x| x == 0));
    assert!(t[157_064..].iter().all(|&x| x == 0));

    // Inline write from unregistered stack memory, up to max_inline.
    if max_inline > 0 {
        let word: Vec<u8> = (0..max_inline.min(200)).map(|i| i as u8 ^ 0x5a).collect();
        let sge = [Sge {
            addr: word.as_ptr() as *mut u8,
            len: word.len() as u32,
            lkey: 0,
        }];
        // SAFETY: inline: the provider copies the bytes during the call.
        unsafe { qa.post(&write_wr(8, &sge, &target, 300_000, true)) }.unwrap();
        assert_eq!(wait_one(&qa).status, CompletionStatus::Success);
        assert_eq!(&bytes(&target)[300_000..300_000 + word.len()], &word[..]);
        let long = vec![0u8; max_inline + 1];
        let sge = [Sge {
            addr: long.as_ptr() as *mut u8,
            len: long.len() as u32,
            lkey: 0,
        }];
        // SAFETY: refused before anything is posted.
        let e = unsafe { qa.post(&write_wr(9, &sge, &target, 0, true)) }.unwrap_err();
        assert!(matches!(e, FabricError::InvalidRequest(_)), "{e}");
    }

    // Many unsignalled writes, then a signalled one retires them all.
    for i in 0..100u64 {
        let sge = [sge_of(&src_mr, i as usize * 100, 100)];
        let mut wr = write_wr(100 + i, &sge, &target, 400_000 + i * 100, false);
        wr.signaled = i == 99;
        // SAFETY: the gather list lies in `src_mr`, which outlives the requests.
        unsafe { qa.post(&wr) }.unwrap();
    }
    let c = wait_one(&qa);
    assert_eq!((c.wr_id, c.status), (199, CompletionStatus::Success));
    assert_eq!(&bytes(&target)[400_000..410_000], &src[..10_000]);

    // RDMA READ back into local memory (scatter in two pieces).
    let back = a.alloc_region(200_000, Access::LOCAL_WRITE).unwrap();
    let scatter = [sge_of(&back, 0, 50_000), sge_of(&back, 100_000, 50_000)];
    let wr = WorkRequest {
        wr_id: 11,
        opcode: Opcode::Read {
            local: &scatter,
            remote_addr: target.remote().addr + 64,
            rkey: target.rkey(),
        },
        signaled: true,
    };
    // SAFETY: the scatter list lies in `back`, unaliased until the completion.
    unsafe { qa.post(&wr) }.unwrap();
    let c = wait_one(&qa);
    assert_eq!(
        (c.wr_id, c.status, c.op),
        (11, CompletionStatus::Success, CompletedOp::Read)
    );
    assert_eq!(c.byte_len, 100_000);
    let bk = bytes(&back);
    assert_eq!(&bk[..50_000], &bytes(&target)[64..50_064]);
    assert_eq!(&bk[100_000..150_000], &bytes(&target)[50_064..100_064]);
    assert_eq!(qa.state(), QpState::ReadyToSend);
    drop(src_mr);
    drop(src);
}

#[test]
fn bad_rkey_is_a_remote_access_error() {
    let a = fabric_or_skip!();
    let b = VerbsFabric::open().unwrap();
    let (qa, _qb) = connect(&a, &b);
    let src = a.alloc_region(4096, Access::LOCAL_WRITE).unwrap();
    fill(&src, 3);
    let target = b.alloc_region(4096, Access::REMOTE_WRITE).unwrap();
    let sges = [sge_of(&src, 0, 64)];
    let wr = WorkRequest {
        wr_id: 1,
        opcode: Opcode::Write {
            local: &sges,
            remote_addr: target.remote().addr,
            rkey: target.rkey() ^ 0x5a5a_0000,
            inline: false,
        },
        signaled: false, // errors complete even when unsignalled
    };
    // SAFETY: the gather list lies in `src`, which outlives the request.
    unsafe { qa.post(&wr) }.unwrap();
    let c = wait_one(&qa);
    assert_eq!(c.wr_id, 1);
    assert_eq!(c.status, CompletionStatus::RemoteAccessError);
    assert_eq!(qa.state(), QpState::Error);
    let why = qa.last_error().expect("a reason");
    println!("last_error: {why}");
    assert!(why.contains("remote access error"), "{why}");
    assert!(
        bytes(&target).iter().all(|&x| x == 0),
        "nothing was written"
    );

    // Later requests are flushed (or refused), and the state stays Error.
    let wr2 = write_wr(2, &sges, &target, 0, false);
    // SAFETY: as above.
    match unsafe { qa.post(&wr2) } {
        Ok(()) => assert_eq!(wait_one(&qa).status, CompletionStatus::Flushed),
        Err(e) => println!("post after the error was refused: {e}"),
    }
    std::thread::sleep(Duration::from_millis(2));
    assert_eq!(qa.state(), QpState::Error);

    // Out of bounds on a fresh connection is a remote access error too.
    let (qc, _qd) = connect(&a, &b);
    let wr = write_wr(3, &sges, &target, 4096 - 32, false);
    // SAFETY: as above.
    unsafe { qc.post(&wr) }.unwrap();
    assert_eq!(wait_one(&qc).status, CompletionStatus::RemoteAccessError);
    assert_eq!(qc.state(), QpState::Error);
}

/// Byte `i` of the test stream.
fn stream_byte(i: u64) -> u8 {
    (common::mix64(i / 8) >> ((i % 8) * 8)) as u8
}

#[test]
fn engine_end_to_end() {
    let fa = fabric_or_skip!();
    let fb = VerbsFabric::open().unwrap();
    let cfg = Config::default()
        .with_ring_size(1 << 20)
        .with_chunk_size(64 << 10);
    let a = Prepared::new(fa, cfg.clone()).unwrap();
    let b = Prepared::new(fb, cfg).unwrap();
    let (card_a, card_b) = (a.card().unwrap(), b.card().unwrap());
    let a = a.connect(card_b).unwrap();
    let b = b.connect(card_a).unwrap();
    let (_arx, mut atx) = a.split();
    let (mut brx, _btx) = b.split();
    const TOTAL: u64 = 4 << 20;
    let start = Instant::now();
    let sender = std::thread::spawn(move || {
        let mut rng = Rng::new(42);
        let mut pos = 0u64;
        let mut buf = Vec::new();
        while pos < TOTAL {
            let n = rng.log_uniform(1, 256 << 10).min((TOTAL - pos) as usize);
            buf.clear();
            buf.extend((pos..pos + n as u64).map(stream_byte));
            let mut off = 0;
            while off < n {
                // Split the buffer in two iovecs to exercise gather lists.
                let mid = off + (n - off) / 3;
                let put = atx
                    .put(&[IoSlice::new(&buf[off..mid]), IoSlice::new(&buf[mid..n])])
                    .unwrap();
                off += put;
                if put == 0 {
                    assert!(
                        start.elapsed() < DEADLINE,
                        "sender stuck at {}",
                        pos + off as u64
                    );
                    std::thread::yield_now();
                }
            }
            pos += n as u64;
        }
        atx.close().unwrap();
        atx
    });
    let mut rng = Rng::new(7);
    let mut pos = 0u64;
    let mut buf = vec![0u8; 256 << 10];
    while pos < TOTAL {
        let n = rng.log_uniform(1, buf.len());
        let got = brx.get(&mut [IoSliceMut::new(&mut buf[..n])]).unwrap();
        for (k, &x) in buf[..got].iter().enumerate() {
            let i = pos + k as u64;
            assert_eq!(x, stream_byte(i), "byte {i}");
        }
        pos += got as u64;
        if got == 0 {
            assert!(start.elapsed() < DEADLINE, "receiver stuck at {pos}");
            std::thread::yield_now();
        }
    }
    let _atx = sender.join().unwrap();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "moved {} MiB in {secs:.2} s ({:.1} MB/s)",
        TOTAL >> 20,
        TOTAL as f64 / secs / 1e6
    );
}

/// Opens the fabric with wakes on, whatever the machine's CPU count.
fn fabric_with_wakes() -> VerbsFabric {
    VerbsFabric::open_with(VerbsConfig {
        wake: true,
        ..VerbsConfig::from_env().unwrap()
    })
    .unwrap()
}

/// Wakes at the fabric: a waiter that armed and blocks is woken by the peer's write
/// (not by its timeout, which is far longer), and a flood of writes that nobody
/// reaps stays within the receive queue's budget: none fails, none is lost; the
/// waiter's first arm after it says it cannot be counted on, and wakes resume.
#[test]
fn wakes_wake_a_blocked_waiter_and_a_flood_stays_within_budget() {
    let _ = fabric_or_skip!();
    let (a, b) = (fabric_with_wakes(), fabric_with_wakes());
    let (mut pa, mut pb) = (a.create_qp().unwrap(), b.create_qp().unwrap());
    assert!(pa.accept_wakes().unwrap() && pb.accept_wakes().unwrap());
    let (ca, cb) = (pa.card().unwrap(), pb.card().unwrap());
    let (qa, qb) = (pa.connect(cb).unwrap(), pb.connect(ca).unwrap());
    qa.send_wakes();
    qb.send_wakes();
    let src = a.alloc_region(4096, Access::LOCAL_WRITE).unwrap();
    fill(&src, 3);
    let target = b.alloc_region(64 << 10, Access::REMOTE_WRITE).unwrap();

    // 1. Blocked until a write lands 200 ms later, well before the 30 s timeout.
    let token = qb.arm_wake().expect("b takes wakes");
    let sges = [sge_of(&src, 0, 64)];
    let waited = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            // SAFETY: `src` outlives the request (it is waited for below).
            unsafe { qa.post(&write_wr(1, &sges, &target, 0, false)) }.unwrap();
        });
        let start = Instant::now();
        qb.block_wake(token, Duration::from_secs(30));
        start.elapsed()
    });
    assert!(
        waited < Duration::from_secs(20),
        "the write did not wake the waiter ({waited:?})"
    );
    assert_eq!(qb.wakes_taken(), 1);
    assert_eq!(wait_one(&qa).status, CompletionStatus::Success);
    assert_eq!(&bytes(&target)[..64], &bytes(&src)[..64]);

    // 2. 5000 writes (five times b's receives) while b reaps none: past the budget
    // they go without immediate data, so none waits for a receive.
    const FLOOD: u64 = 5000;
    for i in 0..FLOOD {
        let sges = [sge_of(&src, (i % 64) as usize * 64, 64)];
        let signaled = i % 64 == 63;
        let wr = WorkRequest {
            signaled,
            ..write_wr(100 + i, &sges, &target, (i % 1024) * 64, true)
        };
        loop {
            // SAFETY: inline: the memory need only be valid during the call.
            match unsafe { qa.post(&wr) } {
                Ok(()) => break,
                Err(FabricError::QueueFull) => {
                    let mut out = [EMPTY; 16];
                    let n = qa.poll(&mut out);
                    assert!(out[..n]
                        .iter()
                        .all(|c| c.status == CompletionStatus::Success));
                }
                Err(e) => panic!("post {i}: {e}"),
            }
        }
    }
    let sent = qa.wakes_sent();
    assert!(
        (1..1024).contains(&sent),
        "{sent} of {FLOOD} writes carried wakes; the budget is below 1024"
    );
    // b reaps (its waits and polls do), tells a, and a's wakes flow again. The
    // arm that finds the budget spent is not to be counted on (writes of a's
    // without immediate data may still be in flight): it says so.
    assert_eq!(
        qb.arm_wake(),
        None,
        "an arm after the peer spent its budget must not be counted on"
    );
    let mut out = [EMPTY; 16];
    let start = Instant::now();
    while qa.wakes_sent() == sent {
        // SAFETY: inline.
        let _ = unsafe { qa.post(&write_wr(9, &[sge_of(&src, 0, 8)], &target, 0, true)) };
        let _ = qa.poll(&mut out);
        match qb.arm_wake() {
            Some(t) => qb.block_wake(t, Duration::from_millis(1)),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
        assert!(start.elapsed() < DEADLINE, "the budget never refilled");
    }
    // Told, a's writes carry wakes again, and b's arms are counted on.
    assert!(
        qb.arm_wake().is_some(),
        "the arms stay uncounted after the report"
    );
    assert_eq!(qa.state(), QpState::ReadyToSend, "{:?}", qa.last_error());
    assert_eq!(qb.state(), QpState::ReadyToSend, "{:?}", qb.last_error());
}

/// The engine on wakes: both ends wait by blocking (one poll, then the channel),
/// in both directions at once, messages with pauses between them and bursts past
/// the wake budget; every byte arrives in order.
#[test]
fn engine_waits_block_on_wakes() {
    let _ = fabric_or_skip!();
    let policy = rdma_channel::config::WaitPolicy {
        spin: 1,
        yields: 0,
        short_sleep_max: Duration::from_millis(1),
        sleep_max: Duration::from_millis(1),
    };
    let cfg = Config::default()
        .with_ring_size(64 << 10)
        .with_chunk_size(4 << 10)
        .with_wait_policy(policy);
    let a = Prepared::new(fabric_with_wakes(), cfg.clone()).unwrap();
    let b = Prepared::new(fabric_with_wakes(), cfg).unwrap();
    let (card_a, card_b) = (a.card().unwrap(), b.card().unwrap());
    let (mut a, mut b) = (a.connect(card_b).unwrap(), b.connect(card_a).unwrap());
    assert!(a.sender().wakes() && b.sender().wakes());
    // a -> b and b -> a at once, each end's writer and reader in its own thread.
    let run = |tx: &mut rdma_channel::Sender<VerbsFabric>,
               rx: &mut rdma_channel::Receiver<VerbsFabric>,
               seed: u64| {
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut rng = Rng::new(seed);
                let mut pos = 0u64;
                for m in 0..300u64 {
                    let n = if m % 50 < 40 {
                        8
                    } else {
                        rng.log_uniform(1, 20_000)
                    };
                    let buf: Vec<u8> = (pos..pos + n as u64).map(stream_byte).collect();
                    let mut off = 0;
                    while off < n {
                        off += tx.put(&[IoSlice::new(&buf[off..])]).unwrap();
                        if off < n {
                            tx.wait_writable().unwrap();
                        }
                    }
                    pos += n as u64;
                    if m % 50 == 49 {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                tx.close().unwrap();
            });
            let mut pos = 0u64;
            let mut buf = vec![0u8; 8192];
            loop {
                match rx.wait_readable() {
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                    r => r.unwrap(),
                }
                let got = rx.get(&mut [IoSliceMut::new(&mut buf)]).unwrap();
                for (k, &x) in buf[..got].iter().enumerate() {
                    assert_eq!(x, stream_byte(pos + k as u64), "byte {}", pos + k as u64);
                }
                pos += got as u64;
            }
            assert!(pos > 0);
        })
    };
    let (mut arx, mut atx) = a.split();
    let (mut brx, mut btx) = b.split();
    std::thread::scope(|s| {
        s.spawn(|| run(&mut atx, &mut brx, 1));
        s.spawn(|| run(&mut btx, &mut arx, 2));
    });
}

/// Opens the fabric as `RCH_IB_WAKE=select` does: connections take wakes for
/// selectors and async tasks, blocking waits still sleep on a timer.
fn fabric_taking_wakes() -> VerbsFabric {
    VerbsFabric::open_with(VerbsConfig {
        wake: false,
        take_wakes: true,
        ..VerbsConfig::from_env().unwrap()
    })
    .unwrap()
}

/// Rounds of `a_selector_on_verbs_sleeps_on_the_completion_channels`.
const VERBS_SELECT_ROUNDS: usize = 6;
/// Bytes of its flood, in 8-byte writes (3x the 1,024 wakes of a budget).
const VERBS_FLOOD: usize = 3 * 1024 * 8;
/// What tells its writer thread to flood instead of writing one byte.
const FLOOD_SIGNAL: usize = usize::MAX;

/// A `Selector` over four verbs streams taking wakes (`RCH_IB_WAKE=select`) sleeps
/// on their completion channels: each round a writer thread waits until the selector is inside its
/// sleep (past its spin, 50 ms later), writes one byte on a round-robin stream,
/// and the select must name exactly that stream and the wake must have come
/// through a channel (counted by `Selector::wakes`; without it each sleep would
/// end only by the selector's 250 ms safety bound, counting none). Half way, a
/// flood past the peer's budget of wakes, read without a select, must not stop
/// them (the rounds after it are woken too). Then the other
/// way: a writer whose ring is full waits with a selector for room, which the
/// reader's credit answer (a write, so a wake) makes.
#[test]
fn a_selector_on_verbs_sleeps_on_the_completion_channels() {
    let _ = fabric_or_skip!();
    use rdma_channel::select::{Interest, Select, Selector};
    let cfg = Config::default()
        .with_ring_size(64 << 10)
        .with_chunk_size(4 << 10);
    let (mut near, mut far): (Vec<RdmaStream<VerbsFabric>>, Vec<RdmaStream<VerbsFabric>>) = (0..4)
        .map(|_| {
            let (sa, sb) = UnixStream::pair().unwrap();
            let c = cfg.clone();
            let t = std::thread::spawn(move || {
                RdmaStream::handshake(fabric_taking_wakes(), &sb, c).unwrap()
            });
            let a = RdmaStream::handshake(fabric_taking_wakes(), &sa, cfg.clone()).unwrap();
            (a, t.join().unwrap())
        })
        .unzip();
    // Wakes for the selector only: the streams' own blocking waits still sleep.
    assert!(!near[0].channel().sender().wakes() && !far[0].channel().sender().wakes());
    let (go_tx, go_rx) = std::sync::mpsc::channel::<usize>();
    let writer = std::thread::spawn(move || {
        while let Ok(i) = go_rx.recv() {
            if i == FLOOD_SIGNAL {
                for _ in 0..VERBS_FLOOD / 8 {
                    far[2].write_all(&[0xf1; 8]).unwrap();
                    far[2].flush().unwrap();
                }
                continue;
            }
            std::thread::sleep(Duration::from_millis(50));
            far[i].write_all(&[i as u8]).unwrap();
            far[i].flush().unwrap();
        }
        far
    });
    let mut selector = Selector::new().unwrap();
    let mut wakes_before_flood = 0;
    for round in 0..VERBS_SELECT_ROUNDS {
        if round == VERBS_SELECT_ROUNDS / 2 {
            wakes_before_flood = selector.wakes();
            // A flood past the peer's budget of wakes (1024 receives), read without
            // a select: the next arm finds the budget spent, naps once, and the
            // wakes must come back.
            go_tx.send(FLOOD_SIGNAL).unwrap();
            let mut got = vec![0u8; VERBS_FLOOD];
            near[2].read_exact(&mut got).unwrap();
            assert!(got.iter().all(|&b| b == 0xf1), "flood bytes");
        }
        go_tx.send(round % 4).unwrap();
        let mut items: Vec<Select<'_>> = near
            .iter_mut()
            .map(|s| Select::new(s, Interest::READABLE))
            .collect();
        let n = selector.select(&mut items, Some(DEADLINE)).unwrap();
        let which: Vec<usize> = (0..4).filter(|&i| items[i].ready().is_readable()).collect();
        drop(items);
        assert_eq!((n, which), (1, vec![round % 4]), "round {round}");
        let mut one = [0u8; 1];
        near[round % 4].read_exact(&mut one).unwrap();
        assert_eq!(usize::from(one[0]), round % 4);
    }
    drop(go_tx);
    let mut far = writer.join().unwrap();
    let read_wakes = selector.wakes();
    let after_flood = read_wakes - wakes_before_flood;
    println!("selector on verbs: {after_flood} wakes in the rounds after the flood");
    assert!(after_flood >= 1, "no wake after the flood spent the budget");
    println!("selector on verbs: {read_wakes} wakes in {VERBS_SELECT_ROUNDS} rounds");
    assert!(read_wakes >= 1, "no wake came through a completion channel");

    // Room: fill near[1]'s ring, then wait for it to be writable while far[1]
    // drains it 50 ms later.
    let block = vec![7u8; 16 << 10];
    let mut queued = 0usize;
    loop {
        let n = near[1].put(&[IoSlice::new(&block)]).unwrap();
        queued += n;
        if n == 0 {
            break;
        }
    }
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        let mut got = vec![0u8; queued];
        far[1].read_exact(&mut got).unwrap();
        assert!(got.iter().all(|&b| b == 7));
        far
    });
    let mut items = [Select::new(&mut near[1], Interest::WRITABLE)];
    let n = selector.select(&mut items, Some(DEADLINE)).unwrap();
    assert_eq!(n, 1);
    assert!(items[0].ready().is_writable());
    let mut far = reader.join().unwrap();
    let room_wakes = selector.wakes() - read_wakes;
    println!("selector on verbs: {room_wakes} wakes waiting for room");
    assert!(room_wakes >= 1, "the credit answer woke no selector");

    // An outer poll loop: arm, then poll(2) the selector's one descriptor (which
    // holds the connections' completion channels); a write 50 ms later must make
    // it readable (without them it would time out), and a zero-timeout select
    // must name the stream. Twice, so that the second arm takes the first's event.
    use std::os::fd::AsFd;
    for round in 0..2 {
        let mut items: Vec<Select<'_>> = near
            .iter_mut()
            .map(|s| Select::new(s, Interest::READABLE))
            .collect();
        assert_eq!(selector.arm(&mut items).unwrap(), 0, "round {round}");
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            far[3].write_all(b"o").unwrap();
            far[3].flush().unwrap();
            far
        });
        let mut p = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&selector.as_fd()),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call.
        let r = unsafe { libc::poll(&mut p, 1, DEADLINE.as_millis() as i32) };
        assert_eq!(
            r, 1,
            "round {round}: the selector's descriptor did not fire"
        );
        let n = selector.select(&mut items, Some(Duration::ZERO)).unwrap();
        assert_eq!(n, 1, "round {round}");
        assert!(items[3].ready().is_readable());
        drop(items);
        far = writer.join().unwrap();
        let mut one = [0u8; 1];
        near[3].read_exact(&mut one).unwrap();
    }
}

/// Async streams on verbs with wakes park on the connection's completion channel:
/// an echo of 256 KiB messages through 64 KiB rings, both ends tasks of one thread,
/// where every read waits for data and every write for room. The runtime has no
/// timer, so a wait that fell back to timer naps (as without the channel) would
/// panic; every byte is checked.
#[cfg(feature = "tokio")]
#[test]
fn async_streams_on_verbs_park_on_the_completion_channel() {
    let _ = fabric_or_skip!();
    use rdma_channel::tokio::AsyncStream;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const MESSAGE: usize = 256 << 10;
    const ROUNDS: u64 = 8;
    let cfg = Config::default()
        .with_ring_size(64 << 10)
        .with_chunk_size(4 << 10);
    let (sa, sb) = UnixStream::pair().unwrap();
    let c = cfg.clone();
    let t =
        std::thread::spawn(move || RdmaStream::handshake(fabric_taking_wakes(), &sb, c).unwrap());
    let a = RdmaStream::handshake(fabric_taking_wakes(), &sa, cfg).unwrap();
    let b = t.join().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut a = AsyncStream::new(a).unwrap();
        let mut b = AsyncStream::new(b).unwrap();
        let echo = tokio::spawn(async move {
            let mut buf = vec![0u8; MESSAGE];
            for _ in 0..ROUNDS {
                b.read_exact(&mut buf).await.unwrap();
                b.write_all(&buf).await.unwrap();
            }
        });
        let mut back = vec![0u8; MESSAGE];
        for round in 0..ROUNDS {
            let pos = round * MESSAGE as u64;
            let msg: Vec<u8> = (pos..pos + MESSAGE as u64).map(stream_byte).collect();
            // The echo reads as this writes: both wait for each other's rings.
            a.write_all(&msg).await.unwrap();
            a.read_exact(&mut back).await.unwrap();
            assert!(back == msg, "round {round}: the echo differs");
        }
        echo.await.unwrap();
    });
}

#[test]
fn stream_handshake_over_unix_socket() {
    let f = fabric_or_skip!();
    let (sa, sb) = UnixStream::pair().unwrap();
    let cfg = Config::default()
        .with_ring_size(256 << 10)
        .with_chunk_size(32 << 10);
    let cfg2 = cfg.clone();
    const TOTAL: usize = 2 << 20;
    let peer = std::thread::spawn(move || {
        let fb = VerbsFabric::open().unwrap();
        let mut s = RdmaStream::handshake(fb, &sb, cfg2).unwrap();
        let mut got = vec![0u8; TOTAL];
        s.read_exact(&mut got).unwrap();
        // Echo a digest back.
        let sum: u64 = got.iter().map(|&x| u64::from(x)).sum();
        s.write_all(&sum.to_le_bytes()).unwrap();
        s.flush().unwrap();
        got
    });
    let mut s = RdmaStream::handshake(f, &sa, cfg).unwrap();
    let data: Vec<u8> = (0..TOTAL as u64).map(stream_byte).collect();
    s.write_all(&data).unwrap();
    s.flush().unwrap();
    let mut sum = [0u8; 8];
    s.read_exact(&mut sum).unwrap();
    let got = peer.join().unwrap();
    assert!(got == data, "payload differs");
    assert_eq!(
        u64::from_le_bytes(sum),
        data.iter().map(|&x| u64::from(x)).sum::<u64>()
    );
}

#[test]
fn peer_gone_is_a_transport_error() {
    let a = fabric_or_skip!();
    let b = VerbsFabric::open().unwrap();
    let (qa, qb) = connect(&a, &b);
    let src = a.alloc_region(4096, Access::LOCAL_WRITE).unwrap();
    let target = b.alloc_region(4096, Access::REMOTE_WRITE).unwrap();
    drop(qb);
    let sges = [sge_of(&src, 0, 64)];
    let start = Instant::now();
    // SAFETY: the gather list lies in `src`, which outlives the request.
    unsafe { qa.post(&write_wr(5, &sges, &target, 0, false)) }.unwrap();
    let c = wait_one(&qa);
    println!(
        "write to a destroyed QP: {:?} after {:?}: {}",
        c.status,
        start.elapsed(),
        qa.last_error().unwrap_or_default()
    );
    assert_eq!(c.wr_id, 5);
    assert_eq!(c.status, CompletionStatus::TransportError);
    assert_eq!(qa.state(), QpState::Error);
}

#[test]
fn raw_write_bandwidth() {
    let a = fabric_or_skip!();
    let b = VerbsFabric::open().unwrap();
    let (qa, _qb) = connect(&a, &b);
    const MSG: usize = 64 << 10;
    const COUNT: u64 = 64;
    let src = a.alloc_region(MSG, Access::LOCAL_WRITE).unwrap();
    fill(&src, 9);
    let target = b.alloc_region(MSG, Access::REMOTE_WRITE).unwrap();
    let depth = qa.caps().max_send_wr as u64;
    let interval = (depth / 2).clamp(1, 16);
    let sges = [sge_of(&src, 0, MSG)];
    let start = Instant::now();
    let (mut posted, mut retired) = (0u64, 0u64);
    let mut out = [EMPTY; 8];
    while retired < COUNT {
        if posted < COUNT && posted - retired < depth {
            let mut wr = write_wr(posted, &sges, &target, 0, false);
            wr.signaled = posted % interval == interval - 1 || posted == COUNT - 1;
            // SAFETY: the gather list lies in `src`, which outlives the requests.
            match unsafe { qa.post(&wr) } {
                Ok(()) => posted += 1,
                Err(FabricError::QueueFull) => {}
                Err(e) => panic!("post: {e}"),
            }
        }
        let n = qa.poll(&mut out);
        for c in &out[..n] {
            assert_eq!(c.status, CompletionStatus::Success);
            retired = c.wr_id + 1;
        }
        assert!(start.elapsed() < DEADLINE);
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{COUNT} x {} KiB RDMA WRITE: {:.1} MB/s",
        MSG >> 10,
        (COUNT as usize * MSG) as f64 / secs / 1e6
    );
    assert_eq!(bytes(&target), bytes(&src));
}

// -------------------------------------------------------------------------------------
// The channel's model and two-process tests, on the verbs fabric
// -------------------------------------------------------------------------------------

/// Payload for a put of `n` bytes whose packet will start at ring position `head`:
/// random bytes, or bytes laid out as header and trailer words for this and the next
/// laps of a ring of `ring` bytes (the values the receiver must never be fooled by).
fn model_payload(rng: &mut Rng, n: usize, head: u64, ring: u64) -> Vec<u8> {
    use rdma_channel::ring::wire::{header_match, trailer_word};
    let mut v = rng.bytes(n);
    if rng.below(2) == 0 {
        for (k, w) in v.chunks_mut(8).enumerate() {
            let pos = head + 64 * (k as u64 / 2 + 1) + ring * rng.below(3);
            let word = if k % 2 == 0 {
                trailer_word(pos)
            } else {
                header_match(pos) | (3 << 32)
            };
            let bytes = word.to_le_bytes();
            w.copy_from_slice(&bytes[..w.len()]);
        }
    }
    v
}

/// Random put/get sequences in both directions of a verbs connection, checked against
/// a `VecDeque` model per direction; random ring, chunk, threshold and inline limit
/// per case (the staging path included). Deterministic (seeded), bounded in time.
#[test]
fn model_random_sequences_on_verbs() {
    use std::collections::VecDeque;
    let f = fabric_or_skip!();
    let cases = std::env::var("RCH_TEST_VERBS_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60u64);
    let start = Instant::now();
    for case in 0..cases {
        let mut rng = Rng::new(0x5eed_0000 + case);
        let ring = 4096usize << rng.below(5); // 4 KiB .. 64 KiB
        let chunk = (128 + 64 * rng.below((ring as u64 / 2 - 128) / 64 + 1)) as usize;
        let mut cfg = Config::default()
            .with_ring_size(ring)
            .with_chunk_size(chunk)
            .with_tail_threshold(1 + rng.below(ring as u64 - 64) as usize);
        if rng.below(3) == 0 {
            cfg = cfg.with_max_inline(64 + rng.below(1000) as usize);
        }
        let a = Prepared::new(f.clone(), cfg.clone()).unwrap();
        let b = Prepared::new(f.clone(), cfg.clone()).unwrap();
        let (ca, cb) = (a.card().unwrap(), b.card().unwrap());
        let mut ends = [a.connect(cb).unwrap(), b.connect(ca).unwrap()];
        let mut model = [VecDeque::new(), VecDeque::new()];
        for _ in 0..40 {
            let from = rng.below(2) as usize;
            let to = 1 - from;
            if rng.below(2) == 0 {
                let n = rng.log_uniform(1, 3 * ring);
                let head = ends[from].sender().position();
                let data = model_payload(&mut rng, n, head, ring as u64);
                let cut = rng.range(0, n);
                let iov = [IoSlice::new(&data[..cut]), IoSlice::new(&data[cut..])];
                let took = ends[from].put(&iov).unwrap();
                assert!(took <= n, "case {case}: put took {took} of {n}");
                model[from].extend(&data[..took]);
            } else {
                let want = rng.log_uniform(1, 3 * ring);
                let mut buf = vec![0u8; want];
                // Data is placed when put returns, but give the completion a moment.
                let mut got = ends[to].get(&mut [IoSliceMut::new(&mut buf)]).unwrap();
                if got == 0 && !model[from].is_empty() {
                    let t = Instant::now();
                    while got == 0 && t.elapsed() < Duration::from_secs(10) {
                        got = ends[to].get(&mut [IoSliceMut::new(&mut buf)]).unwrap();
                    }
                }
                assert!(
                    got <= model[from].len(),
                    "case {case}: got {got} bytes nobody put"
                );
                let expect: Vec<u8> = model[from].drain(..got).collect();
                assert!(
                    buf[..got] == expect[..],
                    "case {case}: {got} bytes differ from the model"
                );
            }
        }
        // Drain both directions.
        for (from, queue) in model.iter_mut().enumerate() {
            let to = 1 - from;
            let t = Instant::now();
            let mut buf = vec![0u8; 64 << 10];
            while !queue.is_empty() {
                assert!(
                    t.elapsed() < Duration::from_secs(30),
                    "case {case}: drain stuck"
                );
                let got = ends[to].get(&mut [IoSliceMut::new(&mut buf)]).unwrap();
                let expect: Vec<u8> = queue.drain(..got).collect();
                assert!(
                    buf[..got] == expect[..],
                    "case {case}: drained bytes differ"
                );
            }
        }
        assert!(
            start.elapsed() < DEADLINE * 2,
            "model test too slow: case {case}"
        );
    }
    println!("{cases} cases in {:.1} s", start.elapsed().as_secs_f64());
}

const VERBS_ROLE: &str = "RCH_TEST_VERBS_ROLE";
const VERBS_SOCKET: &str = "RCH_TEST_VERBS_SOCKET";

/// Sends `total` bytes of stream `seed` in random message sizes (some vectored) on
/// `w`, and reads `total` bytes of stream `peer_seed` from `r`, returning the checksum
/// of what it read and of what it expected.
fn exchange_checked(
    s: RdmaStream<VerbsFabric>,
    seed: u64,
    peer_seed: u64,
    total: u64,
) -> (u64, u64) {
    let (mut r, mut w) = s.split();
    let writer = std::thread::spawn(move || {
        let mut rng = Rng::new(seed);
        let mut sent = 0u64;
        while sent < total {
            let n = rng.log_uniform(1, 1 << 20).min((total - sent) as usize);
            let msg = rng.bytes(n);
            let cut = rng.range(0, n);
            let mut off = 0;
            while off < n {
                let iov = if off < cut {
                    vec![IoSlice::new(&msg[off..cut]), IoSlice::new(&msg[cut..])]
                } else {
                    vec![IoSlice::new(&msg[off..])]
                };
                off += w.write_vectored(&iov).unwrap();
            }
            sent += n as u64;
        }
        w
    });
    let mut expect = Rng::new(peer_seed);
    let (mut want_sum, mut got_sum) = (0u64, 0u64);
    let mut got = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while got < total {
        let n = expect.log_uniform(1, 1 << 20).min((total - got) as usize);
        want_sum = common::fnv1a(want_sum, &expect.bytes(n));
        // The writer also drew where to split the message into two iovecs.
        let _ = expect.range(0, n);
        r.read_exact(&mut buf[..n]).unwrap();
        got_sum = common::fnv1a(got_sum, &buf[..n]);
        got += n as u64;
    }
    let _w = writer.join().unwrap();
    (got_sum, want_sum)
}

/// The child side of `two_processes_exchange_on_verbs`.
#[test]
fn verbs_two_process_child() {
    if std::env::var(VERBS_ROLE).as_deref() != Ok("child") {
        return;
    }
    let sock = UnixStream::connect(std::env::var(VERBS_SOCKET).unwrap()).unwrap();
    let total: u64 = std::env::var("RCH_TEST_VERBS_BYTES")
        .unwrap()
        .parse()
        .unwrap();
    let s = RdmaStream::handshake(VerbsFabric::open().unwrap(), &sock, verbs_exchange_config())
        .unwrap();
    let (got, want) = exchange_checked(s, 2, 1, total);
    assert_eq!(got, want, "child: checksum of received bytes");
}

fn verbs_exchange_config() -> Config {
    Config::default()
        .with_ring_size(1 << 20)
        .with_chunk_size(64 << 10)
}

/// Two processes on one RDMA device exchange `RCH_TEST_VERBS_BYTES` (default 64 MiB;
/// rxe under emulation moves ~35 MB/s) each way at once in random message sizes,
/// checked by checksums of the regenerated streams.
#[test]
fn two_processes_exchange_on_verbs() {
    if std::env::var(VERBS_ROLE).is_ok() {
        return;
    }
    let f = fabric_or_skip!();
    let total: u64 = std::env::var("RCH_TEST_VERBS_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 << 20);
    let dir = std::env::temp_dir().join(format!("rch-verbs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "verbs_two_process_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(VERBS_ROLE, "child")
        .env(VERBS_SOCKET, &path)
        .env("RCH_TEST_VERBS_BYTES", total.to_string())
        .spawn()
        .unwrap();
    let (sock, _) = listener.accept().unwrap();
    let start = Instant::now();
    let s = RdmaStream::handshake(f, &sock, verbs_exchange_config()).unwrap();
    let (got, want) = exchange_checked(s, 1, 2, total);
    let status = child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(got, want, "parent: checksum of received bytes");
    assert!(status.success(), "child failed: {status}");
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} MiB each way between two processes in {secs:.1} s ({:.1} MB/s each way), checksums match",
        total >> 20,
        total as f64 / secs / 1e6
    );
}

fn verbs_channels(
    f: &VerbsFabric,
    cfg: Config,
) -> (
    rdma_channel::Channel<VerbsFabric>,
    rdma_channel::Channel<VerbsFabric>,
) {
    let a = Prepared::new(f.clone(), cfg.clone()).unwrap();
    let b = Prepared::new(f.clone(), cfg).unwrap();
    let (ca, cb) = (a.card().unwrap(), b.card().unwrap());
    (a.connect(cb).unwrap(), b.connect(ca).unwrap())
}

/// The zero-copy model of `channel-tests/common/zc.rs` on verbs: eager and RDMA-READ
/// transfers, private and `alloc_mem` buffers, random receive sizes, FIFO checked.
/// `RCH_TEST_VERBS_ZC_CASES` sets the number of cases (default 40).
#[test]
fn zero_copy_model_on_verbs() {
    let f = fabric_or_skip!();
    let cases = std::env::var("RCH_TEST_VERBS_ZC_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40u64);
    let start = Instant::now();
    let (mut bytes, mut retries) = (0, 0);
    for case in 0..cases {
        let mut rng = Rng::new(0x2c0c_0000 + case);
        let ring = 4096usize << rng.below(5);
        let cfg = Config::default()
            .with_ring_size(ring)
            .with_chunk_size((ring / 2).min(64 << 10))
            .with_zero_copy_threshold(Some(1 << rng.below(17)))
            .with_zero_copy_private_threshold(Some(1 << rng.below(19)));
        let (mut a, mut b) = verbs_channels(&f, cfg.clone());
        let zc = common::zc::ZcCase {
            seed: rng.next_u64(),
            messages: rng.range(1, 10),
            max_buf: 1 << rng.range(10, 18),
            alloc_in_8: rng.below(9),
        };
        let run = common::zc::run_zc_model(&mut a, &mut b, &zc)
            .unwrap_or_else(|e| panic!("case {case} {cfg:?} {zc:?}: {e}"));
        bytes += run.bytes;
        retries += run.in_flight_retries;
        assert!(start.elapsed() < DEADLINE * 3, "too slow at case {case}");
    }
    println!(
        "{cases} zero-copy model cases, {} KiB, {retries} receives retried with reads in flight, in {:.1} s",
        bytes >> 10,
        start.elapsed().as_secs_f64()
    );
    // Soft-RoCE over loopback tends to complete a read within the post itself, so
    // `retries` may be 0 here; on a real device get_nowait leaves reads in flight.
}

/// The stale-registration test where it bites: on verbs a registration pins the
/// physical pages, so a cache that reused it after the buffer was unmapped and new
/// memory mapped at the same address would send the old pages' bytes.
#[test]
fn unmapped_and_remapped_buffer_on_verbs() {
    const LEN: usize = 256 << 10;
    const ROUNDS: usize = 20;
    let f = fabric_or_skip!();
    let cfg = Config::default()
        .with_ring_size(1 << 20)
        .with_zero_copy_private_threshold(Some(4096));
    let (a, mut b) = verbs_channels(&f, cfg);
    let mode = a.registration_cache().watch_mode();
    let writer = std::thread::spawn(move || {
        let mut a = RdmaStreamLike(a);
        common::zc::send_from_remapped_buffer(LEN, ROUNDS, |buf| a.write_all(buf)).unwrap();
        a.0
    });
    let mut buf = vec![0u8; LEN];
    for round in 0..ROUNDS {
        let mut at = 0;
        while at < LEN {
            at += b.get(&mut [IoSliceMut::new(&mut buf[at..])]).unwrap();
        }
        let want = round as u8 + 1;
        if let Some(at) = buf.iter().position(|&x| x != want) {
            panic!(
                "round {round}: byte {at} is {} instead of {want}: a stale registration",
                buf[at]
            );
        }
    }
    let a = writer.join().unwrap();
    let stats = a.cache_stats();
    println!("watch: {mode:?}; cache: {stats:?}");
    if mode == rdma_channel::rcache::WatchMode::Userfaultfd {
        assert!(stats.invalidations >= ROUNDS as u64 - 1, "{stats:?}");
    }
}

/// `Write` over a bare channel, the way the stream does it (rendezvous for big buffers).
struct RdmaStreamLike(rdma_channel::Channel<VerbsFabric>);

impl RdmaStreamLike {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut at = 0;
        while at < buf.len() {
            // SAFETY: `buf` stays borrowed and unchanged until this loop has counted
            // every byte, which includes the end of any zero-copy transfer.
            let n = unsafe { self.0.sender().put_nocopy(&[IoSlice::new(&buf[at..])]) }?;
            at += n;
            if self.0.sender().zero_copy_pending() {
                self.0.sender().wait_zero_copy()?;
            } else if n == 0 {
                self.0.sender().wait_writable()?;
            }
        }
        Ok(())
    }
}
