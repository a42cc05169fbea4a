//! The statements only the operator tools run, each opening with its `/* gd:KIND */`
//! marker as the library's do (`gen_durable_testkit::statements` classifies by it). The
//! reads they share with the library (the node announcements, gate usage, buckets,
//! pauses, the bounded counts) come through `gen_durable::backend`.

pub(crate) mod admin;
pub(crate) mod dashboard;
pub(crate) mod limits;

#[cfg(test)]
mod tests {
    #[test]
    fn every_statement_starts_with_its_marker() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
        let seen = gen_durable_testkit::statements::assert_marked(&dir, &[]);
        // The scan found them: every statement of the status page and the dashboard.
        assert!(seen >= 17, "only {seen} statements found");
    }
}
