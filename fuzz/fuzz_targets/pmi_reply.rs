//! PMI-1 lines (`cmd=<name> key=value ...`), as the process manager sends them to
//! each process and as the launcher's server reads requests.
//!
//! Checks that a line longer than `MAX_LINE`, with a byte outside printable ASCII,
//! or not starting with `cmd=` is refused; that an accepted line has a non-empty
//! command and attribute names of letters, digits, `_`, `-` and `/`, with values in
//! printable ASCII; that formatting the message (escaping the values) and parsing
//! the result gives the same message; and that reading an attribute as an integer
//! succeeds exactly for a decimal of at most 18 digits, with its value.
#![no_main]

use std::io::ErrorKind;

use libfuzzer_sys::fuzz_target;
use rdma_channel::fuzzing::{pmi_format, pmi_int, pmi_parse, PMI_MAX_LINE};

fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-/".contains(&b))
}

fn int_ok(v: &str) -> Option<i64> {
    let digits = v.strip_prefix('-').unwrap_or(v);
    let ok = (1..=18).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| v.parse().expect("18 digits fit an i64"))
}

fuzz_target!(|data: &[u8]| {
    let m = match pmi_parse(data) {
        Ok(m) => m,
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidData);
            return;
        }
    };
    assert!(data.len() <= PMI_MAX_LINE);
    assert!(data.starts_with(b"cmd="));
    assert!(data.iter().all(|b| (0x20..0x7f).contains(b)));
    assert!(!m.cmd.is_empty());
    for (k, v) in &m.attrs {
        assert!(name_ok(k), "attribute name {k:?}");
        assert!(v.bytes().all(|b| (0x20..0x7f).contains(&b)), "value {v:?}");
    }

    // The command travels unescaped (it is never free text), so only a command
    // without spaces or backslashes can make the round trip.
    if !m.cmd.contains([' ', '\\']) {
        let line = pmi_format(&m);
        let line = line
            .strip_suffix('\n')
            .expect("a formatted line ends in \\n");
        if line.len() <= PMI_MAX_LINE {
            let again = pmi_parse(line.as_bytes()).expect("a formatted line parses");
            assert_eq!(again, m, "{line:?}");
        }
    }

    for (k, _) in m.attrs.iter().take(4) {
        let first = &m.attrs.iter().find(|(key, _)| key == k).unwrap().1;
        match pmi_int(data, k) {
            Ok(n) => assert_eq!(Some(n), int_ok(first), "{k}={first:?}"),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::InvalidData);
                assert_eq!(int_ok(first), None, "{k}={first:?} refused");
            }
        }
    }
});
