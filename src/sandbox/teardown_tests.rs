use std::os::unix::fs::{symlink, PermissionsExt};

use proptest::prelude::*;

use super::*;

/// A chain of `depth` directories under `top` (made iteratively, one descriptor held), a
/// file every 1,000 levels.
fn nest(top: &Path, depth: usize) {
    std::fs::create_dir_all(top).unwrap();
    let mut cur = rustix::fs::open(top, DIR_FLAGS, Mode::empty()).unwrap();
    for i in 0..depth {
        rustix::fs::mkdirat(&cur, "d", Mode::from_raw_mode(0o700)).unwrap();
        if i % 1000 == 0 {
            let f = rustix::fs::openat(
                &cur,
                "f",
                OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .unwrap();
            drop(f);
        }
        cur = rustix::fs::openat(&cur, "d", DIR_FLAGS, Mode::empty()).unwrap();
    }
}

/// Run `f` on a thread with a small stack (64 KiB): a removal that recursed per level would
/// overflow it within a few hundred levels.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

/// A temp dir on a tmpfs where there is one (`/dev/shm`): 30,000 directory creations and
/// removals take seconds there and minutes on a busy ext4 journal.
fn fast_tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap())
}

#[test]
fn a_30000_deep_nest_is_removed_on_a_small_stack() {
    let d = fast_tempdir();
    let top = d.path().join("tmp-task");
    nest(&top, 30_000);
    // A closed directory and a read-only one on the way, as a task may leave them.
    let mode = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    mode(&top.join("d/d/d"), 0o500).unwrap();
    mode(&top.join("d/d/d/d/d"), 0o000).unwrap();
    let t = top.clone();
    // Through the daemon's one entry point for task-written trees.
    on_small_stack(move || crate::sandbox::beneath::remove_tree(&t)).unwrap();
    assert!(!top.exists());
    assert!(
        d.path().read_dir().unwrap().next().is_none(),
        "nothing moved out"
    );
}

#[test]
fn a_removal_over_its_budget_is_set_aside_and_listed() {
    let d = tempfile::tempdir().unwrap();
    let top = d.path().join("t1");
    nest(&top, 100);
    let r = remove_or_set_aside_within(&top, &mut Budget::new(10, Duration::from_secs(60)));
    let Removal::SetAside { to, why } = r else {
        panic!("{r:?}")
    };
    assert!(!top.exists() && to.exists(), "{}", to.display());
    assert!(to.starts_with(d.path().join(SET_ASIDE)));
    assert!(why.contains("budget"), "{why}");
    assert_eq!(set_aside_in(d.path()).len(), 1);
    // Removed (as a tree like any other) when asked with a budget that is enough.
    remove_path(&to, &mut Budget::unlimited()).unwrap();
    assert!(set_aside_in(d.path()).is_empty());
}

/// One entry of a generated tree: what it is and under which earlier directory.
#[derive(Debug, Clone)]
enum Node {
    Dir { parent: usize, mode: u32 },
    File { parent: usize },
    LinkOut { parent: usize },
    LinkUp { parent: usize },
    Fifo { parent: usize },
}

fn node() -> impl Strategy<Value = Node> {
    let parent = 0usize..64;
    prop_oneof![
        4 => (parent.clone(), prop_oneof![Just(0o700u32), Just(0o500), Just(0o000), Just(0o300)])
            .prop_map(|(parent, mode)| Node::Dir { parent, mode }),
        3 => parent.clone().prop_map(|parent| Node::File { parent }),
        1 => parent.clone().prop_map(|parent| Node::LinkOut { parent }),
        1 => parent.clone().prop_map(|parent| Node::LinkUp { parent }),
        1 => parent.prop_map(|parent| Node::Fifo { parent }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever a task leaves (any shape, modes taken away, links out of the tree and back
    /// up it, FIFOs), the tree goes, with a stack of 2 to 5 held directories (so deep
    /// directories are moved up), and nothing outside it changes.
    #[test]
    fn any_tree_is_removed_and_nothing_outside_it_changes(
        nodes in prop::collection::vec(node(), 1..80),
        chain in 0usize..40,
        held in 2usize..6,
    ) {
        let d = tempfile::tempdir().unwrap();
        let (top, outside) = (d.path().join("tree"), d.path().join("outside"));
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let outside_mode = std::fs::metadata(&outside).unwrap().permissions().mode();
        nest(&top, chain);
        let mut dirs = vec![top.clone()];
        let mut modes = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            let at = |p: &usize| dirs[p % dirs.len()].join(format!("n{i}"));
            match n {
                Node::Dir { parent, mode } => {
                    let p = at(parent);
                    std::fs::create_dir(&p).unwrap();
                    modes.push((p.clone(), *mode));
                    dirs.push(p);
                }
                Node::File { parent } => std::fs::write(at(parent), "f").unwrap(),
                Node::LinkOut { parent } => symlink(&outside, at(parent)).unwrap(),
                Node::LinkUp { parent } => symlink("..", at(parent)).unwrap(),
                Node::Fifo { parent } => {
                    rustix::fs::mknodat(
                        rustix::fs::CWD,
                        at(parent),
                        FileType::Fifo,
                        Mode::from_raw_mode(0o600),
                        0,
                    )
                    .unwrap();
                }
            }
        }
        // Deepest first, so a closed directory does not stop the next chmod.
        for (p, m) in modes.iter().rev() {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(*m)).unwrap();
        }
        let parent = rustix::fs::open(d.path(), DIR_FLAGS, Mode::empty()).unwrap();
        let budget = &mut Budget::unlimited();
        let root = rustix::fs::openat(&parent, "tree", DIR_FLAGS, Mode::empty()).unwrap();
        empty(root, budget, held).unwrap();
        rmdir(parent.as_fd(), OsStr::new("tree")).unwrap();
        prop_assert!(!top.exists());
        prop_assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "x");
        prop_assert_eq!(
            std::fs::metadata(&outside).unwrap().permissions().mode(),
            outside_mode
        );
    }
}

/// Found by the property as the service user: a read-only directory deeper than the stack
/// cannot move up until it is writable itself (its `..` changes).
#[test]
fn a_read_only_directory_below_the_stack_moves_up_and_goes() {
    let d = tempfile::tempdir().unwrap();
    let top = d.path().join("tree");
    std::fs::create_dir_all(top.join("a/ro/deeper")).unwrap();
    std::fs::set_permissions(top.join("a/ro"), std::fs::Permissions::from_mode(0o500)).unwrap();
    let root = rustix::fs::open(&top, DIR_FLAGS, Mode::empty()).unwrap();
    empty(root, &mut Budget::unlimited(), 2).unwrap();
    assert!(top.read_dir().unwrap().next().is_none());
}
