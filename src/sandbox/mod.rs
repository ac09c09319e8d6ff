//! Containment of the work a task runs: what every child process of a task may touch.
//!
//! A task's children (the shell command, `claude`, verification checks, the agentic
//! `run_command`, the judge, and the daemon's own git calls in the workspace) all start in
//! [`crate::process::run_with`], which applies the task's [`Sandbox`] to them. A sandbox
//! travels inside the [`ChildEnv`](crate::process::ChildEnv) the runner hands out, so a call site cannot forget it.
//!
//! What a sandbox enforces, each where the kernel allows it (see [`Support`]):
//!
//! - **Filesystem (Landlock)**: read-write only the workspace and a private per-task
//!   directory (`TMPDIR`, and in it the task's own `HOME`, see [`task_home`], and `claude`'s
//!   per-task `CLAUDE_CONFIG_DIR`, a copy of the operator's template: see [`agent_home`]);
//!   the repository's dependency caches ([`caches`]); read-only the system
//!   (`/usr`, `/etc`, toolchains on PATH); nothing else: not the daemon's config file, state
//!   directory (outbox, locks), other workspaces or credentials. With Landlock ABI ≥ 6 the
//!   children cannot signal processes outside their domain nor reach abstract sockets.
//! - **Processes (user + PID namespace)**: each command is PID 1 of a fresh namespace, so
//!   nothing it starts (`setsid`, double fork) outlives it, and the daemon is not even
//!   addressable by pid from inside. See `child.rs`.
//! - **Kernel channels (IPC namespace, keyring)**: SysV shared memory, message queues,
//!   semaphores and POSIX message queues in an IPC namespace of the task's own, bounded and
//!   gone with it (see `ipc.rs`); a fresh, empty session keyring for each child and the key
//!   calls refused (see `keyring.rs`).
//! - **The host's socket files (mount namespace)**: every tree but the system's is hidden
//!   under an empty tmpfs, what is granted in it bound back, so no path socket outside the
//!   grants and `[sandbox] sockets` can be named (see `mounts.rs`). Made once per task,
//!   joined by each child (see `view.rs`).
//! - **Network** (`[network] mode`): `open`; `none`: a network namespace of the task's
//!   own with only its loopback, so it reaches no host and none of the host's loopback
//!   services (Ollama, a database, the hub); `allowlist`: the same namespace, whose only
//!   way out is the daemon's HTTP proxy ([`proxy`]) letting through the hosts in
//!   `[network] allow`. One namespace per task, made with its view and shared by all its
//!   children, never by another task's (see `netns.rs`). Only the task's children; the
//!   daemon's own connections and git calls keep the host's network.
//! - **Limits (rlimits)**: memory, processes, file size, open files, no core dumps.
//! - **The daemon itself** is not dumpable ([`protect_daemon`]): its memory and
//!   `/proc/<pid>/environ` are closed to other processes of the same user.
//!
//! Levels (`containment` in the config): `strict` refuses a task it cannot confine fully,
//! `best-effort` confines what it can and says once, at start, what is missing, `off` runs
//! children unconfined (process groups and environment scrubbing only). Unset means strict,
//! everywhere: a weaker level is the operator's explicit choice, never a silent fallback. A
//! strict daemon on a machine that cannot confine takes no work and says why (see
//! `daemon`), and every task's result records the level it ran under ([`Policy::ran_under`]).
//!
//! # Layout
//!
//! - this file: levels, per-task policies and [`Sandbox`].
//! - `support.rs`: what the kernel allows ([`Support`]), probed once; [`refusal`]: who
//!   refused what is missing (a seccomp filter, an LSM, a sysctl, the kernel).
//! - `mounts.rs`: the children's view of the host's trees (a mount namespace's plan);
//!   `view.rs`: that view made once per task, in namespaces each child joins; `premade.rs`:
//!   views made ahead, while the daemon is idle; `netns.rs`: the task's network namespace
//!   in the view, its `lo` and the proxy's listener; `probing.rs`: the probe off the runtime.
//! - `grants.rs`: what a sandbox grants on the file system ([`Grants`] → the policy).
//! - [`landlock`]: the filesystem policy as a Landlock ruleset.
//! - [`agent_home`]: the agent CLI's per-task configuration directory.
//! - [`caches`]: the per-repository dependency caches a task's package managers write.
//! - [`beneath`]: the one way the daemon touches a tree a task can write (no link followed).
//! - [`task_home`]: the task's own HOME, fresh for every task.
//! - [`denial`]: telling from a failed child's output that containment refused it a path.
//! - [`proxy`]: the HTTP proxy that is a task's only way out under `[network] mode = "allowlist"`;
//!   [`allowlist`]: what it lets through (by name and port, then by address); `tally.rs`:
//!   its bounded record of hosts; `network.rs`: the proxy and its variables in a task's plan;
//!   [`descriptors`]: the daemon's open-files limit and the proxy's share of it.
//! - `handoff.rs`: how a view's descriptors reach the daemon, and the checks on the task's
//!   proxy listener before the sandbox serves it for its life.
//! - [`launch`]: how every child is made (`clone` in the daemon's memory, not `fork`);
//!   `child.rs`: what it does before its `exec`; `ipc.rs`: the task's IPC namespace and
//!   its bounds; `keyring.rs`: the key calls closed to the children.
//! - `resolve.rs`: the grants' canonical paths.
//! - `hardening.rs`: the daemon's own ([`protect_daemon`], [`refuse_powerless_root`]).

pub mod agent_home;
pub mod allowlist;
pub mod beneath;
pub mod caches;
mod child;
pub mod denial;
pub mod descriptors;
mod grants;
mod handoff;
mod hardening;
mod ipc;
mod keyring;
pub mod landlock;
mod launch;
mod mounts;
mod netns;
mod network;
mod premade;
mod probing;
pub mod proxy;
pub mod refusal;
mod resolve;
mod splice;
mod support;
mod tally;
pub mod task_home;
pub mod teardown;
mod view;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Config;

use child::ChildPlan;
pub use grants::Grants;
use grants::{fs_policy, var_in};
pub use hardening::{protect_daemon, refuse_powerless_root};
use landlock::FsPolicy;
pub use launch::{launch, Launch, Launched, Stdio};
pub use mounts::host_trees;
use netns::NetPlan;
pub use probing::Probing;
pub use support::{NamespaceError, Refused, Support};

pub use crate::config::{Containment, NetworkMode, SandboxConfig};

/// The containment level in force, decided from the config and the probe.
///
/// Unset means strict: a weaker level is only ever the operator's explicit choice. Where
/// the machine cannot enforce strict, a strict daemon takes no work ([`Policy::refusal`])
/// rather than quietly running tasks with less confinement than it says.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The level in force: the configured one, or strict.
    pub level: Containment,
    /// What the kernel can enforce.
    pub support: Support,
    /// Task views made while the daemon is idle (see `premade.rs`), shared by the clones of
    /// this policy; each view in it serves one task.
    views: Arc<premade::ViewPool>,
}

impl Policy {
    /// `configured` (None: strict), against what the kernel allows.
    pub fn decide(configured: Option<Containment>, support: Support) -> Policy {
        Policy {
            level: configured.unwrap_or(Containment::Strict),
            support,
            views: Arc::default(),
        }
    }

    /// Make the views of the next tasks now, while the daemon is idle (see `premade.rs`),
    /// for children that inherit `vars`: blocking (forks), so off the runtime. Nothing when
    /// tasks get no view here (containment off, no namespaces, strict and refusing).
    pub fn prepare_views(&self, cfg: &Config, vars: &[(String, String)]) {
        if self.level == Containment::Off
            || self.support.namespaces.is_err()
            || self.refusal().is_some()
        {
            return;
        }
        // What the task's own children need (the daemon's git takes less of the view).
        let net = NetPlan::new(
            cfg.network.mode != NetworkMode::Open,
            cfg.network.mode == NetworkMode::Allowlist,
        );
        self.views.refill(
            &mounts::private(cfg, vars),
            &ipc::IpcPlan::new(cfg.sandbox.max_memory_mb),
            net,
        );
    }

    /// Views made ahead and not yet taken by a task.
    pub fn views_ready(&self) -> usize {
        self.views.ready()
    }

    /// The view for one task's children, with the network `net`: one made ahead when
    /// there is one that fits, else one made now (the same holder code). Blocking.
    fn view_for(
        &self,
        plan: &mounts::MountPlan,
        ipc: &ipc::IpcPlan,
        net: NetPlan,
    ) -> std::io::Result<view::TaskView> {
        if let Some(premade) = self.views.take() {
            match premade.finish(plan, net) {
                Ok(view) => return Ok(view),
                Err(e) => {
                    tracing::debug!(error = %e, "the view made ahead does not fit this task; making one")
                }
            }
        }
        view::TaskView::create(plan, ipc, net)
    }

    /// Protect the daemon, then probe the kernel and decide the level for `cfg`: blocking
    /// (it forks a short-lived child), so off the runtime.
    ///
    /// The one probe every entry point uses — the daemon, `run-task`, `verify`, `check`,
    /// `demo` — so all of them answer "can tasks be confined?" in the same process state
    /// as a real task's spawn: after [`protect_daemon`], which changes what a child may
    /// do with its own `/proc/self` (the service-user failure this order once hid).
    pub fn probe_blocking(configured: Option<Containment>) -> Policy {
        protect_daemon();
        let support = if configured == Some(Containment::Off) {
            Support::none()
        } else {
            Support::probe()
        };
        Policy::decide(configured, support)
    }

    /// [`Probing`] from start to answer: what every entry point that runs tasks does first.
    pub async fn probe_and_decide(configured: Option<Containment>) -> Policy {
        Probing::start(configured).answer().await
    }

    /// Why no task may run now, with what to do about it; `None` when tasks may run.
    /// Only strict refuses: best-effort and off run with what there is, by the operator's
    /// explicit choice.
    pub fn refusal(&self) -> Option<String> {
        let missing = self.support.missing();
        (self.level == Containment::Strict && !missing.is_empty()).then(|| {
            format!(
                "containment_unavailable: containment is strict (the default) but {}; fix the machine (the daemon re-checks by itself), or set containment = \"best-effort\" to run tasks with weaker confinement",
                missing.join("; ")
            )
        })
    }

    /// The level tasks run under now, as one word: `strict`, `best-effort` or `off`. A
    /// best-effort daemon on a machine that enforces everything still says `best-effort`:
    /// it is the operator's promise, not the kernel's, that a reader should see.
    pub fn level_name(&self) -> &'static str {
        self.level.as_str()
    }

    /// What a task ran under, for its result and flight record: the level and, below
    /// strict, the layers that were not enforced.
    pub fn ran_under(&self) -> serde_json::Value {
        let missing = match self.level {
            Containment::Strict => Vec::new(),
            Containment::BestEffort => self.support.missing(),
            Containment::Off => vec!["everything: containment is off".to_string()],
        };
        if missing.is_empty() {
            serde_json::json!({"level": self.level_name()})
        } else {
            serde_json::json!({"level": self.level_name(), "not_enforced": missing})
        }
    }

    /// Log once what is enforced and what is not.
    pub fn log(&self) {
        let missing = self.support.missing();
        match self.level {
            Containment::Off => tracing::warn!(
                "containment is off: tasks run with the daemon's full privileges (set containment = \"strict\")"
            ),
            _ if missing.is_empty() => tracing::info!(
                level = self.level_name(),
                layers = %self.support.describe(),
                "containment ready"
            ),
            Containment::Strict => tracing::error!(
                missing = %missing.join("; "),
                "NOT accepting tasks: containment is strict but this machine cannot enforce it; fix it (re-checked with backoff, no restart needed) or set containment = \"best-effort\""
            ),
            Containment::BestEffort => tracing::warn!(
                missing = %missing.join("; "),
                "containment is best-effort (configured): these layers are NOT enforced"
            ),
        }
    }
}

/// Why a task's children cannot be confined as the level demands.
#[derive(Debug, thiserror::Error)]
pub enum ContainmentError {
    /// Strict containment, and the machine lacks layers: [`Policy::refusal`]'s text.
    #[error("{0}")]
    Unavailable(String),
    /// The task's private TMPDIR could not be created.
    #[error("containment_failed: cannot set up the task's sandbox: cannot create TMPDIR {}: {source}", path.display())]
    Tmpdir {
        /// The TMPDIR that was to be created.
        path: PathBuf,
        /// Why creating it failed.
        source: std::io::Error,
    },
    /// The task's copy of the agent's configuration could not be made.
    #[error("containment_failed: cannot set up the agent's configuration {}: {source}", path.display())]
    AgentConfig {
        /// The per-task configuration directory.
        path: PathBuf,
        /// Why making it failed.
        source: std::io::Error,
    },
    /// `[network] mode = "none"` or `"allowlist"` needs a network namespace, and this machine
    /// gives none.
    #[error("containment_unavailable: [network] mode = \"none\" or \"allowlist\" needs user namespaces, which this machine refuses ({0}); fix the machine or set [network] mode = \"open\"")]
    NoNetworkNamespace(String),
    /// The network proxy of `[network] mode = "allowlist"` could not start.
    #[error("containment_failed: cannot start the task's network proxy: {0}")]
    Proxy(std::io::Error),
    /// The repository's dependency caches could not be prepared.
    #[error("containment_failed: cannot prepare the repository's dependency caches under {}: {source}; check that the state directory is writable, or set [caches] enabled = false", path.display())]
    Caches {
        /// The caches' root.
        path: PathBuf,
        /// Why preparing them failed.
        source: std::io::Error,
    },
    /// The task's own HOME could not be made.
    #[error("containment_failed: cannot set up the task's HOME under {}: {source}; check that the state directory is writable and that [sandbox] npmrc, when set, names a readable file", path.display())]
    TaskHome {
        /// The task's private directory.
        path: PathBuf,
        /// Why making it failed.
        source: std::io::Error,
    },
    /// The Landlock ruleset could not be built.
    #[error("containment_failed: cannot set up the task's sandbox: {0}")]
    Landlock(#[from] landlock::BuildError),
    /// The children's view of the host's trees could not be planned.
    #[error("containment_failed: cannot plan the task's view of the file system: {0}")]
    Mounts(#[from] mounts::PlanError),
    /// The task's namespaces, with that view in them, could not be made.
    #[error("containment_failed: cannot make the task's view of the file system: {0}")]
    View(std::io::Error),
    /// The set-up, run on the blocking pool, panicked or was cancelled.
    #[error("containment_failed: the sandbox set-up panicked: {0}")]
    Panicked(String),
}

/// One task's confinement, shared by every child of the task.
#[derive(Debug)]
pub struct Sandbox {
    plan: ChildPlan,
    /// Keeps the ruleset descriptor the plan names open.
    _ruleset: Option<landlock::Built>,
    /// Keeps the task's namespaces the plan joins open (see `view.rs`).
    _view: Option<view::TaskView>,
    /// The private TMPDIR.
    tmp: PathBuf,
    /// The operator's agent configuration the task's copies are made from (never granted).
    agent_template: Option<PathBuf>,
    /// What of the template the task's copy was made from ([`agent_home::fingerprint`]).
    agent_copied: Option<agent_home::Fingerprint>,
    /// The filesystem policy enforced (None without Landlock), to recognise its refusals.
    fs: Option<FsPolicy>,
    /// Whether the children have no network (`[network] mode = "none"`).
    network_cut: bool,
    /// The proxy that is their only way out (`[network] mode = "allowlist"`).
    proxy: Option<proxy::Proxy>,
    /// The proxy serving the task's one listener (in its network namespace, see
    /// `netns.rs`) for the sandbox's life, whichever children run.
    _serving: Option<proxy::Lease>,
    /// The config file a grant would go into, for messages.
    config: Option<PathBuf>,
    /// The service user's HOME, which a denial never suggests granting.
    home: Option<PathBuf>,
    /// Every repository's dependency caches, in bytes, once this task's was prepared
    /// (`None`: no cache, or no bound to count for).
    pub caches_bytes: Option<u64>,
}

impl Sandbox {
    /// A sandbox that only joins `view`'s namespaces (no limits, no Landlock, no network of
    /// its own): the probe's child and the views' own tests.
    pub(super) fn joining(view: view::TaskView) -> Sandbox {
        Sandbox {
            plan: ChildPlan {
                rlimits: Vec::new(),
                namespaces: Some(view.join()),
                own_network: false,
                landlock_fd: None,
            },
            _ruleset: None,
            _view: Some(view),
            tmp: PathBuf::new(),
            agent_template: None,
            agent_copied: None,
            fs: None,
            network_cut: false,
            proxy: None,
            _serving: None,
            config: None,
            home: None,
            caches_bytes: None,
        }
    }

    /// What each child of the task does between `clone` and `exec` (see `launch.rs`).
    pub(crate) fn child_plan(&self) -> &ChildPlan {
        &self.plan
    }

    /// The task's private temp directory.
    pub fn tmp(&self) -> &Path {
        &self.tmp
    }

    /// The operator's agent configuration directory, the template of the task's copies.
    pub fn agent_template(&self) -> Option<&Path> {
        self.agent_template.as_deref()
    }

    /// Reap now what made the task's view ahead of it (see `view.rs`), not when the sandbox
    /// closes: for a sandbox kept while the daemon is idle. Blocking, briefly.
    pub fn reap_view_holder(&self) {
        if let Some(view) = &self._view {
            view.reap_holder();
        }
    }

    /// Copy the operator's agent configuration into the task's directory again (see
    /// [`agent_home`]) if it changed since the copy was made: for a sandbox made ahead of
    /// its task, whose copy may predate a new login. Blocking; reads only, unless it
    /// changed.
    pub fn refresh_agent_config(&self) -> std::io::Result<()> {
        let Some(template) = &self.agent_template else {
            return Ok(());
        };
        let now = agent_home::fingerprint(template);
        if now.is_some() && now == self.agent_copied {
            return Ok(());
        }
        agent_home::seed(template, &agent_home::dir_for(&self.tmp, "agent"))
    }

    /// Whether `output` (of a child that failed) shows that this sandbox refused it a path
    /// the task needed: an infrastructure error, not a fault of the task's code (see
    /// [`denial`]). Blocking (stats the paths named): for a failed child's output only.
    pub fn denial(&self, output: &str) -> Option<denial::Denial> {
        let (cut, hides) = (self.network_cut, self.plan.namespaces.is_some());
        let config = self.config.as_deref();
        self.fs
            .as_ref()
            .and_then(|fs| denial::find(output, fs, config, self.home.as_deref(), hides))
            .or_else(|| cut.then(|| denial::find_network(output, config)).flatten())
            .or_else(|| {
                // The proxy's tally is the whole task's: a host counts only when this output
                // shows the proxy's answer (its status or the host), so an earlier child's
                // refused or unreachable host does not turn a real failure into an
                // infrastructure error.
                let hosts = self.proxy.as_ref()?.hosts();
                let shows = |h: &proxy::HostUse, status: &[&str]| {
                    let lower = output.to_ascii_lowercase();
                    let host = h.target.rsplit_once(':').map_or(&*h.target, |(n, _)| n);
                    status.iter().any(|s| lower.contains(s)) || output.contains(host)
                };
                // A refused host first: the operator's allowlist is the likelier cause.
                if let Some(refused) = hosts
                    .iter()
                    .find(|h| !h.allowed && shows(h, &["403", "forbidden"]))
                {
                    return Some(denial::Denial::Host {
                        target: refused.target.clone(),
                        config: config.map(Path::to_path_buf),
                    });
                }
                let down = hosts
                    .into_iter()
                    .find(|h| h.unreachable > 0 && shows(h, &["502", "bad gateway"]))?;
                Some(denial::Denial::Unreachable {
                    target: down.target,
                    error: down.last_error.unwrap_or_default(),
                })
            })
    }

    /// What the task's children asked of the network proxy (`[network] mode = "allowlist"`),
    /// allowed and refused, with bytes; empty without one.
    pub fn network_use(&self) -> Vec<proxy::HostUse> {
        self.proxy.as_ref().map(|p| p.hosts()).unwrap_or_default()
    }

    /// The task's proxy listeners served now: under `[network] mode = "allowlist"` one, in
    /// the task's network namespace, from the sandbox's making to its end, however many
    /// children run (0 without the proxy).
    pub fn proxy_listeners(&self) -> usize {
        self.proxy.as_ref().map_or(0, proxy::Proxy::listeners)
    }
}

/// The environment a task's children get beyond the daemon's: the variables the sandbox
/// sets and the sandbox itself (`None` when containment is off). Applied to a child
/// environment by [`crate::process::confine`].
#[derive(Debug)]
pub struct Confined {
    /// Variables set for the children (TMPDIR and friends, the task's HOME, the per-task
    /// CLAUDE_CONFIG_DIR), one of each name.
    pub set: Vec<(String, String)>,
    /// The sandbox every child installs; `None` when containment is off.
    pub sandbox: Option<Arc<Sandbox>>,
}

/// The sandbox for one task whose children inherit `vars`, with `tmp` as their private
/// TMPDIR (created). Refuses, in strict mode, what this machine cannot confine.
pub fn plan(
    cfg: &Config,
    policy: &Policy,
    vars: &[(String, String)],
    tmp: &Path,
    grants: &Grants,
) -> Result<Confined, ContainmentError> {
    if policy.level == Containment::Off {
        return Ok(Confined {
            set: Vec::new(),
            sandbox: None,
        });
    }
    if let Some(why) = policy.refusal() {
        return Err(ContainmentError::Unavailable(why));
    }
    std::fs::create_dir_all(tmp).map_err(|source| ContainmentError::Tmpdir {
        path: tmp.to_path_buf(),
        source,
    })?;
    let mut set = Vec::new();
    let tmp_s = tmp.to_string_lossy().into_owned();
    for k in ["TMPDIR", "TMP", "TEMP"] {
        set.push((k.to_string(), tmp_s.clone()));
    }
    // The task's own HOME (see `task_home`); the daemon's git has its own (`git-home`).
    if grants.task {
        let home = task_home::seed(tmp, vars, cfg.sandbox.npmrc.as_deref()).map_err(|source| {
            ContainmentError::TaskHome {
                path: tmp.to_path_buf(),
                source,
            }
        })?;
        put_all(&mut set, home);
    }
    let mut grants = std::borrow::Cow::Borrowed(grants);
    let mut caches_bytes = None;
    if let Some(ws) = caches::workspace_of(cfg, &grants) {
        let prepared =
            caches::prepare(cfg, ws, vars).map_err(|source| ContainmentError::Caches {
                path: caches::root(cfg),
                source,
            })?;
        put_all(&mut set, prepared.set);
        grants.to_mut().write.push(prepared.dir);
        caches_bytes = prepared.bytes;
    }
    set.extend(safe_directory(grants.write.first(), vars));
    // `claude`'s configuration is the task's own: a fresh copy of the operator's template
    // under the task's private directory, removed with it (see `agent_home`).
    let agent_template = agent_home::template(vars);
    // Taken before the copy: a change while copying shows as a change later.
    let agent_copied = agent_template.as_deref().and_then(agent_home::fingerprint);
    if let Some(template) = &agent_template {
        let dir = agent_home::dir_for(tmp, "agent");
        agent_home::seed(template, &dir).map_err(|source| ContainmentError::AgentConfig {
            path: dir.clone(),
            source,
        })?;
        set.push((
            "CLAUDE_CONFIG_DIR".to_string(),
            dir.to_string_lossy().into_owned(),
        ));
    }
    let (landlock_on, ns_on) = (
        policy.support.landlock_abi > 0,
        policy.support.namespaces.is_ok(),
    );
    // What the children will see: the variables set here over the inherited ones.
    let fs = (landlock_on || ns_on).then(|| fs_policy(cfg, &[&set, vars], tmp, &grants));
    let ruleset = fs
        .as_ref()
        .filter(|_| landlock_on)
        .map(landlock::build)
        .transpose()?;
    let mounts = fs.as_ref().filter(|_| ns_on);
    let mounts = mounts
        .map(|fs| mounts::for_sandbox(cfg, fs, vars, tmp, &grants))
        .transpose()?;
    let own_network = grants.task && cfg.network.mode != NetworkMode::Open;
    if let (true, Err(e)) = (own_network, &policy.support.namespaces) {
        return Err(ContainmentError::NoNetworkNamespace(e.to_string()));
    }
    let proxy = (own_network && cfg.network.mode == NetworkMode::Allowlist)
        .then(|| network::proxy(cfg, vars, &grants, &mut set))
        .transpose()?;
    // Made once for the task (usually ahead of it: `premade.rs`), joined by each child (see
    // `view.rs`), with the task's own IPC namespace (see `ipc.rs`) and network namespace
    // (see `netns.rs`).
    let ipc = ipc::IpcPlan::new(cfg.sandbox.max_memory_mb);
    let net = NetPlan::new(own_network, proxy.is_some());
    let mut task_view = mounts
        .as_ref()
        .map(|m| policy.view_for(m, &ipc, net))
        .transpose()
        .map_err(ContainmentError::View)?;
    let serving = serve(proxy.as_ref(), task_view.as_mut())?;
    let fs = fs.filter(|_| landlock_on);
    let plan = ChildPlan {
        rlimits: rlimits(&cfg.sandbox),
        namespaces: task_view.as_ref().map(view::TaskView::join),
        own_network,
        landlock_fd: ruleset.as_ref().map(landlock::Built::raw_fd),
    };
    Ok(Confined {
        set,
        sandbox: Some(Arc::new(Sandbox {
            plan,
            _ruleset: ruleset,
            _view: task_view,
            tmp: tmp.to_path_buf(),
            agent_template,
            agent_copied,
            fs,
            network_cut: own_network && proxy.is_none(),
            proxy,
            _serving: serving,
            config: cfg.origin.clone(),
            home: var_in(&[vars], "HOME").map(PathBuf::from),
            caches_bytes,
        })),
    })
}

/// The proxy serving the listener in `view`'s network namespace (checked: see `handoff.rs`),
/// for the sandbox's life; nothing without a proxy. A proxy needs that listener.
fn serve(
    proxy: Option<&proxy::Proxy>,
    view: Option<&mut view::TaskView>,
) -> Result<Option<proxy::Lease>, ContainmentError> {
    let Some(proxy) = proxy else {
        return Ok(None);
    };
    let listener = view
        .and_then(view::TaskView::take_listener)
        .ok_or_else(|| {
            ContainmentError::Proxy(std::io::Error::other(
                "the task's view has no proxy listener",
            ))
        })?;
    let listener = handoff::checked(listener).map_err(ContainmentError::Proxy)?;
    proxy
        .serve(listener)
        .map(Some)
        .map_err(ContainmentError::Proxy)
}

/// `vars` into `set`, each replacing an earlier value of its name: the children see one.
fn put_all(set: &mut Vec<(String, String)>, vars: Vec<(String, String)>) {
    for (k, v) in vars {
        set.retain(|(n, _)| *n != k);
        set.push((k, v));
    }
}

/// The workspace named a safe directory for the children's own git.
///
/// Inside the task's user namespace only the service user's id is mapped: a workspace it
/// may write but does not own (a `repo_dir` shared through a group) shows the overflow
/// owner, and git refuses it as "dubious ownership" — never as root, who owns what it
/// works in. `safe.directory` is honoured only from protected scopes; the
/// `GIT_CONFIG_COUNT` variables are the command-line scope. Appended after any the
/// children already inherit.
fn safe_directory(workspace: Option<&PathBuf>, vars: &[(String, String)]) -> Vec<(String, String)> {
    let Some(ws) = workspace else {
        return Vec::new();
    };
    let n: usize = var_in(&[vars], "GIT_CONFIG_COUNT")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    vec![
        ("GIT_CONFIG_COUNT".into(), (n + 1).to_string()),
        (format!("GIT_CONFIG_KEY_{n}"), "safe.directory".into()),
        (
            format!("GIT_CONFIG_VALUE_{n}"),
            ws.to_string_lossy().into_owned(),
        ),
    ]
}

fn rlimits(c: &SandboxConfig) -> Vec<(libc::__rlimit_resource_t, libc::rlim_t)> {
    const MIB: u64 = 1024 * 1024;
    let mut v = vec![(libc::RLIMIT_CORE, 0)];
    for (res, val) in [
        (libc::RLIMIT_DATA, c.max_memory_mb.saturating_mul(MIB)),
        (libc::RLIMIT_NPROC, c.max_processes),
        (libc::RLIMIT_FSIZE, c.max_file_size_mb.saturating_mul(MIB)),
        (libc::RLIMIT_NOFILE, c.max_open_files),
    ] {
        if val > 0 {
            v.push((res, val));
        }
    }
    v
}

#[cfg(test)]
mod tests;
