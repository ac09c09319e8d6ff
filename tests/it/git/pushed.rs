//! Push protection reads what is pushed (issue 43, row 2): the agent's key reaches the
//! remote in no object the push sends, whatever rendering of the change hides it (the name
//! of an empty file or directory, an extra commit header, a message under an `encoding`
//! header, a tree written from a poisoned cache-tree), and a task never chooses the base
//! the next task branches from.
//!
//! An operator's checkout as `repo_dir`: its git directory is in the workspace, so the
//! task's own git writes objects, refs and the index there, as an agent's does. "Nothing
//! pushed" is every ref of the remote unchanged and no object in its store holding the key.

use super::*;
use crate::harness::Setup;

/// The agent's key, as the operator lists it in `secrets`.
const KEY: &str = "listed-secret-4Kd8wQz";

/// A daemon on an operator's checkout of a fresh remote, knowing [`KEY`].
async fn checkout(s: &Setup) -> (Remote, PathBuf, Config) {
    let remote = Remote::new();
    let work = s.dir().join("checkout");
    git(s.dir(), &["clone", "-q", &remote.url(), "checkout"]);
    let mut c = base_cfg(&s.hub, s.dir());
    c.repo_dir = Some(work.clone());
    c.secrets = vec![KEY.to_string()];
    // A push from an operator's directory to a remote on local disk needs that remote in
    // the sandbox's write paths.
    c.sandbox.write_paths.push(remote.path());
    (remote, work, c)
}

/// Run the shell task `cmd` (the agent) on the checkout; its result.
async fn run(s: Setup, c: Config, id: &str, cmd: &str) -> Value {
    let h = s.start(c).await;
    let mut t = sample_shell_task(id, cmd);
    t["description"] = json!("Hostile change");
    t["verification_steps"] = json!([]);
    h.assign(t);
    let done = terminal(h.hub(), id).await;
    h.finish().await;
    assert_eq!(done["type"], "task_complete", "{done}");
    done["result"].clone()
}

/// The refusal: nothing pushed, a finding at `path` (line `line`) naming the key's source,
/// and the key itself nowhere in the result.
fn refused(r: &Value, path: &str, line: u64) {
    assert_eq!(r["pushed"], false, "{r}");
    assert!(r.get("commit").is_none(), "{r}");
    assert_eq!(r["publish_refused"]["reason"], "credential", "{r}");
    let findings = r["publish_refused"]["findings"].as_array().unwrap();
    assert!(
        findings.iter().any(|f| f["path"] == path
            && f["line"] == line
            && f["what"] == "a `secrets` value (verbatim)"),
        "no finding at {path}:{line}: {r}"
    );
    assert!(
        !r.to_string().contains(KEY),
        "the refusal names the key: {r}"
    );
}

/// A commit object the agent writes by hand on HEAD (its work tree's `work.txt` staged in
/// it), with extra header lines `headers` and message `message`, then moves HEAD to.
fn hand_made_commit(headers: &str, message: &str) -> String {
    format!(
        "echo work > work.txt && git add work.txt && \
         printf 'tree %s\\nparent %s\\nauthor A <a@x> 1700000000 +0000\\ncommitter A <a@x> 1700000000 +0000\\n{headers}\\n{message}\\n' \
           \"$(git write-tree)\" \"$(git rev-parse HEAD)\" | git hash-object -t commit -w --stdin > commit.id && \
         git update-ref HEAD \"$(cat commit.id)\" && rm commit.id"
    )
}

/// An empty file named after the key, and a directory named after it holding only an
/// empty file: `git diff` prints no `+++` line for either, so the diff scan never saw the
/// names. Each tree's entry names are read now.
#[tokio::test]
async fn a_key_in_the_name_of_an_empty_file_or_directory_is_refused() {
    let s = Harness::setup().await;
    let (remote, _work, c) = checkout(&s).await;
    let before = remote.refs();
    let cmd = format!("touch '{KEY}.txt' && mkdir -p 'd/{KEY}' && touch 'd/{KEY}/.keep'");
    let r = run(s, c, "names", &cmd).await;
    refused(&r, "(names in /)", 4);
    refused(&r, "(names in d/)", 1);
    remote.assert_untouched(&before, &[KEY], "names");
}

/// A commit object the agent wrote with an extra header holding the key: the log's
/// rendering of authors and message never showed it. The commit's raw bytes are read now.
#[tokio::test]
async fn a_key_in_an_extra_header_of_the_agents_commit_is_refused() {
    let s = Harness::setup().await;
    let (remote, _work, c) = checkout(&s).await;
    let before = remote.refs();
    let cmd = hand_made_commit(&format!("x-note {KEY}\\n"), "Update work");
    let r = run(s, c, "header", &cmd).await;
    assert_eq!(r["pushed"], false, "{r}");
    let id = r["publish_refused"]["findings"][0]["path"].clone();
    assert!(id.as_str().unwrap_or("").starts_with("(commit "), "{r}");
    refused(&r, id.as_str().unwrap(), 5);
    remote.assert_untouched(&before, &[KEY], "extra header");
}

/// A commit message holding the key under an `encoding IBM037` header: `%B` re-encoded
/// it into other bytes. The message is read as stored now.
#[tokio::test]
async fn a_key_in_a_message_under_an_encoding_header_is_refused() {
    let s = Harness::setup().await;
    let (remote, _work, c) = checkout(&s).await;
    let before = remote.refs();
    let cmd = hand_made_commit("encoding IBM037\\n", &format!("Update {KEY}"));
    let r = run(s, c, "encoding", &cmd).await;
    assert_eq!(r["pushed"], false, "{r}");
    let id = r["publish_refused"]["findings"][0]["path"].clone();
    assert!(id.as_str().unwrap_or("").starts_with("(commit "), "{r}");
    refused(&r, id.as_str().unwrap(), 7);
    remote.assert_untouched(&before, &[KEY], "encoding header");
}

/// An index whose entries hold a benign `sub/a.txt` but whose cache-tree names the trees
/// of one holding the key: `git diff --cached` shows the benign file, `git commit` (and
/// `git write-tree`) write the cached trees. The tree the daemon's commit holds is read now.
#[tokio::test]
async fn a_poisoned_cache_tree_in_the_index_is_refused() {
    let s = Harness::setup().await;
    let (remote, _work, c) = checkout(&s).await;
    let before = remote.refs();
    // Build the key's trees, then the benign ones (the file's mtime set back, so no entry
    // is racily clean and refreshed), and swap the tree ids in the index's cache-tree
    // extension, checksum redone: every entry's stat data stays true, so the daemon's
    // `git add -A` keeps the cached trees.
    let patch = r#"perl -MDigest::SHA=sha1 -e 'open(F, "<", ".git/index") or die; binmode F; local $/; my $d = <F>; close F; $d = substr($d, 0, -20); while (@ARGV) { my ($x, $y) = map { pack("H*", $_) } splice(@ARGV, 0, 2); $d =~ s/\Q$x\E/$y/ or die "no $x" } open(F, ">", ".git/index") or die; binmode F; print F $d, sha1($d); close F'"#;
    let cmd = format!(
        "mkdir -p sub && echo '{KEY}' > sub/a.txt && git add sub && E=$(git write-tree) && \
         echo benign > sub/a.txt && touch -d @1700000000 sub/a.txt && git add sub && B=$(git write-tree) && \
         {patch} \"$B\" \"$E\" \"$(git rev-parse \"$B:sub\")\" \"$(git rev-parse \"$E:sub\")\" && \
         test \"$(git write-tree)\" = \"$E\" && git diff --cached --stat"
    );
    let r = run(s, c, "cache-tree", &cmd).await;
    refused(&r, "sub/a.txt", 1);
    remote.assert_untouched(&before, &[KEY], "cache-tree");
}

/// A task moves the checkout's `refs/remotes/origin/trunk` to a commit of its own holding
/// the key and leaves nothing else; the next, benign task must branch from what the remote
/// has, and push only its own commit.
#[tokio::test]
async fn a_base_a_task_moved_is_never_the_next_tasks_base() {
    let s = Harness::setup().await;
    let (remote, work, c) = checkout(&s).await;
    let before = remote.refs();
    let trunk = remote.git(&["rev-parse", "trunk"]).trim().to_string();
    let h = s.start(c).await;
    let mut t = sample_shell_task(
        "plant",
        &format!(
            "echo '{KEY}' > planted.txt && git add planted.txt && \
             git -c user.name=A -c user.email=a@x commit -qm planted && \
             git update-ref refs/remotes/origin/trunk HEAD && git reset -q --hard HEAD~1"
        ),
    );
    t["description"] = json!("Plant a base");
    t["verification_steps"] = json!([]);
    h.assign(t);
    let r = terminal(h.hub(), "plant").await["result"].clone();
    assert_eq!(r["pushed"], false, "{r}");
    let planted = git(&work, &["rev-parse", "refs/remotes/origin/trunk"]);
    assert_ne!(planted.trim(), trunk, "the task moved the local ref");
    remote.assert_untouched(&before, &[KEY], "the planting task");

    let mut t = sample_shell_task("benign", "echo hello > hello.txt");
    t["description"] = json!("Say hello");
    t["verification_steps"] = json!([]);
    h.assign(t);
    let r = terminal(h.hub(), "benign").await["result"].clone();
    h.finish().await;
    assert_eq!(r["pushed"], true, "{r}");
    let branch = r["branch"].as_str().unwrap();
    let commit = r["commit"].as_str().unwrap();
    assert_eq!(remote.git(&["rev-parse", branch]).trim(), commit);
    // One commit on the remote's trunk: the base came from the remote.
    assert_eq!(
        remote.git(&["rev-list", "--parents", "-n1", commit]).trim(),
        format!("{commit} {trunk}"),
        "{r}"
    );
    assert!(
        remote.objects_holding(&[KEY]).is_empty(),
        "the key reached the remote"
    );
}
