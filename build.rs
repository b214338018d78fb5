//! Build script: generates the Rust view of the C interface from `ffi/rch.h`.
//!
//! The header is the source of truth. bindgen turns its types (`rch_status`,
//! `rch_exchange`, `struct iovec`, the opaque `rch_vc`) and its function declarations
//! into `$OUT_DIR/rch_sys.rs`, which `src/ffi/` includes; the exports there are checked
//! against the generated declarations at compile time, and their struct layouts with
//! static_assertions and memoffset.
//!
//! bindgen needs libclang (`apt-get install libclang-dev`, as `scripts/test` does).

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=ffi/rch.h");
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");

    let header = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"))
        .join("ffi")
        .join("rch.h");
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_function("rch_.*")
        .allowlist_type("rch_.*")
        .allowlist_var("RCH_.*")
        .constified_enum_module("rch_status")
        // The documentation lives in the header; comments copied into Rust would turn
        // its examples into doc-tests.
        .generate_comments(false)
        // Layouts are checked by hand (src/ffi/sys.rs), against libc and std too.
        .layout_tests(false)
        .derive_default(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "bindgen could not process {}: {e:?}\n\
                 (bindgen needs libclang: apt-get install libclang-dev)",
                header.display()
            )
        });
    let out = PathBuf::from(env::var("OUT_DIR").expect("set by cargo")).join("rch_sys.rs");
    bindings
        .write_to_file(&out)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
}
