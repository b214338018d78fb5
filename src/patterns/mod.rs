//! The distributed patterns of seed 004 ("Message passing on InfiniBand RDMA for
//! parallel run-time supports", FastFlow's external channels, which it moved from
//! ZeroMQ to a channel like ours), over the public API only: messages on a stream
//! ([`Messages`]), one-to-many ([`Scatter`], [`OnDemand`]) and many-to-one
//! ([`FromAny`], [`AllGather`]). A farm is an emitter that scatters tasks (or
//! deals them on demand) to workers and a collector that takes their results from
//! any: see the example below, and `cargo bench --bench farm`.
//!
//! The connections may be of any kind: [`RdmaStream::pair`] between threads,
//! a listener's between processes of one host or across hosts.
//!
//! ```
//! use rdma_channel::patterns::{FromAny, Messages, OnDemand, OnDemandWorker};
//! use rdma_channel::RdmaStream;
//!
//! let workers = 3;
//! let (mut to_workers, mut from_workers) = (Vec::new(), Vec::new());
//! let mut threads = Vec::new();
//! for _ in 0..workers {
//!     let (e, w_in) = RdmaStream::pair()?;
//!     let (w_out, c) = RdmaStream::pair()?;
//!     to_workers.push(e);
//!     from_workers.push(c);
//!     threads.push(std::thread::spawn(move || -> std::io::Result<()> {
//!         let mut tasks = OnDemandWorker::new(w_in);
//!         let mut results = Messages::new(w_out);
//!         let mut task = Vec::new();
//!         while tasks.recv(&mut task)? {
//!             let sum: u64 = task.iter().map(|&b| u64::from(b)).sum();
//!             results.send(&sum.to_le_bytes())?;
//!         }
//!         results.close()
//!     }));
//! }
//! let emitter = std::thread::spawn(move || -> std::io::Result<()> {
//!     let mut deal = OnDemand::new(to_workers)?;
//!     for i in 0..100u8 {
//!         deal.send(&[i; 10])?;
//!     }
//!     deal.close()
//! });
//! let mut collector = FromAny::new(from_workers)?;
//! let (mut total, mut got, mut result) = (0u64, 0, Vec::new());
//! while let Some(_worker) = collector.recv(&mut result)? {
//!     total += u64::from_le_bytes(result[..8].try_into().unwrap());
//!     got += 1;
//! }
//! assert_eq!((got, total), (100, (0..100u64).map(|i| 10 * i).sum()));
//! emitter.join().unwrap()?;
//! for t in threads {
//!     t.join().unwrap()?;
//! }
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::time::Instant;

use crate::select::{Interest, Select, Selector};
use crate::stream::RdmaStream;

/// Largest message [`Messages::recv`] accepts (a length above it is a peer that
/// does not speak this framing).
pub const MAX_MESSAGE: usize = 1 << 30;

/// Messages on a stream: each a 4-byte little-endian length, then its bytes.
///
/// A receive that finds nothing waits as a [`Selector`] does (spins
/// [`select::SPIN`](crate::select::SPIN), then sleeps until the peer's write wakes
/// it), not as the stream's blocking read (thousands of polls, then yields): a
/// runtime's threads and processes often outnumber the CPUs, and a waiting one
/// should give its CPU back soon (a farm of two workers and a master's two threads
/// on two CPUs moved 64 KiB tasks at 0.75 GB/s with the stream's wait, 3.2 with a
/// short spin; notebook 2026-12).
///
/// # Batching
///
/// Each [`send`](Self::send) is at least one put, and across hosts one put is one
/// RDMA WRITE: a fabric round of its own, whatever the message's size (~50 us
/// between two Soft-RoCE VMs for 10 B). A sender that knows more messages follow
/// says so with [`send_more`](Self::send_more): small messages then gather in
/// this end's batch (up to [`BATCH_BYTES`]) and go out in one put when it fills,
/// at the next [`send`](Self::send) or [`flush`](Self::flush), before a
/// [`recv`](Self::recv) waits, at [`close`](Self::close) and at drop. What TCP's
/// `MSG_MORE` and ZeroMQ's I/O thread do for their users; it costs one more copy
/// of each small message, and the messages of a batch wait for the batch.
///
/// ```
/// use rdma_channel::patterns::Messages;
/// use rdma_channel::RdmaStream;
///
/// let (a, b) = RdmaStream::pair()?;
/// let (mut tx, mut rx) = (Messages::new(a), Messages::new(b));
/// for i in 0..1000u32 {
///     tx.send_more(&i.to_le_bytes())?; // held here: nothing is put yet
/// }
/// tx.flush()?; // the thousand messages in one put
/// let mut m = Vec::new();
/// for i in 0..1000u32 {
///     assert!(rx.recv(&mut m)?);
///     assert_eq!(m, i.to_le_bytes());
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct Messages {
    stream: RdmaStream,
    /// Made at the first wait.
    selector: Option<Selector>,
    /// Framed messages from [`send_more`](Self::send_more) not yet put.
    batch: Vec<u8>,
}

/// Most bytes [`Messages::send_more`] holds before it puts them: past a few
/// fabric packets a write's fixed cost is a small share of its time (Soft-RoCE
/// moves 16 KiB in ~0.7 ms between the VMs, a write costs ~50 us), and the first
/// message of a batch waits for at most this many bytes behind it.
pub const BATCH_BYTES: usize = 16 << 10;

impl Messages {
    /// Messages on `stream`.
    pub fn new(stream: RdmaStream) -> Messages {
        Messages {
            stream,
            selector: None,
            batch: Vec::new(),
        }
    }

    /// Puts all of `iov`, waiting while the peer's ring is full.
    fn put_all(&mut self, iov: &[IoSlice<'_>], deadline: Option<Instant>) -> io::Result<()> {
        debug_assert!(iov.len() <= 3, "put_all takes at most three slices");
        let total: usize = iov.iter().map(|s| s.len()).sum();
        let mut done = 0;
        while done < total {
            // The slices from byte `done` on (at most three here).
            let mut rest: [IoSlice<'_>; 3] =
                [IoSlice::new(&[]), IoSlice::new(&[]), IoSlice::new(&[])];
            let (mut skip, mut k) = (done, 0);
            for s in iov {
                if skip >= s.len() {
                    skip -= s.len();
                    continue;
                }
                rest[k] = IoSlice::new(&s[skip..]);
                skip = 0;
                k += 1;
            }
            match self.stream.put(&rest[..k])? {
                0 => {
                    let tx = self.stream.channel().sender();
                    tx.wait_writable_until(deadline)?;
                }
                n => done += n,
            }
        }
        Ok(())
    }

    /// Puts the batch, waiting for room until `deadline`; the batch is empty after
    /// it, whatever it returns.
    fn flush_until(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        let r = self.put_all(&[IoSlice::new(&batch)], deadline);
        // The allocation is kept for the next batch.
        self.batch = batch;
        self.batch.clear();
        r
    }

    /// Puts the batch of [`send_more`](Self::send_more), if any, waiting while the
    /// peer's ring is full.
    ///
    /// # Errors
    ///
    /// The stream's. A stream's errors are final (its connection is broken or the
    /// peer stopped reading), and what the batch held is dropped with the error.
    pub fn flush(&mut self) -> io::Result<()> {
        self.flush_until(None)
    }

    /// Bytes held by [`send_more`](Self::send_more) and not yet put (the 4-byte
    /// lengths included).
    pub fn batched(&self) -> usize {
        self.batch.len()
    }

    /// True when [`recv`](Self::recv) would not wait: a message (or part of one,
    /// or the end of the stream) has arrived. A worker that answers each message
    /// with [`send_more`](Self::send_more) flushes its answers when this says
    /// false, before it waits for more.
    ///
    /// # Errors
    ///
    /// The stream's.
    pub fn ready(&mut self) -> io::Result<bool> {
        match self.stream.channel().receiver().poll_readable() {
            Ok(r) => Ok(r),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Fills `buf` from the stream, waiting through the selector while nothing has
    /// arrived; false when the stream ended before the first byte.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            match self.stream.get(&mut [IoSliceMut::new(&mut buf[got..])]) {
                Ok(0) => {
                    // A peer that answers what we batched would wait for it.
                    self.flush()?;
                    if self.selector.is_none() {
                        self.selector = Some(Selector::new()?);
                    }
                    let sel = self.selector.as_mut().expect("made above");
                    let mut item = [Select::new(&mut self.stream, Interest::READABLE)];
                    sel.select(&mut item, None)?;
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && got == 0 => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Sends `msg` whole, after the batch of [`send_more`](Self::send_more) if
    /// any (blocking while the peer's ring is full).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a message above [`MAX_MESSAGE`]; the stream's.
    pub fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        self.send_framed(msg, false)
    }

    /// Sends `msg` when the batch fills or at the next [`send`](Self::send),
    /// [`flush`](Self::flush), waiting [`recv`](Self::recv), [`close`](Self::close)
    /// or drop (see [Batching](Self#batching)); a message that does not fit the
    /// batch goes at once, after it.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send).
    pub fn send_more(&mut self, msg: &[u8]) -> io::Result<()> {
        self.send_framed(msg, true)
    }

    fn send_framed(&mut self, msg: &[u8], more: bool) -> io::Result<()> {
        if msg.len() > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a message of {} bytes is above MAX_MESSAGE", msg.len()),
            ));
        }
        let len = (msg.len() as u32).to_le_bytes();
        if more && self.batch.len() + len.len() + msg.len() <= BATCH_BYTES {
            self.batch.extend_from_slice(&len);
            self.batch.extend_from_slice(msg);
            return Ok(());
        }
        // The batch, the length and the bytes in one put: one packet when they fit.
        let batch = std::mem::take(&mut self.batch);
        let r = self.put_all(
            &[IoSlice::new(&batch), IoSlice::new(&len), IoSlice::new(msg)],
            None,
        );
        self.batch = batch;
        self.batch.clear();
        r
    }

    /// Receives the next message into `buf` (replacing its contents); false at the
    /// end of the stream (the peer closed between messages).
    ///
    /// # Errors
    ///
    /// `InvalidData` for a length above [`MAX_MESSAGE`]; `UnexpectedEof` when the
    /// stream ends inside a message; the stream's errors.
    pub fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<bool> {
        let mut len = [0u8; 4];
        if !self.fill(&mut len)? {
            return Ok(false);
        }
        let n = u32::from_le_bytes(len) as usize;
        if n > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a message of {n} bytes is above MAX_MESSAGE"),
            ));
        }
        buf.clear();
        buf.resize(n, 0);
        if !self.fill(buf)? {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the stream ended inside a message",
            ));
        }
        Ok(true)
    }

    /// Ends the messages this end sends (the peer's `recv` says false after the
    /// last).
    ///
    /// # Errors
    ///
    /// The stream's.
    pub fn close(&mut self) -> io::Result<()> {
        self.flush()?;
        self.stream.shutdown_write()
    }

    /// The stream, for a [`Selector`] or its own calls (put the batch first with
    /// [`flush`](Self::flush) before writing to it).
    pub fn get_mut(&mut self) -> &mut RdmaStream {
        &mut self.stream
    }

    /// The stream back, after the batch is put (as at drop: waiting at most 10 s
    /// for room, an error lost; [`flush`](Self::flush) first to see it).
    pub fn into_inner(mut self) -> RdmaStream {
        let _ = self.flush_until(Some(Instant::now() + DROP_LINGER));
        let mut me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped after this: the stream is moved out
        // once, and the other fields are dropped in place once.
        unsafe {
            std::ptr::drop_in_place(&mut me.selector);
            std::ptr::drop_in_place(&mut me.batch);
            std::ptr::read(&me.stream)
        }
    }
}

/// How long a drop waits for room to put the batch: a peer that stopped reading
/// without closing must not hang its sender's drop (the stream's own drop waits as
/// long for relayed bytes to be read).
const DROP_LINGER: std::time::Duration = std::time::Duration::from_secs(10);

impl Drop for Messages {
    /// Puts the batch, as a `BufWriter` does its buffer, waiting at most 10 s for
    /// room (an error is lost: call [`flush`](Self::flush) or
    /// [`close`](Self::close) to see it).
    fn drop(&mut self) {
        let _ = self.flush_until(Some(Instant::now() + DROP_LINGER));
    }
}

/// One-to-many, in turn: message k goes to destination k mod n (FastFlow's
/// round-robin scatter of a farm's emitter).
#[derive(Debug)]
pub struct Scatter {
    outs: Vec<Messages>,
    next: usize,
}

impl Scatter {
    /// Over `outs` (at least one).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for none.
    pub fn new(outs: Vec<RdmaStream>) -> io::Result<Scatter> {
        if outs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a scatter needs a destination",
            ));
        }
        Ok(Scatter {
            outs: outs.into_iter().map(Messages::new).collect(),
            next: 0,
        })
    }

    /// Sends `msg` to the next destination; returns which.
    ///
    /// # Errors
    ///
    /// As [`Messages::send`].
    pub fn send(&mut self, msg: &[u8]) -> io::Result<usize> {
        self.send_framed(msg, false)
    }

    /// [`send`](Self::send), batched as [`Messages::send_more`]: the destination
    /// puts its batch when it fills, at its next `send`, or at
    /// [`flush`](Self::flush) or [`close`](Self::close).
    ///
    /// # Errors
    ///
    /// As [`Messages::send`].
    pub fn send_more(&mut self, msg: &[u8]) -> io::Result<usize> {
        self.send_framed(msg, true)
    }

    fn send_framed(&mut self, msg: &[u8], more: bool) -> io::Result<usize> {
        let to = self.next;
        self.outs[to].send_framed(msg, more)?;
        self.next = (to + 1) % self.outs.len();
        Ok(to)
    }

    /// Puts every destination's batch.
    ///
    /// # Errors
    ///
    /// The first stream's error (every batch is tried all the same).
    pub fn flush(&mut self) -> io::Result<()> {
        flush_all(&mut self.outs)
    }

    /// Ends every destination's messages (after its batch).
    ///
    /// # Errors
    ///
    /// The first stream's error (every stream is closed all the same).
    pub fn close(&mut self) -> io::Result<()> {
        close_all(&mut self.outs)
    }
}

/// `step` on every one of `outs`, all of them even after an error; the first error.
fn each(outs: &mut [Messages], step: fn(&mut Messages) -> io::Result<()>) -> io::Result<()> {
    let mut first = Ok(());
    for m in outs {
        let r = step(m);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

fn flush_all(outs: &mut [Messages]) -> io::Result<()> {
    each(outs, Messages::flush)
}

fn close_all(outs: &mut [Messages]) -> io::Result<()> {
    each(outs, Messages::close)
}

/// One-to-many, on demand: a message goes to a destination that asked for one
/// (seed 004's onDemand: a worker takes a new task only when it is free, so uneven
/// tasks balance themselves). Each destination asks through the other direction of
/// its stream, one byte a message ([`OnDemandWorker`] does it).
#[derive(Debug)]
pub struct OnDemand {
    outs: Vec<Messages>,
    /// Requests received and not yet answered, per destination.
    asked: Vec<usize>,
    next: usize,
    selector: Selector,
}

impl OnDemand {
    /// Over `outs` (at least one).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for none; the selector's eventfd cannot be made.
    pub fn new(outs: Vec<RdmaStream>) -> io::Result<OnDemand> {
        if outs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "on demand needs a destination",
            ));
        }
        let n = outs.len();
        Ok(OnDemand {
            outs: outs.into_iter().map(Messages::new).collect(),
            asked: vec![0; n],
            next: 0,
            selector: Selector::new()?,
        })
    }

    /// Sends `msg` to a destination that asked for one, waiting for a request if
    /// none is pending; returns which.
    ///
    /// # Errors
    ///
    /// `BrokenPipe` when every destination has ended its requests with none pending;
    /// the streams' errors.
    pub fn send(&mut self, msg: &[u8]) -> io::Result<usize> {
        self.send_framed(msg, false)
    }

    /// [`send`](Self::send), batched as [`Messages::send_more`]: every batch is
    /// put before this waits for requests, and at [`flush`](Self::flush) or
    /// [`close`](Self::close). Workers ask for one message at a time, so a
    /// destination's batch holds the messages it asked for ahead.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send).
    pub fn send_more(&mut self, msg: &[u8]) -> io::Result<usize> {
        self.send_framed(msg, true)
    }

    /// Puts every destination's batch.
    ///
    /// # Errors
    ///
    /// The first stream's error (every batch is tried all the same).
    pub fn flush(&mut self) -> io::Result<()> {
        flush_all(&mut self.outs)
    }

    fn send_framed(&mut self, msg: &[u8], more: bool) -> io::Result<usize> {
        let to = loop {
            let n = self.asked.len();
            if let Some(k) = (0..n)
                .map(|i| (self.next + i) % n)
                .find(|&k| self.asked[k] > 0)
            {
                break k;
            }
            self.take_requests()?;
        };
        self.asked[to] -= 1;
        self.next = (to + 1) % self.outs.len();
        self.outs[to].send_framed(msg, more)?;
        Ok(to)
    }

    /// Waits for requests and counts them.
    fn take_requests(&mut self) -> io::Result<()> {
        // A worker asks again only once it has what it asked for.
        self.flush()?;
        let mut items: Vec<Select<'_>> = self
            .outs
            .iter_mut()
            .map(|m| Select::new(m.get_mut(), Interest::READABLE))
            .collect();
        self.selector.select(&mut items, None)?;
        let ready: Vec<bool> = items.iter().map(|i| i.ready().is_readable()).collect();
        drop(items);
        let mut open = 0;
        let mut buf = [0u8; 64];
        for (k, m) in self.outs.iter_mut().enumerate() {
            if !ready[k] {
                open += 1;
                continue;
            }
            match m.get_mut().read(&mut buf) {
                Ok(0) => {}
                Ok(n) => {
                    self.asked[k] += n;
                    open += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
                Err(e) => return Err(e),
            }
        }
        if open == 0 {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "every destination stopped asking",
            ));
        }
        Ok(())
    }

    /// Ends every destination's messages.
    ///
    /// # Errors
    ///
    /// As [`Scatter::close`].
    pub fn close(&mut self) -> io::Result<()> {
        close_all(&mut self.outs)
    }
}

/// The receiving end of [`OnDemand`]: asks for a message (one byte back on the
/// stream) before it waits for one, keeping up to its window of requests
/// outstanding.
///
/// With the default window of one, a worker asks for its next message only when it
/// has taken the last, so every message costs a round trip between the two ends
/// (across hosts, hundreds of microseconds on Soft-RoCE VMs): a window of `k`
/// (FastFlow's on-demand scheduling with `k` buffer entries) keeps `k` messages
/// on their way, at the price of `k - 1` messages that a free worker elsewhere
/// might have taken.
#[derive(Debug)]
pub struct OnDemandWorker {
    inner: Messages,
    /// Requests to keep outstanding.
    window: usize,
    /// Requests sent and not yet answered by a message (or by the end).
    asked: usize,
}

impl OnDemandWorker {
    /// On `stream`, whose other end is one of an [`OnDemand`]'s destinations; one
    /// request outstanding at a time.
    pub fn new(stream: RdmaStream) -> OnDemandWorker {
        OnDemandWorker {
            inner: Messages::new(stream),
            window: 1,
            asked: 0,
        }
    }

    /// On `stream`, keeping `window` requests outstanding.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a window of 0 (a worker that never asks is never sent
    /// anything) or above 4,096.
    pub fn with_window(stream: RdmaStream, window: usize) -> io::Result<OnDemandWorker> {
        if window == 0 || window > 4096 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("an on-demand window of {window} requests (1 to 4096)"),
            ));
        }
        let mut w = OnDemandWorker::new(stream);
        w.window = window;
        Ok(w)
    }

    /// Tops the requests up to the window and receives the next message into
    /// `buf`; false once the sender ended its messages.
    ///
    /// # Errors
    ///
    /// As [`Messages::recv`]; the requests' put.
    pub fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<bool> {
        const ASK: [u8; 64] = [b'?'; 64];
        let s = self.inner.get_mut();
        while self.asked < self.window {
            let n = (self.window - self.asked).min(ASK.len());
            match s.put(&[IoSlice::new(&ASK[..n])]) {
                Ok(0) => s.channel().sender().wait_writable()?,
                Ok(k) => self.asked += k,
                // The sender stopped reading: it has ended, or is about to.
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => break,
                Err(e) => return Err(e),
            }
        }
        let got = self.inner.recv(buf)?;
        self.asked = self.asked.saturating_sub(1);
        Ok(got)
    }
}

/// Many-to-one, whichever has a message (seed 004's fromAny, a farm's collector):
/// waits on every source with a [`Selector`], taking sources in turn when several
/// have messages, so none starves.
#[derive(Debug)]
pub struct FromAny {
    ins: Vec<Messages>,
    ended: Vec<bool>,
    next: usize,
    selector: Selector,
}

impl FromAny {
    /// Over `ins`.
    ///
    /// # Errors
    ///
    /// The selector's eventfd cannot be made.
    pub fn new(ins: Vec<RdmaStream>) -> io::Result<FromAny> {
        let n = ins.len();
        Ok(FromAny {
            ins: ins.into_iter().map(Messages::new).collect(),
            ended: vec![false; n],
            next: 0,
            selector: Selector::new()?,
        })
    }

    /// The next message from any source into `buf`, and which source; `None` once
    /// every source has ended its messages.
    ///
    /// # Errors
    ///
    /// As [`Messages::recv`].
    pub fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<usize>> {
        loop {
            let n = self.ins.len();
            if self.ended.iter().all(|&e| e) {
                return Ok(None);
            }
            // A source with a message already: taken in turn, without the
            // selector's lists (the busy collector's path allocates nothing).
            for i in 0..n {
                let k = (self.next + i) % n;
                if self.ended[k] {
                    continue;
                }
                let rx = self.ins[k].get_mut().channel().receiver();
                if matches!(rx.poll_readable(), Ok(false)) {
                    continue;
                }
                if self.ins[k].recv(buf)? {
                    self.next = (k + 1) % n;
                    return Ok(Some(k));
                }
                self.ended[k] = true;
            }
            if self.ended.iter().all(|&e| e) {
                return Ok(None);
            }
            let order: Vec<usize> = (0..n)
                .map(|i| (self.next + i) % n)
                .filter(|&k| !self.ended[k])
                .collect();
            let ready: Vec<usize> = {
                let mut picked: Vec<&mut Messages> = Vec::with_capacity(order.len());
                let mut rest: Vec<Option<&mut Messages>> = self.ins.iter_mut().map(Some).collect();
                for &k in &order {
                    picked.push(rest[k].take().expect("each source once"));
                }
                let mut items: Vec<Select<'_>> = picked
                    .into_iter()
                    .map(|m| Select::new(m.get_mut(), Interest::READABLE))
                    .collect();
                self.selector.select(&mut items, None)?;
                items
                    .iter()
                    .zip(&order)
                    .filter(|(i, _)| i.ready().is_readable())
                    .map(|(_, &k)| k)
                    .collect()
            };
            for k in ready {
                if self.ins[k].recv(buf)? {
                    self.next = (k + 1) % n;
                    return Ok(Some(k));
                }
                self.ended[k] = true;
            }
        }
    }
}

/// Many-to-one, one message from each source in order (seed 004's allGather).
#[derive(Debug)]
pub struct AllGather {
    ins: Vec<Messages>,
}

impl AllGather {
    /// Over `ins`.
    pub fn new(ins: Vec<RdmaStream>) -> AllGather {
        AllGather {
            ins: ins.into_iter().map(Messages::new).collect(),
        }
    }

    /// One message from each source into `bufs` (one buffer per source, in the
    /// sources' order); false once the first source has ended.
    ///
    /// # Errors
    ///
    /// `InvalidInput` unless there is a buffer per source; `UnexpectedEof` when a
    /// source other than the first ends first; as [`Messages::recv`].
    pub fn recv(&mut self, bufs: &mut [Vec<u8>]) -> io::Result<bool> {
        if bufs.len() != self.ins.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} buffers for {} sources", bufs.len(), self.ins.len()),
            ));
        }
        for (k, (m, b)) in self.ins.iter_mut().zip(bufs.iter_mut()).enumerate() {
            if !m.recv(b)? {
                if k == 0 {
                    return Ok(false);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("source {k} ended before the others"),
                ));
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::{AllGather, Messages, OnDemand, OnDemandWorker, Scatter, BATCH_BYTES};
    use crate::RdmaStream;

    /// Three workers, each on a pair of streams running `work(tasks, results)` in
    /// a thread: the emitter's ends, the collector's ends and the threads.
    fn three_workers(
        work: impl Fn(RdmaStream, RdmaStream) + Clone + Send + 'static,
    ) -> (
        Vec<RdmaStream>,
        Vec<RdmaStream>,
        Vec<std::thread::JoinHandle<()>>,
    ) {
        let (mut outs, mut back, mut threads) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            let (e, w_in) = RdmaStream::pair().unwrap();
            let (w_out, c) = RdmaStream::pair().unwrap();
            outs.push(e);
            back.push(c);
            let work = work.clone();
            threads.push(std::thread::spawn(move || work(w_in, w_out)));
        }
        (outs, back, threads)
    }

    /// The message `i` of a batching test: its length varies from 0 to past the
    /// batch, its bytes name it.
    fn numbered(i: usize) -> Vec<u8> {
        let len = match i % 7 {
            0 => 0,
            1 => 1,
            2 => 10,
            3 => 1000,
            4 => BATCH_BYTES - 4,
            5 => BATCH_BYTES + 1,
            _ => 100_000,
        };
        (0..len).map(|k| (k + i) as u8).collect()
    }

    /// `send_more` holds small messages until the batch fills or a flush; every
    /// message arrives whole and in order, whether batched, too large for the
    /// batch, or sent plainly between batched ones.
    #[test]
    fn batched_messages_arrive_whole_and_in_order() {
        let (a, b) = RdmaStream::pair().unwrap();
        let (mut tx, mut rx) = (Messages::new(a), Messages::new(b));
        tx.send_more(b"held").unwrap();
        assert_eq!(tx.batched(), 8);
        assert!(
            !rx.ready().unwrap(),
            "a batched message was put before its flush"
        );
        tx.flush().unwrap();
        assert_eq!(tx.batched(), 0);
        let mut m = Vec::new();
        assert!(rx.recv(&mut m).unwrap());
        assert_eq!(m, b"held");
        let reader = std::thread::spawn(move || {
            let mut m = Vec::new();
            for i in 0..200 {
                assert!(
                    rx.recv(&mut m).unwrap(),
                    "the stream ended before message {i}"
                );
                assert!(
                    m == numbered(i),
                    "message {i} arrived wrong ({} bytes)",
                    m.len()
                );
            }
            assert!(!rx.recv(&mut m).unwrap(), "more messages than were sent");
        });
        for i in 0..200 {
            if i % 10 == 9 {
                tx.send(&numbered(i)).unwrap();
            } else {
                tx.send_more(&numbered(i)).unwrap();
                assert!(tx.batched() <= BATCH_BYTES);
            }
        }
        // close puts the last batch.
        tx.close().unwrap();
        reader.join().unwrap();
    }

    /// Both ends batch their messages and then wait for the other's: a recv that
    /// would wait puts this end's batch first, so neither waits forever.
    #[test]
    fn a_waiting_recv_puts_its_batch_first() {
        let (a, b) = RdmaStream::pair().unwrap();
        let echo = std::thread::spawn(move || {
            let mut m = Messages::new(b);
            let mut buf = Vec::new();
            while m.recv(&mut buf).unwrap() {
                m.send_more(&buf).unwrap();
            }
        });
        let mut m = Messages::new(a);
        let mut buf = Vec::new();
        for round in 0..50u32 {
            for k in 0..round % 5 + 1 {
                m.send_more(&(round * 10 + k).to_le_bytes()).unwrap();
            }
            for k in 0..round % 5 + 1 {
                assert!(m.recv(&mut buf).unwrap());
                assert_eq!(buf, (round * 10 + k).to_le_bytes());
            }
        }
        m.close().unwrap();
        echo.join().unwrap();
    }

    /// A batch is not lost when its `Messages` is dropped or taken apart.
    #[test]
    fn drop_and_into_inner_put_the_batch() {
        let (a, b) = RdmaStream::pair().unwrap();
        let mut tx = Messages::new(a);
        tx.send_more(b"one").unwrap();
        let stream = tx.into_inner();
        let mut tx = Messages::new(stream);
        tx.send_more(b"two").unwrap();
        drop(tx);
        let mut rx = Messages::new(b);
        let mut m = Vec::new();
        assert!(rx.recv(&mut m).unwrap());
        assert_eq!(m, b"one");
        assert!(rx.recv(&mut m).unwrap());
        assert_eq!(m, b"two");
        assert!(!rx.recv(&mut m).unwrap());
    }

    /// Workers with a window of requests each take their share of the messages,
    /// and every message arrives once; a window of 0 is refused.
    #[test]
    fn on_demand_workers_with_a_window_take_every_message_once() {
        let (x, _y) = RdmaStream::pair().unwrap();
        let e = OnDemandWorker::with_window(x, 0).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        let mut outs = Vec::new();
        let mut workers = Vec::new();
        for window in [1usize, 4, 16] {
            let (e, w) = RdmaStream::pair().unwrap();
            outs.push(e);
            workers.push(std::thread::spawn(move || {
                let mut rx = OnDemandWorker::with_window(w, window).unwrap();
                let mut got = Vec::new();
                let mut m = Vec::new();
                while rx.recv(&mut m).unwrap() {
                    got.push(u32::from_le_bytes(m[..4].try_into().unwrap()));
                }
                got
            }));
        }
        // A window of 4: four requests before the first message is sent.
        let (mut e, w) = RdmaStream::pair().unwrap();
        let early = std::thread::spawn(move || {
            let mut rx = OnDemandWorker::with_window(w, 4).unwrap();
            let mut m = Vec::new();
            assert!(rx.recv(&mut m).unwrap());
            m
        });
        let mut asks = [0u8; 4];
        std::io::Read::read_exact(&mut e, &mut asks).unwrap();
        assert_eq!(&asks, b"????");
        let mut tx = Messages::new(e);
        tx.send(b"first").unwrap();
        assert_eq!(early.join().unwrap(), b"first");
        let mut d = OnDemand::new(outs).unwrap();
        let mut sent_to = [0usize; 3];
        for i in 0..3000u32 {
            sent_to[d.send(&i.to_le_bytes()).unwrap()] += 1;
        }
        d.close().unwrap();
        let mut all: Vec<u32> = Vec::new();
        for (k, w) in workers.into_iter().enumerate() {
            let got = w.join().unwrap();
            assert_eq!(
                got.len(),
                sent_to[k],
                "worker {k} took a message twice or lost one"
            );
            assert!(
                got.windows(2).all(|p| p[0] < p[1]),
                "worker {k}: out of order"
            );
            all.extend(got);
        }
        all.sort_unstable();
        assert!(
            all.iter().copied().eq(0..3000),
            "a message lost or duplicated"
        );
    }

    /// A drop whose peer stopped reading (without closing) gives up on its batch
    /// after the linger instead of hanging.
    #[test]
    fn a_drop_waits_a_bounded_time_for_a_peer_that_does_not_read() {
        let (mut a, _b) = RdmaStream::pair().unwrap();
        let chunk = vec![7u8; 64 << 10];
        // Fill the peer's ring: put until it takes nothing.
        while a.put(&[std::io::IoSlice::new(&chunk)]).unwrap() > 0 {}
        let mut tx = Messages::new(a);
        tx.send_more(b"held").unwrap();
        let t0 = std::time::Instant::now();
        drop(tx);
        let took = t0.elapsed();
        assert!(
            took >= super::DROP_LINGER && took < super::DROP_LINGER * 3,
            "the drop took {took:?}"
        );
    }

    /// A farm whose emitter batches its tasks (scatter and on demand) and whose
    /// workers batch their answers, flushing them when no task is waiting.
    #[test]
    fn a_batching_farm_answers_every_task() {
        for on_demand in [false, true] {
            let (outs, back, threads) = three_workers(move |w_in, w_out| {
                let mut tx = Messages::new(w_out);
                let mut t = Vec::new();
                if on_demand {
                    let mut rx = OnDemandWorker::new(w_in);
                    while rx.recv(&mut t).unwrap() {
                        tx.send_more(&t).unwrap();
                        tx.flush().unwrap();
                    }
                } else {
                    let mut rx = Messages::new(w_in);
                    loop {
                        if !rx.ready().unwrap() {
                            tx.flush().unwrap();
                        }
                        if !rx.recv(&mut t).unwrap() {
                            break;
                        }
                        tx.send_more(&t).unwrap();
                    }
                }
                tx.close().unwrap();
            });
            let emitter = std::thread::spawn(move || {
                if on_demand {
                    let mut d = OnDemand::new(outs).unwrap();
                    for i in 0..300u32 {
                        d.send_more(&i.to_le_bytes()).unwrap();
                    }
                    d.close().unwrap();
                } else {
                    let mut s = Scatter::new(outs).unwrap();
                    for i in 0..300u32 {
                        s.send_more(&i.to_le_bytes()).unwrap();
                    }
                    s.close().unwrap();
                }
            });
            let mut c = super::FromAny::new(back).unwrap();
            let mut seen = vec![false; 300];
            let mut m = Vec::new();
            while c.recv(&mut m).unwrap().is_some() {
                let i = u32::from_le_bytes(m[..4].try_into().unwrap()) as usize;
                assert!(!seen[i], "task {i} answered twice");
                seen[i] = true;
            }
            assert!(
                seen.iter().all(|&s| s),
                "on_demand {on_demand}: a task unanswered"
            );
            emitter.join().unwrap();
            for t in threads {
                t.join().unwrap();
            }
        }
    }

    /// A scatter deals messages in turn; an all-gather takes one from each in order;
    /// messages of any size (empty, small, larger than the ring) arrive whole.
    #[test]
    fn scatter_then_gather_keeps_every_message_whole() {
        let sizes = [0usize, 1, 17, 4096, 3 << 20];
        let (outs, back, threads) = three_workers(|w_in, w_out| {
            let (mut rx, mut tx) = (Messages::new(w_in), Messages::new(w_out));
            let mut m = Vec::new();
            while rx.recv(&mut m).unwrap() {
                tx.send(&m).unwrap();
            }
            tx.close().unwrap();
        });
        let sender = std::thread::spawn(move || {
            let mut s = Scatter::new(outs).unwrap();
            for &len in &sizes {
                for w in 0..3 {
                    let msg: Vec<u8> = (0..len).map(|i| (i + w) as u8).collect();
                    assert_eq!(s.send(&msg).unwrap(), w);
                }
            }
            s.close().unwrap();
        });
        let mut g = AllGather::new(back);
        let mut bufs = vec![Vec::new(); 3];
        for &len in &sizes {
            assert!(g.recv(&mut bufs).unwrap());
            for (w, b) in bufs.iter().enumerate() {
                assert!(b.len() == len && b.iter().enumerate().all(|(i, &x)| x == (i + w) as u8));
            }
        }
        assert!(!g.recv(&mut bufs).unwrap());
        sender.join().unwrap();
        for t in threads {
            t.join().unwrap();
        }
    }
}
