//! `hub-sidecar check`: validate the configuration, then probe everything it points at and
//! print one line per item.
//!
//! Required items (config, hub, state dir) decide the exit code; the others (claude, Ollama,
//! git, workspace) are reported so an operator sees what this box can run. Every detail is
//! scrubbed with the config's redactor: the token is never printed.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio_util::sync::CancellationToken;

use super::status::Asked;
use crate::cli::CheckArgs;
use crate::config::Config;
use crate::ops::StatusSnapshot;
use crate::process::{self, ChildEnv, CommandSpec, Exit, Limits, RunOutput};

/// How long any one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Item {
    /// Short name: `config`, `hub`, `claude`, …
    pub name: &'static str,
    /// A failure of this item makes `check` exit non-zero.
    pub required: bool,
    /// `Some(true)` ok, `Some(false)` failed, `None` not applicable (skipped).
    pub ok: Option<bool>,
    /// What was found, or what failed and what to do.
    pub detail: String,
}

impl Item {
    /// A probed item: `Ok` says what was found, `Err` what failed and what to do.
    fn new(name: &'static str, required: bool, res: anyhow::Result<String>) -> Item {
        let (ok, detail) = match res {
            Ok(d) => (Some(true), d),
            Err(e) => (Some(false), format!("{e:#}")),
        };
        Item {
            name,
            required,
            ok,
            detail,
        }
    }

    fn skipped(name: &'static str, why: &str) -> Item {
        Item {
            name,
            required: false,
            ok: None,
            detail: why.to_string(),
        }
    }
}

/// Run every probe and print the table.
pub async fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let origin = args
        .config
        .config
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "no --config file: environment and flags only".into());
    println!("hub-sidecar check ({origin})");
    let cfg = match args.config.load() {
        Ok(cfg) => cfg,
        Err(e) => {
            // Its message already names the cause; `{e}` keeps the source from printing twice.
            print_items(&[Item::new("config", true, Err(anyhow!("{e}")))]);
            println!("\nFAILED: config");
            return Ok(ExitCode::FAILURE);
        }
    };
    // Unknown keys, a config file others can read: logged as warnings on stderr.
    crate::config::warn_about(&cfg);
    let items = probe_all(&cfg).await;
    let redactor = ChildEnv::from_config(&cfg).redactor(&cfg).await;
    let items: Vec<Item> = items
        .into_iter()
        .map(|mut i| {
            i.detail = redactor.scrub(&i.detail);
            i
        })
        .collect();
    print_items(&items);
    let failed_required: Vec<&str> = items
        .iter()
        .filter(|i| i.required && i.ok == Some(false))
        .map(|i| i.name)
        .collect();
    let failed_optional = items
        .iter()
        .filter(|i| !i.required && i.ok == Some(false))
        .count();
    if failed_required.is_empty() {
        println!(
            "\nok: required items pass{}",
            if failed_optional > 0 {
                format!(
                    " ({failed_optional} optional item(s) failed: tasks needing them will fail)"
                )
            } else {
                String::new()
            }
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\nFAILED: {}", failed_required.join(", "));
        Ok(ExitCode::FAILURE)
    }
}

/// Every probe for a valid config, in display order. Probes run concurrently.
///
/// A daemon running on this state directory is asked first, and its answer stands for the
/// hub: `check` then never identifies to the hub itself, since the hub keeps one
/// connection per agent and a second identify as the same agent replaces the daemon's,
/// whose close makes the hub reclaim its running task (PROTOCOL.md §8).
pub async fn probe_all(cfg: &Config) -> Vec<Item> {
    // Asked while `check` is still dumpable: the daemon admits a peer of its status socket
    // by reading the peer's `/proc/<pid>/ns/user`, which the kernel closes to a
    // non-dumpable process of the same (non-root) user.
    let daemon = super::status::ask_socket(&crate::ops::socket::path(&cfg.state_dir)).await;
    // Then non-dumpable at once, as the daemon is (`protect_daemon`): `check` holds the
    // token too, and the probes below (the containment probe above all) must see the
    // process state the daemon's children are spawned from.
    crate::sandbox::protect_daemon();
    let config = Item::new(
        "config",
        true,
        Ok(format!(
            "agent {}, hub {}{}",
            cfg.agent_id,
            cfg.hub_url,
            cfg.origin
                .as_ref()
                .map(|p| format!(", file {}", p.display()))
                .unwrap_or_default()
        )),
    );
    let workspace = cfg
        .repo_dir
        .clone()
        .unwrap_or_else(|| crate::workspace::task_dirs_root(cfg));
    let (hub, claude, ollama, git, state, work) = tokio::join!(
        hub_item(cfg, &daemon),
        probe_claude(cfg),
        probe_ollama(cfg),
        probe_version(cfg, "git", Path::new("git")),
        probe_writable(&cfg.state_dir),
        probe_writable(&workspace),
    );
    vec![
        config,
        Item::new("hub", true, hub),
        Item::new(
            "state dir",
            true,
            state.map(|()| format!("{} writable", cfg.state_dir.display())),
        ),
        Item::new(
            "workspace",
            false,
            work.map(|()| format!("{} writable", workspace.display())),
        ),
        Item::new("git", false, git),
        claude,
        ollama,
        containment_item(cfg, &daemon).await,
    ]
}

/// The hub line: the running daemon's own link when one answers on this state directory,
/// else `check`'s own probe (identify, then close) when no daemon is there.
async fn hub_item(cfg: &Config, daemon: &Asked) -> anyhow::Result<String> {
    let sock = crate::ops::socket::path(&cfg.state_dir);
    match daemon {
        Asked::NoDaemon => probe_hub(cfg).await,
        Asked::Answered(snap) if snap.identified => Ok(format!(
            "{}: the running daemon's link is {} (check did not identify: it would take the daemon's connection over)",
            cfg.hub_url,
            super::status::link(snap)
        )),
        Asked::Answered(snap) => Err(anyhow!(
            "{}: the running daemon's link is {}: see its log (journalctl -u hub-sidecar) for why; check did not identify as {} beside it",
            cfg.hub_url,
            super::status::link(snap),
            cfg.agent_id
        )),
        Asked::NoAnswer(e) => Err(anyhow!(
            "a daemon seems to run on this state directory ({}) but did not answer: {e:#}; run check as the daemon's user (sudo -u hub-sidecar hub-sidecar check) or root. check does not identify as {} while a daemon may hold that agent's connection",
            sock.display(),
            cfg.agent_id
        )),
    }
}

/// What containment tasks would run under, decided by the daemon's own probe in the
/// daemon's process state ([`Policy::probe_blocking`](crate::sandbox::Policy::probe_blocking)):
/// run as the service user, this is the daemon's answer. Required at the strict level
/// (the default), where "unavailable" means the daemon takes no work. When a daemon is
/// running with this state directory its own answer is shown too, and it is the one that
/// counts.
async fn containment_item(cfg: &Config, daemon: &Asked) -> Item {
    use crate::sandbox::{Containment, Policy};
    let configured = cfg.containment;
    let policy = tokio::task::spawn_blocking(move || Policy::probe_blocking(configured))
        .await
        .unwrap_or_else(|_| Policy::decide(configured, crate::sandbox::Support::none()));
    let mut res = match (policy.level, policy.refusal()) {
        (Containment::Off, _) => Err(anyhow!(
            "off: tasks run with the daemon's full privileges (set containment = \"strict\")"
        )),
        (_, Some(why)) => Err(anyhow!("NOT accepting tasks: {why}")),
        (Containment::Strict, None) => Ok(format!("strict: {}", policy.support.describe())),
        (Containment::BestEffort, None) => {
            let missing = policy.support.missing();
            if missing.is_empty() {
                Ok(format!(
                    "best-effort (configured; strict is available here: {})",
                    policy.support.describe()
                ))
            } else {
                Err(anyhow!(
                    "best-effort (configured), NOT enforced: {}",
                    missing.join("; ")
                ))
            }
        }
    };
    if let Asked::Answered(snap) = daemon {
        let running = running_daemon_containment(snap);
        res = match res {
            Ok(s) => Ok(format!("{s}; {running}")),
            Err(e) => Err(anyhow!("{e}; {running}")),
        };
    }
    Item::new("containment", policy.level == Containment::Strict, res)
}

/// The running daemon's own containment answer: it decides what its tasks run under, so
/// it wins over this probe.
fn running_daemon_containment(snap: &StatusSnapshot) -> String {
    let level = snap.containment.as_deref().unwrap_or("unknown");
    match &snap.not_accepting {
        Some(why) => {
            format!("the running daemon (its answer counts) is NOT accepting tasks: {why}")
        }
        None => format!("the running daemon (its answer counts) runs tasks {level}"),
    }
}

async fn probe_hub(cfg: &Config) -> anyhow::Result<String> {
    match tokio::time::timeout(PROBE_TIMEOUT, crate::hub::link::probe(cfg)).await {
        Ok(Ok(())) => Ok(format!(
            "{} reachable, token accepted (identified as {}; no daemon runs on this state directory)",
            cfg.hub_url, cfg.agent_id
        )),
        Ok(Err(e)) => Err(anyhow!("{e}; check hub_url, agent_id and token")),
        Err(_) => Err(anyhow!(
            "no answer from {} within {PROBE_TIMEOUT:?}",
            cfg.hub_url
        )),
    }
}

async fn probe_claude(cfg: &Config) -> Item {
    // Found the way the executor finds it: config, else the PATH tasks get.
    let env = crate::process::ChildEnv::from_config(cfg);
    let located = {
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || {
            let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
            crate::executor::claude::locate(&cfg, &env, &cwd)
        })
        .await
    };
    let path = match located {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            return Item::new(
                "claude",
                false,
                Err(anyhow!("{e} (needed for claude tasks only)")),
            )
        }
        Err(e) => return Item::new("claude", false, Err(anyhow!("probe crashed: {e}"))),
    };
    let version = match probe_version(cfg, "claude", &path).await {
        Ok(v) => v,
        Err(e) => return Item::new("claude", false, Err(e)),
    };
    Item::new(
        "claude",
        false,
        probe_claude_auth(cfg, &path)
            .await
            .map(|auth| format!("{version}; {auth}")),
    )
}

/// `claude auth status` (JSON, under a second) with the environment claude tasks get. It
/// does not validate the credential (the first run's `authentication_failed` does), but it
/// tells "not logged in" from "logged in".
async fn probe_claude_auth(cfg: &Config, program: &Path) -> anyhow::Result<String> {
    // JSON is the default output (2.1.x also knows `--json`; older versions may not).
    let spec = CommandSpec::new(program, "/", ChildEnv::from_config(cfg).for_agent())
        .args(["auth", "status"]);
    let who = format!("`{} auth status`", program.display());
    let out = run_probe(&spec, "auth status", &who).await?;
    // Exit 1 when logged out, with the JSON on stdout all the same.
    claude_auth_verdict(&out.stdout)
}

/// Run a probe through the daemon's one spawn path (process group, capped output, killed at
/// 10 s). Not a task's child, so not confined: `check` looks at the host as the daemon does.
/// `what` completes the command in messages (`--version`); `who` names it when it cannot
/// start at all.
async fn run_probe(spec: &CommandSpec, what: &str, who: &str) -> anyhow::Result<RunOutput> {
    let limits = Limits {
        timeout: Some(Duration::from_secs(10)),
        grace: Duration::from_secs(1),
        output_cap: 64 * 1024,
    };
    let program = Path::new(&spec.program).display();
    let out = process::run(spec, &limits, &CancellationToken::new(), None)
        .await
        .map_err(|e| anyhow!("cannot run {who}: {e}"))?;
    if out.exit == Exit::TimedOut {
        bail!("`{program} {what}` did not answer in 10 s");
    }
    Ok(out)
}

/// Read `claude auth status` JSON: `loggedIn`, `authMethod`, `apiKeySource`.
pub fn claude_auth_verdict(stdout: &str) -> anyhow::Result<String> {
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).map_err(|e| {
        anyhow!(
            "`claude auth status` printed no JSON ({e}): {}",
            crate::util::truncate_chars(stdout.trim(), 200)
        )
    })?;
    let method = v["authMethod"].as_str().unwrap_or("unknown");
    if v["loggedIn"].as_bool() != Some(true) {
        bail!(
            "claude is not logged in (authMethod {method}): run `claude auth login` as the daemon's user, or pass ANTHROPIC_API_KEY to it ([env] allow)"
        );
    }
    match v["apiKeySource"].as_str() {
        Some(source) => Ok(format!(
            "logged in with an API key from {source} (costs are spend)"
        )),
        None => Ok(format!(
            "logged in ({method}, subscription: costs reported are API-equivalent estimates)"
        )),
    }
}

/// `PROGRAM --version`, first line, with a timeout; the child dies with the probe. With the
/// environment tasks get, never `check`'s own (which may hold the hub token).
async fn probe_version(cfg: &Config, name: &str, program: &Path) -> anyhow::Result<String> {
    let spec = CommandSpec::new(program, "/", ChildEnv::from_config(cfg)).arg("--version");
    let who = format!("{name} ({})", program.display());
    let out = run_probe(&spec, "--version", &who).await?;
    if !out.exit.success() {
        bail!(
            "`{} --version` failed ({}): {}",
            program.display(),
            out.exit.describe(),
            out.stderr.trim()
        );
    }
    Ok(format!(
        "{} ({})",
        out.stdout.lines().next().unwrap_or("").trim(),
        program.display()
    ))
}

async fn probe_ollama(cfg: &Config) -> Item {
    let Some(url) = &cfg.ollama_url else {
        return Item::skipped(
            "ollama",
            "ollama_url not set (tasks naming an endpoint still work)",
        );
    };
    let tags = format!("{}/api/tags", crate::util::http_base_url(url));
    let res = async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .context("HTTP client")?;
        let resp = client
            .get(&tags)
            .send()
            .await
            .map_err(|e| anyhow!("GET {tags} failed: {e}; is Ollama running?"))?;
        if !resp.status().is_success() {
            bail!("GET {tags}: HTTP {}", resp.status());
        }
        let v: serde_json::Value = resp
            .json()
            .await
            .with_context(|| format!("GET {tags}: not Ollama's JSON"))?;
        let models: Vec<&str> = v["models"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["name"].as_str())
            .collect();
        let wanted = &cfg.executor.ollama_model;
        let note = if models.iter().any(|m| m == wanted) {
            String::new()
        } else {
            format!("; default model {wanted} not pulled (ollama pull {wanted})")
        };
        Ok(format!(
            "{url} reachable, models: {}{note}",
            if models.is_empty() {
                "none".to_string()
            } else {
                models.join(", ")
            }
        ))
    }
    .await;
    Item::new("ollama", false, res)
}

/// Create `dir` if needed and write and remove a file in it.
async fn probe_writable(dir: &Path) -> anyhow::Result<()> {
    let dir = dir.to_path_buf();
    let res = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow!("cannot create {}: {e}", dir.display()))?;
        tempfile::NamedTempFile::new_in(&dir)
            .map(drop)
            .map_err(|e| {
                anyhow!(
                    "cannot write in {}: {e}; fix ownership/permissions for the daemon's user",
                    dir.display()
                )
            })
    })
    .await;
    res.unwrap_or_else(|e| Err(anyhow!("probe crashed: {e}")))
}

/// The table: mark, name, detail, `(optional)` where it does not decide the result.
pub fn print_items(items: &[Item]) {
    for i in items {
        let mark = match i.ok {
            Some(true) => "✓",
            Some(false) => "✗",
            None => "-",
        };
        let opt = if i.required || i.ok != Some(false) {
            ""
        } else {
            "  (optional)"
        };
        println!("  {mark} {:<10} {}{opt}", i.name, i.detail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_counts_as_ok_only_when_auth_status_says_logged_in() {
        let out = r#"{"loggedIn": false, "authMethod": "none", "apiProvider": "firstParty"}"#;
        let e = claude_auth_verdict(out).unwrap_err().to_string();
        assert!(
            e.contains("not logged in") && e.contains("claude auth login"),
            "{e}"
        );
        let key = r#"{"loggedIn": true, "authMethod": "api_key", "apiProvider": "firstParty", "apiKeySource": "ANTHROPIC_API_KEY"}"#;
        assert!(claude_auth_verdict(key)
            .unwrap()
            .contains("ANTHROPIC_API_KEY"));
        let sub = r#"{"loggedIn": true, "authMethod": "claude.ai", "apiProvider": "firstParty"}"#;
        assert!(claude_auth_verdict(sub).unwrap().contains("estimates"));
        assert!(claude_auth_verdict("Usage: claude [options]").is_err());
    }
}
