//! A simulated node's disk (tests and demos only). The io check does real file I/O on the host
//! even beside simulated GPUs; `disk=` makes that I/O meet the error a failing disk gives, at
//! the call where the kernel would give it, so the check classifies it exactly as it does a
//! real one:
//!
//! - `disk=eio@read`: the first read of the first file fails with EIO (a failing NVMe's
//!   uncorrectable read); `eio@write` and `eio@fsync` fail its first write or its flush;
//! - `disk=short@read`: the first read of the first file comes back with half the bytes and
//!   the file ends there (written data lost);
//! - `disk=full@write`: the first write fails with ENOSPC (something else filled the
//!   filesystem): not the disk's fault, the contrast the tests need.
//!
//! The fault fires once per run, on file 0 at offset 0; every other call is the real one.

use std::fmt;
use std::io;
use std::str::FromStr;

/// The call a fault is planted at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskOp {
    Write,
    Fsync,
    Read,
}

/// What the call gets instead of its real outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFaultKind {
    /// EIO: the device failed the operation.
    Eio,
    /// The read returns half the block and the file ends there.
    Short,
    /// ENOSPC: the filesystem is full.
    Full,
}

/// `disk=<kind>@<op>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskFault {
    pub kind: DiskFaultKind,
    pub op: DiskOp,
}

impl DiskFault {
    /// The error the planted call returns instead of its own: Some for `op` on file 0 at
    /// offset 0 when this fault is an errno planted at `op`.
    pub fn error_at(&self, op: DiskOp, file: u32, offset: u64) -> Option<io::Error> {
        if op != self.op || file != 0 || offset != 0 {
            return None;
        }
        match self.kind {
            DiskFaultKind::Eio => Some(io::Error::from_raw_os_error(libc::EIO)),
            DiskFaultKind::Full => Some(io::Error::from_raw_os_error(libc::ENOSPC)),
            DiskFaultKind::Short => None,
        }
    }

    /// How many of `got` bytes a read of `file` at `offset` returns: half of them where a
    /// short read is planted there, else all.
    pub fn bytes_read(&self, file: u32, offset: u64, got: usize) -> usize {
        if self.kind == DiskFaultKind::Short && self.op == DiskOp::Read && file == 0 && offset == 0
        {
            got / 2
        } else {
            got
        }
    }
}

impl FromStr for DiskFault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, op) = s
            .split_once('@')
            .ok_or_else(|| format!("expected kind@op (eio@read), got {s:?}"))?;
        let kind = match kind {
            "eio" => DiskFaultKind::Eio,
            "short" => DiskFaultKind::Short,
            "full" => DiskFaultKind::Full,
            _ => {
                return Err(format!(
                    "unknown disk fault {kind:?}: use eio, short or full"
                ));
            }
        };
        let op = match op {
            "read" => DiskOp::Read,
            "write" => DiskOp::Write,
            "fsync" => DiskOp::Fsync,
            _ => {
                return Err(format!(
                    "unknown disk call {op:?}: use read, write or fsync"
                ));
            }
        };
        match (kind, op) {
            (DiskFaultKind::Short, DiskOp::Read) | (DiskFaultKind::Eio, _) => {}
            (DiskFaultKind::Full, DiskOp::Write) => {}
            _ => return Err(format!("{s:?}: short is planted at read, full at write")),
        }
        Ok(DiskFault { kind, op })
    }
}

impl fmt::Display for DiskFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            DiskFaultKind::Eio => "eio",
            DiskFaultKind::Short => "short",
            DiskFaultKind::Full => "full",
        };
        let op = match self.op {
            DiskOp::Read => "read",
            DiskOp::Write => "write",
            DiskOp::Fsync => "fsync",
        };
        write!(f, "{kind}@{op}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_reads_back_as_written_and_bad_ones_say_what_to_use() {
        for s in [
            "eio@read",
            "eio@write",
            "eio@fsync",
            "short@read",
            "full@write",
        ] {
            let f: DiskFault = s.parse().expect(s);
            assert_eq!(f.to_string(), s);
        }
        for (s, says) in [
            ("eio", "kind@op"),
            ("bad@read", "eio, short or full"),
            ("eio@open", "read, write or fsync"),
            ("short@write", "short is planted at read"),
            ("full@read", "full at write"),
        ] {
            let e = s.parse::<DiskFault>().expect_err(s);
            assert!(e.contains(says), "{s}: {e}");
        }
    }

    #[test]
    fn it_fires_once_at_the_first_file_s_first_call_of_its_kind() {
        let eio: DiskFault = "eio@read".parse().expect("a fault");
        let e = eio.error_at(DiskOp::Read, 0, 0).expect("planted");
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert!(eio.error_at(DiskOp::Read, 0, 4096).is_none());
        assert!(eio.error_at(DiskOp::Read, 1, 0).is_none());
        assert!(eio.error_at(DiskOp::Write, 0, 0).is_none());
        assert_eq!(eio.bytes_read(0, 0, 100), 100, "an errno, not a short read");
        let full: DiskFault = "full@write".parse().expect("a fault");
        let e = full.error_at(DiskOp::Write, 0, 0).expect("planted");
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        let short: DiskFault = "short@read".parse().expect("a fault");
        assert!(short.error_at(DiskOp::Read, 0, 0).is_none());
        assert_eq!(short.bytes_read(0, 0, 100), 50);
        assert_eq!(short.bytes_read(0, 8, 100), 100);
        assert_eq!(short.bytes_read(2, 0, 100), 100);
    }
}
