//! What a child process inherits from the daemon: its environment, an **allowlist**, so
//! that no daemon setting or credential reaches code the daemon did not write unless the
//! operator passes it on purpose.
//!
//! A child gets the variables toolchains need ([`BUILT_IN`], and `LC_*`), plus what the
//! operator lists in `[env] allow`; never `HUB_SIDECAR_*`, a name in `[env] deny`, or a
//! value that contains one of the daemon's secrets. Credentials such as `GH_TOKEN`,
//! `GITHUB_TOKEN`, `AWS_*` or `NPM_TOKEN` are simply not on the list. The agent CLI's own
//! credential (`[env] agent`, `ANTHROPIC_API_KEY` by default) is kept aside and added only
//! where the agent itself is started ([`ChildEnv::for_agent`]); the pull request's
//! (`[env] publish`, `GH_TOKEN`) only for the push and `gh` ([`ChildEnv::for_publish`]).

/// What a child gets from the daemon: the environment it may see and, for a task's
/// children, the task's [`Sandbox`], applied by [`super::run_with`] to every spawn.
#[derive(Debug, Clone, Default)]
pub struct ChildEnv {
    vars: Vec<(String, String)>,
    /// The agent CLI's variables (`[env] agent`): only in [`ChildEnv::for_agent`].
    agent: Vec<(String, String)>,
    /// The publishing step's variables (`[env] publish`): only in
    /// [`ChildEnv::for_publish`].
    publish: Vec<(String, String)>,
    sandbox: Option<Arc<Sandbox>>,
    /// The task's fence (see [`super::Fence`]): every child started with this environment
    /// is stopped while it is closed, and none starts.
    fence: Option<super::Fence>,
}

use std::sync::Arc;

use crate::redact::known::Credential;
use crate::redact::Redactor;
use crate::sandbox::Sandbox;

/// Variables every child gets when the daemon has them: what shells, compilers and
/// toolchain managers need to find themselves. Paths and names only, no credentials.
const BUILT_IN: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "GOPATH",
    "GOROOT",
    "GOBIN",
    "GOMODCACHE",
    "GOCACHE",
    "JAVA_HOME",
    "GRADLE_USER_HOME",
    "MAVEN_HOME",
    "PYENV_ROOT",
    "PYENV_VERSION",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "NVM_DIR",
    "NVM_BIN",
    "NODE_PATH",
    "VOLTA_HOME",
    "PNPM_HOME",
    "BUN_INSTALL",
    "DENO_DIR",
    "ASDF_DIR",
    "ASDF_DATA_DIR",
    "RBENV_ROOT",
    "GEM_HOME",
    "GEM_PATH",
    "SDKMAN_DIR",
    "CLAUDE_CONFIG_DIR",
];

/// Whether `name` is on the built-in list (or a locale variable).
fn built_in(name: &str) -> bool {
    BUILT_IN.contains(&name) || name.starts_with("LC_")
}

impl ChildEnv {
    /// The daemon's environment through the `[env]` allowlist (see the module docs).
    pub fn from_config(cfg: &crate::config::Config) -> ChildEnv {
        ChildEnv::filter(std::env::vars(), cfg)
    }

    /// `vars` through the `[env]` allowlist: built-in and `allow` names pass, `deny`, the
    /// daemon's own settings and any value holding a secret never do; `agent` names are
    /// kept aside for [`ChildEnv::for_agent`].
    pub fn filter(
        vars: impl IntoIterator<Item = (String, String)>,
        cfg: &crate::config::Config,
    ) -> ChildEnv {
        let secrets: Vec<String> = cfg
            .secret_values()
            .into_iter()
            .filter(|s| s.len() >= 6)
            .collect();
        let listed = |list: &[String], k: &str| list.iter().any(|a| a == k);
        let (mut kept, mut agent, mut publish) = (Vec::new(), Vec::new(), Vec::new());
        for (k, v) in vars {
            if k.starts_with("HUB_SIDECAR_")
                || listed(&cfg.env.deny, &k)
                || secrets.iter().any(|s| v.contains(s.as_str()))
            {
                continue;
            }
            if built_in(&k) || listed(&cfg.env.allow, &k) {
                kept.push((k, v));
            } else if listed(&cfg.env.agent, &k) {
                agent.push((k, v));
            } else if listed(&cfg.env.publish, &k) {
                publish.push((k, v));
            }
        }
        ChildEnv {
            vars: kept,
            agent,
            publish,
            sandbox: None,
            fence: None,
        }
    }

    /// The same environment with the agent CLI's own variables (`[env] agent`) added: for
    /// starting `claude` (executor or judge), never a shell task, a check or git.
    pub fn for_agent(&self) -> ChildEnv {
        let mut env = self.clone();
        for (k, v) in &self.agent {
            env.set(k, v);
        }
        env
    }

    /// The same environment with the publishing step's variables (`[env] publish`) added:
    /// for `git push` and `gh pr create`, after the task's work is done.
    pub fn for_publish(&self) -> ChildEnv {
        let mut env = self.clone();
        for (k, v) in &self.publish {
            env.set(k, v);
        }
        env
    }

    /// The agent CLI's variables (`[env] agent`) as kept aside: credentials to redact.
    pub fn agent_vars(&self) -> &[(String, String)] {
        &self.agent
    }

    /// The publishing step's variables (`[env] publish`) as kept aside: credentials to
    /// redact.
    pub fn publish_vars(&self) -> &[(String, String)] {
        &self.publish
    }

    /// Every credential the daemon holds, named by source: `cfg`'s token and `secrets`,
    /// this environment's `[env] agent` and `[env] publish` values, and the tokens of the
    /// agent login in the template these variables name (see
    /// [`crate::redact::known`]). Reads the login files: call it off the runtime.
    pub fn credentials(&self, cfg: &crate::config::Config) -> Vec<Credential> {
        let mut all = crate::redact::known::from_parts(cfg, &self.agent, &self.publish);
        all.extend(self.agent_login());
        all
    }

    /// The tokens of the agent login in the template these variables name (the operator's
    /// `CLAUDE_CONFIG_DIR`, else `~/.claude`), as the files are now. Reads them: call it off
    /// the runtime.
    pub fn agent_login(&self) -> Vec<Credential> {
        crate::sandbox::agent_home::template(&self.vars)
            .map(|dir| crate::redact::known::agent_login(&dir))
            .unwrap_or_default()
    }

    /// The redactor for everything [`ChildEnv::credentials`] names, the login files read
    /// off the runtime: what the daemon scrubs from every frame, record and log line.
    pub async fn redactor(&self, cfg: &crate::config::Config) -> Redactor {
        let (env, config) = (self.clone(), cfg.clone());
        match tokio::task::spawn_blocking(move || env.credentials(&config)).await {
            Ok(all) => Redactor::from_credentials(all),
            // The login unread (the blocking pool is shutting down): still everything the
            // config and the environment hold.
            Err(_) => Redactor::from_credentials(crate::redact::known::from_parts(
                cfg,
                &self.agent,
                &self.publish,
            )),
        }
    }

    /// The current environment, unfiltered (tests, offline tools).
    pub fn inherit() -> ChildEnv {
        ChildEnv {
            vars: std::env::vars().collect(),
            agent: Vec::new(),
            publish: Vec::new(),
            sandbox: None,
            fence: None,
        }
    }

    /// Every variable, in order.
    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }

    /// The value of `key`, if passed.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The same environment, confined by `sandbox` (see [`confine`]).
    pub fn with_sandbox(mut self, sandbox: Arc<Sandbox>) -> ChildEnv {
        self.sandbox = Some(sandbox);
        self
    }

    /// The sandbox every child started with this environment runs in, if any.
    pub fn sandbox(&self) -> Option<&Arc<Sandbox>> {
        self.sandbox.as_ref()
    }

    /// The same environment, for the children of the task `fence` belongs to.
    pub fn with_fence(mut self, fence: super::Fence) -> ChildEnv {
        self.fence = Some(fence);
        self
    }

    /// The fence every child started with this environment obeys, if any.
    pub fn fence(&self) -> Option<&super::Fence> {
        self.fence.as_ref()
    }

    /// Remove one variable, if passed.
    pub fn remove(&mut self, key: &str) {
        self.vars.retain(|(k, _)| k != key);
    }

    /// Override or add one variable (e.g. a test's PATH).
    pub fn set(&mut self, key: &str, value: &str) {
        self.vars.retain(|(k, _)| k != key);
        self.vars.push((key.to_string(), value.to_string()));
    }
}

/// `env` confined by `policy` for one task, with `tmp` as its private TMPDIR: the variables
/// the sandbox sets, and the sandbox every child started with the result runs in (see
/// [`crate::sandbox::plan`]). Unchanged when containment is off.
pub fn confine(
    cfg: &crate::config::Config,
    policy: &crate::sandbox::Policy,
    env: &ChildEnv,
    tmp: &std::path::Path,
    grants: &crate::sandbox::Grants,
) -> Result<ChildEnv, crate::sandbox::ContainmentError> {
    let c = crate::sandbox::plan(cfg, policy, env.vars(), tmp, grants)?;
    let mut out = env.clone();
    for (k, v) in &c.set {
        out.set(k, v);
    }
    Ok(match c.sandbox {
        Some(sb) => out.with_sandbox(sb),
        None => out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An allowlist, built from the class: every common credential a developer's or a CI
    /// machine's environment holds stays out unless the operator names it.
    #[test]
    fn no_credential_reaches_a_child_unless_the_operator_passes_it() {
        let mut cfg = crate::config::Config::default();
        let creds = [
            "GH_TOKEN",
            "GITHUB_TOKEN",
            "GH_ENTERPRISE_TOKEN",
            "GITLAB_TOKEN",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "AZURE_CLIENT_SECRET",
            "NPM_TOKEN",
            "CARGO_REGISTRY_TOKEN",
            "DOCKER_AUTH_CONFIG",
            "SSH_AUTH_SOCK",
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "DATABASE_URL",
            "GIT_ASKPASS",
            "GIT_CONFIG_PARAMETERS",
            "HTTPS_PROXY",
        ];
        let mut vars: Vec<(String, String)> = creds
            .iter()
            .map(|k| (k.to_string(), "s3cr3t-value".to_string()))
            .collect();
        for (k, v) in [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/svc"),
            ("LC_CTYPE", "C.UTF-8"),
            ("CARGO_HOME", "/opt/cargo"),
            ("MY_BUILD_FLAG", "1"),
        ] {
            vars.push((k.into(), v.into()));
        }
        let env = ChildEnv::filter(vars.clone(), &cfg);
        let names: Vec<&str> = env.vars().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "HOME", "LC_CTYPE", "CARGO_HOME"]);
        // The agent's credential reaches the agent alone.
        assert_eq!(env.get("ANTHROPIC_API_KEY"), None);
        assert_eq!(
            env.for_agent().get("ANTHROPIC_API_KEY"),
            Some("s3cr3t-value")
        );
        // The pull request's credential reaches the publishing step alone.
        assert_eq!(env.for_agent().get("GH_TOKEN"), None);
        assert_eq!(env.for_publish().get("GH_TOKEN"), Some("s3cr3t-value"));
        // On purpose: the operator lists it.
        cfg.env.allow = vec!["GH_TOKEN".into(), "MY_BUILD_FLAG".into()];
        cfg.env.agent.clear();
        let env = ChildEnv::filter(vars, &cfg);
        assert_eq!(env.get("GH_TOKEN"), Some("s3cr3t-value"));
        assert_eq!(env.get("MY_BUILD_FLAG"), Some("1"));
        assert_eq!(env.for_agent().get("ANTHROPIC_API_KEY"), None);
    }

    /// Each source the daemon holds a credential from is named, and the environment's
    /// `[env] agent` and `[env] publish` values are among them though no child but the
    /// agent (or the push) ever sees them.
    #[test]
    fn every_credential_the_daemon_holds_is_known_by_its_source() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join(".credentials.json"),
            r#"{"claudeAiOauth":{"accessToken":"oauth-access-123456"}}"#,
        )
        .unwrap();
        let cfg = crate::config::Config {
            token: "hub-token-123456".into(),
            secrets: vec!["listed-secret-123".into()],
            ..crate::config::Config::default()
        };
        let vars = [
            ("ANTHROPIC_API_KEY", "sk-ant-api-key-123"),
            ("GH_TOKEN", "gh-publish-tok-123"),
            ("CLAUDE_CONFIG_DIR", &d.path().to_string_lossy()),
            ("PATH", "/usr/bin"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let env = ChildEnv::filter(vars, &cfg);
        let got: Vec<(String, String)> = env
            .credentials(&cfg)
            .into_iter()
            .map(|c| (c.source, c.value))
            .collect();
        let want = [
            ("the hub token", "hub-token-123456"),
            ("a `secrets` value", "listed-secret-123"),
            ("`[env] agent` ANTHROPIC_API_KEY", "sk-ant-api-key-123"),
            ("`[env] publish` GH_TOKEN", "gh-publish-tok-123"),
            (
                "the agent login (.credentials.json: claudeAiOauth.accessToken)",
                "oauth-access-123456",
            ),
        ]
        .map(|(s, v)| (s.to_string(), v.to_string()));
        assert_eq!(got, want);
        // Still passed where it belongs, and only there.
        assert_eq!(
            env.for_agent().get("ANTHROPIC_API_KEY"),
            Some("sk-ant-api-key-123")
        );
        assert_eq!(env.get("ANTHROPIC_API_KEY"), None);
    }
}
