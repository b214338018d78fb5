//! Build script. The C ABI (issue: the C channel) will run bindgen on `ffi/rch.h` here;
//! until then it only tells cargo that nothing outside this file affects the build.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
