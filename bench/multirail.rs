//! Multirail striping on the emulated fabric (seed 002, figures 17-20): two rails
//! rate-limited to 400 and 100 MB/s (a 4:1 pair, as the paper's 4x and 1x HCAs),
//! large messages streamed one way, and the bandwidth of one rail alone, even
//! striping, fixed 4:1 weights and adaptive striping from equal weights, side by
//! side in interleaved rounds; then a time trace of the weights and bandwidth while
//! a competing flow loads the 100 MB/s rail and stops.
//!
//! ```text
//! cargo bench --bench multirail                                  # table and trace
//! cargo bench --bench multirail -- --rounds 3 --secs 1 --sizes 65536,1048576,4194304
//! cargo bench --bench multirail -- --trace-only --svg bench/results/multirail-trace.svg
//! cargo bench --bench multirail -- --copying --no-trace            # copying puts (relayed)
//! ```
//!
//! The rails are emulated queue pairs whose completions a pacer holds back until a
//! link of that rate would have carried the bytes (`RCH_RAILS=@400m/a,@100m/b`
//! syntax; `fabric::emulated::Pacer`); the copies themselves run at memory speed in
//! the receiving thread. The sender lends a window of 16 heap buffers
//! (`Sender::put_lending`), so transfers are read back to back, as `osu_bw` keeps a
//! window in flight; with `--copying` it copies them with `put` instead (with rails,
//! through its relay slots). Bandwidth is what the receiver got per second of wall time
//! after a warm-up. Prints tables; asserts nothing about speed.

use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rdma_channel::config::{RailSpec, StripePolicy};
use rdma_channel::{Config, RdmaStream};

const WINDOW: usize = 16;

/// `--copying`: the sender uses `put` (copies) instead of lending.
static COPYING: AtomicBool = AtomicBool::new(false);

struct Args {
    rounds: usize,
    secs: f64,
    sizes: Vec<usize>,
    trace: bool,
    table: bool,
    trace_secs: f64,
    compete_from: f64,
    compete_to: f64,
    svg: Option<String>,
    csv: Option<String>,
    /// Between the two VMs of `bench/multirail-cluster.sh`.
    cluster: bool,
    /// Bytes of a cell there.
    cluster_bytes: usize,
}

fn args() -> Args {
    let mut a = Args {
        rounds: 3,
        secs: 1.0,
        sizes: vec![64 << 10, 256 << 10, 1 << 20, 4 << 20],
        trace: true,
        table: true,
        trace_secs: 20.0,
        compete_from: 5.0,
        compete_to: 15.0,
        svg: None,
        csv: None,
        cluster: false,
        cluster_bytes: 16 << 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--rounds" => a.rounds = val().parse().expect("--rounds N"),
            "--secs" => a.secs = val().parse().expect("--secs S"),
            "--sizes" => {
                a.sizes = val()
                    .split(',')
                    .map(|s| s.parse().expect("--sizes 65536,1048576"))
                    .collect()
            }
            "--trace-only" => a.table = false,
            "--no-trace" => a.trace = false,
            "--trace-secs" => a.trace_secs = val().parse().expect("--trace-secs S"),
            "--compete" => {
                let v = val();
                let (f, t) = v.split_once(',').expect("--compete FROM,TO");
                a.compete_from = f.parse().expect("--compete FROM,TO");
                a.compete_to = t.parse().expect("--compete FROM,TO");
            }
            "--svg" => a.svg = Some(val()),
            "--cluster" => a.cluster = true,
            "--cluster-bytes" => a.cluster_bytes = val().parse().expect("--cluster-bytes N"),
            "--csv" => a.csv = Some(val()),
            "--copying" => COPYING.store(true, Ordering::Relaxed),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// The schemes of the table: (name, rails, striping policy).
fn schemes() -> Vec<(&'static str, &'static str, StripePolicy)> {
    vec![
        ("one rail", "@400m", StripePolicy::Even),
        ("even", "@400m,@100m", StripePolicy::Even),
        ("4:1", "@400m,@100m", StripePolicy::Weights(vec![4, 1])),
        ("adaptive", "@400m,@100m", StripePolicy::default()),
    ]
}

fn config(rails: &str, policy: StripePolicy) -> Config {
    Config::default()
        .with_rails(RailSpec::parse_list(rails).expect("rails"))
        .with_stripe_policy(policy)
}

/// A trace's rows: time (s), MB/s over the step before it, rail 0's weight.
type Trace = Vec<(f64, f64, f64)>;

/// What a receiving thread saw: bytes by time since the connection was made, and
/// the weights at the same moments.
#[derive(Default)]
struct Seen {
    samples: Vec<(f64, u64, Vec<f64>)>,
}

/// A running one-way stream of `size`-byte messages on a new connection made with
/// `cfg`: the sender lends a window of heap buffers; the receiver notes its bytes
/// and weights every `every`.
struct Flow {
    stop: Arc<AtomicBool>,
    sender: thread::JoinHandle<std::io::Result<()>>,
    receiver: thread::JoinHandle<std::io::Result<()>>,
    seen: Arc<Mutex<Seen>>,
    got: Arc<AtomicU64>,
}

impl Flow {
    fn start(cfg: Config, size: usize, every: Duration) -> std::io::Result<Flow> {
        let (a, b) = RdmaStream::pair_with(cfg)?;
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let got = Arc::new(AtomicU64::new(0));
        let t0 = Instant::now();
        let sender = {
            let stop = stop.clone();
            thread::spawn(move || send_loop(a, size, &stop))
        };
        let receiver = {
            let (stop, seen, got) = (stop.clone(), seen.clone(), got.clone());
            thread::spawn(move || recv_loop(b, size, &stop, &seen, &got, t0, every))
        };
        Ok(Flow {
            stop,
            sender,
            receiver,
            seen,
            got,
        })
    }

    fn finish(self) -> std::io::Result<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        self.sender.join().expect("sender")?;
        self.receiver.join().expect("receiver")?;
        let _ = &self.got;
        Ok(std::mem::take(&mut *self.seen.lock().unwrap()))
    }
}

fn send_loop(mut a: RdmaStream, size: usize, stop: &AtomicBool) -> std::io::Result<()> {
    if COPYING.load(Ordering::Relaxed) {
        return copy_loop(a, size, stop);
    }
    let bufs: Vec<Vec<u8>> = (0..WINDOW).map(|k| vec![k as u8 + 1; size]).collect();
    let mut tickets = [0u64; WINDOW];
    let mut released = 0u64;
    let mut i = 0usize;
    // Every way out goes through the end, where the sender is dropped before the
    // buffers it may still lend (a return from here would free them first).
    'stream: while !stop.load(Ordering::Relaxed) {
        let k = i % WINDOW;
        while released < tickets[k] {
            released = match a.channel().sender().lends_released() {
                Ok(r) => r,
                Err(e) => {
                    drop(a);
                    return Err(e);
                }
            };
            if stop.load(Ordering::Relaxed) {
                break 'stream;
            }
        }
        let mut done = 0;
        while done < size {
            // SAFETY: buffer k stays untouched until lends_released passes its
            // ticket (checked above before it is lent again), and outlives the sender.
            let l = match unsafe {
                a.channel()
                    .sender()
                    .put_lending(&[IoSlice::new(&bufs[k][done..])])
            } {
                Ok(l) => l,
                Err(e) => {
                    drop(a);
                    return Err(e);
                }
            };
            done += l.bytes;
            if l.ticket > 0 {
                tickets[k] = l.ticket;
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        i += 1;
    }
    // Hold the buffers until the peer read them all (or the connection ends).
    let last = tickets.iter().copied().max().unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while released < last && Instant::now() < deadline {
        match a.channel().sender().lends_released() {
            Ok(r) => released = r,
            Err(_) => break,
        }
    }
    // The sender first: dropping it revokes what is still lent, then the buffers go.
    drop(a);
    drop(bufs);
    Ok(())
}

/// `send_loop` with copying puts: a message is the caller's again as soon as `put`
/// counted it.
fn copy_loop(mut a: RdmaStream, size: usize, stop: &AtomicBool) -> std::io::Result<()> {
    let buf = vec![7u8; size];
    while !stop.load(Ordering::Relaxed) {
        let mut done = 0;
        while done < size && !stop.load(Ordering::Relaxed) {
            let r = a.put(&[IoSlice::new(&buf[done..])]).and_then(|n| {
                if n == 0 {
                    a.channel().sender().wait_writable()?;
                }
                Ok(n)
            });
            match r {
                Ok(n) => done += n,
                // The receiver may be gone first once told to stop.
                Err(_) if stop.load(Ordering::Relaxed) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

fn recv_loop(
    mut b: RdmaStream,
    size: usize,
    stop: &AtomicBool,
    seen: &Mutex<Seen>,
    got: &AtomicU64,
    t0: Instant,
    every: Duration,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; size];
    let mut total = 0u64;
    let mut next = every;
    loop {
        let n = match b.get(&mut [IoSliceMut::new(&mut buf)]) {
            Ok(n) => n,
            Err(e) if stop.load(Ordering::Relaxed) => {
                let _ = e;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        total += n as u64;
        got.store(total, Ordering::Relaxed);
        let now = t0.elapsed();
        if now >= next {
            let w = b.channel().receiver().stripe_weights().to_vec();
            seen.lock()
                .unwrap()
                .samples
                .push((now.as_secs_f64(), total, w));
            next = now + every;
        }
        if n == 0 {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            std::hint::spin_loop();
        }
    }
}

/// Bytes a second between `from` and `to` seconds of a flow's samples.
fn rate(seen: &Seen, from: f64, to: f64) -> f64 {
    let at = |t: f64| {
        seen.samples
            .iter()
            .rfind(|s| s.0 <= t)
            .map_or((0.0, 0), |s| (s.0, s.1))
    };
    let (t1, b1) = at(from);
    let (t2, b2) = at(to);
    if t2 <= t1 {
        return 0.0;
    }
    (b2 - b1) as f64 / (t2 - t1)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn table(a: &Args) -> std::io::Result<()> {
    let schemes = schemes();
    // [size][scheme] -> rounds of MB/s; and the adaptive flow's first second.
    let mut cells = vec![vec![Vec::new(); schemes.len()]; a.sizes.len()];
    let mut first_second: Vec<Vec<Seen>> = (0..a.sizes.len()).map(|_| Vec::new()).collect();
    let warm = 0.3;
    for round in 0..a.rounds {
        for (si, &size) in a.sizes.iter().enumerate() {
            for (ci, (_, rails, policy)) in schemes.iter().enumerate() {
                let flow = Flow::start(
                    config(rails, policy.clone()),
                    size,
                    Duration::from_millis(20),
                )?;
                thread::sleep(Duration::from_secs_f64(warm + a.secs));
                let seen = flow.finish()?;
                cells[si][ci].push(rate(&seen, warm, warm + a.secs) / 1e6);
                if ci == schemes.len() - 1 {
                    first_second[si].push(seen);
                }
            }
        }
        eprintln!("round {} of {} done", round + 1, a.rounds);
    }
    println!(
        "\nmultirail striping, emulated rails of 400 and 100 MB/s: {} round(s), medians, MB/s \
         ({})",
        a.rounds,
        if COPYING.load(Ordering::Relaxed) {
            "copying puts".to_string()
        } else {
            format!("window of {WINDOW} lent heap buffers")
        }
    );
    print!("| size |");
    for (name, _, _) in &schemes {
        print!(" {name} |");
    }
    println!(" adaptive / best static | adaptive / one rail |");
    print!("| ---: |");
    for _ in 0..schemes.len() + 2 {
        print!(" ---: |");
    }
    println!();
    let mut csv = String::from("size,scheme,round,mbps\n");
    for (si, size) in a.sizes.iter().enumerate() {
        let mut meds: Vec<f64> = Vec::new();
        for (ci, (name, _, _)) in schemes.iter().enumerate() {
            for (r, v) in cells[si][ci].iter().enumerate() {
                csv.push_str(&format!("{size},{name},{r},{v:.1}\n"));
            }
            meds.push(median(&mut cells[si][ci].clone()));
        }
        print!("| {size} |");
        for m in &meds {
            print!(" {m:.1} |");
        }
        let best_static = meds[1].max(meds[2]);
        println!(" {:.3} | {:.2} |", meds[3] / best_static, meds[3] / meds[0]);
    }
    // How soon adaptive striping gets there from equal weights: the first 100 ms
    // window from which every window of the first second delivers at least 90% of
    // the fixed 4:1 split's median.
    println!(
        "\nadaptive from equal weights, first second of a new connection: rail 0's weight \
         and MB/s per 100 ms window (median round by first-second bytes)"
    );
    println!(
        "| size | 4:1 MB/s | within 10% of 4:1 from | weights after 100 ms | MB/s per 100 ms |"
    );
    println!("| ---: | ---: | ---: | ---: | --- |");
    for (si, size) in a.sizes.iter().enumerate() {
        let four = median(&mut cells[si][2].clone());
        let mut runs: Vec<&Seen> = first_second[si].iter().collect();
        runs.sort_by(|x, y| rate(x, 0.0, 1.0).partial_cmp(&rate(y, 0.0, 1.0)).unwrap());
        let s = runs[runs.len() / 2];
        let windows: Vec<f64> = (0..10)
            .map(|w| rate(s, w as f64 / 10.0, (w + 1) as f64 / 10.0) / 1e6)
            .collect();
        let from = (0..10)
            .find(|&w| windows[w..].iter().all(|&m| m >= 0.9 * four))
            .map_or("never".to_string(), |w| format!("{} ms", w * 100));
        let w100 = s
            .samples
            .iter()
            .find(|x| x.0 >= 0.1)
            .map_or(f64::NAN, |x| x.2[0]);
        let list: Vec<String> = windows.iter().map(|m| format!("{m:.0}")).collect();
        println!(
            "| {size} | {four:.1} | {from} | {w100:.3} | {} |",
            list.join(" ")
        );
    }
    if let Some(path) = &a.csv {
        std::fs::write(path, csv)?;
    }
    Ok(())
}

/// Seed 002's figure 20: a 4 MiB stream over rails of 400 and 400 MB/s... here 400
/// and 100 (the 4:1 pair), while a second connection streams over the 100 MB/s
/// link from `compete_from` to `compete_to` seconds. Adaptive and even striping, one
/// after the other.
fn trace(a: &Args) -> std::io::Result<Vec<(String, Trace)>> {
    let size = 4 << 20;
    let mut out = Vec::new();
    for (name, policy) in [
        ("adaptive", StripePolicy::default()),
        ("even", StripePolicy::Even),
    ] {
        let main = Flow::start(
            config("@400m/a,@100m/b", policy),
            size,
            Duration::from_millis(50),
        )?;
        let t0 = Instant::now();
        thread::sleep(Duration::from_secs_f64(a.compete_from));
        let rival = Flow::start(
            config("@100m/b", StripePolicy::Even),
            1 << 20,
            Duration::from_millis(250),
        )?;
        let rival_t0 = t0.elapsed().as_secs_f64();
        thread::sleep(Duration::from_secs_f64(a.compete_to - a.compete_from));
        let rival_seen = rival.finish()?;
        thread::sleep(Duration::from_secs_f64(
            (a.trace_secs - t0.elapsed().as_secs_f64()).max(0.0),
        ));
        let seen = main.finish()?;
        let step = 0.25;
        let mut rows = Vec::new();
        println!(
            "\ntrace, {name} striping: 4 MiB messages over rails of 400 and 100 MB/s; a \
             second connection streams 1 MiB messages over the 100 MB/s link from {:.1} s to \
             {:.1} s ({:.0} MB/s while it ran)",
            a.compete_from,
            a.compete_to,
            rate(&rival_seen, 0.5, a.compete_to - rival_t0 - 0.1) / 1e6
        );
        println!("| t (s) | MB/s | rail 0 weight |");
        println!("| ---: | ---: | ---: |");
        let mut t = 0.0;
        while t + step <= a.trace_secs + 1e-9 {
            let mbps = rate(&seen, t, t + step) / 1e6;
            let w0 = seen
                .samples
                .iter()
                .rfind(|s| s.0 <= t + step)
                .map_or(f64::NAN, |s| s.2[0]);
            println!("| {:.2} | {mbps:.1} | {w0:.3} |", t + step);
            rows.push((t + step, mbps, w0));
            t += step;
        }
        out.push((name.to_string(), rows));
    }
    Ok(out)
}

/// The best split while the competing flow runs: static weights (all on the 400
/// MB/s rail, 8:1, 4:1) and adaptive striping, each on a new connection over the
/// two links while a second connection streams over the 100 MB/s one; `secs`
/// seconds measured after one of warm-up. Returns the adaptive and best static
/// figures.
fn competing_table(a: &Args) -> std::io::Result<(f64, f64)> {
    let schemes = [
        (
            "400 MB/s rail only (1:0)",
            StripePolicy::Weights(vec![1, 0]),
        ),
        ("8:1", StripePolicy::Weights(vec![8, 1])),
        ("4:1", StripePolicy::Weights(vec![4, 1])),
        ("adaptive", StripePolicy::default()),
    ];
    let mut got = vec![Vec::new(); schemes.len()];
    for _ in 0..a.rounds {
        for (i, (_, policy)) in schemes.iter().enumerate() {
            let rival = Flow::start(
                config("@100m/b", StripePolicy::Even),
                1 << 20,
                Duration::from_millis(250),
            )?;
            thread::sleep(Duration::from_millis(300));
            let main = Flow::start(
                config("@400m/a,@100m/b", policy.clone()),
                4 << 20,
                Duration::from_millis(50),
            )?;
            thread::sleep(Duration::from_secs_f64(1.0 + a.secs));
            let seen = main.finish()?;
            rival.finish()?;
            got[i].push(rate(&seen, 1.0, 1.0 + a.secs) / 1e6);
        }
    }
    println!(
        "
while a second connection streams 1 MiB messages over the 100 MB/s link: 4 MiB \
         messages over both links, MB/s ({} round(s), medians)",
        a.rounds
    );
    println!("| split | MB/s |");
    println!("| --- | ---: |");
    let mut meds = Vec::new();
    for (i, (name, _)) in schemes.iter().enumerate() {
        let m = median(&mut got[i].clone());
        println!("| {name} | {m:.1} |");
        meds.push(m);
    }
    let best = meds[..3].iter().copied().fold(0.0, f64::max);
    println!("| adaptive / best static | {:.3} |", meds[3] / best);
    Ok((meds[3], best))
}

fn plot(
    path: &str,
    caption: &str,
    secs: f64,
    series: &[(String, Trace)],
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(340);
    let max_bw = series
        .iter()
        .flat_map(|s| s.1.iter().map(|r| r.1))
        .fold(0.0f64, f64::max)
        * 1.15;
    let colors = [RED, BLUE];
    let mut c = ChartBuilder::on(&top)
        .caption(caption, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..secs, 0.0..max_bw)?;
    c.configure_mesh()
        .x_desc("time (s)")
        .y_desc("MB/s")
        .draw()?;
    for (i, (name, rows)) in series.iter().enumerate() {
        let col = colors[i % colors.len()];
        c.draw_series(LineSeries::new(rows.iter().map(|r| (r.0, r.1)), col))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
    }
    c.configure_series_labels().border_style(BLACK).draw()?;
    let mut w = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..secs, 0.0..1.0)?;
    w.configure_mesh()
        .x_desc("time (s)")
        .y_desc("weight of rail 0 (the faster)")
        .draw()?;
    for (i, (name, rows)) in series.iter().enumerate() {
        let col = colors[i % colors.len()];
        w.draw_series(LineSeries::new(rows.iter().map(|r| (r.0, r.2)), col))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
    }
    w.configure_series_labels().border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

/// Across the two Soft-RoCE VMs of `bench/multirail-cluster.sh` (two links, rxe0 and
/// rxe1 in each VM, rate-limited with `tc`): VM 1 receives and prints the tables, VM 0
/// sends. Each cell is a connection by IP address (rdma_cm; the rails' cards follow
/// over rail 0) with the scheme's rails, `bytes` bytes of `size`-byte messages.
mod cluster {
    use super::*;
    use rdma_channel::RdmaListener;

    fn env(k: &str) -> String {
        std::env::var(k)
            .unwrap_or_else(|_| panic!("{k} is not set: run bench/multirail-cluster.sh"))
    }

    fn schemes(dev2: &str) -> Vec<(&'static str, String, StripePolicy)> {
        vec![
            // Read like the striped schemes (no push), for a like-for-like rail.
            ("one rail", "1".into(), StripePolicy::Even),
            ("even", format!(",{dev2}"), StripePolicy::Even),
            ("4:1", format!(",{dev2}"), StripePolicy::Weights(vec![4, 1])),
            ("adaptive", format!(",{dev2}"), StripePolicy::default()),
        ]
    }

    /// Connects, retrying while the listener is not up yet.
    fn connect(addr: &str, cfg: &Config) -> std::io::Result<RdmaStream> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match RdmaStream::connect_with(addr, cfg.clone()) {
                Ok(s) => return Ok(s),
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends `total` bytes of `size`-byte messages with a window of 4 lent buffers,
    /// then waits for the receiver to close.
    fn send(
        mut a: RdmaStream,
        size: usize,
        total: usize,
        stop: Option<&AtomicBool>,
    ) -> std::io::Result<()> {
        let stopped = || stop.is_some_and(|s| s.load(Ordering::Relaxed));
        let bufs: Vec<Vec<u8>> = (0..4).map(|k| vec![k as u8 + 1; size]).collect();
        let mut tickets = [0u64; 4];
        let mut released = 0;
        let mut sent = 0usize;
        let mut i = 0;
        let result = (|| {
            while sent < total && !stopped() {
                let k = i % 4;
                while released < tickets[k] {
                    released = a.channel().sender().lends_released()?;
                }
                let n = size.min(total - sent);
                let mut done = 0;
                while done < n {
                    // SAFETY: buffer k is lent again only after lends_released passed
                    // its ticket, and `a` is dropped before the buffers (below).
                    let l = unsafe {
                        a.channel()
                            .sender()
                            .put_lending(&[IoSlice::new(&bufs[k][done..n])])
                    }?;
                    done += l.bytes;
                    if l.ticket > 0 {
                        tickets[k] = l.ticket;
                    }
                }
                sent += n;
                i += 1;
            }
            a.shutdown_write()?;
            // The receiver closes once it read everything: the buffers are free then.
            let mut b = [0u8; 1];
            let _ = std::io::Read::read(&mut a, &mut b);
            Ok(())
        })();
        let t = Instant::now();
        drop(a);
        if t.elapsed() > Duration::from_millis(200) {
            eprintln!(
                "sender: dropping the stream took {:.2} s",
                t.elapsed().as_secs_f64()
            );
        }
        drop(bufs);
        result
    }

    pub(super) fn run(a: &Args) -> std::io::Result<()> {
        let node: usize = env("SOFTROCE_NODE").parse().expect("SOFTROCE_NODE");
        let hosts: Vec<String> = env("SOFTROCE_HOSTS")
            .split_whitespace()
            .map(String::from)
            .collect();
        let hosts2: Vec<String> = env("SOFTROCE_HOSTS2")
            .split_whitespace()
            .map(String::from)
            .collect();
        let dev2 = env("SOFTROCE_IBDEV2");
        let total = a.cluster_bytes;
        let schemes = schemes(&dev2);
        let mut port = 20000u16;
        let mut cells = vec![vec![Vec::new(); schemes.len()]; a.sizes.len()];
        if a.table {
            for round in 0..a.rounds {
                for (si, &size) in a.sizes.iter().enumerate() {
                    for (ci, (_, rails, policy)) in schemes.iter().enumerate() {
                        port += 1;
                        let mut cfg = config(rails, policy.clone());
                        if ci == 0 {
                            cfg = cfg.with_zero_copy_push(Some(0));
                        }
                        let addr = format!("{}:{port}", hosts[1]);
                        if node == 0 {
                            send(connect(&addr, &cfg)?, size, total, None)?;
                        } else {
                            let l = RdmaListener::bind_with(addr.as_str(), cfg)?;
                            let mut b = l.accept()?;
                            // The second half of the cell: past the adaptive weights'
                            // first steps from equal weights (reported by the trace).
                            let mut buf = vec![0u8; size];
                            let mut got = 0;
                            let mut half = None;
                            while got < total {
                                got += b.get(&mut [IoSliceMut::new(&mut buf)])?;
                                if got >= total / 2 && half.is_none() {
                                    half = Some((Instant::now(), got));
                                }
                            }
                            let (t, at) = half.expect("half of the cell");
                            cells[si][ci]
                                .push((total - at) as f64 / t.elapsed().as_secs_f64() / 1e6);
                        }
                    }
                }
                if node == 1 {
                    eprintln!("round {} of {} done", round + 1, a.rounds);
                }
            }
            if node == 1 {
                println!(
                    "\nmultirail striping between two Soft-RoCE VMs, rxe0 on a link limited to {} and \
                     rxe1 on one limited to {} (tc): {} round(s), medians, MB/s over the second \
                     half of {total} bytes a cell (4 lent buffers in flight)",
                    std::env::var("RCH_BENCH_RATE").unwrap_or_default(),
                    std::env::var("RCH_BENCH_RATE2").unwrap_or_default(),
                    a.rounds
                );
                print!("| size |");
                for (name, _, _) in &schemes {
                    print!(" {name} |");
                }
                println!(" adaptive / best static | adaptive / one rail |");
                println!("| ---: |{}", " ---: |".repeat(schemes.len() + 2));
                for (si, size) in a.sizes.iter().enumerate() {
                    let meds: Vec<f64> = (0..schemes.len())
                        .map(|ci| median(&mut cells[si][ci].clone()))
                        .collect();
                    print!("| {size} |");
                    for m in &meds {
                        print!(" {m:.2} |");
                    }
                    println!(
                        " {:.3} | {:.2} |",
                        meds[3] / meds[1].max(meds[2]),
                        meds[3] / meds[0]
                    );
                }
            }
        }
        if a.trace {
            // The best split while a second connection streams over rxe1's link:
            // each split on a new connection, measured over `secs` after a second.
            let splits = [
                ("rxe0 only (1:0)", StripePolicy::Weights(vec![1, 0])),
                ("8:1", StripePolicy::Weights(vec![8, 1])),
                ("4:1", StripePolicy::Weights(vec![4, 1])),
                ("adaptive", StripePolicy::default()),
            ];
            let mut got = vec![Vec::new(); splits.len()];
            for (si, (_, policy)) in splits
                .iter()
                .enumerate()
                .cycle()
                .take(a.rounds * splits.len())
            {
                port += 2;
                let main_addr = format!("{}:{port}", hosts[1]);
                let rival_addr = format!("{}:{}", hosts2[1], port + 1);
                let main_cfg = config(&format!(",{dev2}"), policy.clone());
                let rival_cfg = config("1", StripePolicy::Even);
                let window = 1.0 + a.secs.max(4.0);
                if node == 0 {
                    let stop = AtomicBool::new(false);
                    thread::scope(|s| -> std::io::Result<()> {
                        let rival = s.spawn(|| {
                            send(
                                connect(&rival_addr, &rival_cfg)?,
                                1 << 20,
                                usize::MAX,
                                Some(&stop),
                            )
                        });
                        let main = s.spawn(|| {
                            send(
                                connect(&main_addr, &main_cfg)?,
                                1 << 20,
                                usize::MAX,
                                Some(&stop),
                            )
                        });
                        thread::sleep(Duration::from_secs_f64(window + 1.0));
                        stop.store(true, Ordering::Relaxed);
                        main.join().expect("main")?;
                        rival.join().expect("rival")
                    })?;
                } else {
                    let ml = RdmaListener::bind_with(main_addr.as_str(), main_cfg)?;
                    let rl = RdmaListener::bind_with(rival_addr.as_str(), rival_cfg)?;
                    let rival = thread::spawn(move || -> std::io::Result<()> {
                        let mut r = rl.accept()?;
                        let mut buf = vec![0u8; 1 << 20];
                        while let Ok(n) = std::io::Read::read(&mut r, &mut buf) {
                            if n == 0 {
                                break;
                            }
                        }
                        Ok(())
                    });
                    let mut m = ml.accept()?;
                    let mut buf = vec![0u8; 1 << 20];
                    let t0 = Instant::now();
                    let (mut got_bytes, mut from, mut measured) = (0u64, None, None);
                    loop {
                        match std::io::Read::read(&mut m, &mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => got_bytes += n as u64,
                        }
                        let t = t0.elapsed().as_secs_f64();
                        if t >= 1.0 && from.is_none() {
                            from = Some((t, got_bytes));
                        }
                        if let (true, None, Some((t1, b1))) = (t >= window, measured, from) {
                            measured = Some((got_bytes - b1) as f64 / (t - t1) / 1e6);
                        }
                    }
                    got[si].push(measured.unwrap_or(f64::NAN));
                    drop(m);
                    rival.join().expect("rival")?;
                }
            }
            if node == 1 {
                println!(
                    "\nwhile a second connection streams 1 MiB messages over rxe1's link: 1 MiB \
                     messages over both links, MB/s from 1 s to {:.0} s of each connection ({} \
                     round(s), medians)",
                    1.0 + a.secs.max(4.0),
                    a.rounds
                );
                println!("| split | MB/s | rounds |");
                println!("| --- | ---: | --- |");
                let mut meds = Vec::new();
                for ((name, _), v) in splits.iter().zip(&got) {
                    let m = median(&mut v.clone());
                    let all: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
                    println!("| {name} | {m:.2} | {} |", all.join(" "));
                    meds.push(m);
                }
                let best = meds[..3].iter().copied().fold(0.0, f64::max);
                println!("| adaptive / best static | {:.3} | |", meds[3] / best);
            }
        }
        if a.trace {
            port += 10;
            let main_addr = format!("{}:{port}", hosts[1]);
            let rival_addr = format!("{}:{}", hosts2[1], port + 1);
            let main_cfg = config(&format!(",{dev2}"), StripePolicy::default());
            let rival_cfg = config("1", StripePolicy::Even);
            let size = 1 << 20;
            if node == 0 {
                let stop = AtomicBool::new(false);
                let rival_stop = AtomicBool::new(false);
                thread::scope(|s| -> std::io::Result<()> {
                    let main = s.spawn(|| {
                        send(
                            connect(&main_addr, &main_cfg)?,
                            size,
                            usize::MAX,
                            Some(&stop),
                        )
                    });
                    thread::sleep(Duration::from_secs_f64(a.compete_from));
                    let rival = s.spawn(|| {
                        send(
                            connect(&rival_addr, &rival_cfg)?,
                            size,
                            usize::MAX,
                            Some(&rival_stop),
                        )
                    });
                    thread::sleep(Duration::from_secs_f64(a.compete_to - a.compete_from));
                    rival_stop.store(true, Ordering::Relaxed);
                    rival.join().expect("rival")?;
                    thread::sleep(Duration::from_secs_f64(
                        (a.trace_secs - a.compete_to).max(0.0),
                    ));
                    stop.store(true, Ordering::Relaxed);
                    main.join().expect("main")
                })?;
            } else {
                let ml = RdmaListener::bind_with(main_addr.as_str(), main_cfg)?;
                let rl = RdmaListener::bind_with(rival_addr.as_str(), rival_cfg)?;
                // The rival's bytes, and when its first and last data came, its end
                // of stream came, and its drop returned.
                let rival = thread::spawn(move || -> std::io::Result<(u64, [Instant; 4])> {
                    let mut r = rl.accept()?;
                    let mut buf = vec![0u8; 1 << 20];
                    let mut got = 0u64;
                    let (mut first, mut last) = (None, Instant::now());
                    loop {
                        match std::io::Read::read(&mut r, &mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                got += n as u64;
                                last = Instant::now();
                                first.get_or_insert(last);
                            }
                        }
                    }
                    let eof = Instant::now();
                    drop(r);
                    Ok((got, [first.unwrap_or(last), last, eof, Instant::now()]))
                });
                let mut m = ml.accept()?;
                let t0 = Instant::now();
                let mut buf = vec![0u8; size];
                let mut rows: Trace = Vec::new();
                let (mut got, mut last_t, mut last_got) = (0u64, 0.0, 0u64);
                loop {
                    match std::io::Read::read(&mut m, &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n as u64,
                    }
                    let t = t0.elapsed().as_secs_f64();
                    if t - last_t >= 0.5 {
                        let w0 = m.channel().receiver().stripe_weights()[0];
                        rows.push((t, (got - last_got) as f64 / (t - last_t) / 1e6, w0));
                        (last_t, last_got) = (t, got);
                    }
                }
                let (rival_bytes, ends) = rival.join().expect("rival")?;
                let at = |i: Instant| i.saturating_duration_since(t0).as_secs_f64();
                println!(
                    "\nthe competing connection's first data came at {:.2} s, its last at {:.2} s, \
                     its end of stream at {:.2} s, its receiving end was dropped by {:.2} s",
                    at(ends[0]),
                    at(ends[1]),
                    at(ends[2]),
                    at(ends[3])
                );
                println!(
                    "\ntrace between the VMs, adaptive striping: 1 MiB messages over rxe0 and rxe1; a \
                     second connection streams over rxe1's link from {:.0} s to {:.0} s ({:.1} MB in all)",
                    a.compete_from,
                    a.compete_to,
                    rival_bytes as f64 / 1e6
                );
                println!("| t (s) | MB/s | rxe0's weight |");
                println!("| ---: | ---: | ---: |");
                for (t, mbps, w0) in &rows {
                    println!("| {t:.1} | {mbps:.2} | {w0:.3} |");
                }
                if let Some(path) = &a.svg {
                    let series = vec![("adaptive".to_string(), rows)];
                    let caption = format!(
                        "Multirail between two Soft-RoCE VMs (rxe0 and rxe1 links, tc-limited); competing flow on rxe1's link started at {:.0} s (first data {:.1} s), stopped at {:.0} s (last data {:.1} s)",
                        a.compete_from, at(ends[0]), a.compete_to, at(ends[1])
                    );
                    plot(path, &caption, a.trace_secs, &series)
                        .map_err(|e| std::io::Error::other(e.to_string()))?;
                }
            }
        }
        Ok(())
    }
}

fn main() -> std::io::Result<()> {
    let a = args();
    if a.cluster {
        return cluster::run(&a);
    }
    if a.table {
        table(&a)?;
    }
    if a.trace {
        competing_table(&a)?;
        let series = trace(&a)?;
        if let Some(path) = &a.svg {
            let caption = format!(
                "Multirail, emulated 400 + 100 MB/s rails, 4 MiB messages; competing flow on the 100 MB/s rail {:.0}-{:.0} s",
                a.compete_from, a.compete_to
            );
            plot(path, &caption, a.trace_secs, &series)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            println!("\nwrote {path}");
        }
    }
    Ok(())
}
