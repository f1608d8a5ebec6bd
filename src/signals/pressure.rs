//! Pressure stall information (PSI): `/proc/pressure/{memory,cpu,io}` and a cgroup's
//! `memory.pressure`. These are extra signals for operators and notifiers; eviction
//! thresholds never read them.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::{FileError, FileProblem};
use super::fileio::with_file_text;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PressureResource {
    Memory,
    Cpu,
    Io,
}

impl PressureResource {
    pub const ALL: [PressureResource; 3] = [
        PressureResource::Memory,
        PressureResource::Cpu,
        PressureResource::Io,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            PressureResource::Memory => "memory",
            PressureResource::Cpu => "cpu",
            PressureResource::Io => "io",
        }
    }
}

impl fmt::Display for PressureResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `some`: at least one task stalled; `full`: all non-idle tasks stalled at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PressureKind {
    Some,
    Full,
}

impl fmt::Display for PressureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PressureKind::Some => "some",
            PressureKind::Full => "full",
        })
    }
}

/// Whose stalls a reading measures: the whole machine or one cgroup (relative path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PressureScope {
    Node,
    Cgroup(PathBuf),
}

impl fmt::Display for PressureScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PressureScope::Node => f.write_str("node"),
            PressureScope::Cgroup(path) => write!(f, "cgroup {}", path.display()),
        }
    }
}

/// One line of a PSI file. The averages are percentages of wall time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PressureReading {
    pub scope: PressureScope,
    pub resource: PressureResource,
    pub kind: PressureKind,
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    pub total_microseconds: u64,
}

/// Parse a PSI file's text, appending one reading per line. A file without a single
/// well-formed line is an error; so is any malformed line, since it means the format changed.
pub fn parse_pressure(
    text: &str,
    resource: PressureResource,
    scope: &PressureScope,
    out: &mut Vec<PressureReading>,
) -> Result<(), FileProblem> {
    let start = out.len();
    // A line cut short could hold the first digits of a larger total or average.
    if super::parse::is_cut_short(text) {
        return Err(super::parse::cut_short(text));
    }
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        match parse_line(line, resource, scope) {
            Ok(reading) => out.push(reading),
            Err(problem) => {
                out.truncate(start);
                return Err(problem);
            }
        }
    }
    if out.len() == start {
        return Err(FileProblem::Malformed("no pressure lines".into()));
    }
    Ok(())
}

fn parse_line(
    line: &str,
    resource: PressureResource,
    scope: &PressureScope,
) -> Result<PressureReading, FileProblem> {
    let malformed = |why: &str| FileProblem::Malformed(format!("{why} in line {line:?}"));
    let mut fields = line.split_ascii_whitespace();
    let kind = match fields.next() {
        Some("some") => PressureKind::Some,
        Some("full") => PressureKind::Full,
        _ => return Err(malformed("expected `some` or `full`")),
    };
    let (mut avg10, mut avg60, mut avg300, mut total) = (None, None, None, None);
    for field in fields {
        let (key, value) = field
            .split_once('=')
            .ok_or_else(|| malformed("expected key=value"))?;
        let average = || {
            value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| malformed("bad average"))
        };
        match key {
            "avg10" => avg10 = Some(average()?),
            "avg60" => avg60 = Some(average()?),
            "avg300" => avg300 = Some(average()?),
            "total" => total = Some(value.parse().map_err(|_| malformed("bad total"))?),
            // Newer kernels may add fields; ignoring them keeps old agents working.
            _ => {}
        }
    }
    match (avg10, avg60, avg300, total) {
        (Some(avg10), Some(avg60), Some(avg300), Some(total_microseconds)) => Ok(PressureReading {
            scope: scope.clone(),
            resource,
            kind,
            avg10,
            avg60,
            avg300,
            total_microseconds,
        }),
        _ => Err(malformed("missing avg10, avg60, avg300 or total")),
    }
}

/// Whether a PSI file exists and can be read, as opposed to PSI being absent from the kernel
/// (no file) or disabled at boot (reads fail with EOPNOTSUPP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PressureFile {
    Read,
    Unavailable,
}

pub(crate) fn read_pressure_file(
    path: &Path,
    resource: PressureResource,
    scope: &PressureScope,
    out: &mut Vec<PressureReading>,
) -> Result<PressureFile, FileError> {
    match with_file_text(path, |text| parse_pressure(text, resource, scope, out)) {
        Ok(()) => Ok(PressureFile::Read),
        Err(problem) if psi_unavailable(&problem.problem) => Ok(PressureFile::Unavailable),
        Err(problem) => Err(problem),
    }
}

pub(crate) fn psi_unavailable(problem: &FileProblem) -> bool {
    match problem {
        FileProblem::Io(e) => {
            e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::EOPNOTSUPP)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<PressureReading>, FileProblem> {
        let mut out = Vec::new();
        parse_pressure(
            text,
            PressureResource::Memory,
            &PressureScope::Node,
            &mut out,
        )?;
        Ok(out)
    }

    #[test]
    fn parses_some_and_full_lines() {
        let readings = parse(
            "some avg10=1.53 avg60=0.87 avg300=0.20 total=123456\nfull avg10=0.50 avg60=0.10 avg300=0.00 total=4567\n",
        )
        .unwrap();
        assert_eq!(readings.len(), 2);
        assert_eq!(readings[0].kind, PressureKind::Some);
        assert_eq!(readings[0].avg10, 1.53);
        assert_eq!(readings[0].avg300, 0.20);
        assert_eq!(readings[0].total_microseconds, 123456);
        assert_eq!(readings[1].kind, PressureKind::Full);
        assert_eq!(readings[1].total_microseconds, 4567);
    }

    #[test]
    fn all_zero_file_is_a_valid_reading() {
        let readings = parse(
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        )
        .unwrap();
        assert!(
            readings
                .iter()
                .all(|r| r.avg10 == 0.0 && r.total_microseconds == 0)
        );
    }

    #[test]
    fn cpu_file_with_only_some_line_is_accepted() {
        let readings = parse("some avg10=2.00 avg60=1.00 avg300=0.50 total=99\n").unwrap();
        assert_eq!(readings.len(), 1);
    }

    #[test]
    fn malformed_lines_are_rejected_and_leave_no_partial_readings() {
        for bad in [
            "",
            "partial avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
            "some avg10=0.00 avg60=0.00 total=0\n",
            "some avg10=abc avg60=0.00 avg300=0.00 total=0\n",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=-1\n",
            "some avg10=-1.0 avg60=0.00 avg300=0.00 total=1\n",
            "some avg10 0.00 avg60=0.00 avg300=0.00 total=0\n",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull garbage\n",
        ] {
            let mut out = Vec::new();
            let result = parse_pressure(bad, PressureResource::Io, &PressureScope::Node, &mut out);
            assert!(result.is_err(), "accepted {bad:?}");
            assert!(out.is_empty(), "left partial readings for {bad:?}");
        }
    }

    #[test]
    fn a_file_cut_short_is_an_error_never_a_smaller_figure() {
        // `avg10=1` of `avg10=12.50`, `total=4` of `total=4567`.
        let whole = "some avg10=12.50 avg60=0.87 avg300=0.20 total=123456\nfull avg10=0.50 avg60=0.10 avg300=0.00 total=4567\n";
        let truth = parse(whole).unwrap();
        for end in 0..whole.len() {
            match parse(&whole[..end]) {
                // Cut right after a newline, the whole lines are true (a CPU file has
                // only its `some` line).
                Ok(readings) => assert!(truth.starts_with(&readings), "cut at {end}"),
                Err(FileProblem::CutShort(_) | FileProblem::Malformed(_)) => {}
                Err(other) => panic!("cut at {end}: {other:?}"),
            }
        }
        assert!(matches!(
            parse("some avg10=1.53 avg60=0.87 avg300=0.20 total=123456\nfull avg10=0.5"),
            Err(FileProblem::CutShort(_))
        ));
    }

    #[test]
    fn unknown_extra_fields_are_ignored() {
        let readings = parse("some avg10=0.10 avg60=0.00 avg300=0.00 total=5 avg1=9.9\n").unwrap();
        assert_eq!(readings[0].avg10, 0.10);
    }
}
