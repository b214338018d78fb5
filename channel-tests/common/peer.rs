//! Peer processes for the tests: this test binary re-executed as one test (a *role*),
//! on this host, or on another host of a test cluster.
//!
//! * [`spawn_self`] runs `current_exe() --exact <test> --nocapture --test-threads=1`
//!   here, with the caller's `RCH_*` settings removed (but the fabric kept) and the
//!   role's variables set.
//! * [`spawn_peer`] does the same on the host `RCH_TEST_PEER_HOST` names, through the
//!   ssh-like remote shell `RCH_TEST_REMOTE_SHELL` (`ssh` on a real cluster;
//!   `scripts/softroce-rexec` between the Soft-RoCE VMs of `scripts/softroce-cluster`),
//!   and here when no peer host is set. The peer host must see the same files (the
//!   VMs share the host's root file system), so the same path runs there. Killing
//!   the local shell client kills the remote process (rexec does; ssh does for a
//!   command without a terminal when the connection drops).
use std::io::Read;
use std::path::{Path, PathBuf};

use rdma_channel::{Config, RdmaListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The host peers run on, if the tests run across hosts.
pub const PEER_HOST_ENV: &str = "RCH_TEST_PEER_HOST";
/// The ssh-like program that runs a command on the peer host.
pub const REMOTE_SHELL_ENV: &str = "RCH_TEST_REMOTE_SHELL";

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

/// A peer process: here, or the local client of a remote shell running it on the
/// peer host.
pub struct PeerRun {
    child: Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
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

fn start(mut cmd: Command) -> PeerRun {
    let desc = format!("{cmd:?}");
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {desc}: {e}"));
    let out = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    PeerRun { child, out, err }
}

/// Runs test `test` of this binary here, as a child process.
pub fn spawn_self(test: &str, envs: &[(&str, String)]) -> PeerRun {
    let exe = std::env::current_exe().expect("current_exe");
    start(role_command(&exe, test, envs))
}

/// The peer host, when the tests run across hosts.
pub fn peer_host() -> Option<String> {
    std::env::var(PEER_HOST_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// True when peers run on another host (see [`spawn_peer`]).
pub fn across_hosts() -> bool {
    peer_host().is_some()
}

/// `s` quoted for a POSIX shell.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs test `test` of this binary on the peer host if there is one, else here.
pub fn spawn_peer(test: &str, envs: &[(&str, String)]) -> PeerRun {
    let Some(host) = peer_host() else {
        return spawn_self(test, envs);
    };
    let shell = std::env::var(REMOTE_SHELL_ENV).unwrap_or_else(|_| "ssh".into());
    let exe = std::env::current_exe().expect("current_exe");
    let mut words = vec!["exec".to_string(), "env".to_string()];
    // The fabric choice, its verbs settings and the run's scale travel with the
    // role's variables (as spawn_self keeps them).
    for (k, v) in std::env::vars() {
        let travels = k == "RCH_FABRIC" || k == "RCH_TEST_CASE_SCALE" || k.starts_with("RCH_IB_");
        if travels && !envs.iter().any(|(n, _)| *n == k) {
            words.push(sh_quote(&format!("{k}={v}")));
        }
    }
    words.extend(envs.iter().map(|(k, v)| sh_quote(&format!("{k}={v}"))));
    words.push(sh_quote(exe.to_str().expect("UTF-8 path")));
    for a in ["--exact", test, "--nocapture", "--test-threads=1"] {
        words.push(sh_quote(a));
    }
    let mut cmd = Command::new(&shell);
    cmd.arg(&host).arg(words.join(" "));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    start(cmd)
}

impl PeerRun {
    /// Waits until the process exits or `deadline` passes (then kills it). Returns
    /// the status (`None` on timeout) and the process's stdout and stderr.
    pub fn wait(mut self, deadline: Instant) -> (Option<PeerStatus>, String, String) {
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break Some(PeerStatus::of(st)),
                Ok(None) => {}
                Err(e) => break Some(PeerStatus::Error(format!("waiting: {e}"))),
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (
            status,
            self.out.join().unwrap_or_default(),
            self.err.join().unwrap_or_default(),
        )
    }

    /// Kills the process with SIGKILL (on a peer host: its remote-shell client, whose
    /// end kills the remote process) and returns once the kill is sent.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// True once the process has ended.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }
}

/// A fresh folder in the temporary directory, unique to this process and moment.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("rch-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes its folder when dropped.
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where the parent listens for its child: a Unix socket path in `dir` when the child
/// runs on this host, an IP address and port (rdma_cm, verbs) when it runs on the
/// peer host of a test cluster. Returns the listener and what the child connects to.
pub fn listen_for_child(dir: &Path, cfg: Config) -> (RdmaListener, String) {
    if across_hosts() {
        let listener = RdmaListener::bind_with("0.0.0.0:0", cfg).expect("bind an IP address");
        let port = match listener.local_addr().expect("local_addr") {
            rdma_channel::Address::Inet(a) => a.port(),
            other => panic!("not an IP listener: {other}"),
        };
        (listener, format!("{}:{port}", super::my_ip()))
    } else {
        let path = dir.join("sock");
        let listener = RdmaListener::bind_with(&path, cfg).expect("bind");
        (listener, path.display().to_string())
    }
}
