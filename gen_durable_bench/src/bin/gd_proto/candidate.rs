//! A candidate design: its SQL, read from `gen_durable_bench/proto/candidates/<name>.sql`.
//!
//! A candidate file has sections, each opened by a line `-- @<section>`. In any section a
//! line `@include <file>` is replaced by that file of the same directory (the parts that
//! several candidates share, named `_*.sql`).
//! - `setup`: the schema, run as one simple query; a line `@gen_durable_schema` runs
//!   gen_durable's migrations.
//! - `seed`: inserts `$1` (int8) instances at step `s0`, runnable now.
//! - `claim`: claims up to `$2` (int8) rows for worker `$1` (text); returns
//!   `(id int8, epoch int8, step text, state jsonb)`.
//! - `read` (optional): for a claim of ranges: the claim then returns `(lo int8, hi int8)`
//!   rows, and this statement, run once per range with `$1` = lo and `$2` = hi in a
//!   transaction of its own, returns the claimed rows as `claim` would.
//! - `commit`: commits the outcomes of claimed rows `$1` (int8[], sorted) with epochs `$2`
//!   (int8[]) for worker `$3` (text): each goes on to step `$4[i]` (text[]), or is `done`
//!   where that is NULL, with state `$5[i]` (jsonb[]); returns how many were fenced and
//!   written (int8).
//! - `gc` (optional): retention of terminal rows; run while it returns a positive count
//!   (a statement that returns no row, such as `TRUNCATE`, runs once).
//! - `tables`: the tables whose writes are counted, comma-separated.
//! - `max_steps` (optional): the most steps per instance the design handles correctly; a
//!   run with more skips it.
//!
//! The first comment lines, before `-- @setup`, say what the candidate is.

use std::path::{Path, PathBuf};

/// One candidate's SQL.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub(crate) about: String,
    pub(crate) migrate: bool,
    pub(crate) setup: String,
    pub(crate) seed: String,
    pub(crate) claim: String,
    pub(crate) read: Option<String>,
    pub(crate) commit: String,
    pub(crate) gc: Option<String>,
    pub(crate) tables: Vec<String>,
    pub(crate) max_steps: Option<u32>,
}

/// The candidates' directory.
pub(crate) fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/candidates")
}

/// The names of every candidate file (those not starting with `_`), sorted.
pub(crate) fn all() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .expect("proto/candidates")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let stem = name.strip_suffix(".sql")?;
            (!stem.starts_with('_')).then(|| stem.to_string())
        })
        .collect();
    names.sort();
    names
}

impl Candidate {
    /// Reads candidate `name`.
    pub(crate) fn load(name: &str) -> Result<Candidate, String> {
        let path = dir().join(format!("{name}.sql"));
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut about = Vec::new();
        let mut sections: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if let Some(section) = line.strip_prefix("-- @") {
                sections.push((section.trim().to_string(), String::new()));
            } else if let Some((_, body)) = sections.last_mut() {
                body.push_str(line);
                body.push('\n');
            } else if let Some(comment) = line.strip_prefix("--") {
                about.push(comment.trim().to_string());
            }
        }
        // Every section with its includes in place.
        let mut expanded: Vec<(String, String)> = Vec::with_capacity(sections.len());
        for (section, body) in sections {
            let mut text = String::new();
            for line in body.lines() {
                if let Some(file) = line.trim().strip_prefix("@include ") {
                    let included = dir().join(file.trim());
                    text.push_str(
                        &std::fs::read_to_string(&included)
                            .map_err(|e| format!("{}: {e}", included.display()))?,
                    );
                } else {
                    text.push_str(line);
                    text.push('\n');
                }
            }
            expanded.push((section, text));
        }
        let take = |name: &str| {
            expanded
                .iter()
                .find(|(s, _)| s == name)
                .map(|(_, body)| body.trim().to_string())
        };
        let need = |name: &str| take(name).ok_or(format!("{name}.sql has no `-- @{name}`"));
        let setup_text = need("setup")?;
        let migrate = setup_text
            .lines()
            .any(|l| l.trim() == "@gen_durable_schema");
        let setup: String = setup_text
            .lines()
            .filter(|l| l.trim() != "@gen_durable_schema")
            .map(|l| format!("{l}\n"))
            .collect();
        Ok(Candidate {
            about: about.join(" "),
            migrate,
            setup,
            seed: need("seed")?,
            claim: need("claim")?,
            read: take("read"),
            commit: need("commit")?,
            gc: take("gc"),
            tables: need("tables")?
                .split(',')
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect(),
            max_steps: match take("max_steps") {
                Some(n) => Some(
                    n.parse()
                        .map_err(|_| format!("{name}.sql: max_steps {n:?}"))?,
                ),
                None => None,
            },
        })
    }
}
