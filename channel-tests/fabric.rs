//! Integration tests of the emulated fabric: access checks, deregistration, ordering,
//! peer death, and the same between two processes (this test binary re-runs itself as
//! the child, see `xproc_child`).

use rdma_channel::fabric::emulated::{EmuFabric, EmuQp, EmuRegion};
use rdma_channel::fabric::{
    Access, CompletedOp, Completion, CompletionStatus, Fabric, FabricError, GatherList,
    MemoryRegion, Opcode, PendingQp, QpState, QueuePair, RemoteRegion, Sge, WorkRequest,
};
use rdma_channel::oob;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CANARY: u8 = 0xa5;

fn fabric() -> EmuFabric {
    EmuFabric::new().expect("create a domain")
}

fn connect(a: &EmuFabric, b: &EmuFabric) -> (EmuQp, EmuQp) {
    let (pa, pb) = (a.create_qp().unwrap(), b.create_qp().unwrap());
    let (ca, cb) = (pa.card().unwrap(), pb.card().unwrap());
    (pa.connect(cb).unwrap(), pb.connect(ca).unwrap())
}

fn sge_of(r: &EmuRegion, off: usize, len: usize) -> Sge {
    assert!(off + len <= r.len());
    Sge {
        // SAFETY: inside the region (asserted above).
        addr: unsafe { r.addr().add(off) },
        len: len as u32,
        lkey: r.lkey(),
    }
}

fn no_completion() -> Completion {
    Completion {
        wr_id: u64::MAX,
        status: CompletionStatus::Flushed,
        op: CompletedOp::Read,
        byte_len: 0,
    }
}

/// Posts and returns every completion it produced.
fn post(qp: &EmuQp, wr: &WorkRequest<'_>) -> Vec<Completion> {
    // SAFETY: every test keeps the memory its gather/scatter lists name alive for the
    // duration of the call, and the emulated fabric completes requests inside post.
    unsafe { qp.post(wr).expect("post") };
    let mut out = [no_completion(); 8];
    let n = qp.poll(&mut out);
    out[..n].to_vec()
}

fn write_wr<'a>(local: &'a [Sge], remote_addr: u64, rkey: u32, signaled: bool) -> WorkRequest<'a> {
    WorkRequest {
        wr_id: 7,
        opcode: Opcode::Write {
            local,
            remote_addr,
            rkey,
            inline: false,
        },
        signaled,
    }
}

fn read_wr<'a>(local: &'a [Sge], remote_addr: u64, rkey: u32) -> WorkRequest<'a> {
    WorkRequest {
        wr_id: 8,
        opcode: Opcode::Read {
            local,
            remote_addr,
            rkey,
        },
        signaled: true,
    }
}

fn fill(r: &EmuRegion, f: impl Fn(usize) -> u8) {
    for i in 0..r.len() {
        // SAFETY: inside the region; no request is in flight.
        unsafe { r.addr().add(i).write(f(i)) };
    }
}

fn bytes(r: &EmuRegion) -> &[u8] {
    // SAFETY: the region is live; tests only read it while no request is in flight.
    unsafe { std::slice::from_raw_parts(r.addr(), r.len()) }
}

/// `pad + len + pad` canary bytes, in a data segment of a domain or on the heap, the
/// middle `len` of which tests register and aim requests at.
struct Canaried {
    base: *mut u8,
    pad: usize,
    len: usize,
    _segment: EmuRegion,
    _heap: Vec<u8>,
}

impl Canaried {
    fn new(owner: &EmuFabric, pad: usize, len: usize, segment_backed: bool) -> Canaried {
        let segment = owner.alloc_region(pad + len + pad, Access::NONE).unwrap();
        let mut heap = vec![CANARY; pad + len + pad];
        let base = if segment_backed {
            segment.addr()
        } else {
            heap.as_mut_ptr()
        };
        // SAFETY: base points pad + len + pad valid bytes (the segment or the vector,
        // both kept in the value returned, and a vector's buffer does not move with it).
        unsafe { base.write_bytes(CANARY, pad + len + pad) };
        Canaried {
            base,
            pad,
            len,
            _segment: segment,
            _heap: heap,
        }
    }

    /// Registers the middle `len` bytes in `owner` (drop the region before `self`).
    fn register(&self, owner: &EmuFabric, access: Access) -> EmuRegion {
        // SAFETY: the middle bytes of the buffer, which lives as long as `self`.
        unsafe { owner.register(self.base.add(self.pad), self.len, access) }.unwrap()
    }

    /// Every byte, canaries included (read while no request is in flight).
    fn all(&self) -> &[u8] {
        // SAFETY: the whole live buffer; tests read it between requests.
        unsafe { std::slice::from_raw_parts(self.base, self.pad + self.len + self.pad) }
    }
}

/// Asserts that the request fails with `status`, leaves the queue pair in error, and
/// that a further post is flushed.
fn assert_fails(qp: &EmuQp, wr: &WorkRequest<'_>, status: CompletionStatus) {
    let c = post(qp, wr);
    assert_eq!(
        c.len(),
        1,
        "an error always completes, signalled or not: {c:?}"
    );
    assert_eq!(c[0].status, status, "{:?}", qp.last_error());
    assert_eq!(c[0].wr_id, wr.wr_id);
    assert_eq!(qp.state(), QpState::Error);
    assert!(qp.last_error().is_some());
    let again = post(qp, wr);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].status, CompletionStatus::Flushed);
}

/// `post_completing` of `wr`: the completion handed back, and what `poll` then finds.
fn post_completing(qp: &EmuQp, wr: &WorkRequest<'_>) -> (Option<Completion>, usize) {
    // SAFETY: as in `post`.
    let handed = unsafe { qp.post_completing(wr).expect("post") };
    let mut out = [no_completion(); 8];
    (handed, qp.poll(&mut out))
}

#[test]
fn an_unbounded_queue_hands_back_a_reads_completion_and_queues_none() {
    let (a, b) = (fabric(), fabric());
    let (qa, _qb) = connect(&a, &b);
    let src = b.alloc_region(5000, Access::REMOTE_READ).unwrap();
    fill(&src, |i| (i * 13 % 251) as u8);
    let back = a.alloc_region(5000, Access::LOCAL_WRITE).unwrap();
    let list = [sge_of(&back, 0, 1000), sge_of(&back, 1000, 3999)];
    let (handed, queued) = post_completing(&qa, &read_wr(&list, src.addr() as u64 + 1, src.rkey()));
    let c = handed.expect("the read was carried out in the call");
    assert_eq!(
        (c.status, c.op, c.byte_len, c.wr_id, queued),
        (CompletionStatus::Success, CompletedOp::Read, 4999, 8, 0)
    );
    assert!(bytes(&back)[..4999] == bytes(&src)[1..]);

    // An unsignalled success has no completion to hand back.
    let one = [sge_of(&back, 0, 1)];
    let mut wr = read_wr(&one, src.addr() as u64, src.rkey());
    wr.signaled = false;
    assert_eq!(post_completing(&qa, &wr).0.map(|c| c.status), None);

    // A refused read is handed back too (signalled or not), the queue pair fails,
    // and what follows is flushed the same way.
    let bad = read_wr(&list, src.addr() as u64, src.rkey() ^ 0x100);
    let (handed, queued) = post_completing(&qa, &bad);
    assert_eq!(
        handed.map(|c| c.status),
        Some(CompletionStatus::RemoteAccessError)
    );
    assert_eq!((queued, qa.state()), (0, QpState::Error));
    let (handed, queued) = post_completing(&qa, &read_wr(&list, src.addr() as u64, src.rkey()));
    assert_eq!(
        (handed.map(|c| c.status), queued),
        (Some(CompletionStatus::Flushed), 0)
    );
}

#[test]
fn a_bounded_queue_reports_a_read_through_poll_as_ever() {
    let (a, b) = (fabric().with_send_queue_depth(4), fabric());
    let (qa, _qb) = connect(&a, &b);
    let src = b.alloc_region(4096, Access::REMOTE_READ).unwrap();
    fill(&src, |i| (i % 7) as u8);
    let back = a.alloc_region(4096, Access::LOCAL_WRITE).unwrap();
    let list = [sge_of(&back, 0, 4096)];
    let (handed, queued) = post_completing(&qa, &read_wr(&list, src.addr() as u64, src.rkey()));
    assert!(handed.is_none());
    assert_eq!(queued, 1, "the completion is polled, and frees its slot");
    assert!(bytes(&back) == bytes(&src));
}

#[test]
fn write_and_read_round_trip_in_process() {
    let (a, b) = (fabric(), fabric());
    let (qa, _qb) = connect(&a, &b);
    let src = a.alloc_region(10_000, Access::LOCAL_WRITE).unwrap();
    fill(&src, |i| (i * 7 % 251) as u8);
    let dst = b
        .alloc_region(
            10_000,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();

    // Three gather entries, landing at an unaligned offset.
    let list = [
        sge_of(&src, 0, 3),
        sge_of(&src, 3, 4000),
        sge_of(&src, 4003, 5996),
    ];
    let c = post(
        &qa,
        &write_wr(&list, dst.addr() as u64 + 1, dst.rkey(), true),
    );
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].status, c[0].op, c[0].byte_len, c[0].wr_id),
        (CompletionStatus::Success, CompletedOp::Write, 9_999, 7)
    );
    assert_eq!(bytes(&dst)[0], 0);
    assert!(bytes(&dst)[1..] == bytes(&src)[..9_999]);

    // Unsignalled success: no completion (one byte into the untouched first byte).
    let one = [sge_of(&src, 5, 1)];
    assert!(post(&qa, &write_wr(&one, dst.addr() as u64, dst.rkey(), false)).is_empty());
    assert_eq!(bytes(&dst)[0], bytes(&src)[5]);

    // Read back into two scatter entries.
    let back = a.alloc_region(10_000, Access::LOCAL_WRITE).unwrap();
    let list = [sge_of(&back, 0, 5000), sge_of(&back, 5000, 4999)];
    let c = post(&qa, &read_wr(&list, dst.addr() as u64 + 1, dst.rkey()));
    assert_eq!(
        (c[0].status, c[0].op, c[0].byte_len),
        (CompletionStatus::Success, CompletedOp::Read, 9_999)
    );
    assert!(bytes(&back)[..9_999] == bytes(&src)[..9_999]);
    assert_eq!(qa.state(), QpState::ReadyToSend);
    assert_eq!(qa.last_error(), None);
}

#[test]
fn private_memory_round_trip_in_process() {
    let (a, b) = (fabric(), fabric());
    let (qa, _qb) = connect(&a, &b);
    let mut heap = vec![0u8; 4096];
    // SAFETY: the vector outlives the region (dropped at the end of the test, after it).
    let target = unsafe {
        b.register(
            heap.as_mut_ptr(),
            heap.len(),
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
    }
    .unwrap();
    let data: Vec<u8> = (0..100u8).collect();
    let inline = [Sge {
        addr: data.as_ptr() as *mut u8,
        len: 100,
        lkey: 0,
    }];
    let wr = WorkRequest {
        wr_id: 1,
        opcode: Opcode::Write {
            local: &inline,
            remote_addr: target.addr() as u64 + 10,
            rkey: target.rkey(),
            inline: true,
        },
        signaled: true,
    };
    assert_eq!(post(&qa, &wr)[0].status, CompletionStatus::Success);
    let back = a.alloc_region(100, Access::LOCAL_WRITE).unwrap();
    let list = [sge_of(&back, 0, 100)];
    assert_eq!(
        post(
            &qa,
            &read_wr(&list, target.addr() as u64 + 10, target.rkey())
        )[0]
        .status,
        CompletionStatus::Success
    );
    assert_eq!(bytes(&back), &data[..]);
    drop(target);
    assert_eq!(&heap[10..110], &data[..]);
    assert!(heap[..10].iter().chain(&heap[110..]).all(|&x| x == 0));
}

#[test]
fn loopback_and_late_segments_work() {
    let f = fabric();
    let (q1, _q2) = connect(&f, &f);
    // Allocated after the cards were exchanged: reached through the domain itself.
    let late = f
        .alloc_region(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    fill(&late, |i| i as u8);
    // Loopback: copy the first half of the region onto its second half.
    let list = [sge_of(&late, 0, 32)];
    assert_eq!(
        post(
            &q1,
            &write_wr(&list, late.addr() as u64 + 32, late.rkey(), true)
        )[0]
        .status,
        CompletionStatus::Success
    );
    assert_eq!(&bytes(&late)[32..], &bytes(&late)[..32]);
}

#[test]
fn zero_length_requests_still_check_keys() {
    let (a, b) = (fabric(), fabric());
    let (qa, _qb) = connect(&a, &b);
    let dst = b.alloc_region(64, Access::REMOTE_WRITE).unwrap();
    assert_eq!(
        post(&qa, &write_wr(&[], dst.addr() as u64, dst.rkey(), true))[0].byte_len,
        0
    );
    assert_fails(
        &qa,
        &write_wr(&[], dst.addr() as u64, dst.rkey() ^ 0x10000, true),
        CompletionStatus::RemoteAccessError,
    );
}

#[test]
fn invalid_requests_are_refused_synchronously() {
    let (a, b) = (fabric(), fabric());
    let (qa, _qb) = connect(&a, &b);
    let dst = b.alloc_region(8 << 20, Access::REMOTE_WRITE).unwrap();
    let src = a.alloc_region(8 << 20, Access::LOCAL_WRITE).unwrap();
    let caps = qa.caps();
    let many = vec![sge_of(&src, 0, 1); caps.max_sge + 1];
    // SAFETY: refused before any memory is touched.
    match unsafe { qa.post(&write_wr(&many, dst.addr() as u64, dst.rkey(), true)) } {
        Err(FabricError::InvalidRequest(_)) => {}
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
    let long = [sge_of(&src, 0, caps.max_inline + 1)];
    let wr = WorkRequest {
        wr_id: 3,
        opcode: Opcode::Write {
            local: &long,
            remote_addr: dst.addr() as u64,
            rkey: dst.rkey(),
            inline: true,
        },
        signaled: true,
    };
    // SAFETY: refused before any memory is touched.
    let refused = unsafe { qa.post(&wr) };
    assert!(matches!(refused, Err(FabricError::InvalidRequest(_))));
    let mut out = [no_completion(); 4];
    assert_eq!(
        qa.poll(&mut out),
        0,
        "refused requests produce no completion"
    );
    assert_eq!(qa.state(), QpState::ReadyToSend);
    // Exactly max_inline and max_sge are fine.
    let exact = [sge_of(&src, 0, caps.max_inline)];
    let wr = WorkRequest {
        opcode: Opcode::Write {
            local: &exact,
            remote_addr: dst.addr() as u64,
            rkey: dst.rkey(),
            inline: true,
        },
        ..wr
    };
    assert_eq!(post(&qa, &wr)[0].status, CompletionStatus::Success);
    let max = vec![sge_of(&src, 0, 1); caps.max_sge];
    assert_eq!(
        post(&qa, &write_wr(&max, dst.addr() as u64, dst.rkey(), true))[0].byte_len,
        caps.max_sge as u64
    );
}

/// `QueuePair::write_inline` (the emulated fabric's shortcut for one contiguous
/// buffer) does what an unsignalled inline post of the same bytes does, in every
/// case: the bytes land; a bad key, range or permission, or a queue pair already in
/// error, completes with the same error status and writes nothing; a length beyond
/// `max_inline` is refused before anything happens.
#[test]
fn write_inline_is_an_inline_post() {
    const PAD: usize = 256;
    const LEN: usize = 1024;
    #[derive(Clone, Copy, Debug)]
    enum Case {
        Ok { at: usize, len: usize },
        BadKey,
        PastEnd,
        ReadOnly,
        AfterError,
        TooLong,
    }
    /// What a case leaves behind: the call's result, the completions (status,
    /// wr_id), the queue pair's state and the whole target buffer.
    type Outcome = (
        Result<(), String>,
        Vec<(CompletionStatus, u64)>,
        QpState,
        Vec<u8>,
    );
    let run = |case: Case, segment_backed: bool, shortcut: bool| -> Outcome {
        let (a, b) = (fabric(), fabric());
        let (qa, _qb) = connect(&a, &b);
        let target = Canaried::new(&b, PAD, LEN, segment_backed);
        let rw = target.register(&b, Access::REMOTE_WRITE);
        let read_only = target.register(&b, Access::REMOTE_READ);
        let start = rw.addr() as u64;
        let long = vec![0x33u8; qa.caps().max_inline + 1];
        let source: Vec<u8> = (0..LEN).map(|i| (i * 7 + 1) as u8).collect();
        // A first write (of the canary bytes already there) maps the peer's segment,
        // as a connection's first packets do; the shortcut takes mapped segments only.
        let mut warm = GatherList::<1>::new();
        warm.push(&[CANARY; 8]);
        qa.post_inline_write(0, &warm, start, rw.rkey(), false)
            .unwrap();
        let (bytes, addr, rkey) = match case {
            Case::Ok { at, len } => (&source[..len], start + at as u64, rw.rkey()),
            Case::BadKey => (&source[..32], start, rw.rkey() ^ 0x10000),
            Case::PastEnd => (&source[..32], start + LEN as u64 - 24, rw.rkey()),
            Case::ReadOnly => (&source[..32], start, read_only.rkey()),
            Case::AfterError => {
                let mut out = [no_completion(); 4];
                let bad = [Sge {
                    addr: std::ptr::null_mut(),
                    len: 0,
                    lkey: 0,
                }];
                let wr = write_wr(&bad, start, rw.rkey() ^ 0x10000, false);
                // SAFETY: a zero-length list; the fabric completes it inside post.
                unsafe { qa.post(&wr) }.unwrap();
                assert_eq!(qa.poll(&mut out), 1);
                (&source[..32], start, rw.rkey())
            }
            Case::TooLong => (&long[..], start, rw.rkey()),
        };
        let result = if shortcut {
            qa.write_inline(bytes, addr, rkey)
        } else {
            let mut list = GatherList::<1>::new();
            list.push(bytes);
            qa.post_inline_write(0, &list, addr, rkey, false)
        };
        let mut out = [no_completion(); 4];
        let n = qa.poll(&mut out);
        let completions = out[..n].iter().map(|c| (c.status, c.wr_id)).collect();
        let after = target.all().to_vec();
        drop((rw, read_only));
        (
            result.map_err(|e| format!("{e:?}")),
            completions,
            qa.state(),
            after,
        )
    };
    let cases = [
        Case::Ok { at: 0, len: 32 },
        Case::Ok { at: 64, len: 64 },
        Case::Ok { at: 128, len: 8 },
        Case::Ok { at: 3, len: 13 },
        Case::Ok { at: 0, len: LEN },
        Case::BadKey,
        Case::PastEnd,
        Case::ReadOnly,
        Case::AfterError,
        Case::TooLong,
    ];
    for segment_backed in [true, false] {
        for case in cases {
            let shortcut = run(case, segment_backed, true);
            let posted = run(case, segment_backed, false);
            let first_difference = shortcut.3.iter().zip(&posted.3).position(|(x, y)| x != y);
            assert!(
                shortcut == posted,
                "{case:?}, segment-backed {segment_backed}: write_inline and an inline post \
                 differ: {:?} against {:?}; bytes first differ at {first_difference:?}",
                (&shortcut.0, &shortcut.1, shortcut.2),
                (&posted.0, &posted.1, posted.2),
            );
            let (result, completions, state, after) = shortcut;
            let mut want = vec![CANARY; PAD + LEN + PAD];
            match case {
                Case::Ok { at, len } => {
                    assert_eq!(result, Ok(()));
                    assert!(completions.is_empty(), "{completions:?}");
                    assert_eq!(state, QpState::ReadyToSend);
                    for (i, w) in want[PAD + at..PAD + at + len].iter_mut().enumerate() {
                        *w = (i * 7 + 1) as u8;
                    }
                }
                Case::TooLong => {
                    assert!(result.unwrap_err().contains("InvalidRequest"));
                    assert!(completions.is_empty());
                    assert_eq!(state, QpState::ReadyToSend);
                }
                _ => {
                    assert_eq!(result, Ok(()), "{case:?}: errors are completions");
                    assert_eq!(completions.len(), 1, "{case:?}: {completions:?}");
                    assert_ne!(completions[0].0, CompletionStatus::Success, "{case:?}");
                    assert_eq!(state, QpState::Error);
                }
            }
            let wrong = after.iter().zip(&want).position(|(x, y)| x != y);
            assert_eq!(
                wrong, None,
                "{case:?}, segment-backed {segment_backed}: wrong byte"
            );
        }
    }
}

/// `write_inline` remembers where the registration of a checked write lies, so that
/// the next write to it checks less: what can have changed since must still be
/// checked on every write. After a first good write, each change below makes the
/// next `write_inline` fail as it would have without the first (an error completion,
/// the queue pair in error), with every byte outside the first write untouched.
#[test]
fn write_inline_checks_again_what_can_change() {
    const PAD: usize = 256;
    const LEN: usize = 1024;
    #[derive(Clone, Copy, Debug)]
    enum Change {
        Deregistered,
        PastEnd,
        OtherKeySameMemory,
        PeerQpGone,
        None,
    }
    for change in [
        Change::Deregistered,
        Change::PastEnd,
        Change::OtherKeySameMemory,
        Change::PeerQpGone,
        Change::None,
    ] {
        let (a, b) = (fabric(), fabric());
        let (qa, qb) = connect(&a, &b);
        let target = Canaried::new(&b, PAD, LEN, true);
        let rw = target.register(&b, Access::REMOTE_WRITE);
        let read_only = target.register(&b, Access::REMOTE_READ);
        let start = rw.addr() as u64;
        let first = [0x11u8; 32];
        // Twice: the first checks in full and remembers, the second takes the short
        // check.
        for _ in 0..2 {
            qa.write_inline(&first, start, rw.rkey()).unwrap();
        }
        let (addr, rkey) = match change {
            Change::PastEnd => (start + LEN as u64 - 24, rw.rkey()),
            Change::OtherKeySameMemory => (start + 64, read_only.rkey()),
            _ => (start + 64, rw.rkey()),
        };
        let mut qb = Some(qb);
        let mut rw = Some(rw);
        match change {
            Change::Deregistered => drop(rw.take()),
            Change::PeerQpGone => drop(qb.take()),
            _ => {}
        }
        qa.write_inline(&[0x22u8; 32], addr, rkey).unwrap();
        let mut out = [no_completion(); 4];
        let n = qa.poll(&mut out);
        let mut want = vec![CANARY; PAD + LEN + PAD];
        want[PAD..PAD + 32].fill(0x11);
        match change {
            Change::None => {
                assert_eq!(n, 0, "{change:?}: {:?}", &out[..n]);
                assert_eq!(qa.state(), QpState::ReadyToSend);
                want[PAD + 64..PAD + 96].fill(0x22);
            }
            _ => {
                assert_eq!(n, 1, "{change:?}: an error completes");
                assert_ne!(out[0].status, CompletionStatus::Success, "{change:?}");
                assert_eq!(qa.state(), QpState::Error, "{change:?}");
            }
        }
        assert_eq!(
            target.all().iter().zip(&want).position(|(x, y)| x != y),
            None,
            "{change:?}: wrong byte"
        );
        drop((rw, read_only, qb));
    }
}

/// A region registered in the middle of a canary-filled buffer, segment-backed or
/// private; every bad request is tried on a fresh queue pair and must leave every
/// canary byte intact.
#[test]
fn failed_requests_touch_nothing() {
    const PAD: usize = 4096;
    const LEN: usize = 4096;
    for segment_backed in [true, false] {
        let (a, b) = (fabric(), fabric());
        let target = Canaried::new(&b, PAD, LEN, segment_backed);
        let reg = |access| target.register(&b, access);
        let rw = reg(Access::REMOTE_WRITE | Access::REMOTE_READ);
        let read_only = reg(Access::REMOTE_READ);
        let write_only = reg(Access::REMOTE_WRITE);
        let start = rw.addr() as u64;

        let src = a.alloc_region(64, Access::LOCAL_WRITE).unwrap();
        fill(&src, |_| 0x11);
        let s8 = [sge_of(&src, 0, 8)];
        let sink = a.alloc_region(64, Access::LOCAL_WRITE).unwrap();
        let d8 = [sge_of(&sink, 0, 8)];
        let unwritable_sink = a.alloc_region(64, Access::NONE).unwrap();
        let unwritable = [sge_of(&unwritable_sink, 0, 8)];
        let bad_local = [Sge {
            lkey: src.lkey() ^ 0x10000,
            ..s8[0]
        }];
        let outside_local = [Sge {
            // SAFETY: one past the 64-byte region: out of it, which is the point.
            addr: unsafe { src.addr().add(60) },
            ..s8[0]
        }];
        let cases: Vec<(&str, WorkRequest<'_>, CompletionStatus)> = vec![
            (
                "stale generation",
                write_wr(&s8, start, rw.rkey() ^ 0x10000, false),
                CompletionStatus::RemoteAccessError,
            ),
            (
                "unknown index",
                write_wr(&s8, start, (rw.rkey() & !0xffff) | 0x1fff, false),
                CompletionStatus::RemoteAccessError,
            ),
            (
                "index beyond the table",
                write_wr(&s8, start, 0xffff_ffff, false),
                CompletionStatus::RemoteAccessError,
            ),
            (
                "key zero",
                write_wr(&s8, start, 0, false),
                CompletionStatus::RemoteAccessError,
            ),
            (
                "one byte past the end",
                write_wr(&s8, start + LEN as u64 - 7, rw.rkey(), false),
                CompletionStatus::RemoteAccessError,
            ),
            (
                "one byte before the start",
                write_wr(&s8, start - 1, rw.rkey(), false),
                CompletionStatus::RemoteAccessError,
            ),
            (
                "address overflow",
                write_wr(&s8, u64::MAX - 3, rw.rkey(), false),
                CompletionStatus::RemoteAccessError,
            ),
            (
                "no REMOTE_WRITE",
                write_wr(&s8, start, read_only.rkey(), false),
                CompletionStatus::RemoteAccessError,
            ),
            (
                "no REMOTE_READ",
                read_wr(&d8, start, write_only.rkey()),
                CompletionStatus::RemoteAccessError,
            ),
            (
                "read past the end",
                read_wr(&d8, start + LEN as u64 - 4, rw.rkey()),
                CompletionStatus::RemoteAccessError,
            ),
            (
                "wrong lkey",
                write_wr(&bad_local, start, rw.rkey(), false),
                CompletionStatus::LocalProtectionError,
            ),
            (
                "local entry outside its region",
                write_wr(&outside_local, start, rw.rkey(), false),
                CompletionStatus::LocalProtectionError,
            ),
            (
                "read into memory without LOCAL_WRITE",
                read_wr(&unwritable, start, rw.rkey()),
                CompletionStatus::LocalProtectionError,
            ),
        ];
        for (what, wr, status) in &cases {
            let (qa, _qb) = connect(&a, &b);
            let c = post(&qa, wr);
            assert_eq!(c.len(), 1, "{what}: {c:?}");
            assert_eq!(c[0].status, *status, "{what}: {:?}", qa.last_error());
            assert_eq!(qa.state(), QpState::Error, "{what}");
            let again = post(&qa, &write_wr(&s8, start, rw.rkey(), true));
            assert_eq!(again[0].status, CompletionStatus::Flushed, "{what}");
            if let Some(i) = target.all().iter().position(|&x| x != CANARY) {
                panic!("{what} (segment-backed: {segment_backed}) changed byte {i}");
            }
            assert!(
                bytes(&sink).iter().all(|&x| x == 0),
                "{what} wrote into the sink"
            );
        }
        // The good request does land, so the canary check above can see a write.
        let (qa, _qb) = connect(&a, &b);
        assert_eq!(
            post(&qa, &write_wr(&s8, start, rw.rkey(), true))[0].status,
            CompletionStatus::Success
        );
        assert_eq!(target.all()[PAD], 0x11);
        drop((rw, read_only, write_only));
    }
}

#[test]
fn deregistered_keys_fail_and_reused_entries_get_new_keys() {
    let (a, b) = (fabric(), fabric());
    let src = a.alloc_region(8, Access::NONE).unwrap();
    let s8 = [sge_of(&src, 0, 8)];
    let r = b.alloc_region(64, Access::REMOTE_WRITE).unwrap();
    let (old_key, old_addr) = (r.rkey(), r.addr() as u64);
    let (qa, _qb) = connect(&a, &b);
    assert_eq!(
        post(&qa, &write_wr(&s8, old_addr, old_key, true))[0].status,
        CompletionStatus::Success
    );
    drop(r);
    let again = b.alloc_region(64, Access::REMOTE_WRITE).unwrap();
    assert_ne!(again.rkey(), old_key);
    assert_fails(
        &qa,
        &write_wr(&s8, old_addr, old_key, true),
        CompletionStatus::RemoteAccessError,
    );
    let keys: Vec<u32> = (0..100)
        .map(|_| b.alloc_region(8, Access::NONE).unwrap().rkey())
        .collect();
    assert!(
        !keys.contains(&old_key),
        "a dead key must not come back soon"
    );
}

/// Drops a private region while another thread keeps writing 4 MiB into it, then
/// overwrites the memory: no write may land after `drop` returned.
#[test]
fn deregistration_fences_in_flight_private_writes() {
    const LEN: usize = 4 << 20;
    for round in 0..5 {
        let (a, b) = (fabric(), fabric());
        let (qa, _qb) = connect(&a, &b);
        let src = a.alloc_region(LEN, Access::NONE).unwrap();
        fill(&src, |_| 0x11);
        let mut heap = vec![0u8; LEN];
        // SAFETY: the vector outlives the region (dropped explicitly below first).
        let target = unsafe { b.register(heap.as_mut_ptr(), LEN, Access::REMOTE_WRITE) }.unwrap();
        let (addr, rkey) = (target.addr() as u64, target.rkey());
        let started = Arc::new(AtomicU64::new(0));
        let writer = {
            let started = Arc::clone(&started);
            std::thread::spawn(move || {
                let list = [sge_of(&src, 0, LEN)];
                let deadline = Instant::now() + Duration::from_secs(10);
                while qa.state() == QpState::ReadyToSend && Instant::now() < deadline {
                    post(&qa, &write_wr(&list, addr, rkey, false));
                    // Relaxed: a progress counter for the main thread's wait only.
                    started.fetch_add(1, Ordering::Relaxed);
                }
                qa.last_error()
            })
        };
        // Relaxed: see above.
        while started.load(Ordering::Relaxed) < 2 + round {
            std::thread::yield_now();
        }
        drop(target);
        heap.fill(0x22);
        let reason = writer.join().unwrap();
        assert!(reason.unwrap_or_default().contains("rkey"));
        if let Some(i) = heap.iter().position(|&x| x != 0x22) {
            panic!("round {round}: byte {i} was written after deregistration");
        }
    }
}

/// A writer thread places 4 KiB blocks whose last word is a sequence number; a reader
/// polls that word with Acquire and checks the rest of the block.
#[test]
fn the_last_word_of_a_write_is_placed_last() {
    const BLOCK: usize = 4096;
    const SLOTS: usize = 2;
    const ROUNDS: u64 = 10_000;
    for segment_backed in [true, false] {
        let (a, b) = (fabric(), fabric());
        let (qa, _qb) = connect(&a, &b);
        let mut heap = vec![0u64; BLOCK * SLOTS / 8];
        let target = if segment_backed {
            b.alloc_region(BLOCK * SLOTS, Access::REMOTE_WRITE).unwrap()
        } else {
            // SAFETY: the vector outlives the region (dropped at the end of the loop body,
            // after `target`).
            unsafe {
                b.register(
                    heap.as_mut_ptr().cast(),
                    BLOCK * SLOTS,
                    Access::REMOTE_WRITE,
                )
            }
            .unwrap()
        };
        let remote = target.remote();
        let base = target.addr() as usize;
        let acked = Arc::new(AtomicU64::new(0));
        let reader = {
            let acked = Arc::clone(&acked);
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(20);
                for seq in 1..=ROUNDS {
                    let block = base + (seq as usize % SLOTS) * BLOCK;
                    // SAFETY: the last word of a block inside the live region, 8-aligned.
                    let last = unsafe { AtomicU64::from_ptr((block + BLOCK - 8) as *mut u64) };
                    // Acquire: pairs with the fabric's Release store of the word.
                    while last.load(Ordering::Acquire) != seq {
                        assert!(Instant::now() < deadline, "reader timed out at {seq}");
                        std::hint::spin_loop();
                    }
                    // SAFETY: the block minus its last word, inside the live region; the
                    // writer does not touch this block again before we acknowledge it.
                    let body =
                        unsafe { std::slice::from_raw_parts(block as *const u64, BLOCK / 8 - 1) };
                    if let Some(w) = body.iter().position(|&v| v != seq) {
                        panic!("word {w} of block {seq} seen before it was written");
                    }
                    // Release: the writer may reuse the block after seeing this.
                    acked.store(seq, Ordering::Release);
                }
            })
        };
        let src = a.alloc_region(BLOCK, Access::NONE).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        for seq in 1..=ROUNDS {
            // Acquire: pairs with the reader's Release, so its reads of the block are done.
            while acked.load(Ordering::Acquire) + (SLOTS as u64) <= seq && !reader.is_finished() {
                assert!(Instant::now() < deadline, "writer timed out at {seq}");
                std::hint::spin_loop();
            }
            if reader.is_finished() {
                break; // the reader failed; its panic is reported by join below
            }
            // SAFETY: the whole source region, which nothing else uses meanwhile.
            unsafe { std::slice::from_raw_parts_mut(src.addr().cast::<u64>(), BLOCK / 8) }
                .fill(seq);
            // Split the gather list so the last word straddles two entries.
            let list = [sge_of(&src, 0, BLOCK - 4), sge_of(&src, BLOCK - 4, 4)];
            let at = remote.addr + (seq % SLOTS as u64) * BLOCK as u64;
            assert!(post(&qa, &write_wr(&list, at, remote.rkey, false)).is_empty());
        }
        reader.join().unwrap();
        drop(target);
        drop(heap);
    }
}

#[test]
fn a_vanished_peer_is_a_transport_error() {
    let (a, b) = (fabric(), fabric());
    let dst = b.alloc_region(64, Access::REMOTE_WRITE).unwrap();
    let src = a.alloc_region(8, Access::NONE).unwrap();
    let s8 = [sge_of(&src, 0, 8)];
    let remote = dst.remote();

    // The peer queue pair is dropped.
    let (qa, qb) = connect(&a, &b);
    drop(qb);
    assert_fails(
        &qa,
        &write_wr(&s8, remote.addr, remote.rkey, false),
        CompletionStatus::TransportError,
    );

    // The whole peer domain goes away.
    let (qa, qb) = connect(&a, &b);
    assert_eq!(qa.state(), QpState::ReadyToSend);
    drop((qb, dst, b));
    assert_eq!(qa.state(), QpState::Error);
    assert!(qa.last_error().unwrap().contains("no longer exists"));
    let c = post(&qa, &write_wr(&s8, remote.addr, remote.rkey, true));
    assert_eq!(c[0].status, CompletionStatus::Flushed);
}

#[test]
fn malformed_cards_are_refused() {
    let (a, b) = (fabric(), fabric());
    let good = b.create_qp().unwrap().card().unwrap();
    let mut bad = a.create_qp().unwrap().card().unwrap();
    bad.bytes[0] ^= 0xff;
    let e = a.create_qp().unwrap().connect(bad).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("magic"), "{e}");
    let mut short = good;
    short.bytes.truncate(20);
    let e = a.create_qp().unwrap().connect(short).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    let mut no_fds = b.create_qp().unwrap().card().unwrap();
    no_fds.fds.clear();
    assert_eq!(
        a.create_qp().unwrap().connect(no_fds).unwrap_err().kind(),
        std::io::ErrorKind::InvalidData
    );
}

// ---------------------------------------------------------------------------------
// Cross-process tests. The parent runs this binary again with `--exact xproc_child`;
// the child finds its end of a socket pair in RDMA_EMU_CHILD_FD.
// ---------------------------------------------------------------------------------

const CHILD_FD: &str = "RDMA_EMU_CHILD_FD";
const CHILD_MODE: &str = "RDMA_EMU_CHILD_MODE";
const TIMEOUT: Duration = Duration::from_secs(20);

fn pattern_a(i: usize) -> u8 {
    (i * 13 + 5) as u8
}

fn pattern_b(i: usize) -> u8 {
    (i * 31 + 7) as u8
}

fn pattern_c(i: usize) -> u8 {
    (i * 3 + 1) as u8
}

fn with_timeouts(s: UnixStream) -> UnixStream {
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    s
}

fn spawn_child(mode: &str) -> (Child, UnixStream) {
    let (mine, theirs) = UnixStream::pair().unwrap();
    let fd = theirs.as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "xproc_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_FD, fd.to_string())
        .env(CHILD_MODE, mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the hook only calls fcntl, which is async-signal-safe, on a descriptor
    // that stays open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            // Let exactly this descriptor survive exec in the child.
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    drop(theirs);
    (child, with_timeouts(mine))
}

/// Waits for the child (killing it after the timeout) and returns its output on failure.
fn finish_child(mut child: Child) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "child failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn send_regions(sock: &UnixStream, regions: &[RemoteRegion]) {
    let bytes: Vec<u8> = regions.iter().flat_map(|r| r.to_bytes()).collect();
    oob::send_frame(sock, &bytes).unwrap();
}

fn recv_regions(sock: &UnixStream) -> Vec<RemoteRegion> {
    let bytes = oob::recv_frame(sock).unwrap();
    bytes
        .chunks(20)
        .map(|c| RemoteRegion::from_bytes(c).unwrap())
        .collect()
}

/// Exchanges cards for one queue pair (the child sends first).
fn exchange(fabric: &EmuFabric, sock: &UnixStream, child: bool) -> EmuQp {
    let pending = fabric.create_qp().unwrap();
    let card = pending.card().unwrap();
    let peer = if child {
        oob::send_card(sock, &card).unwrap();
        oob::recv_card(sock).unwrap()
    } else {
        let peer = oob::recv_card(sock).unwrap();
        oob::send_card(sock, &card).unwrap();
        peer
    };
    pending.connect(peer).unwrap()
}

fn expect(sock: &UnixStream, what: &str) {
    let got = oob::recv_frame(sock).unwrap();
    assert_eq!(String::from_utf8_lossy(&got), what);
}

/// The child side of the cross-process tests; a no-op unless run by a parent test.
#[test]
fn xproc_child() {
    let Ok(fd) = std::env::var(CHILD_FD) else {
        return;
    };
    let fd: i32 = fd.parse().unwrap();
    // SAFETY: the parent passed us this descriptor (our end of the socket pair) and
    // nothing else in this process owns it.
    let sock = with_timeouts(UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) }));
    let mode = std::env::var(CHILD_MODE).unwrap();
    let f = fabric();
    match mode.as_str() {
        "main" => child_main(&f, &sock),
        "linger" => {
            let _qp = exchange(&f, &sock, true);
            oob::send_frame(&sock, b"ready").unwrap();
            // The parent kills us; never outlive the test.
            std::thread::sleep(TIMEOUT);
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn child_main(f: &EmuFabric, sock: &UnixStream) {
    let rx = f
        .alloc_region(64 << 10, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut private: Vec<u8> = (0..64 << 10).map(pattern_b).collect();
    // SAFETY: the vector outlives the region (the region is dropped at the end of this
    // function, before the vector).
    let priv_region = unsafe {
        f.register(
            private.as_mut_ptr(),
            private.len(),
            Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
    }
    .unwrap();
    let qp = exchange(f, sock, true);
    let spare = exchange(f, sock, true);
    send_regions(sock, &[rx.remote(), priv_region.remote()]);

    // 1. The parent writes pattern A into rx (a segment sent with the card).
    expect(sock, "wrote rx");
    let ok = bytes(&rx)
        .iter()
        .enumerate()
        .all(|(i, &x)| x == pattern_a(i));
    oob::send_frame(sock, if ok { b"ok" } else { b"bad" }).unwrap();

    // 2. The parent reads our private memory, then writes pattern C into its second half.
    expect(sock, "wrote private");
    let half = private.len() / 2;
    let ok = private[..half]
        .iter()
        .enumerate()
        .all(|(i, &x)| x == pattern_b(i))
        && private[half..]
            .iter()
            .enumerate()
            .all(|(i, &x)| x == pattern_c(i));
    oob::send_frame(sock, if ok { b"ok" } else { b"bad" }).unwrap();

    // 3. A segment created after the cards were exchanged.
    let late = f
        .alloc_region(8192, Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
    send_regions(sock, &[late.remote()]);
    expect(sock, "wrote late");
    let ok = bytes(&late)
        .iter()
        .enumerate()
        .all(|(i, &x)| x == pattern_a(i));
    oob::send_frame(sock, if ok { b"ok" } else { b"bad" }).unwrap();

    // 4. We write pattern C into the parent's region.
    let theirs = recv_regions(sock)[0];
    let src = f.alloc_region(theirs.len as usize, Access::NONE).unwrap();
    fill(&src, pattern_c);
    let list = [sge_of(&src, 0, src.len())];
    let c = post(&qp, &write_wr(&list, theirs.addr, theirs.rkey, true));
    assert_eq!(
        c[0].status,
        CompletionStatus::Success,
        "{:?}",
        qp.last_error()
    );
    oob::send_frame(sock, b"wrote parent").unwrap();

    // 5. Drop the spare queue pair; the parent must see a transport error on its end.
    expect(sock, "drop spare");
    drop(spare);
    oob::send_frame(sock, b"dropped").unwrap();
    expect(sock, "bye");
    drop(priv_region);
    drop(private);
}

#[test]
fn cross_process_write_read_and_errors() {
    let (child, sock) = spawn_child("main");
    let f = fabric();
    let mine = f
        .alloc_region(4096, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
        .unwrap();
    let qp = exchange(&f, &sock, false);
    let spare = exchange(&f, &sock, false);
    assert!(!qp.peer_in_process());
    assert_eq!(qp.peer_pid(), child.id());
    let regions = recv_regions(&sock);
    let (rx, private) = (regions[0], regions[1]);

    // 1. Segment write (the child's alloc_region memory, mapped here).
    let src = f.alloc_region(rx.len as usize, Access::NONE).unwrap();
    fill(&src, pattern_a);
    let list = [
        sge_of(&src, 0, src.len() / 2),
        sge_of(&src, src.len() / 2, src.len() / 2),
    ];
    let c = post(&qp, &write_wr(&list, rx.addr, rx.rkey, true));
    assert_eq!(
        c[0].status,
        CompletionStatus::Success,
        "{:?}",
        qp.last_error()
    );
    oob::send_frame(&sock, b"wrote rx").unwrap();
    expect(&sock, "ok");

    // 2. Private memory: read it all (process_vm_readv), write the second half.
    let back = f
        .alloc_region(private.len as usize, Access::LOCAL_WRITE)
        .unwrap();
    let list = [sge_of(&back, 0, back.len())];
    let c = post(&qp, &read_wr(&list, private.addr, private.rkey));
    assert_eq!(
        c[0].status,
        CompletionStatus::Success,
        "{:?}",
        qp.last_error()
    );
    assert!(bytes(&back)
        .iter()
        .enumerate()
        .all(|(i, &x)| x == pattern_b(i)));
    let half = private.len as usize / 2;
    let src_c = f.alloc_region(half, Access::NONE).unwrap();
    fill(&src_c, pattern_c);
    // Unaligned split of the gather list, so the last word straddles entries.
    let list = [sge_of(&src_c, 0, half - 5), sge_of(&src_c, half - 5, 5)];
    let c = post(
        &qp,
        &write_wr(&list, private.addr + half as u64, private.rkey, true),
    );
    assert_eq!(
        c[0].status,
        CompletionStatus::Success,
        "{:?}",
        qp.last_error()
    );
    oob::send_frame(&sock, b"wrote private").unwrap();
    expect(&sock, "ok");

    // 3. A segment the child created after the card: opened through /proc.
    let late = recv_regions(&sock)[0];
    let list = [sge_of(&src, 0, late.len as usize)];
    let c = post(&qp, &write_wr(&list, late.addr, late.rkey, true));
    assert_eq!(
        c[0].status,
        CompletionStatus::Success,
        "{:?}",
        qp.last_error()
    );
    oob::send_frame(&sock, b"wrote late").unwrap();
    expect(&sock, "ok");

    // 4. The child writes into our region.
    send_regions(&sock, &[mine.remote()]);
    expect(&sock, "wrote parent");
    assert!(bytes(&mine)
        .iter()
        .enumerate()
        .all(|(i, &x)| x == pattern_c(i)));

    // 5. A bad key across processes, then a vanished peer queue pair.
    let s8 = [sge_of(&src, 0, 8)];
    assert_fails(
        &qp,
        &write_wr(&s8, rx.addr, rx.rkey ^ 0x10000, false),
        CompletionStatus::RemoteAccessError,
    );
    assert_eq!(spare.state(), QpState::ReadyToSend);
    oob::send_frame(&sock, b"drop spare").unwrap();
    expect(&sock, "dropped");
    assert_fails(
        &spare,
        &write_wr(&s8, rx.addr, rx.rkey, false),
        CompletionStatus::TransportError,
    );
    oob::send_frame(&sock, b"bye").unwrap();
    finish_child(child);
}

#[test]
fn cross_process_peer_death_is_noticed() {
    let (mut child, sock) = spawn_child("linger");
    let f = fabric();
    let qp = exchange(&f, &sock, false);
    expect(&sock, "ready");
    assert_eq!(qp.state(), QpState::ReadyToSend);
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while qp.state() == QpState::ReadyToSend {
        assert!(Instant::now() < deadline, "peer death not noticed");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        qp.last_error().unwrap().contains("exited"),
        "{:?}",
        qp.last_error()
    );
    let src = f.alloc_region(8, Access::NONE).unwrap();
    let c = post(&qp, &write_wr(&[sge_of(&src, 0, 8)], 0, 1, true));
    assert_eq!(c[0].status, CompletionStatus::Flushed);
}
