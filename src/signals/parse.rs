//! Parsers for the kernel's text formats, free of I/O so they can be tested on strings.
//! Public so the fuzz targets (fuzz/) can feed them any text a broken or hostile kernel
//! file could hold.

use super::error::FileProblem;

/// The part of a kernel file's text made of whole lines. The kernel ends every line it
/// writes with a newline, so text after the last one is a read cut short (a truncated
/// copy, a short read, a file being rewritten): a number there may be the first digits
/// of a larger one (`60` of `600`), and must never be read as a smaller figure.
pub fn complete_lines(text: &str) -> &str {
    text.rfind('\n').map_or("", |end| &text[..=end])
}

/// Whether `text` goes on after its last newline with more than whitespace: a read cut
/// short.
pub fn is_cut_short(text: &str) -> bool {
    !text[complete_lines(text).len()..].trim().is_empty()
}

/// The error for `text` cut short after its last newline, quoting the end of the part
/// cut (a file of garbage without a newline must not fill every cycle's error).
pub fn cut_short(text: &str) -> FileProblem {
    const QUOTED: usize = 40;
    let cut = text[complete_lines(text).len()..].trim();
    let start = cut
        .char_indices()
        .rev()
        .nth(QUOTED - 1)
        .map_or(0, |(at, _)| at);
    let ellipsis = if start > 0 { "…" } else { "" };
    FileProblem::CutShort(format!("{ellipsis}{}", &cut[start..]))
}

/// The one line of a single-value file, without its newline; an error when the file is
/// cut short.
fn single_line(text: &str) -> Result<&str, FileProblem> {
    match text.strip_suffix('\n') {
        Some(line) => Ok(line.trim()),
        None => Err(cut_short(text)),
    }
}

/// A file holding one unsigned integer, with the kernel's trailing newline
/// (`memory.current`, `pid_max`). Without the newline it is an error: `41` read from a
/// `pid_max` of `4194304` cut short would make the node look out of PIDs.
pub fn single_u64(text: &str) -> Result<u64, FileProblem> {
    integer(single_line(text)?)
}

fn integer(value: &str) -> Result<u64, FileProblem> {
    value
        .parse()
        .map_err(|_| FileProblem::Malformed(format!("expected an integer, found {value:?}")))
}

/// The value of `key` in a flat keyed file (`memory.stat`: one `key value` per line).
/// Every cycle reads it for every pod, so it searches for the key itself instead of
/// splitting every line: v1 puts `total_inactive_file` some thirty lines down.
///
/// Only whole lines count: a key whose line is cut short is an error, never the first
/// digits of its value (`total_inactive_file 12` cut from `1234567` would make the working
/// set look larger than it is).
pub fn flat_keyed_u64(text: &str, key: &'static str) -> Result<u64, FileProblem> {
    let whole = complete_lines(text);
    match flat_keyed_in(whole, key) {
        // The key may be in the part cut off (`inactive_fi`, or not there at all).
        Err(FileProblem::MissingKey(_)) if is_cut_short(text) => Err(cut_short(text)),
        found => found,
    }
}

fn flat_keyed_in(text: &str, key: &'static str) -> Result<u64, FileProblem> {
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
pub fn memory_limit(text: &str) -> Result<Option<u64>, FileProblem> {
    let value = single_line(text)?;
    if value == "max" {
        return Ok(None);
    }
    let bytes = integer(value)?;
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
    /// The huge page pool of every page size, in bytes: what the kubelet reports as the
    /// node's `hugepages-<size>` capacities (each size's `nr_hugepages`, surplus pages
    /// included). The memory controller does not count these pages in any working set,
    /// so `HugepageAwareEviction` takes them out of `memory.available`.
    pub hugepage_pool: u64,
}

/// `/proc/meminfo`. The kernel ends every line with a newline and writes every size in
/// `kB`, so a read cut short (a truncated copy, a short read) is told from the truth: a
/// last line without its newline is left out, and a size without its unit is an error,
/// never a figure a thousand times too small (`MemAvailable: 60` cut from `600 kB` would
/// otherwise read as 60 bytes available and evict pods for nothing).
pub fn meminfo(text: &str) -> Result<MemInfo, FileProblem> {
    let mut total = None;
    let mut free = None;
    let mut info = MemInfo::default();
    let mut huge = HugePageLines::default();
    for line in complete_lines(text).lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let slot = match key {
            "MemTotal" => &mut total,
            "MemFree" => &mut free,
            "MemAvailable" => &mut info.available,
            "Inactive(file)" => &mut info.inactive_file,
            // A huge page line the kernel wrote oddly must not cost memory.available
            // altogether: it counts as absent.
            "Hugetlb" => {
                huge.hugetlb_bytes = meminfo_bytes(key, rest, Unit::Kilobytes).ok();
                continue;
            }
            "HugePages_Total" => {
                huge.default_size_pages = meminfo_bytes(key, rest, Unit::Count).ok();
                continue;
            }
            "Hugepagesize" => {
                huge.default_size_bytes = meminfo_bytes(key, rest, Unit::Kilobytes).ok();
                continue;
            }
            _ => continue,
        };
        *slot = Some(meminfo_bytes(key, rest, Unit::Kilobytes)?);
    }
    info.total = total.ok_or(FileProblem::MissingKey("MemTotal"))?;
    info.free = free.ok_or(FileProblem::MissingKey("MemFree"))?;
    info.hugepage_pool = huge.pool();
    Ok(info)
}

/// meminfo's huge page lines. `Hugetlb` (Linux 4.16 and later) counts the pages of every
/// size; without it, `HugePages_Total` pages of `Hugepagesize` are the default size's.
/// Both count surplus pages, as each size's `nr_hugepages` does.
#[derive(Default)]
struct HugePageLines {
    hugetlb_bytes: Option<u64>,
    default_size_pages: Option<u64>,
    default_size_bytes: Option<u64>,
}

impl HugePageLines {
    fn pool(&self) -> u64 {
        self.hugetlb_bytes.unwrap_or_else(|| {
            let pages = self.default_size_pages.unwrap_or(0);
            pages.saturating_mul(self.default_size_bytes.unwrap_or(0))
        })
    }
}

/// What a meminfo line's number counts: a size the kernel writes in `kB`, or pages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unit {
    Kilobytes,
    Count,
}

fn meminfo_bytes(key: &str, rest: &str, unit: Unit) -> Result<u64, FileProblem> {
    let mut fields = rest.split_ascii_whitespace();
    let number = fields.next().unwrap_or("");
    let value: u64 = number
        .parse()
        .map_err(|_| FileProblem::Malformed(format!("`{key}` has non-integer value {number:?}")))?;
    match (fields.next(), unit) {
        (Some("kB"), Unit::Kilobytes) => Ok(value.saturating_mul(1024)),
        (None, Unit::Count) => Ok(value),
        (None, Unit::Kilobytes) => Err(FileProblem::Malformed(format!(
            "`{key}` has no unit (cut short?): {number}"
        ))),
        (Some(other), _) => Err(FileProblem::Malformed(format!(
            "`{key}` has unknown unit {other:?}"
        ))),
    }
}

/// The number of processes and threads from `/proc/loadavg`: the denominator of the 4th
/// field (`0.51 0.58 0.27 1/84 6799` gives 84), as the kubelet reads it.
/// Cut short (no newline), it is an error: the count could be the first digits of the
/// real one.
pub fn loadavg_process_count(text: &str) -> Result<u64, FileProblem> {
    let field = single_line(text)?
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
pub fn count_lines(text: &str) -> Result<u64, FileProblem> {
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
        for missing_value in ["inactive_file\n", "inactive_file \nx 1\n"] {
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

    /// Every cut of `whole` short of its last newline: `parse` gives the true figure or an
    /// error, never another figure.
    fn assert_cut_never_misread<T: PartialEq + std::fmt::Debug>(
        whole: &str,
        truth: T,
        parse: impl Fn(&str) -> Result<T, FileProblem>,
    ) {
        assert_eq!(parse(whole).expect("the whole file"), truth);
        for end in 0..whole.len() {
            if let Ok(figure) = parse(&whole[..end]) {
                assert_eq!(figure, truth, "{:?} read as {figure:?}", &whole[..end]);
            }
        }
    }

    #[test]
    fn a_single_value_file_cut_short_is_never_read_as_another_figure() {
        // pid_max cut to `41` would leave the node 41 PIDs; memory.max cut to `10` a
        // 10-byte limit; memory.current cut short a usage far too small.
        assert_cut_never_misread("4194304\n", 4194304, single_u64);
        assert_cut_never_misread("1073741824\n", Some(1 << 30), memory_limit);
        assert_cut_never_misread("max\n", None, memory_limit);
        assert_cut_never_misread("0.51 0.58 0.27 1/846 6799\n", 846, loadavg_process_count);
        let error = single_u64("41").unwrap_err();
        assert!(matches!(error, FileProblem::CutShort(_)), "{error:?}");
        assert!(error.to_string().contains("\"41\""), "{error}");
        // The error quotes the end of what was cut, not a whole file of garbage.
        let error = single_u64(&"x".repeat(5000)).unwrap_err().to_string();
        assert!(error.len() < 200, "{error}");
        assert!(error.contains(&format!("…{}", "x".repeat(40))), "{error}");
    }

    #[test]
    fn a_keyed_line_cut_short_is_never_read_as_another_figure() {
        // v1 memory.stat ends with the total_ lines the working set is computed from.
        let stat = "cache 4096\ninactive_file 1234567\ntotal_inactive_file 7654321\n";
        assert_cut_never_misread(stat, 7654321, |text| {
            flat_keyed_u64(text, "total_inactive_file")
        });
        assert_cut_never_misread(stat, 1234567, |text| flat_keyed_u64(text, "inactive_file"));
        assert!(matches!(
            flat_keyed_u64("a 1\ninactive_file 7", "inactive_file"),
            Err(FileProblem::CutShort(_))
        ));
        assert!(matches!(
            flat_keyed_u64("inactive_file", "inactive_file"),
            Err(FileProblem::CutShort(_))
        ));
        // Cut before its key could be read, the key is not called missing.
        assert!(matches!(
            flat_keyed_u64("anon 1\ninactive_fi", "inactive_file"),
            Err(FileProblem::CutShort(_))
        ));
        // A cut in a later line leaves the whole lines before it readable.
        assert_eq!(
            flat_keyed_u64("inactive_file 7\ntotal_ca", "inactive_file").unwrap(),
            7
        );
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
    fn a_meminfo_cut_short_is_never_read_as_a_small_figure() {
        let whole = "MemTotal:       1000 kB\nMemFree:         200 kB\nMemAvailable:    600 kB\n";
        assert_eq!(meminfo(whole).unwrap().available, Some(600 * 1024));
        // Cut anywhere: every figure read is the true one, or the read is an error.
        for end in 0..whole.len() {
            match meminfo(&whole[..end]) {
                Ok(info) => {
                    assert_eq!(info.total, 1000 * 1024, "cut at {end}");
                    assert_eq!(info.free, 200 * 1024, "cut at {end}");
                    assert!(
                        info.available.is_none() || info.available == Some(600 * 1024),
                        "cut at {end}: {info:?}"
                    );
                }
                Err(FileProblem::MissingKey(_) | FileProblem::Malformed(_)) => {}
                Err(other) => panic!("cut at {end}: {other:?}"),
            }
        }
        // A line cut before its unit, in the middle of the file, is an error naming it.
        let cut = "MemTotal: 1000 kB\nMemFree: 200 kB\nMemAvailable: 60\nActive: 1 kB\n";
        let error = meminfo(cut).unwrap_err();
        assert!(error.to_string().contains("MemAvailable"), "{error}");
    }

    #[test]
    fn the_hugepage_pool_is_every_size() {
        let base = "MemTotal: 1000000 kB\nMemFree: 1000 kB\n";
        let pool = |lines: &str| meminfo(&format!("{base}{lines}")).unwrap().hugepage_pool;
        // No huge pages at all, or lines the kernel did not write.
        assert_eq!(pool(""), 0);
        assert_eq!(
            pool("HugePages_Total: 0\nHugePages_Surp: 0\nHugepagesize: 2048 kB\nHugetlb: 0 kB\n"),
            0
        );
        // 32 pages of 2 MiB, the kubelet's e2e reservation: 64 MiB either way.
        assert_eq!(
            pool("HugePages_Total: 32\nHugePages_Surp: 0\nHugepagesize: 2048 kB\n"),
            64 << 20
        );
        assert_eq!(
            pool(
                "HugePages_Total: 32\nHugePages_Surp: 0\nHugepagesize: 2048 kB\nHugetlb: 65536 kB\n"
            ),
            64 << 20
        );
        // Two sizes (32 × 2 MiB and 2 × 1 GiB): Hugetlb has them all, as the node's
        // hugepages-2Mi and hugepages-1Gi capacities together.
        assert_eq!(
            pool(
                "HugePages_Total: 32\nHugePages_Surp: 0\nHugepagesize: 2048 kB\nHugetlb: 2162688 kB\n"
            ),
            (64 << 20) + (2 << 30)
        );
        // Surplus pages count, as they do in nr_hugepages.
        assert_eq!(
            pool("HugePages_Total: 32\nHugePages_Surp: 8\nHugepagesize: 2048 kB\n"),
            64 << 20
        );
        // A malformed huge page line counts as absent; the rest of meminfo still reads.
        let info = meminfo(&format!(
            "{base}Hugetlb: lots kB\nHugePages_Total: 4\nHugepagesize: 2048 kB\n"
        ))
        .unwrap();
        assert_eq!(
            (info.total, info.hugepage_pool),
            (1_000_000 * 1024, 8 << 20)
        );
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
