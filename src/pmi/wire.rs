//! The PMI-1 line format, shared by the client and the launcher's server.
//!
//! A message is one line of ASCII ending in `\n`: `cmd=<name>` followed by
//! space-separated `key=value` attributes. Attribute names are letters, digits, `_`,
//! `-` and `/`; a value runs to the next space, and a backslash makes the character
//! after it literal (MPICH 4.1 and later escape spaces that way; we only ever need it
//! for the free-text `msg`/`message` attributes). PMI-1's multi-line `mcmd=` form
//! (used only by `spawn`) is not supported.

use std::fmt::Write as _;
use std::io;

/// Longest line either side accepts, in bytes (the `\n` excluded).
pub(crate) const MAX_LINE: usize = 64 * 1024;

/// One parsed PMI-1 message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    /// The value of `cmd=`.
    pub cmd: String,
    /// The other attributes, in order of appearance.
    pub attrs: Vec<(String, String)>,
}

impl Message {
    /// The first value of attribute `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Attribute `key`, which must be present.
    pub fn require(&self, key: &str) -> io::Result<&str> {
        self.get(key).ok_or_else(|| {
            invalid_data(format!(
                "PMI message cmd={} lacks the attribute '{key}'",
                self.cmd
            ))
        })
    }

    /// Attribute `key` as an integer, which must be present.
    pub fn require_int(&self, key: &str) -> io::Result<i64> {
        let v = self.require(key)?;
        parse_int(v).ok_or_else(|| {
            invalid_data(format!(
                "PMI message cmd={}: attribute {key}='{v}' is not an integer",
                self.cmd
            ))
        })
    }

    /// Attribute `key` as an integer, or `default` when absent.
    pub fn int_or(&self, key: &str, default: i64) -> io::Result<i64> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.require_int(key),
        }
    }
}

fn parse_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || digits.len() > 18 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

pub(crate) fn invalid_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// A line shortened for an error message.
pub(crate) fn excerpt(line: &[u8]) -> String {
    const SHOW: usize = 120;
    let shown = &line[..line.len().min(SHOW)];
    let mut s = String::new();
    for &b in shown {
        if (0x20..0x7f).contains(&b) {
            s.push(b as char);
        } else {
            let _ = write!(s, "\\x{b:02x}");
        }
    }
    if line.len() > SHOW {
        let _ = write!(s, "... ({} bytes)", line.len());
    }
    s
}

fn is_attr_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'/'
}

/// Parses one line (without its `\n`).
///
/// # Errors
///
/// `InvalidData` naming the fault and showing the line: not `cmd=` first, a byte
/// outside printable ASCII, a malformed attribute name, an empty command.
pub(crate) fn parse(line: &[u8]) -> io::Result<Message> {
    let bad = |why: &str| invalid_data(format!("malformed PMI line ({why}): '{}'", excerpt(line)));
    if line.len() > MAX_LINE {
        return Err(bad("too long"));
    }
    if let Some(&b) = line.iter().find(|&&b| !(0x20..0x7f).contains(&b)) {
        return Err(bad(&format!("byte 0x{b:02x} is not printable ASCII")));
    }
    if !line.starts_with(b"cmd=") {
        return Err(bad("it does not start with cmd="));
    }
    let mut attrs: Vec<(String, String)> = Vec::new();
    let mut i = 0;
    while i < line.len() {
        if line[i] == b' ' {
            i += 1;
            continue;
        }
        let name_start = i;
        while i < line.len() && is_attr_name_byte(line[i]) {
            i += 1;
        }
        if i == name_start {
            return Err(bad(&format!(
                "'{}' cannot start an attribute name",
                line[i] as char
            )));
        }
        let name = String::from_utf8_lossy(&line[name_start..i]).into_owned();
        let mut value = String::new();
        if i < line.len() && line[i] == b'=' {
            i += 1;
            while i < line.len() && line[i] != b' ' {
                if line[i] == b'\\' && i + 1 < line.len() {
                    i += 1;
                }
                value.push(line[i] as char);
                i += 1;
            }
        } else if i < line.len() && line[i] != b' ' {
            return Err(bad(&format!(
                "'{}' after the attribute name '{name}'",
                line[i] as char
            )));
        }
        attrs.push((name, value));
    }
    let (_, cmd) = attrs.remove(0);
    if cmd.is_empty() {
        return Err(bad("empty command"));
    }
    Ok(Message { cmd, attrs })
}

/// Formats a message as a line ending in `\n`. Values are escaped where needed.
pub(crate) fn format(cmd: &str, attrs: &[(&str, &str)]) -> String {
    let mut s = format!("cmd={cmd}");
    for (k, v) in attrs {
        s.push(' ');
        s.push_str(k);
        s.push('=');
        push_escaped(&mut s, v);
    }
    s.push('\n');
    s
}

/// Appends `v`, with a backslash before spaces and backslashes and with other bytes
/// outside printable ASCII replaced by `?` (free text only: keys and values checked
/// by [`check_token`] never need either).
pub(crate) fn push_escaped(s: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            ' ' | '\\' => {
                s.push('\\');
                s.push(c);
            }
            '\x21'..='\x7e' => s.push(c),
            _ => s.push('?'),
        }
    }
}

/// Checks a KVS key or value that must travel unescaped: non-empty, printable ASCII
/// without space or backslash (and without `=` in a key), at most `max` bytes.
///
/// # Errors
///
/// `InvalidInput` saying which rule `token` breaks.
pub(crate) fn check_token(what: &str, token: &str, max: usize) -> io::Result<()> {
    let bad = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("PMI {what} '{}' {why}", excerpt(token.as_bytes())),
        )
    };
    if token.is_empty() {
        return Err(bad("is empty".into()));
    }
    if token.len() > max {
        return Err(bad(format!(
            "is {} bytes long; the process manager accepts at most {max}",
            token.len()
        )));
    }
    if let Some(b) = token
        .bytes()
        .find(|&b| !(0x21..0x7f).contains(&b) || b == b'\\' || (what == "key" && b == b'='))
    {
        return Err(bad(format!(
            "contains byte 0x{b:02x}; only printable ASCII without space or backslash{} may be used",
            if what == "key" { " or '='" } else { "" }
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_attributes_in_order() {
        let m = parse(b"cmd=get_result rc=0 msg=success value=a=b").unwrap();
        assert_eq!(m.cmd, "get_result");
        assert_eq!(m.get("rc"), Some("0"));
        assert_eq!(m.get("value"), Some("a=b"));
        assert_eq!(m.require_int("rc").unwrap(), 0);
    }

    #[test]
    fn unescapes_and_round_trips() {
        let line = format("abort", &[("exitcode", "3"), ("message", "a b\\c")]);
        assert_eq!(line, "cmd=abort exitcode=3 message=a\\ b\\\\c\n");
        let m = parse(line.trim_end().as_bytes()).unwrap();
        assert_eq!(m.get("message"), Some("a b\\c"));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            &b"hello"[..],
            b"cmd=",
            b"cmd=x \xff",
            b"cmd=x =y",
            b"cmd=x a#b=1",
            b"cmd=x\ty=1",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        }
        assert!(parse(b"cmd=x n=abc").unwrap().require_int("n").is_err());
        assert!(parse(b"cmd=x").unwrap().require("n").is_err());
    }

    #[test]
    fn checks_tokens() {
        assert!(check_token("key", "card#3", 64).is_ok());
        assert!(check_token("value", "a=b", 64).is_ok());
        for (what, t) in [
            ("key", ""),
            ("key", "a b"),
            ("key", "a=b"),
            ("value", "x\\y"),
        ] {
            assert_eq!(
                check_token(what, t, 64).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
        }
        assert!(check_token("key", "abcd", 3).is_err());
    }
}
