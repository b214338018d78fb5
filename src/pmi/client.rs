//! The PMI-1 client: [`PmiClient`].

use super::conn::Conn;
use super::wire::{self, Message};
use crate::settings::{self, Setting};
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a PMI exchange may take when `RCH_PMI_TIMEOUT_MS` is not set: 60 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Environment variable holding the PMI timeout in milliseconds.
pub const TIMEOUT_ENV: &str = crate::settings::PMI_TIMEOUT_MS.name();

/// Largest `vallen_max`, `keylen_max` or `kvsname_max` believed from a server.
const MAX_LIMIT: i64 = 1 << 20;

/// Most parts [`PmiClient::get_bytes`] accepts for one value.
const MAX_PARTS: usize = 1 << 16;

/// Set once [`PmiClient::from_env`] has connected: the environment's PMI connection
/// has one owner per process.
static ENV_CLAIMED: AtomicBool = AtomicBool::new(false);

fn invalid_input(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// The timeout `RCH_PMI_TIMEOUT_MS` asks for, or [`DEFAULT_TIMEOUT`].
///
/// ```
/// let t = rdma_channel::pmi::timeout_from_env()?;
/// assert!(t > std::time::Duration::ZERO);
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// # Errors
///
/// `InvalidInput` naming the variable when it is set but not a positive number of
/// milliseconds.
pub fn timeout_from_env() -> io::Result<Duration> {
    match crate::settings::PMI_TIMEOUT_MS.value()? {
        None => Ok(DEFAULT_TIMEOUT),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => Err(invalid_input(format!(
                "{TIMEOUT_ENV}='{v}' is not a positive number of milliseconds"
            ))),
        },
    }
}

fn env_var(setting: &Setting) -> io::Result<Option<String>> {
    setting.value()
}

fn env_number(name: &str, value: &str) -> io::Result<i64> {
    value
        .trim()
        .parse::<i64>()
        .map_err(|_| invalid_input(format!("{name}='{value}' is not a number")))
}

fn check_rank_size(rank: i64, size: i64, source: &str) -> io::Result<(u32, u32)> {
    if size < 1 || size > i64::from(u32::MAX) {
        return Err(invalid_input(format!(
            "{source}: size {size} is not a positive 32-bit number"
        )));
    }
    if rank < 0 || rank >= size {
        return Err(invalid_input(format!(
            "{source}: rank {rank} is outside 0..{size}"
        )));
    }
    Ok((rank as u32, size as u32))
}

/// A connection to the process manager over the simple PMI-1 wire protocol, the one
/// MPICH's Hydra (`mpiexec.hydra`), Slurm's PMI-1 plugin and our `rch-run` serve.
///
/// The process manager gives every process of a job its rank and the job's size, and a
/// key-value space (KVS) shared by the job: each process [`put`](Self::put)s what the
/// others need (here: its connection card), all meet in a [`barrier`](Self::barrier),
/// then each [`get`](Self::get)s what it needs. A value put before a barrier is
/// guaranteed visible to every process only after that barrier (Hydra caches puts
/// until the next barrier, even for the putting process itself).
///
/// Every exchange waits at most [`timeout`](Self::timeout) (`RCH_PMI_TIMEOUT_MS`,
/// default 60 s), so a process manager that stops answering gives `TimedOut` rather
/// than a hang, and everything the server sends is checked: garbage, a truncated line,
/// an unexpected command or a hang-up each give an error saying what was expected.
///
/// ```
/// use std::os::unix::net::UnixStream;
/// use std::io::{BufRead, BufReader, Write};
/// use rdma_channel::pmi::PmiClient;
///
/// // A tiny scripted server: answer each request with the next canned line.
/// let (ours, theirs) = UnixStream::pair()?;
/// let server = std::thread::spawn(move || {
///     let mut r = BufReader::new(theirs.try_clone().unwrap());
///     let mut w = theirs;
///     for answer in [
///         "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0",
///         "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024",
///         "cmd=my_kvsname kvsname=kvs_0",
///         "cmd=put_result rc=0",
///         "cmd=barrier_out",
///         "cmd=get_result rc=0 value=card-of-0",
///         "cmd=finalize_ack",
///     ] {
///         let mut request = String::new();
///         r.read_line(&mut request).unwrap();
///         writeln!(w, "{answer}").unwrap();
///     }
/// });
/// let mut pmi = PmiClient::with_fd(ours.into(), 0, 1, std::time::Duration::from_secs(5))?;
/// assert_eq!((pmi.rank(), pmi.size(), pmi.kvs_name()), (0, 1, "kvs_0"));
/// pmi.put("card-0", "card-of-0")?;
/// pmi.barrier()?;
/// assert_eq!(pmi.get("card-0")?, "card-of-0");
/// pmi.finalize()?;
/// server.join().unwrap();
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PmiClient {
    conn: ConnDebug,
    rank: u32,
    size: u32,
    spawned: bool,
    kvs_name: String,
    max_kvs_name_len: usize,
    max_key_len: usize,
    max_value_len: usize,
}

/// [`Conn`] with a `Debug` that shows only the descriptor.
struct ConnDebug(Conn);

impl std::fmt::Debug for ConnDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("fd", self.0.fd())
            .field("timeout", &self.0.timeout)
            .finish()
    }
}

impl PmiClient {
    /// Connects to the process manager named by the environment, the way MPICH's
    /// simple PMI does:
    ///
    /// * `PMI_FD` (Hydra's default, `rch-run`, Slurm's `--mpi=pmi1`): an inherited,
    ///   connected socket; `PMI_RANK` and `PMI_SIZE` give rank and size;
    /// * otherwise `PMI_PORT=host:port` and `PMI_ID` (Hydra's `-pmi-port`): connect,
    ///   then learn size and rank from the server's `initack`;
    /// * neither: `Ok(None)`, a singleton started without a process manager.
    ///
    /// `PMI_SPAWNED=1` marks a process started by a dynamic spawn. The descriptor is
    /// made close-on-exec, so programs this process starts do not inherit it. Then the
    /// handshake runs: `init` (PMI 1.1), `get_maxes`, `get_my_kvsname`.
    ///
    /// The environment's connection has one owner: only the first successful call in a
    /// process connects; later calls fail with `AlreadyExists` (a second client on the
    /// same `PMI_FD` would interleave its lines with the first one's, and after
    /// [`finalize`](Self::finalize) the descriptor number may belong to something else).
    /// A call that fails on a malformed environment leaves the connection unclaimed; one
    /// whose handshake over `PMI_FD` fails has closed the descriptor, and later calls
    /// fail with `AlreadyExists` too.
    ///
    /// ```
    /// # // Doc-tests do not run under a process manager.
    /// use rdma_channel::settings::{PMI_FD, PMI_PORT};
    /// # if PMI_FD.value()?.is_none() && PMI_PORT.value()?.is_none() {
    /// assert!(rdma_channel::pmi::PmiClient::from_env()?.is_none());
    /// # }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `InvalidInput` naming the variable when `PMI_FD`, `PMI_RANK`, `PMI_SIZE`,
    /// `PMI_PORT`, `PMI_ID`, `PMI_SPAWNED` or `RCH_PMI_TIMEOUT_MS` is malformed, or
    /// `PMI_FD` is not an open descriptor; `AlreadyExists` on a second call; connection
    /// errors for `PMI_PORT`; and the handshake's errors (see [`with_fd`](Self::with_fd)).
    pub fn from_env() -> io::Result<Option<PmiClient>> {
        let fd_var = env_var(&settings::PMI_FD)?;
        let port_var = env_var(&settings::PMI_PORT)?;
        if fd_var.is_none() && port_var.is_none() {
            return Ok(None);
        }
        let timeout = timeout_from_env()?;
        let spawned = match env_var(&settings::PMI_SPAWNED)? {
            None => false,
            Some(v) => env_number("PMI_SPAWNED", &v)? != 0,
        };
        if ENV_CLAIMED.swap(true, Ordering::AcqRel) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "PMI: this process already connected to its process manager (PmiClient::from_env \
                 may succeed once per process)",
            ));
        }
        // Set once an OwnedFd owns PMI_FD: from then on the number is ours to close,
        // and after a failure it may name something else, so no retry may take it.
        let mut taken = false;
        let result = match fd_var {
            Some(fd) => Self::from_env_fd(&fd, timeout, &mut taken),
            None => (|| {
                let port = port_var.unwrap_or_default();
                let id = env_var(&settings::PMI_ID)?
                    .ok_or_else(|| invalid_input("PMI_PORT is set but PMI_ID is not".into()))?;
                let id = env_number("PMI_ID", &id)?;
                Self::connect_port(&port, id, timeout)
            })(),
        };
        match result {
            Ok(mut c) => {
                c.spawned = spawned;
                Ok(Some(c))
            }
            Err(e) => {
                if !taken {
                    // Nothing took the connection: a corrected retry may.
                    ENV_CLAIMED.store(false, Ordering::Release);
                }
                Err(e)
            }
        }
    }

    fn from_env_fd(fd: &str, timeout: Duration, taken: &mut bool) -> io::Result<PmiClient> {
        let raw: RawFd = fd
            .trim()
            .parse()
            .ok()
            .filter(|&n: &RawFd| n >= 0)
            .ok_or_else(|| invalid_input(format!("PMI_FD='{fd}' is not a descriptor number")))?;
        // SAFETY: F_GETFD only inspects the descriptor table; any number is allowed.
        let flags = unsafe { libc::fcntl(raw, libc::F_GETFD) };
        if flags < 0 {
            return Err(invalid_input(format!(
                "PMI_FD={raw} is not an open descriptor in this process ({})",
                io::Error::last_os_error()
            )));
        }
        let rank = env_var(&settings::PMI_RANK)?
            .ok_or_else(|| invalid_input("PMI_FD is set but PMI_RANK is not".into()))?;
        let size = env_var(&settings::PMI_SIZE)?
            .ok_or_else(|| invalid_input("PMI_FD is set but PMI_SIZE is not".into()))?;
        let (rank, size) = check_rank_size(
            env_number("PMI_RANK", &rank)?,
            env_number("PMI_SIZE", &size)?,
            "PMI_RANK/PMI_SIZE",
        )?;
        // SAFETY: F_SETFD on a descriptor just checked to be open.
        unsafe { libc::fcntl(raw, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
        // SAFETY: the descriptor is open (checked above), and PMI_FD hands it to the
        // process's PMI client; ENV_CLAIMED makes this the only place in the process
        // that takes ownership of it, so it is closed exactly once, by this OwnedFd.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        *taken = true;
        Self::with_fd(owned, rank, size, timeout)
    }

    /// Connects to `host:port` (the value of `PMI_PORT`) as process `id` (`PMI_ID`):
    /// sends `initack`, reads the server's `initack` and its `set size=`, `set rank=`
    /// and `set debug=` lines, then runs the handshake of [`with_fd`](Self::with_fd).
    ///
    /// ```no_run
    /// let pmi = rdma_channel::pmi::PmiClient::connect_port(
    ///     "node1:41825", 0, std::time::Duration::from_secs(10))?;
    /// println!("rank {} of {}", pmi.rank(), pmi.size());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a malformed address; the connection's errors; `InvalidData`,
    /// `UnexpectedEof` or `TimedOut` for a server that does not follow the protocol.
    pub fn connect_port(host_port: &str, id: i64, timeout: Duration) -> io::Result<PmiClient> {
        let (host, port) = host_port
            .rsplit_once(':')
            .filter(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            .ok_or_else(|| {
                invalid_input(format!(
                    "PMI_PORT='{host_port}' is not of the form host:port"
                ))
            })?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port.parse().unwrap_or(0);
        let addrs: Vec<_> = (host, port).to_socket_addrs()?.collect();
        let mut last = io::Error::new(
            io::ErrorKind::NotFound,
            format!("PMI_PORT='{host_port}': no address found"),
        );
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = io::Error::new(e.kind(), format!("PMI: connecting to {a}: {e}")),
            }
        }
        let stream = stream.ok_or(last)?;
        let _ = stream.set_nodelay(true);
        let mut conn = Conn::new(stream.into(), timeout);
        conn.send(&wire::format("initack", &[("pmiid", &id.to_string())]))?;
        conn.recv("initack")?;
        let (mut size, mut rank) = (None, None);
        for _ in 0..3 {
            let m = conn.recv("set")?;
            if m.get("size").is_some() {
                size = Some(m.require_int("size")?);
            } else if m.get("rank").is_some() {
                rank = Some(m.require_int("rank")?);
            } else {
                m.require_int("debug")?;
            }
        }
        let (Some(rank), Some(size)) = (rank, size) else {
            return Err(wire::invalid_data(
                "PMI: the server's initack did not set both size and rank".into(),
            ));
        };
        let (rank, size) = check_rank_size(rank, size, "PMI initack")?;
        Self::handshake(conn, rank, size)
    }

    /// Runs the PMI-1 handshake (`init`, `get_maxes`, `get_my_kvsname`) over `fd`, an
    /// already connected stream, for process `rank` of `size`; every exchange then
    /// waits at most `timeout`. This is what [`from_env`](Self::from_env) does with
    /// `PMI_FD`; it is public for process managers and tests that connect the
    /// descriptor themselves.
    ///
    /// See the [type's documentation](PmiClient) for an example.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `rank >= size` or `size == 0`; `InvalidData` when the server
    /// sends garbage, an unexpected command, a missing or non-numeric attribute, or
    /// refuses version 1.1 (`rc` != 0); `UnexpectedEof` when it hangs up, `BrokenPipe`
    /// when it has hung up before we write; `TimedOut` when it does not answer in time.
    pub fn with_fd(fd: OwnedFd, rank: u32, size: u32, timeout: Duration) -> io::Result<PmiClient> {
        let (rank, size) = check_rank_size(i64::from(rank), i64::from(size), "PmiClient::with_fd")?;
        Self::handshake(Conn::new(fd, timeout), rank, size)
    }

    fn handshake(mut conn: Conn, rank: u32, size: u32) -> io::Result<PmiClient> {
        let m = conn.call(
            "cmd=init pmi_version=1 pmi_subversion=1\n",
            "response_to_init",
        )?;
        let rc = m.int_or("rc", 0)?;
        if rc != 0 {
            return Err(wire::invalid_data(format!(
                "PMI: the process manager refused PMI version 1.1 (rc={rc}, it offers {}.{})",
                m.get("pmi_version").unwrap_or("?"),
                m.get("pmi_subversion").unwrap_or("?")
            )));
        }
        let m = conn.call("cmd=get_maxes\n", "maxes")?;
        // The limits count C's terminating NUL: Hydra keeps at most `vallen_max - 1`
        // bytes of a value (and `keylen_max - 1` of a key), silently dropping the rest.
        let limit = |key: &str| -> io::Result<usize> {
            let v = m.require_int(key)?;
            if !(2..=MAX_LIMIT).contains(&v) {
                return Err(wire::invalid_data(format!(
                    "PMI: the process manager announced {key}={v}, outside 2..={MAX_LIMIT}"
                )));
            }
            Ok(v as usize - 1)
        };
        let (max_kvs_name_len, max_key_len, max_value_len) = (
            limit("kvsname_max")?,
            limit("keylen_max")?,
            limit("vallen_max")?,
        );
        let m = conn.call("cmd=get_my_kvsname\n", "my_kvsname")?;
        let kvs_name = m.require("kvsname")?.to_owned();
        wire::check_token("KVS name", &kvs_name, max_kvs_name_len).map_err(|e| {
            wire::invalid_data(format!(
                "PMI: the process manager's KVS name is unusable: {e}"
            ))
        })?;
        Ok(PmiClient {
            conn: ConnDebug(conn),
            rank,
            size,
            spawned: false,
            kvs_name,
            max_kvs_name_len,
            max_key_len,
            max_value_len,
        })
    }

    /// This process's rank, `0..size()`.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of processes in the job.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Whether this process was started by a dynamic spawn (`PMI_SPAWNED=1`).
    pub fn spawned(&self) -> bool {
        self.spawned
    }

    /// The name of the job's key-value space.
    pub fn kvs_name(&self) -> &str {
        &self.kvs_name
    }

    /// The longest value [`put`](Self::put) accepts: the server's `vallen_max` minus one,
    /// because that limit counts C's terminating NUL (Hydra announces 1024 and silently
    /// cuts longer values to 1023 bytes).
    pub fn max_value_len(&self) -> usize {
        self.max_value_len
    }

    /// The longest key [`put`](Self::put) accepts: the server's `keylen_max` minus one
    /// (Hydra: 63).
    pub fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    /// The longest KVS name the server supports (its `kvsname_max` minus one).
    pub fn max_kvs_name_len(&self) -> usize {
        self.max_kvs_name_len
    }

    /// How long one exchange with the process manager may take.
    pub fn timeout(&self) -> Duration {
        self.conn.0.timeout
    }

    /// Changes how long one exchange may take (a long [`barrier`](Self::barrier) may
    /// need more than the default).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.conn.0.timeout = timeout;
    }

    fn check_rc(m: &Message, what: &str) -> io::Result<()> {
        let rc = m.int_or("rc", 0)?;
        if rc != 0 {
            return Err(io::Error::other(format!(
                "PMI: the process manager refused {what}: rc={rc}{}",
                m.get("msg").map(|s| format!(" ({s})")).unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// Stores `value` under `key` in the job's key-value space. Other processes are
    /// guaranteed to see it after the next [`barrier`](Self::barrier).
    ///
    /// Keys and values travel as single words of the line protocol: non-empty,
    /// printable ASCII without spaces or backslashes (and no `=` in keys), at most
    /// [`max_key_len`](Self::max_key_len) and [`max_value_len`](Self::max_value_len)
    /// bytes. Binary or longer values go through [`put_bytes`](Self::put_bytes).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a key or value that breaks those rules; `Other` when the
    /// server answers with `rc` != 0; the connection errors of [`with_fd`](Self::with_fd).
    pub fn put(&mut self, key: &str, value: &str) -> io::Result<()> {
        wire::check_token("key", key, self.max_key_len)?;
        wire::check_token("value", value, self.max_value_len)?;
        let line = format!(
            "cmd=put kvsname={} key={key} value={value}\n",
            self.kvs_name
        );
        let m = self.conn.0.call(&line, "put_result")?;
        Self::check_rc(&m, &format!("put of key '{key}'"))
    }

    /// Fetches the value stored under `key`.
    ///
    /// # Errors
    ///
    /// `NotFound` when the server answers `rc` != 0 (no such key, or not visible yet:
    /// call [`barrier`](Self::barrier) after the put); `InvalidInput` for a malformed
    /// key; `InvalidData` for an answer without a value; connection errors as in
    /// [`with_fd`](Self::with_fd).
    pub fn get(&mut self, key: &str) -> io::Result<String> {
        wire::check_token("key", key, self.max_key_len)?;
        let line = format!("cmd=get kvsname={} key={key}\n", self.kvs_name);
        let m = self.conn.0.call(&line, "get_result")?;
        let rc = m.int_or("rc", 0)?;
        if rc != 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "PMI: key '{key}' not found in {} (rc={rc}{})",
                    self.kvs_name,
                    m.get("msg").map(|s| format!(", {s}")).unwrap_or_default()
                ),
            ));
        }
        Ok(m.require("value")?.to_owned())
    }

    /// Stores arbitrary bytes under `key`: hex-encoded, in `key` itself when that fits
    /// in one value, otherwise split over `key#0`, `key#1`, ... with the number of
    /// parts in `key` (so `key#<n>` names are taken). Read it back with
    /// [`get_bytes`](Self::get_bytes) after a [`barrier`](Self::barrier).
    ///
    /// Layout: `key` holds `x<hex>` (one value) or `p<parts>`; each part holds up to
    /// `max_value_len` hex digits (an even number).
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `key` (with the longest `#<n>` suffix needed) is malformed or
    /// longer than [`max_key_len`](Self::max_key_len), or the value needs more than
    /// 65536 parts; otherwise as [`put`](Self::put).
    pub fn put_bytes(&mut self, key: &str, value: &[u8]) -> io::Result<()> {
        let hex = hex_encode(value);
        if hex.len() < self.max_value_len {
            return self.put(key, &format!("x{hex}"));
        }
        let per_part = (self.max_value_len & !1).max(2);
        let parts = hex.len().div_ceil(per_part);
        if parts > MAX_PARTS {
            return Err(invalid_input(format!(
                "PMI: a value of {} bytes needs {parts} parts of {per_part} hex digits; at most \
                 {MAX_PARTS} are allowed",
                value.len()
            )));
        }
        wire::check_token("key", &format!("{key}#{}", parts - 1), self.max_key_len)?;
        for (i, chunk) in hex.as_bytes().chunks(per_part).enumerate() {
            // Hex digits are ASCII, so every chunk is valid UTF-8.
            let chunk = std::str::from_utf8(chunk).expect("hex is ASCII");
            self.put(&format!("{key}#{i}"), chunk)?;
        }
        // The header last: whoever sees it can find every part.
        self.put(key, &format!("p{parts}"))
    }

    /// Fetches bytes stored by [`put_bytes`](Self::put_bytes).
    ///
    /// # Errors
    ///
    /// `NotFound` when `key` or one of its parts is missing; `InvalidData` when the
    /// stored value is not in `put_bytes`'s layout (bad header, odd length, non-hex
    /// digit); otherwise as [`get`](Self::get).
    pub fn get_bytes(&mut self, key: &str) -> io::Result<Vec<u8>> {
        let head = self.get(key)?;
        let bad = |why: String| wire::invalid_data(format!("PMI: value of '{key}' {why}"));
        if let Some(hex) = head.strip_prefix('x') {
            return hex_decode(hex).map_err(bad);
        }
        let parts = head
            .strip_prefix('p')
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| (1..=MAX_PARTS).contains(&n))
            .ok_or_else(|| {
                bad(format!(
                    "is not in put_bytes's layout (x<hex> or p<parts>): '{}'",
                    wire::excerpt(head.as_bytes())
                ))
            })?;
        let mut out = Vec::new();
        for i in 0..parts {
            let part = self.get(&format!("{key}#{i}"))?;
            if part.len() % 2 != 0 {
                return Err(bad(format!("has part {i} of odd length {}", part.len())));
            }
            out.extend(hex_decode(&part).map_err(bad)?);
        }
        Ok(out)
    }

    /// Waits until every process of the job has entered the barrier. Puts made
    /// before it are visible to every process after it.
    ///
    /// # Errors
    ///
    /// The connection errors of [`with_fd`](Self::with_fd); `TimedOut` when the other
    /// processes do not arrive within [`timeout`](Self::timeout).
    pub fn barrier(&mut self) -> io::Result<()> {
        self.conn
            .0
            .call("cmd=barrier_in\n", "barrier_out")
            .map(|_| ())
    }

    /// Asks for the application number (`get_appnum`; 0 unless started as one of
    /// several programs of an MPMD launch).
    ///
    /// # Errors
    ///
    /// As [`barrier`](Self::barrier), plus `InvalidData` for a non-numeric answer.
    pub fn appnum(&mut self) -> io::Result<i64> {
        self.conn
            .0
            .call("cmd=get_appnum\n", "appnum")?
            .require_int("appnum")
    }

    /// Tells the process manager this process is done with PMI (`finalize`, answered by
    /// `finalize_ack`) and closes the connection. A process that initialised PMI and
    /// exits without finalizing is treated by `rch-run` (and Hydra) as a failure.
    ///
    /// # Errors
    ///
    /// As [`barrier`](Self::barrier). The connection is closed either way.
    pub fn finalize(mut self) -> io::Result<()> {
        self.conn.0.call("cmd=finalize\n", "finalize_ack")?;
        // SAFETY: shutdown on our own open descriptor; ENOTSOCK (a pipe) is harmless.
        unsafe {
            libc::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(self.conn.0.fd()),
                libc::SHUT_RDWR,
            )
        };
        Ok(())
    }

    /// Asks the process manager to abort the whole job with exit `code`, reporting
    /// `msg` (`cmd=abort exitcode=<code> message=<msg>`). No answer is awaited: the
    /// process manager kills every process of the job, this one included, so the
    /// caller should exit with `code` itself if it is still running shortly after.
    ///
    /// # Errors
    ///
    /// `BrokenPipe` when the process manager has already hung up, `TimedOut` when the
    /// line cannot be written in time.
    pub fn abort(&mut self, code: i32, msg: &str) -> io::Result<()> {
        let mut line = format!("cmd=abort exitcode={code} message=");
        let text = if msg.is_empty() { "(none)" } else { msg };
        wire::push_escaped(&mut line, &text.chars().take(1024).collect::<String>());
        line.push('\n');
        self.conn.0.send(&line)
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

fn hex_decode(hex: &str) -> Result<Vec<u8>, String> {
    if hex.len() % 2 != 0 {
        return Err(format!("has an odd number ({}) of hex digits", hex.len()));
    }
    let digit = |c: u8| -> Result<u8, String> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(format!("contains '{}', not a hex digit", c as char)),
        }
    };
    hex.as_bytes()
        .chunks(2)
        .map(|p| Ok(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_decode(&hex_encode(&all)).unwrap(), all);
        assert_eq!(hex_encode(&[0x0f, 0xa0]), "0fa0");
        assert!(hex_decode("abc").is_err());
        assert!(hex_decode("zz").is_err());
    }

    #[test]
    fn rank_and_size_are_checked() {
        assert!(check_rank_size(0, 1, "t").is_ok());
        assert!(check_rank_size(1, 1, "t").is_err());
        assert!(check_rank_size(-1, 4, "t").is_err());
        assert!(check_rank_size(0, 0, "t").is_err());
    }
}
