//! Parsers for the kernel's text formats, free of I/O so they can be tested on strings.

use super::error::FileProblem;

/// A file holding one unsigned integer, with the kernel's trailing newline.
pub(crate) fn single_u64(text: &str) -> Result<u64, FileProblem> {
    let value = text.trim();
    value
        .parse()
        .map_err(|_| FileProblem::Malformed(format!("expected an integer, found {value:?}")))
}

/// The value of `key` in a flat keyed file (`memory.stat`: one `key value` per line).
/// Every cycle reads it for every pod, so it searches for the key itself instead of
/// splitting every line: v1 puts `total_inactive_file` some thirty lines down.
pub(crate) fn flat_keyed_u64(text: &str, key: &'static str) -> Result<u64, FileProblem> {
    for (at, _) in text.match_indices(key) {
        let line_start = text[..at].rfind('\n').map_or(0, |newline| newline + 1);
        let first_field = text[line_start..at]
            .bytes()
            .all(|b| b.is_ascii_whitespace());
        let rest = &text[at + key.len()..];
        let line = &rest[..rest.find('\n').unwrap_or(rest.len())];
        if !first_field || !(line.is_empty() || line.starts_with([' ', '\t'])) {
            continue;
        }
        let value = line.split_ascii_whitespace().next().unwrap_or("");
        return value.parse().map_err(|_| {
            FileProblem::Malformed(format!("`{key}` has non-integer value {value:?}"))
        });
    }
    Err(FileProblem::MissingKey(key))
}

/// A memory limit: v2 writes `max` for "no limit"; v1 writes a huge page-rounded number.
pub(crate) fn memory_limit(text: &str) -> Result<Option<u64>, FileProblem> {
    let value = text.trim();
    if value == "max" {
        return Ok(None);
    }
    let bytes = single_u64(value)?;
    // v1 reports "unlimited" as LONG_MAX rounded down to the page size (0x7FFFFFFFFFFFF000
    // with 4 KiB pages); anything that close to i64::MAX cannot be a real limit.
    const V1_UNLIMITED_FLOOR: u64 = (i64::MAX as u64) & !0xFFFF;
    Ok((bytes < V1_UNLIMITED_FLOOR).then_some(bytes))
}

/// The fields of `/proc/meminfo` the collectors need, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    pub total: u64,
    pub free: u64,
    pub available: Option<u64>,
    pub inactive_file: Option<u64>,
}

pub(crate) fn meminfo(text: &str) -> Result<MemInfo, FileProblem> {
    let mut total = None;
    let mut free = None;
    let mut info = MemInfo::default();
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let slot = match key {
            "MemTotal" => &mut total,
            "MemFree" => &mut free,
            "MemAvailable" => &mut info.available,
            "Inactive(file)" => &mut info.inactive_file,
            _ => continue,
        };
        *slot = Some(meminfo_bytes(key, rest)?);
    }
    info.total = total.ok_or(FileProblem::MissingKey("MemTotal"))?;
    info.free = free.ok_or(FileProblem::MissingKey("MemFree"))?;
    Ok(info)
}

fn meminfo_bytes(key: &str, rest: &str) -> Result<u64, FileProblem> {
    let mut fields = rest.split_ascii_whitespace();
    let number = fields.next().unwrap_or("");
    let value: u64 = number
        .parse()
        .map_err(|_| FileProblem::Malformed(format!("`{key}` has non-integer value {number:?}")))?;
    match fields.next() {
        Some("kB") => Ok(value.saturating_mul(1024)),
        None => Ok(value),
        Some(unit) => Err(FileProblem::Malformed(format!(
            "`{key}` has unknown unit {unit:?}"
        ))),
    }
}

/// The number of processes and threads from `/proc/loadavg`: the denominator of the 4th
/// field (`0.51 0.58 0.27 1/84 6799` gives 84), as the kubelet reads it.
pub(crate) fn loadavg_process_count(text: &str) -> Result<u64, FileProblem> {
    let field = text
        .split_ascii_whitespace()
        .nth(3)
        .ok_or_else(|| FileProblem::Malformed("fewer than 4 fields".into()))?;
    let total = field
        .split_once('/')
        .map(|(_, total)| total)
        .ok_or_else(|| {
            FileProblem::Malformed(format!("4th field {field:?} is not running/total"))
        })?;
    total
        .parse()
        .map_err(|_| FileProblem::Malformed(format!("4th field {field:?} is not running/total")))
}

/// Number of non-empty lines: the entries of `cgroup.procs`.
pub(crate) fn count_lines(text: &str) -> Result<u64, FileProblem> {
    Ok(text.lines().filter(|line| !line.trim().is_empty()).count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_keyed_finds_exact_key_not_prefix() {
        let stat = "inactive_file 10\ntotal_inactive_file 99\n";
        assert_eq!(flat_keyed_u64(stat, "inactive_file").unwrap(), 10);
        assert_eq!(flat_keyed_u64(stat, "total_inactive_file").unwrap(), 99);
        assert!(matches!(
            flat_keyed_u64("cache 1\n", "inactive_file"),
            Err(FileProblem::MissingKey("inactive_file"))
        ));
        assert!(matches!(
            flat_keyed_u64("inactive_file x\n", "inactive_file"),
            Err(FileProblem::Malformed(_))
        ));
    }

    #[test]
    fn flat_keyed_takes_the_key_only_as_a_line_s_first_field() {
        // Longer keys that contain it, and the key as a later field, do not count.
        let stat =
            "inactive_files 1\nfoo inactive_file 2\ninactive_file_x 3\n  inactive_file\t4 5\n";
        assert_eq!(flat_keyed_u64(stat, "inactive_file").unwrap(), 4);
        assert_eq!(
            flat_keyed_u64("a 1\ninactive_file 7", "inactive_file").unwrap(),
            7
        );
        for missing_value in ["inactive_file\n", "inactive_file", "inactive_file \nx 1\n"] {
            assert!(
                matches!(
                    flat_keyed_u64(missing_value, "inactive_file"),
                    Err(FileProblem::Malformed(_))
                ),
                "{missing_value:?}"
            );
        }
        assert!(matches!(
            flat_keyed_u64("", "inactive_file"),
            Err(FileProblem::MissingKey("inactive_file"))
        ));
    }

    #[test]
    fn memory_limit_understands_both_spellings_of_unlimited() {
        assert_eq!(memory_limit("max\n").unwrap(), None);
        assert_eq!(memory_limit("9223372036854771712\n").unwrap(), None);
        assert_eq!(memory_limit("1073741824\n").unwrap(), Some(1 << 30));
        assert!(memory_limit("lots\n").is_err());
    }

    #[test]
    fn meminfo_converts_kilobytes_and_requires_total_and_free() {
        let text = "MemTotal:       1000 kB\nMemFree:         200 kB\nMemAvailable:    600 kB\nInactive(file):   50 kB\nHugePages_Total:       0\n";
        let info = meminfo(text).unwrap();
        assert_eq!(info.total, 1000 * 1024);
        assert_eq!(info.free, 200 * 1024);
        assert_eq!(info.available, Some(600 * 1024));
        assert_eq!(info.inactive_file, Some(50 * 1024));
        assert!(matches!(
            meminfo("MemFree: 1 kB\n"),
            Err(FileProblem::MissingKey("MemTotal"))
        ));
        assert!(matches!(
            meminfo("MemTotal: x kB\nMemFree: 1 kB\n"),
            Err(FileProblem::Malformed(_))
        ));
    }

    #[test]
    fn loadavg_uses_the_denominator_of_the_fourth_field() {
        assert_eq!(
            loadavg_process_count("0.51 0.58 0.27 1/84 6799\n").unwrap(),
            84
        );
        assert!(loadavg_process_count("0.51 0.58 0.27\n").is_err());
        assert!(loadavg_process_count("0.51 0.58 0.27 184 6799\n").is_err());
    }
}
