//! pip and uv install from a loopback package index (PEP 503) into the repository's cache;
//! uv's next task installs the wheel again with the index no longer serving it.

use std::collections::HashMap;
use std::path::Path;

use super::{can_run, completed, only_cache, open_cfg, run};
use crate::harness::Harness;
use crate::loopback::Loopback;

/// A pure-python wheel (`tinywheel`, `VALUE = 7`), made with python's own zipfile.
fn make_wheel(dir: &Path) -> Vec<u8> {
    let path = dir.join("tinywheel-1.0-py3-none-any.whl");
    let script = r#"
import sys, zipfile
files = {
    "tinywheel/__init__.py": "VALUE = 7\n",
    "tinywheel-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinywheel\nVersion: 1.0\n",
    "tinywheel-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = "".join(f"{name},,\n" for name in files) + "tinywheel-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
    z.writestr("tinywheel-1.0.dist-info/RECORD", record)
"#;
    let ok = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::read(path).unwrap()
}

/// Where [`wheel_index`] serves the wheel.
const WHEEL: &str = "/files/tinywheel-1.0-py3-none-any.whl";

/// A loopback package index (PEP 503 simple page) serving one wheel, `tinywheel`, at
/// [`WHEEL`], with its sha256 in the link as pip and uv check it.
async fn wheel_index(dir: &Path) -> Loopback {
    let wheel = make_wheel(dir);
    let sha = {
        use sha2::Digest as _;
        sha2::Sha256::digest(&wheel)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    Loopback::serve(|url| {
        let page = format!(
            "<html><body><a href=\"{url}{WHEEL}#sha256={sha}\">tinywheel-1.0-py3-none-any.whl</a></body></html>"
        );
        HashMap::from([
            ("/simple/tinywheel/".to_string(), page.into_bytes()),
            (WHEEL.to_string(), wheel),
        ])
    })
    .await
}

/// pip installs from a (loopback) index under containment, with its cache pointed into the
/// repository's. (pip 23 on the test machine stores no HTTP responses even unconfined, so
/// reuse across tasks is shown with cargo and npm; here, that pip is handed the cache.)
#[tokio::test]
async fn pip_installs_from_an_index_with_its_cache_in_the_repositorys() {
    if !can_run(&["python3"]) {
        return;
    }
    let venv_works = std::process::Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .status()
        .is_ok_and(|s| s.success());
    let why = (!venv_works)
        .then(|| "python3 has no venv/ensurepip (apt-get install python3-venv)".into());
    if !crate::util::require("venv", why) {
        return;
    }
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let index = wheel_index(&dir).await;
    let (c, _ws) = open_cfg(&s);
    let h = s.start(c).await;
    let cmd = format!(
        "python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check --index-url {}/simple/ tinywheel 2>&1 && .venv/bin/python -c 'import tinywheel; assert tinywheel.VALUE == 7' && .venv/bin/pip cache dir",
        index.url()
    );
    let done = run(h.hub(), "pip-1", &cmd).await;
    assert!(completed(&done), "{done}");
    assert!(
        index.hits().iter().any(|p| p == WHEEL),
        "the wheel came from the index"
    );
    let pip_cache = only_cache(&dir).join("pip");
    let out = done["result"]["output"].as_str().unwrap_or_default();
    assert!(
        out.lines().any(|l| Path::new(l.trim()) == pip_cache),
        "pip's cache is the repository's ({}): {out}",
        pip_cache.display()
    );
    h.finish().await;
}

/// uv installs from a (loopback) index under containment into the repository's cache, and
/// the next task on the repository installs the same wheel with the index no longer serving
/// it: from the cache.
#[tokio::test]
async fn uv_installs_from_an_index_and_the_next_task_installs_from_the_cache() {
    if !can_run(&["uv", "python3"]) {
        return;
    }
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let index = wheel_index(&dir).await;
    let (c, _ws) = open_cfg(&s);
    let h = s.start(c).await;
    let install = |venv: &str| {
        format!(
            "rm -rf {venv} && uv venv -q --python python3 {venv} 2>&1 && uv pip install -q --python {venv}/bin/python --index-url {}/simple/ tinywheel 2>&1 && {venv}/bin/python -c 'import tinywheel; assert tinywheel.VALUE == 7' && echo \"cache=$UV_CACHE_DIR\"",
            index.url()
        )
    };
    let first = run(h.hub(), "uv-1", &install(".venv-a")).await;
    assert!(completed(&first), "{first}");
    assert!(
        index.hits().iter().any(|p| p == WHEEL),
        "the wheel came from the index"
    );
    let uv_cache = only_cache(&dir).join("uv");
    let out = first["result"]["output"].as_str().unwrap_or_default();
    assert!(
        out.contains(&format!("cache={}", uv_cache.display())),
        "uv's cache is the repository's ({}): {out}",
        uv_cache.display()
    );
    index.remove(WHEEL);
    let fetched = index.hits().iter().filter(|p| *p == WHEEL).count();
    let second = run(h.hub(), "uv-2", &install(".venv-b")).await;
    assert!(completed(&second), "installed from the cache: {second}");
    assert_eq!(
        index.hits().iter().filter(|p| *p == WHEEL).count(),
        fetched,
        "the second task fetched the wheel again"
    );
    h.finish().await;
}
