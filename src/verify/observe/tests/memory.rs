//! What an observation holds: memory per tracked path, and what is kept of a listing.

use super::*;

#[tokio::test]
async fn memory_per_tracked_path_is_compact() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    for d in 0..10 {
        let sub = ws.join(format!("d{d}"));
        std::fs::create_dir(&sub).unwrap();
        for f in 0..1000 {
            std::fs::write(sub.join(format!("f{f:04}.txt")), "x\n").unwrap();
        }
    }
    let env = ChildEnv::inherit();
    let c = CancellationToken::new();
    let before = snapshot(ws, &env, &c).await;
    assert_eq!(before.paths(), 10_000);
    let t = &before.table;
    let bytes = t.names.capacity()
        + t.rows.capacity() * std::mem::size_of::<Row>()
        + t.hashes.capacity() * std::mem::size_of::<(u32, ContentHash)>();
    // 16-byte rows, 12-byte names (with their end) and (these files are fresh, so racy)
    // 20-byte hashes: ~48 bytes a path. The margin is wide: the old map held ~250.
    assert!(bytes < 10_000 * 80, "{bytes} bytes for 10,000 paths");
    assert_eq!(std::mem::size_of::<Row>(), 16);
}

/// `git status` is read as git prints it: a listing far longer than what the git call keeps
/// of its output ([`git::LISTING_CAPTURE`]) is counted whole at both ends, and the snapshot
/// holds each path once (the listing's buffer becomes the table's names).
#[tokio::test]
async fn a_listing_longer_than_the_capture_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    repo_with_a_commit(ws);
    let name = |i: usize| format!("{i:04}-{}.txt", "n".repeat(56));
    let n = 2 * git::LISTING_CAPTURE / name(0).len() + 500;
    for i in 0..n {
        std::fs::write(ws.join(name(i)), "x\n").unwrap();
    }
    let env = ChildEnv::inherit();
    let c = CancellationToken::new();
    let before = snapshot(ws, &env, &c).await;
    assert_eq!(before.paths(), n);
    assert_eq!(before.table.names.len(), n * (name(0).len() + 1));
    assert!(matches!(
        before.source,
        Source::Git {
            incomplete: false,
            ..
        }
    ));
    for i in 0..n {
        std::fs::remove_file(ws.join(name(i))).unwrap();
    }
    for i in 0..n {
        std::fs::write(ws.join(format!("new-{}", name(i))), "y\n").unwrap();
    }
    let obs = observe_with(&before, ws, &env, &c, small(50_000, 5)).await;
    assert_eq!(obs.len(), 6, "{obs:?}");
    // By path: the deletions ("0000-…") come before the additions ("new-…").
    assert_eq!(obs[0], format!("deleted: {} (−2 bytes)", name(0)));
    assert_eq!(
        obs[5],
        format!("… and {} more changes not listed", group_digits(2 * n - 5))
    );
}

/// What the after side keeps of a listing: one byte per row from before and the first
/// `max` new paths, however many paths git lists.
#[test]
fn the_listing_is_kept_as_one_byte_a_row_and_the_first_new_paths() {
    let mut table = Table::default();
    for i in 0..1_000 {
        let p = Probe {
            fp: 7,
            size: 1,
            is_file: true,
            racy: false,
            changed_ns: 0,
        };
        table.push(format!("old/{i:04}").as_bytes(), &p, None);
    }
    table.finish();
    let mut listed = Listed::new(table.rows.len(), 5);
    let entry = |code: &[u8; 2], path: String| git_text::StatusEntry {
        code: *code,
        path: path.into_bytes(),
    };
    listed.add(&table, entry(b" M", "old/0003".into()));
    listed.add(&table, entry(b" D", "old/0004".into()));
    for i in (0..100_000).rev() {
        listed.add(&table, entry(b"??", format!("new/{i:06}")));
    }
    listed.add(&table, entry(b"!!", "dist/".into()));
    assert_eq!(listed.rows.len(), 1_000);
    assert_eq!(listed.rows[3], LISTED | LISTED_TRACKED);
    assert_eq!(listed.rows[4], LISTED | LISTED_TRACKED | LISTED_DELETED);
    assert_eq!(listed.rows.iter().filter(|f| **f != 0).count(), 2);
    assert_eq!(listed.new.total, 100_000);
    let kept: Vec<&[u8]> = listed.new.kept.keys().map(Vec::as_slice).collect();
    assert_eq!(
        kept,
        [
            &b"new/000000"[..],
            b"new/000001",
            b"new/000002",
            b"new/000003",
            b"new/000004"
        ]
    );
    assert_eq!(listed.ignored, [b"dist/".to_vec()]);
}

/// A nest deeper than the walk enters (a task can make one 30,000 deep): the walk stops at
/// its depth, the rest is one coarse root, and a change below that depth still shows as a
/// change of it.
#[tokio::test]
async fn a_nest_deeper_than_the_walk_is_seen_coarsely() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let deep = (0..200).fold(ws.join("nest"), |p, _| p.join("d"));
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(ws.join("top.txt"), "t\n").unwrap();
    let mut files = Vec::new();
    let (capped, coarse) = walk(ws, 1000, |rel, _, _| files.push(rel.to_vec()));
    assert!(!capped);
    assert_eq!(files, vec![b"top.txt".to_vec()]);
    assert_eq!(coarse.roots.len(), 1, "one directory past the depth");
    let env = ChildEnv::inherit();
    let c = CancellationToken::new();
    let before = snapshot(ws, &env, &c).await;
    std::fs::write(deep.join("planted"), "p\n").unwrap();
    let obs = observe(&before, ws, &env, &c).await;
    assert!(!is_unchanged(&obs), "{obs:?}");
}
