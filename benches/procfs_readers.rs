//! Our procfs readers against the `procfs` crate's on the same files of this host, read
//! and parsed as the collector does every cycle: `/proc/meminfo`, `/proc/loadavg` and
//! `/proc/pressure/memory`. The figures decide whether the agent adopts `procfs`
//! (docs/architecture.md, "Why our own readers"); ratios are procfs over ours, measured in
//! the same run.
//!
//! Run: cargo bench --bench procfs_readers (PSI is required: without it the bench fails
//! under `CI=true`, and prints SKIPPED and measures the other files otherwise).

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::Criterion;
use nodekeeper::signals::PressureResource;
use nodekeeper::signals::readers::{read_meminfo, read_pressure, read_process_count};
use procfs::Current;

#[allow(dead_code, unused_macros)]
#[path = "../tests/support/real.rs"]
mod real;

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("procfs_readers");
    group.measurement_time(Duration::from_secs(3));

    let meminfo = Path::new("/proc/meminfo");
    group.bench_function("meminfo/ours", |b| {
        b.iter(|| black_box(read_meminfo(black_box(meminfo)).unwrap()))
    });
    group.bench_function("meminfo/procfs", |b| {
        b.iter(|| black_box(procfs::Meminfo::current().unwrap()))
    });

    let loadavg = Path::new("/proc/loadavg");
    group.bench_function("loadavg/ours", |b| {
        b.iter(|| black_box(read_process_count(black_box(loadavg)).unwrap()))
    });
    group.bench_function("loadavg/procfs", |b| {
        b.iter(|| black_box(procfs::LoadAverage::current().unwrap()))
    });

    let psi = Path::new("/proc/pressure/memory");
    let psi_readable = std::fs::read_to_string(psi);
    if let Err(error) = &psi_readable {
        // Fails under CI=true; on a developer's machine says SKIPPED and measures the rest.
        real::unavailable("PSI (/proc/pressure/memory)", error);
    }
    if psi_readable.is_ok() {
        let mut readings = Vec::with_capacity(2);
        group.bench_function("psi_memory/ours", |b| {
            b.iter(|| {
                readings.clear();
                read_pressure(black_box(psi), PressureResource::Memory, &mut readings).unwrap();
                black_box(&readings);
            })
        });
        group.bench_function("psi_memory/procfs", |b| {
            b.iter(|| black_box(procfs::MemoryPressure::current().unwrap()))
        });
    }
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    benches(&mut criterion);
    criterion.final_summary();
}
