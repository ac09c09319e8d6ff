//! The daemon's own hardening at start, apart from what confines its tasks: not dumpable,
//! and no powerless root.

/// Make the daemon non-dumpable: no core file with the token in it, and its memory,
/// `/proc/<pid>/environ` and `/proc/<pid>/mem` closed to other processes of the same user.
pub fn protect_daemon() {
    // SAFETY: PR_SET_DUMPABLE takes plain integers and has no memory effects.
    #[allow(unsafe_code)]
    let r = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if r != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot make the daemon non-dumpable");
    }
}

/// Refuse a root that holds none of root's powers: the shipped unit run with `User=root`
/// (its `CapabilityBoundingSet=` is empty). Such a root cannot read the service user's
/// config (0600) nor set up its tasks' namespaces, and every step would fail with a
/// different, misleading error; one clear refusal at start says what to do instead.
/// Root with its capabilities (a developer's shell, CI) and any other user pass.
pub fn refuse_powerless_root() -> Result<(), PowerlessRoot> {
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
    const CAP_DAC_OVERRIDE: u64 = 1 << 1;
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    match effective {
        Some(caps) if caps & (CAP_DAC_OVERRIDE | CAP_SYS_ADMIN) == 0 => Err(PowerlessRoot),
        _ => Ok(()),
    }
}

/// The daemon runs as root without root's powers; see [`refuse_powerless_root`].
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to run as root without root's capabilities (an empty CapabilityBoundingSet=, as in the shipped unit): \
     such a root can neither read the service user's config nor confine tasks. Run the unit as its service user \
     (User=hub-sidecar, as shipped: remove the User=/Group= override), or run as root with its capabilities"
)]
pub struct PowerlessRoot;
