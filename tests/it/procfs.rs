//! The process table as the tests read it: one parser for `/proc/<pid>/{stat,status,cmdline}`
//! and the scans built on it (processes by argument, children, zombies, memory, open fds).
//!
//! `stat` is parsed after the *last* `)`: the command name in between may itself contain
//! spaces and parentheses, so splitting the whole line on whitespace reads the wrong field
//! for a process named `a b` or `x) Z`.

#![allow(dead_code)]

/// The fields of `/proc/<pid>/stat` the tests look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stat {
    pub pid: i32,
    /// The command name (`comm`), without its parentheses.
    pub comm: String,
    /// `R`, `S`, `D`, `Z`, `T`, …
    pub state: char,
    pub ppid: i32,
}

impl Stat {
    pub(crate) fn is_zombie(&self) -> bool {
        self.state == 'Z'
    }
}

/// Parse one `/proc/<pid>/stat` line; `None` when it is not one.
pub(crate) fn parse_stat(line: &str) -> Option<Stat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = line[..open].trim().parse().ok()?;
    let comm = line.get(open + 1..close)?.to_string();
    let mut rest = line[close + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(Stat {
        pid,
        comm,
        state,
        ppid,
    })
}

/// `pid`'s stat; `None` once it is gone (or was never there).
pub(crate) fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `pid`'s arguments; `None` once it is gone.
pub(crate) fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// One `Key:` value of `/proc/<pid>/status`, as its first word (`VmRSS:  1234 kB` → `1234`).
pub(crate) fn status_field(pid: i32, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .map(str::to_string)
}

/// Every pid in the table now.
pub(crate) fn pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect()
}

/// `pid` exists and is not a zombie.
pub(crate) fn is_live(pid: i32) -> bool {
    stat(pid).is_some_and(|s| !s.is_zombie())
}

/// Live (non-zombie) processes whose argv contains `needle` as one argument.
pub(crate) fn procs_with_arg(needle: &str) -> Vec<i32> {
    pids()
        .into_iter()
        .filter(|&pid| cmdline(pid).is_some_and(|args| args.iter().any(|a| a == needle)))
        .filter(|&pid| is_live(pid))
        .collect()
}

/// Live processes whose space-joined command line contains `needle`, as `pid: cmdline`
/// (for failure messages).
pub(crate) fn procs_with(needle: &str) -> Vec<String> {
    pids()
        .into_iter()
        .filter_map(|pid| Some((pid, cmdline(pid)?.join(" "))))
        .filter(|(pid, cmd)| cmd.contains(needle) && is_live(*pid))
        .map(|(pid, cmd)| format!("{pid}: {cmd}"))
        .collect()
}

/// The direct children of `pid`, zombies included.
pub(crate) fn children(pid: i32) -> Vec<Stat> {
    pids()
        .into_iter()
        .filter_map(stat)
        .filter(|s| s.ppid == pid)
        .collect()
}

/// Zombie children of `pid`: exited, never reaped.
pub(crate) fn zombie_children(pid: i32) -> Vec<i32> {
    children(pid)
        .into_iter()
        .filter(Stat::is_zombie)
        .map(|s| s.pid)
        .collect()
}

/// `VmRSS` of `pid` in KiB (0 when unknown).
pub(crate) fn rss_kb(pid: i32) -> u64 {
    status_field(pid, "VmRSS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Open file descriptors of `pid` (0 when unknown).
pub(crate) fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_read_after_the_last_parenthesis() {
        let s = parse_stat("42 (a b) Z) S 7 42 42 0 -1").unwrap();
        assert_eq!(s.pid, 42);
        assert_eq!(s.comm, "a b) Z");
        assert_eq!(s.state, 'S');
        assert_eq!(s.ppid, 7);
        assert!(!s.is_zombie());
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x)").is_none());
    }

    #[test]
    fn this_process_is_in_the_table_with_its_parent_and_arguments() {
        let me = std::process::id() as i32;
        let s = stat(me).expect("own stat");
        assert_eq!(s.pid, me);
        assert!(is_live(me));
        assert!(!cmdline(me).unwrap().is_empty());
        assert!(rss_kb(me) > 0);
        assert!(fd_count(me) > 0);
        assert!(pids().contains(&me));
        assert!(pids().contains(&s.ppid) || s.ppid == 0);
    }

    #[tokio::test]
    async fn a_child_is_found_by_argument_and_an_unreaped_one_is_a_zombie() {
        let arg = crate::util::unique_sleep();
        let mut child = std::process::Command::new("sleep")
            .arg(&arg)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let me = std::process::id() as i32;
        // Until the child has exec'd `sleep`, its cmdline is still this test binary's.
        assert!(
            crate::util::wait_until(|| procs_with_arg(&arg) == vec![pid], crate::util::T).await,
            "{:?}",
            procs_with_arg(&arg)
        );
        assert!(procs_with(&format!("sleep {arg}"))[0].starts_with(&format!("{pid}: ")));
        assert!(children(me).iter().any(|c| c.pid == pid));
        child.kill().unwrap();
        // Killed but not yet waited for: a zombie child, no longer "live".
        assert!(
            crate::util::wait_until(|| zombie_children(me).contains(&pid), crate::util::T).await
        );
        assert!(procs_with_arg(&arg).is_empty());
        child.wait().unwrap();
        assert!(stat(pid).is_none());
    }
}
