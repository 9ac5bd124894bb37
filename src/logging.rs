//! Diagnostics on stderr through `tracing`; results stay on stdout.
//!
//! Every program here prints two kinds of lines. Results and upstream's
//! progress lines (`[target] ✓ Checksum OK: …`) go to stdout with
//! [`crate::say!`], because scripts read them. Everything else (which GPU,
//! how a side waits, baselines as they are measured, notes and warnings)
//! is a `tracing` event, written to stderr as `[role] message`
//! (`[role] warning: message` above INFO), so that two processes sharing a
//! terminal stay readable. The filter comes from `RUST_LOG` (default
//! `info`): `RUST_LOG=debug` shows more, `RUST_LOG=warn` only problems.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Writes `[role] message` (with `warning:`, `error:`, `debug:` or
/// `trace:` before the message below or above INFO).
struct RoleFormat {
    role: String,
}

impl<S, N> FormatEvent<S, N> for RoleFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(w, "[{}] ", self.role)?;
        match *event.metadata().level() {
            Level::INFO => {}
            Level::WARN => w.write_str("warning: ")?,
            Level::ERROR => w.write_str("error: ")?,
            Level::DEBUG => w.write_str("debug: ")?,
            Level::TRACE => w.write_str("trace: ")?,
        }
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// Routes `tracing` events of this process to stderr as `[role] …`,
/// filtered by `RUST_LOG` (default `info`). Call once, early in `main`;
/// later calls (e.g. a second role in one process) keep the first.
pub fn init(role: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .event_format(RoleFormat {
            role: role.to_string(),
        })
        .try_init();
}

/// Prints a line to stdout and flushes it, so the two processes' lines
/// interleave in order when both write to one terminal or pipe. For
/// results and upstream's progress lines; diagnostics use `tracing`.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut line = format!($($arg)*);
        line.push('\n');
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }};
}

/// Prints a line to stderr in one write ([`crate::cli::eprint_line`]): for
/// the few lines outside `tracing` (a program's last error, a launcher's
/// summary), so that they never mix with another process's.
#[macro_export]
macro_rules! eline {
    ($($arg:tt)*) => {
        $crate::cli::eprint_line(&format!($($arg)*))
    };
}
