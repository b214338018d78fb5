//! Waiting on many connections at once (rsocket's `rpoll`, `poll(2)` for streams):
//! [`Selector::select`] looks at any number of streams and halves, and says which
//! are readable, writable or closed.
//!
//! A wait spins over its items a while (their readiness is a few loads each), then
//! sleeps in the kernel on the selector's eventfd. Before it sleeps it asks each
//! readable-interest item's peer to wake it after its next write: the peer's sender
//! already loads one control word after every put (`BellWanted`, the word a process
//! group's doorbell uses), so the data path pays nothing more, and only a write made
//! while someone sleeps costs the writer a system call (`QueuePair::notify`). The
//! request and the writer's data race without fences on the writer's side: the
//! sleeper issues `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` between its request
//! and its last look, which orders the writer's store and load as a fence of its
//! own would, so that either the writer sees the request or the last look sees the
//! data. Processes of this library register for that barrier when they make an
//! emulated fabric.
//!
//! A writable-interest item waits for room in the peer's ring the same way: the
//! peer's receiver answers our credit request (its tail, after its reads) and then
//! wakes the eventfd our sender named (`RoomWakeFd`).
//!
//! On verbs with wakes on (`RCH_IB_WAKE=select` or `1`) each connection wakes us
//! through its own completion channel: the selector arms it before its last look
//! and polls its descriptor beside the eventfd (the peer's writes carry immediate
//! data). Where a peer cannot wake us (verbs without wakes) the sleep is bounded
//! instead: sleeps that follow the connection's wait policy, as its blocking reads
//! would (short while the wait is young, then up to `RCH_SLEEP_MAX_US`). Where it
//! can, the sleep is bounded only by the caller's timeout and [`WAKE_SAFETY`], which
//! covers a peer that does not register for the barrier (an older library).
//!
//! ```
//! use std::io::{IoSlice, Read};
//! use std::time::Duration;
//! use rdma_channel::select::{Interest, Select, Selector};
//!
//! let (mut a1, mut b1) = rdma_channel::RdmaStream::pair()?;
//! let (mut a2, mut b2) = rdma_channel::RdmaStream::pair()?;
//! let writer = std::thread::spawn(move || {
//!     std::thread::sleep(Duration::from_millis(20));
//!     a2.put(&[IoSlice::new(b"hello")]).map(|_| (a1, a2))
//! });
//! let mut selector = Selector::new()?;
//! let mut items = [
//!     Select::new(&mut b1, Interest::READABLE),
//!     Select::new(&mut b2, Interest::READABLE),
//! ];
//! let n = selector.select(&mut items, Some(Duration::from_secs(10)))?;
//! assert_eq!(n, 1);
//! assert!(!items[0].ready().is_readable());
//! assert!(items[1].ready().is_readable());
//! let mut got = [0u8; 5];
//! b2.read_exact(&mut got)?;
//! assert_eq!(&got, b"hello");
//! let _ = writer.join().unwrap()?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use crate::config::WaitPolicy;
use crate::engine::{Backoff, Receiver, Sender};
use crate::fabric::Fabric;
use crate::stream::{RdmaStream, ReadHalf, WriteHalf};

/// Longest sleep when every item's peer will wake us: a wake lost to a peer that
/// does not take part in the barrier (an older library) costs at most this.
pub const WAKE_SAFETY: Duration = Duration::from_millis(250);

/// How long a wait looks at its items before it first sleeps, by default: a
/// message that comes within it is seen without a wake (a sleeping thread's wake-up
/// alone takes ~30-60 us on this project's VMs), and an idle wait gives its core
/// back soon. Looks take time in proportion to the items (~50 ns each on a quiet
/// connection), so a wait over many looks at each fewer times.
pub const SPIN: Duration = Duration::from_micros(50);

/// What an item is waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interest(u8);

impl Interest {
    /// A read would return data, the end of the stream, or an error.
    pub const READABLE: Interest = Interest(1);
    /// A put would take bytes (or fail).
    pub const WRITABLE: Interest = Interest(2);
    /// Both.
    pub const BOTH: Interest = Interest(3);

    /// True when `self` includes readability.
    pub fn is_readable(self) -> bool {
        self.0 & 1 != 0
    }

    /// True when `self` includes writability.
    pub fn is_writable(self) -> bool {
        self.0 & 2 != 0
    }
}

impl std::ops::BitOr for Interest {
    type Output = Interest;
    fn bitor(self, other: Interest) -> Interest {
        Interest(self.0 | other.0)
    }
}

/// What an item was found ready for (level-triggered, as `poll(2)`'s events).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ready {
    readable: bool,
    writable: bool,
    closed: bool,
}

impl Ready {
    /// A read would not block: data, the end of the stream, or an error is there.
    pub fn is_readable(self) -> bool {
        self.readable
    }

    /// A put would not block: the ring has room (or the put fails).
    pub fn is_writable(self) -> bool {
        self.writable
    }

    /// The direction asked about is over: the peer ended its stream or stopped
    /// reading, or the connection failed (a read or put says which).
    pub fn is_closed(self) -> bool {
        self.closed
    }

    fn any(self) -> bool {
        self.readable || self.writable || self.closed
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A connection end a [`Selector`] can wait on: [`RdmaStream`], [`ReadHalf`] and
/// [`WriteHalf`]. Sealed; its methods are the selector's.
pub trait Selectable: sealed::Sealed {
    #[doc(hidden)]
    fn ready_now(&mut self, interest: Interest) -> Ready;
    /// Asks the peer to wake the thread sleeping on eventfd `fd` (of `instance`),
    /// adding bit `hint` to its count, when what `interest` waits for may have come:
    /// after its next write (readable), when it answers our credit request
    /// (writable); false where it cannot (then the selector bounds its sleep).
    #[doc(hidden)]
    fn ask_wake(&mut self, interest: Interest, fd: u32, instance: u32, hint: u32) -> bool;
    /// Arms the fabric's own wake for what `interest` waits for and returns the
    /// descriptor it makes readable (verbs: the completion channel); `None` where
    /// the fabric has none (then [`ask_wake`](Self::ask_wake)).
    #[doc(hidden)]
    fn arm_fd(&mut self, interest: Interest) -> Option<RawFd>;
    /// The descriptor [`arm_fd`](Self::arm_fd) would return, without arming.
    #[doc(hidden)]
    fn wake_fd(&mut self) -> Option<RawFd>;
    /// The connection's number in this process (never reused, unlike its
    /// descriptors' numbers).
    #[doc(hidden)]
    fn serial(&mut self) -> u64;
    /// `poll(2)` found the [`arm_fd`](Self::arm_fd) descriptor readable: take its
    /// events.
    #[doc(hidden)]
    fn fd_fired(&mut self);
    /// The wait policy of the connection's blocking calls, which shapes a
    /// selector's naps where no wake comes.
    #[doc(hidden)]
    fn wait_policy(&mut self) -> WaitPolicy;
}

fn readable<F: Fabric>(rx: &mut Receiver<F>) -> Ready {
    match rx.poll_readable() {
        Ok(r) => Ready {
            readable: r,
            ..Ready::default()
        },
        // The end of the stream, or a failure: a read returns it at once.
        Err(_) => Ready {
            readable: true,
            closed: true,
            ..Ready::default()
        },
    }
}

fn writable<F: Fabric>(tx: &mut Sender<F>) -> Ready {
    match tx.poll_writable() {
        Ok(w) => Ready {
            writable: w,
            ..Ready::default()
        },
        Err(_) => Ready {
            writable: true,
            closed: true,
            ..Ready::default()
        },
    }
}

fn merge(a: Ready, b: Ready) -> Ready {
    Ready {
        readable: a.readable || b.readable,
        writable: a.writable || b.writable,
        closed: a.closed || b.closed,
    }
}

impl<F: Fabric> sealed::Sealed for RdmaStream<F> {}
impl<F: Fabric> Selectable for RdmaStream<F> {
    fn ready_now(&mut self, interest: Interest) -> Ready {
        let mut r = Ready::default();
        if interest.is_readable() {
            r = merge(r, readable(self.channel().receiver()));
        }
        if interest.is_writable() {
            r = merge(r, writable(self.channel().sender()));
        }
        r
    }

    fn ask_wake(&mut self, interest: Interest, fd: u32, instance: u32, hint: u32) -> bool {
        let mut all = true;
        if interest.is_readable() {
            all &= self
                .channel()
                .receiver()
                .ask_for_wake(fd, instance, hint)
                .unwrap_or(false);
        }
        if interest.is_writable() {
            all &= self
                .channel()
                .sender()
                .ask_for_room_wake(fd, instance, hint)
                .unwrap_or(false);
        }
        all
    }

    fn arm_fd(&mut self, interest: Interest) -> Option<RawFd> {
        // Both directions share the connection's queue pair, so one descriptor.
        let mut fd = None;
        if interest.is_readable() {
            fd = Some(self.channel().receiver().link.arm_wake_fd()?);
        }
        if interest.is_writable() {
            // A failed request shows as the item ready and closed at the next look.
            fd = Some(self.channel().sender().arm_room_wake_fd().ok()??);
        }
        fd
    }

    fn wake_fd(&mut self) -> Option<RawFd> {
        self.channel().receiver().link.wake_fd()
    }

    fn serial(&mut self) -> u64 {
        self.channel().receiver().link.serial
    }

    fn fd_fired(&mut self) {
        self.channel().receiver().link.wake_fired();
    }

    fn wait_policy(&mut self) -> WaitPolicy {
        self.channel().receiver().wait_policy()
    }
}

impl<F: Fabric> sealed::Sealed for ReadHalf<F> {}
impl<F: Fabric> Selectable for ReadHalf<F> {
    fn ready_now(&mut self, interest: Interest) -> Ready {
        if interest.is_readable() {
            readable(self.rx())
        } else {
            Ready::default()
        }
    }

    fn ask_wake(&mut self, interest: Interest, fd: u32, instance: u32, hint: u32) -> bool {
        !interest.is_readable() || self.rx().ask_for_wake(fd, instance, hint).unwrap_or(false)
    }

    fn arm_fd(&mut self, interest: Interest) -> Option<RawFd> {
        if interest.is_readable() {
            self.rx().link.arm_wake_fd()
        } else {
            None
        }
    }

    fn wake_fd(&mut self) -> Option<RawFd> {
        self.rx().link.wake_fd()
    }

    fn serial(&mut self) -> u64 {
        self.rx().link.serial
    }

    fn fd_fired(&mut self) {
        self.rx().link.wake_fired();
    }

    fn wait_policy(&mut self) -> WaitPolicy {
        self.rx().wait_policy()
    }
}

impl<F: Fabric> sealed::Sealed for WriteHalf<F> {}
impl<F: Fabric> Selectable for WriteHalf<F> {
    fn ready_now(&mut self, interest: Interest) -> Ready {
        if interest.is_writable() {
            writable(self.sender())
        } else {
            Ready::default()
        }
    }

    fn ask_wake(&mut self, interest: Interest, fd: u32, instance: u32, hint: u32) -> bool {
        !interest.is_writable()
            || self
                .sender()
                .ask_for_room_wake(fd, instance, hint)
                .unwrap_or(false)
    }

    fn arm_fd(&mut self, interest: Interest) -> Option<RawFd> {
        if interest.is_writable() {
            self.sender().arm_room_wake_fd().ok()?
        } else {
            None
        }
    }

    fn wake_fd(&mut self) -> Option<RawFd> {
        self.sender().link.wake_fd()
    }

    fn serial(&mut self) -> u64 {
        self.sender().link.serial
    }

    fn fd_fired(&mut self) {
        self.sender().link.wake_fired();
    }

    fn wait_policy(&mut self) -> WaitPolicy {
        self.sender().wait_policy()
    }
}

/// One item of a [`Selector::select`]: a connection end, what it is waited for, and
/// what it was found ready for.
pub struct Select<'a> {
    target: &'a mut dyn Selectable,
    interest: Interest,
    ready: Ready,
}

impl std::fmt::Debug for Select<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Select")
            .field("interest", &self.interest)
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl<'a> Select<'a> {
    /// `target`, waited for `interest`.
    pub fn new(target: &'a mut dyn Selectable, interest: Interest) -> Select<'a> {
        Select {
            target,
            interest,
            ready: Ready::default(),
        }
    }

    /// What the last [`Selector::select`] found (nothing before one).
    pub fn ready(&self) -> Ready {
        self.ready
    }
}

/// Waits on many connections at once; see the [module documentation](self).
///
/// Its descriptor ([`AsFd`]) becomes readable when a peer wakes it: for a
/// `poll`/`epoll` loop, call [`arm`](Self::arm) before blocking on it (it returns how
/// many items are ready already: then do not block), and [`select`](Self::select)
/// with a zero timeout after it fires. It is an epoll instance holding the
/// selector's eventfd (the emulated fabric's wakes) and the armed verbs connections'
/// completion channels, so one descriptor serves both fabrics.
#[derive(Debug)]
pub struct Selector {
    wake: OwnedFd,
    /// This eventfd's instance ([`wake_instance`]): a peer that took an eventfd
    /// of an earlier selector by the same number takes this one anew.
    instance: u32,
    /// Wakes peers sent through the eventfd, as counted when it was emptied.
    wakes: u64,
    /// Whether `membarrier` orders a peer's writes before our last look; without it
    /// every sleep is bounded as for a peer that cannot wake us.
    barrier: bool,
    /// See [`set_spin`](Self::set_spin); `None`: [`SPIN`], or none where the
    /// items' connections do not spin (their fabric's work needs this process's
    /// only CPU).
    spin: Option<Duration>,
    /// What a sleep polls: the eventfd first, then the descriptors of the items
    /// whose fabric wakes them itself (verbs), as the last arm found them.
    polls: Vec<libc::pollfd>,
    /// The item of each of `polls[1..]`, and its connection's serial.
    poll_items: Vec<(usize, u64)>,
    /// The selector's descriptor ([`AsFd`]): an epoll instance holding the eventfd
    /// and, after an [`arm`](Self::arm), duplicates of the armed items' wake
    /// descriptors, so that one descriptor serves an outer loop on both fabrics.
    epoll: OwnedFd,
    /// The duplicates in `epoll`, with their connections' serials.
    members: Vec<(u64, OwnedFd)>,
    /// The last arm asked some peer for a wake or polls some descriptor.
    armed_any: bool,
    /// Descriptors of the last arm found readable by the next [`arm`](Self::arm)
    /// (a caller's own poll saw them): their events are taken before re-arming.
    fired: Vec<RawFd>,
}

impl Selector {
    /// A selector with its eventfd.
    ///
    /// # Errors
    ///
    /// The eventfd cannot be made (the process's descriptor limit).
    pub fn new() -> io::Result<Selector> {
        // SAFETY: eventfd takes an initial count and flags, returns a descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor; nobody else owns it.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let polls = vec![libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: epoll_create1 takes flags and returns a descriptor or -1.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor; nobody else owns it.
        let epoll = unsafe { OwnedFd::from_raw_fd(ep) };
        epoll_add(&epoll, wake.as_raw_fd())?;
        Ok(Selector {
            wake,
            instance: wake_instance(),
            wakes: 0,
            barrier: crate::sync::register_barrier(),
            spin: None,
            polls,
            poll_items: Vec::new(),
            epoll,
            members: Vec::new(),
            armed_any: false,
            fired: Vec::new(),
        })
    }

    /// Waits until at least one item is ready for what it is waited for, or
    /// `timeout` passes (`None`: no limit; zero: one look), and returns how many
    /// items it found ready (0 on timeout); each item's [`Select::ready`] says for
    /// what. After a wake it looks first at the items the wake points to, so other
    /// items may be ready too and not reported this time (they are at the next
    /// call: readiness is level-triggered).
    ///
    /// # Errors
    ///
    /// Only the selector's own system calls' (a failed connection is an item ready
    /// and closed, whose read or put reports the error).
    pub fn select(
        &mut self,
        items: &mut [Select<'_>],
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let deadline = timeout.map(|t| Instant::now() + t);
        // Where some item cannot be woken, the sleeps follow its connection's wait
        // policy (as its blocking reads would sleep), made at the first such sleep.
        let mut naps: Option<Backoff> = None;
        // No item's peer can wake us (found by the first arm): the rest of this
        // call only looks and naps.
        let mut unwakeable = false;
        let spin = self.spin.unwrap_or_else(|| {
            let quiet = items
                .first_mut()
                .is_some_and(|it| it.target.wait_policy().spin == 0);
            if quiet {
                Duration::ZERO
            } else {
                SPIN
            }
        });
        // Spinning ends at this time, once: after a sleep, one look, then sleep again.
        let mut spin_until = None;
        // The hint bits of the wakes the last sleep ended with: the items to look at
        // first (item i's peer adds bit i % 32).
        let mut hint = 0;
        loop {
            if hint != 0 {
                let n = look_hinted(items, hint);
                hint = 0;
                if n > 0 {
                    return Ok(n);
                }
            }
            let n = look(items);
            if n > 0 {
                return Ok(n);
            }
            let now = Instant::now();
            let left = match deadline {
                Some(d) if now >= d => return Ok(0),
                Some(d) => Some(d - now),
                None => None,
            };
            if now < *spin_until.get_or_insert(now + spin) {
                std::hint::spin_loop();
                continue;
            }
            if unwakeable {
                // Nothing can wake us (no item's peer can): a look and a nap, as
                // the connections' blocking reads would, with no arming between.
                let nap = naps
                    .get_or_insert_with(|| Backoff::with_policy(nap_policy(items)))
                    .next_nap();
                std::thread::sleep(left.map_or(nap, |l| l.min(nap)));
                continue;
            }
            let (n, woken) = self.arm_items(items)?;
            if n > 0 {
                return Ok(n);
            }
            // Whether anything at all was armed: a wake is asked of some peer, or a
            // descriptor is polled.
            unwakeable = !woken && !self.armed_any;
            if woken {
                hint = self.sleep(items, left.map_or(WAKE_SAFETY, |l| l.min(WAKE_SAFETY)))?;
            } else {
                // Some item's peer cannot wake us: sleep a little, longer each time.
                let nap = naps
                    .get_or_insert_with(|| Backoff::with_policy(nap_policy(items)))
                    .next_nap();
                hint = self.sleep(items, left.map_or(nap, |l| l.min(nap)))?;
            }
        }
    }

    /// How long a [`select`](Self::select) looks at its items before it first
    /// sleeps (default [`SPIN`], or none where the first item's connection does
    /// not spin: its wait policy's `spin` is 0, as on a one-CPU host whose fabric's
    /// work needs that CPU): a caller that expects a message within microseconds
    /// spins longer, one that wants its core back sooner shorter (zero: one look,
    /// then sleep).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = Some(spin);
    }

    /// Prepares to block on the selector's descriptor: asks every item's peer to
    /// wake it (after its next write, or when it makes room), orders those requests before a
    /// last look, and returns how many items that look found ready (do not block
    /// then). Then block on the selector's descriptor ([`AsFd`], which this arm
    /// made hold the verbs connections' completion channels too); after it fires,
    /// call [`select`](Self::select) with a zero timeout. A peer that cannot wake the
    /// selector (see the module documentation) is not covered: poll with a timeout
    /// while such items are in the set.
    ///
    /// # Errors
    ///
    /// As [`select`](Self::select).
    pub fn arm(&mut self, items: &mut [Select<'_>]) -> io::Result<usize> {
        // The caller's own poll may have seen wake descriptors of the last arm fire
        // without taking their events: find them (one poll over all), for
        // arm_items to take before re-arming, else they would stay readable.
        self.fired.clear();
        if self.polls.len() > 1 {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            for p in &mut self.polls[1..] {
                p.revents = 0;
            }
            // SAFETY: `polls[1..]` is a valid array of pollfds for the call, its
            // length below i32::MAX (one per item); zero timeout, no signal mask.
            let r = unsafe {
                libc::ppoll(
                    self.polls[1..].as_mut_ptr(),
                    (self.polls.len() - 1) as libc::nfds_t,
                    &zero,
                    std::ptr::null(),
                )
            };
            if r > 0 {
                let fired = self.polls[1..].iter().filter(|p| p.revents != 0);
                self.fired.extend(fired.map(|p| p.fd));
            }
        }
        let n = self.arm_items(items)?.0;
        self.sync_epoll()?;
        Ok(n)
    }

    /// Makes the epoll instance hold the last arm's wake descriptors (beside the
    /// eventfd), as duplicates: one per connection, told apart by serial, so that
    /// a descriptor number reused by a newer connection is registered anew. A set
    /// unchanged since the last arm costs nothing.
    fn sync_epoll(&mut self) -> io::Result<()> {
        let same = self.members.len() == self.poll_items.len()
            && self
                .members
                .iter()
                .zip(&self.poll_items)
                .all(|((a, _), (_, b))| a == b);
        if same {
            return Ok(());
        }
        for (_, dup) in self.members.drain(..) {
            // Removed before it is closed: the registration would outlive the
            // duplicate while the connection keeps the description open.
            epoll_del(&self.epoll, dup.as_raw_fd());
        }
        for (p, &(_, serial)) in self.polls[1..].iter().zip(&self.poll_items) {
            // SAFETY: F_DUPFD_CLOEXEC on a descriptor the armed connection keeps
            // open; returns a new descriptor or -1.
            let dup = unsafe { libc::fcntl(p.fd, libc::F_DUPFD_CLOEXEC, 0) };
            if dup < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: the kernel just returned this descriptor; nobody else owns it.
            let dup = unsafe { OwnedFd::from_raw_fd(dup) };
            epoll_add(&self.epoll, dup.as_raw_fd())?;
            self.members.push((serial, dup));
        }
        Ok(())
    }

    /// [`arm`](Self::arm), and whether every item's peer will wake us.
    fn arm_items(&mut self, items: &mut [Select<'_>]) -> io::Result<(usize, bool)> {
        self.drain();
        let fd = self.wake.as_raw_fd() as u32;
        self.polls.truncate(1);
        self.poll_items.clear();
        // Whether every item will be woken, and whether some through the eventfd.
        let (mut all, mut notified) = (true, false);
        for (i, it) in items.iter_mut().enumerate() {
            if !self.fired.is_empty()
                && it.target.wake_fd().is_some_and(|f| self.fired.contains(&f))
            {
                it.target.fd_fired();
            }
            if let Some(wake_fd) = it.target.arm_fd(it.interest) {
                self.polls.push(libc::pollfd {
                    fd: wake_fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
                self.poll_items.push((i, it.target.serial()));
            } else if it
                .target
                .ask_wake(it.interest, fd, self.instance, (i % 32) as u32)
            {
                notified = true;
            } else {
                all = false;
            }
        }
        self.fired.clear();
        self.armed_any = notified || self.polls.len() > 1;
        // Only a sleep that counts on the peers' notifies needs them ordered before
        // the look (a fabric's own wake is armed before it, and fires for anything
        // that lands after the arm).
        if all && notified && !(self.barrier && crate::sync::full_barrier()) {
            all = false;
        }
        Ok((look(items), all))
    }

    /// Blocks on the eventfd and the armed wake descriptors for at most `nap`, then
    /// empties the eventfd and takes the descriptors' events; returns the wakes'
    /// hint bits (0: none came).
    fn sleep(&mut self, items: &mut [Select<'_>], nap: Duration) -> io::Result<u64> {
        let ts = libc::timespec {
            tv_sec: nap.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: libc::c_long::from(nap.subsec_nanos() as i32),
        };
        for p in &mut self.polls {
            p.revents = 0;
        }
        // SAFETY: `polls` is a valid array of pollfds for the call (its length below
        // i32::MAX: one per item and the eventfd), a valid timespec, no signal mask.
        let r = unsafe {
            libc::ppoll(
                self.polls.as_mut_ptr(),
                self.polls.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return Err(io::Error::last_os_error());
        }
        let mut hint = 0;
        if r > 0 {
            let mut fired = false;
            for (p, &(i, _)) in self.polls[1..].iter().zip(&self.poll_items) {
                if p.revents != 0 {
                    items[i].target.fd_fired();
                    hint |= 1 << (i % 32);
                    fired = true;
                }
            }
            if fired {
                self.wakes = self.wakes.saturating_add(1);
            }
        }
        Ok(hint | self.drain())
    }

    /// Empties the eventfd (wakes from before now are spent); returns the count it
    /// held: the sum of the wakes' hint bits (0: none).
    fn drain(&mut self) -> u64 {
        let mut v = [0u8; 8];
        // SAFETY: a nonblocking eventfd we own, and 8 writable bytes.
        let r = unsafe { libc::read(self.wake.as_raw_fd(), v.as_mut_ptr().cast(), v.len()) };
        if r != 8 {
            return 0;
        }
        self.wakes = self.wakes.saturating_add(1);
        u64::from_ne_bytes(v)
    }

    /// How many times this selector found its eventfd written by peers' wakes so
    /// far (several wakes between two looks count once), including wakes that came
    /// after a look had already found their data (a sleep that its timeout or
    /// [`WAKE_SAFETY`] ended counts none).
    pub fn wakes(&mut self) -> u64 {
        self.drain();
        self.wakes
    }
}

impl AsFd for Selector {
    /// An epoll instance: readable when a peer woke the eventfd, or (after
    /// [`arm`](Selector::arm)) an armed connection's completion channel fired.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }
}

/// Adds `fd` to `epoll` for readability (level-triggered).
fn epoll_add(epoll: &OwnedFd, fd: RawFd) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: a valid epoll instance and descriptor; `ev` is read during the call.
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes `fd` from `epoll` (a failure leaves nothing to undo: it was not there).
fn epoll_del(epoll: &OwnedFd, fd: RawFd) {
    // SAFETY: a valid epoll instance; EPOLL_CTL_DEL ignores the event pointer.
    unsafe {
        libc::epoll_ctl(
            epoll.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            fd,
            std::ptr::null_mut(),
        )
    };
}

/// A new eventfd instance number for wakes (24 bits, never 0 in the first 2^24):
/// peers cache the eventfd they took by number and instance.
pub(crate) fn wake_instance() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    // Relaxed: a counter; uniqueness is all that matters.
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0xff_ffff
}

/// A look at the items whose hint bit (index % 32) is in `bits` only, the others
/// marked not ready; returns how many are ready. Wakes whose bits add up to a carry
/// point elsewhere: a miss is followed by a look at every item.
fn look_hinted(items: &mut [Select<'_>], bits: u64) -> usize {
    let mut n = 0;
    for (i, it) in items.iter_mut().enumerate() {
        it.ready = if bits & (1 << (i % 32)) != 0 {
            it.target.ready_now(it.interest)
        } else {
            Ready::default()
        };
        if it.ready.any() {
            n += 1;
        }
    }
    n
}

/// The wait policy whose sleeps a selector's naps follow: that of the first item,
/// with the shortest caps of any (a selector over several policies naps as the most
/// eager one would).
fn nap_policy(items: &mut [Select<'_>]) -> WaitPolicy {
    let mut p: Option<WaitPolicy> = None;
    for it in items.iter_mut() {
        let q = it.target.wait_policy();
        p = Some(match p {
            None => q,
            Some(p) => WaitPolicy {
                short_sleep_max: p.short_sleep_max.min(q.short_sleep_max),
                sleep_max: p.sleep_max.min(q.sleep_max),
                ..p
            },
        });
    }
    p.unwrap_or(crate::config::DEFAULT_WAIT_POLICY)
}

/// One look at every item; returns how many are ready.
fn look(items: &mut [Select<'_>]) -> usize {
    let mut n = 0;
    for it in items.iter_mut() {
        it.ready = it.target.ready_now(it.interest);
        if it.ready.any() {
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use std::io::{IoSlice, IoSliceMut};
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Interest, Select, Selector};
    use crate::RdmaStream;

    /// An outer poll loop on the selector's descriptor: `arm`, then `poll(2)` on
    /// `as_fd` until the peer's write (made once the request is out) makes it
    /// readable, then a zero-timeout select names the stream. Without the wake the
    /// poll would time out.
    #[test]
    fn an_armed_selectors_descriptor_fires_for_a_poll_loop() {
        use std::os::fd::{AsFd, AsRawFd};
        let (mut writer, mut reader) = RdmaStream::pair().unwrap();
        let link = Arc::clone(&writer.channel().sender().link);
        let mut selector = Selector::new().unwrap();
        let mut items = [Select::new(&mut reader, Interest::READABLE)];
        assert_eq!(selector.arm(&mut items).unwrap(), 0);
        let t = std::thread::spawn(move || {
            while link.ctrl.bell_wanted() == 0 {
                std::thread::yield_now();
            }
            writer.put(&[IoSlice::new(b"x")]).unwrap();
            writer
        });
        let mut p = libc::pollfd {
            fd: selector.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call.
        let r = unsafe { libc::poll(&mut p, 1, 60_000) };
        assert_eq!(r, 1, "the selector's descriptor did not fire");
        assert_eq!(
            selector.select(&mut items, Some(Duration::ZERO)).unwrap(),
            1
        );
        assert!(items[0].ready().is_readable());
        let _writer = t.join().unwrap();
    }

    /// A selector asleep over idle connections is woken by the write its request
    /// asked for: the writer waits for the request (the peer's `BellWanted`), so the
    /// wake cannot come from data found before the sleep, and a lost wake would show
    /// as none counted (the safety nap would find the data).
    #[test]
    fn a_write_after_the_request_wakes_the_sleeping_selector() {
        let mut pairs: Vec<_> = (0..8).map(|_| RdmaStream::pair().unwrap()).collect();
        let (mut writer, mut reader) = pairs.pop().unwrap();
        let link = Arc::clone(&writer.channel().sender().link);
        let t = std::thread::spawn(move || {
            while link.ctrl.bell_wanted() == 0 {
                std::thread::yield_now();
            }
            writer.put(&[IoSlice::new(b"wake")]).unwrap();
            writer
        });
        let mut selector = Selector::new().unwrap();
        let mut items: Vec<Select<'_>> = pairs
            .iter_mut()
            .map(|(_, b)| Select::new(b, Interest::READABLE))
            .collect();
        items.push(Select::new(&mut reader, Interest::READABLE));
        let n = selector
            .select(&mut items, Some(Duration::from_secs(60)))
            .unwrap();
        assert_eq!(n, 1);
        assert!(items.last().unwrap().ready().is_readable());
        assert!(items[..7].iter().all(|i| !i.ready().is_readable()));
        drop(items);
        let _writer = t.join().unwrap();
        assert_eq!(selector.wakes(), 1);
        let mut got = [0u8; 4];
        assert_eq!(reader.get(&mut [IoSliceMut::new(&mut got)]).unwrap(), 4);
        assert_eq!(&got, b"wake");
    }

    /// A selector waiting for room in a full ring is woken when the peer's reads
    /// free some and it answers the credit request: the reader reads only once the
    /// request for the wake is out, and a lost wake would show as none counted.
    #[test]
    fn room_made_by_the_peers_reads_wakes_a_selector_waiting_to_write() {
        let cfg = crate::Config::default()
            .with_ring_size(64 << 10)
            .with_chunk_size(16 << 10);
        let (mut a, mut b) = RdmaStream::pair_with(cfg).unwrap();
        let chunk = vec![7u8; 4096];
        let mut sent = 0;
        loop {
            match a.put(&[IoSlice::new(&chunk)]).unwrap() {
                0 => break,
                n => sent += n,
            }
        }
        let link = Arc::clone(&b.channel().receiver().link);
        let reader = std::thread::spawn(move || {
            while link.ctrl.room_wake_fd().is_none() {
                std::thread::yield_now();
            }
            let mut sink = vec![0u8; sent];
            let mut got = 0;
            while got < sent {
                got += b.get(&mut [IoSliceMut::new(&mut sink[got..])]).unwrap();
            }
            b
        });
        let mut selector = Selector::new().unwrap();
        let mut items = [Select::new(&mut a, Interest::WRITABLE)];
        let n = selector
            .select(&mut items, Some(Duration::from_secs(60)))
            .unwrap();
        assert_eq!(n, 1);
        assert!(items[0].ready().is_writable());
        let _b = reader.join().unwrap();
        assert!(
            selector.wakes() >= 1,
            "the reads' credit answer woke the selector"
        );
    }

    /// A timeout with nothing ready returns 0; a zero timeout is one look.
    #[test]
    fn nothing_ready_times_out() {
        let (_a, mut b) = RdmaStream::pair().unwrap();
        let mut selector = Selector::new().unwrap();
        let mut items = [Select::new(&mut b, Interest::READABLE)];
        assert_eq!(
            selector.select(&mut items, Some(Duration::ZERO)).unwrap(),
            0
        );
        assert_eq!(
            selector
                .select(&mut items, Some(Duration::from_millis(30)))
                .unwrap(),
            0
        );
        assert!(!items[0].ready().is_readable());
    }

    /// The end of the peer's stream is readable and closed; a fresh connection is
    /// writable; a peer that stopped reading makes the writing side closed.
    #[test]
    fn ends_and_room_are_seen() {
        let (mut a, mut b) = RdmaStream::pair().unwrap();
        let mut selector = Selector::new().unwrap();
        {
            let mut items = [Select::new(&mut a, Interest::WRITABLE)];
            assert_eq!(
                selector.select(&mut items, Some(Duration::ZERO)).unwrap(),
                1
            );
            assert!(items[0].ready().is_writable() && !items[0].ready().is_closed());
        }
        a.shutdown_write().unwrap();
        {
            let mut items = [Select::new(&mut b, Interest::READABLE)];
            assert_eq!(
                selector
                    .select(&mut items, Some(Duration::from_secs(60)))
                    .unwrap(),
                1
            );
            assert!(items[0].ready().is_readable() && items[0].ready().is_closed());
        }
        let (mut c, d) = RdmaStream::pair().unwrap();
        drop(d);
        let mut items = [Select::new(&mut c, Interest::WRITABLE)];
        assert_eq!(
            selector
                .select(&mut items, Some(Duration::from_secs(60)))
                .unwrap(),
            1
        );
        assert!(items[0].ready().is_closed());
    }
}
