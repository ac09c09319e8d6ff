//! Operations: systemd notification, health and metrics (filled in by the operations issue).
