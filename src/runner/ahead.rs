//! The next task's directories and sandbox, made while the daemon is idle ([`AheadPool`]),
//! so that a task without a repository starts with nothing left to build on its way.
//!
//! What a task in a directory of its own (`workspace::Shape::Temp`) needs before its first
//! child runs does not depend on the task: its workspace and TMPDIR (empty directories), its
//! HOME and agent configuration (seeded from the operator's files), its Landlock ruleset,
//! its view of the host's trees with its IPC and network namespaces, and the proxy serving
//! its listener. Built at assignment this was ~1 ms of the task's round trip
//! (BENCHMARKS.md, issue 45); built after the previous task, it is handed over at
//! assignment whole.
//!
//! The directories are named before the task is known: `ahead.<run>.<n>` (a `.` that no
//! task id's safe name has, see `workspace::dirs_name`; `<run>` new for every start of the
//! daemon). The name is recorded with the task in the state file, so a restarted daemon
//! keeps the task's directories and finds them again; the start-up sweep spares this run's
//! own names and removes an earlier run's.
//!
//! Never shared: one is made at a time, taking it removes it ([`AheadPool::take`]), and
//! it serves one task. Never stale in what confines: at handover ([`Ahead::hand_over`]) it
//! must have been made under the policy in force, within [`MAX_AGE`], and with the same
//! trees at `/` as its view hides (a tree made since is not hidden in it); the agent's
//! configuration is copied again when the operator's changed since (a new login). Otherwise
//! the task's sandbox is built on the spot over the same directories, as without it. An
//! idle daemon makes it anew every [`RENEW_EVERY`], and a stopping one removes it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::process::ChildEnv;
use crate::sandbox::Policy;
use crate::task::Task;
use crate::workspace::{self, Workspace};

use super::prepare::{task_grants, Handed};

/// Oldest a sandbox made ahead may be when its task comes: a granted tree replaced since
/// (a toolchain reinstalled) keeps the old one's rule, so one made long ago is rebuilt.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(600);

/// How often an idle daemon makes the next task's directories and sandbox anew
/// ([`AheadPool::renew`]): well within [`MAX_AGE`], so a task after a long idle time still
/// finds one that may serve it.
pub const RENEW_EVERY: Duration = Duration::from_secs(240);

/// The prefix of what this pool names, `ahead.<run>.`: spared by this run's start-up sweep.
fn run_prefix() -> String {
    // New for every start: the sweep of a later start removes this run's leftovers.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("ahead.{:x}{:x}.", nanos, std::process::id())
}

/// At most one task's directories and sandbox made ahead; see the module docs.
#[derive(Debug)]
pub struct AheadPool {
    prefix: String,
    next: AtomicU64,
    ready: Mutex<Option<Ahead>>,
    /// A refill is under way (one at a time).
    filling: AtomicBool,
    /// The daemon is stopping: nothing more is kept ([`AheadPool::close`]).
    closed: AtomicBool,
}

impl Default for AheadPool {
    fn default() -> Self {
        AheadPool {
            prefix: run_prefix(),
            next: AtomicU64::new(0),
            ready: Mutex::new(None),
            filling: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }
}

impl AheadPool {
    /// What this pool's names start with (the start-up sweep spares them).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Make the next task's directories and sandbox if none is ready, for a daemon whose
    /// tasks without a repository get a directory of their own (no `repo_dir`). Blocking
    /// (file system, forks): off the runtime, while the daemon is idle. A failure is logged
    /// and leaves the pool empty: the next task builds its own.
    pub fn refill(&self, cfg: &Arc<Config>, policy: &Arc<Policy>, env: &ChildEnv) {
        if cfg.repo_dir.is_some() || self.filling.swap(true, Ordering::AcqRel) {
            return;
        }
        // One made under an earlier containment decision (a re-probe) would not serve.
        let stale = self
            .ready
            .lock()
            .ok()
            .and_then(|mut r| r.take_if(|a| !Arc::ptr_eq(&a.policy, policy)));
        if let Some(stale) = stale {
            stale.discard();
        }
        if self.ready.lock().is_ok_and(|r| r.is_none()) {
            let name = format!(
                "{}{}",
                self.prefix,
                self.next.fetch_add(1, Ordering::Relaxed)
            );
            match Ahead::make(cfg, policy, env, name) {
                Ok(ahead) => match self.ready.lock() {
                    Ok(mut r) if !self.closed.load(Ordering::Acquire) => {
                        tracing::debug!(name = %ahead.name, "the next task's directories and sandbox are ready");
                        *r = Some(ahead);
                    }
                    _ => ahead.discard(),
                },
                Err(e) => {
                    tracing::debug!(error = %e, "cannot make the next task's sandbox ahead; it makes its own")
                }
            }
        }
        self.filling.store(false, Ordering::Release);
    }

    /// Close what is ready and make it anew (see [`RENEW_EVERY`]). Blocking.
    pub fn renew(&self, cfg: &Arc<Config>, policy: &Arc<Policy>, env: &ChildEnv) {
        if let Some(old) = self.take() {
            old.discard();
        }
        self.refill(cfg, policy, env);
    }

    /// The daemon is stopping: what is ready, and what a refill under way makes, is closed
    /// and its directories removed. Blocking.
    pub fn close(&self) {
        let ready = match self.ready.lock() {
            Ok(mut r) => {
                // Under the lock a refill stores under: it sees `closed` and discards.
                self.closed.store(true, Ordering::Release);
                r.take()
            }
            Err(_) => None,
        };
        if let Some(ahead) = ready {
            ahead.discard();
        }
    }

    /// The sandbox made ahead, removed from the pool: it serves one task. Cheap (no file
    /// system): the checks are [`Ahead::hand_over`]'s, on the task's way off the runtime.
    pub fn take(&self) -> Option<Ahead> {
        self.ready.lock().ok()?.take()
    }
}

/// A task's private directories (its TMPDIR and, without a repository, its workspace): their
/// name, and the directories with their sandbox when they were made ahead of the task.
#[derive(Debug)]
pub struct TaskDirs {
    /// `tmp/<name>`, `work/<name>` (see [`workspace::dirs_name`]).
    pub name: String,
    /// Made ahead ([`AheadPool`]), named `name`.
    pub ahead: Option<Ahead>,
}

impl TaskDirs {
    /// Named as recorded with the task (a restarted daemon), else after its id.
    pub fn of(task: &Task, recorded: Option<&str>) -> TaskDirs {
        TaskDirs {
            name: workspace::dirs_name(task, recorded),
            ahead: None,
        }
    }

    /// The directories and sandbox made ahead.
    pub fn made_ahead(ahead: Ahead) -> TaskDirs {
        TaskDirs {
            name: ahead.name.clone(),
            ahead: Some(ahead),
        }
    }
}

/// One trip to the blocking pool at a task's start: the agent login as it is now (see
/// [`super::run_task`]) and, for a task whose directories and sandbox were made ahead of it, their
/// handover ([`Ahead::hand_over`]: checks, and the agent's configuration copied again if it
/// changed).
pub(super) async fn handover(
    deps: &super::RunnerDeps,
    ahead: Option<Ahead>,
) -> (Vec<crate::redact::known::Credential>, Option<Handed>) {
    let (env, policy) = (deps.env.clone(), deps.containment.clone());
    tokio::task::spawn_blocking(move || {
        let login = env.agent_login();
        let handed = ahead.map(|a| a.hand_over(&policy, env.fence()));
        (login, handed)
    })
    .await
    .unwrap_or_default()
}

/// One task's directories and sandbox, made ahead of it.
#[derive(Debug)]
pub struct Ahead {
    /// The directories' name (`tmp/<name>`, `work/<name>`).
    pub name: String,
    workspace: Workspace,
    /// Its TMPDIR (`tmp/<name>`).
    tmp: PathBuf,
    /// The children's environment, confined (no fence yet: the task's is added at handover).
    env: ChildEnv,
    /// The policy it was made under.
    policy: Arc<Policy>,
    /// The directories at `/` when it was made (its view hides those that are not the
    /// system's).
    trees: Vec<OsString>,
    made: Instant,
}

impl Ahead {
    /// The directories and the sandbox over them, as `runner::prepare` makes them for a
    /// task in a directory of its own. Blocking.
    fn make(
        cfg: &Arc<Config>,
        policy: &Arc<Policy>,
        env: &ChildEnv,
        name: String,
    ) -> anyhow::Result<Ahead> {
        // Listed before the view is made: a tree made after is seen at handover.
        let trees = crate::sandbox::host_trees();
        let workspace =
            workspace::prepare_temp_blocking(&workspace::task_dirs_root(cfg).join(&name))?;
        let tmp = workspace::task_tmp_dir(cfg, &name);
        let grants = task_grants(None, &workspace);
        match crate::process::confine(cfg, policy, env, &tmp, &grants) {
            Ok(env) => {
                // Its view's holder has answered: reaped now, not a zombie while idle.
                if let Some(sandbox) = env.sandbox() {
                    sandbox.reap_view_holder();
                }
                Ok(Ahead {
                    name,
                    workspace,
                    tmp,
                    env,
                    policy: policy.clone(),
                    trees,
                    made: Instant::now(),
                })
            }
            Err(e) => {
                remove_dirs(&tmp, &workspace);
                Err(e.into())
            }
        }
    }

    /// The workspace and the children's environment for a task run under `policy`, whose
    /// children obey `fence`; only the directories (its sandbox closed: the task builds its
    /// own over them) when it may not serve: made under another policy, too old, or `/` has
    /// other trees than its view hides. Blocking.
    pub(super) fn hand_over(
        self,
        policy: &Arc<Policy>,
        fence: Option<&crate::process::Fence>,
    ) -> Handed {
        if !self.fits(policy) {
            return Err(self.workspace);
        }
        let env = match fence {
            Some(f) => self.env.with_fence(f.clone()),
            None => self.env,
        };
        Ok((self.workspace, env))
    }

    /// Close the sandbox and remove the directories: never used. Blocking.
    fn discard(self) {
        drop(self.env);
        remove_dirs(&self.tmp, &self.workspace);
    }

    /// See [`Ahead::hand_over`]; the agent's configuration is copied again when the
    /// operator's changed (the task's redactor knows the login read now, not the one of
    /// when this was made).
    fn fits(&self, policy: &Arc<Policy>) -> bool {
        Arc::ptr_eq(&self.policy, policy)
            && self.made.elapsed() < MAX_AGE
            && crate::sandbox::host_trees() == self.trees
            && self
                .env
                .sandbox()
                .is_none_or(|s| s.refresh_agent_config().is_ok())
    }
}

/// Remove the TMPDIR and workspace made ahead, never used by a task. Blocking.
fn remove_dirs(tmp: &std::path::Path, workspace: &Workspace) {
    for dir in [tmp, &workspace.path] {
        let _ = crate::sandbox::beneath::remove_tree(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new containment decision (containment off: no kernel feature needed).
    fn decided() -> Arc<Policy> {
        Arc::new(Policy::decide(
            Some(crate::config::Containment::Off),
            crate::sandbox::Support::none(),
        ))
    }

    fn made(dir: &std::path::Path) -> (Arc<Config>, Arc<Policy>, ChildEnv, AheadPool) {
        let cfg = Arc::new(crate::config::Config::for_hub("ws://127.0.0.1:1/ws", dir));
        let mut env = ChildEnv::default();
        env.set("PATH", "/usr/bin:/bin");
        (cfg, decided(), env, AheadPool::default())
    }

    /// The names under `work/` now.
    fn work_names(dir: &std::path::Path) -> Vec<String> {
        std::fs::read_dir(dir.join("work"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// One made at a time, taken once, under this run's prefix; another policy refuses it.
    #[test]
    fn made_once_taken_once_and_only_under_its_policy() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, policy, env, pool) = made(dir.path());
        pool.refill(&cfg, &policy, &env);
        pool.refill(&cfg, &policy, &env);
        let names = work_names(dir.path());
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].starts_with(pool.prefix()) && names[0].contains('.'));
        let ahead = pool.take().expect("made");
        assert!(pool.take().is_none(), "taken once");
        // (Containment off: no TMPDIR is made; the daemon's tests make the whole sandbox.)
        assert!(dir.path().join("work").join(&ahead.name).is_dir());
        let other = decided();
        let ws = ahead.hand_over(&other, None).expect_err("another policy");
        assert!(ws.path.ends_with(format!("work/{}", names[0])));
        // A refill under another policy replaces one made under the old: after a re-probe.
        pool.refill(&cfg, &other, &env);
        pool.refill(&cfg, &policy, &env);
        assert!(!dir
            .path()
            .join("work")
            .join(format!("{}1", pool.prefix()))
            .exists());
        let (ws, _) = pool
            .take()
            .unwrap()
            .hand_over(&policy, None)
            .expect("its policy");
        assert!(ws.path.ends_with(format!("work/{}2", pool.prefix())));
    }

    /// A stopping daemon leaves nothing made ahead: what is ready is removed, and a refill
    /// after the close keeps nothing.
    #[test]
    fn a_closed_pool_removes_what_it_made_and_keeps_nothing_more() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, policy, env, pool) = made(dir.path());
        pool.refill(&cfg, &policy, &env);
        let work = dir.path().join("work");
        assert_eq!(std::fs::read_dir(&work).unwrap().count(), 1);
        pool.close();
        assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
        pool.refill(&cfg, &policy, &env);
        assert!(pool.take().is_none());
        assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
    }

    /// Made anew: another name, the old one's directories gone.
    #[test]
    fn a_renewal_replaces_what_was_made() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, policy, env, pool) = made(dir.path());
        pool.refill(&cfg, &policy, &env);
        pool.renew(&cfg, &policy, &env);
        let names = work_names(dir.path());
        assert_eq!(names, [format!("{}1", pool.prefix())]);
        assert_eq!(pool.take().unwrap().name, names[0]);
    }

    /// A daemon with a `repo_dir` runs tasks there: nothing is made ahead.
    #[test]
    fn nothing_is_made_for_a_repo_dir() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, policy, env, pool) = made(dir.path());
        let mut c = (*cfg).clone();
        c.repo_dir = Some(dir.path().join("repo"));
        pool.refill(&Arc::new(c), &policy, &env);
        assert!(pool.take().is_none());
        assert!(!dir.path().join("work").exists());
    }
}
