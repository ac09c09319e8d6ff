//! Link-time layout of the daemon binary: how much of it an idle daemon keeps in memory
//! (BENCHMARKS.md, figure 2). Two linker options, both for the `hub-sidecar` binary only:
//!
//! - `--symbol-ordering-file=scripts/link-order.txt` (release builds): the functions the
//!   daemon runs at start-up, idle and on a task (`scripts/link-order.sh` profiles them) are
//!   placed together at the start of `.text`. The kernel maps code in fault-around windows,
//!   so a few hundred functions scattered over 7 MB of code kept ~4.5 MB of it resident.
//! - `-z pack-relative-relocs` (RELR): the 440 KB table of relative relocations the dynamic
//!   loader reads at every start becomes ~5 KB. The binary then needs glibc ≥ 2.36 (Debian
//!   12, Ubuntu 22.10, RHEL 10), so it is used only when the building machine has one.
//!
//! Both need LLD, the default linker of Rust ≥ 1.90 on x86_64 Linux. `HUB_SIDECAR_LINK_TUNING=off`
//! turns both off (another linker, or a binary for an older glibc). Neither changes behaviour.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=scripts/link-order.txt");
    println!("cargo:rerun-if-env-changed=HUB_SIDECAR_LINK_TUNING");
    if std::env::var("HUB_SIDECAR_LINK_TUNING").as_deref() == Ok("off") {
        return;
    }
    if std::env::var("TARGET").as_deref() != Ok("x86_64-unknown-linux-gnu")
        || !rustc_links_with_lld()
    {
        return;
    }
    if glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    if std::env::var("PROFILE").as_deref() == Ok("release") {
        let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR") else {
            return;
        };
        let order = std::path::Path::new(&dir).join("scripts/link-order.txt");
        if order.is_file() {
            println!(
                "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
                order.display()
            );
            // Names the file has and this build lacks are expected after any change (the file
            // is a profile, see scripts/link-order.sh); they are skipped either way.
            println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
        }
    }
}

/// Rust 1.90 made LLD the default linker for x86_64-unknown-linux-gnu.
fn rustc_links_with_lld() -> bool {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = Command::new(rustc).arg("-V").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    second_word_version(&out.stdout) >= (1, 90)
}

/// The building machine's glibc (`getconf GNU_LIBC_VERSION` prints "glibc 2.36").
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    second_word_version(&out.stdout) >= (major, minor)
}

/// Major and minor of the version that is a command's second word ("rustc 1.95.0 (…)",
/// "glibc 2.36"); (0, 0) when there is none.
fn second_word_version(output: &[u8]) -> (u32, u32) {
    let text = String::from_utf8_lossy(output);
    let mut parts = text
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}
