//! The task's fence: whether the task may do any work now, and the stopping of every
//! process of a task while it may not.
//!
//! The daemon closes a task's fence the moment its link to the hub drops: the hub reclaims
//! a task on any disconnect and may already have given it to another agent (PROTOCOL.md §8),
//! so from then on the task must do nothing that other agent might also do. Closed, the
//! fence
//! - stops (SIGSTOP) every process the task runs: [`run_with`](super::run_with) watches it
//!   for each child it spawned and stops the child's process group and every descendant
//!   that left the group (a `setsid` in the task's command), walking `/proc` until no new
//!   one turns up; a stopped process cannot fork, so the walk ends;
//! - holds back every new process of the task (checks, git, `gh pr create`): a spawn waits
//!   until the fence opens or the task is cancelled; so nothing is committed, pushed or
//!   proposed while the link is down;
//! - stops the task's clocks: [`Fence::sleep`] counts only time spent open, so a timeout
//!   or a time budget is not spent while paused.
//!
//! Opened (the hub said the task is still ours), the processes are continued (SIGCONT) and
//! the clocks run again. A task that is not ours any more is cancelled while fenced: its
//! processes are killed outright (SIGKILL), never continued first, so not one more
//! instruction of it runs.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One task's fence: open (the task may work) or closed (paused). Cheap to clone; every
/// clone is the same fence.
#[derive(Clone, Debug)]
pub struct Fence(Arc<watch::Sender<bool>>);

impl Default for Fence {
    fn default() -> Self {
        Fence::new()
    }
}

impl Fence {
    /// An open fence.
    pub fn new() -> Fence {
        Fence(Arc::new(watch::channel(false).0))
    }

    /// Close the fence: the task's processes are stopped, its clocks paused. `true` when
    /// it was open.
    pub fn pause(&self) -> bool {
        self.0.send_if_modified(|p| !std::mem::replace(p, true))
    }

    /// Open the fence again: the task's processes continue. `true` when it was closed.
    pub fn resume(&self) -> bool {
        self.0.send_if_modified(|p| std::mem::replace(p, false))
    }

    /// Closed now.
    pub fn is_paused(&self) -> bool {
        *self.0.borrow()
    }

    /// Every change from now on (`true`: closed).
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }

    /// Wait until the fence is open; `false` when `cancel` came first.
    pub async fn open(&self, cancel: &CancellationToken) -> bool {
        let mut rx = self.watch();
        tokio::select! {
            r = rx.wait_for(|paused| !paused) => r.is_ok(),
            _ = cancel.cancelled() => false,
        }
    }

    /// Sleep for `d` of time with the fence open: the clock of a timeout or a time budget
    /// that a pause must not spend.
    pub async fn sleep(&self, d: Duration) {
        let mut rx = self.watch();
        let mut left = d;
        loop {
            if *rx.borrow_and_update() {
                if rx.wait_for(|paused| !paused).await.is_err() {
                    // The fence is gone with its task: nothing pauses this clock any more.
                    tokio::time::sleep(left).await;
                    return;
                }
                continue;
            }
            let from = Instant::now();
            tokio::select! {
                _ = tokio::time::sleep(left) => return,
                r = rx.changed() => {
                    left = left.saturating_sub(from.elapsed());
                    if r.is_err() {
                        tokio::time::sleep(left).await;
                        return;
                    }
                }
            }
        }
    }
}

/// Sleep for `d` of unpaused time when there is a fence, plain `d` otherwise.
pub async fn sleep(fence: Option<&Fence>, d: Duration) {
    match fence {
        Some(f) => f.sleep(d).await,
        None => tokio::time::sleep(d).await,
    }
}

/// Send `sig` to the process group `pgid` and to every descendant of its leader `pgid`
/// that left the group, repeating the walk until it finds no process not signalled yet.
/// Off the runtime: it reads `/proc`.
pub async fn signal_tree(pgid: u32, sig: libc::c_int) {
    if pgid == 0 {
        return;
    }
    super::signal_group(pgid, sig);
    let _ = tokio::task::spawn_blocking(move || {
        let mut done: Vec<i32> = Vec::new();
        // Bounded: a tree that keeps forking faster than the walk (only possible for a
        // signal that does not stop it) is covered by its group and PID namespace anyway.
        for _ in 0..8 {
            let fresh: Vec<i32> = descendants(pgid as i32)
                .into_iter()
                .filter(|p| !done.contains(p))
                .collect();
            if fresh.is_empty() {
                break;
            }
            for pid in fresh {
                // SAFETY: kill has no memory-safety preconditions; a stale pid is ESRCH.
                #[allow(unsafe_code)]
                unsafe {
                    libc::kill(pid, sig);
                }
                done.push(pid);
            }
        }
    })
    .await;
}

/// Every live descendant of `root` (not `root` itself), from each process's parent in
/// `/proc/PID/stat`.
fn descendants(root: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(i32, i32)> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, ppid)| *ppid == p)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// The parent of `pid`, from `/proc/PID/stat` (`pid (comm) state ppid …`; comm may hold
/// spaces and parentheses, so it is read after the last `)`).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_clock_counts_only_time_with_the_fence_open() {
        let fence = Fence::new();
        let started = Instant::now();
        let clock = tokio::spawn({
            let fence = fence.clone();
            async move { fence.sleep(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_secs(4)).await;
        fence.pause();
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!clock.is_finished(), "the clock ran while paused");
        fence.resume();
        clock.await.unwrap();
        // 4 s before the pause, 100 s paused, the 6 s left after it.
        assert_eq!(started.elapsed(), Duration::from_secs(110));
    }

    #[tokio::test(start_paused = true)]
    async fn open_waits_for_the_fence_or_the_cancel() {
        let fence = Fence::new();
        let cancel = CancellationToken::new();
        assert!(fence.open(&cancel).await);
        assert!(fence.pause());
        assert!(!fence.pause(), "closing a closed fence changes nothing");
        let waiter = tokio::spawn({
            let (fence, cancel) = (fence.clone(), cancel.clone());
            async move { fence.open(&cancel).await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiter.is_finished());
        fence.resume();
        assert!(waiter.await.unwrap());
        fence.pause();
        let waiter = tokio::spawn({
            let (fence, cancel) = (fence.clone(), cancel.clone());
            async move { fence.open(&cancel).await }
        });
        cancel.cancel();
        assert!(!waiter.await.unwrap());
    }

    /// Processes whose command line holds `token`, with their state letter and parent.
    fn procs_holding(token: &str) -> Vec<(i32, char, i32)> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(token))
            })
            .filter_map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
                let state = rest.next()?.chars().next()?;
                Some((pid, state, rest.next()?.parse().ok()?))
            })
            .filter(|(_, s, _)| *s != 'Z')
            .collect()
    }

    /// Every process holding `token` is stopped: in state `T`, or waiting in `vfork` for a
    /// child that is (`D`, as `dash` is when stopped between its `vfork` and the child's
    /// `exec`: it cannot run until that child does).
    fn all_stopped(token: &str) -> bool {
        let p = procs_holding(token);
        !p.is_empty()
            && p.iter().all(|&(pid, s, _)| {
                s == 'T' || (s == 'D' && p.iter().any(|&(_, cs, pp)| pp == pid && cs == 'T'))
            })
    }

    async fn until(mut cond: impl FnMut() -> bool) {
        // Polled: the process table has no event to wait on. Generous: a loaded CI box.
        for _ in 0..1500 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("condition never held");
    }

    #[tokio::test]
    async fn a_closed_fence_starts_no_process_stops_a_running_one_and_a_cancel_kills_it() {
        use crate::process::{run, ChildEnv, CommandSpec, Exit, Limits};
        let dir = tempfile::tempdir().unwrap();
        let token = format!("fence-{}", fastrand::u64(..));
        let fence = Fence::new();
        let env = ChildEnv::inherit().with_fence(fence.clone());
        let script = format!("while :; do echo {token} >> ticks; sleep 0.05; done");
        let spec = CommandSpec::shell(&script, dir.path(), env);
        let limits = Limits {
            timeout: Some(Duration::from_secs(60)),
            ..Limits::default()
        };
        let cancel = CancellationToken::new();
        fence.pause();
        let mut running = Box::pin(run(&spec, &limits, &cancel, None));
        // Polled once: without the gate the child would exist now (spawn returns after
        // exec); with the fence closed nothing was started.
        tokio::select! {
            biased;
            _ = &mut running => panic!("ran to an end with the fence closed"),
            _ = std::future::ready(()) => {}
        }
        assert!(
            procs_holding(&token).is_empty(),
            "started behind a closed fence"
        );
        fence.resume();
        let ticks = dir.path().join("ticks");
        let out = async {
            // Let it start and tick, stop it, see it stopped, let it go on, stop it again.
            let started = tokio::select! {
                out = &mut running => panic!("ended early: {out:?}"),
                _ = until(|| ticks.exists()) => true,
            };
            assert!(started);
            fence.pause();
            tokio::select! {
                out = &mut running => panic!("ended while paused: {out:?}"),
                _ = until(|| all_stopped(&token)) => {}
            }
            fence.resume();
            tokio::select! {
                out = &mut running => panic!("ended after resuming: {out:?}"),
                _ = until(|| !procs_holding(&token).is_empty() && !all_stopped(&token)) => {}
            }
            fence.pause();
            tokio::select! {
                out = &mut running => panic!("ended while paused: {out:?}"),
                _ = until(|| all_stopped(&token)) => {}
            }
            // Not ours any more: killed where it stands.
            cancel.cancel();
            running.await.unwrap()
        }
        .await;
        assert_eq!(out.exit, Exit::Cancelled);
        until(|| procs_holding(&token).is_empty()).await;
    }

    #[test]
    fn the_parent_is_read_past_a_command_name_with_spaces_and_parentheses() {
        // This test's own process: its parent is the test harness's parent.
        let me = std::process::id() as i32;
        // SAFETY: getppid has no preconditions.
        #[allow(unsafe_code)]
        let parent = unsafe { libc::getppid() };
        assert_eq!(parent_of(me), Some(parent));
    }
}
