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

    /// The literal each `const NAME: &str = …;` of `src` starts with: (name, text).
    fn sql_constants(src: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut rest = src;
        while let Some(at) = rest.find("const ") {
            rest = &rest[at + "const ".len()..];
            let Some((name, after)) = rest.split_once(": &str =") else {
                continue;
            };
            if !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                continue;
            }
            let after = after.trim_start();
            let text = if let Some(raw) = after.strip_prefix("r#\"") {
                raw.split_once("\"#").map(|(t, _)| t)
            } else if let Some(plain) = after.strip_prefix('"') {
                plain.split_once('"').map(|(t, _)| t)
            } else {
                None
            };
            out.push((name.to_string(), text.unwrap_or_default().to_string()));
        }
        out
    }

    #[test]
    fn every_statement_starts_with_its_marker() {
        let mut seen = 0;
        for (file, src) in SOURCES {
            for (name, sql) in sql_constants(src) {
                assert!(
                    sql.starts_with("/* gd:"),
                    "{file}: {name} does not start with its /* gd:KIND */ marker"
                );
                let kind = gen_durable_testkit::statements::classify(&sql);
                assert_ne!(kind, "other", "{file}: {name}: an unknown marker");
                seen += 1;
            }
        }
        // The scan found them: every statement of the status page and the dashboard.
        assert!(seen >= 17, "only {seen} statements found");
    }
}
