//! What the programs share at their edges: byte counts on the command
//! line, exit statuses and the errors that select them, clap's names for
//! the library's enums, and checking a port before listening on it.

/// Parses a byte count: a plain number, or one with a binary suffix
/// (`K`/`KiB` = 1024, `M`/`MiB`, `G`/`GiB`), e.g. `64M`. Zero is refused.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a byte count (e.g. 1048576, 64K, 1M, 2G)"))?;
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size suffix '{other}' in '{s}' (use K, M or G: powers of 1024)"
            ));
        }
    };
    let v = n
        .checked_mul(mult)
        .ok_or_else(|| format!("'{s}' overflows 64 bits"))?;
    if v == 0 {
        return Err("size must be at least 1 byte".into());
    }
    Ok(v)
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
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("8"), Ok(8));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("-5").is_err());
        assert!(parse_bytes("5X").is_err());
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
/// [`DataMismatch`], 1 otherwise, each line prefixed `[tag]`.
pub fn exit_status(tag: &str, e: &anyhow::Error) -> std::process::ExitCode {
    use std::process::ExitCode;
    if let Some(u) = e.downcast_ref::<UsageError>() {
        print_usage_error(u);
        return ExitCode::from(EXIT_USAGE as u8);
    }
    if let Some(sig) = crate::interrupt::received() {
        eprintln!("[{tag}] {sig}: released memory views, deregistered memory, deleted store keys");
        return ExitCode::from(sig.exit_code() as u8);
    }
    if let Some(m) = e.downcast_ref::<DataMismatch>() {
        eprintln!("[{tag}] error: {m}");
        return ExitCode::from(EXIT_MISMATCH as u8);
    }
    eprintln!("[{tag}] error: {e:#}");
    ExitCode::FAILURE
}

/// Prints a [`UsageError`] like clap does.
pub fn print_usage_error(e: &UsageError) {
    eprintln!("error: {}\n\nFor more information, try '--help'.", e.0);
}

/// Fails with a [`UsageError`] if this process cannot listen on `port`:
/// taken by another process, or privileged (< 1024) for a non-root user.
pub fn check_port_free(port: u16) -> Result<(), UsageError> {
    match std::net::TcpListener::bind(("::", port))
        .or_else(|_| std::net::TcpListener::bind(("0.0.0.0", port)))
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(UsageError(format!(
            "port {port} is already in use (another simple_write initiator, or an earlier run still exiting?): \
             stop it or pick another with --port"
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(UsageError(format!(
            "port {port} is privileged (below 1024) and this process may not listen on it: pick one above 1023 with --port"
        ))),
        Err(e) => Err(UsageError(format!("cannot listen on port {port}: {e}"))),
    }
}

// clap's view of the library's enums: the library itself knows nothing of
// clap (its layers sit below the programs), so the programs' parsers are
// taught the names here, once.
impl clap::ValueEnum for crate::gpu::kernels::Level {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use crate::gpu::kernels::Level;
        let help = match self {
            Level::Thread => "one thread per call; on cuda_ipc its put is a single-thread memcpy",
            Level::Warp => "one warp (32 lanes) per call, every lane with the same arguments",
            Level::Block => "one thread block per call, every thread with the same arguments",
        };
        Some(clap::builder::PossibleValue::new(self.name()).help(help))
    }
}

impl clap::ValueEnum for crate::gpu::kernels::WaitMode {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use crate::gpu::kernels::WaitMode;
        let help = match self {
            WaitMode::Kernel => {
                "a kernel spins on the word (the device-API pattern; different GPUs, or MPS)"
            }
            WaitMode::Stream => {
                "cuStreamWaitValue64, then a one-thread kernel: leaves the GPU free while waiting"
            }
            WaitMode::Auto => "stream when both processes share a GPU without MPS, else kernel",
        };
        Some(clap::builder::PossibleValue::new(self.name()).help(help))
    }
}

impl clap::ValueEnum for crate::gpu::kernels::Path {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use crate::gpu::kernels::Path;
        let help = match self {
            Path::Put => "nixlPut + nixlAtomicAdd: any UCX device transport, RDMA included",
            Path::Store => {
                "nixlGetPtr + 16-byte stores + a release add: NVLink/PCIe peers (cuda_ipc) only"
            }
            Path::Ll => {
                "nixlGetPtr + 16-byte lines {data, seq, data, seq}, no fence or signal: NVLink only"
            }
            Path::Flag => "no data: the bare flag of --floor",
        };
        Some(clap::builder::PossibleValue::new(self.name()).help(help))
    }
}

impl clap::ValueEnum for crate::slots::Coverage {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use crate::slots::Coverage;
        let help = match self {
            Coverage::Full => "every payload byte is written and checked",
            Coverage::Sample => {
                "header plus the first, the last and one sequence-dependent 4 KiB block of each payload; \
                 the rest of a slot keeps older bytes. For measuring the transfer pipeline without the \
                 cost of generating and checking every byte"
            }
        };
        Some(clap::builder::PossibleValue::new(self.name()).help(help))
    }
}
