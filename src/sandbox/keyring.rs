//! The kernel's key store, closed to a task's children: each child starts in a fresh, empty
//! session keyring of its own, and a seccomp filter refuses it the key system calls
//! (`add_key`, `request_key`, `keyctl`) with `ENOSYS`, as a kernel built without keys would.
//!
//! Both, because neither is enough alone. A fresh session keyring drops what a child would
//! inherit from the daemon (whatever systemd or a login put in its session keyring), but a
//! child runs as the daemon's own user, and the kernel checks a key's "user" permissions by
//! uid alone, across user namespaces: a key or keyring of the service user's that grants its
//! user read or link (a user keyring does, and systemd's service keyring does) can be found
//! by its serial in `/proc/keys` and read or linked by any process of that user. Refusing
//! the calls closes that; the fresh keyring covers what the kernel looks up in a process's
//! keyrings on its own behalf.
//!
//! Runs in the forked child (`child.rs`): raw system calls on static data only.

#![allow(unsafe_code)]

use std::io;

/// Leave the inherited session keyring for a new, anonymous, empty one.
///
/// # Safety
///
/// Only in a child made by `launch.rs`, before its `exec` (see `child.rs`).
pub(super) unsafe fn join_fresh_session() -> io::Result<()> {
    const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
    if libc::syscall(
        libc::SYS_keyctl,
        KEYCTL_JOIN_SESSION_KEYRING,
        std::ptr::null::<libc::c_char>(),
    ) < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Refuse this process and everything it starts the key system calls (a seccomp filter
/// cannot be removed, and every descendant inherits it). Needs `no_new_privs`.
///
/// # Safety
///
/// Only in a child made by `launch.rs`, before its `exec` (see `child.rs`), after
/// `PR_SET_NO_NEW_PRIVS`.
pub(super) unsafe fn refuse_key_calls() -> io::Result<()> {
    if NATIVE.is_none() {
        // No filter for this architecture. An errno, not a message: this runs in a child
        // sharing the daemon's memory (`launch.rs`), where nothing may allocate, and only
        // the errno reaches the daemon anyway.
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    let prog = libc::sock_fprog {
        len: FILTER.len() as libc::c_ushort,
        filter: FILTER.as_ptr().cast_mut(),
    };
    if libc::prctl(
        libc::PR_SET_SECCOMP,
        libc::SECCOMP_MODE_FILTER as libc::c_ulong,
        &prog as *const libc::sock_fprog,
        0,
        0,
    ) != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// Classic BPF, as seccomp takes it (linux/filter.h, linux/seccomp.h).
/// `BPF_LD | BPF_W | BPF_ABS` (the first two are 0).
const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x05 | 0x10;
const JGE_K: u16 = 0x05 | 0x30;
const RET_K: u16 = 0x06;
const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const REFUSE: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;

const fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// `AUDIT_ARCH_*` of the native system call table.
#[cfg(target_arch = "x86_64")]
const NATIVE: Option<u32> = Some(0xC000_003E);
#[cfg(target_arch = "aarch64")]
const NATIVE: Option<u32> = Some(0xC000_00B7);
#[cfg(target_arch = "riscv64")]
const NATIVE: Option<u32> = Some(0xC000_00F3);
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
const NATIVE: Option<u32> = None;

/// Numbers at or above this are not native calls: x32's (on x86_64), which reach the same
/// code under other numbers. Elsewhere no call has it.
const FOREIGN_NR: u32 = 0x4000_0000;

/// The filter: a call of another architecture's table (i386 or x32 on x86_64: the same key
/// calls under other numbers) is refused whatever it is, as the shipped unit's
/// `SystemCallArchitectures=native` does; the three key calls are refused; the rest passes.
static FILTER: [libc::sock_filter; 10] = [
    op(LD_W_ABS, 0, 0, ARCH),
    op(
        JEQ_K,
        1,
        0,
        match NATIVE {
            Some(arch) => arch,
            None => 0,
        },
    ),
    op(RET_K, 0, 0, REFUSE),
    op(LD_W_ABS, 0, 0, NR),
    op(JGE_K, 4, 0, FOREIGN_NR),
    op(JEQ_K, 3, 0, libc::SYS_add_key as u32),
    op(JEQ_K, 2, 0, libc::SYS_request_key as u32),
    op(JEQ_K, 1, 0, libc::SYS_keyctl as u32),
    op(RET_K, 0, 0, ALLOW),
    op(RET_K, 0, 0, REFUSE),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_jump_of_the_filter_lands_on_a_return() {
        assert!(NATIVE.is_some(), "a filter for this architecture");
        let filter = &FILTER;
        for (i, ins) in filter.iter().enumerate() {
            if ins.code & 0x07 == 0x05 {
                for to in [i + 1 + ins.jt as usize, i + 1 + ins.jf as usize] {
                    assert!(to < filter.len(), "instruction {i} jumps out");
                }
            }
        }
        // Each key call jumps to the refusal; everything else falls through to allow.
        let refuse = filter.len() - 1;
        assert_eq!(filter[refuse].k, REFUSE);
        for (i, ins) in filter.iter().enumerate().skip(5).take(3) {
            assert_eq!(i + 1 + ins.jt as usize, refuse);
        }
        assert_eq!(filter[refuse - 1].k, ALLOW);
    }
}
