//! The rank program of `pmi.rs` (see `pmi_rank.rs`) under MPICH's own process
//! manager, Debian's `mpiexec.hydra` (package `mpich`), unmodified.
//!
//! When `mpiexec.hydra` is missing, the first test installs it: as root with apt,
//! `apt-get install -y --no-install-recommends mpich` (7 packages, about 10 MB; with
//! recommends it would pull a compiler toolchain), running `apt-get update` first only
//! when that fails. When it cannot be installed (not root, no apt, no network), the
//! tests print `SKIPPED` and pass, unless `RCH_REQUIRE_HYDRA` is set (CI sets it):
//! then they fail.
//!
//! Hydra needs no special options here: on one host it starts ranks with `fork`
//! (no ssh), and it runs as root without complaint (`--allow-run-as-root` is an Open MPI
//! option). We still pass `-launcher fork -bind-to none` so that a machine whose host
//! name does not resolve to itself, or that has few cores, behaves the same.

#[path = "pmi_rank.rs"]
mod pmi_rank;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Entry point of the re-executed rank program.
#[test]
fn rank_entry() {
    pmi_rank::entry();
}

/// Prints a line on standard error even when the test harness captures output (it
/// captures `eprintln!`, not writes to the stream itself).
fn note(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

fn apt_install() -> Result<(), String> {
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "mpich"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output()
    };
    let t0 = Instant::now();
    let out = install().map_err(|e| format!("cannot run apt-get: {e}"))?;
    if out.status.success() {
        note(&format!(
            "hydra: installed mpich in {:.1} s",
            t0.elapsed().as_secs_f64()
        ));
        return Ok(());
    }
    note(&format!(
        "hydra: apt-get install failed ({}); running apt-get update first",
        String::from_utf8_lossy(&out.stderr).trim()
    ));
    let t1 = Instant::now();
    let up = Command::new("apt-get")
        .arg("update")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run apt-get update: {e}"))?;
    if !up.status.success() {
        return Err(format!(
            "apt-get update failed: {}",
            String::from_utf8_lossy(&up.stderr).trim()
        ));
    }
    let out = install().map_err(|e| format!("cannot run apt-get: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "apt-get install mpich failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    note(&format!(
        "hydra: apt-get update + install of mpich took {:.1} s",
        t1.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// `mpiexec.hydra`, installed if need be; `Err` says why it is unavailable.
fn find_or_install() -> Result<PathBuf, String> {
    if let Some(p) = in_path("mpiexec.hydra") {
        return Ok(p);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("mpiexec.hydra is not installed and we are not root to install it".into());
    }
    if in_path("apt-get").is_none() {
        return Err("mpiexec.hydra is not installed and there is no apt-get".into());
    }
    apt_install()?;
    in_path("mpiexec.hydra").ok_or_else(|| "mpich installed but no mpiexec.hydra in PATH".into())
}

/// `mpiexec.hydra`, or `None` after printing why the calling test is skipped.
fn hydra() -> Option<&'static Path> {
    static HYDRA: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match HYDRA.get_or_init(find_or_install) {
        Ok(p) => Some(p),
        Err(why) => {
            if std::env::var_os("RCH_REQUIRE_HYDRA").is_some() {
                panic!("RCH_REQUIRE_HYDRA is set but Hydra is unavailable: {why}");
            }
            note(&format!(
                "SKIPPED: {why} (set RCH_REQUIRE_HYDRA to make this a failure)"
            ));
            None
        }
    }
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `mpiexec.hydra <options> -n <n> <this binary> <rank args>` in `mode`.
fn mpiexec(hydra: &Path, options: &[&str], n: u32, env: &[(&str, &str)]) -> Run {
    const LIMIT: Duration = Duration::from_secs(120);
    let mut c = Command::new(hydra);
    c.args(["-launcher", "fork", "-bind-to", "none"])
        .args(options)
        .args(["-n", &n.to_string()])
        .arg(std::env::current_exe().unwrap())
        .args(pmi_rank::rank_args())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Our own launcher's variables must not leak in when the tests run under it.
    for v in ["PMI_FD", "PMI_PORT", "PMI_ID", "PMI_RANK", "PMI_SIZE"] {
        c.env_remove(v);
    }
    let t0 = Instant::now();
    let mut child = c.spawn().expect("start mpiexec.hydra");
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
        if t0.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mpiexec.hydra still running after {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let run = Run {
        code: status.code(),
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    };
    eprintln!(
        "mpiexec.hydra {options:?} -n {n} {env:?}: {:?} in {:?}\n--- stdout\n{}--- stderr\n{}---",
        run.code,
        t0.elapsed(),
        run.stdout,
        run.stderr
    );
    run
}

fn assert_exchanged(r: &Run, n: u32) {
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for rank in 0..n {
        let line = format!("rank {rank} of {n}: exchanged with {n} ranks");
        assert_eq!(
            r.stdout.matches(&line).count(),
            1,
            "'{line}' missing:\n{}",
            r.stdout
        );
    }
    // Hydra's limits, not ours: the 3000-byte blobs went through split keys.
    assert!(r.stdout.contains("max value len 1023"), "{}", r.stdout);
    assert!(
        !r.stdout.contains("kvs rch_kvs_"),
        "not run by Hydra?\n{}",
        r.stdout
    );
}

#[test]
fn rank_program_exchanges_values_under_hydra() {
    let Some(h) = hydra() else { return };
    let r = mpiexec(h, &[], 4, &[(pmi_rank::MODE, "exchange")]);
    assert_exchanged(&r, 4);
}

#[test]
fn rank_program_works_with_hydra_pmi_port() {
    let Some(h) = hydra() else { return };
    let r = mpiexec(h, &["-pmi-port"], 4, &[(pmi_rank::MODE, "exchange")]);
    assert_exchanged(&r, 4);
}

#[test]
fn eight_ranks_barrier_loop_under_hydra() {
    let Some(h) = hydra() else { return };
    let r = mpiexec(
        h,
        &[],
        8,
        &[
            (pmi_rank::MODE, "barrier-loop"),
            ("RCH_PMI_TEST_ITERS", "50"),
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for rank in 0..8 {
        assert!(
            r.stdout
                .contains(&format!("rank {rank} of 8: 50 barriers done")),
            "{}",
            r.stdout
        );
    }
}

#[test]
fn abort_under_hydra_ends_the_job_with_its_code() {
    let Some(h) = hydra() else { return };
    let t0 = Instant::now();
    let r = mpiexec(
        h,
        &[],
        4,
        &[(pmi_rank::MODE, "abort"), ("RCH_PMI_TEST_RANK", "2")],
    );
    assert_eq!(r.code, Some(7), "{}", r.stderr);
    // Hydra killed the ranks waiting in the barrier (they would wait 60 s for PMI).
    assert!(t0.elapsed() < Duration::from_secs(30));
}
