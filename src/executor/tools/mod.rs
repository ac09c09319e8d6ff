//! The agentic tools the Ollama loop offers the model, and the workspace sandbox they run in.
//!
//! Tools: `read_file`, `write_file`, `list_directory`, `search_files`, `run_command`.
//! Their JSON schemas ([`schemas`]) are what `/api/chat` receives as `tools`.
//!
//! # Sandbox
//!
//! Every path the model names is resolved by [`Sandbox::resolve`] to a canonical path inside
//! the canonical workspace: `..` that climbs out, absolute paths elsewhere, symlinks (of the
//! file or of any parent) that lead out and dangling symlinks are all refused. The tools then
//! act on the resolved path, never on the model's string. A race with a process that swaps
//! a directory for a symlink between the check and the use is out of scope: the only other
//! writer is the model itself, through these tools or `run_command`.
//!
//! `run_command` runs `sh -c` in the workspace through [`process::run`] (own process group,
//! capped output, group kill on timeout and cancel), after a denylist of obviously dangerous
//! programs. Tool failures are results for the model (`ToolOutcome::ok` false), never
//! errors of the loop.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::process::{self, ChildEnv, CommandSpec, Exit, Limits};
use crate::util::tail_bytes;

mod files;
use files::file_tool;

/// `run_command` timeout when the model gives none.
pub const RUN_COMMAND_DEFAULT_SECS: u64 = 60;
/// Upper bound on the `timeout_secs` the model may ask for.
pub const RUN_COMMAND_MAX_SECS: u64 = 300;
/// Text returned to the model per tool call is cut to this (it all goes into the context).
pub const MAX_TOOL_OUTPUT: usize = 16 * 1024;
/// Files larger than this are not searched.
const MAX_SEARCH_FILE_BYTES: u64 = 1024 * 1024;
/// `read_file` refuses larger files (it reads them whole).
const MAX_READ_FILE_BYTES: u64 = 8 * 1024 * 1024;
/// `list_directory` stops after this many entries.
const MAX_LIST_ENTRIES: usize = 500;

/// Programs `run_command` refuses: privilege changes, disk wiping, power, network egress.
pub const DENYLIST: &[&str] = &[
    "sudo", "su", "doas", "mkfs", "dd", "shutdown", "reboot", "poweroff", "halt", "curl", "wget",
    "nc", "ncat", "netcat", "ssh", "scp", "sftp", "rsync",
];

/// The `tools` array for `/api/chat` (OpenAI-style function schemas, as Ollama expects).
pub fn schemas() -> Value {
    let f = |name: &str, desc: &str, params: Value| json!({"type": "function", "function": {"name": name, "description": desc, "parameters": params}});
    json!([
        f("read_file", "Read a text file in the workspace, optionally only lines start_line..=end_line (1-based).",
          json!({"type": "object", "required": ["path"], "properties": {
              "path": {"type": "string", "description": "Path relative to the workspace root"},
              "start_line": {"type": "integer"}, "end_line": {"type": "integer"}}})),
        f("write_file", "Create or overwrite a file in the workspace with the given content (parent directories are created).",
          json!({"type": "object", "required": ["path", "content"], "properties": {
              "path": {"type": "string"}, "content": {"type": "string"}}})),
        f("list_directory", "List a directory of the workspace; recursive lists the whole tree; pattern is a glob filter such as **/*.rs.",
          json!({"type": "object", "properties": {
              "path": {"type": "string", "description": "Defaults to the workspace root"},
              "recursive": {"type": "boolean"}, "pattern": {"type": "string"}}})),
        f("run_command", "Run a shell command in the workspace root and return its exit status and output. Network and privilege tools are not available.",
          json!({"type": "object", "required": ["command"], "properties": {
              "command": {"type": "string"},
              "timeout_secs": {"type": "integer", "description": "Default 60, at most 300"}}})),
        f("search_files", "Search file contents under a path with a regular expression; returns path:line: text.",
          json!({"type": "object", "required": ["pattern"], "properties": {
              "pattern": {"type": "string"}, "path": {"type": "string"},
              "max_results": {"type": "integer", "description": "Default 50"}}})),
    ])
}

/// Why a model-supplied path is refused: the sandbox's verdict, never an I/O accident.
#[derive(Debug, thiserror::Error)]
pub enum PathRefusal {
    /// A NUL byte: no file system path holds one.
    #[error("path contains a NUL byte")]
    Nul,
    /// `..` climbs above the workspace root.
    #[error("path `{0}` escapes the workspace; use a path inside it")]
    Escapes(String),
    /// A component on the way is a dangling symlink or cannot be read.
    #[error("path `{path}` goes through `{}`, a dangling symlink or unreadable entry ({source})", entry.display())]
    Unresolvable {
        /// The path as the model gave it.
        path: String,
        /// The entry that could not be followed.
        entry: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not even `/` exists above it (a path the OS cannot name).
    #[error("path `{0}` has no existing ancestor")]
    NoAncestor(String),
    /// It resolves (through `..`, an absolute path or a symlink) outside the workspace.
    #[error("path `{path}` resolves to {} outside the workspace (absolute paths and symlinks must stay inside it); use a path inside the workspace", resolved.display())]
    Outside {
        /// The path as the model gave it.
        path: String,
        /// Where it leads.
        resolved: PathBuf,
    },
}

/// Why a file tool did nothing; the message goes back to the model as the tool's result.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The path is refused by the workspace sandbox.
    #[error(transparent)]
    Refused(#[from] PathRefusal),
    /// The model's arguments are missing or malformed; the text says which and how.
    #[error("{0}")]
    BadArgs(String),
    /// The file is larger than `read_file` returns.
    #[error("{rel} is {size} bytes, more than read_file handles ({MAX_READ_FILE_BYTES}); use search_files or run_command (head, sed -n) on it")]
    TooLarge {
        /// The file, relative to the workspace.
        rel: String,
        /// Its size in bytes.
        size: u64,
    },
    /// The file system failed on an allowed path.
    #[error("cannot {action} {rel}: {source}")]
    Io {
        /// What was attempted: `read`, `write`, `create the directories of`.
        action: &'static str,
        /// The file, relative to the workspace.
        rel: String,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// Why the agentic tools could not be set up for a workspace.
#[derive(Debug, thiserror::Error)]
pub enum ToolsSetupError {
    /// The workspace cannot be canonicalized (gone, or unreadable).
    #[error("workspace {} is not usable for the agentic tools: {source}", path.display())]
    Workspace {
        /// The workspace.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The set-up on the blocking pool panicked.
    #[error("sandbox setup panicked: {0}")]
    Panicked(String),
}

/// Resolves model-supplied paths inside one workspace.
#[derive(Debug, Clone)]
pub struct Sandbox {
    root: PathBuf,
}

impl Sandbox {
    /// A sandbox rooted at the canonical form of `workspace` (which must exist). Blocking.
    pub fn new(workspace: &Path) -> std::io::Result<Sandbox> {
        Ok(Sandbox {
            root: std::fs::canonicalize(workspace)?,
        })
    }

    /// The canonical workspace.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The canonical path `path` names, if it is inside the workspace. Blocking (stat calls).
    ///
    /// Lexical `..` is applied first (refused if it climbs above the root), then the nearest
    /// existing ancestor is canonicalized, which resolves every symlink on the way; the
    /// result must still be inside the root. A dangling symlink anywhere is refused, since
    /// writing through it would create its (unchecked) target.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, PathRefusal> {
        if path.contains('\0') {
            return Err(PathRefusal::Nul);
        }
        let p = Path::new(if path.trim().is_empty() { "." } else { path });
        let mut lexical = if p.is_absolute() {
            PathBuf::from("/")
        } else {
            self.root.clone()
        };
        for c in p.components() {
            match c {
                Component::Prefix(_) | Component::RootDir | Component::CurDir => {}
                Component::ParentDir => {
                    if !p.is_absolute() && lexical == self.root {
                        return Err(PathRefusal::Escapes(path.to_string()));
                    }
                    lexical.pop();
                }
                Component::Normal(n) => lexical.push(n),
            }
        }
        // Walk up to the nearest existing entry; canonicalize it (following symlinks).
        let mut existing = lexical.as_path();
        let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
        let resolved = loop {
            if std::fs::symlink_metadata(existing).is_ok() {
                let canon = std::fs::canonicalize(existing).map_err(|source| {
                    PathRefusal::Unresolvable {
                        path: path.to_string(),
                        entry: existing.to_path_buf(),
                        source,
                    }
                })?;
                let mut full = canon;
                for r in rest.iter().rev() {
                    full.push(r);
                }
                break full;
            }
            match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name);
                    existing = parent;
                }
                _ => return Err(PathRefusal::NoAncestor(path.to_string())),
            }
        };
        if resolved.starts_with(&self.root) {
            Ok(resolved)
        } else {
            Err(PathRefusal::Outside {
                path: path.to_string(),
                resolved,
            })
        }
    }

    /// `abs` relative to the root, for messages to the model.
    /// Open `path` for reading, only if it is a regular file reached without a symlink in
    /// its last component and, once open, still inside the workspace (the descriptor's real
    /// path is checked, so a parent swapped for a symlink after [`Sandbox::resolve`] is
    /// caught). Opened non-blocking, so a FIFO can never hang the daemon. Returns the file
    /// and its size.
    fn open_regular(&self, path: &Path) -> std::io::Result<(std::fs::File, u64)> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other(
                "not a regular file (FIFOs, sockets and devices are never read)",
            ));
        }
        use std::os::fd::AsRawFd;
        let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
        if !real.starts_with(&self.root) {
            return Err(std::io::Error::other(
                "the file is outside the workspace (a path changed under the tool)",
            ));
        }
        Ok((file, meta.len()))
    }

    fn rel(&self, abs: &Path) -> String {
        match abs.strip_prefix(&self.root) {
            Ok(r) if r.as_os_str().is_empty() => ".".into(),
            Ok(r) => r.display().to_string(),
            Err(_) => abs.display().to_string(),
        }
    }
}

/// What a tool call produced, as text for the model.
#[derive(Debug, Clone)]
pub struct ToolOutcome {
    /// False for refused or failed calls; the text then says why.
    pub ok: bool,
    /// The text the model gets back.
    pub output: String,
    /// A `write_file` that succeeded (the loop's stall detection counts these).
    pub wrote: bool,
}

impl ToolOutcome {
    fn ok(output: impl Into<String>) -> ToolOutcome {
        ToolOutcome {
            ok: true,
            output: output.into(),
            wrote: false,
        }
    }

    fn err(msg: impl Into<String>) -> ToolOutcome {
        ToolOutcome {
            ok: false,
            output: format!("error: {}", msg.into()),
            wrote: false,
        }
    }
}

/// The tools of one task, bound to its workspace and child environment.
#[derive(Debug, Clone)]
pub struct Tools {
    sandbox: Arc<Sandbox>,
    env: ChildEnv,
    grace: Duration,
    output_cap: usize,
}

impl Tools {
    /// Tools for `workspace` (canonicalized off the runtime). `output_cap` bounds what
    /// `run_command` captures; `grace` is its SIGTERM → SIGKILL delay.
    pub async fn new(
        workspace: &Path,
        env: ChildEnv,
        grace: Duration,
        output_cap: usize,
    ) -> Result<Tools, ToolsSetupError> {
        let ws = workspace.to_path_buf();
        let sandbox = tokio::task::spawn_blocking(move || Sandbox::new(&ws))
            .await
            .map_err(|e| ToolsSetupError::Panicked(e.to_string()))?
            .map_err(|source| ToolsSetupError::Workspace {
                path: workspace.to_path_buf(),
                source,
            })?;
        Ok(Tools {
            sandbox: Arc::new(sandbox),
            env,
            grace,
            output_cap,
        })
    }

    /// The sandbox every file tool resolves paths with.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// Run tool `name` with `args` (a JSON object). `max_timeout` bounds `run_command`
    /// (the task's remaining time); `cancel` stops it.
    pub async fn call(
        &self,
        name: &str,
        args: &Value,
        cancel: &CancellationToken,
        max_timeout: Duration,
    ) -> ToolOutcome {
        let mut out = match name {
            "run_command" => self.run_command(args, cancel, max_timeout).await,
            "read_file" | "write_file" | "list_directory" | "search_files" => {
                let sandbox = self.sandbox.clone();
                let (name, args) = (name.to_string(), args.clone());
                // File tools are plain std::fs work: keep it off the async workers.
                tokio::task::spawn_blocking(move || file_tool(&sandbox, &name, &args))
                    .await
                    .unwrap_or_else(|e| ToolOutcome::err(format!("tool panicked: {e}")))
            }
            other => ToolOutcome::err(format!(
                "unknown tool `{other}`; available: read_file, write_file, list_directory, run_command, search_files"
            )),
        };
        if out.output.len() > MAX_TOOL_OUTPUT {
            out.output = tail_bytes(&out.output, MAX_TOOL_OUTPUT);
        }
        out
    }

    async fn run_command(
        &self,
        args: &Value,
        cancel: &CancellationToken,
        max_timeout: Duration,
    ) -> ToolOutcome {
        let Some(command) = str_arg(args, "command").filter(|c| !c.trim().is_empty()) else {
            return ToolOutcome::err("run_command needs a non-empty `command` string");
        };
        if let Some(word) = denied_program(command) {
            return ToolOutcome::err(format!(
                "`{word}` is not allowed in run_command (denylisted: privilege, disk, power and network tools); the command was not run"
            ));
        }
        let secs = args
            .get("timeout_secs")
            .and_then(Value::as_u64)
            .unwrap_or(RUN_COMMAND_DEFAULT_SECS)
            .clamp(1, RUN_COMMAND_MAX_SECS);
        let timeout = Duration::from_secs(secs).min(max_timeout);
        let spec = CommandSpec::shell(command, self.sandbox.root(), self.env.clone());
        let limits = Limits {
            timeout: Some(timeout),
            grace: self.grace,
            output_cap: self.output_cap.min(256 * 1024),
        };
        match process::run(&spec, &limits, cancel, None).await {
            Err(e) => ToolOutcome::err(format!("could not start `sh`: {e}")),
            Ok(out) => {
                let body = out.combined();
                match out.exit {
                    Exit::TimedOut => ToolOutcome::err(format!(
                        "command timed out after {} s and was killed; output so far:\n{body}",
                        timeout.as_secs_f32()
                    )),
                    Exit::Cancelled => ToolOutcome::err("command cancelled"),
                    exit => ToolOutcome {
                        ok: exit.success(),
                        output: format!("{}\n{body}", exit.describe()),
                        wrote: false,
                    },
                }
            }
        }
    }
}

fn str_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

/// The first denylisted program named in `command`, if any.
///
/// Looks at the first word of every segment, where segments are split at `| ; & ( ) \n`,
/// backticks, `$(` and quotes (so `bash -c "curl …"` is caught), after skipping variable
/// assignments and wrappers (`env`, `nohup`, `time`, `exec`, `command`, `nice`, `timeout`,
/// `xargs`, `busybox`). A path such as `/usr/bin/curl` counts by its file name. This errs on
/// refusing: `echo "dd"` is refused too. It stops the obvious, not a determined model
/// (`python -c …` still reaches the network): it is a guard rail, not a security boundary.
pub fn denied_program(command: &str) -> Option<String> {
    const WRAPPERS: &[&str] = &[
        "env", "nohup", "time", "exec", "command", "nice", "timeout", "xargs", "busybox",
        "builtin", "then", "do", "else", "if", "while", "until", "!", "{",
    ];
    let segments = command.split(|c: char| {
        matches!(
            c,
            '|' | ';' | '&' | '(' | ')' | '\n' | '`' | '"' | '\'' | '$'
        )
    });
    for seg in segments {
        for word in seg.split_whitespace() {
            let is_assignment = word.contains('=') && !word.starts_with('=');
            let base = word.rsplit('/').next().unwrap_or(word);
            if DENYLIST.contains(&base) {
                return Some(base.to_string());
            }
            // A number or flag after a wrapper (`timeout 5`, `nice -n 5`) is still prefix.
            let is_wrapper_arg = word.starts_with('-') || word.chars().all(|c| c.is_ascii_digit());
            if !(is_assignment || WRAPPERS.contains(&base) || is_wrapper_arg) {
                break;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denylist_matches_first_words_of_segments() {
        for bad in [
            "sudo rm -rf /",
            "ls | nc host 1",
            "echo hi && curl http://x",
            "FOO=1 wget x",
            "/usr/bin/ssh host",
            "bash -c \"scp a b\"",
            "timeout 5 dd if=/dev/zero of=x",
            "echo $(curl x)",
            "env -i su",
        ] {
            assert!(denied_program(bad).is_some(), "{bad} should be refused");
        }
        for ok in [
            "cargo test",
            "ls -la | grep dd",
            "echo sudoku",
            "git status; make",
        ] {
            assert_eq!(denied_program(ok), None, "{ok} should run");
        }
    }
}
