//! What a child process inherits from the daemon: its environment, filtered so that no
//! daemon setting or secret reaches code the daemon did not write.

/// What a child gets from the daemon: the environment it may see and, for a task's
/// children, the task's [`Sandbox`], applied by [`super::run_with`] to every spawn.
#[derive(Debug, Clone, Default)]
pub struct ChildEnv {
    vars: Vec<(String, String)>,
    sandbox: Option<Arc<Sandbox>>,
}

use std::sync::Arc;

use crate::sandbox::Sandbox;

/// Always passed when an allowlist is in force, so children can still find programs.
const ALWAYS_ALLOWED: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TERM", "USER", "TMPDIR"];

impl ChildEnv {
    /// The daemon's environment minus its own settings (`HUB_SIDECAR_*`), the deny list, and
    /// any variable whose value contains a secret; with an allowlist, only those names.
    pub fn from_config(cfg: &crate::config::Config) -> ChildEnv {
        ChildEnv::filter(std::env::vars(), cfg)
    }

    /// The daemon's environment filtered by the `[env]` rules: `allow` names pass, `deny` wins.
    pub fn filter(
        vars: impl IntoIterator<Item = (String, String)>,
        cfg: &crate::config::Config,
    ) -> ChildEnv {
        let secrets: Vec<String> = cfg
            .secret_values()
            .into_iter()
            .filter(|s| s.len() >= 6)
            .collect();
        let allow = &cfg.env.allow;
        let vars = vars
            .into_iter()
            .filter(|(k, v)| {
                !k.starts_with("HUB_SIDECAR_")
                    && k != "NOTIFY_SOCKET"
                    && k != "WATCHDOG_USEC"
                    && k != "WATCHDOG_PID"
                    && !cfg.env.deny.iter().any(|d| d == k)
                    && (allow.is_empty()
                        || allow.iter().any(|a| a == k)
                        || ALWAYS_ALLOWED.contains(&k.as_str()))
                    && !secrets.iter().any(|s| v.contains(s.as_str()))
            })
            .collect();
        ChildEnv {
            vars,
            sandbox: None,
        }
    }

    /// The current environment, unfiltered (tests, offline tools).
    pub fn inherit() -> ChildEnv {
        ChildEnv {
            vars: std::env::vars().collect(),
            sandbox: None,
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
