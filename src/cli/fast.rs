//! The command line of a serving process without building clap's whole command tree.
//!
//! Editors and agent hosts start `gaffer [--workspace DIR] [serve [--lsp|--mcp|--jsonl]]` once
//! per session, and building the tree of every subcommand costs about half of the instructions
//! from exec to the first reply (measured with callgrind: 1.1 M of 2.1 M). This reads exactly
//! those shapes; anything else — another command, `--help`, a repeated or conflicting flag, a
//! value that looks like a flag, an empty one — returns `None`, and clap parses (and reports)
//! it as before. The test below holds both readers to the same result.

use std::ffi::OsString;
use std::path::PathBuf;

use super::{Cli, Command, Global, ServeArgs};

/// `Some` only for a serve invocation clap would read the same way.
pub fn serve_invocation(args: &[OsString]) -> Option<Cli> {
    let mut global = Global {
        workspace: None,
        log_file: None,
        log_level: None,
        patterns_policy: None,
    };
    let mut serve: Option<ServeArgs> = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let text = arg.to_str()?;
        if text == "serve" && serve.is_none() {
            serve = Some(ServeArgs::default());
            continue;
        }
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (text, None),
        };
        match name {
            "--workspace" | "--log-file" | "--log-level" | "--patterns-policy" => {
                let value = match inline {
                    Some(v) => v,
                    None => it.next()?.to_str()?,
                };
                if value.is_empty() || value.starts_with('-') {
                    return None;
                }
                let slot_taken = match name {
                    "--workspace" => set(&mut global.workspace, PathBuf::from(value)),
                    "--log-file" => set(&mut global.log_file, PathBuf::from(value)),
                    "--log-level" => set(&mut global.log_level, value.to_string()),
                    _ => set(&mut global.patterns_policy, PathBuf::from(value)),
                };
                if slot_taken {
                    return None;
                }
            }
            "--lsp" | "--jsonl" | "--mcp" if inline.is_none() => {
                let s = serve.as_mut()?;
                if s.lsp || s.jsonl || s.mcp {
                    return None;
                }
                match name {
                    "--lsp" => s.lsp = true,
                    "--jsonl" => s.jsonl = true,
                    _ => s.mcp = true,
                }
            }
            _ => return None,
        }
    }
    Some(Cli {
        global,
        command: serve.map(Command::Serve),
    })
}

/// Fills an empty slot; `true` when it was already taken (clap refuses a repeated flag).
fn set<T>(slot: &mut Option<T>, value: T) -> bool {
    if slot.is_some() {
        return true;
    }
    *slot = Some(value);
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use proptest::prelude::*;

    fn both(args: &[&str]) -> (Option<String>, Option<String>) {
        let os: Vec<OsString> = args.iter().map(OsString::from).collect();
        let fast = serve_invocation(&os).map(|c| format!("{c:?}"));
        let full = Cli::try_parse_from(std::iter::once("gaffer").chain(args.iter().copied()))
            .ok()
            .map(|c| format!("{c:?}"));
        (fast, full)
    }

    #[test]
    fn the_shapes_hosts_use_read_as_clap_reads_them() {
        for args in [
            &[][..],
            &["serve"],
            &["serve", "--lsp"],
            &["--workspace", "/w", "serve", "--mcp"],
            &["serve", "--jsonl", "--workspace=/w", "--log-level", "debug"],
            &["--log-file", "/tmp/g.log", "--patterns-policy", "p.yaml"],
        ] {
            let (fast, full) = both(args);
            assert!(fast.is_some(), "{args:?} should take the fast path");
            assert_eq!(fast, full, "{args:?}");
        }
    }

    #[test]
    fn everything_else_is_left_to_clap() {
        for args in [
            &["--help"][..],
            &["serve", "--lsp", "--mcp"],
            &["--lsp"],
            &["serve", "serve"],
            &["--workspace"],
            &["--workspace", "--lsp", "serve"],
            &["--workspace", "a", "--workspace", "b"],
            &["--workspace="],
            &["serve", "--lsp=yes"],
            &["doctor"],
            &["store", "verify"],
            &["-V"],
        ] {
            let os: Vec<OsString> = args.iter().map(OsString::from).collect();
            assert!(serve_invocation(&os).is_none(), "{args:?}");
        }
    }

    fn token() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("serve".to_string()),
            Just("--lsp".to_string()),
            Just("--jsonl".to_string()),
            Just("--mcp".to_string()),
            Just("--workspace".to_string()),
            Just("--log-level".to_string()),
            Just("--log-file".to_string()),
            Just("--patterns-policy".to_string()),
            Just("--workspace=/x".to_string()),
            Just("--lsp=1".to_string()),
            Just("doctor".to_string()),
            Just("-".to_string()),
            Just("--".to_string()),
            Just("".to_string()),
            "[a-z/.]{1,6}",
            "-[a-z]{1,3}",
        ]
    }

    proptest! {
        /// Whenever the fast path answers, clap accepts the same words and reads them the same.
        #[test]
        fn the_fast_path_never_disagrees_with_clap(args in prop::collection::vec(token(), 0..7)) {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let (fast, full) = both(&refs);
            if fast.is_some() {
                prop_assert_eq!(fast, full, "{:?}", refs);
            }
        }
    }
}
