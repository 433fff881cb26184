//! Lays out the functions a serving process runs at start together (link/startup.order), so
//! an idle server maps the pages of those functions instead of pages all over the text:
//! fault-around maps 64 KiB around every first touch, and the ~700 functions of start-up are
//! otherwise spread over ~66 such regions.
//!
//! Only for optimised builds on x86_64 Linux with Rust >= 1.90, whose default linker there is
//! LLD (`--symbol-ordering-file`); `GAFFER_NO_LINK_ORDER=1` turns it off (e.g. with another
//! linker configured). Names the file lacks or no longer matches are ignored by the linker.
//!
//! The same builds pack their ~11,000 relative relocations as RELR (`-z pack-relative-relocs`:
//! 270 KiB of RELA become ~5 KiB the loader reads and maps at every start, ~0.1 ms of each
//! start measured 2026-12-03) when the building machine's glibc is 2.36 or newer: the binary
//! then needs that glibc's loader (`GLIBC_ABI_DT_RELR`), which an older one refuses by name.

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
    if wanted && glibc_minor().is_some_and(|m| m >= 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// The minor version of this machine's glibc (`getconf GNU_LIBC_VERSION` → `glibc 2.36` → 36);
/// `None` on another C library or when it cannot be asked.
fn glibc_minor() -> Option<u32> {
    let out = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.trim().strip_prefix("glibc ")?;
    let (major, rest) = version.split_once('.')?;
    if major != "2" {
        return None;
    }
    rest.split('.').next()?.parse().ok()
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
