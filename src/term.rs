//! The live progress display for long work in a terminal (`run-task`).
//!
//! Owns one render task. Progress events reach it through [`ProgressLine::observer`] (a
//! [`ProgressSink`] observer: it only updates shared state and never writes, so emitting
//! progress never waits on the terminal). On a TTY the render task rewrites one line with
//! `\r` a few times a second — phase, attempt k/N, elapsed time, last output line; elsewhere
//! (CI logs, pipes) it prints one plain line per structured event.
//!
//! Also [`printable`], the one way text from a task (its output, file names, descriptions)
//! reaches a terminal: a task must not be able to move the cursor, retitle the window, or
//! answer for the operator through escape sequences.

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::progress::{EventKind, ProgressEvent, ProgressSink};

/// What the line shows.
#[derive(Debug, Clone)]
struct LineState {
    phase: String,
    attempt: u64,
    attempts_max: u64,
    last_output: String,
}

/// Handle to the display; [`ProgressLine::finish`] clears the line and ends the render task.
pub struct ProgressLine {
    state: Arc<Mutex<LineState>>,
    plain_tx: Option<mpsc::UnboundedSender<String>>,
    stop: tokio_util::sync::CancellationToken,
    task: JoinHandle<()>,
}

impl ProgressLine {
    /// Start the display on stderr. `attempts_max` is the initial N of "attempt k/N".
    pub fn start(attempts_max: u64) -> ProgressLine {
        let tty = std::io::stderr().is_terminal();
        let state = Arc::new(Mutex::new(LineState {
            phase: "starting".into(),
            attempt: 1,
            attempts_max: attempts_max.max(1),
            last_output: String::new(),
        }));
        let stop = tokio_util::sync::CancellationToken::new();
        let (plain_tx, mut plain_rx) = mpsc::unbounded_channel::<String>();
        let started = Instant::now();
        let render_state = state.clone();
        let render_stop = stop.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tokio::select! {
                    _ = render_stop.cancelled() => break,
                    line = plain_rx.recv(), if !tty => match line {
                        Some(line) => eprintln!("{line}"),
                        None => break,
                    },
                    _ = tick.tick(), if tty => {
                        let s = render_state.lock().expect("progress line lock").clone();
                        let line = render(&s, started.elapsed(), terminal_width());
                        eprint!("\r\x1b[2K{line}");
                        let _ = std::io::stderr().flush();
                    }
                }
            }
            if tty {
                eprint!("\r\x1b[2K");
            } else {
                while let Ok(line) = plain_rx.try_recv() {
                    eprintln!("{line}");
                }
            }
        });
        ProgressLine {
            state,
            plain_tx: (!tty).then_some(plain_tx),
            stop,
            task,
        }
    }

    /// A [`ProgressSink`] that feeds this display.
    pub fn sink(&self, max_text: usize) -> ProgressSink {
        let state = self.state.clone();
        let plain = self.plain_tx.clone();
        ProgressSink::with_observer(max_text, move |ev| {
            if let Some(line) = update(&mut state.lock().expect("progress line lock"), ev) {
                if let Some(tx) = &plain {
                    let _ = tx.send(line);
                }
            }
        })
    }

    /// Clear the line (TTY) or flush the pending plain lines, and stop rendering.
    pub async fn finish(self) {
        drop(self.plain_tx);
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// `s` with every control character but newline and tab written out as an escape (`\x1b`,
/// `\u{9b}`, `\u{202e}`): C0 and C1 controls, DEL, and the bidirectional overrides that
/// make text read differently from what it is. Borrowed when there is nothing to escape.
pub fn printable(s: &str) -> Cow<'_, str> {
    fn escaped(c: char) -> bool {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    if !s.chars().any(escaped) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if !escaped(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            let _ = std::fmt::Write::write_fmt(&mut out, format_args!("\\x{:02x}", c as u32));
        } else {
            let _ = std::fmt::Write::write_fmt(&mut out, format_args!("\\u{{{:x}}}", c as u32));
        }
    }
    Cow::Owned(out)
}

/// Apply one event; the plain line to print for it, if it is worth a line of its own.
fn update(s: &mut LineState, ev: &ProgressEvent) -> Option<String> {
    // `run_number` is the execution (the loop's events carry it next to the retry's
    // `attempt`, which is 0 for the first execution).
    if let Some(k) = ev.fields.get("run_number").and_then(|v| v.as_u64()) {
        s.attempt = k;
    }
    if let Some(max) = ev.fields.get("max_retries").and_then(|v| v.as_u64()) {
        s.attempts_max = max + 1;
    }
    s.attempts_max = s.attempts_max.max(s.attempt);
    match ev.kind {
        k if k.is_stream() => {
            if let Some(line) = ev.text.lines().rev().find(|l| !l.trim().is_empty()) {
                s.last_output = printable(line.trim()).into_owned();
            }
            None
        }
        EventKind::VerificationCheckResult => {
            s.phase = "verifying".into();
            let ty = ev.fields.get("check_type").and_then(|v| v.as_str());
            let st = ev.fields.get("check_status").and_then(|v| v.as_str());
            Some(format!(
                "  check {} → {}",
                printable(ty.unwrap_or("?")),
                printable(st.unwrap_or("?"))
            ))
        }
        _ => {
            s.phase = printable(first_line(&ev.text)).into_owned();
            Some(format!(
                "[attempt {}/{}] {}",
                s.attempt, s.attempts_max, s.phase
            ))
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// The one-line rendering, cut to `width` characters.
fn render(s: &LineState, elapsed: Duration, width: usize) -> String {
    let secs = elapsed.as_secs();
    let mut line = format!(
        "⏳ {:>2}:{:02}  attempt {}/{}  {}",
        secs / 60,
        secs % 60,
        s.attempt,
        s.attempts_max,
        s.phase
    );
    if !s.last_output.is_empty() {
        line.push_str("  │ ");
        line.push_str(&s.last_output);
    }
    crate::util::truncate_chars(&line, width.saturating_sub(1).max(20))
}

/// `$COLUMNS`, else 100: no ioctl needed for a progress line.
fn terminal_width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> LineState {
        LineState {
            phase: "starting".into(),
            attempt: 1,
            attempts_max: 1,
            last_output: String::new(),
        }
    }

    #[test]
    fn tracks_attempts_phase_and_last_output() {
        let mut s = state();
        update(
            &mut s,
            &ProgressEvent::new(EventKind::Stdout, "building\ncompiling foo\n\n"),
        );
        assert_eq!(s.last_output, "compiling foo");
        let line = update(
            &mut s,
            &ProgressEvent::new(EventKind::VerificationRetryStart, "verification retry 1/2")
                .with("attempt", 1)
                .with("run_number", 2)
                .with("max_retries", 2),
        )
        .unwrap();
        assert_eq!(line, "[attempt 2/3] verification retry 1/2");
        let r = render(&s, Duration::from_secs(75), 200);
        assert!(r.contains(" 1:15"), "{r}");
        assert!(r.contains("attempt 2/3"), "{r}");
        assert!(r.ends_with("compiling foo"), "{r}");
        assert!(render(&s, Duration::ZERO, 30).chars().count() <= 30);
    }

    #[test]
    fn control_characters_from_a_task_never_reach_the_terminal_raw() {
        assert_eq!(printable("plain\ttext\nnext"), "plain\ttext\nnext");
        assert_eq!(
            printable("a\x1b[2Jb\rc\x07\x7f\u{9b}31m\u{202e}cod"),
            "a\\x1b[2Jb\\x0dc\\x07\\x7f\\u{9b}31m\\u{202e}cod"
        );
        let mut s = state();
        update(
            &mut s,
            &ProgressEvent::new(EventKind::Stdout, "\x1b]0;owned\x07done"),
        );
        let line = update(
            &mut s,
            &ProgressEvent::new(EventKind::Status, "\x1b[1Aphase"),
        )
        .unwrap();
        let r = render(&s, Duration::ZERO, 200);
        for text in [line.as_str(), r.as_str()] {
            assert!(!text.chars().any(|c| c.is_control()), "{text:?}");
        }
    }

    #[test]
    fn stream_text_is_not_a_plain_line_but_checks_are() {
        let mut s = state();
        assert!(update(&mut s, &ProgressEvent::new(EventKind::Stdout, "x")).is_none());
        let l = update(
            &mut s,
            &ProgressEvent::new(EventKind::VerificationCheckResult, "ok")
                .with("check_type", "file_exists")
                .with("check_status", "pass"),
        )
        .unwrap();
        assert_eq!(l, "  check file_exists → pass");
    }
}
