//! The statements only the operator tools run, each opening with its `/* gd:KIND */`
//! marker as the library's do (`gen_durable_testkit::statements` classifies by it). The
//! reads they share with the library (the node announcements, gate usage, buckets,
//! pauses, the bounded counts) come through `gen_durable::backend`.

pub(crate) mod admin;
pub(crate) mod dashboard;
pub(crate) mod limits;

#[cfg(test)]
mod tests {
    /// The statements of this module, as written: every `const NAME: &str` of each file.
    const SOURCES: [(&str, &str); 3] = [
        ("admin.rs", include_str!("admin.rs")),
        ("dashboard.rs", include_str!("dashboard.rs")),
        ("limits.rs", include_str!("limits.rs")),
    ];

    #[test]
    fn every_statement_starts_with_its_marker() {
        let seen = gen_durable_testkit::statements::assert_marked(&SOURCES);
        // The scan found them: every statement of the status page and the dashboard.
        assert!(seen >= 17, "only {seen} statements found");
    }
}
