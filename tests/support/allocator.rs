//! A memory-hungry child process for real-cgroup tests and the detection benchmark. The
//! test (or bench) binary re-executes itself with `NODEKEEPER_ALLOCATOR` set; the child
//! waits for one byte on stdin (sent once the parent has moved it into its cgroups), then
//! touches memory at a controlled rate and holds it until killed.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

pub const ALLOCATOR_ENV: &str = "NODEKEEPER_ALLOCATOR";

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

/// Become the allocator if the environment asks for it; otherwise return.
pub fn run_if_requested() {
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
