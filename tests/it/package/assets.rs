//! What the package is made of: generated files that match the CLI, and the built `.deb`'s
//! contents, conffile and lintian's verdict.

use std::path::Path;

use clap::CommandFactory;

use super::*;

/// The man page and the bash, zsh and fish completions, generated from the clap definition:
/// (path under the repository, contents).
fn generated() -> Vec<(String, Vec<u8>)> {
    let cmd = hub_sidecar::cli::Cli::command();
    let mut man = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut man).unwrap();
    let mut out = vec![("pkg/man/hub-sidecar.1".to_string(), man)];
    // One page per subcommand, as the main page's SUBCOMMANDS section names them
    // (hub-sidecar-run(1), …), with the subcommand's own flags.
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("hub-sidecar-{}", sub.get_name());
        let mut page = Vec::new();
        // clap takes a `'static` name without its `string` feature: a test may leak it.
        let title: &'static str = Box::leak(name.clone().into_boxed_str());
        let bin: &'static str =
            Box::leak(format!("hub-sidecar {}", sub.get_name()).into_boxed_str());
        clap_mangen::Man::new(sub.clone().name(title).bin_name(bin))
            .render(&mut page)
            .unwrap();
        out.push((format!("pkg/man/{name}.1"), page));
    }
    use clap_complete::Shell;
    for (shell, path) in [
        (Shell::Bash, "pkg/completions/hub-sidecar.bash"),
        (Shell::Zsh, "pkg/completions/_hub-sidecar"),
        (Shell::Fish, "pkg/completions/hub-sidecar.fish"),
    ] {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut cmd.clone(), "hub-sidecar", &mut buf);
        out.push((path.to_string(), buf));
    }
    out
}

/// The man page and completions the package ships are what the CLI definition gives now:
/// a flag added without regenerating them fails here. `HUB_SIDECAR_REGENERATE=1 cargo test
/// --test it package::assets` rewrites them.
#[test]
fn the_man_page_and_completions_are_generated_from_the_cli_definition() {
    let regenerate = std::env::var_os("HUB_SIDECAR_REGENERATE").is_some();
    let mut stale = Vec::new();
    for (path, want) in generated() {
        let file = repo().join(&path);
        if regenerate {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, &want).unwrap();
        } else if std::fs::read(&file).ok().as_deref() != Some(&want[..]) {
            stale.push(path);
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:?} differ from what the CLI definition generates; rewrite them with \
         HUB_SIDECAR_REGENERATE=1 cargo test --test it package::assets"
    );
    // What they hold: every subcommand, by name.
    let man = std::fs::read_to_string(repo().join("pkg/man/hub-sidecar.1")).unwrap();
    let bash = std::fs::read_to_string(repo().join("pkg/completions/hub-sidecar.bash")).unwrap();
    for sub in [
        "run", "check", "run-task", "verify", "demo", "tasks", "show", "status",
    ] {
        let page = format!("hub\\-sidecar\\-{}", sub.replace('-', "\\-"));
        assert!(man.contains(&page), "{sub} not in the man page");
        assert!(
            repo()
                .join(format!("pkg/man/hub-sidecar-{sub}.1"))
                .is_file(),
            "no page for {sub}"
        );
        assert!(bash.contains(sub), "{sub} not in the bash completion");
    }
    let check = std::fs::read_to_string(repo().join("pkg/man/hub-sidecar-check.1")).unwrap();
    assert!(check.contains("\\-\\-config"), "{check}");
}

/// The built package: the binary, both units (naming the packaged binary), the sysusers and
/// tmpfiles entries, the config as a 0600 conffile, man page, completions and alert rules;
/// maintainer scripts without `useradd`; and no lintian error.
#[test]
fn the_package_holds_the_service_and_lintian_finds_no_error() {
    let deb = built_deb();
    if !crate::util::require("deb", deb.is_none().then(no_deb)) {
        return;
    }
    let deb = deb.unwrap();
    let contents = run_ok("dpkg-deb", &["--contents", deb.to_str().unwrap()], None);
    // "-rw------- 0/0  12953 2026-11-27 00:00 ./etc/hub-sidecar/hub-sidecar.toml"
    let entry = |path: &str| {
        contents
            .lines()
            .find(|l| l.ends_with(&format!(" .{path}")))
            .unwrap_or_else(|| panic!("{path} is not in the package:\n{contents}"))
            .to_string()
    };
    // Mode and owner as dpkg unpacks them (root, by number or name).
    let mode_owner = |path: &str| {
        let e = entry(path);
        let mut w = e.split_whitespace();
        let (mode, owner) = (w.next().unwrap().to_string(), w.next().unwrap());
        (mode, owner == "0/0" || owner == "root/root")
    };
    assert_eq!(
        mode_owner("/usr/bin/hub-sidecar"),
        ("-rwxr-xr-x".into(), true)
    );
    assert_eq!(
        mode_owner("/etc/hub-sidecar/hub-sidecar.toml"),
        ("-rw-------".into(), true),
        "the token's file is never readable by others"
    );
    for path in [
        "/usr/lib/systemd/system/hub-sidecar.service",
        "/usr/lib/systemd/system/hub-sidecar@.service",
        "/usr/lib/sysusers.d/hub-sidecar.conf",
        "/usr/lib/tmpfiles.d/hub-sidecar.conf",
        "/usr/share/man/man1/hub-sidecar.1.gz",
        "/usr/share/bash-completion/completions/hub-sidecar",
        "/usr/share/zsh/vendor-completions/_hub-sidecar",
        "/usr/share/fish/vendor_completions.d/hub-sidecar.fish",
        "/usr/share/hub-sidecar/prometheus/alerts.yml",
    ] {
        entry(path);
    }
    let tmp = tempfile::tempdir().unwrap();
    run_ok(
        "dpkg-deb",
        &[
            "--control",
            deb.to_str().unwrap(),
            tmp.path().to_str().unwrap(),
        ],
        None,
    );
    let conffiles = std::fs::read_to_string(tmp.path().join("conffiles")).unwrap_or_default();
    assert!(
        conffiles
            .lines()
            .any(|l| l == "/etc/hub-sidecar/hub-sidecar.toml"),
        "conffiles: {conffiles}"
    );
    for script in ["postinst", "prerm", "postrm"] {
        let text = std::fs::read_to_string(tmp.path().join(script)).unwrap();
        assert!(
            !text.contains("useradd") && !text.contains("adduser"),
            "{script}"
        );
    }
    let postinst = std::fs::read_to_string(tmp.path().join("postinst")).unwrap();
    assert!(
        postinst.contains("systemd-sysusers hub-sidecar.conf"),
        "{postinst}"
    );
    // Nothing enabled or started (the printed next steps name the commands, in a heredoc).
    for line in postinst.lines().map(str::trim_start) {
        for verb in [
            "systemctl enable",
            "systemctl start",
            "deb-systemd-helper enable",
            "deb-systemd-invoke start",
        ] {
            assert!(!line.starts_with(verb), "{line}");
        }
    }
    // The glibc the binary needs is what the package depends on and what the install
    // guide names (RELR needs 2.36: a binary built with it must not reach Ubuntu 22.04).
    let control = std::fs::read_to_string(tmp.path().join("control")).unwrap();
    let libc = control
        .split("libc6 (>= ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("no libc6 dependency: {control}"))
        .to_string();
    // Units where Debian 13's merged /usr expects them, none under the /lib alias.
    assert!(
        !contents.contains(" ./lib/"),
        "nothing under /lib:\n{contents}"
    );
    // wss:// needs the system's roots.
    let recommends = control
        .lines()
        .find_map(|l| l.strip_prefix("Recommends: "))
        .unwrap_or_else(|| panic!("no Recommends: {control}"));
    assert!(
        recommends.split(", ").any(|p| p == "ca-certificates"),
        "Recommends: {recommends}"
    );
    let bin = tmp.path().join("hub-sidecar");
    run_ok(
        "sh",
        &[
            "-c",
            &format!(
                "dpkg-deb --fsys-tarfile '{}' | tar -xO ./usr/bin/hub-sidecar > '{}'",
                deb.display(),
                bin.display()
            ),
        ],
        None,
    );
    if which::which("readelf").is_ok() {
        let needs = run_ok(
            "readelf",
            &["--version-info", "--wide", bin.to_str().unwrap()],
            None,
        );
        let newest = needs
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("GLIBC_2."))
            .filter_map(|v| v.split('.').next()?.parse::<u32>().ok())
            .max()
            .unwrap();
        let relr = needs.contains("GLIBC_ABI_DT_RELR");
        let floor = if relr { newest.max(36) } else { newest };
        let declared: u32 = libc
            .strip_prefix("2.")
            .and_then(|m| m.parse().ok())
            .unwrap();
        assert!(
            declared >= floor,
            "Depends: libc6 (>= {libc}), but the binary needs 2.{floor} (RELR: {relr})"
        );
    }
    for guide in ["README.md", "docs/install.md"] {
        let text = std::fs::read_to_string(repo().join(guide)).unwrap();
        assert!(
            text.contains(&format!("**glibc ≥ {libc}**")),
            "{guide} does not name glibc {libc}, the package's floor"
        );
    }
    let unit = run_ok(
        "sh",
        &[
            "-c",
            &format!(
                "dpkg-deb --fsys-tarfile '{}' | tar -xO ./usr/lib/systemd/system/hub-sidecar.service",
                deb.display()
            ),
        ],
        None,
    );
    assert!(
        unit.contains(
            "\nExecStart=/usr/bin/hub-sidecar run --config /etc/hub-sidecar/hub-sidecar.toml"
        ),
        "{unit}"
    );

    if !crate::util::require("lintian", crate::util::missing_tool("lintian")) {
        return;
    }
    let out = std::process::Command::new("lintian")
        .args(["--no-tag-display-limit"])
        .arg(&deb)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("E:")).collect();
    // Its exit status counts too: an error tag exits 1 (`--fail-on error`), and a lintian
    // that could not check the package (a broken install, an unreadable .deb) exits
    // non-zero with no tag at all.
    assert!(
        errors.is_empty() && out.status.success(),
        "lintian {} on {}:\n{text}{}",
        out.status,
        deb.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("lintian on {}:\n{text}", Path::new(&deb).display());
}
