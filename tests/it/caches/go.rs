//! Go modules: `go test` of a module with one dependency fetched from a loopback module proxy
//! (the GOPROXY protocol: `list`, `.info`, `.mod`, `.zip`), then again by the next task with
//! no proxy at all: from the repository's module cache (`GOMODCACHE`).

use std::collections::HashMap;
use std::path::Path;

use super::{can_run, completed, only_cache, open_cfg, run};
use crate::harness::Harness;
use crate::loopback::Loopback;

/// The dependency's module path.
const MODULE: &str = "example.test/dep";

/// Its `go.mod`.
const DEP_GO_MOD: &str = "module example.test/dep\n\ngo 1.19\n";

/// The module zip a proxy serves for `MODULE@v1.0.0` (every file under
/// `<module>@<version>/`), made with python's zipfile.
fn module_zip(dir: &Path) -> Vec<u8> {
    let path = dir.join("dep-v1.0.0.zip");
    let script = r#"
import sys, zipfile
prefix = "example.test/dep@v1.0.0/"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr(prefix + "go.mod", sys.argv[2])
    z.writestr(prefix + "dep.go", "package dep\n\n// Two is two.\nfunc Two() int { return 2 }\n")
"#;
    let ok = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .arg(DEP_GO_MOD)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::read(path).unwrap()
}

#[tokio::test]
async fn go_fetches_a_module_once_and_the_next_task_builds_from_the_module_cache() {
    if !can_run(&["go", "python3"]) {
        return;
    }
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let zip = module_zip(&dir);
    let at = |file: &str| format!("/{MODULE}/@v/{file}");
    let proxy = Loopback::serve(|_| {
        HashMap::from([
            (at("list"), b"v1.0.0\n".to_vec()),
            (
                at("v1.0.0.info"),
                br#"{"Version":"v1.0.0","Time":"2024-01-01T00:00:00Z"}"#.to_vec(),
            ),
            (at("v1.0.0.mod"), DEP_GO_MOD.as_bytes().to_vec()),
            (at("v1.0.0.zip"), zip),
        ])
    })
    .await;
    let (c, ws) = open_cfg(&s);
    std::fs::write(
        ws.join("go.mod"),
        format!("module example.test/app\n\ngo 1.19\n\nrequire {MODULE} v1.0.0\n"),
    )
    .unwrap();
    std::fs::write(
        ws.join("app.go"),
        "package app\n\nimport \"example.test/dep\"\n\nfunc Four() int { return dep.Two() * 2 }\n",
    )
    .unwrap();
    std::fs::write(
        ws.join("app_test.go"),
        "package app\n\nimport \"testing\"\n\nfunc TestFour(t *testing.T) {\n\tif Four() != 4 {\n\t\tt.Fatal(Four())\n\t}\n}\n",
    )
    .unwrap();
    let h = s.start(c).await;
    // No checksum database here (the module is not public); `-mod=mod` lets go write go.sum.
    let test = |goproxy: &str| {
        format!("GOPROXY={goproxy} GOSUMDB=off GOFLAGS=-mod=mod go test -count=1 ./... 2>&1")
    };

    let first = run(h.hub(), "go-1", &test(&proxy.url())).await;
    assert!(completed(&first), "{first}");
    let zip_fetches = || proxy.hits().iter().filter(|p| p.ends_with(".zip")).count();
    assert_eq!(zip_fetches(), 1, "{:?}", proxy.hits());
    assert!(
        only_cache(&dir)
            .join("go/mod")
            .join(format!("{MODULE}@v1.0.0/dep.go"))
            .is_file(),
        "the module is in the repository's GOMODCACHE"
    );

    // No proxy at all: only the module cache can provide the dependency.
    let second = run(h.hub(), "go-2", &test("off")).await;
    assert!(completed(&second), "{second}");
    assert_eq!(zip_fetches(), 1, "the module came from the cache");
    h.finish().await;
}
