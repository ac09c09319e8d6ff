//! Fuzz the hub → sidecar path with libFuzzer; the check itself is `../check_frame.rs`,
//! shared with the stable fallback `examples/fuzz_frames.rs`.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../check_frame.rs"]
mod check_frame;

fuzz_target!(|data: &[u8]| {
    check_frame::check(&String::from_utf8_lossy(data));
});
