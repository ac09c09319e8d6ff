//! `[network] mode = "allowlist"`: a task's only way out is the daemon's proxy, which lets
//! through the hosts on the list (plain HTTP and CONNECT tunnels) and the task's repository
//! host (its own git over HTTPS), and refuses the rest; a check that needed a refused host
//! is an infrastructure error naming it.

use std::collections::HashMap;
use std::path::Path;

use hub_sidecar::config::NetworkMode;
use hub_sidecar::mock_hub::sample_shell_task;
use serde_json::json;

use crate::denials::check_error;
use crate::git::{git, terminal};
use crate::harness::Harness;
use crate::loopback::{test_ca, tls_front, Loopback};
use crate::util::{wait_until, write_config, T};

/// A python one-liner run with the proxy variables the sandbox set, minus NO_PROXY (the
/// stand-in hosts are loopback addresses, which NO_PROXY names).
fn via_proxy(py: &str) -> String {
    format!("env NO_PROXY= no_proxy= python3 -c \"{py}\"")
}

#[tokio::test]
async fn the_allowlist_lets_listed_hosts_through_the_proxy_and_nothing_else() {
    if !crate::containment::supported() {
        return;
    }
    if !crate::util::require("python3", crate::util::missing_tool("python3")) {
        return;
    }
    let server =
        Loopback::serve(|_| HashMap::from([("/x".to_string(), b"through-the-proxy".to_vec())]))
            .await;
    let port = server.addr.port();
    // Nothing listens there: an allowed host that does not answer.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let s = Harness::setup().await;
    let (mut c, _ws) = s.cfg_with_workspace();
    c.network.mode = NetworkMode::Allowlist;
    // The host's loopback is reached only where an entry names the exact `host:port`.
    c.network.allow = vec![format!("127.0.0.1:{port}"), format!("127.0.0.1:{closed}")];
    let h = s.start(c).await;

    // Plain HTTP to an allowed host, through HTTP_PROXY.
    let get = |host: &str| {
        via_proxy(&format!(
            "import urllib.request; print(urllib.request.urlopen('http://{host}:{port}/x', timeout=10).read().decode())"
        ))
    };
    let get_port = |p: u16| {
        via_proxy(&format!(
            "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{p}/x', timeout=10).read().decode())"
        ))
    };
    h.assign(sample_shell_task("allowed", &get("127.0.0.1")));
    let done = terminal(h.hub(), "allowed").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(done["result"]["output"]
        .as_str()
        .unwrap_or_default()
        .contains("through-the-proxy"));

    // A CONNECT tunnel to an allowed host (what HTTPS clients do), bytes untouched.
    let tunnel = via_proxy(&format!(
        "import socket; s = socket.create_connection(('127.0.0.1', 3128)); s.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\\\r\\\\n\\\\r\\\\n'); assert b' 200 ' in s.recv(100); s.sendall(b'GET /x HTTP/1.1\\\\r\\\\nHost: t\\\\r\\\\n\\\\r\\\\n'); d = b''\nwhile True:\n    c = s.recv(4096)\n    if not c: break\n    d += c\nprint(d.decode())"
    ));
    h.assign(sample_shell_task("tunnel", &tunnel));
    let done = terminal(h.hub(), "tunnel").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(
        done["result"]["output"]
            .as_str()
            .unwrap_or_default()
            .contains("through-the-proxy"),
        "{done}"
    );

    // Straight to the host's loopback, around the proxy: there is no route.
    let direct = format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)\""
    );
    h.assign(sample_shell_task("direct", &direct));
    let done = terminal(h.hub(), "direct").await;
    assert_eq!(done["type"], "task_failed", "{done}");

    // A host not on the list is refused by the proxy (never connected), and a check that
    // needed it is an infrastructure error naming it.
    let before = server.hits().len();
    let out = check_error(&h, sample_shell_task("refused", "true"), &get("127.0.0.2")).await;
    assert!(out.contains(&format!("refused 127.0.0.2:{port}")), "{out}");
    assert!(
        out.contains(&format!("add \"127.0.0.2:{port}\" to `[network] allow`")),
        "{out}"
    );
    // Another port of a listed loopback address: refused too.
    let other = if port ^ 1 == closed {
        port ^ 2
    } else {
        port ^ 1
    };
    let out = check_error(
        &h,
        sample_shell_task("other-port", "true"),
        &get_port(other),
    )
    .await;
    assert!(out.contains(&format!("refused 127.0.0.1:{other}")), "{out}");
    assert_eq!(
        server.hits().len(),
        before,
        "the refused request reached no server"
    );

    // An allowed host that does not answer (nothing listens on the port): the proxy's 502
    // is an infrastructure error naming the host and why, not a failure of the task's code.
    let get_closed = via_proxy(&format!(
        "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{closed}/x', timeout=10)"
    ));
    let out = check_error(&h, sample_shell_task("down", "true"), &get_closed).await;
    assert!(
        out.contains(&format!("could not reach 127.0.0.1:{closed}")),
        "{out}"
    );
    assert!(out.contains("refused"), "the connect error is said: {out}");
    let down = show_when_recorded(h.dir(), "down").await;
    assert!(down.contains("1 could not be made"), "{down}");
    // The same unreachable host earlier in a task does not make a later, real failure an
    // infrastructure error: only output that shows the proxy's answer does.
    let mut task = sample_shell_task("down-then-fail", &format!("{get_closed} 2>/dev/null; true"));
    task["verification_steps"] =
        json!([{"type": "command_succeeds", "target": "echo the real failure; exit 1"}]);
    h.assign(task);
    let done = terminal(h.hub(), "down-then-fail").await;
    assert_eq!(
        done["result"]["termination_reason"], "retries_exhausted",
        "{done}"
    );

    // Every host, allowed or refused, with its bytes, is in the flight record and `show`.
    let allowed = show_when_recorded(h.dir(), "allowed").await;
    assert_downloaded(&allowed, &format!("127.0.0.1:{port}"));
    let refused = show_when_recorded(h.dir(), "refused").await;
    assert!(
        refused.contains(&format!("REFUSED 127.0.0.2:{port}")),
        "{refused}"
    );
    h.finish().await;
}

/// `hub-sidecar show <id>` once the task's flight record has its terminal line.
async fn show_when_recorded(state: &Path, id: &str) -> String {
    let record = state.join("tasks").join(id).join("record.jsonl");
    let recorded = || {
        std::fs::read_to_string(&record)
            .unwrap_or_default()
            .contains("\"kind\":\"terminal\"")
    };
    assert!(wait_until(recorded, T).await, "{id} was never recorded");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hub-sidecar"))
        .args(["show", id, "--state-dir"])
        .arg(state)
        .env_remove("HUB_SIDECAR_CONFIG")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `show` lists `target` as allowed, with bytes down.
fn assert_downloaded(show: &str, target: &str) {
    let line = show
        .lines()
        .find(|l| l.contains(&format!("allowed {target}")))
        .unwrap_or_else(|| panic!("{target} not in:\n{show}"));
    assert!(!line.contains("0.0 KiB down"), "bytes are counted: {line}");
}

/// A bare repository `<name>.git` with one commit on `main` holding `file`, as git's dumb
/// HTTP protocol serves it (`git update-server-info` writes the refs and packs lists): URL
/// path under `/<name>.git/` → bytes.
fn dumb_http_repo(dir: &Path, name: &str, file: (&str, &str)) -> HashMap<String, Vec<u8>> {
    let src = dir.join(format!("{name}-src"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join(file.0), file.1).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    git(&src, &["add", "."]);
    git(&src, &["commit", "-qm", name]);
    let bare = dir.join(format!("{name}.git"));
    git(
        dir,
        &[
            "clone",
            "-q",
            "--bare",
            &src.to_string_lossy(),
            &bare.to_string_lossy(),
        ],
    );
    git(&bare, &["update-server-info"]);
    let mut files = HashMap::new();
    let mut todo = vec![bare.clone()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let rel = p
                    .strip_prefix(&bare)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                files.insert(format!("/{name}.git/{rel}"), std::fs::read(&p).unwrap());
            }
        }
    }
    files
}

/// Under the default `allowlist`, a task's own git reaches its repository's HTTPS remote
/// through the proxy (the remote's host is let through for the task without being listed),
/// with the CA the operator passes (`GIT_SSL_CAINFO` in `[env] allow`); another host is
/// refused, and a check that needed it is an infrastructure error naming it.
#[tokio::test]
async fn the_tasks_git_reaches_its_https_remote_through_the_proxy_and_no_other_host() {
    if !crate::containment::supported() {
        return;
    }
    if !crate::util::require("git", crate::util::missing_tool("git")) {
        return;
    }
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let mut files = dumb_http_repo(&dir, "app", ("README", "app\n"));
    files.extend(dumb_http_repo(
        &dir,
        "dep",
        ("dep.txt", "from-the-dep-remote\n"),
    ));
    let server = Loopback::serve(|_| files).await;
    let (port, _) = tls_front(server.addr).await;
    let ca = test_ca();
    // Nothing listed: the repository's host is what the task may reach. (Dumb HTTP takes
    // no push: nothing to publish.)
    let extra = "[env]\nallow = [\"GIT_SSL_CAINFO\"]\n[git]\nenabled = false\n[network]\nmode = \"allowlist\"\nallow = []\n";
    let config = write_config(&s.hub, &dir, "test-token", extra);
    let mut text = std::fs::read_to_string(&config).unwrap();
    // The config ends in its `[sandbox]` table: the CA is readable to the children.
    text.push_str(&format!("read_paths = [\"{}\"]\n", ca.display()));
    std::fs::write(&config, text).unwrap();
    let ca_env = ca.to_string_lossy().into_owned();
    let h = s
        .start_bin_written(&[("GIT_SSL_CAINFO", ca_env.as_str())])
        .await;

    // NO_PROXY names loopback, where the stand-in remote is: cleared, so git uses the proxy.
    let task = |id: &str, cmd: &str| {
        let mut t = sample_shell_task(id, &format!("export NO_PROXY= no_proxy=; {cmd}"));
        t["repo"] = json!(format!("https://127.0.0.1:{port}/app.git"));
        t["branch"] = json!("main");
        t
    };
    h.assign(task(
        "git-https",
        &format!("git ls-remote origin 2>&1 && git clone -q https://127.0.0.1:{port}/dep.git dep 2>&1 && cat dep/dep.txt"),
    ));
    let done = terminal(h.hub(), "git-https").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(
        done["result"]["output"]
            .as_str()
            .unwrap_or_default()
            .contains("from-the-dep-remote"),
        "{done}"
    );
    let before = server.hits().len();
    let out = check_error(
        &h,
        task("git-refused", "true"),
        &format!("NO_PROXY= no_proxy= git ls-remote https://localhost:{port}/app.git"),
    )
    .await;
    assert!(out.contains(&format!("refused localhost:{port}")), "{out}");
    assert!(out.contains("[network] allow"), "{out}");

    let allowed = show_when_recorded(h.dir(), "git-https").await;
    assert_downloaded(&allowed, &format!("127.0.0.1:{port}"));
    let refused = show_when_recorded(h.dir(), "git-refused").await;
    assert!(
        refused.contains(&format!("REFUSED localhost:{port}")),
        "{refused}"
    );
    // The refused task's only requests were the daemon's own refresh of its workspace.
    assert!(
        server.hits()[before..]
            .iter()
            .all(|p| p.starts_with("/app.git/")),
        "{:?}",
        &server.hits()[before..]
    );
    h.finish().await;
}

/// The proxy is reached only through its port inside the task's namespace: no socket file
/// a task (this one or another) could connect to, no descriptor inherited by the command
/// over which it could hand the daemon a socket of its own.
#[tokio::test]
async fn a_task_has_no_channel_to_the_proxy_but_its_port() {
    if !crate::containment::supported() {
        return;
    }
    let s = Harness::setup().await;
    let (mut c, ws) = s.cfg_with_workspace();
    c.network.mode = NetworkMode::Allowlist;
    let h = s.start(c).await;
    h.assign(sample_shell_task(
        "fds",
        "ls -l /proc/self/fd > fds.txt; while [ ! -e go ]; do sleep 0.02; done; cat fds.txt",
    ));
    assert!(wait_until(|| ws.join("fds.txt").exists(), T).await);
    // While the task runs: no socket under the state directory but the operator's status
    // socket.
    let mut sockets = Vec::new();
    let mut dirs = vec![h.dir().to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                dirs.push(e.path());
            } else if std::os::unix::fs::FileTypeExt::is_socket(&t)
                && e.file_name() != "status.sock"
            {
                sockets.push(e.path());
            }
        }
    }
    assert!(
        sockets.is_empty(),
        "sockets a task could reach: {sockets:?}"
    );
    std::fs::write(ws.join("go"), "").unwrap();
    let done = terminal(h.hub(), "fds").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    // The command's descriptors (as `ls` inherits them): its pipes, /dev/null, whatever the test
    // runner passed down, but no socket.
    let fds = done["result"]["output"].as_str().unwrap_or_default();
    assert!(fds.contains("pipe:"), "{fds}");
    assert!(!fds.contains("socket:"), "{fds}");
    h.finish().await;
}
