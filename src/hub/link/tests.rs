//! The link's unit tests: how a hub's close frame becomes a wait.

use super::*;

#[test]
fn policy_close_becomes_cooldown() {
    let end = close_end(Some(CloseFrame {
        code: CloseCode::Policy,
        reason: "cooldown active: retry in 60s".into(),
    }));
    assert!(matches!(end, End::Cooldown(d, _) if d == Duration::from_secs(60)));
    let end = close_end(Some(CloseFrame {
        code: CloseCode::Policy,
        reason: "too many validation errors".into(),
    }));
    assert!(matches!(end, End::Cooldown(d, _) if d == Duration::from_secs(30)));
}
