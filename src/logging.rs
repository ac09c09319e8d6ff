//! The daemon's log: human text or JSON on stderr, every line scrubbed of known secrets.

use crate::cli::LogFormat;
use crate::redact::{RedactingWriter, Redactor};

/// Set up tracing: human text or JSON on stderr, secrets scrubbed from every line.
pub fn init_tracing(format: LogFormat, level: &str, secrets: Vec<String>) -> RedactingWriter {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let writer = RedactingWriter::new(Redactor::new(secrets));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer.clone())
        .with_target(false);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
    writer
}
