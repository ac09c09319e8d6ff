//! The file tools (`read_file`, `write_file`, `list_directory`, `search_files`): blocking
//! code run on the blocking pool, acting only on paths [`Sandbox::resolve`] let through, and
//! opening files so that a FIFO, a device or a swapped-in symlink cannot hang or fool them.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::truncate_chars;

use super::{
    str_arg, Sandbox, ToolError, ToolOutcome, MAX_LIST_ENTRIES, MAX_READ_FILE_BYTES,
    MAX_SEARCH_FILE_BYTES, MAX_TOOL_OUTPUT,
};

/// `read_file`, `write_file`, `list_directory`, `search_files`: blocking, run in spawn_blocking.
pub(super) fn file_tool(sb: &Sandbox, name: &str, args: &Value) -> ToolOutcome {
    let res = match name {
        "read_file" => read_file(sb, args),
        "write_file" => write_file(sb, args),
        "list_directory" => list_directory(sb, args),
        _ => search_files(sb, args),
    };
    match res {
        Ok(out) => out,
        Err(e) => ToolOutcome::err(e.to_string()),
    }
}

fn required_path(sb: &Sandbox, args: &Value, tool: &str) -> Result<PathBuf, ToolError> {
    let p = str_arg(args, "path")
        .ok_or_else(|| ToolError::BadArgs(format!("{tool} needs a `path` string")))?;
    Ok(sb.resolve(p)?)
}

/// An I/O failure on `rel`.
fn io_err(action: &'static str, rel: &str) -> impl FnOnce(std::io::Error) -> ToolError {
    let rel = rel.to_string();
    move |source| ToolError::Io {
        action,
        rel,
        source,
    }
}

fn read_file(sb: &Sandbox, args: &Value) -> Result<ToolOutcome, ToolError> {
    let path = required_path(sb, args, "read_file")?;
    let rel = sb.rel(&path);
    let (file, size) = sb.open_regular(&path).map_err(io_err("read", &rel))?;
    if size > MAX_READ_FILE_BYTES {
        return Err(ToolError::TooLarge { rel, size });
    }
    let bytes = read_capped(file, MAX_READ_FILE_BYTES).map_err(io_err("read", &rel))?;
    let text = String::from_utf8_lossy(&bytes);
    let start = args.get("start_line").and_then(Value::as_u64);
    let end = args.get("end_line").and_then(Value::as_u64);
    if start.is_none() && end.is_none() {
        return Ok(ToolOutcome::ok(head_of(
            &text,
            "use start_line/end_line to read the rest",
        )));
    }
    let start = start.unwrap_or(1).max(1) as usize;
    let end = end.map(|e| e as usize).unwrap_or(usize::MAX);
    if end < start {
        return Err(ToolError::BadArgs(format!(
            "end_line {end} is before start_line {start}"
        )));
    }
    let lines: Vec<&str> = text
        .lines()
        .skip(start - 1)
        .take(end.saturating_sub(start) + 1)
        .collect();
    Ok(ToolOutcome::ok(head_of(
        &lines.join("\n"),
        "narrow the line range",
    )))
}

/// At most `cap` bytes of `file`, whatever its size claims (a file may grow while read).
fn read_capped(file: std::fs::File, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    file.take(cap).read_to_end(&mut out)?;
    Ok(out)
}

/// The start of `text` when it is longer than a tool result may be, with a hint.
fn head_of(text: &str, hint: &str) -> String {
    if text.len() <= MAX_TOOL_OUTPUT - 200 {
        return text.to_string();
    }
    let mut cut = MAX_TOOL_OUTPUT - 200;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(
        "{}\n[… {} more bytes; {hint}]",
        &text[..cut],
        text.len() - cut
    )
}

fn write_file(sb: &Sandbox, args: &Value) -> Result<ToolOutcome, ToolError> {
    let path = required_path(sb, args, "write_file")?;
    let content = str_arg(args, "content")
        .ok_or_else(|| ToolError::BadArgs("write_file needs a `content` string".into()))?;
    let rel = sb.rel(&path);
    if path == sb.root() || path.is_dir() {
        return Err(ToolError::BadArgs(format!(
            "{rel} is a directory; give a file path"
        )));
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("create the directories of", &rel))?;
    }
    std::fs::write(&path, content).map_err(io_err("write", &rel))?;
    Ok(ToolOutcome {
        ok: true,
        output: format!("wrote {} bytes to {rel}", content.len()),
        wrote: true,
    })
}

/// Depth-first walk without following symlinks, skipping `.git`; calls `f(abs, is_dir)`
/// until it returns false. Iterative (the workspace is the task's: any depth), one sorted
/// listing held per level; a directory whose path the kernel refuses as too long is not
/// entered.
fn walk(dir: &Path, recursive: bool, f: &mut dyn FnMut(&Path, bool) -> bool) -> bool {
    let sorted = |dir: &Path| {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .map(|rd| rd.filter_map(Result::ok).collect())
            .unwrap_or_default();
        // Reversed, so `pop` yields them in name order.
        entries.sort_by_key(|e| std::cmp::Reverse(e.file_name()));
        entries
    };
    let mut levels = vec![sorted(dir)];
    while let Some(level) = levels.last_mut() {
        let Some(e) = level.pop() else {
            levels.pop();
            continue;
        };
        let p = e.path();
        let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if is_dir && e.file_name() == ".git" {
            continue;
        }
        if !f(&p, is_dir) {
            return false;
        }
        if is_dir && recursive {
            levels.push(sorted(&p));
        }
    }
    true
}

fn list_directory(sb: &Sandbox, args: &Value) -> Result<ToolOutcome, ToolError> {
    let path = sb.resolve(str_arg(args, "path").unwrap_or("."))?;
    if !path.is_dir() {
        return Err(ToolError::BadArgs(format!(
            "{} is not a directory",
            sb.rel(&path)
        )));
    }
    let recursive = args
        .get("recursive")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let matcher = match str_arg(args, "pattern").filter(|p| !p.is_empty()) {
        Some(p) => Some(
            globset::Glob::new(p)
                .map_err(|e| ToolError::BadArgs(format!("bad glob pattern `{p}`: {e}")))?
                .compile_matcher(),
        ),
        None => None,
    };
    let mut lines = Vec::new();
    let mut truncated = false;
    walk(&path, recursive, &mut |p, is_dir| {
        let rel = p.strip_prefix(&path).unwrap_or(p);
        let matches = matcher
            .as_ref()
            .is_none_or(|m| m.is_match(rel) || p.file_name().is_some_and(|n| m.is_match(n)));
        if matches {
            if lines.len() >= MAX_LIST_ENTRIES {
                truncated = true;
                return false;
            }
            let shown = sb.rel(p);
            lines.push(if is_dir { format!("{shown}/") } else { shown });
        }
        true
    });
    if truncated {
        lines.push(format!("[… stopped after {MAX_LIST_ENTRIES} entries]"));
    }
    if lines.is_empty() {
        lines.push("(no entries)".into());
    }
    Ok(ToolOutcome::ok(lines.join("\n")))
}

fn search_files(sb: &Sandbox, args: &Value) -> Result<ToolOutcome, ToolError> {
    let pattern = str_arg(args, "pattern")
        .ok_or_else(|| ToolError::BadArgs("search_files needs a `pattern` string".into()))?;
    let re = regex::Regex::new(pattern)
        .map_err(|e| ToolError::BadArgs(format!("bad regex `{pattern}`: {e}")))?;
    let path = sb.resolve(str_arg(args, "path").unwrap_or("."))?;
    let max = args
        .get("max_results")
        .and_then(Value::as_u64)
        .unwrap_or(50)
        .clamp(1, 500) as usize;
    let mut hits = Vec::new();
    let mut search = |p: &Path| {
        // Regular files only, never through a symlink: no FIFO that blocks, no device that
        // never ends, nothing outside the workspace.
        let Ok((file, size)) = sb.open_regular(p) else {
            return true;
        };
        if size > MAX_SEARCH_FILE_BYTES {
            return true;
        }
        let Ok(text) = read_capped(file, MAX_SEARCH_FILE_BYTES) else {
            return true;
        };
        if text.contains(&0) {
            return true; // binary
        }
        for (i, line) in String::from_utf8_lossy(&text).lines().enumerate() {
            if re.is_match(line) {
                hits.push(format!(
                    "{}:{}: {}",
                    sb.rel(p),
                    i + 1,
                    truncate_chars(line.trim(), 200)
                ));
                if hits.len() >= max {
                    return false;
                }
            }
        }
        true
    };
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
        search(&path);
    } else {
        walk(&path, true, &mut |p, is_dir| is_dir || search(p));
    }
    if hits.is_empty() {
        return Ok(ToolOutcome::ok("no matches"));
    }
    Ok(ToolOutcome::ok(hits.join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A workspace with a FIFO, a symlink to /dev/zero, a symlink to a secret outside, and
    /// a plain file; the secret lives beside the workspace.
    fn hostile_workspace() -> (tempfile::TempDir, Sandbox) {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        std::fs::write(d.path().join("secret.txt"), "needle-outside\n").unwrap();
        std::fs::write(ws.join("plain.txt"), "needle-inside\n").unwrap();
        let fifo = std::ffi::CString::new(ws.join("pipe").to_str().unwrap()).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: mkfifo with a valid NUL-terminated path.
        let r = unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) };
        assert_eq!(r, 0);
        std::os::unix::fs::symlink("/dev/zero", ws.join("zero")).unwrap();
        std::os::unix::fs::symlink(d.path().join("secret.txt"), ws.join("out.txt")).unwrap();
        let sb = Sandbox::new(&ws).unwrap();
        (d, sb)
    }

    #[test]
    fn search_files_skips_fifos_devices_and_symlinks_out() {
        let (_d, sb) = hostile_workspace();
        // Would hang on the FIFO, never end on /dev/zero, or find the outside needle.
        let out = search_files(&sb, &json!({"pattern": "needle"})).unwrap();
        assert!(out.output.contains("plain.txt:1"), "{}", out.output);
        assert!(!out.output.contains("outside"), "{}", out.output);
    }

    #[test]
    fn read_file_refuses_fifos_devices_and_symlinks_out() {
        let (_d, sb) = hostile_workspace();
        for p in ["pipe", "zero", "out.txt"] {
            let r = read_file(&sb, &json!({"path": p}));
            assert!(r.is_err(), "{p} was read: {:?}", r.map(|o| o.output));
        }
        // The FIFO in particular: refused as not a regular file, without blocking.
        let e = read_file(&sb, &json!({"path": "pipe"})).unwrap_err();
        assert!(matches!(e, ToolError::Io { action: "read", .. }), "{e:?}");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(read_file(&sb, &json!({"path": "plain.txt"})).is_ok());
    }
}
