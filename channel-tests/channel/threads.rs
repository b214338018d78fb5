//! Multi-threaded model execution: writer and reader threads per direction, one or both
//! ways, blocking and non-blocking, with streams compared byte for byte.

use super::*;

#[derive(Clone, Debug)]
pub(crate) struct PutSpec {
    pub(crate) shape: Vec<usize>,
    pub(crate) data: Data,
    pub(crate) seed: u64,
}

pub(crate) fn put_spec_strategy(t: &Tun) -> BoxedStrategy<PutSpec> {
    (shape_strategy(t), data_strategy(), any::<u64>())
        .prop_map(|(shape, data, seed)| PutSpec { shape, data, seed })
        .boxed()
}

/// How the writer thread ends its stream.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WriterEnd {
    Shutdown,
    Drop,
}

#[derive(Clone, Debug)]
pub(crate) struct Flow {
    pub(crate) puts: Vec<PutSpec>,
    pub(crate) gets: Vec<Vec<usize>>,
    pub(crate) end: WriterEnd,
}

pub(crate) fn flow_strategy(t: &Tun, max_puts: usize) -> BoxedStrategy<Flow> {
    (
        vec(put_spec_strategy(t), 0..=max_puts),
        vec(shape_strategy(t), 1..=8),
        prop_oneof![Just(WriterEnd::Shutdown), Just(WriterEnd::Drop)],
    )
        .prop_map(|(puts, mut gets, end)| {
            // At least one shape with room, so the reader always makes progress.
            gets.push(vec![1000]);
            Flow { puts, gets, end }
        })
        .boxed()
}

/// Time bound of one property case (a hang fails the case).
pub(crate) fn case_limit() -> Duration {
    limit(30)
}

/// Does every put of `flow`, retrying the rest until all was taken; returns the bytes
/// sent. `put` is the non-blocking put, `position` the sender's head (real, or an
/// estimate when the half does not expose it).
pub(crate) fn writer_loop(
    flow: &Flow,
    ring: usize,
    mut put: impl FnMut(&[IoSlice<'_>]) -> io::Result<usize>,
    mut position: impl FnMut(u64) -> u64,
    abort: &AtomicBool,
    deadline: Deadline,
) -> Result<Vec<u8>, String> {
    let mut sent = Vec::new();
    for (i, p) in flow.puts.iter().enumerate() {
        let total = sum(&p.shape);
        let head = position(sent.len() as u64);
        let bytes = gen_data(p.data, p.seed, head, ring, total, usize::MAX);
        let mut off = 0;
        let mut spins = 0u64;
        loop {
            let iov = iovecs(&bytes, &p.shape, off);
            let n =
                put(&iov).map_err(|e| format!("put #{i} ({total} B, {off} done): {}", ioe(&e)))?;
            if n > total - off {
                return Err(format!(
                    "put #{i} took {n} bytes, only {} offered",
                    total - off
                ));
            }
            off += n;
            if off == total {
                break;
            }
            if n == 0 {
                spins += 1;
                if spins % 64 == 0 {
                    if abort.load(Ordering::Relaxed) {
                        return Err("aborted (other thread failed)".into());
                    }
                    deadline.check(|| {
                        format!(
                            "writer stuck in put #{i}: {off} of {total} B, {} B sent before",
                            sent.len()
                        )
                    })?;
                }
                std::thread::yield_now();
            }
        }
        sent.extend_from_slice(&bytes);
    }
    Ok(sent)
}

/// Gets with the shapes of `flow` in turn until end of stream; returns what arrived.
pub(crate) fn reader_loop(
    gets: &[Vec<usize>],
    expected_len: usize,
    mut get: impl FnMut(&mut [IoSliceMut<'_>]) -> io::Result<usize>,
    abort: &AtomicBool,
    deadline: Deadline,
) -> Result<Vec<u8>, String> {
    let mut got = Vec::with_capacity(expected_len);
    let mut buf = Vec::new();
    let mut spins = 0u64;
    let mut k = 0usize;
    loop {
        let shape = &gets[k % gets.len()];
        k += 1;
        let cap = sum(shape);
        buf.resize(cap, 0);
        let r = {
            let mut iov = iovecs_mut(&mut buf, shape);
            get(&mut iov)
        };
        match r {
            Ok(m) => {
                if m > cap {
                    return Err(format!("get returned {m} bytes into {cap}"));
                }
                got.extend_from_slice(&buf[..m]);
                if got.len() > expected_len {
                    return Err(format!(
                        "received {} bytes, more than the {expected_len} sent",
                        got.len()
                    ));
                }
                if m == 0 {
                    spins += 1;
                    if spins % 64 == 0 {
                        if abort.load(Ordering::Relaxed) {
                            return Err("aborted (other thread failed)".into());
                        }
                        deadline.check(|| {
                            format!(
                                "reader: {} of {expected_len} B received, no end of stream",
                                got.len()
                            )
                        })?;
                    }
                    std::thread::yield_now();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                if got.len() != expected_len {
                    return Err(format!(
                        "end of stream after {} of {expected_len} bytes",
                        got.len()
                    ));
                }
                return Ok(got);
            }
            Err(e) => return Err(format!("get after {} B: {}", got.len(), ioe(&e))),
        }
    }
}

pub(crate) fn compare_streams(sent: &[u8], got: &[u8], what: &str) -> Result<(), String> {
    if sent == got {
        return Ok(());
    }
    if sent.len() != got.len() {
        return Err(format!(
            "{what}: sent {} bytes, received {}",
            sent.len(),
            got.len()
        ));
    }
    let i = sent.iter().zip(got).position(|(a, b)| a != b).unwrap();
    Err(format!(
        "{what}: byte {i} of {} differs: sent {:#04x}, received {:#04x}; around: sent {:02x?} received {:02x?}",
        sent.len(),
        sent[i],
        got[i],
        &sent[i.saturating_sub(8)..(i + 8).min(sent.len())],
        &got[i.saturating_sub(8)..(i + 8).min(got.len())]
    ))
}

pub(crate) fn flow_total(f: &Flow) -> usize {
    f.puts.iter().map(|p| sum(&p.shape)).sum()
}

/// Collects the results of several threads; reports every real failure (threads that
/// only stopped because another one failed are left out unless nothing else failed).
pub(crate) fn all_ok(results: Vec<(&str, Result<(), String>)>) -> Result<(), String> {
    let errs: Vec<String> = results
        .iter()
        .filter_map(|(who, r)| r.as_ref().err().map(|e| format!("{who}: {e}")))
        .collect();
    if errs.is_empty() {
        return Ok(());
    }
    let real: Vec<&String> = errs.iter().filter(|e| !e.contains("aborted (")).collect();
    if real.is_empty() {
        Err(errs.join("\n  "))
    } else {
        Err(real
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  "))
    }
}

/// A rough guess at the sender position after `sent` payload bytes (for halves, which
/// do not expose it): chunk-sized packets plus overhead, rounded to cells.
pub(crate) fn estimate_position(chunk: usize) -> impl FnMut(u64) -> u64 + Send + Copy {
    move |sent: u64| {
        let packets = sent / (chunk as u64 - 24) + 1;
        (sent + packets * 40) / 64 * 64
    }
}

/// Ends a writer the way its flow says (shut down or dropped) once `sent` is known,
/// and raises `abort` for the reader on any error.
fn end_writer<W>(
    sent: Result<Vec<u8>, String>,
    end: WriterEnd,
    mut w: W,
    shutdown: impl FnOnce(&mut W) -> io::Result<()>,
    abort: &AtomicBool,
) -> Result<Vec<u8>, String> {
    let r = sent.and_then(|sent| match end {
        WriterEnd::Shutdown => shutdown(&mut w)
            .map(|_| sent)
            .map_err(|e| format!("shutdown: {}", ioe(&e))),
        WriterEnd::Drop => {
            drop(w);
            Ok(sent)
        }
    });
    if r.is_err() {
        abort.store(true, Ordering::Relaxed);
    }
    r
}

pub(crate) fn spawn_half_writer(
    mut w: rdma_channel::WriteHalf,
    flow: Flow,
    t: &Tun,
    abort: Arc<AtomicBool>,
    deadline: Deadline,
) -> std::thread::JoinHandle<Result<Vec<u8>, String>> {
    let (ring, chunk) = (t.ring, t.chunk);
    std::thread::spawn(move || {
        let r = writer_loop(
            &flow,
            ring,
            |iov| w.put(iov),
            estimate_position(chunk),
            &abort,
            deadline,
        );
        end_writer(r, flow.end, w, |w| w.shutdown(), &abort)
    })
}

pub(crate) fn spawn_half_reader(
    mut r: rdma_channel::ReadHalf,
    flow: &Flow,
    abort: Arc<AtomicBool>,
    deadline: Deadline,
) -> std::thread::JoinHandle<Result<Vec<u8>, String>> {
    let (gets, expected) = (flow.gets.clone(), flow_total(flow));
    std::thread::spawn(move || {
        let res = reader_loop(&gets, expected, |iov| r.get(iov), &abort, deadline);
        if res.is_err() {
            abort.store(true, Ordering::Relaxed);
        }
        res
    })
}

pub(crate) fn check_flow(
    sent: Result<Vec<u8>, String>,
    got: Result<Vec<u8>, String>,
    what: &str,
) -> Vec<(String, Result<(), String>)> {
    match (sent, got) {
        (Ok(s), Ok(g)) => vec![(what.to_string(), compare_streams(&s, &g, what))],
        (s, g) => vec![
            (format!("{what} writer"), s.map(|_| ())),
            (format!("{what} reader"), g.map(|_| ())),
        ],
    }
}

pub(crate) fn report(results: Vec<(String, Result<(), String>)>) -> Result<(), String> {
    all_ok(
        results
            .iter()
            .map(|(w, r)| (w.as_str(), r.clone()))
            .collect(),
    )
}

/// One direction, split halves: a writer thread with A's write half, a reader thread
/// with B's read half (A's read half and B's write half stay idle in this thread).
pub(crate) fn run_two_threads_one_way(t: &Tun, flow: &Flow) -> Result<(), String> {
    let (a, b) =
        RdmaStream::pair_with(t.config()).map_err(|e| format!("pair_with: {}", ioe(&e)))?;
    let (_ra, wa) = a.split();
    let (rb, _wb) = b.split();
    let abort = Arc::new(AtomicBool::new(false));
    let deadline = Deadline::after(case_limit());
    let w = spawn_half_writer(wa, flow.clone(), t, abort.clone(), deadline);
    let r = spawn_half_reader(rb, flow, abort, deadline);
    let (sent, got) = (join(w, "writer"), join(r, "reader"));
    report(check_flow(sent, got, "A->B"))
}

/// One direction, two threads each owning a whole stream, so the writer knows its real
/// position and the flag-word payloads are exact.
pub(crate) fn run_two_threads_one_way_exact(t: &Tun, flow: &Flow) -> Result<(), String> {
    let (a, mut b) =
        RdmaStream::pair_with(t.config()).map_err(|e| format!("pair_with: {}", ioe(&e)))?;
    let abort = Arc::new(AtomicBool::new(false));
    let deadline = Deadline::after(case_limit());
    let expected = flow_total(flow);
    let ring = t.ring;
    let w = {
        let (flow, abort) = (flow.clone(), abort.clone());
        std::thread::spawn(move || {
            let a = std::cell::RefCell::new(a);
            let r = writer_loop(
                &flow,
                ring,
                |iov| a.borrow_mut().put(iov),
                |_| a.borrow_mut().channel().sender().position(),
                &abort,
                deadline,
            );
            end_writer(r, flow.end, a.into_inner(), |a| a.shutdown_write(), &abort)
        })
    };
    let rd = {
        let (gets, abort) = (flow.gets.clone(), abort.clone());
        std::thread::spawn(move || {
            let r = reader_loop(&gets, expected, |iov| b.get(iov), &abort, deadline);
            if r.is_err() {
                abort.store(true, Ordering::Relaxed);
            }
            r
        })
    };
    let (sent, got) = (join(w, "writer"), join(rd, "reader"));
    report(check_flow(sent, got, "A->B"))
}

/// Both directions at once with split halves: four threads.
pub(crate) fn run_two_threads_both_ways(t: &Tun, ab: &Flow, ba: &Flow) -> Result<(), String> {
    let (a, b) =
        RdmaStream::pair_with(t.config()).map_err(|e| format!("pair_with: {}", ioe(&e)))?;
    let (ra, wa) = a.split();
    let (rb, wb) = b.split();
    let abort = Arc::new(AtomicBool::new(false));
    let deadline = Deadline::after(case_limit());
    let w1 = spawn_half_writer(wa, ab.clone(), t, abort.clone(), deadline);
    let w2 = spawn_half_writer(wb, ba.clone(), t, abort.clone(), deadline);
    let r1 = spawn_half_reader(rb, ab, abort.clone(), deadline);
    let r2 = spawn_half_reader(ra, ba, abort, deadline);
    let (s1, s2, g1, g2) = (
        join(w1, "writer A->B"),
        join(w2, "writer B->A"),
        join(r1, "reader A->B"),
        join(r2, "reader B->A"),
    );
    let mut res = check_flow(s1, g1, "A->B");
    res.extend(check_flow(s2, g2, "B->A"));
    report(res)
}
