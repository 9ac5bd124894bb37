//! What the programs share at their edges: byte counts on the command
//! line, exit statuses and the errors that select them, the store backend
//! switch, and checking a port before listening on it.

use crate::store;

/// Parses a byte count: a whole number, or one with a binary suffix
/// (`K`/`KiB` = 1024, `M`/`MiB`, `G`/`GiB`, `T`/`TiB`) and then possibly a
/// fraction that makes whole bytes (`1.5M` = 1572864). Zero is refused,
/// and so is a count over 64 bits. The one byte-size parser of every
/// program here.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let not_a_count = || format!("'{s}' is not a byte count (e.g. 1048576, 64K, 1.5M, 2G)");
    if num.is_empty() || num == "." {
        return Err(not_a_count());
    }
    let shift: u32 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        other => {
            return Err(format!(
                "unknown size suffix '{other}' in '{s}' (use K, M, G or T: powers of 1024)"
            ));
        }
    };
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if frac.contains('.') {
        return Err(not_a_count());
    }
    let too_large = || format!("'{s}' is more bytes than 64 bits can count");
    // Digits only (checked above), so a failed parse is an overflow.
    let w: u128 = match whole {
        "" => 0,
        w => w.parse().map_err(|_| too_large())?,
    };
    let mut v = w.checked_mul(1 << shift).ok_or_else(too_large)?;
    if !frac.is_empty() {
        // The fraction of the unit, exactly: digits / 10^len of 2^shift bytes.
        let digits: u128 = frac
            .get(..30)
            .unwrap_or(frac)
            .parse()
            .map_err(|_| not_a_count())?;
        let scale = 10u128.pow(frac.len().min(30) as u32);
        let part = digits * (1u128 << shift);
        if part % scale != 0 || frac.len() > 30 {
            return Err(format!("'{s}' is not a whole number of bytes"));
        }
        v += part / scale;
    }
    let v = u64::try_from(v).map_err(|_| too_large())?;
    if v == 0 {
        return Err("size must be at least 1 byte".into());
    }
    Ok(v)
}

/// [`parse_bytes`] limited to `min..=max` bytes, for clap's
/// `value_parser`: the message names the bounds in bytes and units.
pub fn bytes_between(
    min: u64,
    max: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |s| {
        let v = parse_bytes(s)?;
        if v < min || v > max {
            return Err(format!(
                "{v} bytes is outside {}..={} ({}..={})",
                min,
                max,
                fmt_bytes(min),
                fmt_bytes(max)
            ));
        }
        Ok(v)
    }
}

/// The longest `--timeout` any program accepts: a day.
pub const MAX_TIMEOUT_S: f64 = 86_400.0;

/// Parses `--timeout`: seconds, whole or not (`30`, `0.5`), more than 0
/// and at most a day. The one timeout parser of every program here.
pub fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds (e.g. 30, 0.5)"))?;
    if !(v > 0.0 && v <= MAX_TIMEOUT_S) {
        return Err(format!(
            "a timeout must be more than 0 and at most {MAX_TIMEOUT_S} seconds (got {s})"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(v))
}

/// A timeout as [`parse_timeout`] reads it back (`30`, `0.5`): what a
/// parent passes its child processes.
pub fn fmt_timeout(d: std::time::Duration) -> String {
    d.as_secs_f64().to_string()
}

/// Checks that `need` bytes of host memory (named `what`) fit in what this
/// machine has available now (`MemAvailable` of /proc/meminfo), before any
/// is allocated: a usage error with both numbers and the fix otherwise.
/// Machines without /proc/meminfo are not checked.
pub fn check_host_memory(need: u64, what: &str, fix: &str) -> Result<(), UsageError> {
    let Some(avail) = available_memory() else {
        return Ok(());
    };
    if need > avail {
        return Err(UsageError(format!(
            "{what} need {} ({need} bytes) of host memory, but this machine has {} available: {fix}",
            fmt_gib(need),
            fmt_gib(avail)
        )));
    }
    Ok(())
}

/// `MemAvailable` of /proc/meminfo, in bytes.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

fn fmt_gib(n: u64) -> String {
    format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64)
}

/// Formats a byte count compactly (`1 MiB`, `8 B`).
pub fn fmt_bytes(n: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{} {unit}", n >> shift);
        }
    }
    format!("{n} B")
}

#[cfg(test)]
mod tests {
    #[test]
    fn open_through_the_backend_switch() {
        use super::StoreBackend;
        let opts = crate::store::StoreOptions {
            host: "127.0.0.1".into(),
            port: 0,
            is_server: true,
            num_workers: None,
            wait_workers: false,
            timeout: std::time::Duration::from_secs(2),
        };
        let host = StoreBackend::Native.open(&opts).unwrap();
        host.set("k", b"v").unwrap();
        assert_eq!(host.get("k").unwrap(), b"v");
        #[cfg(not(feature = "libtorch"))]
        assert!(matches!(
            StoreBackend::Libtorch.open(&opts),
            Err(crate::store::StoreError::Invalid(_))
        ));
    }

    use super::*;

    #[test]
    fn timeouts() {
        use std::time::Duration;
        assert_eq!(parse_timeout("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("0.5"), Ok(Duration::from_millis(500)));
        for bad in ["0", "-1", "86401", "nan", "inf"] {
            assert!(
                parse_timeout(bad)
                    .unwrap_err()
                    .contains("more than 0 and at most 86400"),
                "{bad}"
            );
        }
        assert!(
            parse_timeout("x")
                .unwrap_err()
                .contains("not a number of seconds")
        );
        assert_eq!(fmt_timeout(Duration::from_millis(500)), "0.5");
        assert_eq!(
            parse_timeout(&fmt_timeout(Duration::from_secs(30))),
            Ok(Duration::from_secs(30))
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("8"), Ok(8));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("-5").unwrap_err().contains("not a byte count"));
        assert!(parse_bytes("5X").is_err());
        assert_eq!(parse_bytes("1.5M"), Ok(3 << 19));
        assert_eq!(parse_bytes("0.5K"), Ok(512));
        assert_eq!(
            parse_bytes("16E").unwrap_err(),
            "unknown size suffix 'e' in '16E' (use K, M, G or T: powers of 1024)"
        );
        assert!(
            parse_bytes("1.5")
                .unwrap_err()
                .contains("whole number of bytes")
        );
        assert!(
            parse_bytes("1.2.3M")
                .unwrap_err()
                .contains("not a byte count")
        );
        assert!(parse_bytes(".").unwrap_err().contains("not a byte count"));
        for huge in [
            "99999999999999999999",
            "18446744073709551616",
            "17179869184G",
            "1".repeat(60).as_str(),
        ] {
            assert!(parse_bytes(huge).unwrap_err().contains("64 bits"), "{huge}");
        }
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        assert!(
            bytes_between(1, 1 << 30)("2G")
                .unwrap_err()
                .contains("1 GiB")
        );
        assert_eq!(bytes_between(1, 1 << 30)("1M"), Ok(1 << 20));
        assert_eq!(fmt_bytes(64 << 20), "64 MiB");
        assert_eq!(fmt_bytes(1000), "1000 B");
    }
}

/// An argument that cannot work on this machine or with the others given
/// (port taken, GPU missing, size too large…). Binaries print it the way
/// clap prints its own errors and exit with [`EXIT_USAGE`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A store error in the words of a program whose store is set by
/// `--host`, `--port` and `--timeout`: the store's own message (host, port,
/// operation, key, cause) and then the flag or step that fixes it. A taken
/// port is a [`UsageError`] (exit 2); the rest exit 1. Programs with more
/// to say (which of their processes hosts the store) match the error first.
pub fn store_error(e: store::StoreError) -> anyhow::Error {
    use store::StoreError as E;
    let fix = match &e {
        E::Bind { .. } => {
            return anyhow::Error::new(UsageError(format!(
                "{e}: stop it or pick another with --port"
            )));
        }
        E::UnknownHost { source, .. } => return anyhow::anyhow!("{e} (check --host): {source}"),
        E::Unreachable { .. } => {
            "start the process that hosts the store first, or check --host/--port"
        }
        E::Timeout { .. } => "is the peer running, and on the same --host/--port?",
        E::WorkersTimeout { .. } => "start the peer process, or raise --timeout",
        E::NoReply { .. } => "raise --timeout if the store is only slow",
        _ => return anyhow::Error::new(e),
    };
    anyhow::anyhow!("{e}; {fix}")
}

/// Exit status for bad arguments, as clap uses.
pub const EXIT_USAGE: i32 = 2;

/// A data verification failure. Programs exit with [`EXIT_MISMATCH`] for
/// it, so scripts can tell wrong data from other failures.
#[derive(Debug, thiserror::Error)]
#[error("data mismatch: {0}")]
pub struct DataMismatch(pub String);

/// Exit status for a run whose data did not verify.
pub const EXIT_MISMATCH: i32 = 3;

/// A program's exit status for an error, after its last line on stderr:
/// 2 for a [`UsageError`] (printed as clap prints its own), 130/143 when
/// the run was interrupted (whatever the error chain says), 3 for a
/// [`DataMismatch`] (also found anywhere in the error's chain), 1
/// otherwise, each line prefixed `[tag]`. The one way every program here
/// turns an error into its exit; each message is one write, so the lines
/// of processes sharing a terminal never mix.
pub fn exit_status(tag: &str, e: &anyhow::Error) -> std::process::ExitCode {
    use std::process::ExitCode;
    if let Some(u) = e.downcast_ref::<UsageError>() {
        print_usage_error(u);
        return ExitCode::from(EXIT_USAGE as u8);
    }
    if let Some(sig) = crate::interrupt::received() {
        crate::eline!(
            "[{tag}] {sig}: released memory views, deregistered memory, deleted store keys"
        );
        return ExitCode::from(sig.exit_code() as u8);
    }
    if e.chain().any(|c| c.is::<DataMismatch>()) {
        crate::eline!("[{tag}] error: {e:#}");
        return ExitCode::from(EXIT_MISMATCH as u8);
    }
    crate::eline!("[{tag}] error: {e:#}");
    ExitCode::FAILURE
}

/// Prints a [`UsageError`] like clap does, in one write.
pub fn print_usage_error(e: &UsageError) {
    crate::eline!("error: {}\n\nFor more information, try '--help'.", e.0);
}

/// Writes `text` and a newline to stderr in one write, so that lines of
/// processes sharing a terminal never interleave mid-line (`eprintln!`
/// writes each formatted piece separately). [`crate::eline!`] formats.
pub fn eprint_line(text: &str) {
    use std::io::Write as _;
    let mut line = String::with_capacity(text.len() + 1);
    line.push_str(text);
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Fails with a [`UsageError`] if this process cannot listen on `port`:
/// taken by another process, or privileged (< 1024) for a non-root user.
pub fn check_port_free(port: u16) -> Result<(), UsageError> {
    match std::net::TcpListener::bind(("::", port))
        .or_else(|_| std::net::TcpListener::bind(("0.0.0.0", port)))
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(UsageError(format!(
            "port {port} is already in use (by another program, or an earlier run still exiting): \
             stop it or pick another with --port"
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(UsageError(format!(
            "port {port} is privileged (below 1024) and this process may not listen on it: pick one above 1023 with --port"
        ))),
        Err(e) => Err(UsageError(format!("cannot listen on port {port}: {e}"))),
    }
}

/// Which TCPStore implementation a program hosts or joins (`--store`): the
/// one backend switch of every program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreBackend {
    /// The Rust TCPStore (torch's c10d wire protocol; the tcpstore crate).
    #[default]
    Native,
    /// torch's own c10d::TCPStore (binary built with --features libtorch).
    Libtorch,
}

impl StoreBackend {
    /// The `--store` value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Libtorch => "libtorch",
        }
    }

    /// Opens this store, as server or client per `opts.is_server`.
    ///
    /// Errors: as [`store::native::TcpStore::open`] (port taken, no server,
    /// a silent one, peers not joining); [`store::StoreError::Invalid`] if
    /// the libtorch store was not compiled in.
    pub fn open(
        self,
        opts: &store::StoreOptions,
    ) -> Result<Box<dyn store::Store>, store::StoreError> {
        match self {
            Self::Native => Ok(Box::new(store::native::TcpStore::open(opts)?)),
            #[cfg(feature = "libtorch")]
            Self::Libtorch => Ok(Box::new(store::libtorch::TorchStore::open(opts)?)),
            #[cfg(not(feature = "libtorch"))]
            Self::Libtorch => Err(store::StoreError::Invalid(
                "this binary was built without the libtorch store: rebuild with `--features libtorch`"
                    .into(),
            )),
        }
    }
}
