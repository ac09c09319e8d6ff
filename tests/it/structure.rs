//! The shape of the source tree (issue 38): no import circles between files, every arrow
//! between top-level modules pointing down the layers, no source file over 700 lines.
//!
//! Read from the `use` paths of `src/` as text, the way a newcomer reads the tree: a file
//! depends on every module file a `crate::`, `super::` or `self::` path in it names (a path is
//! resolved to the longest prefix that is a module file), and a module's face (`mod.rs`, or
//! `x.rs` beside `x/`) on the children whose items it uses. A child using what its parent
//! module declares is not an arrow: the parent is the module's face, and its children are its
//! parts. Test code is left out, tests may reach anywhere: test files (`tests.rs`,
//! `*_tests.rs`, `tests/`, a file whose first attribute is `#![cfg(test)]`) and, in every
//! other file, exactly the item each `#[cfg(test)]` applies to (a `mod tests;` line, a
//! `mod tests { … }` block, a helper function, a field); every line after it is read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines a source file may have.
const MAX_LINES: usize = 700;

/// The layers, top down (README "Layout" and `shared/STYLE.md`): commands → daemon → runner
/// → verify/recorder/workspace → executor/git → process → sandbox/hub/state → config/task →
/// util, with the modules that list leaves out placed where their imports put them. An arrow
/// may point to the same layer or below, never above.
const LAYERS: &[(&str, u32)] = &[
    ("main", 110),
    ("lib", 110),
    ("commands", 100),
    ("cli", 95),
    ("logging", 95),
    ("mock_hub", 95),
    ("term", 90),
    ("daemon", 80),
    ("runner", 70),
    ("verify", 60),
    ("recorder", 60),
    // Task traces: fed by the runner and the daemon beside the flight record.
    ("telemetry", 60),
    ("workspace", 60),
    ("executor", 50),
    ("git", 50),
    // The task's plan: the executors keep the text it is found in, the loop carries it.
    ("plan", 45),
    ("process", 40),
    // Progress events: made by executors, checks and children's output, sent on the link.
    ("progress", 35),
    ("outbox", 32),
    ("sandbox", 30),
    ("hub", 30),
    ("state", 30),
    // Health and metrics: updated by the link and the runner, read by the HTTP endpoint.
    ("ops", 25),
    ("redact", 20),
    ("spend", 15),
    ("config", 10),
    ("task", 10),
    ("cost", 10),
    ("util", 0),
];

struct Tree {
    /// Module path (`["sandbox", "caches"]`) → file.
    modules: BTreeMap<Vec<String>, PathBuf>,
    /// File → its module path and its text (test parts removed).
    files: BTreeMap<PathBuf, (Vec<String>, String)>,
}

fn is_test_file(rel: &Path) -> bool {
    let name = rel.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    name == "tests"
        || name.ends_with("_tests")
        || rel.components().any(|c| c.as_os_str() == "tests")
}

fn module_path(rel: &Path) -> Vec<String> {
    let mut segs: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        segs.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) && segs.len() > 1
    {
        segs.pop();
    } else if segs == ["lib"] || segs == ["main"] {
        // The crate root: its own name, so it has a layer.
    }
    segs
}

fn read_tree(src: &Path) -> Tree {
    let mut tree = Tree {
        modules: BTreeMap::new(),
        files: BTreeMap::new(),
    };
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().to_path_buf();
            let text = std::fs::read_to_string(&path).unwrap();
            let segs = module_path(&rel);
            tree.modules.insert(segs.clone(), rel.clone());
            if is_test_file(&rel) {
                continue;
            }
            let body: String = without_test_items(&text)
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            tree.files.insert(rel, (segs, body));
        }
    }
    tree
}

/// `text` without the items `#[cfg(test)]` applies to (the attribute, any attributes after
/// it, and the item: up to its `;`, its `{ … }` block, or — for a field, an argument or a
/// match arm — its `,`). A file marked `#![cfg(test)]` is all test. Strings, characters and
/// comments are skipped while matching brackets, so a `"}"` in a test does not end it early.
fn without_test_items(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        if starts(&c, i, "#![cfg(test)]") {
            return String::new();
        }
        if starts(&c, i, "#[cfg(test)]") {
            i = test_item_end(&c, i);
            continue;
        }
        let next = token_end(&c, i);
        out.extend(&c[i..next]);
        i = next;
    }
    out
}

fn starts(c: &[char], i: usize, pat: &str) -> bool {
    pat.chars()
        .enumerate()
        .all(|(k, p)| c.get(i + k) == Some(&p))
}

/// The end of the token at `i`: a whole comment, string or character literal, else one char.
fn token_end(c: &[char], i: usize) -> usize {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    match (at(i), at(i + 1)) {
        ('/', '/') => (i..c.len()).find(|&k| c[k] == '\n').unwrap_or(c.len()),
        ('/', '*') => {
            let (mut k, mut depth) = (i + 2, 1);
            while k < c.len() && depth > 0 {
                if starts(c, k, "/*") {
                    depth += 1;
                    k += 2;
                } else if starts(c, k, "*/") {
                    depth -= 1;
                    k += 2;
                } else {
                    k += 1;
                }
            }
            k
        }
        ('"', _) => {
            let mut k = i + 1;
            while k < c.len() && c[k] != '"' {
                k += if c[k] == '\\' { 2 } else { 1 };
            }
            k + 1
        }
        // Raw strings: r"…", r#"…"#, br#"…"# (not an identifier ending in r).
        ('r' | 'b', _) if i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_') => {
            let mut k = i + if at(i) == 'b' && at(i + 1) == 'r' {
                2
            } else {
                1
            };
            if at(i) == 'b' && at(i + 1) != 'r' {
                return i + 1;
            }
            let hashes = (k..c.len()).take_while(|&j| c[j] == '#').count();
            k += hashes;
            if at(k) != '"' {
                return i + 1;
            }
            let close: String = std::iter::once('"')
                .chain("#".repeat(hashes).chars())
                .collect();
            (k + 1..c.len())
                .find(|&j| starts(c, j, &close))
                .map_or(c.len(), |j| j + close.len())
        }
        // A character literal ('x', '\n', '\''), not a lifetime ('a).
        ('\'', '\\') => (i + 3..c.len())
            .find(|&k| c[k] == '\'')
            .map_or(c.len(), |k| k + 1),
        ('\'', _) if at(i + 2) == '\'' => i + 3,
        _ => i + 1,
    }
}

/// Where the item the `#[cfg(test)]` at `i` applies to ends.
fn test_item_end(c: &[char], i: usize) -> usize {
    let mut k = i + "#[cfg(test)]".len();
    // Whitespace, comments and further attributes.
    loop {
        while k < c.len() && c[k].is_whitespace() {
            k += 1;
        }
        if starts(c, k, "//") || starts(c, k, "/*") {
            k = token_end(c, k);
        } else if starts(c, k, "#[") {
            k = bracket_end(c, k + 1);
        } else {
            break;
        }
    }
    let mut depth = 0usize;
    let mut angle = 0usize;
    while k < c.len() {
        match c[k] {
            '(' | '[' => depth += 1,
            '{' if depth == 0 => return bracket_end(c, k),
            '{' => depth += 1,
            ')' | ']' | '}' if depth == 0 => return k,
            ')' | ']' | '}' => depth -= 1,
            ';' if depth == 0 => return k + 1,
            // `->` and `=>` are arrows, not brackets.
            '<' => angle += 1,
            '>' if k > 0 && matches!(c[k - 1], '-' | '=') => {}
            '>' => angle = angle.saturating_sub(1),
            ',' if depth == 0 && angle == 0 => return k + 1,
            _ => {}
        }
        k = token_end(c, k);
    }
    k
}

/// The end (one past) of the bracket group opening at `i`.
fn bracket_end(c: &[char], i: usize) -> usize {
    let mut depth = 0usize;
    let mut k = i;
    while k < c.len() {
        match c[k] {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
        k = token_end(c, k);
    }
    k
}

/// Every path a file names, as module-path segments: `crate::a::b::{c, d::e}` gives
/// `[a, b, c]` and `[a, b, d, e]`; `super::` and `self::` are made absolute.
fn named_paths(me: &[String], body: &str) -> Vec<Vec<String>> {
    let re = regex::Regex::new(r"\b(crate|super|self)((?:::\w+)+)(?:::\{([^;]*?)\})?").unwrap();
    // `self::` in a face is the module itself; in `x.rs` too (its children live in `x/`).
    // `super::` is the parent of the module.
    let parent: Vec<String> = me[..me.len().saturating_sub(1)].to_vec();
    let mut out = Vec::new();
    for c in re.captures_iter(body) {
        let rest: Vec<String> = c[2]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let mut base = match &c[1] {
            "crate" => Vec::new(),
            "super" => parent.clone(),
            _ => me.to_vec(),
        };
        // `super::super::x`
        let mut rest = rest.as_slice();
        while rest.first().map(String::as_str) == Some("super") {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        match c.get(3) {
            Some(group) => {
                for item in group.as_str().split(',') {
                    let item = item.split(" as ").next().unwrap_or("").trim();
                    let item = item.split("::{").next().unwrap_or("");
                    if item.is_empty() || item == "self" {
                        out.push(base.clone());
                        continue;
                    }
                    let mut p = base.clone();
                    p.extend(item.split("::").map(|s| s.trim().to_string()));
                    out.push(p);
                }
            }
            None => out.push(base),
        }
    }
    // A module's own children, named bare (`use child::X`, `child::f()`).
    let declared = regex::Regex::new(r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;").unwrap();
    for c in declared.captures_iter(body) {
        let name = &c[1];
        let named = regex::Regex::new(&format!(r"(?:^|[^:\w]){name}::")).unwrap();
        if named.is_match(body) {
            let mut p = me.to_vec();
            p.push(name.to_string());
            out.push(p);
        }
    }
    out
}

fn resolve<'a>(tree: &'a Tree, segs: &[String]) -> Option<&'a PathBuf> {
    (1..=segs.len())
        .rev()
        .find_map(|i| tree.modules.get(&segs[..i]))
}

/// File → the files it depends on (ancestors excluded: see the module doc).
fn edges(tree: &Tree) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut out = BTreeMap::new();
    for (file, (me, body)) in &tree.files {
        let mut to = BTreeSet::new();
        for p in named_paths(me, body) {
            let Some(target) = resolve(tree, &p) else {
                continue;
            };
            let Some((target_mod, _)) = tree.files.get(target) else {
                continue;
            };
            let ancestor = target_mod.len() < me.len() && me.starts_with(target_mod);
            if target != file && !ancestor && !target_mod.is_empty() {
                to.insert(target.clone());
            }
        }
        out.insert(file.clone(), to);
    }
    out
}

/// The strongly connected components of more than one file (Tarjan).
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct S<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        next: usize,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut S<'a>, v: &'a PathBuf) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = S {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_import_circles_between_files() {
    let tree = read_tree(&src());
    let edges = edges(&tree);
    let found = circles(&edges);
    let report: Vec<String> = found
        .iter()
        .map(|comp| {
            let arrows: Vec<String> = comp
                .iter()
                .flat_map(|a| {
                    edges[a]
                        .iter()
                        .filter(|b| comp.contains(b))
                        .map(move |b| format!("{} -> {}", a.display(), b.display()))
                })
                .collect();
            arrows.join(", ")
        })
        .collect();
    assert!(
        report.is_empty(),
        "import circles between files (move the shared type down, or pass the dependency in):\n  {}",
        report.join("\n  ")
    );
}

/// The arrows of `tree` that point up the layers, as `from -> to`.
fn upward_arrows(tree: &Tree) -> Vec<String> {
    let layer = |segs: &[String]| -> u32 {
        let top = segs.first().map(String::as_str).unwrap_or("lib");
        LAYERS
            .iter()
            .find(|(m, _)| *m == top)
            .map(|(_, l)| *l)
            .unwrap_or_else(|| panic!("top-level module `{top}` has no layer in LAYERS: place it"))
    };
    let mut upward = Vec::new();
    for (from, to) in edges(tree) {
        let from_mod = &tree.files[&from].0;
        for t in to {
            let to_mod = &tree.files[&t].0;
            if from_mod.first() != to_mod.first() && layer(to_mod) > layer(from_mod) {
                upward.push(format!("{} -> {}", from.display(), t.display()));
            }
        }
    }
    upward
}

#[test]
fn every_arrow_between_modules_points_down_the_layers() {
    let upward = upward_arrows(&read_tree(&src()));
    assert!(
        upward.is_empty(),
        "imports pointing up the layers (move the shared type down, or pass it in):\n  {}",
        upward.join("\n  ")
    );
}

/// A source tree of `files` (path under src/, text) in a temp dir, as the checks read it.
fn fixture(files: &[(&str, &str)]) -> (tempfile::TempDir, Tree) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let tree = read_tree(dir.path());
    (dir, tree)
}

/// The reader drops only the item a `#[cfg(test)]` applies to: an upward import after an
/// early `#[cfg(test)] mod tests;` (and after a test block holding `"}"` and `'{'`, which
/// must not end or extend it) is an arrow, and it closes a circle.
#[test]
fn an_upward_import_below_an_early_test_module_is_rejected() {
    let (_dir, tree) = fixture(&[
        ("lib.rs", "pub mod config;\npub mod daemon;\n"),
        (
            "config/mod.rs",
            "//! Config.\npub struct C;\n\n#[cfg(test)]\nmod tests;\n\nuse crate::daemon::Daemon;\n",
        ),
        ("config/tests.rs", "use crate::daemon::Daemon;\n"),
        ("daemon/mod.rs", "use crate::config::C;\npub struct Daemon;\n"),
    ]);
    assert_eq!(
        upward_arrows(&tree),
        ["config/mod.rs -> daemon/mod.rs"],
        "{:?}",
        tree.files
    );
    assert_eq!(circles(&edges(&tree)).len(), 1);

    let (_dir, tree) = fixture(&[
        ("lib.rs", "pub mod config;\npub mod daemon;\n"),
        (
            "config/mod.rs",
            r#"pub struct C;
#[cfg(test)]
#[allow(dead_code)]
mod tests {
    const OPEN: char = '{';
    const CLOSE: &str = "}}";
    use crate::daemon::Daemon;
}
#[cfg(test)]
fn helper<A, B>(a: A, b: B) -> (A, B) { let _ = crate::daemon::Daemon; (a, b) }
#[cfg(test)] use crate::daemon::Daemon as D;
pub fn config() -> C { C }
use crate::daemon::Daemon;
"#,
        ),
        ("daemon/mod.rs", "pub struct Daemon;\n"),
    ]);
    assert_eq!(upward_arrows(&tree), ["config/mod.rs -> daemon/mod.rs"]);
    let body = &tree.files[Path::new("config/mod.rs")].1;
    assert!(body.contains("pub fn config() -> C { C }"), "{body}");
    assert!(
        !body.contains("OPEN") && !body.contains("helper") && !body.contains(" as D"),
        "{body}"
    );
}

/// What `#[cfg(test)]` applies to is dropped, and nothing else: the test parts of a file
/// may import anything.
#[test]
fn imports_in_test_items_alone_are_not_arrows() {
    let (_dir, tree) = fixture(&[
        ("lib.rs", "pub mod config;\npub mod daemon;\n"),
        (
            "config/mod.rs",
            r#"pub struct C {
    pub a: u8,
    #[cfg(test)]
    pub seen: std::collections::HashMap<String, crate::daemon::Daemon>,
    pub b: u8,
}
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod test_support {
    pub(crate) fn d() -> crate::daemon::Daemon { crate::daemon::Daemon }
}
pub fn after() {}
"#,
        ),
        ("config/tests.rs", "use crate::daemon::Daemon;\n"),
        ("daemon/mod.rs", "pub struct Daemon;\n"),
    ]);
    assert!(upward_arrows(&tree).is_empty(), "{:?}", tree.files);
    let body = &tree.files[Path::new("config/mod.rs")].1;
    assert!(
        body.contains("pub b: u8") && body.contains("pub fn after()"),
        "{body}"
    );
}

#[test]
fn no_source_file_over_700_lines() {
    let tree = read_tree(&src());
    let mut long = Vec::new();
    for rel in tree.modules.values() {
        let n = std::fs::read_to_string(src().join(rel))
            .unwrap()
            .lines()
            .count();
        if n > MAX_LINES {
            long.push(format!("{} ({n} lines)", rel.display()));
        }
    }
    long.sort();
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines (split them by concept):\n  {}",
        long.join("\n  ")
    );
}

#[test]
fn the_reader_finds_the_arrows_it_checks() {
    // The checks above pass vacuously if the reader finds no arrow: the runner's own imports
    // must be seen (runner → workspace, runner → verify).
    let tree = read_tree(&src());
    let edges = edges(&tree);
    let runner = edges
        .iter()
        .find(|(f, _)| *f == Path::new("runner.rs") || *f == Path::new("runner/mod.rs"))
        .map(|(_, to)| to.clone())
        .expect("src/runner.rs or src/runner/mod.rs");
    assert!(
        runner.iter().any(|t| t.starts_with("workspace")),
        "{runner:?}"
    );
    assert!(runner.iter().any(|t| t.starts_with("verify")), "{runner:?}");
    // And it reads past a file's early `#[cfg(test)] mod tests;`: the daemon's and the
    // config's main items come after theirs.
    for (file, item) in [
        ("daemon/mod.rs", "pub async fn run("),
        ("config/mod.rs", "pub struct Config"),
    ] {
        assert!(
            tree.files[Path::new(file)].1.contains(item),
            "{file}: {item} not read"
        );
    }
}
