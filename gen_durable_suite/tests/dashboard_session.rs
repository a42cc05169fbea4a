//! The dashboard's sign-in (round 4 of the audit): a short operator token is refused
//! when the dashboard is configured.

use gen_durable::dashboard::{DashboardConfig, DashboardConfigError, MIN_OPERATOR_TOKEN_LEN};

#[test]
fn r4_session_short_operator_token_is_refused() {
    let short = "s3cret-but-only-31-bytes-long!!";
    assert_eq!(short.len(), MIN_OPERATOR_TOKEN_LEN - 1);
    let e = DashboardConfig::new()
        .with_operator_token(short)
        .expect_err("a 31-byte token was accepted");
    assert_eq!(e, DashboardConfigError::TokenTooShort { len: 31 });
    let said = e.to_string();
    for want in ["31 bytes", "at least 32", "openssl rand -hex 32"] {
        assert!(said.contains(want), "{said:?} lacks {want:?}");
    }
    assert_eq!(
        DashboardConfig::new().with_operator_token("").unwrap_err(),
        DashboardConfigError::TokenTooShort { len: 0 }
    );
    let ok = DashboardConfig::new().with_operator_token("x".repeat(MIN_OPERATOR_TOKEN_LEN));
    assert!(ok.is_ok_and(|c| !c.is_read_only()));
}
