//! What `bench/runtime.rs` and `bench/farm.rs` share: seed 004's message sizes and
//! the way both read their positional arguments.

/// Seed 004's Table I message sizes (its Table II has the first seven).
pub const TABLE_SIZES: [usize; 10] = [
    10, 100, 1024, 5000, 10000, 25000, 50000, 65536, 200000, 400000,
];

/// The positional arguments (`cargo bench` adds `--bench`, which is skipped).
pub fn args() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect()
}

/// The sizes in `arg` (comma-separated), or [`TABLE_SIZES`].
pub fn sizes(arg: Option<&String>) -> Vec<usize> {
    arg.map(|s| s.split(',').map(|x| x.parse().expect("a size")).collect())
        .unwrap_or_else(|| TABLE_SIZES.to_vec())
}
