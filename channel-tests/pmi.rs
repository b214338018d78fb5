//! The PMI-1 client against scripted servers, and `rch-run` end to end.
//!
//! Client tests script a fake process manager on one end of a socket pair (or a TCP
//! listener for `PMI_PORT`) and check what the client sends and how it reacts to
//! garbage, hang-ups, `rc` != 0, silence and long values. Launcher tests run
//! `rch-run` on this test binary (see `pmi_rank.rs` for the rank program) and on
//! `sh`, and check exchanged values, exit statuses, reports and termination.

#[path = "pmi_rank.rs"]
mod pmi_rank;

use rdma_channel::pmi::PmiClient;
use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Entry point of the re-executed rank program.
#[test]
fn rank_entry() {
    pmi_rank::entry();
}

// ---------------------------------------------------------------------------------
// A scripted process manager.

struct Fake {
    r: BufReader<Box<dyn Read + Send>>,
    w: Box<dyn Write + Send>,
}

impl Fake {
    fn from_unix(s: UnixStream) -> Fake {
        Fake {
            r: BufReader::new(Box::new(s.try_clone().unwrap())),
            w: Box::new(s),
        }
    }

    /// Reads one request; `None` at end of stream.
    fn read(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.r.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim_end_matches('\n').to_owned()),
        }
    }

    /// Reads one request, which must start with `prefix`.
    fn expect(&mut self, prefix: &str) -> String {
        let line = self.read().expect("client hung up");
        assert!(
            line.starts_with(prefix),
            "expected '{prefix}...', got '{line}'"
        );
        line
    }

    fn send(&mut self, line: &str) {
        self.w.write_all(line.as_bytes()).unwrap();
        self.w.flush().unwrap();
    }

    /// Answers the client's handshake, announcing `vallen_max`.
    fn handshake(&mut self, vallen: usize) {
        self.expect("cmd=init pmi_version=1 pmi_subversion=1");
        self.send("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
        self.expect("cmd=get_maxes");
        self.send(&format!(
            "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max={vallen}\n"
        ));
        self.expect("cmd=get_my_kvsname");
        self.send("cmd=my_kvsname kvsname=kvs_fake\n");
    }
}

/// Starts `script` as the server on a socket pair; returns the client's end.
fn fake<T: Send + 'static>(
    script: impl FnOnce(&mut Fake) -> T + Send + 'static,
) -> (OwnedFd, JoinHandle<T>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || script(&mut Fake::from_unix(theirs)));
    (ours.into(), h)
}

const T: Duration = Duration::from_secs(10);

fn client(fd: OwnedFd) -> io::Result<PmiClient> {
    PmiClient::with_fd(fd, 0, 2, T)
}

fn assert_err(r: io::Result<impl std::fmt::Debug>, kind: io::ErrorKind, needle: &str) -> String {
    let e = r.expect_err("expected an error");
    assert_eq!(e.kind(), kind, "wrong kind for '{e}'");
    let msg = e.to_string();
    assert!(msg.contains(needle), "'{msg}' does not mention '{needle}'");
    msg
}

// ---------------------------------------------------------------------------------
// Client against scripted servers.

#[test]
fn client_speaks_the_wire_protocol() {
    let (fd, server) = fake(|f| {
        f.handshake(1024);
        let put = f.expect("cmd=put ");
        f.send("cmd=put_result rc=0 msg=success\n");
        f.expect("cmd=barrier_in");
        f.send("cmd=barrier_out\n");
        let get = f.expect("cmd=get ");
        f.send("cmd=get_result rc=0 msg=success value=v1\n");
        f.expect("cmd=get_appnum");
        f.send("cmd=appnum appnum=0\n");
        f.expect("cmd=finalize");
        f.send("cmd=finalize_ack\n");
        assert!(f.read().is_none(), "client should close after finalize");
        (put, get)
    });
    let mut c = client(fd).unwrap();
    assert_eq!((c.rank(), c.size(), c.kvs_name()), (0, 2, "kvs_fake"));
    // The announced limits count a terminating NUL.
    assert_eq!((c.max_value_len(), c.max_key_len()), (1023, 63));
    c.put("k0", "v0").unwrap();
    c.barrier().unwrap();
    assert_eq!(c.get("k1").unwrap(), "v1");
    assert_eq!(c.appnum().unwrap(), 0);
    c.finalize().unwrap();
    let (put, get) = server.join().unwrap();
    assert_eq!(put, "cmd=put kvsname=kvs_fake key=k0 value=v0");
    assert_eq!(get, "cmd=get kvsname=kvs_fake key=k1");
}

#[test]
fn garbage_from_the_server_is_invalid_data() {
    // Instead of response_to_init: text that is not PMI.
    let (fd, h) = fake(|f| {
        f.expect("cmd=init");
        f.send("hello there\n");
    });
    assert_err(client(fd), io::ErrorKind::InvalidData, "response_to_init");
    h.join().unwrap();
    // Bytes that are not ASCII.
    let (fd, h) = fake(|f| {
        f.expect("cmd=init");
        f.send("cmd=response_to_init \u{1}\u{2}\n");
    });
    assert_err(client(fd), io::ErrorKind::InvalidData, "not printable");
    h.join().unwrap();
    // A limit that is not a number.
    let (fd, h) = fake(|f| {
        f.expect("cmd=init");
        f.send("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
        f.expect("cmd=get_maxes");
        f.send("cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=lots\n");
    });
    assert_err(client(fd), io::ErrorKind::InvalidData, "vallen_max");
    h.join().unwrap();
    // A missing attribute.
    let (fd, h) = fake(|f| {
        f.expect("cmd=init");
        f.send("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
        f.expect("cmd=get_maxes");
        f.send("cmd=maxes kvsname_max=256 vallen_max=1024\n");
    });
    assert_err(client(fd), io::ErrorKind::InvalidData, "keylen_max");
    h.join().unwrap();
}

#[test]
fn refused_version_is_an_error() {
    let (fd, h) = fake(|f| {
        f.expect("cmd=init");
        f.send("cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=-1\n");
    });
    assert_err(
        client(fd),
        io::ErrorKind::InvalidData,
        "refused PMI version 1.1",
    );
    h.join().unwrap();
}

#[test]
fn unexpected_command_is_invalid_data() {
    let (fd, h) = fake(|f| {
        f.handshake(1024);
        f.expect("cmd=get ");
        f.send("cmd=barrier_out\n");
    });
    let mut c = client(fd).unwrap();
    assert_err(
        c.get("k"),
        io::ErrorKind::InvalidData,
        "expected cmd=get_result from the process manager, got cmd=barrier_out",
    );
    h.join().unwrap();
}

#[test]
fn hang_up_mid_conversation_is_unexpected_eof() {
    let (fd, h) = fake(|f| {
        f.handshake(1024);
        f.expect("cmd=put ");
        // Closes without answering.
    });
    let mut c = client(fd).unwrap();
    assert_err(
        c.put("k", "v"),
        io::ErrorKind::UnexpectedEof,
        "closed the connection while waiting for cmd=put_result",
    );
    h.join().unwrap();
    // The next request finds the connection gone.
    let e = c.barrier().unwrap_err();
    assert!(
        matches!(
            e.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::UnexpectedEof
        ),
        "{e}"
    );
}

#[test]
fn truncated_line_is_unexpected_eof() {
    let (fd, h) = fake(|f| {
        f.handshake(1024);
        f.expect("cmd=get ");
        f.send("cmd=get_result rc=0 val");
    });
    let mut c = client(fd).unwrap();
    assert_err(
        c.get("k"),
        io::ErrorKind::UnexpectedEof,
        "truncated line 'cmd=get_result rc=0 val'",
    );
    h.join().unwrap();
}

#[test]
fn nonzero_rc_is_an_error() {
    let (fd, h) = fake(|f| {
        f.handshake(1024);
        f.expect("cmd=get kvsname=kvs_fake key=missing");
        f.send("cmd=get_result rc=-1 msg=key_missing_not_found value=unknown\n");
        f.expect("cmd=put ");
        f.send("cmd=put_result rc=-1 msg=duplicate_key\n");
        f.expect("cmd=get ");
        f.send("cmd=get_result rc=0 msg=success\n");
    });
    let mut c = client(fd).unwrap();
    assert_err(
        c.get("missing"),
        io::ErrorKind::NotFound,
        "key 'missing' not found",
    );
    assert_err(
        c.put("k", "v"),
        io::ErrorKind::Other,
        "rc=-1 (duplicate_key)",
    );
    assert_err(
        c.get("k"),
        io::ErrorKind::InvalidData,
        "lacks the attribute 'value'",
    );
    h.join().unwrap();
}

#[test]
fn silent_server_times_out() {
    let (release, wait) = mpsc::channel::<()>();
    let (fd, h) = fake(move |f| {
        f.handshake(1024);
        f.expect("cmd=barrier_in");
        // Never answers; keeps the connection open until the test is done.
        let _ = wait.recv();
    });
    let mut c = PmiClient::with_fd(fd, 0, 2, Duration::from_millis(300)).unwrap();
    let t0 = Instant::now();
    assert_err(
        c.barrier(),
        io::ErrorKind::TimedOut,
        "waiting for cmd=barrier_out",
    );
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_secs(5),
        "{took:?}"
    );
    release.send(()).unwrap();
    h.join().unwrap();
}

/// A server with a real key-value space and a tiny `vallen_max`, written separately
/// from the launcher's, so the two cannot share a mistake.
fn kvs_server(f: &mut Fake, vallen: usize) -> HashMap<String, String> {
    f.handshake(vallen);
    let mut kvs = HashMap::new();
    while let Some(line) = f.read() {
        let words: HashMap<&str, &str> =
            line.split(' ').filter_map(|w| w.split_once('=')).collect();
        match words["cmd"] {
            "put" => {
                // vallen_max counts a NUL, as in Hydra.
                assert!(
                    words["value"].len() < vallen,
                    "value over vallen_max - 1: {line}"
                );
                kvs.insert(words["key"].to_owned(), words["value"].to_owned());
                f.send("cmd=put_result rc=0\n");
            }
            "get" => match kvs.get(words["key"]) {
                Some(v) => f.send(&format!("cmd=get_result rc=0 value={v}\n")),
                None => f.send("cmd=get_result rc=-1 value=unknown\n"),
            },
            "finalize" => {
                f.send("cmd=finalize_ack\n");
            }
            other => panic!("unexpected {other}"),
        }
    }
    kvs
}

#[test]
fn long_bytes_are_split_over_keys_and_round_trip() {
    let (fd, h) = fake(|f| kvs_server(f, 32));
    let mut c = client(fd).unwrap();
    let long: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(37)).collect();
    c.put_bytes("blob", &long).unwrap();
    c.put_bytes("short", b"\x00\xffok").unwrap();
    c.put_bytes("empty", b"").unwrap();
    // Exactly fills one value (1 + 2 * 15 = 31 = vallen_max - 1) and just overflows it.
    c.put_bytes("fit", &[7u8; 15]).unwrap();
    c.put_bytes("over", &[9u8; 16]).unwrap();
    assert_eq!(c.get_bytes("blob").unwrap(), long);
    assert_eq!(c.get_bytes("short").unwrap(), b"\x00\xffok");
    assert_eq!(c.get_bytes("empty").unwrap(), b"");
    assert_eq!(c.get_bytes("fit").unwrap(), [7u8; 15]);
    assert_eq!(c.get_bytes("over").unwrap(), [9u8; 16]);
    assert_err(c.get_bytes("absent"), io::ErrorKind::NotFound, "absent");
    // A value that is not in put_bytes's layout.
    c.put("plain", "hello").unwrap();
    assert_err(c.get_bytes("plain"), io::ErrorKind::InvalidData, "layout");
    c.finalize().unwrap();
    let kvs = h.join().unwrap();
    // 200 hex digits in parts of 30 (31 rounded down to even): 7 parts, announced by
    // the key itself.
    assert_eq!(kvs["blob"], "p7");
    for i in 0..7 {
        assert!(kvs.contains_key(&format!("blob#{i}")), "blob#{i} missing");
    }
    assert!(!kvs.contains_key("blob#7"));
    assert_eq!(kvs["short"], "x00ff6f6b");
    assert_eq!(kvs["fit"].len(), 31);
    assert_eq!(kvs["over"], "p2");
    assert_eq!(kvs["over#0"].len(), 30);
}

#[test]
fn bad_keys_and_values_are_refused_before_sending() {
    let (fd, h) = fake(|f| {
        f.handshake(16);
        let mut rest = Vec::new();
        while let Some(l) = f.read() {
            rest.push(l);
        }
        rest
    });
    let mut c = client(fd).unwrap();
    assert_err(
        c.put("a key", "v"),
        io::ErrorKind::InvalidInput,
        "key 'a key'",
    );
    assert_err(c.put("k=1", "v"), io::ErrorKind::InvalidInput, "'='");
    assert_err(c.put("k", ""), io::ErrorKind::InvalidInput, "is empty");
    assert_err(c.put("k", "a\\b"), io::ErrorKind::InvalidInput, "backslash");
    assert_err(
        c.put("k", &"v".repeat(16)),
        io::ErrorKind::InvalidInput,
        "at most 15",
    );
    assert_err(
        c.put(&"k".repeat(64), "v"),
        io::ErrorKind::InvalidInput,
        "at most 63",
    );
    assert_err(c.get("new\nline"), io::ErrorKind::InvalidInput, "0x0a");
    // A key whose part names would exceed keylen_max.
    assert_err(
        c.put_bytes(&"k".repeat(63), &[1; 20]),
        io::ErrorKind::InvalidInput,
        "#2'",
    );
    drop(c);
    assert_eq!(h.join().unwrap(), Vec::<String>::new());
}

#[test]
fn pmi_port_handshake() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut f = Fake {
            r: BufReader::new(Box::new(s.try_clone().unwrap())),
            w: Box::new(s),
        };
        f.expect("cmd=initack pmiid=3");
        f.send("cmd=initack\ncmd=set size=4\ncmd=set rank=3\ncmd=set debug=0\n");
        f.handshake(1024);
        f.expect("cmd=finalize");
        f.send("cmd=finalize_ack\n");
    });
    let c = PmiClient::connect_port(&format!("127.0.0.1:{}", addr.port()), 3, T).unwrap();
    assert_eq!((c.rank(), c.size(), c.kvs_name()), (3, 4, "kvs_fake"));
    c.finalize().unwrap();
    h.join().unwrap();
    assert_err(
        PmiClient::connect_port("no-port-here", 0, T),
        io::ErrorKind::InvalidInput,
        "host:port",
    );
}

/// Runs this binary in `mode` with `env`, without a process manager.
fn run_rank_alone(mode: &str, env: &[(&str, &str)]) -> (ExitStatus, String) {
    let mut c = pmi_rank::rank_command(mode);
    for v in [
        "PMI_FD",
        "PMI_PORT",
        "PMI_ID",
        "PMI_RANK",
        "PMI_SIZE",
        "PMI_SPAWNED",
    ] {
        c.env_remove(v);
    }
    c.envs(env.iter().copied());
    let out = c.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status, text)
}

#[test]
fn from_env_without_process_manager_is_singleton() {
    let (status, out) = run_rank_alone("singleton", &[]);
    assert!(status.success(), "{out}");
    assert!(out.contains("singleton ok"), "{out}");
}

#[test]
fn from_env_checks_the_environment() {
    for (env, expect) in [
        (
            &[("PMI_FD", "abc")][..],
            "PMI_FD='abc' is not a descriptor number",
        ),
        (
            &[("PMI_FD", "917"), ("PMI_RANK", "0"), ("PMI_SIZE", "1")][..],
            "PMI_FD=917 is not an open descriptor",
        ),
        (&[("PMI_FD", "0"), ("PMI_SIZE", "2")][..], "PMI_RANK is not"),
        (
            &[("PMI_FD", "0"), ("PMI_RANK", "2"), ("PMI_SIZE", "2")][..],
            "rank 2 is outside 0..2",
        ),
        (
            &[("PMI_FD", "0"), ("PMI_RANK", "0"), ("PMI_SIZE", "x")][..],
            "PMI_SIZE='x'",
        ),
        (
            &[("PMI_FD", "0"), ("RCH_PMI_TIMEOUT_MS", "soon")][..],
            "RCH_PMI_TIMEOUT_MS='soon'",
        ),
        (&[("PMI_PORT", "127.0.0.1:1")][..], "PMI_ID is not"),
        (
            &[("PMI_PORT", "nonsense"), ("PMI_ID", "0")][..],
            "host:port",
        ),
    ] {
        let mut env = env.to_vec();
        env.push(("RCH_PMI_TEST_EXPECT", expect));
        let (status, out) = run_rank_alone("env-error", &env);
        assert!(status.success(), "{env:?}: {out}");
    }
}

// ---------------------------------------------------------------------------------
// rch-run end to end.

const RCH_RUN: &str = env!("CARGO_BIN_EXE_rch-run");

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `rch-run args...` with `env`, killing it (and failing) after `limit`.
fn rch_run(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Run {
    let mut c = Command::new(RCH_RUN);
    c.args(args).envs(env.iter().copied());
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = c.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("rch-run {args:?} still running after {limit:?}; stderr so far unavailable");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t0.elapsed();
    let run = Run {
        code: status.code(),
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
        took,
    };
    eprintln!(
        "rch-run {args:?}: {:?} in {:?}\n--- stdout\n{}--- stderr\n{}---",
        run.code, run.took, run.stdout, run.stderr
    );
    run
}

fn rank_cmd_args<'a>(n: &'a str, exe: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = extra.to_vec();
    v.extend([
        "-n",
        n,
        exe,
        "--exact",
        "rank_entry",
        "--nocapture",
        "--test-threads=1",
    ]);
    v
}

fn exe() -> String {
    std::env::current_exe()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned()
}

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn four_ranks_exchange_values_through_rch_run() {
    let exe = exe();
    let r = rch_run(
        &rank_cmd_args("4", &exe, &[]),
        &[(pmi_rank::MODE, "exchange")],
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for rank in 0..4 {
        let line = format!("rank {rank} of 4: exchanged with 4 ranks");
        assert_eq!(
            r.stdout.matches(&line).count(),
            1,
            "'{line}' missing:\n{}",
            r.stdout
        );
    }
    assert!(r.stdout.contains("max value len 1023"));
}

#[test]
fn exit_status_of_the_first_failing_rank_is_propagated() {
    // All succeed: 0.
    let r = rch_run(&["-n", "3", "sh", "-c", "exit 0"], &[], LIMIT);
    assert_eq!(r.code, Some(0));
    assert!(r.stderr.is_empty(), "{}", r.stderr);
    // Rank 2 fails while the others would run for a minute: they are terminated.
    let r = rch_run(
        &[
            "-n",
            "3",
            "sh",
            "-c",
            "if [ $PMI_RANK = 2 ]; then exit 4; fi; exec sleep 60",
        ],
        &[],
        LIMIT,
    );
    assert_eq!(r.code, Some(4));
    assert!(
        r.stderr.contains("rch-run: rank 2 (pid ") && r.stderr.contains(") exited with status 4"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("terminating ranks 0, 1"), "{}", r.stderr);
    assert!(r.took < Duration::from_secs(30), "{:?}", r.took);
    // The same through PMI: rank 1 exits 3 while the others sit in a barrier.
    let exe = exe();
    let r = rch_run(
        &rank_cmd_args("4", &exe, &[]),
        &[(pmi_rank::MODE, "exit-code")],
        LIMIT,
    );
    assert_eq!(r.code, Some(3));
    assert!(r.stderr.contains(") exited with status 3"), "{}", r.stderr);
    assert!(r.stderr.contains("rch-run: rank 1 (pid "), "{}", r.stderr);
}

#[test]
fn crashing_rank_ends_the_job() {
    let exe = exe();
    let t0 = Instant::now();
    // A grace period longer than the test may take: the others must go at SIGTERM.
    let r = rch_run(
        &rank_cmd_args("4", &exe, &["--grace", "100"]),
        &[(pmi_rank::MODE, "crash"), ("RCH_PMI_TEST_RANK", "2")],
        LIMIT,
    );
    assert_eq!(r.code, Some(128 + 9));
    assert!(
        r.stderr.contains("rch-run: rank 2 (pid ")
            && r.stderr.contains(") killed by signal 9 (SIGKILL)"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("terminating ranks 0, 1, 3"),
        "{}",
        r.stderr
    );
    // Well before the PMI timeout (60 s) would have ended the waiting ranks, and
    // before the grace period.
    assert!(t0.elapsed() < Duration::from_secs(30));
}

#[test]
fn aborting_rank_ends_the_job() {
    let exe = exe();
    let r = rch_run(
        &rank_cmd_args("4", &exe, &[]),
        &[(pmi_rank::MODE, "abort"), ("RCH_PMI_TEST_RANK", "3")],
        LIMIT,
    );
    assert_eq!(r.code, Some(7));
    assert!(
        r.stderr.contains("rank 3 (pid ")
            && r.stderr
                .contains("called PMI abort with exit code 7: rank 3 gives up"),
        "{}",
        r.stderr
    );
    assert!(r.took < Duration::from_secs(30));
}

#[test]
fn garbage_from_a_rank_ends_the_job() {
    let exe = exe();
    let r = rch_run(
        &rank_cmd_args("3", &exe, &[]),
        &[(pmi_rank::MODE, "garbage")],
        LIMIT,
    );
    assert_eq!(r.code, Some(1));
    assert!(
        r.stderr.contains("rank 1 (pid ")
            && r.stderr.contains("broke the PMI protocol")
            && r.stderr.contains("this is not PMI"),
        "{}",
        r.stderr
    );
    assert!(r.took < Duration::from_secs(30));
}

#[test]
fn exit_without_finalize_is_a_failure() {
    let exe = exe();
    let r = rch_run(
        &rank_cmd_args("3", &exe, &[]),
        &[(pmi_rank::MODE, "no-finalize"), ("RCH_PMI_TEST_RANK", "0")],
        LIMIT,
    );
    assert_eq!(r.code, Some(1));
    assert!(
        r.stderr.contains("rank 0 (pid ") && r.stderr.contains("without PMI finalize"),
        "{}",
        r.stderr
    );
}

#[test]
fn prefix_output_tags_every_line_with_its_rank() {
    let exe = exe();
    let r = rch_run(
        &rank_cmd_args("3", &exe, &["--prefix-output"]),
        &[(pmi_rank::MODE, "prefix")],
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for rank in 0..3 {
        // (libtest prints "test rank_entry ... " before the test's own output.)
        let tag = format!("[{rank}] ");
        let out = format!("hello from rank {rank} of 3");
        let err = format!("[{rank}] note from rank {rank}\n");
        assert_eq!(
            r.stdout
                .lines()
                .filter(|l| l.starts_with(&tag) && l.ends_with(&out))
                .count(),
            1,
            "'{tag}...{out}' missing:\n{}",
            r.stdout
        );
        assert!(r.stderr.contains(&err), "'{err}' missing:\n{}", r.stderr);
    }
    for line in r.stdout.lines().chain(r.stderr.lines()) {
        assert!(line.starts_with('['), "untagged line '{line}'");
    }
    // A last line without a newline is still forwarded, on its own line.
    let r = rch_run(
        &[
            "-n",
            "2",
            "--prefix-output",
            "sh",
            "-c",
            "printf 'no newline'",
        ],
        &[],
        LIMIT,
    );
    assert_eq!(r.code, Some(0));
    assert!(
        r.stdout.contains("[0] no newline\n") && r.stdout.contains("[1] no newline\n"),
        "{}",
        r.stdout
    );
}

#[test]
fn eight_ranks_on_two_cores_complete_a_barrier_loop() {
    let exe = exe();
    // Pinned to (at most) two CPUs, whatever this machine has.
    let taskset = Command::new("taskset").arg("-V").output().is_ok();
    let mut args = Vec::new();
    if taskset {
        args.extend(["taskset", "-c", "0,1"]);
    }
    args.push(RCH_RUN);
    args.extend(rank_cmd_args("8", &exe, &[]));
    let t0 = Instant::now();
    let mut c = Command::new(args[0]);
    c.args(&args[1..])
        .env(pmi_rank::MODE, "barrier-loop")
        .env("RCH_PMI_TEST_ITERS", "100")
        .stdin(Stdio::null());
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for rank in 0..8 {
        assert!(
            stdout.contains(&format!("rank {rank} of 8: 100 barriers done")),
            "{stdout}"
        );
    }
    eprintln!(
        "8 ranks, 100 barriers: {:?} (taskset: {taskset})",
        t0.elapsed()
    );
}

#[test]
fn usage_errors_exit_2_with_a_message() {
    for (args, msg) in [
        (&["true"][..], "-n N (the number of ranks) is required"),
        (&["-n", "0", "true"][..], "-n must be at least 1"),
        (
            &["-n", "four", "true"][..],
            "-n expects a number of ranks, not 'four'",
        ),
        (&["-n", "1000000", "true"][..], "too many ranks"),
        (
            &["-n", "99999999999999999999999", "true"][..],
            "expects a number",
        ),
        (&["-n"][..], "-n needs a value"),
        (&["-n", "2"][..], "no program given"),
        (
            &["--bogus", "-n", "2", "true"][..],
            "unknown option '--bogus'",
        ),
        (
            &["-n", "2", "--timeout", "-1", "true"][..],
            "--timeout expects a number of seconds",
        ),
    ] {
        let r = rch_run(args, &[], LIMIT);
        assert_eq!(r.code, Some(2), "{args:?}");
        assert!(
            r.stderr.contains(msg),
            "{args:?}: '{}' lacks '{msg}'",
            r.stderr
        );
    }
    let r = rch_run(&["--help"], &[], LIMIT);
    assert_eq!(r.code, Some(0));
    assert!(r.stdout.contains("usage: rch-run -n N"));
}

#[test]
fn missing_program_is_reported() {
    let r = rch_run(&["-n", "2", "rch-no-such-program-here"], &[], LIMIT);
    assert_eq!(r.code, Some(127));
    assert!(
        r.stderr.contains("cannot start 'rch-no-such-program-here'")
            && r.stderr.contains("No such file"),
        "{}",
        r.stderr
    );
    // A file without execute permission.
    let path = std::env::temp_dir().join(format!("rch-not-executable-{}", std::process::id()));
    std::fs::write(&path, "not a program").unwrap();
    let r = rch_run(&["-n", "2", path.to_str().unwrap()], &[], LIMIT);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(r.code, Some(126), "{}", r.stderr);
    assert!(r.stderr.contains("Permission denied"), "{}", r.stderr);
}

#[test]
fn timeout_ends_the_job() {
    let r = rch_run(&["-n", "2", "--timeout", "0.5", "sleep", "60"], &[], LIMIT);
    assert_eq!(r.code, Some(124));
    assert!(
        r.stderr.contains("the job timed out after 0.5 s"),
        "{}",
        r.stderr
    );
    assert!(r.took < Duration::from_secs(20), "{:?}", r.took);
}

#[test]
fn ranks_ignoring_sigterm_get_sigkill_after_the_grace_period() {
    let r = rch_run(
        &[
            "-n",
            "2",
            "--grace",
            "0.5",
            "sh",
            "-c",
            "if [ $PMI_RANK = 0 ]; then sleep 0.2; exit 5; fi; trap '' TERM; exec sleep 60",
        ],
        &[],
        LIMIT,
    );
    assert_eq!(r.code, Some(5));
    assert!(r.stderr.contains("SIGKILL after 500ms"), "{}", r.stderr);
    assert!(r.took < Duration::from_secs(20), "{:?}", r.took);
}

#[test]
fn sigterm_to_rch_run_terminates_the_ranks() {
    let dir = std::env::temp_dir().join(format!("rch-run-sig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!("echo $$ > {}/$PMI_RANK; exec sleep 60", dir.display());
    // With a long grace period: the ranks must go at the forwarded SIGTERM.
    let child = Command::new(RCH_RUN)
        .args(["-n", "3", "--grace", "100", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::fs::read_dir(&dir).unwrap().count() < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "ranks did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: kill(2) on our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{stderr}");
    assert!(stderr.contains("received SIGTERM"), "{stderr}");
    for r in 0..3 {
        let pid: i32 = std::fs::read_to_string(dir.join(r.to_string()))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SAFETY: signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        assert!(!alive, "rank {r} (pid {pid}) survived");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ranks_start_with_no_signals_blocked() {
    // The launcher blocks SIGCHLD/SIGINT/SIGTERM/SIGHUP for its signalfd; a rank that
    // inherited that mask could not be terminated with SIGTERM.
    let r = rch_run(
        &["-n", "1", "grep", "SigBlk", "/proc/self/status"],
        &[],
        LIMIT,
    );
    assert_eq!(r.code, Some(0));
    assert_eq!(r.stdout.trim(), "SigBlk:\t0000000000000000");
}
