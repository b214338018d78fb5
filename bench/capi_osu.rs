//! The OSU-style C benchmark `bench/c/osu.c` (latency and bandwidth at the level of
//! the MPI-like layer `channel-tests/c/mm.c`, through the C interface `ffi/rch.h`):
//! compiled with the system C compiler against the crate's static library and run
//! with `rch-run -n 2`, so the numbers sit beside MPICH's and Open MPI's osu_latency
//! and osu_bw, and beside the channel's own (`cargo bench --bench pingpong`).
//!
//! ```text
//! cargo bench --bench capi_osu                        # 1 B .. 4 MiB
//! cargo bench --bench capi_osu -- --sizes 8,65536     # chosen sizes
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn main() {
    // cargo bench passes --bench; everything else goes to osu.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let exe = std::env::current_exe().expect("bench executable");
    let deps = exe.parent().expect("deps folder");
    let lib = [
        deps.join("librdma_channel.a"),
        deps.parent()
            .expect("profile folder")
            .join("librdma_channel.a"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .expect("librdma_channel.a is built with the benchmarks (crate-type staticlib)");
    let out_dir = deps.parent().expect("profile folder").join("capi");
    std::fs::create_dir_all(&out_dir).expect("build folder");
    let osu = out_dir.join("osu");
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args(["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-I{ROOT}/ffi"))
        .arg(format!("-I{ROOT}/channel-tests/c"))
        .arg(Path::new(ROOT).join("bench/c/osu.c"))
        .arg(Path::new(ROOT).join("channel-tests/c/mm.c"))
        .arg("-o")
        .arg(&osu)
        .arg(&lib);
    if cfg!(feature = "verbs") {
        cc.args(["-libverbs", "-lrdmacm"]);
    }
    cc.args([
        "-lgcc_s",
        "-lutil",
        "-lrt",
        "-lpthread",
        "-lm",
        "-ldl",
        "-lc",
    ]);
    let status = cc.status().expect("run the C compiler");
    assert!(status.success(), "compiling bench/c/osu.c failed");
    let launcher = PathBuf::from(env!("CARGO_BIN_EXE_rch-run"));
    let status = Command::new(launcher)
        .args(["-n", "2"])
        .arg(&osu)
        .args(&args)
        .status()
        .expect("run rch-run");
    std::process::exit(status.code().unwrap_or(1));
}
