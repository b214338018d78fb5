//! Single-threaded model execution: one thread drives both ends in a generated order,
//! so every interleaving is deterministic and checked against the model.

use super::*;

pub(crate) fn sum(shape: &[usize]) -> usize {
    shape.iter().sum()
}

/// Pops `m` bytes from the model and compares them with `got`.
pub(crate) fn check_against_model(
    model: &mut VecDeque<u8>,
    got: &[u8],
    what: &str,
) -> Result<(), String> {
    if got.len() > model.len() {
        return Err(format!(
            "{what}: got {} bytes but only {} were put",
            got.len(),
            model.len()
        ));
    }
    let (s1, s2) = model.as_slices();
    let n1 = s1.len().min(got.len());
    let ok = s1[..n1] == got[..n1] && s2[..got.len() - n1] == got[n1..];
    if !ok {
        let exp: Vec<u8> = model.iter().take(got.len()).copied().collect();
        let i = exp.iter().zip(got).position(|(a, b)| a != b).unwrap();
        return Err(format!(
            "{what}: data differs at byte {i} of {}: got {:#04x}, expected {:#04x}; got[{}..] = {:02x?}, expected {:02x?}",
            got.len(),
            got[i],
            exp[i],
            i.saturating_sub(8) / 8 * 8,
            &got[i.saturating_sub(8) / 8 * 8..(i + 16).min(got.len())],
            &exp[i.saturating_sub(8) / 8 * 8..(i + 16).min(got.len())],
        ));
    }
    model.drain(..got.len());
    Ok(())
}

/// Where a direction stands with respect to flow control, for the liveness check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stall {
    /// The last put took everything offered.
    None,
    /// The last put was cut short: the sender found the ring full and asked for credit.
    Short,
    /// ... and the receiver has polled since.
    Polled,
}

pub(crate) struct SingleState {
    pub(crate) s: [Option<RdmaStream>; 2],
    pub(crate) model: [VecDeque<u8>; 2],
    /// Per direction. Liveness rule: once a put was cut short (the sender asked for
    /// credit) and the receiver then polled, a put must make progress as soon as
    /// everything sent has been read. (Before the first stall a put may legitimately
    /// find the ring full because tail updates are delayed; the stall is what asks
    /// for the update.)
    pub(crate) stall: [Stall; 2],
    pub(crate) ring: usize,
    pub(crate) log: Vec<String>,
}

impl SingleState {
    pub(crate) fn stream(&mut self, i: usize) -> &mut RdmaStream {
        self.s[i].as_mut().expect("stream still open")
    }

    pub(crate) fn put(
        &mut self,
        dir: Dir,
        shape: &[usize],
        data: Data,
        seed: u64,
    ) -> Result<usize, String> {
        let (w, _) = dir.ends();
        let d = dir.idx();
        let total = sum(shape);
        let ring = self.ring;
        let head = self.stream(w).channel().sender().position();
        let bytes = gen_data(data, seed, head, ring, total, ring + 64);
        let iov = iovecs(&bytes, shape, 0);
        let put_err = |e: io::Error| {
            format!(
                "put({dir:?}, {} pieces, {total} B) failed: {}",
                shape.len(),
                ioe(&e)
            )
        };
        let mut n = self.stream(w).put(&iov).map_err(put_err)?;
        let live_now = |st: &SingleState, n: usize| {
            !(total > 0
                && n == 0
                && st.model[d].is_empty()
                && st.stall[d] == Stall::Polled
                && liveness_checked())
        };
        if !live_now(self, n) && lands_later() {
            // The credit request, or the answer to it, may still be in flight: the
            // rule then is that the put goes through while the receiver keeps polling.
            let start = Instant::now();
            let mut polls = 0;
            while n == 0 && start.elapsed() < SETTLE {
                self.get(dir, &[1])?;
                polls += 1;
                n = self.stream(w).put(&iov).map_err(put_err)?;
            }
            self.log.push(format!(
                "  (put retried while the receiver polled {polls} times)"
            ));
        }
        self.log.push(format!(
            "put {dir:?} {total} B ({} pieces, {data:?}) at head {head} -> {n}",
            shape.len()
        ));
        if n > total {
            return Err(format!("put took {n} bytes but only {total} were offered"));
        }
        if !live_now(self, n) {
            return Err(format!(
                "liveness: put({dir:?}) of {total} B took nothing although the receiver has read \
                 everything and polled since the sender's last stall (sender position {head})"
            ));
        }
        if total > 0 {
            self.stall[d] = if n < total { Stall::Short } else { Stall::None };
        }
        self.model[d].extend(&bytes[..n]);
        Ok(n)
    }

    pub(crate) fn get(&mut self, dir: Dir, shape: &[usize]) -> Result<usize, String> {
        let (_, r) = dir.ends();
        let d = dir.idx();
        let cap = sum(shape);
        let mut buf = vec![0u8; cap];
        let want = cap.min(self.model[d].len());
        let get_err = |e: io::Error| {
            format!(
                "get({dir:?}, {} pieces, {cap} B) failed: {}",
                shape.len(),
                ioe(&e)
            )
        };
        let mut m = {
            let mut iov = iovecs_mut(&mut buf, shape);
            self.stream(r).get(&mut iov)
        }
        .map_err(get_err)?;
        let mut polls = 1;
        if m < want && lands_later() {
            // Bytes still in flight: keep polling into the rest of the buffers.
            let start = Instant::now();
            while m < want && m <= cap && start.elapsed() < SETTLE {
                let mut iov = iovecs_mut_from(&mut buf, shape, m);
                m += self.stream(r).get(&mut iov).map_err(get_err)?;
                polls += 1;
            }
        }
        self.log.push(format!(
            "get {dir:?} cap {cap} ({} pieces) -> {m}{}",
            shape.len(),
            if polls > 1 {
                format!(" ({polls} polls)")
            } else {
                String::new()
            }
        ));
        if m > cap {
            return Err(format!("get returned {m} bytes into buffers of {cap}"));
        }
        // Single-threaded, every put has placed its bytes in the peer's ring when it
        // returns on the emulated fabric (it writes synchronously), so a get must
        // deliver everything that fits; where writes land later, the polls above must
        // have delivered it within SETTLE.
        if m != want {
            return Err(format!(
                "get({dir:?}) returned {m} bytes; {} were put and not yet read, buffers hold {cap}",
                self.model[d].len()
            ));
        }
        check_against_model(&mut self.model[d], &buf[..m], &format!("get {dir:?}"))?;
        if self.stall[d] == Stall::Short {
            self.stall[d] = Stall::Polled;
        }
        Ok(m)
    }

    /// Peeks at `dir`'s stream, checks the lent bytes against the model, and consumes
    /// at most `take` of them (a refused over-long consume first).
    pub(crate) fn peek(&mut self, dir: Dir, take: usize) -> Result<usize, String> {
        let (_, r) = dir.ends();
        let d = dir.idx();
        let err = |what: &str, e: io::Error| format!("{what}({dir:?}) failed: {}", ioe(&e));
        // Out of `self` while the stream is borrowed (errors end the case anyway).
        let mut model = std::mem::take(&mut self.model[d]);
        let start = Instant::now();
        let mut polls = 0;
        let (lent, taken) = loop {
            polls += 1;
            let rx = self.stream(r).channel().receiver();
            match rx.peek().map_err(|e| err("peek", e))? {
                Peeked::Bytes(bytes) => {
                    if bytes.is_empty() || bytes.len() > model.len() {
                        return Err(format!(
                            "peek({dir:?}) lent {} bytes; {} were put and not yet read",
                            bytes.len(),
                            model.len()
                        ));
                    }
                    let copy = bytes.to_vec();
                    // Peeking consumes nothing: compare with a copy of the model.
                    check_against_model(&mut model.clone(), &copy, "peek")?;
                    let len = copy.len();
                    match rx.consume(len + 1) {
                        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {}
                        other => {
                            return Err(format!(
                            "consume({}) after a peek of {len}: {other:?} (expected InvalidInput)",
                            len + 1
                        ))
                        }
                    }
                    let n = take.min(len);
                    rx.consume(n).map_err(|e| err("consume", e))?;
                    check_against_model(&mut model, &copy[..n], "consume")?;
                    break (len, n);
                }
                Peeked::Nothing if model.is_empty() => break (0, 0),
                Peeked::Nothing if lands_later() && start.elapsed() < SETTLE => {}
                Peeked::Nothing => {
                    return Err(format!(
                        "peek({dir:?}) lent nothing; {} bytes were put and not yet read",
                        model.len()
                    ))
                }
                Peeked::ZeroCopy { left } => {
                    return Err(format!(
                        "peek({dir:?}) found a zero-copy transfer of {left} bytes; puts here copy"
                    ))
                }
            }
        };
        self.model[d] = model;
        self.log.push(format!(
            "peek {dir:?} -> {lent}, consumed {taken}{}",
            if polls > 1 {
                format!(" ({polls} polls)")
            } else {
                String::new()
            }
        ));
        if taken > 0 && self.stall[d] == Stall::Short {
            self.stall[d] = Stall::Polled;
        }
        Ok(taken)
    }

    /// Reads until the model of `dir` is empty.
    pub(crate) fn drain(&mut self, dir: Dir, rng: &mut Rng) -> Result<(), String> {
        let mut iters = 0;
        while !self.model[dir.idx()].is_empty() {
            iters += 1;
            if iters > 100_000 {
                return Err(format!(
                    "drain {dir:?}: {} bytes never arrived",
                    self.model[dir.idx()].len()
                ));
            }
            let cap = rng.range(1, 3 * self.ring);
            let shape = random_shape(rng, cap, 4);
            self.get(dir, &shape)?;
        }
        Ok(())
    }

    /// After a shutdown or drop of `dir`'s writer: the reader gets the rest, then end of
    /// stream, repeatedly; `read` says 0.
    pub(crate) fn drain_to_eof(&mut self, dir: Dir, rng: &mut Rng) -> Result<(), String> {
        let (_, r) = dir.ends();
        let d = dir.idx();
        let mut iters = 0;
        let waiting = Instant::now();
        loop {
            iters += 1;
            if iters > 100_000 {
                return Err(format!(
                    "{dir:?}: no end of stream after close ({} bytes left)",
                    self.model[d].len()
                ));
            }
            let cap = rng.range(1, 2 * self.ring);
            let mut buf = vec![0u8; cap];
            match self.stream(r).get(&mut [IoSliceMut::new(&mut buf)]) {
                // The rest of the data or the end-of-stream notice is still in flight.
                Ok(0) if lands_later() && waiting.elapsed() < SETTLE => {
                    iters -= 1;
                    std::thread::yield_now();
                }
                Ok(0) => {
                    if self.model[d].is_empty() {
                        // Allowed only transiently; the close notice is written before
                        // shutdown_write returns, so it should not happen at all here.
                        return Err(format!(
                            "{dir:?}: get returned Ok(0) after close instead of UnexpectedEof"
                        ));
                    }
                    return Err(format!(
                        "{dir:?}: get returned 0 with {} bytes outstanding",
                        self.model[d].len()
                    ));
                }
                Ok(m) => check_against_model(
                    &mut self.model[d],
                    &buf[..m],
                    &format!("drain {dir:?} after close"),
                )?,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    if !self.model[d].is_empty() {
                        return Err(format!(
                            "{dir:?}: end of stream with {} bytes unread",
                            self.model[d].len()
                        ));
                    }
                    break;
                }
                Err(e) => return Err(format!("{dir:?}: get after close: {}", ioe(&e))),
            }
        }
        for _ in 0..3 {
            match self.stream(r).get(&mut [IoSliceMut::new(&mut [0u8; 16])]) {
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
                other => return Err(format!("{dir:?}: get after end of stream: {other:?}")),
            }
        }
        match self.stream(r).read(&mut [0u8; 16]) {
            Ok(0) => {}
            other => {
                return Err(format!(
                    "{dir:?}: read after end of stream: {other:?} (expected Ok(0))"
                ))
            }
        }
        Ok(())
    }

    /// A put/get round trip in `dir` must still work.
    pub(crate) fn round_trip(&mut self, dir: Dir, rng: &mut Rng, what: &str) -> Result<(), String> {
        // The receiver polls (serving any credit request); a small put may still find
        // the ring full once (delayed tail updates: the stall asks for credit), but
        // after one more poll it must go through, and come back intact. (Where writes
        // land later, the request and its answer may be in flight: poll until SETTLE.)
        let start = Instant::now();
        let mut attempt = 0;
        loop {
            self.get(dir, &[64])?;
            let n = self.put(dir, &[100], Data::Random, rng.next_u64())?;
            if n > 0 {
                return self.drain(dir, rng);
            }
            if lands_later() && start.elapsed() < SETTLE {
                continue;
            }
            if attempt >= 1 {
                if !liveness_checked() {
                    // Exploration mode: let the sender read its own incoming ring (it
                    // may learn piggybacked tails there) and try once more.
                    let (w, _) = dir.ends();
                    let _ = self.stream(w).get(&mut [IoSliceMut::new(&mut [])]);
                    let back = if dir == Dir::AB { Dir::BA } else { Dir::AB };
                    self.drain(back, rng)?;
                    let n = self.put(dir, &[100], Data::Random, rng.next_u64())?;
                    if n > 0 {
                        return self.drain(dir, rng);
                    }
                }
                return Err(format!(
                    "{what}: {dir:?} accepts nothing after the receiver drained and polled twice"
                ));
            }
            attempt += 1;
        }
    }
}

/// The liveness checks of the single-threaded model are on unless
/// `RCH_TEST_NO_LIVENESS=1` (for exploring other properties while a liveness bug is
/// open; never set it in CI).
pub(crate) fn liveness_checked() -> bool {
    std::env::var("RCH_TEST_NO_LIVENESS").map_or(true, |v| v.is_empty() || v == "0")
}

/// Runs a single-threaded case under a watchdog (the case only makes non-blocking
/// calls and bounded loops, apart from one `read` at end of stream; this bounds it all).
pub(crate) fn run_single(t: &Tun, ops: &[Op], end: End) -> Result<(), String> {
    let (t, ops) = (t.clone(), ops.to_vec());
    watched("single-threaded case", case_limit(), move || {
        run_single_unwatched(&t, &ops, end)
    })
}

pub(crate) fn run_single_unwatched(t: &Tun, ops: &[Op], end: End) -> Result<(), String> {
    let (a, b) =
        RdmaStream::pair_with(t.config()).map_err(|e| format!("pair_with: {}", ioe(&e)))?;
    let mut st = SingleState {
        s: [Some(a), Some(b)],
        model: [VecDeque::new(), VecDeque::new()],
        stall: [Stall::None, Stall::None],
        ring: t.ring,
        log: Vec::new(),
    };
    let r = run_single_inner(&mut st, ops, end);
    r.map_err(|e| {
        let tail: Vec<&String> = st
            .log
            .iter()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!(
            "{e}\n  last operations:\n    {}",
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n    ")
        )
    })
}

pub(crate) fn run_single_inner(st: &mut SingleState, ops: &[Op], end: End) -> Result<(), String> {
    for op in ops {
        match op {
            Op::Put {
                dir,
                shape,
                data,
                seed,
            } => {
                st.put(*dir, shape, *data, *seed)?;
            }
            Op::Get { dir, shape } => {
                st.get(*dir, shape)?;
            }
            Op::Peek { dir, take } => {
                st.peek(*dir, *take)?;
            }
        }
    }
    let mut rng = Rng::new(ops.len() as u64 * 7919 + st.ring as u64);
    match end {
        End::Drain => {
            st.drain(Dir::AB, &mut rng)?;
            st.drain(Dir::BA, &mut rng)?;
            // Nothing stale may be taken for a packet now that the rings are empty.
            st.get(Dir::AB, &[3 * st.ring])?;
            st.get(Dir::BA, &[3 * st.ring])?;
            st.round_trip(Dir::AB, &mut rng, "after drain")?;
            st.round_trip(Dir::BA, &mut rng, "after drain")?;
        }
        End::Shutdown(dir) => {
            let (w, _) = dir.ends();
            st.stream(w)
                .shutdown_write()
                .map_err(|e| format!("shutdown_write: {}", ioe(&e)))?;
            st.drain_to_eof(dir, &mut rng)?;
            match st.stream(w).put(&[IoSlice::new(b"late")]) {
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
                other => {
                    return Err(format!(
                        "put after shutdown_write: {other:?} (expected BrokenPipe)"
                    ))
                }
            }
            // The other direction is unaffected (half close).
            let other = if dir == Dir::AB { Dir::BA } else { Dir::AB };
            st.drain(other, &mut rng)?;
            st.round_trip(other, &mut rng, "after the other direction was shut down")?;
        }
        End::Drop(dir) => {
            let (w, r) = dir.ends();
            drop(st.s[w].take());
            st.drain_to_eof(dir, &mut rng)?;
            match st.stream(r).put(&[IoSlice::new(b"to nobody")]) {
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
                other => {
                    return Err(format!(
                        "put to a dropped peer: {other:?} (expected BrokenPipe)"
                    ))
                }
            }
        }
    }
    Ok(())
}
