//! A peer process killed (SIGKILL: no destructor, no goodbye) at a random moment of
//! each stage of a connection's life, on the fabric `RCH_FABRIC` selects and, in a
//! test cluster, with the peer on the other host (`common::peer::spawn_peer`):
//!
//! * **handshake**: killed while it connects; the listener drops the half-made
//!   connection (or hands it over and its first read fails) and goes on serving;
//! * **eager**: small messages both ways (below one chunk);
//! * **pipelined**: heap messages of 64 KiB - 4 MiB through the ring, zero-copy off;
//! * **zero-copy**: `alloc_mem` messages of 64 KiB - 2 MiB, which the survivor reads
//!   from the dying process's memory (announce, RDMA READ, confirm);
//! * **close**: the peer writes a known amount, shuts down and exits, and is killed
//!   somewhere in that.
//!
//! The survivor reads and writes throughout. Every byte it receives is checked
//! against the peer's deterministic stream, so a byte that was not completely sent
//! would show; its reader and writer must each end, within the watchdog, with the
//! error of a dead peer, `ConnectionReset` (in the close stage also the clean end:
//! end of stream with every byte, and `BrokenPipe` for a writer whose peer closed).
//! `RCH_DEATH_TRIALS` kills per stage (default 20, scaled by `RCH_TEST_CASE_SCALE`).
//! The test prints the table of what the survivor saw and how soon; it asserts no
//! time other than the watchdog's bound.
//!
//! Apart from the kills, a peer that closes its sending side and exits at once, while
//! the survivor writes to it, must leave all it sent readable, then the end of
//! stream, even though the survivor's writes found it gone first.

mod common;

use std::io::{self, IoSlice, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::peer::{listen_for_child, scratch_dir, spawn_peer, PeerStatus, RemoveOnDrop};
use common::*;
use rdma_channel::{Config, RdmaListener, RdmaStream};

const ROLE: &str = "RCH_TEST_DEATH_STAGE";
const SOCKET: &str = "RCH_TEST_SOCKET";
const SEED: &str = "RCH_TEST_SEED";
/// What the peer writes in the close stage before it shuts down.
const CLOSE_TOTAL: u64 = 8 << 20;
/// Longest the survivor may take to see the death, before the test calls it a hang.
const DETECTION_LIMIT_SECS: u64 = 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Handshake,
    Eager,
    Pipelined,
    ZeroCopy,
    Close,
}

const STAGES: [Stage; 5] = [
    Stage::Handshake,
    Stage::Eager,
    Stage::Pipelined,
    Stage::ZeroCopy,
    Stage::Close,
];

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Handshake => "handshake",
            Stage::Eager => "eager",
            Stage::Pipelined => "pipelined",
            Stage::ZeroCopy => "zero-copy",
            Stage::Close => "close",
        }
    }

    fn from_name(s: &str) -> Stage {
        *STAGES
            .iter()
            .find(|st| st.name() == s)
            .unwrap_or_else(|| panic!("unknown stage {s}"))
    }

    /// Both ends use the same configuration (a listener insists on it).
    fn config(self) -> Config {
        let c = Config::default();
        match self {
            // Heap memory through the ring only, so the stage is the pipeline.
            Stage::Pipelined => c
                .with_zero_copy_threshold(None)
                .with_zero_copy_private_threshold(None),
            Stage::ZeroCopy => c.with_zero_copy_threshold(Some(16 << 10)),
            _ => c,
        }
    }

    /// Size of the next message a writer of this stage sends.
    fn message_len(self, rng: &mut Rng) -> usize {
        match self {
            Stage::Handshake | Stage::Eager => rng.log_uniform(1, 2048),
            // Long enough that kills land before, during and after the close.
            Stage::Close => rng.log_uniform(1, 64 << 10),
            Stage::Pipelined => rng.log_uniform(64 << 10, 4 << 20),
            Stage::ZeroCopy => rng.log_uniform(64 << 10, 2 << 20),
        }
    }
}

/// The fabric the connections run on: by IP address across hosts (verbs through
/// rdma_cm, whatever `RCH_FABRIC` says), else the one `RCH_FABRIC` selects.
fn fabric_label() -> &'static str {
    if common::peer::across_hosts() {
        "verbs across hosts"
    } else {
        fabric_kind().name()
    }
}

fn trials() -> usize {
    let n = std::env::var("RCH_DEATH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20u32);
    scaled(n) as usize
}

/// Writes stream `seed` in messages of the stage's sizes until `total` bytes (or
/// forever), each message from the start of `buf` (heap memory, or in the zero-copy
/// stage `alloc_mem` memory, which `write` sends zero-copy).
fn write_stream<W: Write>(
    w: &mut W,
    stage: Stage,
    seed: u64,
    total: Option<u64>,
    buf: &mut [u8],
) -> io::Result<u64> {
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut off = 0u64;
    while total.is_none_or(|t| off < t) {
        let mut n = stage.message_len(&mut rng).min(buf.len()) as u64;
        if let Some(t) = total {
            n = n.min(t - off);
        }
        let msg = &mut buf[..n as usize];
        stream_fill(seed, off, msg);
        w.write_all(msg)?;
        off += n;
    }
    Ok(off)
}

/// Room for the largest message of any stage.
const LARGEST: usize = 4 << 20;

/// The peer: connects and runs its stage until killed (or, in the close stage, to
/// its end).
#[test]
fn dying_peer() {
    let Ok(stage) = std::env::var(ROLE) else {
        return;
    };
    let stage = Stage::from_name(&stage);
    let seed: u64 = std::env::var(SEED).unwrap().parse().unwrap();
    let address = std::env::var(SOCKET).unwrap();
    let s = RdmaStream::connect_with(address.as_str(), stage.config()).unwrap();
    if stage == Stage::Handshake {
        // Connected before the kill came: stay silent until it does.
        std::thread::sleep(Duration::from_secs(600));
    }
    let (mut r, mut w) = s.split();
    // Drain what the survivor writes, so that its writer is not merely blocked.
    let reader = std::thread::spawn(move || {
        let mut sink = vec![0u8; 1 << 20];
        while matches!(r.read(&mut sink), Ok(n) if n > 0) {}
    });
    if stage == Stage::Close {
        write_stream(
            &mut w,
            stage,
            seed,
            Some(CLOSE_TOTAL),
            &mut vec![0u8; LARGEST],
        )
        .unwrap();
        w.shutdown().unwrap();
        let _ = reader.join();
        return;
    }
    let _ = if stage == Stage::ZeroCopy {
        let mut pool = w.alloc_mem(2 << 20).unwrap();
        write_stream(&mut w, stage, seed, None, &mut pool)
    } else {
        write_stream(&mut w, stage, seed, None, &mut vec![0u8; LARGEST])
    };
    std::thread::sleep(Duration::from_secs(600));
}

/// How one side of the survivor ended.
#[derive(Debug)]
struct End {
    /// `None`: the clean end (end of stream for a reader).
    kind: Option<io::ErrorKind>,
    message: String,
    at: Instant,
    bytes: u64,
}

/// Reads stream `seed` until an error or end of stream, checking every byte.
fn survive_reading(
    mut r: rdma_channel::ReadHalf,
    seed: u64,
    progress: &AtomicU64,
) -> Result<End, String> {
    let mut buf = vec![0u8; 1 << 20];
    let mut scratch = Vec::new();
    let mut off = 0u64;
    loop {
        match r.read(&mut buf) {
            Ok(0) => {
                return Ok(End {
                    kind: None,
                    message: "end of stream".into(),
                    at: Instant::now(),
                    bytes: off,
                })
            }
            Ok(n) => {
                stream_check(seed, off, &buf[..n], &mut scratch)?;
                off += n as u64;
                // Relaxed: a progress report for the killer's timing only.
                progress.store(off, Ordering::Relaxed);
            }
            Err(e) => {
                return Ok(End {
                    kind: Some(e.kind()),
                    message: e.to_string(),
                    at: Instant::now(),
                    bytes: off,
                })
            }
        }
    }
}

/// Writes until an error.
fn survive_writing(mut w: rdma_channel::WriteHalf, stage: Stage, seed: u64) -> End {
    let mut sent = 0u64;
    let e = match write_stream(&mut w, stage, seed, None, &mut vec![0u8; LARGEST]) {
        Ok(n) => {
            sent = n;
            io::Error::other("the writer ended without an error")
        }
        Err(e) => e,
    };
    End {
        kind: Some(e.kind()),
        message: e.to_string(),
        at: Instant::now(),
        bytes: sent,
    }
}

/// What one stage's trials gave.
#[derive(Default)]
struct Tally {
    trials: usize,
    outcomes: std::collections::BTreeMap<String, usize>,
    detect_ms: Vec<f64>,
}

impl Tally {
    fn note(&mut self, outcome: String, detect: Option<Duration>) {
        *self.outcomes.entry(outcome).or_default() += 1;
        if let Some(d) = detect {
            self.detect_ms.push(d.as_secs_f64() * 1e3);
        }
    }

    fn row(&mut self, stage: Stage) -> String {
        self.detect_ms.sort_by(f64::total_cmp);
        let (median, max) = match self.detect_ms.len() {
            0 => ("-".into(), "-".into()),
            n => (
                format!("{:.0}", self.detect_ms[n / 2]),
                format!("{:.0}", self.detect_ms[n - 1]),
            ),
        };
        let outcomes: Vec<String> = self
            .outcomes
            .iter()
            .map(|(k, n)| format!("{k} x{n}"))
            .collect();
        format!(
            "| {} | {} | {} | {} | {median} | {max} | 0 | 0 |",
            stage.name(),
            fabric_label(),
            self.trials,
            outcomes.join(", ")
        )
    }
}

/// One kill in a data stage: the survivor's reader and writer run, the peer dies at
/// a random moment, both must end with the death's error.
fn data_trial(listener: &RdmaListener, address: &str, stage: Stage, rng: &mut Rng) -> Tally {
    let seed = rng.next_u64() >> 1;
    let mut child = spawn_peer(
        "dying_peer",
        &[
            (ROLE, stage.name().into()),
            (SOCKET, address.into()),
            (SEED, seed.to_string()),
        ],
    );
    let s = listener.accept().unwrap();
    let (r, w) = s.split();
    let progress = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&progress);
    let reader = std::thread::spawn(move || survive_reading(r, seed, &seen));
    let writer = std::thread::spawn(move || survive_writing(w, stage, seed ^ 1));
    if stage == Stage::Close {
        // Once the second half of what the peer writes is arriving, so that kills
        // land before, during and after its shutdown.
        let mark = CLOSE_TOTAL / 2 + rng.below(CLOSE_TOTAL / 2);
        let give_up = Instant::now() + limit(DETECTION_LIMIT_SECS);
        // Relaxed: as in survive_reading.
        while progress.load(Ordering::Relaxed) < mark && Instant::now() < give_up {
            std::thread::sleep(Duration::from_micros(50));
        }
        std::thread::sleep(Duration::from_micros(rng.below(1_000)));
    } else {
        // Half the kills right at the start of the transfer (where a zero-copy
        // announcement's first READ meets memory that is going away), half well into it.
        let within = if rng.chance(1, 2) { 2_000 } else { 40_000 };
        std::thread::sleep(Duration::from_micros(rng.below(within)));
    }
    child.kill();
    let killed = Instant::now();
    let limit = limit(DETECTION_LIMIT_SECS);
    let read_end = with_watchdog("survivor's reader", limit, move || reader.join().unwrap())
        .unwrap_or_else(|e| panic!("{}: survivor read corrupt bytes: {e}", stage.name()));
    let write_end = with_watchdog("survivor's writer", limit, move || writer.join().unwrap());
    let _ = child.wait(Instant::now() + limit);
    let mut t = Tally::default();
    for (side, end) in [("reader", &read_end), ("writer", &write_end)] {
        let fine = match (stage, side, end.kind) {
            (_, _, Some(io::ErrorKind::ConnectionReset)) => true,
            // The peer finished in order before the kill landed.
            (Stage::Close, "reader", None) => end.bytes == CLOSE_TOTAL,
            (Stage::Close, "writer", Some(io::ErrorKind::BrokenPipe)) => true,
            _ => false,
        };
        assert!(
            fine,
            "{} stage, survivor's {side}: {:?} ({}) after {} bytes",
            stage.name(),
            end.kind,
            end.message,
            end.bytes
        );
        let label = match end.kind {
            Some(k) => format!("{side} {k:?}"),
            None => format!("{side} end of stream"),
        };
        t.note(label, Some(end.at.saturating_duration_since(killed)));
    }
    t
}

/// One kill in the handshake: the peer dies while it connects, with the listener
/// accepting all along. The listener must go on serving (a good client behind it is
/// accepted); a connection it handed over before the death must fail with
/// `ConnectionReset` on its first read.
fn handshake_trial(listener: &RdmaListener, address: &str, rng: &mut Rng) -> Tally {
    let mut child = spawn_peer(
        "dying_peer",
        &[
            (ROLE, Stage::Handshake.name().into()),
            (SOCKET, address.into()),
            (SEED, "0".into()),
        ],
    );
    let limit = limit(DETECTION_LIMIT_SECS);
    let mut t = Tally::default();
    std::thread::scope(|scope| {
        let (killed_tx, killed_rx) = std::sync::mpsc::channel::<Instant>();
        let acceptor = scope.spawn(move || {
            let mut t = Tally::default();
            loop {
                let mut s = listener.accept().unwrap();
                s.set_read_timeout(Some(limit)).unwrap();
                let mut first = [0u8; 5];
                match s.read_exact(&mut first) {
                    Ok(()) => {
                        assert_eq!(&first, b"good!");
                        s.write_all(b"k").unwrap();
                        t.note("listener went on serving".into(), None);
                        return t;
                    }
                    Err(e) => {
                        assert_eq!(
                            e.kind(),
                            io::ErrorKind::ConnectionReset,
                            "a connection from the killed peer: {e}"
                        );
                        let killed = killed_rx.recv().expect("the kill's moment");
                        t.note(
                            "connected, then reader ConnectionReset".into(),
                            Some(killed.elapsed()),
                        );
                    }
                }
            }
        });
        // Process start-up takes some milliseconds: kills land before, in and after
        // the handshake.
        std::thread::sleep(Duration::from_micros(rng.below(20_000)));
        child.kill();
        killed_tx.send(Instant::now()).unwrap();
        let mut s = RdmaStream::connect_with(address, Stage::Handshake.config())
            .expect("the good client connects");
        s.write_all(b"good!").unwrap();
        // Bounded: a listener stuck on the dead peer fails the test here.
        s.set_read_timeout(Some(limit)).unwrap();
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack).expect("the good client is served");
        t = acceptor.join().unwrap();
    });
    let _ = child.wait(Instant::now() + limit);
    t
}

/// The peer of `a_peer_that_closes_and_exits_leaves_its_last_bytes_readable`.
#[test]
fn last_words_peer() {
    let Ok(address) = std::env::var(LAST_WORDS) else {
        return;
    };
    let mut s = RdmaStream::connect(address.as_str()).unwrap();
    for m in 0..LAST_WORDS_MESSAGES {
        s.write_all(&last_words(m)).unwrap();
    }
    s.shutdown_write().unwrap();
    if lands_later() {
        // A NIC may still be moving the last writes, and the kernel destroys the
        // queue pair of a process that exits: give them time to land (this test is
        // about the survivor's reads, not about an exit racing its own writes).
        std::thread::sleep(Duration::from_secs(1));
    }
    // Gone, destructors skipped: its receiving end never says it closed, so the
    // survivor learns of the exit from the fabric alone.
    std::process::exit(0);
}

/// What `last_words_peer` writes: message `m` of 1-2 KiB, its bytes derived from `m`.
fn last_words(m: usize) -> Vec<u8> {
    (0..1024 + 97 * m).map(|i| (i * 7 + m * 13) as u8).collect()
}

const LAST_WORDS: &str = "RCH_TEST_LAST_WORDS";
const LAST_WORDS_MESSAGES: usize = 8;

/// A peer closes its sending side in order and exits at once, while this end
/// writes to it until the ring is full. The health check behind that write finds
/// the peer gone before this end reads anything: the write fails with
/// `ConnectionReset`, and the reads must still return every byte the peer sent,
/// then the end of stream (the peer's end of stream came after its last packet,
/// so they are all in this end's ring). MPICH's close protocol meets this race
/// when a rank finalizes and exits while another still reads its last CLOSE.
#[test]
fn a_peer_that_closes_and_exits_leaves_its_last_bytes_readable() {
    if std::env::var(ROLE).is_ok() || std::env::var(LAST_WORDS).is_ok() {
        return;
    }
    let dir = scratch_dir("last-words");
    let _cleanup = RemoveOnDrop(dir.clone());
    let (listener, address) = listen_for_child(&dir, Config::default());
    let child = spawn_peer("last_words_peer", &[(LAST_WORDS, address)]);
    let mut s = listener.accept().unwrap();
    let give_up = Instant::now() + limit(DETECTION_LIMIT_SECS);
    let (status, out, err) = child.wait(give_up);
    assert!(
        status.as_ref().is_some_and(PeerStatus::success),
        "the peer failed: {status:?}\n{out}\n{err}"
    );
    let block = [0x5au8; 4096];
    let failed = loop {
        match s.put(&[IoSlice::new(&block)]) {
            Ok(0) => {
                assert!(
                    Instant::now() < give_up,
                    "writes to a peer that exited never failed"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    assert_eq!(failed.kind(), io::ErrorKind::ConnectionReset, "{failed}");
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .unwrap_or_else(|e| panic!("read after {} bytes: {e}", got.len()));
    let sent: Vec<u8> = (0..LAST_WORDS_MESSAGES).flat_map(last_words).collect();
    assert_eq!(got.len(), sent.len(), "bytes read");
    assert!(got == sent, "the bytes read differ from those sent");
}

#[test]
fn peer_killed_at_every_stage_is_an_error_in_bounded_time_never_a_hang_or_corrupt_bytes() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let n = trials();
    let mut rng = Rng::new(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    let mut rows = Vec::new();
    for stage in STAGES {
        let dir = scratch_dir(&format!("death-{}", stage.name()));
        let _cleanup = RemoveOnDrop(dir.clone());
        let (listener, address) = listen_for_child(&dir, stage.config());
        let mut tally = Tally::default();
        for _ in 0..n {
            let t = match stage {
                Stage::Handshake => handshake_trial(&listener, &address, &mut rng),
                _ => data_trial(&listener, &address, stage, &mut rng),
            };
            tally.trials += 1;
            for (k, v) in t.outcomes {
                *tally.outcomes.entry(k).or_default() += v;
            }
            tally.detect_ms.extend(t.detect_ms);
        }
        rows.push(tally.row(stage));
    }
    println!("| stage | fabric | kills | survivor saw | detected, median ms | max ms | hangs | corrupt bytes |");
    println!("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |");
    for r in rows {
        println!("{r}");
    }
}
