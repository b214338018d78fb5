//! Checks that keep what the repository says about itself true: the layer order
//! that ARCHITECTURE.md declares against the code's `crate::` paths, and the one
//! home of the environment variables (`src/settings.rs`) against the code and the
//! README's table. They read the sources; nothing runs.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The code of a source file: comments (and so doc comments) blanked, and unit-test
/// modules (`#[cfg(test)]` before `mod name {`) left out up to their closing brace.
fn code_of(text: &str) -> String {
    let lines: Vec<String> = text.lines().map(strip_comment).collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        let is_test_mod = lines[i].trim() == "#[cfg(test)]"
            && lines.get(i + 1).is_some_and(|n| {
                let n = n.trim_start();
                (n.starts_with("mod ") || n.starts_with("pub mod ")) && n.ends_with('{')
            });
        if !is_test_mod {
            out.push_str(&lines[i]);
            out.push('\n');
            i += 1;
            continue;
        }
        // Skip to the line where the module's braces balance.
        let mut depth = 0i64;
        i += 1;
        while i < lines.len() {
            depth += lines[i].matches('{').count() as i64;
            depth -= lines[i].matches('}').count() as i64;
            i += 1;
            if depth <= 0 {
                break;
            }
        }
    }
    out
}

/// A line without its `//` comment (one that is not inside a string, such as a URL).
fn strip_comment(line: &str) -> String {
    let b = line.as_bytes();
    let mut in_str = false;
    for j in 0..b.len() {
        match b[j] {
            b'"' if j == 0 || b[j - 1] != b'\\' => in_str = !in_str,
            b'/' if !in_str && b.get(j + 1) == Some(&b'/') => return line[..j].to_string(),
            _ => {}
        }
    }
    line.to_string()
}

/// The top-level modules a piece of code names through `crate::` paths, with
/// `crate::{a, b::c}` groups opened.
fn crate_modules(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        // `$crate::` in a macro names the crate from outside: not an import here.
        let before = &rest[..at];
        rest = &rest[at + "crate::".len()..];
        if before.ends_with('$') || before.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut start) = (0, 0);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        found.insert(ident(&group[start..i]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.insert(ident(&group[start..i]));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident(rest));
        }
    }
    found.remove("");
    found
}

/// The lines of a document after the first one `is_marker` picks; a document
/// without one fails the test, naming `what` it should hold.
fn lines_after<'a>(
    text: &'a str,
    is_marker: impl Fn(&str) -> bool,
    what: &str,
) -> std::str::Lines<'a> {
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|l| is_marker(l))
        .unwrap_or_else(|| panic!("the document holds no {what}"));
    lines
}

/// The layer order ARCHITECTURE.md declares: the line after "layer order, top to
/// bottom" in its layers section, module names separated by blanks.
fn declared_order() -> Vec<String> {
    let text = fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    lines_after(
        &text,
        |l| l.contains("layer order, top to bottom"),
        "the layer order",
    )
    .next()
    .expect("the order follows its heading")
    .split_whitespace()
    .map(str::to_string)
    .collect()
}

/// The top-level module a file of `src/` belongs to (`src/engine/zerocopy/send.rs`
/// -> `engine`); `None` for the crate root and the binaries.
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(root().join("src")).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (name != "lib" && name != "bin").then_some(name)
}

/// Paths that run up against `order` (highest first): `file: module -> module`.
fn upward_imports(order: &[String], files: &[(PathBuf, String)]) -> Vec<String> {
    let rank = |m: &str| order.iter().position(|o| o == m);
    let mut bad = Vec::new();
    for (file, code) in files {
        let Some(me) = module_of(file) else { continue };
        let mine = rank(&me).unwrap_or_else(|| {
            panic!(
                "{}: module `{me}` is not in ARCHITECTURE.md's layer order",
                file.display()
            )
        });
        for used in crate_modules(code) {
            let theirs = rank(&used).unwrap_or_else(|| {
                panic!(
                    "{}: `crate::{used}` is not in the layer order",
                    file.display()
                )
            });
            // Lower in the list is lower in the stack: a module uses those below it.
            if theirs < mine {
                bad.push(format!("{}: {me} -> {used}", file.display()));
            }
        }
    }
    bad
}

fn sources() -> Vec<(PathBuf, String)> {
    rust_files(&root().join("src"))
        .into_iter()
        .map(|p| {
            let code = code_of(&fs::read_to_string(&p).unwrap());
            (p, code)
        })
        .collect()
}

#[test]
fn no_module_imports_a_layer_above_it() {
    let order = declared_order();
    let bad = upward_imports(&order, &sources());
    assert!(
        bad.is_empty(),
        "imports against ARCHITECTURE.md's layer order ({}):\n{}",
        order.join(" > "),
        bad.join("\n")
    );
}

#[test]
fn the_check_sees_an_upward_import() {
    // The same check over a made-up file of the ring layer that names the stream, in
    // each of the forms the parser opens; and over a comment, which does not count.
    let order = declared_order();
    let ring = root().join("src/ring/made_up.rs");
    for code in [
        "use crate::stream::RdmaStream;",
        "use crate::{fabric::Fabric, stream};",
        "fn f() { let _ = crate::stream::RdmaStream::pair(); }",
    ] {
        let bad = upward_imports(&order, &[(ring.clone(), code_of(code))]);
        assert_eq!(bad.len(), 1, "{code}: {bad:?}");
        assert!(bad[0].ends_with("ring -> stream"), "{bad:?}");
    }
    // After a unit-test module, code counts again; inside it, it does not.
    let after = "#[cfg(test)]\nmod tests {\n    use crate::stream::X;\n}\nuse crate::stream::Y;";
    let bad = upward_imports(&order, &[(ring.clone(), code_of(after))]);
    assert_eq!(bad.len(), 1, "{bad:?}");
    let inside = "#[cfg(test)]\nmod tests {\n    fn f() { if true { crate::stream::g(); } }\n}";
    assert!(upward_imports(&order, &[(ring.clone(), code_of(inside))]).is_empty());
    let quiet = code_of("// see [`crate::stream`]\n/// [`x`](crate::stream::RdmaStream)");
    assert!(upward_imports(&order, &[(ring, quiet)]).is_empty());
}

#[test]
fn every_module_is_in_the_declared_order() {
    let order = declared_order();
    let mut modules: BTreeSet<String> = rust_files(&root().join("src"))
        .iter()
        .filter_map(|f| module_of(f))
        .collect();
    modules.retain(|m| !order.contains(m));
    assert!(modules.is_empty(), "not in the layer order: {modules:?}");
}

#[test]
fn only_the_settings_module_reads_the_environment() {
    let mut bad = Vec::new();
    for (file, code) in sources() {
        if file.ends_with("src/settings.rs") {
            continue;
        }
        for needle in ["env::var", "var_os(", "getenv"] {
            if code.contains(needle) {
                bad.push(format!("{}: {needle}", file.display()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "environment read outside src/settings.rs:\n{}",
        bad.join("\n")
    );
}

/// The variables of the README's configuration table: the backquoted names in the
/// first cell of each row after its `| variable |` header, up to the first line that
/// is not a row.
fn readme_variables() -> BTreeSet<String> {
    let text = fs::read_to_string(root().join("README.md")).unwrap();
    let rows = lines_after(
        &text,
        |l| l.starts_with("| variable |"),
        "a table of variables",
    );
    let mut names = BTreeSet::new();
    for line in rows.skip(1).take_while(|l| l.starts_with('|')) {
        let first = line.split('|').nth(1).unwrap_or("");
        for (i, part) in first.split('`').enumerate() {
            if i % 2 == 1 {
                names.insert(part.to_string());
            }
        }
    }
    names
}

#[test]
fn the_readme_table_lists_every_variable_read_and_no_other() {
    let read: BTreeSet<String> = rdma_channel::settings::ALL
        .iter()
        .map(|s| s.name().to_string())
        .collect();
    assert_eq!(
        read.len(),
        rdma_channel::settings::ALL.len(),
        "a name listed twice"
    );
    let documented = readme_variables();
    let undocumented: Vec<_> = read.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&read).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "read but not in the README's table: {undocumented:?}; \
         in the table but never read: {stale:?}"
    );
}

#[test]
fn the_settings_parse_as_documented() {
    use rdma_channel::settings::parse_size;
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert_eq!(parse_size(" 64K ").unwrap(), 64 << 10);
    assert_eq!(parse_size("2g").unwrap(), 2 << 30);
    for bad in ["", "k", "-1", "1.5m", "99999999999999999999g"] {
        assert!(parse_size(bad).is_err(), "{bad:?}");
    }
}
