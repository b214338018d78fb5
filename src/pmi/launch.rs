//! Running a job: N local processes served PMI-1, what `rch-run` does.
//!
//! [`run`] starts the ranks, each with one end of its own socket pair as `PMI_FD`
//! (plus `PMI_RANK`, `PMI_SIZE`, `PMI_SPAWNED=0`, `MPI_LOCALNRANKS`,
//! `MPI_LOCALRANKID`), and serves them all from one thread with `poll(2)`: their PMI
//! sockets, their output pipes (with `prefix_output`), and a `signalfd` for `SIGCHLD`,
//! `SIGINT`, `SIGTERM` and `SIGHUP`. Nothing busy-waits, and ranks sitting in a barrier
//! cost nothing until the last one arrives.
//!
//! The first failure ends the job: a rank that exits nonzero, is killed by a signal,
//! exits after PMI `init` without `finalize`, calls PMI `abort`, sends a malformed or
//! unsupported PMI command, or waits in a barrier that can no longer complete (another
//! rank has finalized or gone); also the job timeout and a terminating signal sent to
//! the launcher. It is reported on standard error (`rch-run: rank 3 (pid 4242) killed
//! by signal 9 (SIGKILL)`), the other ranks get `SIGTERM` and, after the grace period,
//! `SIGKILL`. Ranks also get `SIGKILL` should the launcher itself die
//! (`PR_SET_PDEATHSIG`).
//!
//! [`run`] blocks those signals in the calling thread while it runs (and restores the
//! mask afterwards); call it from a program's main thread, where no other thread
//! expects `SIGCHLD`.

use super::server::{Action, PmiServer};
use super::wire;
use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Most ranks [`run`] starts.
pub const MAX_RANKS: u32 = 1024;

/// Exit status of a job that ran out of time (as `timeout(1)`).
pub const TIMEOUT_EXIT: i32 = 124;

/// Largest unanswered PMI output kept for one rank before it counts as not reading.
const MAX_PENDING_OUT: usize = 16 << 20;

/// Longest partial output line kept before it is forwarded anyway.
const MAX_PARTIAL_LINE: usize = 64 * 1024;

/// How long forwarded output may still arrive after the last rank exited (a
/// grandchild may hold the pipe).
const DRAIN: Duration = Duration::from_millis(500);

/// How a job is run.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Number of ranks, `1..=MAX_RANKS`.
    pub ranks: u32,
    /// Forward each rank's stdout and stderr line by line with a `[rank] ` prefix
    /// (otherwise the ranks inherit the launcher's).
    pub prefix_output: bool,
    /// End the job (exit status [`TIMEOUT_EXIT`]) when it runs longer than this.
    pub timeout: Option<Duration>,
    /// Time between `SIGTERM` and `SIGKILL` when ranks are terminated.
    pub grace: Duration,
}

impl Default for LaunchOptions {
    /// One rank, inherited output, no timeout, 2 s grace.
    fn default() -> Self {
        LaunchOptions {
            ranks: 1,
            prefix_output: false,
            timeout: None,
            grace: Duration::from_secs(2),
        }
    }
}

/// The name of signal `sig` (`SIGKILL`), or `signal <n>`.
///
/// ```
/// assert_eq!(rdma_channel::pmi::launch::signal_name(9), "SIGKILL");
/// ```
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_owned()
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads what is available from a non-blocking descriptor into `buf`. Returns `false`
/// at end of file (or on an error that ends the stream).
fn read_available(fd: RawFd, buf: &mut Vec<u8>, limit: usize) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        // SAFETY: `chunk` is a valid writable buffer of `chunk.len()` bytes.
        let n = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
        if n > 0 {
            buf.extend_from_slice(&chunk[..n as usize]);
            if buf.len() > limit {
                return true;
            }
            continue;
        }
        if n == 0 {
            return false;
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return true,
            _ => return false,
        }
    }
}

/// The signals the launcher receives through its signalfd, blocked while it runs.
struct Signals {
    fd: OwnedFd,
    old_mask: libc::sigset_t,
}

impl Signals {
    fn block() -> io::Result<Signals> {
        // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it before use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` and `old_mask` are valid sigset_t values owned by this frame.
        unsafe {
            libc::sigemptyset(&mut set);
            for s in [libc::SIGCHLD, libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old_mask);
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
        }
        // SAFETY: `set` is initialised; -1 asks for a new descriptor.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: restoring the mask saved above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut()) };
            return Err(e);
        }
        // SAFETY: signalfd just returned this new descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Signals { fd, old_mask })
    }

    /// The signals received since the last call.
    fn drain(&self) -> Vec<i32> {
        let mut got = Vec::new();
        loop {
            // SAFETY: signalfd_siginfo is plain data, fully written by a successful read.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            // SAFETY: `info` is a valid writable buffer of `size` bytes.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    (&mut info as *mut libc::signalfd_siginfo).cast(),
                    size,
                )
            };
            if n != size as isize {
                return got;
            }
            got.push(info.ssi_signo as i32);
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `block`, a valid sigset_t.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut()) };
    }
}

/// One rank's PMI connection.
struct Peer {
    fd: OwnedFd,
    input: Vec<u8>,
    output: Vec<u8>,
}

/// One forwarded output stream.
struct Forward {
    fd: OwnedFd,
    buf: Vec<u8>,
    stderr: bool,
}

impl Forward {
    fn emit(&mut self, rank: u32, flush_partial: bool) {
        let mut text = Vec::new();
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            text.extend_from_slice(format!("[{rank}] ").as_bytes());
            text.extend(self.buf.drain(..=pos));
        }
        if !self.buf.is_empty() && (flush_partial || self.buf.len() >= MAX_PARTIAL_LINE) {
            text.extend_from_slice(format!("[{rank}] ").as_bytes());
            text.append(&mut self.buf);
            text.push(b'\n');
        }
        if text.is_empty() {
            return;
        }
        // A reader that went away loses the output; the job goes on.
        let _ = if self.stderr {
            io::stderr().lock().write_all(&text)
        } else {
            let mut out = io::stdout().lock();
            out.write_all(&text).and_then(|_| out.flush())
        };
    }
}

struct Rank {
    child: Child,
    pid: u32,
    status: Option<ExitStatus>,
    peer: Option<Peer>,
    out: Vec<Forward>,
    /// We signalled it while ending the job.
    terminated: bool,
}

struct Failure {
    code: i32,
}

struct Job<'a> {
    opts: &'a LaunchOptions,
    server: PmiServer,
    ranks: Vec<Rank>,
    failure: Option<Failure>,
    kill_at: Option<Instant>,
    killed: bool,
}

impl Job<'_> {
    fn fail(&mut self, code: i32, message: String, forward_signal: i32) {
        if self.failure.is_some() {
            return;
        }
        eprintln!("rch-run: {message}");
        self.failure = Some(Failure { code });
        let mut others = Vec::new();
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            if rank.status.is_none() {
                // SAFETY: kill(2) on our own unreaped child (its pid cannot be reused
                // before we wait for it).
                unsafe { libc::kill(rank.pid as libc::pid_t, forward_signal) };
                rank.terminated = true;
                others.push(r.to_string());
            }
        }
        if !others.is_empty() {
            eprintln!(
                "rch-run: terminating rank{} {} ({}, then SIGKILL after {:?})",
                if others.len() == 1 { "" } else { "s" },
                others.join(", "),
                signal_name(forward_signal),
                self.opts.grace
            );
            self.kill_at = Some(Instant::now() + self.opts.grace);
        }
    }

    fn who(&self, r: usize) -> String {
        format!("rank {r} (pid {})", self.ranks[r].pid)
    }

    /// Reads and handles what rank `r` sent on its PMI connection.
    fn pump_pmi(&mut self, r: usize) {
        let Some(peer) = self.ranks[r].peer.as_mut() else {
            return;
        };
        let open = read_available(peer.fd.as_raw_fd(), &mut peer.input, wire::MAX_LINE + 1);
        let mut lines = Vec::new();
        while let Some(pos) = peer.input.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = peer.input.drain(..=pos).collect();
            line.pop();
            lines.push(line);
        }
        let overlong = peer.input.len() > wire::MAX_LINE;
        if !open {
            self.ranks[r].peer = None;
        }
        for line in lines {
            if self.failure.is_some() {
                return;
            }
            let text = String::from_utf8_lossy(&line);
            match self.server.handle(r as u32, &text) {
                Ok(actions) => {
                    for a in actions {
                        match a {
                            Action::Send { rank, line } => {
                                if let Some(p) = self.ranks[rank as usize].peer.as_mut() {
                                    p.output.extend_from_slice(line.as_bytes());
                                }
                            }
                            Action::Abort {
                                rank,
                                code,
                                message,
                            } => {
                                let code = if code == 0 { 1 } else { code };
                                let msg = format!(
                                    "{} called PMI abort with exit code {code}{}",
                                    self.who(rank as usize),
                                    if message.is_empty() {
                                        String::new()
                                    } else {
                                        format!(": {message}")
                                    }
                                );
                                self.fail(code, msg, libc::SIGTERM);
                            }
                        }
                    }
                }
                Err(e) => {
                    let msg = format!(
                        "{} broke the PMI protocol: {}",
                        self.who(r),
                        e.to_string().trim_start_matches(&format!("rank {r}: "))
                    );
                    self.fail(1, msg, libc::SIGTERM);
                }
            }
        }
        if overlong && self.failure.is_none() {
            let msg = format!(
                "{} broke the PMI protocol: a line longer than {} bytes",
                self.who(r),
                wire::MAX_LINE
            );
            self.fail(1, msg, libc::SIGTERM);
        }
        self.flush_pmi();
    }

    /// Writes pending PMI answers as far as the sockets take them.
    fn flush_pmi(&mut self) {
        let mut stuck = None;
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            let Some(peer) = rank.peer.as_mut() else {
                continue;
            };
            while !peer.output.is_empty() {
                // SAFETY: `output` is a valid readable buffer of its length.
                let n = unsafe {
                    libc::send(
                        peer.fd.as_raw_fd(),
                        peer.output.as_ptr().cast(),
                        peer.output.len(),
                        libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                    )
                };
                if n > 0 {
                    peer.output.drain(..n as usize);
                    continue;
                }
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => {}
                    // The rank closed its end: it learns nothing more; its exit tells.
                    _ => peer.output.clear(),
                }
                break;
            }
            if peer.output.len() > MAX_PENDING_OUT {
                stuck = Some(r);
            }
        }
        if let Some(r) = stuck {
            let msg = format!("{} does not read its PMI answers", self.who(r));
            self.fail(1, msg, libc::SIGTERM);
        }
    }

    /// Collects exited ranks and judges how they ended.
    fn reap(&mut self) {
        for r in 0..self.ranks.len() {
            if self.ranks[r].status.is_some() {
                continue;
            }
            let status = match self.ranks[r].child.try_wait() {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => {
                    let msg = format!("waiting for {} failed: {e}", self.who(r));
                    self.fail(1, msg, libc::SIGTERM);
                    continue;
                }
            };
            // Whatever it said before exiting counts (a finalize in flight).
            self.pump_pmi(r);
            self.ranks[r].status = Some(status);
            self.ranks[r].peer = None;
            if self.ranks[r].terminated || self.failure.is_some() {
                continue;
            }
            let who = self.who(r);
            if let Some(sig) = status.signal() {
                let core = if status.core_dumped() {
                    " (core dumped)"
                } else {
                    ""
                };
                self.fail(
                    128 + sig,
                    format!("{who} killed by signal {sig} ({}){core}", signal_name(sig)),
                    libc::SIGTERM,
                );
            } else {
                let code = status.code().unwrap_or(1);
                if code != 0 {
                    self.fail(
                        code,
                        format!("{who} exited with status {code}"),
                        libc::SIGTERM,
                    );
                } else if self.server.initialized(r as u32) && !self.server.finalized(r as u32) {
                    self.fail(
                        1,
                        format!("{who} exited with status 0 after PMI init without PMI finalize"),
                        libc::SIGTERM,
                    );
                }
            }
        }
    }

    /// A barrier that can no longer complete ends the job rather than hanging it.
    fn check_barrier(&mut self) {
        if self.failure.is_some() {
            return;
        }
        let Some(waiting) = self.server.in_barrier().next() else {
            return;
        };
        for r in 0..self.ranks.len() {
            let gone = if self.server.finalized(r as u32) {
                "has called PMI finalize"
            } else if self.ranks[r].status.is_some() {
                "has exited"
            } else {
                continue;
            };
            let msg = format!(
                "rank {waiting} waits in a PMI barrier that cannot complete: {} {gone}",
                self.who(r)
            );
            self.fail(1, msg, libc::SIGTERM);
            return;
        }
    }

    fn all_exited(&self) -> bool {
        self.ranks.iter().all(|r| r.status.is_some())
    }
}

fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two descriptors for the kernel to fill.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair just created both descriptors; each gets one owner.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn spawn_rank(
    program: &OsStr,
    args: &[OsString],
    opts: &LaunchOptions,
    r: u32,
    mask: libc::sigset_t,
) -> io::Result<Rank> {
    let (ours, theirs) = socket_pair()?;
    let child_fd = theirs.as_raw_fd();
    // SAFETY: getpid has no preconditions.
    let launcher = unsafe { libc::getpid() };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("PMI_FD", child_fd.to_string())
        .env("PMI_RANK", r.to_string())
        .env("PMI_SIZE", opts.ranks.to_string())
        .env("PMI_SPAWNED", "0")
        .env("MPI_LOCALNRANKS", opts.ranks.to_string())
        .env("MPI_LOCALRANKID", r.to_string())
        .env_remove("PMI_PORT")
        .env_remove("PMI_ID")
        .stdin(if r == 0 {
            Stdio::inherit()
        } else {
            Stdio::null()
        });
    if opts.prefix_output {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (sigprocmask, fcntl, prctl, getppid) on plain
    // values it owns.
    unsafe {
        cmd.pre_exec(move || {
            // The signals the launcher blocked for its signalfd would stay blocked
            // across exec (SIGTERM could not end a rank): give back the mask it had.
            if libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut()) < 0 {
                return Err(io::Error::last_os_error());
            }
            // The child's end of the pair survives exec; the parent's stays closed.
            if libc::fcntl(child_fd, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != launcher {
                return Err(io::Error::other("the launcher died"));
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    drop(theirs);
    let mut out = Vec::new();
    for (fd, stderr) in [
        (child.stdout.take().map(OwnedFd::from), false),
        (child.stderr.take().map(OwnedFd::from), true),
    ] {
        if let Some(fd) = fd {
            set_nonblocking(fd.as_raw_fd())?;
            out.push(Forward {
                fd,
                buf: Vec::new(),
                stderr,
            });
        }
    }
    set_nonblocking(ours.as_raw_fd())?;
    Ok(Rank {
        pid: child.id(),
        child,
        status: None,
        peer: Some(Peer {
            fd: ours,
            input: Vec::new(),
            output: Vec::new(),
        }),
        out,
        terminated: false,
    })
}

/// Runs `program args...` as `opts.ranks` ranks served PMI-1 and returns the job's
/// exit status: 0 when every rank exited 0 (after PMI finalize if it used PMI);
/// otherwise the first failure's: the rank's exit status, 128 + signal, the PMI abort
/// code, 1 for a protocol fault, [`TIMEOUT_EXIT`] for the timeout, 128 + signal for a
/// signal sent to the launcher. Failures are reported on standard error.
///
/// ```
/// use rdma_channel::pmi::launch::{run, LaunchOptions};
/// let opts = LaunchOptions { ranks: 3, ..LaunchOptions::default() };
/// let status = run("sh".as_ref(), &["-c".into(), "exit $((PMI_RANK == 2 ? 4 : 0))".into()], &opts)?;
/// assert_eq!(status, 4);
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// # Errors
///
/// `InvalidInput` when `opts.ranks` is 0 or above [`MAX_RANKS`]; the error of
/// starting the program (`NotFound`, `PermissionDenied`, ...), with its name, after
/// the ranks already started have been killed; errors setting up sockets, pipes or
/// the signalfd.
pub fn run(program: &OsStr, args: &[OsString], opts: &LaunchOptions) -> io::Result<i32> {
    if opts.ranks == 0 || opts.ranks > MAX_RANKS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the number of ranks must be 1..={MAX_RANKS}, not {}",
                opts.ranks
            ),
        ));
    }
    // Three descriptors per rank (PMI socket, two pipes) plus ours.
    raise_fd_limit(u64::from(opts.ranks) * 4 + 64);
    let signals = Signals::block()?;
    // SAFETY: getpid has no preconditions.
    let kvs_name = format!("rch_kvs_{}_0", unsafe { libc::getpid() });
    let mut job = Job {
        opts,
        server: PmiServer::new(opts.ranks, &kvs_name),
        ranks: Vec::with_capacity(opts.ranks as usize),
        failure: None,
        kill_at: None,
        killed: false,
    };
    for r in 0..opts.ranks {
        match spawn_rank(program, args, opts, r, signals.old_mask) {
            Ok(rank) => job.ranks.push(rank),
            Err(e) => {
                for rank in &mut job.ranks {
                    let _ = rank.child.kill();
                    let _ = rank.child.wait();
                }
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot start '{}': {e}", program.to_string_lossy()),
                ));
            }
        }
    }
    let deadline = opts.timeout.map(|t| Instant::now() + t);
    let mut drain_until: Option<Instant> = None;
    let mut child_signal = true;
    loop {
        if std::mem::take(&mut child_signal) {
            job.reap();
        }
        job.check_barrier();
        if job.all_exited() {
            let until = *drain_until.get_or_insert_with(|| Instant::now() + DRAIN);
            let open = job.ranks.iter().any(|r| !r.out.is_empty());
            if !open || Instant::now() >= until {
                break;
            }
        }
        // What to wait for.
        let mut pfds = vec![libc::pollfd {
            fd: signals.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let mut owners: Vec<(usize, Option<usize>)> = vec![(usize::MAX, None)];
        for (r, rank) in job.ranks.iter().enumerate() {
            if let Some(p) = &rank.peer {
                let events = if p.output.is_empty() {
                    libc::POLLIN
                } else {
                    libc::POLLIN | libc::POLLOUT
                };
                pfds.push(libc::pollfd {
                    fd: p.fd.as_raw_fd(),
                    events,
                    revents: 0,
                });
                owners.push((r, None));
            }
            for (i, f) in rank.out.iter().enumerate() {
                pfds.push(libc::pollfd {
                    fd: f.fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                owners.push((r, Some(i)));
            }
        }
        let now = Instant::now();
        let next = [
            deadline.filter(|_| job.failure.is_none()),
            job.kill_at.filter(|_| !job.killed),
            drain_until,
        ]
        .into_iter()
        .flatten()
        .min();
        let ms = match next {
            None => -1,
            Some(t) => t
                .saturating_duration_since(now)
                .as_millis()
                .saturating_add(1)
                .min(i32::MAX as u128) as libc::c_int,
        };
        // SAFETY: `pfds` is a valid array of `pfds.len()` initialised pollfds.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        for (pfd, &(r, which)) in pfds.iter().zip(&owners) {
            if pfd.revents == 0 {
                continue;
            }
            if r == usize::MAX {
                for sig in signals.drain() {
                    if sig == libc::SIGCHLD {
                        child_signal = true;
                    } else {
                        job.fail(
                            128 + sig,
                            format!("received {}; ending the job", signal_name(sig)),
                            sig,
                        );
                    }
                }
                continue;
            }
            match which {
                None => {
                    if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                        job.pump_pmi(r);
                    }
                }
                Some(i) => {
                    let rank = &mut job.ranks[r];
                    let f = &mut rank.out[i];
                    let open = read_available(f.fd.as_raw_fd(), &mut f.buf, MAX_PARTIAL_LINE);
                    f.emit(r as u32, !open);
                    if !open {
                        rank.out.remove(i);
                        // Indices of later streams shifted: skip them this round.
                        break;
                    }
                }
            }
        }
        job.flush_pmi();
        let now = Instant::now();
        if let Some(d) = deadline {
            if now >= d && job.failure.is_none() {
                let secs = opts.timeout.unwrap_or_default().as_secs_f64();
                job.fail(
                    TIMEOUT_EXIT,
                    format!("the job timed out after {secs} s"),
                    libc::SIGTERM,
                );
            }
        }
        if let Some(k) = job.kill_at {
            if now >= k && !job.killed {
                job.killed = true;
                for rank in &mut job.ranks {
                    if rank.status.is_none() {
                        // SAFETY: kill(2) on our own unreaped child.
                        unsafe { libc::kill(rank.pid as libc::pid_t, libc::SIGKILL) };
                    }
                }
            }
        }
    }
    for (r, rank) in job.ranks.iter_mut().enumerate() {
        for mut f in rank.out.drain(..) {
            read_available(f.fd.as_raw_fd(), &mut f.buf, usize::MAX);
            f.emit(r as u32, true);
        }
    }
    drop(signals);
    Ok(job.failure.map_or(0, |f| f.code))
}

fn raise_fd_limit(want: u64) {
    // SAFETY: rlimit is plain data filled by getrlimit.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `lim` is a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur >= want {
        return;
    }
    lim.rlim_cur = lim.rlim_max.min(want.max(lim.rlim_cur));
    // SAFETY: `lim` is a valid rlimit; failure only leaves the old limit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}
