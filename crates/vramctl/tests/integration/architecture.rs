//! File-level import cycles: `no_file_level_import_cycles_in_any_crate` fails when the
//! source files of any crate under `crates/` name each other in a cycle.
//!
//! Run it alone with `cargo test -p vramctl --test integration architecture::`.
//!
//! The rule. Each `.rs` file reached from a crate root (`src/lib.rs`, `src/main.rs`,
//! `src/bin/*.rs`) through `mod x;` declarations is one node; its module path follows the
//! 2018 layout (`a.rs` + `a/b.rs`, or `a/mod.rs`), and an inline `mod x { .. }` belongs to
//! the file that holds it. A file has an edge to another file when it names a path that
//! reaches into it: `use` trees and paths in code that start with `crate::`, `self::`,
//! `super::`, the crate's own library name (`vramctl::x` from the binary maps into the
//! library's files), or the name of a child module the current module declares. Each
//! path resolves to the file that defines the deepest module it names, so `super::f`
//! names an item of the parent's file, while `super::sibling::f` is an edge to the
//! sibling's file only. A `mod x;` declaration alone is not an edge; a parent naming its
//! child's items (`child::f`, `pub use child::T`) is. A file naming the items of an
//! ancestor's own file (`super::f`, `crate::f` from anywhere below the root) is not an
//! edge: a child is part of its parent, sees its private items and is declared by it, so
//! the facade pattern (`cmd.rs` dispatching to `cmd/*.rs`, which share `cmd.rs`'s helpers)
//! is allowed. A cycle is a strongly connected set of two or more files under these
//! edges: siblings (or cousins) naming each other, directly or through other files, as
//! `tui/kill.rs` ↔ `tui/reclaim.rs` did, or a file naming a module whose children name
//! the file back (`audit_sink.rs` → `cmd.rs` → `cmd/kill.rs` → `audit_sink.rs`).
//! Re-exports are not followed. `#[cfg(test)]` items are left out: tests may name what
//! they test from anywhere.
//!
//! The scan is textual: comments (doc comments included), string, byte-string, raw-string
//! and character literals are blanked first, so examples in docs and messages are not
//! references. `$crate` paths in macros and `pub(in path)` are not edges.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// One file's reference to a module path, kept to explain a cycle.
#[derive(Debug, Clone)]
struct Edge {
    to: PathBuf,
    named: String,
}

/// The files of one crate and which of them name which.
#[derive(Debug, Default)]
struct CrateGraph {
    files: Vec<PathBuf>,
    edges: BTreeMap<PathBuf, BTreeMap<PathBuf, Edge>>,
}

/// Module path (root marker first: `lib` or `bin:<file>`) → the file that defines it.
type ModuleFiles = HashMap<Vec<String>, PathBuf>;

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The source with comments and literals replaced by spaces (newlines kept).
fn strip_comments_and_literals(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            continue;
        }
        // Raw strings: r"..", r#".."#, br"..", cr#".."#.
        if c == 'r' {
            let prev = if i > 0 { Some(chars[i - 1]) } else { None };
            let prev2 = if i > 1 { Some(chars[i - 2]) } else { None };
            let at_start = match prev {
                None => true,
                Some(p) if !is_ident_char(p) => true,
                Some('b') | Some('c') => prev2.is_none_or(|p| !is_ident_char(p)),
                _ => false,
            };
            if at_start {
                let mut j = i + 1;
                while chars.get(j) == Some(&'#') {
                    j += 1;
                }
                if chars.get(j) == Some(&'"') {
                    let hashes = j - i - 1;
                    for _ in i..=j {
                        out.push(' ');
                    }
                    i = j + 1;
                    while i < chars.len() {
                        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
                            for _ in 0..=hashes {
                                out.push(' ');
                            }
                            i += hashes + 1;
                            break;
                        }
                        out.push(blank(chars[i]));
                        i += 1;
                    }
                    continue;
                }
            }
        }
        if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() {
                if chars[i] == '\\' {
                    out.push(' ');
                    if let Some(&e) = chars.get(i + 1) {
                        out.push(blank(e));
                    }
                    i += 2;
                    continue;
                }
                if chars[i] == '"' {
                    out.push(' ');
                    i += 1;
                    break;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
            continue;
        }
        if c == '\'' {
            // A character literal ('x', '\n', '\u{1F600}'), not a lifetime ('a).
            if next == Some('\\') {
                out.push_str("  ");
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
                continue;
            }
            if next.is_some() && chars.get(i + 2) == Some(&'\'') {
                out.push_str("   ");
                i += 3;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

fn tokenize(src: &str) -> Vec<Tok> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if is_ident_char(c) {
            let start = i;
            while i < chars.len() && is_ident_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // `r#type` raw identifiers.
            let word = word.strip_prefix("r#").map(str::to_owned).unwrap_or(word);
            toks.push(Tok::Ident(word));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            toks.push(Tok::PathSep);
            i += 2;
        } else {
            toks.push(Tok::Punct(c));
            i += 1;
        }
    }
    toks
}

/// The tokens without `#[cfg(test)]` items: test code may name what it tests from
/// anywhere, and a `#[cfg(test)] mod tests;` file is not part of the build's structure.
fn without_test_items(toks: Vec<Tok>) -> Vec<Tok> {
    let attr = |i: usize| -> Option<(usize, bool)> {
        // `#[ .. ]` starting at i: its end and whether it is `#[cfg(test)]`.
        if toks.get(i) != Some(&Tok::Punct('#')) || toks.get(i + 1) != Some(&Tok::Punct('[')) {
            return None;
        }
        let mut depth = 0usize;
        let mut j = i + 1;
        while j < toks.len() {
            match toks[j] {
                Tok::Punct('[') => depth += 1,
                Tok::Punct(']') => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        let is_test = toks[i + 2..j]
            == [
                Tok::Ident("cfg".into()),
                Tok::Punct('('),
                Tok::Ident("test".into()),
                Tok::Punct(')'),
            ];
        Some((j + 1, is_test))
    };
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        let Some((end, true)) = attr(i) else {
            out.push(toks[i].clone());
            i += 1;
            continue;
        };
        // Skip the item: further attributes, then up to a `;` outside any bracket or the
        // close of its first `{`.
        let mut j = end;
        while let Some((next, _)) = attr(j) {
            j = next;
        }
        let mut depth = 0i64;
        let mut braced = false;
        while j < toks.len() {
            match toks[j] {
                Tok::Punct('{') => {
                    depth += 1;
                    braced = true;
                }
                Tok::Punct('(') | Tok::Punct('[') => depth += 1,
                Tok::Punct(')') | Tok::Punct(']') => depth -= 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if braced && depth == 0 {
                        j += 1;
                        break;
                    }
                }
                Tok::Punct(';') if depth == 0 => {
                    j += 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        i = j;
    }
    out
}

/// Where the files of `module`'s children live, for a module defined by `file`.
fn children_dir(file: &Path) -> PathBuf {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
    if matches!(name, "lib.rs" | "main.rs" | "mod.rs")
        || file.parent().is_some_and(|p| p.ends_with("src/bin"))
    {
        dir
    } else {
        dir.join(file.file_stem().and_then(|s| s.to_str()).unwrap_or(""))
    }
}

/// Module declarations of one file: `mod x;` (a child file) and `mod x { .. }`
/// (inline), each with the inline-module path it sits in.
fn declared_modules(toks: &[Tok]) -> Vec<(Vec<String>, String, bool)> {
    let mut found = Vec::new();
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Punct(p))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    let path: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                    if *p == ';' {
                        found.push((path, name.clone(), false));
                    } else if *p == '{' {
                        found.push((path, name.clone(), true));
                        inline.push((name.clone(), depth));
                        depth += 1;
                        i += 3;
                        continue;
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// Walks `mod` declarations from `root`, filling `modules` and `file_modules`.
fn collect_modules(
    root: &Path,
    root_path: Vec<String>,
    modules: &mut ModuleFiles,
    file_modules: &mut BTreeMap<PathBuf, Vec<String>>,
) {
    let mut queue = vec![(root.to_path_buf(), root_path)];
    while let Some((file, path)) = queue.pop() {
        let Ok(src) = std::fs::read_to_string(&file) else {
            continue;
        };
        modules.insert(path.clone(), file.clone());
        file_modules.insert(file.clone(), path.clone());
        let toks = without_test_items(tokenize(&strip_comments_and_literals(&src)));
        for (inline_path, name, is_inline) in declared_modules(&toks) {
            let mut module = path.clone();
            module.extend(inline_path.iter().cloned());
            module.push(name.clone());
            if is_inline {
                modules.insert(module, file.clone());
            } else {
                let mut dir = children_dir(&file);
                for part in &inline_path {
                    dir = dir.join(part);
                }
                let flat = dir.join(format!("{name}.rs"));
                let nested = dir.join(&name).join("mod.rs");
                let child = if flat.exists() { flat } else { nested };
                if child.exists() {
                    queue.push((child, module));
                }
            }
        }
    }
}

/// Expands the `use` tree starting at `toks[i]` into full paths; returns the index after it.
fn parse_use_tree(
    toks: &[Tok],
    mut i: usize,
    prefix: &[String],
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(i) {
            Some(Tok::PathSep) => i += 1,
            Some(Tok::Ident(id)) if id == "as" => {
                i += 2;
                out.push(path);
                return i;
            }
            Some(Tok::Ident(id)) => {
                if id == "self"
                    && !path.is_empty()
                    && path.len() == prefix.len()
                    && !prefix.is_empty()
                {
                    // `{self, ..}`: the prefix itself.
                } else {
                    path.push(id.clone());
                }
                i += 1;
            }
            Some(Tok::Punct('*')) => {
                i += 1;
                out.push(path);
                return i;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Punct('}')) => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        None => return i,
                        _ => i = parse_use_tree(toks, i, &path, out),
                    }
                }
            }
            _ => {
                out.push(path);
                return i;
            }
        }
    }
}

/// Every module path a file names, as (path written, the module it sits in).
fn named_paths(toks: &[Tok], file_module: &[String]) -> Vec<(Vec<String>, Vec<String>)> {
    let mut found = Vec::new();
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    let current = |inline: &Vec<(String, usize)>| {
        let mut m = file_module.to_vec();
        m.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push((name.clone(), depth));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(kw) if kw == "use" => {
                let mut paths = Vec::new();
                i = parse_use_tree(toks, i + 1, &[], &mut paths);
                let here = current(&inline);
                found.extend(paths.into_iter().map(|p| (p, here.clone())));
                continue;
            }
            Tok::Ident(first) => {
                let after_sep = i > 0 && toks[i - 1] == Tok::PathSep;
                let after_dollar = i > 0 && toks[i - 1] == Tok::Punct('$');
                let after_in = i > 0 && toks[i - 1] == Tok::Ident("in".into());
                if !after_sep
                    && !after_dollar
                    && !after_in
                    && toks.get(i + 1) == Some(&Tok::PathSep)
                {
                    let mut path = vec![first.clone()];
                    let mut j = i + 1;
                    while toks.get(j) == Some(&Tok::PathSep) {
                        match toks.get(j + 1) {
                            Some(Tok::Ident(id)) => {
                                path.push(id.clone());
                                j += 2;
                            }
                            _ => break,
                        }
                    }
                    found.push((path, current(&inline)));
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The absolute module path `written` names from inside `module`, if it is of this crate.
fn absolute(
    written: &[String],
    module: &[String],
    crate_root: &[String],
    lib_name: Option<&str>,
    modules: &ModuleFiles,
) -> Option<Vec<String>> {
    let first = written.first()?;
    let mut base: Vec<String>;
    let mut rest = &written[1..];
    match first.as_str() {
        "crate" => base = crate_root.to_vec(),
        "self" => base = module.to_vec(),
        "super" => {
            base = module.to_vec();
            base.pop();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        name if Some(name) == lib_name => base = vec!["lib".to_string()],
        name => {
            // A 2018 relative path: a child module of the current one.
            let mut child = module.to_vec();
            child.push(name.to_string());
            if !modules.contains_key(&child) {
                return None;
            }
            base = module.to_vec();
            rest = written;
        }
    }
    if base.is_empty() {
        return None;
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The file defining the deepest module of `path`.
fn defining_file(path: &[String], modules: &ModuleFiles) -> Option<PathBuf> {
    (1..=path.len())
        .rev()
        .find_map(|n| modules.get(&path[..n]).cloned())
}

/// The library target's name: `[lib] name`, else the package name with `_` for `-`.
fn lib_name(manifest: &str) -> Option<String> {
    let mut section = "";
    let mut package_name = None;
    let mut lib = None;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if let Some(value) = line
            .strip_prefix("name")
            .map(str::trim)
            .and_then(|v| v.strip_prefix('='))
        {
            let value = value.trim().trim_matches('"').to_string();
            match section {
                "[package]" => package_name = Some(value.replace('-', "_")),
                "[lib]" => lib = Some(value),
                _ => {}
            }
        }
    }
    lib.or(package_name)
}

/// The file graph of the crate whose manifest directory is `dir`.
fn crate_graph(dir: &Path) -> CrateGraph {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
    let lib = lib_name(&manifest);
    let src = dir.join("src");
    let mut modules = ModuleFiles::new();
    let mut file_modules = BTreeMap::new();
    let mut roots = Vec::new();
    if src.join("lib.rs").exists() {
        roots.push((src.join("lib.rs"), vec!["lib".to_string()]));
    }
    let mut bins = vec![src.join("main.rs")];
    if let Ok(entries) = std::fs::read_dir(src.join("bin")) {
        bins.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "rs")),
        );
    }
    for bin in bins.into_iter().filter(|b| b.exists()) {
        roots.push((bin.clone(), vec![format!("bin:{}", bin.display())]));
    }
    for (root, path) in &roots {
        collect_modules(root, path.clone(), &mut modules, &mut file_modules);
    }
    let mut graph = CrateGraph {
        files: file_modules.keys().cloned().collect(),
        ..CrateGraph::default()
    };
    for (file, module) in &file_modules {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let toks = without_test_items(tokenize(&strip_comments_and_literals(&text)));
        let crate_root = &module[..1];
        for (written, here) in named_paths(&toks, module) {
            let Some(target) = absolute(&written, &here, crate_root, lib.as_deref(), &modules)
            else {
                continue;
            };
            let Some(to) = defining_file(&target, &modules) else {
                continue;
            };
            // A child is part of its ancestors (it sees their private items, and they
            // declare it): naming an ancestor's own items is not an edge.
            let ancestor = file_modules.get(&to).is_some_and(|m| here.starts_with(m));
            if &to != file && !ancestor {
                graph
                    .edges
                    .entry(file.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_insert(Edge {
                        to,
                        named: written.join("::"),
                    });
            }
        }
    }
    graph
}

/// Strongly connected sets of two or more files (Tarjan), each sorted.
fn cycles(graph: &CrateGraph) -> Vec<Vec<PathBuf>> {
    struct State<'g> {
        graph: &'g CrateGraph,
        index: HashMap<&'g PathBuf, usize>,
        low: HashMap<&'g PathBuf, usize>,
        on_stack: BTreeSet<&'g PathBuf>,
        stack: Vec<&'g PathBuf>,
        next: usize,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g PathBuf) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(out) = s.graph.edges.get(v) {
            for w in out.keys() {
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let low = s.low[v].min(s.low[w]);
                    s.low.insert(v, low);
                } else if s.on_stack.contains(w) {
                    let low = s.low[v].min(s.index[w]);
                    s.low.insert(v, low);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut set = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                set.push(w.clone());
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                s.found.push(set);
            }
        }
    }
    let mut s = State {
        graph,
        index: HashMap::new(),
        low: HashMap::new(),
        on_stack: BTreeSet::new(),
        stack: Vec::new(),
        next: 0,
        found: Vec::new(),
    };
    for f in &graph.files {
        if !s.index.contains_key(f) {
            visit(&mut s, f);
        }
    }
    s.found
}

/// Each cycle of the crate at `dir`, as lines: the files and the references that join them.
fn describe_cycles(dir: &Path) -> Vec<String> {
    let graph = crate_graph(dir);
    let shown = |p: &Path| p.strip_prefix(dir).unwrap_or(p).display().to_string();
    cycles(&graph)
        .into_iter()
        .map(|set| {
            let mut line = format!(
                "{}: cycle of {} files:",
                dir.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
                set.len()
            );
            for from in &set {
                for edge in graph.edges.get(from).into_iter().flat_map(|e| e.values()) {
                    if set.contains(&edge.to) {
                        line.push_str(&format!(
                            "\n    {} -> {} (names `{}`)",
                            shown(from),
                            shown(&edge.to),
                            edge.named
                        ));
                    }
                }
            }
            line
        })
        .collect()
}

#[test]
fn no_file_level_import_cycles_in_any_crate() {
    let crates_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&crates_dir)
        .expect("crates/ is readable")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 5,
        "expected the workspace's crates under {}",
        crates_dir.display()
    );
    // The scan must reach the binary's files, or a scanner that lost its way would find no
    // cycle. Measured against the files on disk rather than a fixed count, because modules
    // keep moving out of the binary into crates of their own: nearly every file is reached
    // (a few are test-only modules, which are skipped), and most name another.
    let vramctl_dir = crates_dir.join("vramctl");
    let on_disk = rs_files_under(&vramctl_dir.join("src"));
    let vramctl = crate_graph(&vramctl_dir);
    assert!(
        on_disk > 20
            && vramctl.files.len() * 10 >= on_disk * 9
            && vramctl.edges.len() * 2 >= vramctl.files.len(),
        "the scan must reach the binary's files: {} of {} files, {} with references",
        vramctl.files.len(),
        on_disk,
        vramctl.edges.len()
    );
    let found: Vec<String> = dirs.iter().flat_map(|d| describe_cycles(d)).collect();
    assert!(
        found.is_empty(),
        "file-level import cycles:\n{}",
        found.join("\n")
    );
}

/// How many `.rs` files are under `dir`, at any depth.
fn rs_files_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| e.path())
        .map(|p| {
            if p.is_dir() {
                rs_files_under(&p)
            } else {
                usize::from(p.extension().is_some_and(|e| e == "rs"))
            }
        })
        .sum()
}

/// Non-blank lines of a source file outside `#[cfg(test)]` items, with comments and
/// literals blanked first (so a brace in a string does not end an item).
fn code_lines(src: &str) -> usize {
    let stripped = strip_comments_and_literals(src);
    let mut count = 0;
    let mut skip_depth: Option<i64> = None;
    let mut pending_test_item = false;
    for line in stripped.lines() {
        let text = line.trim();
        if let Some(depth) = skip_depth.as_mut() {
            *depth += brace_balance(line);
            if *depth <= 0 {
                skip_depth = None;
            }
            continue;
        }
        if text.starts_with("#[cfg(test)]") {
            pending_test_item = true;
            continue;
        }
        if pending_test_item {
            pending_test_item = false;
            let depth = brace_balance(line);
            if depth > 0 {
                skip_depth = Some(depth);
            }
            continue;
        }
        if !text.is_empty() {
            count += 1;
        }
    }
    count
}

fn brace_balance(line: &str) -> i64 {
    line.chars().fold(0, |n, c| match c {
        '{' => n + 1,
        '}' => n - 1,
        _ => n,
    })
}

/// A crate's non-test lines: `src/` without `tests/` directories and `tests.rs` files.
fn crate_code_lines(dir: &Path) -> usize {
    fn walk(dir: &Path, total: &mut usize) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name != "tests" {
                    walk(&path, total);
                }
            } else if path.extension().is_some_and(|e| e == "rs") && name != "tests.rs" {
                let src = std::fs::read_to_string(&path).expect("source is readable");
                *total += code_lines(&src);
            }
        }
    }
    let mut total = 0;
    walk(&dir.join("src"), &mut total);
    total
}

/// Issue 30: the binary is command-line parsing, dispatch and printing; what commands do
/// lives in library crates. Its share of the workspace's non-test lines stays at most a
/// quarter (18 % when this was written).
#[test]
fn binary_is_at_most_a_quarter_of_the_workspace() {
    let crates_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut total = 0;
    let mut binary = 0;
    for entry in std::fs::read_dir(&crates_dir)
        .expect("crates/ is readable")
        .flatten()
    {
        let path = entry.path();
        if !path.join("Cargo.toml").exists() {
            continue;
        }
        let lines = crate_code_lines(&path);
        total += lines;
        if entry.file_name() == "vramctl" {
            binary = lines;
        }
    }
    assert!(
        binary > 1_000 && total > binary * 2,
        "the count must see the code: {binary} of {total}"
    );
    assert!(
        binary * 4 <= total,
        "the vramctl binary holds {binary} of the workspace's {total} non-test lines ({:.1} %): move what commands do into a library crate",
        100.0 * binary as f64 / total as f64
    );
}

#[test]
fn code_lines_leave_out_test_items_comments_and_braces_in_strings() {
    let src = "// a comment\nfn f() {\n    let s = \"}\";\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n#[cfg(test)]\nmod more;\nfn g() {}\n";
    assert_eq!(code_lines(src), 4);
}

/// Writes `files` (relative path, text) under a fresh crate directory.
fn synthetic_crate(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("Cargo.toml"),
        "[package]\nname = \"demo-crate\"\n",
    )
    .expect("write manifest");
    for (path, text) in files {
        let full = dir.path().join(path);
        std::fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
        std::fs::write(full, text).expect("write source");
    }
    dir
}

#[test]
fn cycle_finder_reports_siblings_that_name_each_other() {
    let dir = synthetic_crate(&[
        ("src/lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        (
            "src/a.rs",
            "use crate::b::helper;\npub fn f() { helper() }\n",
        ),
        ("src/b.rs", "pub fn helper() { super::a::g() }\n"),
        ("src/a/inner.rs", "pub fn x() {}\n"),
        ("src/c.rs", "pub fn z() { crate::a::f() }\n"),
    ]);
    let found = describe_cycles(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("src/a.rs -> src/b.rs") && found[0].contains("src/b.rs -> src/a.rs"),
        "{found:?}"
    );
}

#[test]
fn cycle_finder_follows_binary_into_library_and_inline_modules() {
    let dir = synthetic_crate(&[
        ("src/lib.rs", "pub mod shared;\n"),
        ("src/shared.rs", "pub fn s() {}\n"),
        (
            "src/main.rs",
            "mod cmd;\nmod sink;\nfn main() { cmd::run() }\n",
        ),
        (
            "src/cmd.rs",
            "pub fn run() { demo_crate::shared::s(); crate::sink::write() }\npub fn db() {}\n",
        ),
        (
            "src/sink.rs",
            "// crate::cmd::db() in a comment is not a reference\nconst S: &str = \"crate::cmd::db\";\npub fn write() {}\nmod inner { pub fn p() { crate::cmd::db() } }\n",
        ),
    ]);
    let found = describe_cycles(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("src/sink.rs -> src/cmd.rs (names `crate::cmd::db`)"),
        "{found:?}"
    );
}

#[test]
fn cycle_finder_accepts_parents_naming_children_and_children_naming_siblings() {
    let dir = synthetic_crate(&[
        ("src/lib.rs", "pub mod tui;\npub use tui::run;\n"),
        (
            "src/tui.rs",
            "mod layout;\nmod view;\nmod tests;\npub fn run() { view::draw(layout::Rect) }\n",
        ),
        ("src/tui/layout.rs", "pub struct Rect;\n"),
        (
            "src/tui/view.rs",
            "use super::layout::Rect;\npub fn draw(_: Rect) {}\n",
        ),
        (
            "src/tui/tests.rs",
            "use super::*;\n#[test] fn t() { super::view::draw(super::layout::Rect) }\n",
        ),
        ("src/tui/ignored.rs", "use crate::tui::run;\n"),
    ]);
    let found = describe_cycles(dir.path());
    assert!(found.is_empty(), "{found:?}");
    let graph = crate_graph(dir.path());
    // The parent names its children; tests.rs's `use super::*` names its parent, which is
    // not an edge (a child is part of its parent).
    assert!(
        graph.edges[&dir.path().join("src/tui.rs")]
            .contains_key(&dir.path().join("src/tui/view.rs"))
    );
    let from_tests = &graph.edges[&dir.path().join("src/tui/tests.rs")];
    assert!(from_tests.contains_key(&dir.path().join("src/tui/view.rs")));
    assert!(!from_tests.contains_key(&dir.path().join("src/tui.rs")));
    assert!(!graph.files.contains(&dir.path().join("src/tui/ignored.rs")));
}

#[test]
fn literals_and_comments_are_blanked_but_lifetimes_kept() {
    let src = "fn f<'a>(x: &'a str) -> char { /* crate::a /* nested */ */ let _ = r#\"crate::b\"#; let _ = b\"crate::c\"; '\\'' }";
    let out = strip_comments_and_literals(src);
    assert!(!out.contains("crate::"), "{out}");
    assert!(out.contains("<'a>") && out.contains("&'a str"), "{out}");
    assert_eq!(out.chars().count(), src.chars().count());
}
