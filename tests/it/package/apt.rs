//! The package as an operator meets it: `apt-get install` into a clean Debian 12 root, the
//! package's own unit booted under that root's systemd (PID 1 of private PID + mount
//! namespaces, as `systemd_unit.rs` boots the unit), a task run to `verified` as the
//! service user under strict containment, an upgrade over the operator's edited config
//! (the edit stays), then `apt-get remove` and `purge`.
//!
//! The root is made with `mmdebstrap` from Debian's package registry once and kept as a
//! tarball under `target/debian-root/` (about 25 MB; a later run unpacks it in seconds).
//! Needs root, `unshare`, `nsenter`, the package (`cargo deb`), mmdebstrap or the cached
//! tarball, and a kernel that can confine tasks; elsewhere it is a listed skip (or a failure
//! where CI requires them: `util::require`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hub_sidecar::mock_hub::{sample_shell_task, MockHub, MockHubOptions};
use serde_json::json;

use super::{built_deb, no_deb, run_ok};
use crate::systemd_unit::{read, wait_booted, write_units, Booted};
use crate::util::*;

const TOKEN: &str = "tok-deb-3b8e51c7a2";
/// What the root holds beyond apt's minimal system: the package's dependencies (systemd;
/// git and ca-certificates, which it recommends), so `apt-get install ./….deb` needs no
/// download.
const ROOT_PACKAGES: &str = "systemd,git,ca-certificates";
/// Slower than the suite's usual wait: apt and dpkg run in the root.
const APT: Duration = Duration::from_secs(180);

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| super::repo().join("target"))
}

/// The gate (each a `require`: a listed skip, or a failure where CI requires it): root (to
/// unpack a Debian root and boot its systemd), its tools, the package, containment.
fn supported() -> bool {
    let tool = |req: &str, t: &str| {
        let why = which::which(t)
            .err()
            .map(|e| format!("`{t}` is not installed: {e}"));
        require(req, why)
    };
    require("root", missing_root())
        && tool("unshare", "unshare")
        && tool("unshare", "nsenter")
        && tool("unshare", "chroot")
        && tool("deb", "dpkg-deb")
        && tool("tar", "tar")
        && require("deb", built_deb().is_none().then(no_deb))
        && crate::containment::supported()
}

/// The clean Debian 12 root as a tarball: cached under target/, else made with mmdebstrap.
fn root_tarball() -> Result<PathBuf, String> {
    let dir = target_dir().join("debian-root");
    let tarball = dir.join(format!(
        "bookworm-{}.tar.gz",
        ROOT_PACKAGES.replace(',', "-")
    ));
    if tarball.is_file() {
        return Ok(tarball);
    }
    if which::which("mmdebstrap").is_err() {
        return Err(
            "mmdebstrap is not installed (apt-get install mmdebstrap) and no root is cached".into(),
        );
    }
    std::fs::create_dir_all(&dir).unwrap();
    let partial = dir.join(format!("partial-{}.tar.gz", std::process::id()));
    let out = std::process::Command::new("mmdebstrap")
        .args([
            "--quiet",
            "--variant=apt",
            &format!("--include={ROOT_PACKAGES}"),
            "bookworm",
        ])
        .arg(&partial)
        .output()
        .map_err(|e| format!("cannot run mmdebstrap: {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&partial);
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Err(format!(
            "mmdebstrap could not make a Debian 12 root (is Debian's package registry reachable?): {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    std::fs::rename(&partial, &tarball).unwrap();
    Ok(tarball)
}

/// The package again as version `0.1.0-2` (a new upstream example config line too), the way
/// an upgrade arrives: a different package over the installed one.
fn upgrade_of(deb: &Path, dir: &Path) -> PathBuf {
    let tree = dir.join("upgrade-tree");
    let out = dir.join("hub-sidecar-upgrade.deb");
    run_ok(
        "dpkg-deb",
        &["-R", deb.to_str().unwrap(), tree.to_str().unwrap()],
        None,
    );
    let control = tree.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control).unwrap();
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .unwrap()
        .to_string();
    let upstream = version
        .rsplit_once('-')
        .map_or(version.as_str(), |(u, _)| u);
    std::fs::write(
        &control,
        text.replace(
            &format!("Version: {version}"),
            &format!("Version: {upstream}-99"),
        ),
    )
    .unwrap();
    let conf = tree.join("etc/hub-sidecar/hub-sidecar.toml");
    let mut example = std::fs::read_to_string(&conf).unwrap();
    example.push_str("# a line the upgrade's example config adds\n");
    std::fs::write(&conf, example).unwrap();
    // gzip at level 1: xz (the default) takes most of a minute on a loaded 2-core box.
    run_ok(
        "dpkg-deb",
        &[
            "-Zgzip",
            "-z1",
            "-b",
            tree.to_str().unwrap(),
            out.to_str().unwrap(),
        ],
        None,
    );
    out
}

#[tokio::test]
async fn the_package_installs_runs_a_confined_task_upgrades_over_an_edited_config_and_removes() {
    if !supported() {
        return;
    }
    let tarball = root_tarball();
    if !require("mmdebstrap", tarball.as_ref().err().cloned()) {
        return;
    }
    let tarball = tarball.unwrap();
    let deb = built_deb().unwrap();
    let started = std::time::Instant::now();
    let tmp = tempfile::tempdir_in(target_dir()).unwrap();
    let dir = tmp.path();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    run_ok(
        "tar",
        &[
            "-xzf",
            tarball.to_str().unwrap(),
            "--numeric-owner",
            "-C",
            root.to_str().unwrap(),
        ],
        None,
    );
    let pkg = dir.join("pkg");
    std::fs::create_dir(&pkg).unwrap();
    std::fs::copy(&deb, pkg.join("hub-sidecar.deb")).unwrap();
    upgrade_of(&deb, &pkg);

    let hub = MockHub::start(MockHubOptions {
        agents: vec![("worker-deb".into(), TOKEN.into())],
        ..MockHubOptions::default()
    })
    .await
    .unwrap();
    write_units(dir, "");
    // The operator's edit: the three lines the printed next steps name, and a comment.
    std::fs::write(
        dir.join("edit.sed"),
        format!(
            "s|^agent_id = .*|agent_id = \"worker-deb\"|\ns|^token = .*|token = \"{TOKEN}\"|\ns|^hub_url = .*|hub_url = \"{}\"|\n1i # edited by the operator\n",
            hub.url()
        ),
    )
    .unwrap();
    eprintln!("root unpacked: {:.1} s", started.elapsed().as_secs_f64());
    let sd = Booted::boot_with("deb-boot.sh", dir, &[&root]);
    wait_booted(&sd).await;
    eprintln!(
        "installed and booted: {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Installed, nothing started, the next steps printed.
    let apt_log = read(&dir.join("apt-install.log"));
    assert!(
        apt_log.contains("nothing was started. Next steps:"),
        "{apt_log}"
    );
    assert!(
        apt_log.contains("systemctl enable --now hub-sidecar"),
        "{apt_log}"
    );
    let installed = read(&dir.join("installed"));
    for want in [
        "root hub-sidecar 750 /etc/hub-sidecar",
        "hub-sidecar hub-sidecar 600 /etc/hub-sidecar/hub-sidecar.toml",
        "hub-sidecar hub-sidecar 750 /var/lib/hub-sidecar",
        "root root 755 /usr/bin/hub-sidecar",
    ] {
        assert!(
            installed.lines().any(|l| l == want),
            "{want}: {installed}\n{apt_log}"
        );
    }
    let uid: u32 = read(&dir.join("uid")).trim().parse().unwrap();
    assert!(uid < 1000, "a system user: {uid}");
    assert_eq!(
        sd.property("hub-sidecar.service", "ActiveState"),
        "inactive"
    );
    assert_eq!(
        sd.systemctl(&["is-enabled", "hub-sidecar.service"]).1,
        "disabled"
    );

    // The operator starts it; a task runs to verified as the service user, strictly confined.
    let (ok, out) = sd.systemctl(&["start", "--no-block", "hub-sidecar.service"]);
    assert!(ok, "systemctl start: {out}");
    hub.wait_for_type("identify", T)
        .await
        .unwrap_or_else(|| panic!("the unit never identified; log:\n{}", sd.daemon_log()));
    let mut task = sample_shell_task("deb-task", "id -u; echo pid=$$; echo done > done.txt");
    task["verification_steps"] = json!([{"type": "file_exists", "target": "done.txt"}]);
    let done = sd.complete(&hub, task).await;
    assert_eq!(
        done["result"]["verification_status"], "verified",
        "{done:#}"
    );
    assert_eq!(done["result"]["containment"], "strict", "{done:#}");
    let output = done["result"]["output"].as_str().unwrap_or_default();
    assert_eq!(
        output.lines().next(),
        Some(uid.to_string().as_str()),
        "{output}"
    );
    assert!(output.lines().any(|l| l == "pid=1"), "{output}");
    assert!(wait_until(|| hub.acked_terminal("deb-task") == 1, T).await);
    let first_pid = sd.property("hub-sidecar.service", "MainPID");
    eprintln!("task verified: {:.1} s", started.elapsed().as_secs_f64());

    // The upgrade: apt as unattended upgrades run it (keep the operator's config). The
    // running daemon restarts on the new binary.
    let (ok, out) = sd.exec(&[
        "env",
        "DEBIAN_FRONTEND=noninteractive",
        "apt-get",
        "install",
        "-y",
        "-o",
        "Dpkg::Options::=--force-confdef",
        "-o",
        "Dpkg::Options::=--force-confold",
        "/run/hub-sidecar-test/pkg/hub-sidecar-upgrade.deb",
    ]);
    assert!(ok, "upgrade: {out}");
    let (_, version) = sd.exec(&["dpkg-query", "-W", "-f", "${Version}", "hub-sidecar"]);
    assert!(version.ends_with("-99"), "{version}\n{out}");
    let (_, config) = sd.exec(&["cat", "/etc/hub-sidecar/hub-sidecar.toml"]);
    assert_eq!(
        config,
        read(&dir.join("edited.toml")).trim(),
        "the edit was lost:\n{out}"
    );
    let (_, dist) = sd.exec(&["cat", "/etc/hub-sidecar/hub-sidecar.toml.dpkg-dist"]);
    assert!(
        dist.contains("a line the upgrade's example config adds"),
        "{dist}\n{out}"
    );
    let (_, mode) = sd.exec(&[
        "stat",
        "-c",
        "%U %G %a",
        "/etc/hub-sidecar/hub-sidecar.toml",
    ]);
    assert_eq!(mode, "hub-sidecar hub-sidecar 600");
    let restarted = wait_until(
        || {
            hub.received_of("identify").len() >= 2
                && sd.property("hub-sidecar.service", "ActiveState") == "active"
        },
        APT,
    )
    .await;
    assert!(
        restarted,
        "not restarted after the upgrade; log:\n{}",
        sd.daemon_log()
    );
    assert_ne!(sd.property("hub-sidecar.service", "MainPID"), first_pid);

    // Removal stops the daemon and keeps the config; purge takes the config and the state.
    let (ok, out) = sd.exec(&[
        "env",
        "DEBIAN_FRONTEND=noninteractive",
        "apt-get",
        "remove",
        "-y",
        "hub-sidecar",
    ]);
    assert!(ok, "remove: {out}");
    assert_eq!(
        sd.property("hub-sidecar.service", "ActiveState"),
        "inactive",
        "{out}"
    );
    assert!(!sd.exec(&["test", "-e", "/usr/bin/hub-sidecar"]).0);
    assert!(
        sd.exec(&["test", "-e", "/etc/hub-sidecar/hub-sidecar.toml"])
            .0,
        "{out}"
    );
    let (ok, out) = sd.exec(&[
        "env",
        "DEBIAN_FRONTEND=noninteractive",
        "apt-get",
        "purge",
        "-y",
        "hub-sidecar",
    ]);
    assert!(ok, "purge: {out}");
    assert!(
        !sd.exec(&["test", "-e", "/etc/hub-sidecar/hub-sidecar.toml"])
            .0,
        "{out}"
    );
    assert!(!sd.exec(&["test", "-e", "/var/lib/hub-sidecar"]).0, "{out}");
    assert_no_violations(&hub);
    eprintln!(
        "package test: {:.1} s after the root was at hand",
        started.elapsed().as_secs_f64()
    );
}
