//! Compile-fail cases, one per misuse (`tests/ui/<error>.rs` + `.stderr`), and
//! cases that must compile (`tests/pass/*.rs`).
//!
//! Regenerate the snapshots with `TRYBUILD=overwrite cargo test -p gen_durable_macros --test ui`
//! and read every `.stderr` before committing it. The snapshots depend on rustc's
//! wording: they were made with the toolchain recorded in `tests/ui/TOOLCHAIN`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/pass/*.rs");
}
