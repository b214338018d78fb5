//! Peer processes for the tests: this test binary re-executed as one test (a *role*),
//! on this host, or on another host of a test cluster through a *peer agent*.
//!
//! * [`spawn_self`] runs `current_exe() --exact <test> --nocapture --test-threads=1`
//!   here, with the caller's `RCH_*` settings removed (but the fabric kept) and the
//!   role's variables set.
//! * [`spawn_peer`] does the same on the peer host when `RCH_TEST_PEER_AGENT`
//!   (`host:port`) names an agent, and here otherwise. The peer host sees the same
//!   files (the Soft-RoCE VMs share the host's root file system), so the same path
//!   runs there.
//! * The agent is the test `common::peer::peer_agent` of any test binary, started
//!   with `RCH_TEST_AGENT_LISTEN=addr:port` (`scripts/softroce-cluster-test` does
//!   it on the other VM). It serves requests over TCP on the cluster's private link:
//!   each is an executable, its arguments and environment; it answers with the exit
//!   status and the output when the process ends, and kills the process when the
//!   requester hangs up first. It stops after `RCH_TEST_AGENT_IDLE_S` (default 900)
//!   seconds without a request, or on a request with an empty executable. It is a
//!   test tool for throw-away VMs: it runs whatever it is asked to.
//!
//! Frames on the agent's connections: a little-endian `u32` length, then the bytes.
//! Request: executable, argument count, arguments, variable count, `NAME=value`s.
//! Reply: `exit N` / `signal N` / `error ...`, stdout, stderr.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the peer agent listens, if the tests run across hosts.
pub const AGENT_ENV: &str = "RCH_TEST_PEER_AGENT";
/// Set on the agent's host to start the agent (`addr:port` to listen on).
pub const AGENT_LISTEN_ENV: &str = "RCH_TEST_AGENT_LISTEN";

/// How a peer process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerStatus {
    /// It exited with this code.
    Exit(i32),
    /// A signal killed it.
    Signal(i32),
    /// It could not be started or watched (the message says why).
    Error(String),
}

impl PeerStatus {
    pub fn success(&self) -> bool {
        *self == PeerStatus::Exit(0)
    }

    fn of(st: std::process::ExitStatus) -> PeerStatus {
        use std::os::unix::process::ExitStatusExt;
        match (st.code(), st.signal()) {
            (Some(c), _) => PeerStatus::Exit(c),
            (None, Some(s)) => PeerStatus::Signal(s),
            (None, None) => PeerStatus::Error(format!("{st}")),
        }
    }

    fn encode(&self) -> String {
        match self {
            PeerStatus::Exit(c) => format!("exit {c}"),
            PeerStatus::Signal(s) => format!("signal {s}"),
            PeerStatus::Error(m) => format!("error {m}"),
        }
    }

    fn decode(s: &str) -> PeerStatus {
        let (kind, rest) = s.split_once(' ').unwrap_or((s, ""));
        match (kind, rest.parse::<i32>()) {
            ("exit", Ok(c)) => PeerStatus::Exit(c),
            ("signal", Ok(n)) => PeerStatus::Signal(n),
            _ => PeerStatus::Error(rest.to_string()),
        }
    }
}

impl std::fmt::Display for PeerStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerStatus::Exit(c) => write!(f, "exit status {c}"),
            PeerStatus::Signal(s) => write!(f, "killed by signal {s}"),
            PeerStatus::Error(m) => write!(f, "{m}"),
        }
    }
}

/// A peer process, here or on the peer host.
pub enum PeerRun {
    Local {
        child: Child,
        out: std::thread::JoinHandle<String>,
        err: std::thread::JoinHandle<String>,
    },
    Remote {
        /// Kept open while the process runs: hanging up kills it.
        conn: Option<TcpStream>,
        reply: std::thread::JoinHandle<(PeerStatus, String, String)>,
    },
}

/// The variables a role's process gets: none of the caller's `RCH_*` settings
/// except the fabric and device choice, then `envs`.
fn role_command(exe: &std::path::Path, test: &str, envs: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("RCH_") && k != "RCH_FABRIC" && !k.starts_with("RCH_IB_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn collect(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Runs test `test` of this binary here, as a child process.
pub fn spawn_self(test: &str, envs: &[(&str, String)]) -> PeerRun {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = role_command(&exe, test, envs)
        .spawn()
        .expect("spawn child test process");
    let out = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    PeerRun::Local { child, out, err }
}

/// The peer agent's address, when the tests run across hosts.
pub fn agent() -> Option<String> {
    std::env::var(AGENT_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// True when peers run on another host (see [`spawn_peer`]).
pub fn across_hosts() -> bool {
    agent().is_some()
}

/// Runs test `test` of this binary on the peer host if there is an agent, else here.
pub fn spawn_peer(test: &str, envs: &[(&str, String)]) -> PeerRun {
    let Some(agent) = agent() else {
        return spawn_self(test, envs);
    };
    let exe = std::env::current_exe().expect("current_exe");
    let mut conn = TcpStream::connect(&agent)
        .unwrap_or_else(|e| panic!("cannot reach the peer agent at {agent}: {e}"));
    let mut req = vec![exe.to_str().expect("UTF-8 path").as_bytes().to_vec()];
    let args = ["--exact", test, "--nocapture", "--test-threads=1"];
    req.push(args.len().to_string().into_bytes());
    req.extend(args.iter().map(|a| a.as_bytes().to_vec()));
    let mut vars: Vec<String> = envs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    // The fabric choice travels too (the agent's own environment may differ).
    for k in ["RCH_FABRIC", "RCH_TEST_CASE_SCALE"] {
        if let Ok(v) = std::env::var(k) {
            if !envs.iter().any(|(n, _)| *n == k) {
                vars.push(format!("{k}={v}"));
            }
        }
    }
    req.push(vars.len().to_string().into_bytes());
    req.extend(vars.into_iter().map(String::into_bytes));
    for f in &req {
        write_frame(&mut conn, f).expect("send a request to the peer agent");
    }
    let mut rconn = conn.try_clone().expect("clone the agent connection");
    let reply = std::thread::spawn(move || {
        let mut next = || read_frame(&mut rconn).map(|b| String::from_utf8_lossy(&b).into_owned());
        match (next(), next(), next()) {
            (Ok(st), Ok(out), Ok(err)) => (PeerStatus::decode(&st), out, err),
            (st, _, _) => (
                PeerStatus::Error(format!(
                    "the peer agent's connection ended early: {:?}",
                    st.err()
                )),
                String::new(),
                String::new(),
            ),
        }
    });
    PeerRun::Remote {
        conn: Some(conn),
        reply,
    }
}

impl PeerRun {
    /// Waits until the process exits or `deadline` passes (then kills it). Returns
    /// the status (`None` on timeout) and the process's stdout and stderr.
    pub fn wait(self, deadline: Instant) -> (Option<PeerStatus>, String, String) {
        match self {
            PeerRun::Local {
                mut child,
                out,
                err,
            } => {
                let status = loop {
                    match child.try_wait() {
                        Ok(Some(st)) => break Some(PeerStatus::of(st)),
                        Ok(None) => {}
                        Err(e) => break Some(PeerStatus::Error(format!("waiting: {e}"))),
                    }
                    if Instant::now() >= deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        break None;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                (
                    status,
                    out.join().unwrap_or_default(),
                    err.join().unwrap_or_default(),
                )
            }
            PeerRun::Remote { mut conn, reply } => {
                while !reply.is_finished() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if !reply.is_finished() {
                    // Hanging up makes the agent kill the process.
                    if let Some(c) = conn.take() {
                        let _ = c.shutdown(std::net::Shutdown::Both);
                    }
                    let (_, out, err) = reply.join().unwrap_or((
                        PeerStatus::Error("reply thread panicked".into()),
                        String::new(),
                        String::new(),
                    ));
                    return (None, out, err);
                }
                let (st, out, err) = reply.join().unwrap_or((
                    PeerStatus::Error("reply thread panicked".into()),
                    String::new(),
                    String::new(),
                ));
                (Some(st), out, err)
            }
        }
    }

    /// True once the process has ended.
    pub fn exited(&mut self) -> bool {
        match self {
            PeerRun::Local { child, .. } => child.try_wait().ok().flatten().is_some(),
            PeerRun::Remote { reply, .. } => reply.is_finished(),
        }
    }
}

fn write_frame(w: &mut impl Write, b: &[u8]) -> io::Result<()> {
    w.write_all(&(b.len() as u32).to_le_bytes())?;
    w.write_all(b)
}

fn read_frame(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > 256 << 20 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too long"));
    }
    let mut b = vec![0u8; len];
    r.read_exact(&mut b)?;
    Ok(b)
}

/// A request to the agent.
struct Request {
    exe: String,
    args: Vec<String>,
    vars: Vec<(String, String)>,
}

/// Reads one request.
fn read_request(c: &mut TcpStream) -> io::Result<Request> {
    let mut text = || read_frame(c).map(|b| String::from_utf8_lossy(&b).into_owned());
    let exe = text()?;
    if exe.is_empty() {
        return Ok(Request {
            exe,
            args: Vec::new(),
            vars: Vec::new(),
        });
    }
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let nargs: usize = text()?.parse().map_err(|_| bad("argument count"))?;
    let mut args = Vec::new();
    for _ in 0..nargs.min(64) {
        args.push(text()?);
    }
    let nvars: usize = text()?.parse().map_err(|_| bad("variable count"))?;
    let mut vars = Vec::new();
    for _ in 0..nvars.min(256) {
        let v = text()?;
        let (k, v) = v.split_once('=').ok_or_else(|| bad("variable without ="))?;
        vars.push((k.to_string(), v.to_string()));
    }
    Ok(Request { exe, args, vars })
}

/// True when the requester hung up (a read would return end of file at once).
fn hung_up(c: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    let _ = c.set_nonblocking(true);
    let r = c.peek(&mut b);
    let _ = c.set_nonblocking(false);
    matches!(r, Ok(0)) || matches!(&r, Err(e) if e.kind() != io::ErrorKind::WouldBlock)
}

/// Serves one request: runs the process, kills it if the requester hangs up,
/// answers with its status and output.
fn serve(mut c: TcpStream) {
    let Ok(Request { exe, args, vars }) = read_request(&mut c) else {
        return;
    };
    let mut cmd = Command::new(&exe);
    cmd.args(&args);
    for (k, _) in std::env::vars() {
        if k.starts_with("RCH_") && !k.starts_with("RCH_IB_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(vars)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(ch) => ch,
        Err(e) => {
            let _ = write_frame(
                &mut c,
                PeerStatus::Error(format!("spawn {exe}: {e}"))
                    .encode()
                    .as_bytes(),
            );
            return;
        }
    };
    let out = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break PeerStatus::of(st),
            Ok(None) => {}
            Err(e) => break PeerStatus::Error(format!("waiting: {e}")),
        }
        if hung_up(&c) {
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (o, e) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    let _ = write_frame(&mut c, status.encode().as_bytes())
        .and_then(|()| write_frame(&mut c, o.as_bytes()))
        .and_then(|()| write_frame(&mut c, e.as_bytes()));
}

/// The peer agent (see the module docs); a no-op unless `RCH_TEST_AGENT_LISTEN` is set.
#[test]
fn peer_agent() {
    let Ok(listen) = std::env::var(AGENT_LISTEN_ENV) else {
        return;
    };
    let idle: u64 = std::env::var("RCH_TEST_AGENT_IDLE_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(900);
    let l = TcpListener::bind(&listen).unwrap_or_else(|e| panic!("agent: bind {listen}: {e}"));
    l.set_nonblocking(true).unwrap();
    println!("peer agent: listening on {listen}");
    let mut last = Instant::now();
    loop {
        match l.accept() {
            Ok((mut c, from)) => {
                last = Instant::now();
                let _ = c.set_nonblocking(false);
                // Peek at the first frame: an empty executable stops the agent.
                let mut len = [0u8; 4];
                if c.peek(&mut len).is_ok_and(|n| n == 4) && u32::from_le_bytes(len) == 0 {
                    let _ = read_frame(&mut c);
                    println!("peer agent: stop requested by {from}");
                    return;
                }
                std::thread::spawn(move || serve(c));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if last.elapsed() > Duration::from_secs(idle) {
                    println!("peer agent: idle for {idle} s, stopping");
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("agent: accept: {e}"),
        }
    }
}

/// Asks the agent at `addr` to stop (for the cluster scripts' last step).
pub fn stop_agent(addr: &str) -> io::Result<()> {
    let mut c = TcpStream::connect(addr)?;
    write_frame(&mut c, b"")
}
