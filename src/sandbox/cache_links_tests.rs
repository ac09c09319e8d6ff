//! Issue 35, item 1, built from the class: every kind of entry a task can leave in its
//! repository's cache tree where the daemon expects one of its own — a link (to a file, to a
//! directory, dangling, into the state directory) in place of the stamp, of cargo's config
//! files, of `cargo/`, of `go/` and of every cache directory the daemon knows, a FIFO or a
//! socket where a file is expected, a FIFO or a file where a directory is — then the daemon
//! prepares the next task. What a link pointed to is untouched (bytes, mode, entries), every
//! entry is the daemon's again, and no grant of the next task's sandbox reaches the target.

use std::collections::BTreeMap;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::sandbox::{beneath, Grants};

/// Every file and directory under `dir` (links not followed): mode and content.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        let bytes = if m.is_file() {
            std::fs::read(&d).unwrap()
        } else {
            Vec::new()
        };
        out.insert(d.clone(), (m.permissions().mode(), bytes));
        if m.is_dir() {
            todo.extend(std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out
}

/// `prepare`, given at most 20 s: writing into a FIFO a task left would block for good.
fn prepare_in_time(cfg: &Config, ws: &Path, vars: &[(String, String)]) -> io::Result<Prepared> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (cfg, ws, vars) = (cfg.clone(), ws.to_path_buf(), vars.to_vec());
    std::thread::spawn(move || {
        let _ = tx.send(prepare(&cfg, &ws, &vars));
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("preparing the caches hung (writing into a FIFO a task left?)")
}

/// What a task plants: `(tree, outside, state directory)`.
type Plant = Box<dyn Fn(&Path, &Path, &Path)>;

/// One case: what a task plants in its tree (`tree` is where `CARGO_HOME`'s parent is, the
/// tree the task was granted), and what outside it must stay as it was.
struct Case {
    name: &'static str,
    plant: Plant,
}

fn link(target: &Path, at: &Path) {
    if std::fs::symlink_metadata(at).is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir_all(at).unwrap();
    } else {
        let _ = std::fs::remove_file(at);
    }
    symlink(target, at).unwrap();
}

fn fifo(at: &Path) {
    if std::fs::symlink_metadata(at).is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir_all(at).unwrap();
    } else {
        let _ = std::fs::remove_file(at);
    }
    let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).unwrap();
    // A test helper: mkfifo has no std wrapper.
    #[allow(unsafe_code)]
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(r, 0, "mkfifo {}", at.display());
}

fn socket(at: &Path) {
    let _ = std::fs::remove_file(at);
    // Bound, then the listener dropped: the socket file stays, as one a task left would.
    drop(std::os::unix::net::UnixListener::bind(at).unwrap());
}

fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = vec![
        Case {
            // Where the LRU stamp was before (`caches/<key>/.last-used`, the task's tree).
            name: "the stamp file",
            plant: Box::new(|tree, out, _| link(&out.join("stamp"), &tree.join(".last-used"))),
        },
        Case {
            name: "cargo's config.toml",
            plant: Box::new(|tree, out, _| {
                link(&out.join("config.toml"), &tree.join("cargo/config.toml"))
            }),
        },
        Case {
            name: "cargo's legacy config",
            plant: Box::new(|tree, out, _| {
                link(&out.join("config.toml"), &tree.join("cargo/config"))
            }),
        },
        Case {
            name: "the cargo directory",
            plant: Box::new(|tree, out, _| link(&out.join("dir"), &tree.join("cargo"))),
        },
        Case {
            name: "the go directory",
            plant: Box::new(|tree, out, _| link(&out.join("dir"), &tree.join("go"))),
        },
        Case {
            name: "a dangling link",
            plant: Box::new(|tree, out, _| link(&out.join("nothing-here"), &tree.join("xdg"))),
        },
        Case {
            // Every task's flight record is there.
            name: "a link into the state directory",
            plant: Box::new(|tree, _, state| link(&state.join("tasks"), &tree.join("cargo"))),
        },
        Case {
            name: "a FIFO where cargo's config is written",
            plant: Box::new(|tree, _, _| fifo(&tree.join("cargo/config.toml"))),
        },
        Case {
            name: "a socket where cargo's legacy config is written",
            plant: Box::new(|tree, _, _| socket(&tree.join("cargo/config"))),
        },
        Case {
            name: "a FIFO where a directory is expected",
            plant: Box::new(|tree, _, _| fifo(&tree.join("pip"))),
        },
        Case {
            name: "a file where a directory is expected",
            plant: Box::new(|tree, _, _| {
                std::fs::remove_dir_all(tree.join("bun")).unwrap();
                std::fs::write(tree.join("bun"), "x").unwrap();
            }),
        },
        Case {
            // With a credentials file in the cache's cargo home, every other directory of
            // the tree was granted on its own, through whatever link stood there.
            name: "every cache directory, beside a cargo credentials file",
            plant: Box::new(|tree, out, _| {
                std::fs::write(tree.join("cargo/credentials.toml"), "token = \"x\"\n").unwrap();
                for (_, sub) in VARS.iter().filter(|(v, _)| *v != "CARGO_HOME") {
                    link(&out.join("dir"), &tree.join(sub));
                }
            }),
        },
    ];
    // And each cache directory on its own.
    for (_, sub) in VARS {
        v.push(Case {
            name: sub,
            plant: Box::new(move |tree, out, _| link(&out.join("dir"), &tree.join(sub))),
        });
    }
    v
}

#[test]
fn whatever_a_task_left_in_its_cache_tree_is_replaced_never_followed_nor_granted() {
    assert_eq!(VARS.len(), 15, "a cache directory without a case here");
    let d = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(d.path()).unwrap();
    let state = base.join("state");
    // The operator's cargo settings, both names, copied into every repository's CARGO_HOME.
    let op = base.join("operator/.cargo");
    std::fs::create_dir_all(&op).unwrap();
    std::fs::write(op.join("config.toml"), "[net]\noffline = true\n").unwrap();
    std::fs::write(op.join("config"), "[net]\nretry = 1\n").unwrap();
    let vars = vec![("CARGO_HOME".to_string(), op.to_string_lossy().into_owned())];
    let cfg = Config {
        state_dir: state.clone(),
        ..Config::default()
    };
    // Every task's flight record, and a file the task may not read.
    std::fs::create_dir_all(state.join("tasks/t1")).unwrap();
    std::fs::write(state.join("tasks/t1/record.jsonl"), "{}\n").unwrap();
    let mut failed = Vec::new();
    for (n, case) in cases().into_iter().enumerate() {
        let why = format!("case {n}: {}", case.name);
        let run = std::panic::AssertUnwindSafe(|| {
            // Outside every grant: a 0600 file, a directory holding a `config` and a secret.
            let out = base.join(format!("outside-{n}"));
            std::fs::create_dir_all(out.join("dir")).unwrap();
            for (f, text) in [
                ("stamp", "stamp\n"),
                ("config.toml", "mine\n"),
                ("dir/config", "theirs\n"),
                ("dir/secret", "secret\n"),
            ] {
                std::fs::write(out.join(f), text).unwrap();
                std::fs::set_permissions(out.join(f), std::fs::Permissions::from_mode(0o600))
                    .unwrap();
            }
            let before = (snapshot(&out), snapshot(&state.join("tasks")));
            let ws = base.join(format!("ws-{n}"));
            std::fs::create_dir_all(&ws).unwrap();
            let first = prepare_in_time(&cfg, &ws, &vars).unwrap();
            // The task's CARGO_HOME's parent: the tree it was granted.
            let cargo = first.set.iter().find(|(k, _)| k == "CARGO_HOME").unwrap();
            let tree = Path::new(&cargo.1).parent().unwrap().to_path_buf();
            (case.plant)(&tree, &out, &state);
            let next = prepare_in_time(&cfg, &ws, &vars).unwrap_or_else(|e| panic!("{why}: {e}"));
            assert_eq!(
                (snapshot(&out), snapshot(&state.join("tasks"))),
                before,
                "{why}: what a link pointed to changed"
            );
            assert!(!out.join("nothing-here").exists(), "{why}");
            // Every entry is the daemon's again.
            for (var, value) in &next.set {
                let m = std::fs::symlink_metadata(value).unwrap();
                assert!(m.is_dir(), "{why}: {var} = {value} is not a directory");
            }
            for (name, text) in [
                ("config.toml", "[net]\noffline = true\n"),
                ("config", "[net]\nretry = 1\n"),
            ] {
                let f = Path::new(&cargo.1).join(name);
                let m = std::fs::symlink_metadata(&f).unwrap();
                assert!(m.is_file(), "{why}: {}", f.display());
                assert_eq!(m.permissions().mode() & 0o777, 0o600, "{why}");
                assert_eq!(std::fs::read_to_string(&f).unwrap(), text, "{why}");
            }
            // The next task's sandbox, as `plan` builds it: no rule reaches outside the tree.
            let grants = Grants {
                write: vec![ws.clone(), next.dir.clone()],
                task: true,
                ..Grants::default()
            };
            let tmp = state.join("tmp/t");
            std::fs::create_dir_all(&tmp).unwrap();
            let fs = super::super::grants::fs_policy(&cfg, &[&next.set, &vars], &tmp, &grants);
            let rules: Vec<PathBuf> = fs
                .read
                .iter()
                .chain(&fs.write)
                .flat_map(|g| super::super::landlock::carve(g, &fs.deny))
                .collect();
            for rule in rules {
                let real = std::fs::canonicalize(&rule).unwrap_or(rule.clone());
                assert!(
                    !real.starts_with(&out) && !real.starts_with(state.join("tasks")),
                    "{why}: the next task is granted {} (as {})",
                    real.display(),
                    rule.display()
                );
            }
        });
        // Every case is tried; the failure lists each one that failed.
        if let Err(e) = std::panic::catch_unwind(run) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("{why}: {}", msg.lines().next().unwrap_or_default()));
        }
    }
    assert!(
        failed.is_empty(),
        "{} cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// The daemon's own bookkeeping is out of the tasks' reach: the LRU clock is beside the
/// tree, and what tasks left in the repository's directory when it was theirs (the layout
/// before issue 35) is removed without following a link.
#[test]
fn the_lru_clock_is_outside_the_tree_and_old_entries_beside_it_go() {
    let d = tempfile::tempdir().unwrap();
    let cfg = Config {
        state_dir: d.path().join("state"),
        ..Config::default()
    };
    let ws = d.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let outside = d.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("keep"), "x").unwrap();
    let repo = root(&cfg).join(key_for(&ws));
    std::fs::create_dir_all(repo.join("npm")).unwrap();
    symlink(&outside, repo.join("cargo")).unwrap();
    symlink(outside.join("keep"), repo.join(".last-used")).unwrap();
    let p = prepare(&cfg, &ws, &[]).unwrap();
    assert_eq!(p.repo, repo);
    assert_eq!(p.dir, repo.join(TREE));
    let mut names: Vec<_> = std::fs::read_dir(&repo)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [LAST_USED, TREE]);
    assert!(std::fs::symlink_metadata(repo.join(LAST_USED))
        .unwrap()
        .is_file());
    assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "x");
    for (_, v) in &p.set {
        assert!(Path::new(v).starts_with(&p.dir), "{v}");
    }
    let u = usage(&root(&cfg));
    assert!(u[0].last_used.is_some());
}

/// No grant is derived from a path a task can change, whatever the daemon's preparation
/// did or missed: a link in a write-granted tree named by a variable (the cache's
/// `CARGO_HOME`) gives no read grant or denial of its target; carving a task's tree skips its
/// links; and a canonical grant that no longer resolves to itself is refused when opened.
#[test]
fn no_grant_is_derived_through_a_link_in_a_tree_a_task_writes() {
    let d = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(d.path()).unwrap();
    let (tree, secret) = (base.join("tree"), base.join("secret"));
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::create_dir_all(secret.join("inner")).unwrap();
    symlink(&secret, tree.join("cargo")).unwrap();
    symlink(&secret, tree.join("npm")).unwrap();
    std::fs::create_dir_all(tree.join("real")).unwrap();
    let cfg = Config {
        state_dir: base.join("state"),
        ..Config::default()
    };
    let set = vec![(
        "CARGO_HOME".to_string(),
        tree.join("cargo").to_string_lossy().into_owned(),
    )];
    let grants = Grants {
        write: vec![tree.clone()],
        task: true,
        ..Grants::default()
    };
    let fs = super::super::grants::fs_policy(&cfg, &[&set, &[]], &base.join("tmp"), &grants);
    for p in fs.read.iter().chain(&fs.write).chain(&fs.deny) {
        assert!(
            !p.starts_with(&secret),
            "derived from the link: {}",
            p.display()
        );
    }
    // Carving a task's tree (a denied path inside it) never yields a link.
    let carved = super::super::landlock::carve(&tree, &[tree.join("real")]);
    assert!(carved.is_empty(), "{carved:?}");
    // A canonical path with a link put in it since is not opened.
    let err = beneath::open_exact(&tree.join("cargo/inner")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
    assert!(beneath::open_exact(&secret.join("inner")).unwrap().1);
}
