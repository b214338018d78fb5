//! `rch-run`: start N local processes and serve them PMI-1, so programs built on
//! rdma-channel (or any simple-PMI program) run without an MPI installation.
//!
//! ```text
//! rch-run -n N [--prefix-output] [--timeout SECS] [--grace SECS] prog args...
//! ```
//!
//! Exit status: 0 when every rank exits 0; otherwise the first failing rank's status
//! (128 + signal when killed), its PMI abort code, 124 on timeout; 2 for a usage
//! error, 127 when the program cannot be found, 126 when it cannot be executed.
//! See `rdma_channel::pmi::launch` for the details.

use rdma_channel::pmi::launch::{self, LaunchOptions, MAX_RANKS};
use std::ffi::OsString;
use std::io;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "\
usage: rch-run -n N [options] program [args...]

Starts N copies of program on this machine, each with PMI_FD, PMI_RANK and PMI_SIZE
set, and serves them the PMI-1 protocol (key-value space, barrier) that MPICH's
Hydra speaks. When a rank fails, the others are terminated and the failure is
reported.

options:
  -n, -np N          number of ranks (1..=1024)
  --prefix-output    forward each rank's output line by line, prefixed '[rank] '
  --timeout SECS     end the job (exit status 124) after SECS seconds
  --grace SECS       wait between SIGTERM and SIGKILL when ending ranks (default 2)
  -h, --help         show this help
";

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("rch-run: {msg}");
    eprintln!("usage: rch-run -n N [--prefix-output] [--timeout SECS] program [args...] (--help for more)");
    ExitCode::from(2)
}

fn parse_ranks(v: &str) -> Result<u32, String> {
    let n: u64 = v
        .trim()
        .parse()
        .map_err(|_| format!("-n expects a number of ranks, not '{v}'"))?;
    if n == 0 {
        return Err("-n must be at least 1".into());
    }
    if n > u64::from(MAX_RANKS) {
        return Err(format!(
            "-n {n} is too many ranks for one machine (at most {MAX_RANKS})"
        ));
    }
    Ok(n as u32)
}

fn parse_secs(opt: &str, v: &str) -> Result<Duration, String> {
    match v.trim().parse::<f64>() {
        Ok(s) if (0.0..1e9).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!("{opt} expects a number of seconds, not '{v}'")),
    }
}

struct Args {
    opts: LaunchOptions,
    program: OsString,
    args: Vec<OsString>,
}

fn parse(mut argv: impl Iterator<Item = OsString>) -> Result<Option<Args>, String> {
    let mut opts = LaunchOptions::default();
    let mut ranks = None;
    let value = |argv: &mut dyn Iterator<Item = OsString>, opt: &str| -> Result<String, String> {
        argv.next()
            .ok_or_else(|| format!("{opt} needs a value"))?
            .into_string()
            .map_err(|_| format!("the value of {opt} is not valid UTF-8"))
    };
    let program = loop {
        let Some(arg) = argv.next() else {
            return Err("no program given".into());
        };
        let Some(s) = arg.to_str() else {
            break arg;
        };
        match s {
            "-h" | "--help" => return Ok(None),
            "-n" | "-np" | "--np" => ranks = Some(parse_ranks(&value(&mut argv, s)?)?),
            "--prefix-output" => opts.prefix_output = true,
            "--timeout" => opts.timeout = Some(parse_secs(s, &value(&mut argv, s)?)?),
            "--grace" => opts.grace = parse_secs(s, &value(&mut argv, s)?)?,
            "--" => {
                break argv.next().ok_or("no program given after --")?;
            }
            _ if s.starts_with("--timeout=") => {
                opts.timeout = Some(parse_secs("--timeout", &s["--timeout=".len()..])?)
            }
            _ if s.starts_with("--grace=") => {
                opts.grace = parse_secs("--grace", &s["--grace=".len()..])?
            }
            _ if s.starts_with("-n") && s.len() > 2 && !s.starts_with("-np") => {
                ranks = Some(parse_ranks(s[2..].trim_start_matches('='))?)
            }
            _ if s.starts_with('-') && s.len() > 1 => return Err(format!("unknown option '{s}'")),
            _ => break arg,
        }
    };
    opts.ranks = ranks.ok_or("-n N (the number of ranks) is required")?;
    Ok(Some(Args {
        opts,
        program,
        args: argv.collect(),
    }))
}

fn main() -> ExitCode {
    let args = match parse(std::env::args_os().skip(1)) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => return usage_error(&msg),
    };
    match launch::run(&args.program, &args.args, &args.opts) {
        // Exit statuses are 8 bits; a failure must never wrap around to success.
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(match code.rem_euclid(256) {
            0 => 1,
            c => c as u8,
        }),
        Err(e) => {
            eprintln!("rch-run: {e}");
            ExitCode::from(match e.kind() {
                io::ErrorKind::NotFound => 127,
                io::ErrorKind::PermissionDenied => 126,
                io::ErrorKind::InvalidInput => 2,
                _ => 1,
            })
        }
    }
}
