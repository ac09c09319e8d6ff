//! npm, pnpm and yarn install a one-dependency project from a loopback npm registry into the
//! repository's cache, and the next task installs it again with the registry no longer
//! serving the tarball: from that cache.

use std::collections::HashMap;

use serde_json::json;

use super::{can_run, completed, only_cache, open_cfg, run, tar_gz};
use crate::harness::Harness;
use crate::loopback::Loopback;
use crate::util::write_config;

#[tokio::test]
async fn npm_installs_from_a_registry_and_the_next_task_installs_from_the_cache() {
    js_installs_then_reuses_the_cache(
        &Js {
            tools: &["npm", "node", "tar"],
            install: "npm install --no-audit --no-fund 2>&1 && npm test 2>&1",
            lockfile: "package-lock.json",
            cache: "npm/_cacache",
        },
        Registry::Project,
    )
    .await;
}

#[tokio::test]
async fn pnpm_installs_from_a_registry_and_the_next_task_installs_from_its_store() {
    js_installs_then_reuses_the_cache(
        &Js {
            tools: &["pnpm", "node", "tar"],
            install: "pnpm install 2>&1 && pnpm test 2>&1",
            lockfile: "pnpm-lock.yaml",
            cache: "pnpm-store",
        },
        Registry::Project,
    )
    .await;
}

/// Yarn 1 reads `$HOME/.yarnrc` (and as root `$HOME/.npmrc`, beside the file
/// `npm_config_userconfig` names) by name: with the service user's own in a HOME closed to
/// tasks it failed before installing anything. Here the service user's HOME holds both; the
/// registry comes from the operator's `[sandbox] npmrc`, a file above the project that yarn
/// reads by name too.
#[tokio::test]
async fn yarn_installs_from_the_operators_registry_and_the_next_task_from_the_cache() {
    js_installs_then_reuses_the_cache(
        &Js {
            tools: &["yarn", "node", "tar"],
            install: "yarn install --non-interactive 2>&1 && yarn test 2>&1",
            lockfile: "yarn.lock",
            cache: "yarn/v6",
        },
        Registry::Operator,
    )
    .await;
}

/// One JavaScript package manager's case.
struct Js {
    /// The package manager first, then what else it needs.
    tools: &'static [&'static str],
    /// The task's command: install, then the project's test.
    install: &'static str,
    /// The lockfile the install writes (removed before the second install).
    lockfile: &'static str,
    /// Where its cache is under the repository's cache directory.
    cache: &'static str,
}

/// Where the package manager learns the registry's URL.
enum Registry {
    /// The project's own `.npmrc`; the daemon runs in-process with the test's HOME.
    Project,
    /// The operator's `[sandbox] npmrc`; the daemon is the real binary whose HOME holds a
    /// `.npmrc` and `.yarnrc` of the service user's that name another registry and carry a
    /// login.
    Operator,
}

/// A JavaScript package manager installs a one-dependency project from a loopback registry
/// under containment with its cache in the repository's, and the next task installs it
/// again with the registry no longer serving the tarball: from that cache.
async fn js_installs_then_reuses_the_cache(js: &Js, registry_from: Registry) {
    let Js {
        tools,
        install,
        lockfile,
        cache,
    } = *js;
    if !can_run(tools) {
        return;
    }
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let pkg = dir.join("pkg/package");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(
        pkg.join("package.json"),
        r#"{"name":"tinydep","version":"1.0.0","main":"index.js"}"#,
    )
    .unwrap();
    std::fs::write(pkg.join("index.js"), "module.exports = 42;\n").unwrap();
    let tarball = tar_gz(&dir.join("pkg"), "package");
    let integrity = {
        use base64::Engine as _;
        use sha2::Digest as _;
        format!(
            "sha512-{}",
            base64::engine::general_purpose::STANDARD.encode(sha2::Sha512::digest(&tarball))
        )
    };
    let registry = Loopback::serve(|url| {
        let packument = json!({
            "name": "tinydep",
            "dist-tags": {"latest": "1.0.0"},
            "versions": {"1.0.0": {
                "name": "tinydep", "version": "1.0.0", "main": "index.js",
                "dist": {"tarball": format!("{url}/tinydep/-/tinydep-1.0.0.tgz"), "integrity": integrity}
            }}
        });
        HashMap::from([
            ("/tinydep".to_string(), packument.to_string().into_bytes()),
            ("/tinydep/-/tinydep-1.0.0.tgz".to_string(), tarball),
        ])
    })
    .await;
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(
        ws.join("package.json"),
        r#"{"name":"app","version":"1.0.0","dependencies":{"tinydep":"1.0.0"},
            "scripts":{"test":"node -e \"process.exit(require('tinydep') === 42 ? 0 : 1)\""}}"#,
    )
    .unwrap();
    let rc = format!("registry={}/\n", registry.url());
    let h = match registry_from {
        Registry::Project => {
            std::fs::write(ws.join(".npmrc"), rc).unwrap();
            let (c, _) = open_cfg(&s);
            s.start(c).await
        }
        Registry::Operator => {
            // Above the project, where yarn also reads it by name (as the service user's
            // HOME under the unit is above its managed clones), and closed to others.
            let tasks_rc = dir.join(".npmrc");
            private(&tasks_rc, &rc);
            // The service user's own files, closed to tasks: a registry that is not there,
            // and a login.
            let home = dir.join("home");
            std::fs::create_dir_all(&home).unwrap();
            private(
                &home.join(".npmrc"),
                "registry=http://127.0.0.1:9/\n//127.0.0.1:9/:_authToken=operator-secret\n",
            );
            private(&home.join(".yarnrc"), "registry \"http://127.0.0.1:9/\"\n");
            let extra = format!(
                "repo_dir = \"{}\"\n[network]\nmode = \"open\"\n",
                ws.display()
            );
            let config = write_config(&s.hub, &dir, "test-token", &extra);
            let mut text = std::fs::read_to_string(&config).unwrap();
            // The config ends in its `[sandbox]` table.
            text.push_str(&format!("npmrc = \"{}\"\n", tasks_rc.display()));
            std::fs::write(&config, text).unwrap();
            let home = home.to_string_lossy().into_owned();
            s.start_bin_written(&[("HOME", home.as_str())]).await
        }
    };

    let first = run(h.hub(), &format!("{}-1", tools[0]), install).await;
    assert!(completed(&first), "{first}");
    assert!(
        only_cache(&dir).join(cache).is_dir(),
        "{} used the repository's cache",
        tools[0]
    );

    // The registry stops serving the tarball: the second install must find it in the cache.
    registry.remove("/tinydep/-/tinydep-1.0.0.tgz");
    std::fs::remove_dir_all(ws.join("node_modules")).unwrap();
    std::fs::remove_file(ws.join(lockfile)).unwrap();
    let tarball_fetches = |r: &Loopback| r.hits().iter().filter(|p| p.ends_with(".tgz")).count();
    let before = tarball_fetches(&registry);
    let second = run(h.hub(), &format!("{}-2", tools[0]), install).await;
    assert!(completed(&second), "{second}");
    assert_eq!(
        tarball_fetches(&registry),
        before,
        "the tarball came from the cache"
    );
    if let Registry::Operator = registry_from {
        // Yarn also reads the settings files of every directory above the project. One of
        // the service user's there is not a task's: the task's view of the host hides it
        // (only the workspace is bound back into the hidden tree), so yarn is not refused it
        // (Landlock alone would refuse it, and yarn would fail on that).
        let above = dir.join(".yarnrc");
        private(
            &above,
            "registry \"http://127.0.0.1:9/above-the-project/\"\n",
        );
        let third = run(h.hub(), &format!("{}-3", tools[0]), install).await;
        assert!(
            completed(&third),
            "the operator's .yarnrc above the project reached the task: {third}"
        );
        // Hidden, not refused: in the task's view the file is not there at all.
        let look = format!(
            "f='{}'; if [ -e \"$f\" ] || [ -L \"$f\" ]; then echo yarnrc-visible; else echo yarnrc-absent; fi; cat \"$f\" 2>&1; true",
            above.display()
        );
        let seen = run(h.hub(), "yarnrc-look", &look).await;
        let out = seen["result"]["output"].as_str().unwrap_or_default();
        assert!(completed(&seen), "{seen}");
        assert!(
            out.contains("yarnrc-absent")
                && out.contains("No such file or directory")
                && !out.contains("above-the-project"),
            "the operator's .yarnrc is visible to the task: {out}"
        );
    }
    h.finish().await;
}

/// Write a file only its owner may read: the service user's own.
fn private(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}
