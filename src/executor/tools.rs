//! Agentic tools and their workspace sandbox (stub until the executors issue lands).
