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
#[derive(Debug)]
pub struct Messages {
    stream: RdmaStream,
    /// Made at the first wait.
    selector: Option<Selector>,
}

impl Messages {
    /// Messages on `stream`.
    pub fn new(stream: RdmaStream) -> Messages {
        Messages {
            stream,
            selector: None,
        }
    }

    /// Fills `buf` from the stream, waiting through the selector while nothing has
    /// arrived; false when the stream ended before the first byte.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            match self.stream.get(&mut [IoSliceMut::new(&mut buf[got..])]) {
                Ok(0) => {
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

    /// Sends `msg` whole (blocking while the peer's ring is full).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a message above [`MAX_MESSAGE`]; the stream's errors.
    pub fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        if msg.len() > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a message of {} bytes is above MAX_MESSAGE", msg.len()),
            ));
        }
        let len = (msg.len() as u32).to_le_bytes();
        let total = len.len() + msg.len();
        let mut done = 0;
        // One put for the length and the bytes, as one packet when they fit one.
        while done < total {
            let iov = if done < len.len() {
                [IoSlice::new(&len[done..]), IoSlice::new(msg)]
            } else {
                [IoSlice::new(&msg[done - len.len()..]), IoSlice::new(&[])]
            };
            match self.stream.put(&iov)? {
                0 => {
                    let tx = self.stream.channel().sender();
                    tx.wait_writable()?;
                }
                n => done += n,
            }
        }
        Ok(())
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
        self.stream.shutdown_write()
    }

    /// The stream, for a [`Selector`] or its own calls.
    pub fn get_mut(&mut self) -> &mut RdmaStream {
        &mut self.stream
    }

    /// The stream back.
    pub fn into_inner(self) -> RdmaStream {
        self.stream
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
        let to = self.next;
        self.outs[to].send(msg)?;
        self.next = (to + 1) % self.outs.len();
        Ok(to)
    }

    /// Ends every destination's messages.
    ///
    /// # Errors
    ///
    /// The first stream's error (every stream is closed all the same).
    pub fn close(&mut self) -> io::Result<()> {
        close_all(&mut self.outs)
    }
}

fn close_all(outs: &mut [Messages]) -> io::Result<()> {
    let mut first = Ok(());
    for m in outs {
        let r = m.close();
        if first.is_ok() {
            first = r;
        }
    }
    first
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
        self.outs[to].send(msg)?;
        Ok(to)
    }

    /// Waits for requests and counts them.
    fn take_requests(&mut self) -> io::Result<()> {
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
/// stream) before it waits for one.
#[derive(Debug)]
pub struct OnDemandWorker {
    inner: Messages,
}

impl OnDemandWorker {
    /// On `stream`, whose other end is one of an [`OnDemand`]'s destinations.
    pub fn new(stream: RdmaStream) -> OnDemandWorker {
        OnDemandWorker {
            inner: Messages::new(stream),
        }
    }

    /// Asks for a message and receives it into `buf`; false once the sender ended
    /// its messages.
    ///
    /// # Errors
    ///
    /// As [`Messages::recv`]; the request's put.
    pub fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<bool> {
        let s = self.inner.get_mut();
        loop {
            match s.put(&[IoSlice::new(b"?")]) {
                Ok(0) => s.channel().sender().wait_writable()?,
                Ok(_) => break,
                // The sender stopped reading: it has ended, or is about to.
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => break,
                Err(e) => return Err(e),
            }
        }
        self.inner.recv(buf)
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
    use super::{AllGather, Messages, Scatter};
    use crate::RdmaStream;

    /// A scatter deals messages in turn; an all-gather takes one from each in order;
    /// messages of any size (empty, small, larger than the ring) arrive whole.
    #[test]
    fn scatter_then_gather_keeps_every_message_whole() {
        let sizes = [0usize, 1, 17, 4096, 3 << 20];
        let mut outs = Vec::new();
        let mut back = Vec::new();
        let mut threads = Vec::new();
        for _ in 0..3 {
            let (e, w_in) = RdmaStream::pair().unwrap();
            let (w_out, c) = RdmaStream::pair().unwrap();
            outs.push(e);
            back.push(c);
            threads.push(std::thread::spawn(move || {
                let (mut rx, mut tx) = (Messages::new(w_in), Messages::new(w_out));
                let mut m = Vec::new();
                while rx.recv(&mut m).unwrap() {
                    tx.send(&m).unwrap();
                }
                tx.close().unwrap();
            }));
        }
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
