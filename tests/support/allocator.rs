//! Memory-hungry child processes for real-cgroup tests and the detection benchmark. The
//! test (or bench) binary re-executes itself with `NODEKEEPER_ALLOCATOR` (or
//! `NODEKEEPER_OSCILLATOR`) set; the child waits for one byte on stdin (sent once the
//! parent has moved it into its cgroups), then:
//! - the allocator touches memory at a controlled rate and holds it until killed;
//! - the oscillator swings its memory across a trigger and back on command, so one
//!   process gives a benchmark as many crossings as it asks for.

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

pub const ALLOCATOR_ENV: &str = "NODEKEEPER_ALLOCATOR";
pub const OSCILLATOR_ENV: &str = "NODEKEEPER_OSCILLATOR";

/// What the child does, passed through the environment as
/// `bytes,rate,ignore_sigterm[,usage_file,trigger]`.
#[derive(Debug, Clone)]
pub struct AllocatorPlan {
    pub bytes: u64,
    /// Bytes per second; 0 means as fast as possible.
    pub rate: u64,
    /// Ignore SIGTERM, to make a soft eviction escalate to SIGKILL.
    pub ignore_sigterm: bool,
    /// When set, the child reads this usage file after each step and, the first time
    /// usage reaches the trigger, writes the CLOCK_MONOTONIC nanoseconds at which that
    /// step started to stdout (8 bytes, little endian).
    pub report_crossing: Option<(std::path::PathBuf, u64)>,
}

impl AllocatorPlan {
    pub fn to_env(&self) -> String {
        let head = format!("{},{},{}", self.bytes, self.rate, self.ignore_sigterm);
        match &self.report_crossing {
            None => head,
            Some((path, trigger)) => format!("{head},{},{trigger}", path.display()),
        }
    }

    fn from_env(text: &str) -> AllocatorPlan {
        let parts: Vec<&str> = text.split(',').collect();
        AllocatorPlan {
            bytes: parts[0].parse().unwrap(),
            rate: parts[1].parse().unwrap(),
            ignore_sigterm: parts[2].parse().unwrap(),
            report_crossing: (parts.len() == 5)
                .then(|| (parts[3].into(), parts[4].parse().unwrap())),
        }
    }
}

pub fn monotonic_nanos() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the kernel to fill.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) },
        0
    );
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Step size: small enough that a crossing is timed to a fraction of a millisecond.
const STEP: usize = 64 << 10;
const PAGE: usize = 4096;

/// Become the allocator or the oscillator if the environment asks for it; otherwise
/// return.
pub fn run_if_requested() {
    if let Ok(plan) = std::env::var(OSCILLATOR_ENV) {
        run_oscillator(&OscillatorPlan::from_env(&plan));
    }
    let Ok(plan) = std::env::var(ALLOCATOR_ENV) else {
        return;
    };
    let plan = AllocatorPlan::from_env(&plan);
    if plan.ignore_sigterm {
        // SAFETY: installing SIG_IGN has no preconditions.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    let mut go = [0u8; 1];
    if std::io::stdin().read_exact(&mut go).is_err() {
        std::process::exit(2);
    }
    let mut held: Vec<Vec<u8>> = Vec::new();
    let started = Instant::now();
    let mut allocated = 0u64;
    let mut reported = false;
    while allocated < plan.bytes {
        let step_started = monotonic_nanos();
        let mut chunk = vec![0u8; STEP];
        for offset in (0..STEP).step_by(PAGE) {
            chunk[offset] = 1;
        }
        held.push(std::hint::black_box(chunk));
        allocated += STEP as u64;
        if let (false, Some((path, trigger))) = (reported, &plan.report_crossing) {
            let usage: u64 = std::fs::read_to_string(path)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            if usage >= *trigger {
                reported = true;
                let mut out = std::io::stdout();
                out.write_all(&step_started.to_le_bytes()).unwrap();
                out.flush().unwrap();
            }
        }
        if plan.rate > 0 {
            let due = Duration::from_secs_f64(allocated as f64 / plan.rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// What the oscillator does, passed as `base,top,usage_file`: it holds `base` bytes, and
/// on each grow command touches pages from `base` up to `top` at the rate the command
/// names (bytes per second, 0: as fast as it can), timing its crossing of the trigger
/// the command names against `usage_file`; on each release command it returns the pages above `base` to
/// the kernel. A rebase command, given at rest, moves what it holds at rest to a new base
/// and its top with it (the swing stays `top - base`), the base up to
/// [`OscillatorPlan::most_base`]. All sizes are multiples of 64 KiB.
#[derive(Debug, Clone)]
pub struct OscillatorPlan {
    pub base: u64,
    pub top: u64,
    pub usage_file: PathBuf,
}

impl OscillatorPlan {
    /// The most a rebase may hold at rest: the mapping is `top + base` bytes.
    pub fn most_base(&self) -> u64 {
        2 * self.base
    }

    pub fn to_env(&self) -> String {
        format!("{},{},{}", self.base, self.top, self.usage_file.display())
    }

    fn from_env(text: &str) -> OscillatorPlan {
        let parts: Vec<&str> = text.splitn(3, ',').collect();
        OscillatorPlan {
            base: parts[0].parse().unwrap(),
            top: parts[1].parse().unwrap(),
            usage_file: parts[2].into(),
        }
    }
}

/// Written by the oscillator before its first report. A child re-executed from a libtest
/// binary shares its stdout with libtest, which prints its own lines first ("running 1
/// test", the test's name); the parent skips everything up to this marker. Nothing comes
/// after it from libtest as long as the child runs with `--test-threads=1`
/// (`TestCgroups::allocator_args`): with more threads libtest would print its "has been
/// running for over 60 seconds" warnings into the reports.
const OSCILLATOR_MARKER: &[u8] = b"\nnodekeeper-oscillator-reports\n";

/// Parent side: wait until a started oscillator holds its base.
pub fn oscillator_ready(child: &mut Child) {
    let stdout = child.stdout.as_mut().unwrap();
    let mut seen: Vec<u8> = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(OSCILLATOR_MARKER) {
        stdout.read_exact(&mut byte).expect("the oscillator died");
        seen.push(byte[0]);
    }
    read_report(child);
}

/// Parent side: grow across `trigger` (bytes of the usage file) at `rate` bytes per
/// second. Returns the CLOCK_MONOTONIC nanoseconds at which the step that crossed it
/// started, or `None` when usage never reached the trigger.
pub fn oscillator_grow(child: &mut Child, trigger: u64, rate: u64) -> Option<u64> {
    let mut command = [0u8; 17];
    command[0] = b'g';
    command[1..9].copy_from_slice(&trigger.to_le_bytes());
    command[9..].copy_from_slice(&rate.to_le_bytes());
    child.stdin.as_mut().unwrap().write_all(&command).unwrap();
    let crossed_at = read_report(child);
    (crossed_at != 0).then_some(crossed_at)
}

/// Parent side: shrink back to the base; returns once the pages are uncharged.
pub fn oscillator_release(child: &mut Child) {
    child.stdin.as_mut().unwrap().write_all(b"r").unwrap();
    read_report(child);
}

/// Parent side: hold `base` bytes at rest from now on (touching or returning the
/// difference), with the top moved by as much; returns once done. Only at rest (after a
/// release, or before the first grow). Memory charged to
/// the cgroup by others (the kernel's own, for each new cgroup below it) moves the
/// usage at rest, and with it how far below a trigger a crossing starts.
pub fn oscillator_rebase(child: &mut Child, base: u64) {
    let mut command = [0u8; 9];
    command[0] = b'b';
    command[1..].copy_from_slice(&base.to_le_bytes());
    child.stdin.as_mut().unwrap().write_all(&command).unwrap();
    read_report(child);
}

fn read_report(child: &mut Child) -> u64 {
    let mut report = [0u8; 8];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut report)
        .expect("the oscillator died");
    u64::from_le_bytes(report)
}

fn run_oscillator(plan: &OscillatorPlan) -> ! {
    let mut stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    let mut report = |value: u64| {
        stdout.write_all(&value.to_le_bytes()).unwrap();
        stdout.flush().unwrap();
    };
    let mut go = [0u8; 1];
    if stdin.read_exact(&mut go).is_err() {
        std::process::exit(2);
    }
    let (mut base, mut top) = (plan.base as usize, plan.top as usize);
    assert!(base % STEP == 0 && top % STEP == 0 && base < top);
    // Room for rebasing up to twice the base (`most_base`); pages never touched are never
    // charged.
    let mapped = top + base;
    // Grown past the base and not released yet: a rebase now would leave pages above
    // its new top that no release returns.
    let mut grown = false;
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let region = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            mapped,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(region, libc::MAP_FAILED, "mmap of {mapped} bytes failed");
    let region = region.cast::<u8>();
    let touch = |from: usize, to: usize| {
        assert!(to <= mapped);
        for offset in (from..to).step_by(PAGE) {
            // SAFETY: `offset` is inside the mapping of `mapped` bytes.
            unsafe { region.add(offset).write_volatile(1) };
        }
    };
    touch(0, base);
    let usage_file = std::fs::File::open(&plan.usage_file).unwrap();
    let read_usage = || {
        let mut text = [0u8; 32];
        let read = usage_file.read_at(&mut text, 0).unwrap();
        std::str::from_utf8(&text[..read])
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    std::io::stdout().write_all(OSCILLATOR_MARKER).unwrap();
    report(0);
    loop {
        let mut command = [0u8; 1];
        if stdin.read_exact(&mut command).is_err() {
            std::process::exit(0);
        }
        match command[0] {
            b'g' => {
                let mut arguments = [0u8; 16];
                stdin.read_exact(&mut arguments).unwrap();
                let (trigger, rate) = arguments.split_at(8);
                let trigger = u64::from_le_bytes(trigger.try_into().unwrap());
                let rate = u64::from_le_bytes(rate.try_into().unwrap());
                let started = Instant::now();
                grown = true;
                let mut crossed_at = 0;
                for from in (base..top).step_by(STEP) {
                    let step_started = monotonic_nanos();
                    touch(from, from + STEP);
                    if crossed_at == 0 && read_usage() >= trigger {
                        crossed_at = step_started;
                    }
                    if rate > 0 {
                        let grown_bytes = (from + STEP - base) as f64;
                        let due = Duration::from_secs_f64(grown_bytes / rate as f64);
                        // Spin rather than sleep: a sleep's timer slack would pace the
                        // growth in bursts and blur the crossing.
                        while started.elapsed() < due {
                            std::hint::spin_loop();
                        }
                    }
                }
                report(crossed_at);
            }
            b'r' => {
                // SAFETY: the range is inside the mapping; DONTNEED frees and uncharges
                // its pages, which read back as zeros if touched again.
                let rc = unsafe {
                    libc::madvise(region.add(base).cast(), top - base, libc::MADV_DONTNEED)
                };
                assert_eq!(rc, 0, "madvise(MADV_DONTNEED) failed");
                grown = false;
                report(0);
            }
            b'b' => {
                let mut argument = [0u8; 8];
                stdin.read_exact(&mut argument).unwrap();
                let wanted = u64::from_le_bytes(argument) as usize;
                let swing = top - base;
                assert!(!grown, "a rebase while grown; release first");
                assert!(
                    wanted.is_multiple_of(STEP)
                        && wanted > 0
                        && wanted.checked_add(swing).is_some_and(|end| end <= mapped),
                    "rebase to {wanted} bytes: a multiple of {STEP}, at most {} bytes",
                    mapped - swing
                );
                if wanted > base {
                    touch(base, wanted);
                } else if wanted < base {
                    // SAFETY: the range is inside the mapping (see the release).
                    let rc = unsafe {
                        libc::madvise(
                            region.add(wanted).cast(),
                            base - wanted,
                            libc::MADV_DONTNEED,
                        )
                    };
                    assert_eq!(rc, 0, "madvise(MADV_DONTNEED) failed");
                }
                (base, top) = (wanted, wanted + swing);
                report(0);
            }
            other => panic!("unknown oscillator command {other}"),
        }
    }
}
