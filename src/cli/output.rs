//! Command output on stdout. A reader that went away (`gaffer call … | head -c1`) is not an
//! error worth a panic: the rest of the output is dropped and the command ends as usual.

use std::io::Write;

/// Writes one line to stdout; a broken pipe is ignored, other failures are logged.
pub fn line(text: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => tracing::warn!(error = %e, "stdout write failed"),
    }
}

/// `println!` for command output, quiet on a broken pipe.
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::cli::output::line(format_args!($($t)*))
    };
}
