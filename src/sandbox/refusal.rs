//! Why the kernel refused a confinement call, told apart: a seccomp filter or an LSM
//! between the daemon and a kernel that has the feature (a container's default filter —
//! systemd-nspawn's, Docker's — refuses `landlock_*` and namespace calls), or a kernel
//! without it; and what to allow in each case.
//!
//! The facts are read once, at the probe ([`Facts::read`]); the verdicts
//! ([`landlock`], [`namespaces`]) are pure functions of the failed call's errno and the
//! facts, so they are tested on any machine.

use std::io;

/// What the system calls to allow are, and where: said by every seccomp verdict.
const ALLOW_LANDLOCK: &str = "allow landlock_create_ruleset, landlock_add_rule and landlock_restrict_self: \
     systemd-nspawn --system-call-filter='landlock_create_ruleset landlock_add_rule landlock_restrict_self'; \
     Docker or Podman: a seccomp profile that allows them (--security-opt seccomp=PROFILE.json); \
     a systemd unit: keep them in its SystemCallFilter= (the shipped unit lists them). \
     See docs/install.md, \"Containers\"";

const ALLOW_NAMESPACES: &str = "allow unshare and clone with namespace flags, setns, mount, open_tree and move_mount: \
     systemd-nspawn --system-call-filter='@mount unshare setns' (and a user namespace for the container, --private-users); \
     Docker or Podman: a seccomp profile that allows them (--security-opt seccomp=PROFILE.json) and no AppArmor profile that denies mount; \
     a systemd unit: RestrictNamespaces=user pid net mnt and SystemCallFilter= with mount open_tree move_mount (as the shipped unit has). \
     See docs/install.md, \"Containers\"";

/// What the probe reads of the machine, to tell who refused a call.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The kernel release (`/proc/sys/kernel/osrelease`), e.g. `6.8.0-45-generic`.
    pub kernel: Option<String>,
    /// Seccomp filters on this process (`Seccomp: 2` in `/proc/self/status`, with
    /// `Seccomp_filters:`); 0 when none, `None` when unreadable.
    pub seccomp_filters: Option<u32>,
    /// The active LSMs (`/sys/kernel/security/lsm`); `None` where securityfs is not
    /// mounted (most containers).
    pub lsm: Option<String>,
    /// `user.max_user_namespaces`.
    pub max_user_namespaces: Option<u64>,
    /// `kernel.unprivileged_userns_clone` (Debian's older kernels).
    pub unprivileged_userns_clone: Option<u64>,
    /// `kernel.apparmor_restrict_unprivileged_userns` (Ubuntu ≥ 23.10).
    pub apparmor_restrict_userns: Option<u64>,
    /// This process runs as root.
    pub root: bool,
}

impl Facts {
    /// Read them from `/proc` and `/sys` (small pseudo-files: a blocking caller, as the
    /// probe is).
    pub fn read() -> Facts {
        let text = |p: &str| std::fs::read_to_string(p).ok();
        let number = |p: &str| text(p).and_then(|t| t.trim().parse().ok());
        let status = text("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u32>().ok())
        };
        let seccomp_filters = match field("Seccomp:") {
            Some(2) => Some(field("Seccomp_filters:").unwrap_or(1).max(1)),
            Some(_) => Some(0),
            None => None,
        };
        // SAFETY: geteuid has no preconditions and cannot fail.
        #[allow(unsafe_code)]
        let root = unsafe { libc::geteuid() } == 0;
        Facts {
            kernel: text("/proc/sys/kernel/osrelease").map(|t| t.trim().to_string()),
            seccomp_filters,
            lsm: text("/sys/kernel/security/lsm").map(|t| t.trim().to_string()),
            max_user_namespaces: number("/proc/sys/user/max_user_namespaces"),
            unprivileged_userns_clone: number("/proc/sys/kernel/unprivileged_userns_clone"),
            apparmor_restrict_userns: number(
                "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            ),
            root,
        }
    }

    /// The kernel's major and minor version.
    fn version(&self) -> Option<(u32, u32)> {
        let k = self.kernel.as_deref()?;
        let mut parts = k.split(|c: char| !c.is_ascii_digit());
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    }

    fn kernel_name(&self) -> String {
        self.kernel
            .as_deref()
            .map_or_else(|| "this kernel".to_string(), |k| format!("kernel {k}"))
    }

    fn lsm_has_landlock(&self) -> Option<bool> {
        self.lsm
            .as_deref()
            .map(|l| l.split(',').any(|m| m.trim() == "landlock"))
    }

    fn filters(&self) -> u32 {
        self.seccomp_filters.unwrap_or(0)
    }

    fn under_filter(&self) -> String {
        let n = self.filters();
        format!(
            "this process runs under {n} seccomp filter{} (Seccomp: 2 in /proc/self/status: a container's or a unit's)",
            if n == 1 { "" } else { "s" }
        )
    }
}

fn errno_name(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::ENOSYS) => "ENOSYS".into(),
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP".into(),
        Some(libc::EACCES) => "EACCES".into(),
        Some(libc::ENOSPC) => "ENOSPC".into(),
        Some(libc::EINVAL) => "EINVAL".into(),
        _ => err.to_string(),
    }
}

/// Why `landlock_create_ruleset` failed with `err`, and what to do: one line for
/// [`Support::missing`](super::Support::missing).
pub fn landlock(err: &io::Error, f: &Facts) -> String {
    let errno = err.raw_os_error();
    let name = errno_name(err);
    let kernel = f.kernel_name();
    let new_enough = f.version().map(|v| v >= (5, 13));
    let in_lsm = f.lsm_has_landlock();
    let call = format!("landlock_create_ruleset failed with {name}");
    if errno == Some(libc::EOPNOTSUPP) {
        return format!(
            "Landlock is built into {kernel} but not enabled ({call}): add `landlock` to the kernel's `lsm=` boot parameter"
        );
    }
    // EPERM is never the kernel's own answer to asking the version; a listed Landlock
    // that still fails is refused on the way.
    let refused = errno == Some(libc::EPERM) || in_lsm == Some(true);
    if refused {
        let why = if in_lsm == Some(true) {
            format!("{kernel} has Landlock enabled (`landlock` is in /sys/kernel/security/lsm)")
        } else {
            format!("{name} is never the kernel's own answer to this call")
        };
        return if f.filters() > 0 {
            format!(
                "Landlock is refused by a seccomp filter, not missing from the kernel: {call}, yet {why}, and {}; {ALLOW_LANDLOCK}",
                f.under_filter()
            )
        } else {
            format!(
                "Landlock is refused by the kernel's security policy (an LSM), not missing from the kernel: {call}, yet {why}, and no seccomp filter applies; see the kernel log (journalctl -k) or the audit log for the LSM's denial"
            )
        };
    }
    match (new_enough, in_lsm, f.filters() > 0) {
        (Some(false), _, _) => format!(
            "Landlock is unavailable: {kernel} is older than 5.13, the first with Landlock ({call}); upgrade the kernel"
        ),
        (_, Some(false), _) => format!(
            "Landlock is unavailable: {kernel} does not enable it (`landlock` is not in /sys/kernel/security/lsm; {call}): build with CONFIG_SECURITY_LANDLOCK=y and add `landlock` to the `lsm=` boot parameter"
        ),
        (Some(true), None, true) => format!(
            "Landlock is most likely refused by a seccomp filter: {call} on {kernel}, new enough for it, and {}; securityfs is not mounted here, so the kernel's LSM list cannot confirm Landlock is enabled. A container's default filter (systemd-nspawn's, Docker's) refuses it: {ALLOW_LANDLOCK}. If the filter allows them, the kernel was built without Landlock",
            f.under_filter()
        ),
        (Some(true), None, false) => format!(
            "Landlock is unavailable: {call} on {kernel} with no seccomp filter in the way, so the kernel was built without it (CONFIG_SECURITY_LANDLOCK=y and `landlock` in the `lsm=` boot parameter are needed)"
        ),
        _ => format!(
            "Landlock is unavailable ({call}): it needs Linux ≥ 5.13 with `landlock` in the kernel's `lsm=` list{}",
            if f.filters() > 0 {
                format!("; {}, which may refuse it: {ALLOW_LANDLOCK}", f.under_filter())
            } else {
                String::new()
            }
        ),
    }
}

/// Why the namespace probe failed with `err`, when the facts name who refused it; `None`
/// leaves the general advice.
pub fn namespaces(err: &io::Error, f: &Facts) -> Option<String> {
    let errno = err.raw_os_error()?;
    let name = errno_name(err);
    if errno == libc::ENOSPC || f.max_user_namespaces == Some(0) {
        return Some(format!(
            "user namespaces are limited by user.max_user_namespaces = {} ({name}): sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/ to keep it)",
            f.max_user_namespaces
                .map_or_else(|| "?".to_string(), |n| n.to_string())
        ));
    }
    if !matches!(errno, libc::EPERM | libc::EACCES | libc::ENOSYS) {
        return None;
    }
    if !f.root && f.unprivileged_userns_clone == Some(0) {
        return Some(format!(
            "unprivileged user namespaces are off (kernel.unprivileged_userns_clone = 0; {name}): sysctl -w kernel.unprivileged_userns_clone=1 (and in /etc/sysctl.d/ to keep it)"
        ));
    }
    if !f.root && f.apparmor_restrict_userns == Some(1) {
        return Some(format!(
            "AppArmor refuses unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1, as on Ubuntu ≥ 23.10; {name}): give /usr/bin/hub-sidecar an AppArmor profile with `userns,` (docs/install.md, \"Containers\"), or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
        ));
    }
    if f.filters() > 0 {
        return Some(format!(
            "the namespace calls are most likely refused by a seccomp filter ({name}; {}), not missing from {}: {ALLOW_NAMESPACES}",
            f.under_filter(),
            f.kernel_name()
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(e: i32) -> io::Error {
        io::Error::from_raw_os_error(e)
    }

    fn facts(kernel: &str, filters: u32, lsm: Option<&str>) -> Facts {
        Facts {
            kernel: Some(kernel.into()),
            seccomp_filters: Some(filters),
            lsm: lsm.map(str::to_string),
            ..Facts::default()
        }
    }

    #[test]
    fn a_filtered_landlock_on_a_new_kernel_is_named_a_filter_with_what_to_allow() {
        let lsm = Some("lockdown,capability,landlock,yama,apparmor");
        for errno in [libc::ENOSYS, libc::EPERM] {
            let why = landlock(&err(errno), &facts("6.8.0-45-generic", 1, lsm));
            assert!(
                why.starts_with("Landlock is refused by a seccomp filter, not missing"),
                "{why}"
            );
            for want in [
                "has Landlock enabled",
                "--system-call-filter='landlock_create_ruleset landlock_add_rule landlock_restrict_self'",
                "seccomp=PROFILE.json",
                "SystemCallFilter=",
            ] {
                assert!(why.contains(want), "{want}: {why}");
            }
            assert!(!why.contains("5.13"), "not an old kernel: {why}");
        }
        // No securityfs (a container): EPERM still proves it; ENOSYS says "most likely".
        let why = landlock(&err(libc::EPERM), &facts("6.8.0", 2, None));
        assert!(why.contains("never the kernel's own answer"), "{why}");
        assert!(why.contains("2 seccomp filters"), "{why}");
        let why = landlock(&err(libc::ENOSYS), &facts("6.8.0", 1, None));
        assert!(why.starts_with("Landlock is most likely refused by a seccomp filter"));
        // An LSM, with no filter.
        let why = landlock(&err(libc::EPERM), &facts("6.8.0", 0, lsm));
        assert!(why.contains("an LSM"), "{why}");
    }

    #[test]
    fn a_kernel_without_landlock_is_told_as_such() {
        let why = landlock(&err(libc::ENOSYS), &facts("5.10.0-30-amd64", 1, None));
        assert!(why.contains("older than 5.13"), "{why}");
        let why = landlock(&err(libc::EOPNOTSUPP), &facts("6.1.0", 0, None));
        assert!(why.contains("not enabled") && why.contains("lsm="), "{why}");
        let why = landlock(
            &err(libc::ENOSYS),
            &facts("6.1.0", 0, Some("capability,yama")),
        );
        assert!(why.contains("does not enable it"), "{why}");
        let why = landlock(&err(libc::ENOSYS), &facts("6.1.0", 0, None));
        assert!(why.contains("built without it"), "{why}");
        assert!(!why.contains("seccomp filter,"), "{why}");
    }

    #[test]
    fn a_refused_user_namespace_names_the_sysctl_the_lsm_or_the_filter() {
        let mut f = facts("6.8.0", 0, None);
        f.max_user_namespaces = Some(0);
        assert!(namespaces(&err(libc::ENOSPC), &f)
            .unwrap()
            .contains("user.max_user_namespaces = 0"));
        let mut f = facts("6.8.0", 0, None);
        f.apparmor_restrict_userns = Some(1);
        let why = namespaces(&err(libc::EPERM), &f).unwrap();
        assert!(
            why.contains("kernel.apparmor_restrict_unprivileged_userns = 1"),
            "{why}"
        );
        f.root = true;
        assert!(
            namespaces(&err(libc::EPERM), &f).is_none(),
            "root is exempt"
        );
        let mut f = facts("6.8.0", 0, None);
        f.unprivileged_userns_clone = Some(0);
        assert!(namespaces(&err(libc::EPERM), &f)
            .unwrap()
            .contains("unprivileged_userns_clone = 0"));
        let why = namespaces(&err(libc::EPERM), &facts("6.8.0", 1, None)).unwrap();
        assert!(
            why.contains("seccomp filter") && why.contains("--system-call-filter="),
            "{why}"
        );
        assert!(namespaces(&err(libc::EPERM), &facts("6.8.0", 0, None)).is_none());
    }
}
