//! A model test of the zero-copy path, generic over the fabric so that the emulated
//! and the verbs test binaries run the same checks.
//!
//! One thread drives both ends of a connection in a random interleaving: the sender
//! offers messages (lists of buffers, some in private memory, some from `alloc_mem`,
//! some of them at or above the zero-copy thresholds) with `put_nocopy` or
//! `put_lending`, now and then with the copying `put`; a message whose buffers were
//! lent is kept until `lends_released` passes its ticket, and then overwritten before
//! it is dropped, so a release that came early shows as bytes that differ. The
//! receiver takes the stream with random, often smaller,
//! scatter lists, with `get` or `get_nowait` (which leaves reads in flight and is then
//! called again on the same place). The bytes received must be exactly the bytes
//! sent, in order.

use std::io::{IoSlice, IoSliceMut};

use rdma_channel::fabric::Fabric;
use rdma_channel::{Channel, RdmaBuf};

use super::{iovecs_mut, random_shape, Rng};

/// A buffer of a message: private memory or memory from `alloc_mem`.
pub enum Buf<F: Fabric> {
    /// Ordinary heap memory.
    Private(Vec<u8>),
    /// Registered memory from the connection's allocator.
    Allocated(RdmaBuf<F>),
}

impl<F: Fabric> Buf<F> {
    fn bytes(&self) -> &[u8] {
        match self {
            Buf::Private(v) => v,
            Buf::Allocated(b) => b,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Buf::Private(v) => v,
            Buf::Allocated(b) => b,
        }
    }
}

/// Shape of one model run.
#[derive(Clone, Debug)]
pub struct ZcCase {
    /// PRNG seed for sizes, contents and the interleaving.
    pub seed: u64,
    /// Messages to send.
    pub messages: usize,
    /// Largest buffer in a message.
    pub max_buf: usize,
    /// Chance (in 8) that a buffer comes from `alloc_mem`.
    pub alloc_in_8: u64,
}

fn make_message<F: Fabric>(
    rng: &mut Rng,
    chan: &Channel<F>,
    case: &ZcCase,
) -> Result<Vec<Buf<F>>, String> {
    let pieces = rng.range(1, 5);
    let mut msg = Vec::with_capacity(pieces);
    for _ in 0..pieces {
        let len = if rng.chance(1, 8) {
            0
        } else {
            rng.log_uniform(1, case.max_buf)
        };
        if len > 0 && rng.below(8) < case.alloc_in_8 {
            let mut b = chan
                .alloc_mem(len)
                .map_err(|e| format!("alloc_mem({len}): {e}"))?;
            rng.fill(&mut b);
            msg.push(Buf::Allocated(b));
        } else {
            msg.push(Buf::Private(rng.bytes(len)));
        }
    }
    Ok(msg)
}

/// The buffers of `msg` from byte `done` on.
fn rest<F: Fabric>(msg: &[Buf<F>], mut done: usize) -> Vec<IoSlice<'_>> {
    let mut out = Vec::with_capacity(msg.len());
    for b in msg {
        let bytes = b.bytes();
        if done >= bytes.len() {
            done -= bytes.len();
            continue;
        }
        out.push(IoSlice::new(&bytes[done..]));
        done = 0;
    }
    out
}

/// What one model run did.
#[derive(Clone, Copy, Debug, Default)]
pub struct ZcRun {
    /// Bytes moved.
    pub bytes: usize,
    /// Receives that found `get_nowait`'s reads still in flight and offered the same
    /// place again.
    pub in_flight_retries: usize,
    /// Calls of `put_lending` that lent a buffer.
    pub lent: u64,
}

/// Runs one case from `a` to `b`.
pub fn run_zc_model<F: Fabric>(
    a: &mut Channel<F>,
    b: &mut Channel<F>,
    case: &ZcCase,
) -> Result<ZcRun, String> {
    let mut rng = Rng::new(case.seed);
    let mut sent_stream: Vec<u8> = Vec::new();
    let mut got: Vec<u8> = Vec::new();
    let mut current: Option<(Vec<Buf<F>>, usize)> = None;
    let mut made = 0;
    let mut idle_steps = 0u64;
    let mut rbuf = vec![0u8; 2 * case.max_buf + 64];
    let mut in_flight: Option<(usize, usize)> = None;
    let mut in_flight_retries = 0;
    // The current message's highest ticket, and messages counted whose lent buffers
    // are not released yet (with their ticket), oldest first.
    let mut ticket = 0u64;
    let mut lent_msgs: std::collections::VecDeque<(u64, Vec<Buf<F>>)> = Default::default();
    let mut lent = 0u64;
    loop {
        if current.is_none() && made < case.messages {
            let msg = make_message(&mut rng, a, case)?;
            for part in &msg {
                sent_stream.extend_from_slice(part.bytes());
            }
            current = Some((msg, 0));
            made += 1;
        }
        if current.is_none()
            && got.len() == sent_stream.len()
            && in_flight.is_none()
            && lent_msgs.is_empty()
        {
            break;
        }
        let mut progressed = false;
        if !lent_msgs.is_empty() && rng.chance(1, 3) {
            let released = a
                .sender()
                .lends_released()
                .map_err(|e| format!("lends_released: {e}"))?;
            while lent_msgs.front().is_some_and(|(t, _)| *t <= released) {
                let (_, mut msg) = lent_msgs.pop_front().expect("checked above");
                // Released: the peer has read it, so scribbling shows nowhere.
                for part in &mut msg {
                    part.bytes_mut().fill(0xEE);
                }
                progressed = true;
            }
        }
        if let Some((msg, done)) = current.as_mut() {
            if rng.chance(1, 2) {
                let iov = rest(msg, *done);
                let pending = a.sender().zero_copy_pending();
                let n = if !pending && rng.chance(1, 8) {
                    a.put(&iov)
                } else if rng.chance(1, 2) {
                    // SAFETY: `msg` is kept alive and unmodified until lends_released
                    // passes the ticket (it waits in `lent_msgs` until then).
                    unsafe { a.sender().put_lending(&iov) }.map(|l| {
                        if l.ticket != 0 {
                            if l.ticket <= ticket {
                                return usize::MAX;
                            }
                            lent += 1;
                            ticket = l.ticket;
                        }
                        l.bytes
                    })
                } else {
                    // SAFETY: `msg` is kept alive and unmodified until every byte of
                    // it has been counted (it is dropped only after `done == total`).
                    unsafe { a.sender().put_nocopy(&iov) }
                }
                .map_err(|e| format!("put after {} bytes: {e}", *done))?;
                if n == usize::MAX {
                    return Err(format!("put_lending's ticket did not grow past {ticket}"));
                }
                *done += n;
                progressed |= n > 0;
                let total: usize = msg.iter().map(|p| p.bytes().len()).sum();
                if *done > total {
                    return Err(format!("put counted {} of {total} bytes", *done));
                }
                if *done == total && !a.sender().zero_copy_pending() {
                    let (msg, _) = current.take().expect("checked above");
                    if ticket != 0 {
                        lent_msgs.push_back((ticket, msg));
                    }
                    ticket = 0;
                }
            }
        }
        if rng.chance(1, 2) {
            // `from..cap` of rbuf is offered; with reads in flight it must start where
            // they land.
            let (from, cap) = match in_flight {
                Some(at) => at,
                None => (0, rng.log_uniform(1, rbuf.len())),
            };
            let nowait = rng.chance(1, 2);
            let n = if in_flight.is_some() {
                in_flight_retries += 1;
                let iov = &mut [IoSliceMut::new(&mut rbuf[from..cap])];
                if nowait {
                    // SAFETY: rbuf is neither touched nor moved while reads are in
                    // flight: the next receive offers exactly this place again.
                    unsafe { b.receiver().get_nowait(iov) }
                } else {
                    b.get(iov)
                }
            } else {
                let shape = random_shape(&mut rng, cap, 5);
                let mut iov = iovecs_mut(&mut rbuf[..cap], &shape);
                if nowait {
                    // SAFETY: as above.
                    unsafe { b.receiver().get_nowait(&mut iov) }
                } else {
                    b.get(&mut iov)
                }
            }
            .map_err(|e| format!("get after {} bytes: {e}", got.len()))?;
            if n > cap - from {
                return Err(format!("get returned {n} > {}", cap - from));
            }
            in_flight = b.receiver().reads_in_flight().then_some((from + n, cap));
            got.extend_from_slice(&rbuf[from..from + n]);
            if got.len() > sent_stream.len() || got[..] != sent_stream[..got.len()] {
                let at = got
                    .iter()
                    .zip(&sent_stream)
                    .position(|(x, y)| x != y)
                    .unwrap_or(sent_stream.len());
                return Err(format!(
                    "received stream differs from the sent one at byte {at} (received {}, sent {})",
                    got.len(),
                    sent_stream.len()
                ));
            }
            progressed |= n > 0;
        }
        if progressed {
            idle_steps = 0;
        } else {
            idle_steps += 1;
            if idle_steps > 200_000 {
                return Err(format!(
                    "no progress: {} of {} bytes received, message {made} of {}",
                    got.len(),
                    sent_stream.len(),
                    case.messages
                ));
            }
        }
    }
    // Nothing may be left over.
    let mut extra = [0u8; 16];
    let n = b
        .get(&mut [IoSliceMut::new(&mut extra)])
        .map_err(|e| format!("final get: {e}"))?;
    if n != 0 {
        return Err(format!("{n} bytes beyond what was sent"));
    }
    if a.sender().lends_in_flight() != 0 {
        return Err(format!(
            "{} transfers still lent after all was read",
            a.sender().lends_in_flight()
        ));
    }
    Ok(ZcRun {
        bytes: got.len(),
        in_flight_retries,
        lent,
    })
}

/// The sending side of the stale-registration tests: maps `len` bytes, and `rounds`
/// times fills them with `round + 1`, sends them with `send`, then replaces the
/// mapping with fresh memory at the same address (`MAP_FIXED` unmaps the old pages
/// and maps new ones in one call; a separate `munmap` would let another test thread
/// take the address in between). A registration cache that missed the unmap would
/// send the old pages' bytes in the next round.
pub fn send_from_remapped_buffer(
    len: usize,
    rounds: usize,
    mut send: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> Result<(), String> {
    // SAFETY: a fresh anonymous mapping, not yet used by anything.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    let mut result = Ok(());
    for round in 0..rounds {
        // SAFETY: base..base+len is our mapping (replaced below at the same place).
        let buf = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, len) };
        buf.fill(round as u8 + 1);
        if let Err(e) = send(buf) {
            result = Err(format!("round {round}: {e}"));
            break;
        }
        // SAFETY: `buf` is not used after this; the mapping is replaced whole.
        let again = unsafe {
            libc::mmap(
                base,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if again != base {
            result = Err(format!("round {round}: could not map again at {base:?}"));
            break;
        }
    }
    // SAFETY: our mapping, no longer used.
    unsafe { libc::munmap(base, len) };
    result
}
