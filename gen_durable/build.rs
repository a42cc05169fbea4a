//! Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds the folder at
//! compile time, and cargo does not otherwise watch it.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
