//! The documentation's shape: a README a newcomer reads in one sitting, user docs that
//! speak of semantics (no commit hashes), links that lead somewhere, and code that
//! compiles: the README's tour is compiled by `cargo test --doc -p gen_durable`
//! (`ReadmeTour` in the crate root), and every Rust block of the guide is found, word for
//! word, in `tests/guide_snippets.rs` or an example, which compile.

use std::path::{Path, PathBuf};

/// The README's budget, in lines.
const README_LINES: usize = 400;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Markdown files of a directory, not recursing.
fn markdown_in(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.sort();
    files
}

/// What users read: the README, the changelog and the guide.
fn user_docs() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md"), root().join("CHANGELOG.md")];
    files.extend(markdown_in("docs/guide"));
    files
}

/// `` `1a2b3c4` ``-like words: 7 to 40 hex digits, at least one a digit and one a letter
/// (a hash of digits alone reads as a number, and is let through).
fn commit_hashes(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| {
            (7..=40).contains(&w.len())
                && w.chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
                && w.chars().any(|c| c.is_ascii_digit())
                && w.chars().any(|c| c.is_ascii_alphabetic())
        })
        .map(String::from)
        .collect()
}

/// The relative targets of `[text](target)` links, without their `#fragment`.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or_default();
        let external = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !external && !target.contains(' ') {
            links.push(target.to_string());
        }
    }
    links
}

#[test]
fn the_readme_stays_within_its_budget() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(
        lines <= README_LINES,
        "README.md has {lines} lines, its budget is {README_LINES}: move the detail to a \
         topic of docs/guide/"
    );
}

#[test]
fn user_docs_name_no_commit() {
    for file in user_docs() {
        let hashes = commit_hashes(&read(&file));
        assert!(
            hashes.is_empty(),
            "{} names commits {hashes:?}: user docs state what holds now; dated runs go \
             to gen_durable_bench/results/",
            file.display()
        );
    }
}

#[test]
fn every_relative_link_leads_to_a_file() {
    let mut files = user_docs();
    files.extend(markdown_in("docs/design"));
    files.push(root().join("CONTRIBUTING.md"));
    let mut broken = Vec::new();
    for file in &files {
        let dir = file.parent().expect("a parent directory");
        for link in relative_links(&read(file)) {
            if !dir.join(&link).exists() {
                broken.push(format!("{}: {link}", file.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The blocks of a Markdown text in one language (` ```rust `, with or without
/// attributes such as `,no_run`).
fn blocks(text: &str, language: &str) -> Vec<String> {
    let fence = format!("```{language}");
    let mut blocks = Vec::new();
    let mut block: Option<String> = None;
    for line in text.lines() {
        match &mut block {
            None if line.starts_with(&fence)
                && !line[fence.len()..].starts_with(|c: char| c.is_alphanumeric()) =>
            {
                block = Some(String::new())
            }
            Some(b) if line.starts_with("```") => {
                blocks.push(std::mem::take(b));
                block = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// The commands of a shell block, as the shell reads them: a line ending in `\\` goes on
/// the next, a `#` after a blank starts a comment, whitespace runs count as one space.
fn shell_commands(block: &str) -> Vec<String> {
    let joined = block.replace("\\\n", " ");
    joined
        .lines()
        .map(|line| {
            let comment = line
                .match_indices('#')
                .map(|(at, _)| at)
                .find(|&at| at == 0 || line[..at].ends_with(char::is_whitespace));
            spaced(comment.map_or(line, |at| &line[..at]))
        })
        .filter(|command| !command.is_empty())
        .collect()
}

/// The text with each run of whitespace made one space, trimmed.
fn spaced(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether a line of `.ci/run` runs `command` whole: the line is the command, ends with
/// it after a wrapper (`timeout 300 …`), or quotes it for a helper (`serves 4000 '…'`).
fn runs(line: &str, command: &str) -> bool {
    line == command
        || line.ends_with(&format!(" {command}"))
        || line.contains(&format!("'{command}'"))
}

#[test]
fn every_shell_command_of_the_readme_and_the_guide_runs_in_ci() {
    let ci: Vec<String> = shell_commands(&read(&root().join(".ci/run")));
    let mut docs = vec![root().join("README.md")];
    docs.extend(markdown_in("docs/guide"));
    let mut not_run = Vec::new();
    for file in &docs {
        for block in blocks(&read(file), "sh") {
            for command in shell_commands(&block) {
                if !ci.iter().any(|line| runs(line, &command)) {
                    not_run.push(format!("{}: {command}", file.display()));
                }
            }
        }
    }
    assert!(
        not_run.is_empty(),
        "shell commands users are told to run that .ci/run does not run as written (run \
         each there, word for word, or move it to docs/design/):\n{}",
        not_run.join("\n")
    );
}

/// The text without its whitespace: rustfmt may lay a compiled snippet out otherwise.
fn words(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

#[test]
fn every_rust_block_of_the_guide_compiles() {
    let suite = root().join("gen_durable_suite");
    let mut compiled = vec![read(&suite.join("tests/guide_snippets.rs"))];
    for example in std::fs::read_dir(suite.join("examples")).expect("the examples") {
        let path = example.expect("an example").path();
        if path.extension().is_some_and(|x| x == "rs") {
            compiled.push(read(&path));
        }
    }
    let compiled: Vec<String> = compiled.iter().map(|c| words(c)).collect();
    let mut missing = Vec::new();
    for file in markdown_in("docs/guide") {
        for block in blocks(&read(&file), "rust") {
            if !compiled.iter().any(|c| c.contains(&words(&block))) {
                missing.push(format!("{}:\n{block}", file.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "Rust blocks of the guide that no compiled file holds (put each, word for word, \
         in gen_durable_suite/tests/guide_snippets.rs):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_checks_see_what_they_check() {
    assert_eq!(
        blocks(
            "a\n```rust\nlet x = 1;\n```\n```sh\nls\n```\n```rust,no_run\ny\n```\n```rustc\nz\n```\n",
            "rust"
        ),
        ["let x = 1;\n", "y\n"]
    );
    assert_eq!(
        shell_commands("a  b   # why\n# alone\nX=$(c) d \\\n  --e f\ng#h # i\n\n"),
        ["a b", "X=$(c) d --e f", "g#h"]
    );
    assert!(runs(
        "timeout 300 cargo run --example checkout",
        "cargo run --example checkout"
    ));
    assert!(runs("serves 4000 'a --b c'", "a --b c"));
    assert!(!runs(
        "cargo run --example checkout -- 5",
        "cargo run --example checkout"
    ));
    assert!(!runs("xcargo test", "cargo test"));
    assert_eq!(words(" a  b\n c "), "abc");
    assert_eq!(
        commit_hashes("at `b23bd38`, `a510311` and `cafe`"),
        ["b23bd38", "a510311"]
    );
    assert!(commit_hashes("`gd_instances` `1000000` `deadbeef`").is_empty());
    assert_eq!(
        relative_links("[a](x.md#top) [b](https://e.org) [c](../y/) [d](#here)"),
        ["x.md", "../y/"]
    );
}
