//! Why the daemon runs no git in a work tree: the one answer [`super::locate`] and
//! [`super::harden`] both give, so neither needs the other's types.

use std::path::PathBuf;

/// Why the daemon runs no git in a work tree.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A config file of the git directory could not be listed.
    #[error("refused: cannot read {} ({exit}); the daemon runs no git in this work tree", file.display())]
    Unreadable {
        /// The config file.
        file: PathBuf,
        /// How `git config --list` ended.
        exit: String,
    },
    /// git itself could not be started to list the config.
    #[error("refused: cannot run git to read {}: {source}", file.display())]
    Spawn {
        /// The config file.
        file: PathBuf,
        /// Why git did not start.
        source: std::io::Error,
    },
    /// `.git` is something git would follow but the daemon cannot resolve the same way.
    #[error("refused: {} is {why}; the daemon runs no git in this work tree (make `.git` a directory or a gitfile naming one)", dot_git.display())]
    Unresolvable {
        /// The `.git` entry.
        dot_git: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The git directory borrows objects from elsewhere.
    #[error("refused: {} exists: objects from another repository could enter what the daemon commits and pushes; the daemon runs no git in this work tree until it is removed", file.display())]
    Alternates {
        /// The alternates file.
        file: PathBuf,
    },
    /// A populated submodule, which git enters (`git add` asks its `git status`), is not
    /// safe (its own config, alternates, or a `.git` that cannot be resolved).
    #[error("refused: the submodule checkout {} has a git directory of its own that git would enter: {why}", path.display())]
    Submodule {
        /// The submodule's directory.
        path: PathBuf,
        /// Why it is not safe.
        why: String,
    },
    /// The config sets keys outside the allowlist.
    #[error("refused: {} sets {}, which can make git run a program; the daemon runs no git in this work tree until the key is removed (or use a managed clone: a task with `repo`)", file.display(), keys.join(", "))]
    UntrustedKeys {
        /// The config file.
        file: PathBuf,
        /// The keys, sorted.
        keys: Vec<String>,
    },
}
