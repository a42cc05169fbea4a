//! Compile-fail cases, one per misuse (`tests/ui/<error>.rs` + `.stderr`). The cases that
//! must compile (`tests/pass/*.rs`) are test targets of their own (`pass_*` in Cargo.toml),
//! built and run by `cargo test`: with compile-fail cases only, trybuild checks
//! (`cargo check`) rather than builds the engine.
//!
//! Regenerate the snapshots with `TRYBUILD=overwrite cargo test -p gen_durable_macros --test ui`
//! and read every `.stderr` before committing it. The snapshots depend on rustc's
//! wording: they were made with the toolchain recorded in `tests/ui/TOOLCHAIN`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
