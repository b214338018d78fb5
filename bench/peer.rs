//! Two-process plumbing shared by the demo and the benchmarks: the program re-runs
//! itself as the peer, the two connect through an `RdmaListener`, and each pins itself
//! to its own core.

use std::io::{self, IoSlice, IoSliceMut};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rdma_channel::fabric::Fabric;
use rdma_channel::{Peeked, RdmaListener, RdmaStream};

const SOCKET_VAR: &str = "RCH_PEER_SOCKET";

/// Message sizes from `--sizes a,b,c` (with k/m suffixes), or `default`.
pub fn sizes_from_args(default: &[usize]) -> Vec<usize> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--sizes") {
        if let Some(list) = args.get(i + 1) {
            return list
                .split(',')
                .filter_map(|s| rdma_channel::config::parse_size(s).ok())
                .filter(|&s| s > 0)
                .collect();
        }
    }
    default.to_vec()
}

/// Which side of the pair this process is.
pub enum Side {
    /// The process the user started, which measures; owns the child (none when the
    /// peer runs elsewhere, e.g. on another host).
    Parent(Option<Child>),
    /// The re-run copy.
    Child,
}

/// Pins the calling thread to `cpu` (modulo the CPUs available); best effort.
pub fn pin_to_cpu(cpu: usize) {
    // Online CPUs, not available_parallelism(): that reads our (inherited) mask.
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write inside it, and
    // sched_setaffinity reads it for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu % n, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Starts or joins the pair: the parent spawns `current_exe` with the same arguments
/// and waits for it to connect; the child connects. Parent runs on CPU 0, child on 1.
pub fn connect_pair(tag: &str) -> io::Result<(RdmaStream, Side)> {
    if let Ok(path) = std::env::var(SOCKET_VAR) {
        pin_to_cpu(1);
        let s = RdmaStream::connect(&path)?;
        return Ok((s, Side::Child));
    }
    let path: PathBuf = std::env::temp_dir().join(format!("rch-{tag}-{}.sock", std::process::id()));
    let listener = RdmaListener::bind(&path)?;
    let child = Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env(SOCKET_VAR, &path)
        .spawn()?;
    pin_to_cpu(0);
    let stream = listener.accept();
    let _ = std::fs::remove_file(&path);
    Ok((stream?, Side::Parent(Some(child))))
}

/// Waits for the child and fails if it failed.
pub fn finish(side: Side) -> io::Result<()> {
    if let Side::Parent(Some(mut child)) = side {
        let status = child.wait()?;
        if !status.success() {
            return Err(io::Error::other(format!("peer process failed: {status}")));
        }
    }
    Ok(())
}

/// Puts all of `buf`, busy-polling, with the channel's default choice between the
/// ring and zero-copy (buffers at or above the configured thresholds go zero-copy).
pub fn send_all<F: Fabric>(s: &mut RdmaStream<F>, buf: &[u8]) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        // SAFETY: `buf` stays borrowed, so alive and unchanged, until this loop has
        // seen every byte counted, which includes the end of any zero-copy transfer.
        at += unsafe { s.channel().sender().put_nocopy(&[IoSlice::new(&buf[at..])]) }?;
    }
    Ok(())
}

/// Gets exactly `buf.len()` bytes, busy-polling.
pub fn recv_all<F: Fabric>(s: &mut RdmaStream<F>, buf: &mut [u8]) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        at += s.get(&mut [IoSliceMut::new(&mut buf[at..])])?;
    }
    Ok(())
}

/// Gets `buf.len()` bytes the way `ucx_perftest`'s am test receives a message:
/// looked at where they landed ([`Receiver::peek`](rdma_channel::Receiver::peek))
/// and consumed without being copied or read. A zero-copy transfer, which is not in
/// the ring, is read into `buf` as [`recv_all`] does.
pub fn recv_in_place<F: Fabric>(s: &mut RdmaStream<F>, buf: &mut [u8]) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        let rx = s.channel().receiver();
        let n = match rx.peek()? {
            Peeked::Bytes(lent) => lent.len().min(buf.len() - at),
            Peeked::Nothing => continue,
            Peeked::ZeroCopy { .. } => {
                at += rx.get(&mut [IoSliceMut::new(&mut buf[at..])])?;
                continue;
            }
        };
        rx.consume(n)?;
        at += n;
    }
    Ok(())
}

/// True when the command line asks for `--in-place`: messages are received with
/// [`recv_in_place`] instead of copied into the receive buffer.
pub fn in_place() -> bool {
    std::env::args().any(|a| a == "--in-place")
}

/// True when the command line asks for `--alloc`: message buffers then come from
/// `alloc_mem` (as OSU's `MPI_Alloc_mem` option), else from the heap.
pub fn alloc_buffers() -> bool {
    std::env::args().any(|a| a == "--alloc")
}

/// A message buffer of `size` bytes filled with `byte`: heap memory, or registered
/// memory from `alloc_mem` when [`alloc_buffers`] says so.
pub fn message_buffer<F: Fabric>(
    s: &RdmaStream<F>,
    size: usize,
    byte: u8,
) -> io::Result<Box<dyn std::ops::DerefMut<Target = [u8]>>> {
    if alloc_buffers() && size > 0 {
        let mut b = s.alloc_mem(size)?;
        b.fill(byte);
        Ok(Box::new(b))
    } else {
        Ok(Box::new(vec![byte; size]))
    }
}

/// How a benchmark sends one message.
pub type SendFn<F> = dyn FnMut(&mut RdmaStream<F>, &[u8]) -> io::Result<()>;
/// How a benchmark receives one message.
pub type RecvFn<F> = dyn FnMut(&mut RdmaStream<F>, &mut [u8]) -> io::Result<()>;

/// One-way latency by ping-pong: half the mean round trip of `iters` exchanges. Each
/// side sends from one buffer and receives into another, as osu_latency does.
pub fn latency<F: Fabric>(
    s: &mut RdmaStream<F>,
    side: &Side,
    size: usize,
    iters: usize,
) -> io::Result<Duration> {
    let sbuf = message_buffer(s, size, 0x5a)?;
    let mut rbuf = message_buffer(s, size, 0)?;
    latency_with(s, side, &sbuf, &mut rbuf, iters, &mut send_all)
}

/// [`latency`] with given buffers and a given way of sending.
pub fn latency_with<F: Fabric>(
    s: &mut RdmaStream<F>,
    side: &Side,
    sbuf: &[u8],
    rbuf: &mut [u8],
    iters: usize,
    send: &mut SendFn<F>,
) -> io::Result<Duration> {
    let recv = receive_fn::<F>();
    let warm = (iters / 10).max(10);
    let mut start = Instant::now();
    for i in 0..warm + iters {
        if i == warm {
            start = Instant::now();
        }
        if matches!(side, Side::Parent(_)) {
            send(s, sbuf)?;
            recv(s, rbuf)?;
        } else {
            recv(s, rbuf)?;
            send(s, sbuf)?;
        }
    }
    Ok(start.elapsed() / (2 * iters as u32))
}

/// Windowed bandwidth (OSU style): the parent sends `window` messages back to back,
/// the child acknowledges each window with 4 bytes. Returns bytes per second.
pub fn bandwidth<F: Fabric>(
    s: &mut RdmaStream<F>,
    side: &Side,
    size: usize,
    window: usize,
    iters: usize,
) -> io::Result<f64> {
    let sbuf = message_buffer(s, size, 0xa5)?;
    let mut rbuf = message_buffer(s, size, 0)?;
    bandwidth_with(
        s,
        side,
        (&sbuf, &mut rbuf),
        window,
        iters,
        (&mut send_all, &mut receive_fn::<F>()),
    )
}

/// How the benchmarks receive a message: [`recv_in_place`] under `--in-place`, else
/// [`recv_all`].
fn receive_fn<F: Fabric>() -> fn(&mut RdmaStream<F>, &mut [u8]) -> io::Result<()> {
    if in_place() {
        recv_in_place
    } else {
        recv_all
    }
}

/// [`bandwidth`] with given buffers (send, receive) and given ways of sending and
/// receiving a message.
pub fn bandwidth_with<F: Fabric>(
    s: &mut RdmaStream<F>,
    side: &Side,
    (sbuf, rbuf): (&[u8], &mut [u8]),
    window: usize,
    iters: usize,
    (send, recv): (&mut SendFn<F>, &mut RecvFn<F>),
) -> io::Result<f64> {
    let mut ack = [0u8; 4];
    let warm = (iters / 10).max(2);
    let mut start = Instant::now();
    for i in 0..warm + iters {
        if i == warm {
            start = Instant::now();
        }
        if matches!(side, Side::Parent(_)) {
            for _ in 0..window {
                send(s, sbuf)?;
            }
            recv(s, &mut ack)?;
        } else {
            for _ in 0..window {
                recv(s, rbuf)?;
            }
            send(s, &ack)?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((sbuf.len() * window * iters) as f64 / secs)
}
