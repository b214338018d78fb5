//! The rank program the PMI tests start under a process manager (`rch-run` in
//! `pmi.rs`, `mpiexec.hydra` in `hydra.rs`): the test binary itself, re-executed as
//! `<test binary> --exact rank_entry --nocapture --test-threads=1` with
//! `RCH_PMI_TEST_MODE` naming what to do. Without that variable `entry` returns at
//! once, so `rank_entry` passes in an ordinary test run.
//!
//! Modes (`RCH_PMI_TEST_RANK` picks the rank that misbehaves, default 1):
//! * `exchange`: put a string and a 3000-byte blob (split over several keys), barrier,
//!   check every rank's values, check that a missing key is `NotFound`, barrier,
//!   print `rank R of N: exchanged with N ranks`, finalize;
//! * `barrier-loop`: `RCH_PMI_TEST_ITERS` rounds of put, barrier, get a neighbour's;
//! * `exit-code`, `crash`, `abort`, `garbage`, `no-finalize`: the chosen rank exits
//!   with status 3 / kills itself with SIGKILL / calls PMI abort (code 7) / writes a
//!   line that is not PMI / exits 0 without finalize, while the others wait in a
//!   barrier that can only end when the launcher kills them;
//! * `prefix`: print `hello from rank R of N` on stdout and `note from rank R` on
//!   stderr, then init and finalize;
//! * `singleton`: `from_env` must give `None`;
//! * `env-error`: `from_env` must fail with `RCH_PMI_TEST_EXPECT` in its message.

#![allow(dead_code)]

use rdma_channel::pmi::PmiClient;
use std::io;
use std::process::{Command, Stdio};

/// Names the mode a re-executed test binary runs.
pub const MODE: &str = "RCH_PMI_TEST_MODE";

/// The arguments that make the test binary run only `rank_entry`, with its output.
pub fn rank_args() -> Vec<String> {
    ["--exact", "rank_entry", "--nocapture", "--test-threads=1"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// A command running this test binary in `mode` (no process manager around it yet).
pub fn rank_command(mode: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.args(rank_args()).env(MODE, mode);
    c.stdin(Stdio::null());
    c
}

fn blob(rank: u32) -> Vec<u8> {
    (0..3000u32)
        .map(|i| (i.wrapping_mul(31) ^ rank.wrapping_mul(97)) as u8)
        .collect()
}

fn env_u32(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn connect() -> PmiClient {
    let pmi = PmiClient::from_env()
        .expect("PmiClient::from_env")
        .expect("started without a process manager");
    assert!(pmi.rank() < pmi.size());
    assert!(!pmi.spawned());
    pmi
}

/// Runs the mode named by `RCH_PMI_TEST_MODE`, if any.
pub fn entry() {
    let Ok(mode) = std::env::var(MODE) else {
        return;
    };
    let bad_rank = env_u32("RCH_PMI_TEST_RANK", 1);
    match mode.as_str() {
        "exchange" => exchange(),
        "barrier-loop" => barrier_loop(env_u32("RCH_PMI_TEST_ITERS", 50)),
        "exit-code" | "crash" | "abort" | "garbage" | "no-finalize" => misbehave(&mode, bad_rank),
        "prefix" => {
            let pmi = connect();
            println!("hello from rank {} of {}", pmi.rank(), pmi.size());
            eprintln!("note from rank {}", pmi.rank());
            pmi.finalize().expect("finalize");
        }
        "singleton" => {
            assert!(PmiClient::from_env().expect("from_env").is_none());
            println!("singleton ok");
        }
        "env-error" => {
            let want = std::env::var("RCH_PMI_TEST_EXPECT").unwrap_or_default();
            let e = PmiClient::from_env().expect_err("from_env should fail");
            println!("from_env error: {:?}: {e}", e.kind());
            assert!(e.to_string().contains(&want), "'{e}' lacks '{want}'");
        }
        other => panic!("unknown {MODE} '{other}'"),
    }
}

fn exchange() {
    let mut pmi = connect();
    let (me, n) = (pmi.rank(), pmi.size());
    // The environment's connection has one owner.
    let again = PmiClient::from_env().expect_err("a second from_env");
    assert_eq!(again.kind(), io::ErrorKind::AlreadyExists, "{again}");
    pmi.put(&format!("rank-{me}"), &format!("value-of-{me}"))
        .expect("put");
    pmi.put_bytes(&format!("blob-{me}"), &blob(me))
        .expect("put_bytes");
    pmi.barrier().expect("barrier");
    for peer in 0..n {
        assert_eq!(
            pmi.get(&format!("rank-{peer}")).expect("get"),
            format!("value-of-{peer}")
        );
        assert_eq!(
            pmi.get_bytes(&format!("blob-{peer}")).expect("get_bytes"),
            blob(peer)
        );
    }
    let e = pmi.get("no-such-key").expect_err("missing key");
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    pmi.barrier().expect("second barrier");
    println!(
        "rank {me} of {n}: exchanged with {n} ranks (kvs {}, max value len {})",
        pmi.kvs_name(),
        pmi.max_value_len()
    );
    pmi.finalize().expect("finalize");
}

fn barrier_loop(iters: u32) {
    let mut pmi = connect();
    let (me, n) = (pmi.rank(), pmi.size());
    for i in 0..iters {
        pmi.put(&format!("it{i}-r{me}"), &format!("{}", i * 1000 + me))
            .expect("put");
        pmi.barrier().expect("barrier");
        let next = (me + 1) % n;
        let v = pmi.get(&format!("it{i}-r{next}")).expect("get");
        assert_eq!(v, format!("{}", i * 1000 + next));
    }
    pmi.barrier().expect("last barrier");
    println!("rank {me} of {n}: {iters} barriers done");
    pmi.finalize().expect("finalize");
}

fn misbehave(mode: &str, bad_rank: u32) {
    let mut pmi = connect();
    pmi.barrier().expect("first barrier");
    if pmi.rank() != bad_rank {
        // Waits for a rank that never comes: only the launcher ends this.
        let r = pmi.barrier();
        panic!("the second barrier returned {r:?}; the launcher should have killed us");
    }
    match mode {
        "exit-code" => std::process::exit(3),
        // SAFETY: raising a signal at ourselves has no memory-safety preconditions.
        "crash" => unsafe {
            libc::raise(libc::SIGKILL);
        },
        "abort" => {
            pmi.abort(7, &format!("rank {bad_rank} gives up"))
                .expect("abort");
            std::thread::sleep(std::time::Duration::from_secs(30));
            std::process::exit(7);
        }
        "garbage" => {
            let fd: i32 = std::env::var("PMI_FD").unwrap().parse().unwrap();
            let line = b"this is not PMI\n";
            // SAFETY: writing a valid buffer to PMI_FD, which stays open (owned by `pmi`).
            let n = unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
            assert_eq!(n, line.len() as isize);
            std::thread::sleep(std::time::Duration::from_secs(30));
        }
        "no-finalize" => std::process::exit(0),
        _ => unreachable!(),
    }
    panic!("rank {bad_rank} should not get here");
}
