//! The library's top-level modules form layers, not circles: no module may reach itself
//! through `crate::` paths, and the boundaries the architecture names hold (the agent
//! loop talks to Kubernetes only through `ports`, which Kubernetes implements). A new
//! circle fails here with the file and line of every edge that closes it.
//!
//! The reader is deliberately plain: it strips comments and string literals, then follows
//! `crate::x` and `super::` paths (including grouped `use crate::{a, b}` imports) from
//! every file under `src/` that belongs to the library.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Edges the architecture forbids even where they would not close a circle.
const FORBIDDEN: &[(&str, &str, &str)] = &[
    (
        "agent",
        "kubernetes",
        "the agent loop uses ports; Kubernetes implements them",
    ),
    (
        "kubernetes",
        "agent",
        "Kubernetes implements ports; it does not drive the agent",
    ),
    (
        "config",
        "signals",
        "the config model names signals through signal_names",
    ),
    (
        "ports",
        "kubernetes",
        "ports are the low side of the boundary",
    ),
    ("ports", "agent", "ports are the low side of the boundary"),
];

/// One `crate::` reference from a module to another: where it is written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Site {
    file: String,
    line: usize,
}

type Graph = BTreeMap<String, BTreeMap<String, Vec<Site>>>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The library's top-level modules, as `lib.rs` declares them.
fn top_level_modules() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("src/lib.rs");
    let modules: BTreeSet<String> = strip_comments_and_strings(&lib)
        .lines()
        .filter_map(declared_module)
        .collect();
    // Every file and directory beside lib.rs must be one of them (or the binary's), so a
    // module the reader failed to see cannot hide a circle.
    for entry in std::fs::read_dir(src()).expect("read src") {
        let path = entry.expect("dir entry").path();
        let name = path.file_stem().unwrap_or_default().to_string_lossy();
        let is_module = path.is_dir() || path.extension().is_some_and(|e| e == "rs");
        if is_module && !["lib", "main", "cli"].contains(&name.as_ref()) {
            assert!(
                modules.contains(name.as_ref()),
                "{} is not among the modules read from src/lib.rs: {modules:?}",
                path.display()
            );
        }
    }
    modules
}

/// The module a line of `lib.rs` declares: `mod x;`, `pub mod x;`, `pub(crate) mod x {`,
/// after any attributes on the same line, with `r#` dropped.
fn declared_module(line: &str) -> Option<String> {
    let mut line = line.trim();
    while line.starts_with("#[") {
        line = line[line.find(']')? + 1..].trim_start();
    }
    if let Some(rest) = line.strip_prefix("pub") {
        line = rest.trim_start();
        if line.starts_with('(') {
            line = line[line.find(')')? + 1..].trim_start();
        }
    }
    let name = line.strip_prefix("mod ")?.trim_start();
    let name = name.strip_prefix("r#").unwrap_or(name);
    let end = name
        .bytes()
        .position(|b| !is_ident_byte(b))
        .unwrap_or(name.len());
    (end > 0).then(|| name[..end].to_string())
}

/// Blank out comments, string and char literals (keeping line breaks), so paths in
/// docs, messages and test data are not taken for imports.
fn strip_comments_and_strings(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, byte: u8| out.push(if byte == b'\n' { '\n' } else { ' ' });
    while i < bytes.len() {
        let rest = &bytes[i..];
        if rest.starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            while i < bytes.len() {
                if bytes[i..].starts_with(b"/*") {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if bytes[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, bytes[i]);
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(rest) {
            // r"…", r#"…"#, br"…": ends at a quote followed by as many hashes.
            let open = rest.iter().position(|&b| b == b'"').unwrap_or(0) + 1;
            for &byte in &rest[..open] {
                blank(&mut out, byte);
            }
            i += open;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            while i < bytes.len() && !bytes[i..].starts_with(&close) {
                blank(&mut out, bytes[i]);
                i += 1;
            }
            for _ in 0..close.len().min(bytes.len() - i) {
                out.push(' ');
                i += 1;
            }
        } else if bytes[i] == b'"' {
            out.push(' ');
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                if bytes[i] == b'\\' && i + 1 < bytes.len() {
                    blank(&mut out, bytes[i]);
                    i += 1;
                }
                blank(&mut out, bytes[i]);
                i += 1;
            }
            if i < bytes.len() {
                out.push(' ');
                i += 1;
            }
        } else if bytes[i] == b'\'' && is_char_literal(rest) {
            // An escape (`'\\'`, `'\u{1F600}'`) ends at the first quote after its second
            // character; anything else is one character between two quotes.
            let length = if rest[1] == b'\\' {
                rest.iter()
                    .skip(3)
                    .position(|&b| b == b'\'')
                    .map_or(rest.len(), |at| at + 4)
            } else {
                let width = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                width + 2
            };
            for &byte in &rest[..length] {
                blank(&mut out, byte);
            }
            i += length;
        } else {
            // Copy one whole UTF-8 character.
            let width = text[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&text[i..i + width]);
            i += width;
        }
    }
    out
}

/// `r"`, `r#"`, `br"` …: the number of hashes, when a raw string starts here.
fn raw_string_start(rest: &[u8]) -> Option<usize> {
    let after_b = rest.strip_prefix(b"b").unwrap_or(rest);
    let after_r = after_b.strip_prefix(b"r")?;
    let hashes = after_r.iter().take_while(|&&b| b == b'#').count();
    (after_r.get(hashes) == Some(&b'"')).then_some(hashes)
}

/// `'a'` or `'\n'`, not a lifetime like `'a` or `'static`.
fn is_char_literal(rest: &[u8]) -> bool {
    match rest.get(1) {
        Some(b'\\') => true,
        Some(_) => {
            // One character (possibly multi-byte) then a closing quote.
            let text = std::str::from_utf8(&rest[1..rest.len().min(6)]).unwrap_or("");
            let mut chars = text.chars();
            chars.next();
            chars.next() == Some('\'')
        }
        None => false,
    }
}

/// The module path a file defines: `src/agent/cycle.rs` is `["agent", "cycle"]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

fn is_ident_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// The identifier starting at `at`.
fn ident_at(code: &str, at: usize) -> &str {
    let at = if code[at..].starts_with("r#") {
        at + 2
    } else {
        at
    };
    if code[at..].starts_with('*') {
        return "*";
    }
    let end = code[at..]
        .bytes()
        .position(|b| !is_ident_byte(b))
        .map_or(code.len(), |n| at + n);
    &code[at..end]
}

/// The brace spans of inline modules (`mod tests { … }`), from `{` to its `}`.
fn inline_module_spans(code: &str) -> Vec<(usize, usize)> {
    let bytes = code.as_bytes();
    let mut spans = Vec::new();
    let mut search = 0;
    while let Some(offset) = code[search..].find("mod ") {
        let start = search + offset;
        search = start + "mod ".len();
        if start > 0 && is_ident_byte(bytes[start - 1]) {
            continue;
        }
        let name_at = skip_space(code, search);
        let name = ident_at(code, name_at);
        let after = skip_space(code, name_at + name.len());
        if name.is_empty() || !code[after..].starts_with('{') {
            continue;
        }
        let mut depth = 0usize;
        for (index, &byte) in bytes.iter().enumerate().skip(after) {
            match byte {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        spans.push((after, index));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    spans
}

fn skip_space(code: &str, mut at: usize) -> usize {
    while code[at..].starts_with(|c: char| c.is_whitespace()) {
        at += 1;
    }
    at
}

/// The top-level modules named right after position `at` (just past `crate::`): one
/// identifier, or each first segment of a `{a::x, b}` group.
fn first_segments(code: &str, at: usize) -> Vec<(String, usize)> {
    let at = skip_space(code, at);
    if code[at..].starts_with('{') {
        let mut names = Vec::new();
        let mut depth = 0;
        let mut expect_name = true;
        for (offset, ch) in code[at..].char_indices() {
            let here = at + offset;
            match ch {
                '{' => {
                    depth += 1;
                    expect_name = depth == 1;
                }
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ',' if depth == 1 => expect_name = true,
                c if expect_name
                    && depth == 1
                    && (c.is_ascii_alphabetic() || c == '_' || c == '*') =>
                {
                    names.push((ident_at(code, here).to_string(), here));
                    expect_name = false;
                }
                c if c.is_whitespace() => {}
                _ if depth == 1 => expect_name = false,
                _ => {}
            }
        }
        names
    } else {
        vec![(ident_at(code, at).to_string(), at)]
    }
}

/// Every reference from the file's top-level module to another top-level module.
fn references(code: &str, module: &[String], modules: &BTreeSet<String>) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let bytes = code.as_bytes();
    let inline_modules = inline_module_spans(code);
    let mut at = 0;
    while at < code.len() {
        // `$crate::x` in a macro counts as the defining module's own import of `x`.
        let preceded_by_ident = at > 0 && is_ident_byte(bytes[at - 1]);
        if !preceded_by_ident && code[at..].starts_with("crate::") {
            for (name, position) in first_segments(code, at + "crate::".len()) {
                found.push((name, line_of(position)));
            }
            at += "crate::".len();
        } else if !preceded_by_ident && code[at..].starts_with("super::") {
            // Climb from the module the path is written in (the file's, plus any inline
            // `mod x { … }` around it); past the crate root, the next segment is a
            // top-level module.
            let mut depth = module.len()
                + inline_modules
                    .iter()
                    .filter(|(open, close)| *open < at && at < *close)
                    .count();
            let mut cursor = at;
            while code[cursor..].starts_with("super::") {
                depth = depth.saturating_sub(1);
                cursor += "super::".len();
            }
            if depth == 0 {
                for (name, position) in first_segments(code, cursor) {
                    found.push((name, line_of(position)));
                }
            }
            at = cursor;
        } else {
            at += code[at..].chars().next().map_or(1, char::len_utf8);
        }
    }
    // `use crate as root;` names the crate under another name the reader cannot follow.
    let mut at = 0;
    while let Some(offset) = code[at..].find("crate") {
        let start = at + offset;
        at = start + "crate".len();
        let standalone = (start == 0 || !is_ident_byte(bytes[start - 1]))
            && !code[at..].starts_with(|c: char| c == ':' || c.is_ascii_alphanumeric() || c == '_');
        if standalone && code[skip_space(code, at)..].starts_with("as ") {
            found.push((HIDDEN.to_string(), line_of(start)));
        }
    }
    let own = module.first().cloned().unwrap_or_default();
    for (name, _) in &mut found {
        if name == "*" || name == "self" {
            *name = HIDDEN.to_string();
        }
    }
    found.retain(|(name, _)| (modules.contains(name) && *name != own) || name == HIDDEN);
    found
}

/// Where a module imports the crate root in a way that hides which modules it then uses
/// (`use crate::*`, `crate::{self as x}`, `use crate as x`).
const HIDDEN: &str = "<glob or alias of the crate root>";

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The library's module graph: which top-level module refers to which, and where.
fn module_graph() -> Graph {
    let modules = top_level_modules();
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut graph: Graph = modules
        .iter()
        .chain(std::iter::once(&HIDDEN.to_string()))
        .map(|m| (m.clone(), BTreeMap::new()))
        .collect();
    for file in files {
        let relative = file.strip_prefix(&root).expect("under src").to_path_buf();
        let module = module_path(&relative);
        // main.rs, cli/ and lib.rs are not library modules.
        let Some(top) = module.first().filter(|m| modules.contains(*m)) else {
            continue;
        };
        let code = strip_comments_and_strings(&std::fs::read_to_string(&file).expect("read"));
        for (target, line) in references(&code, &module, &modules) {
            graph
                .get_mut(top)
                .expect("known module")
                .entry(target)
                .or_default()
                .push(Site {
                    file: format!("src/{}", relative.display()),
                    line,
                });
        }
    }
    graph
}

/// Strongly connected components with more than one module (Tarjan).
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct Search<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Search<'g> {
        fn visit(&mut self, node: &'g str) {
            let number = self.index.len();
            self.index.insert(node, number);
            self.low.insert(node, number);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.graph[node].keys() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    component.push(member.to_string());
                    if member == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !search.index.contains_key(node.as_str()) {
            search.visit(node);
        }
    }
    search.found
}

fn describe_circle(graph: &Graph, members: &[String]) -> String {
    let mut text = format!("circle between {}:\n", members.join(", "));
    for from in members {
        for (to, sites) in &graph[from] {
            if members.contains(to) {
                let first: Vec<String> = sites
                    .iter()
                    .take(3)
                    .map(|s| format!("{}:{}", s.file, s.line))
                    .collect();
                text += &format!(
                    "  {from} -> {to} ({} uses, e.g. {})\n",
                    sites.len(),
                    first.join(", ")
                );
            }
        }
    }
    text
}

#[test]
fn the_top_level_modules_form_no_circle() {
    let graph = module_graph();
    let found = circles(&graph);
    let report: Vec<String> = found.iter().map(|c| describe_circle(&graph, c)).collect();
    assert!(
        found.is_empty(),
        "the library's modules import each other in a circle; move the shared types down \
         (ports, signal_names, config) instead:\n{}",
        report.join("\n")
    );
}

#[test]
fn no_module_imports_the_crate_root_by_glob_or_alias() {
    let graph = module_graph();
    let hidden: Vec<String> = graph
        .values()
        .filter_map(|edges| edges.get(HIDDEN))
        .flatten()
        .map(|s| format!("{}:{}", s.file, s.line))
        .collect();
    assert!(
        hidden.is_empty(),
        "name the modules you import, so the module graph can see them: {}",
        hidden.join(", ")
    );
}

#[test]
fn the_named_boundaries_hold() {
    let graph = module_graph();
    let mut broken = Vec::new();
    for (from, to, why) in FORBIDDEN {
        if let Some(sites) = graph.get(*from).and_then(|edges| edges.get(*to)) {
            broken.push(format!(
                "{from} -> {to} ({why}): {}",
                sites
                    .iter()
                    .map(|s| format!("{}:{}", s.file, s.line))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_reader_sees_every_way_an_import_is_written() {
    let modules: BTreeSet<String> = ["agent", "config", "pods", "signals", "text"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let code = strip_comments_and_strings(
        r##"use crate::config::X;
use crate::{pods::Pod, signals};
fn f() { super::super::text::aligned(); }
// crate::agent in a comment
/* crate::agent in a /* nested */ block */
const S: &str = "crate::agent in a \"string\"";
const R: &str = r#"crate::agent in a "raw" string"#;
fn g<'a>(c: char) -> bool { c == '"' || c == '\\' || c == '\'' }
fn h() { crate::pods::count(); }
pub(crate) use crate::r#agent::Agent;
macro_rules! m { () => { $crate::config::load() } }
"##,
    );
    let module = vec!["eviction".to_string(), "rank".to_string()];
    let found: Vec<(String, usize)> = references(&code, &module, &modules);
    assert_eq!(
        found,
        vec![
            ("config".to_string(), 1),
            ("pods".to_string(), 2),
            ("signals".to_string(), 2),
            ("text".to_string(), 3),
            ("pods".to_string(), 9),
            ("agent".to_string(), 10),
            ("config".to_string(), 11),
        ]
    );
    // A module's references to itself are not edges.
    let own = vec!["pods".to_string()];
    assert!(references("use crate::pods::Pod;", &own, &modules).is_empty());
    // Imports that hide which modules are used are reported as such.
    for hiding in [
        "use crate::*;",
        "use crate::{*, pods::Pod};",
        "use crate::{self as root};",
        "use crate as root;",
    ] {
        let found = references(hiding, &own, &modules);
        assert!(
            found.iter().any(|(name, _)| name == HIDDEN),
            "{hiding}: {found:?}"
        );
    }
    // In a top-level module's own file, `super::*` is the crate root too; inside its
    // inline `mod tests`, it is the module itself.
    let top = vec!["signals".to_string()];
    assert!(
        references("use super::*;", &top, &modules)
            .iter()
            .any(|(name, _)| name == HIDDEN)
    );
    assert!(references("mod tests { use super::*; }", &top, &modules).is_empty());
    assert_eq!(
        references(
            "mod tests { fn f() {} mod deeper { use super::super::super::pods; } }",
            &top,
            &modules
        ),
        vec![("pods".to_string(), 1)]
    );
}

#[test]
fn lib_rs_declarations_are_read_whatever_their_visibility_or_attributes() {
    for (line, module) in [
        ("pub mod agent;", Some("agent")),
        ("mod text;", Some("text")),
        ("pub(crate) mod ports;", Some("ports")),
        ("#[cfg(unix)] pub mod systemd;", Some("systemd")),
        ("pub mod r#trace {", Some("trace")),
        ("pub use agent::Agent;", None),
    ] {
        assert_eq!(declared_module(line).as_deref(), module, "{line}");
    }
}

#[test]
fn a_circle_is_found_and_a_layering_is_not() {
    let mut graph: Graph = BTreeMap::new();
    let site = || {
        vec![Site {
            file: "src/x.rs".into(),
            line: 1,
        }]
    };
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")] {
        graph.entry(to.to_string()).or_default();
        graph
            .entry(from.to_string())
            .or_default()
            .insert(to.to_string(), site());
    }
    assert_eq!(
        circles(&graph),
        vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]
    );
    graph.get_mut("c").unwrap().clear();
    assert!(circles(&graph).is_empty());
}
