//! `sqlx::migrate!` embeds the migrations at compile time; without this, adding a migration file would not
//! rebuild booking and the new migration would silently not run.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
