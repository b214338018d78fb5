//! Hello cards (`rch4,<fabric>,<pid>,<socket>,<host>,<ip:port or ->,<doorbell or ->,<cpus or ->`):
//! what every process of a group publishes through the process manager's key-value
//! store, and what a peer decodes to find it.
//!
//! Checks that a refused card comes with a reason, and that an accepted card
//! encodes to the canonical text: `rch4` and seven more comma-separated fields, in
//! printable ASCII without spaces or `=` (so that any key-value store carries it),
//! which decodes to the same fields (the canonical text is a fixed point).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_channel::fuzzing::hello_card;

fuzz_target!(|data: &[u8]| {
    let text = match hello_card(data) {
        Ok(t) => t,
        Err(why) => {
            assert!(!why.is_empty());
            return;
        }
    };
    let fields: Vec<&str> = text.split(',').collect();
    assert_eq!(fields.len(), 8, "{text:?}");
    assert_eq!(fields[0], "rch4");
    assert!(["emulated", "verbs"].contains(&fields[1]), "{text:?}");
    assert!(fields[2].parse::<u32>().is_ok(), "{text:?}");
    // The CPU list is "-" or ranges and single CPUs joined by '.', ascending.
    assert!(
        fields[7] == "-"
            || fields[7]
                .split('.')
                .all(|r| !r.is_empty() && r.bytes().all(|c| c.is_ascii_digit() || c == b'-')),
        "{text:?}"
    );
    assert!(
        text.bytes().all(|c| c.is_ascii_graphic() && c != b'='),
        "{text:?} cannot travel in a key-value store"
    );
    assert_eq!(hello_card(text.as_bytes()), Ok(text.clone()));
});
