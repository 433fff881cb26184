//! Lays out the functions a serving process runs at start together (link/startup.order), so
//! an idle server maps the pages of those functions instead of pages all over the text:
//! fault-around maps 64 KiB around every first touch, and the ~700 functions of start-up are
//! otherwise spread over ~66 such regions.
//!
//! Only for optimised builds on x86_64 Linux with Rust >= 1.90, whose default linker there is
//! LLD (`--symbol-ordering-file`); `GAFFER_NO_LINK_ORDER=1` turns it off (e.g. with another
//! linker configured). Names the file lacks or no longer matches are ignored by the linker.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=link/startup.order");
    println!("cargo:rerun-if-env-changed=GAFFER_NO_LINK_ORDER");
    let wanted = std::env::var("PROFILE").is_ok_and(|p| p == "release")
        && std::env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu")
        && std::env::var_os("GAFFER_NO_LINK_ORDER").is_none_or(|v| v == "0")
        && rustc_minor().is_some_and(|m| m >= 90);
    let Some(root) = std::env::var_os("CARGO_MANIFEST_DIR") else {
        return;
    };
    let order = Path::new(&root).join("link/startup.order");
    if wanted && order.is_file() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={},--no-warn-symbol-ordering",
            order.display()
        );
    }
}

/// The minor version of the compiler building this crate (`rustc 1.95.0 (...)` → 95).
fn rustc_minor() -> Option<u32> {
    let rustc = std::env::var_os("RUSTC")?;
    let out = Command::new(rustc).arg("--version").output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.split_whitespace()
        .nth(1)?
        .split('.')
        .nth(1)?
        .parse()
        .ok()
}
