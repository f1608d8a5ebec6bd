//! The fence-agent runner's cost, against baselines in the same run:
//!
//! - `status` of the real `fence_dummy` through `FenceRunner::call` (stdin options,
//!   process group, captured and redacted output, deadline) versus the same agent started
//!   directly (`fence_emulators::run_agent`) with the same stdin: the ratio is the
//!   runner's overhead;
//! - one `fence_ipmilan` off confirmed by status against an `ipmi_sim` BMC through
//!   `FenceRunner::execute`, versus the two agent calls (off, status) made directly.
//!
//! Needs fence-agents and openipmi; fails under `CI=true` without them.

#[allow(dead_code)]
#[path = "../tests/support/fence_emulators.rs"]
mod fence_emulators;
#[allow(dead_code)]
#[path = "../tests/support/real.rs"]
pub mod real;
/// Where `require!` looks for its helpers.
mod support {
    pub use super::real;
}

use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use fence_emulators::{IpmiSim, LOOPBACK, run_agent};
use nodekeeper::fencing::config::{Layer, Parameter, ParameterValue, Source};
use nodekeeper::fencing::{FenceAction, FenceRunner, MethodPlan, RunnerSettings, SecretValue};

fn parameter(name: &str, value: &str, sensitive: bool) -> Parameter {
    Parameter {
        name: name.to_string(),
        written: name.to_string(),
        value: if sensitive {
            ParameterValue::Sensitive(SecretValue::new(value))
        } else {
            ParameterValue::Text(value.to_string())
        },
        layer: Layer::Node,
        source: Source {
            config_map: "bench".to_string(),
            key: "method.properties".to_string(),
        },
        secret: None,
    }
}

fn bench(c: &mut Criterion) {
    require!("fence-agents", real::program("fence_dummy", "fence-agents"));
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let runner = FenceRunner::new(RunnerSettings {
        verify_interval: Duration::from_millis(100),
        ..RunnerSettings::default()
    });

    let status_file = dir.path().join("dummy.status");
    std::fs::write(&status_file, "on").expect("power on");
    let dummy = [parameter(
        "status_file",
        &status_file.display().to_string(),
        false,
    )];
    let status_path = status_file.display().to_string();
    let dummy_options = [("status_file", status_path.as_str()), ("action", "status")];
    let agent = |name: &str| Path::new("/usr/sbin").join(name);

    let mut group = c.benchmark_group("fence_agent_status");
    group.sample_size(20);
    group.bench_function("baseline_fence_dummy_direct", |b| {
        b.iter(|| {
            assert_eq!(
                run_agent(&agent("fence_dummy"), &dummy_options).exit_code,
                0
            )
        });
    });
    group.bench_function("fence_dummy_through_runner", |b| {
        b.iter(|| {
            let call = runtime.block_on(runner.call("fence_dummy", "status", &dummy));
            assert!(call.succeeded());
        });
    });
    group.finish();

    let port = bmc.port().to_string();
    let ipmi = vec![
        parameter("ip", LOOPBACK, false),
        parameter("ipport", &port, false),
        parameter("username", IpmiSim::USER, false),
        parameter("password", IpmiSim::PASSWORD, true),
        parameter("power_wait", "0", false),
    ];
    let ipmi_options = |action| {
        [
            ("ip", LOOPBACK),
            ("ipport", port.as_str()),
            ("username", IpmiSim::USER),
            ("password", IpmiSim::PASSWORD),
            ("power_wait", "0"),
            ("action", action),
        ]
    };
    let off = MethodPlan {
        name: "ipmi-off".to_string(),
        source: Source {
            config_map: "bench".to_string(),
            key: "method.properties".to_string(),
        },
        template: None,
        agent: "fence_ipmilan".to_string(),
        action: FenceAction::Off,
        action_layer: Layer::Node,
        must_succeed: true,
        parameters: ipmi,
    };
    let mut group = c.benchmark_group("fence_ipmilan_off_confirmed");
    group.sample_size(10);
    group.bench_function("baseline_off_then_status_direct", |b| {
        b.iter(|| {
            bmc.set_power(true);
            let ipmilan = agent("fence_ipmilan");
            assert_eq!(run_agent(&ipmilan, &ipmi_options("off")).exit_code, 0);
            assert_eq!(run_agent(&ipmilan, &ipmi_options("status")).exit_code, 2);
        });
    });
    group.bench_function("off_confirmed_through_runner", |b| {
        b.iter(|| {
            bmc.set_power(true);
            let result = runtime.block_on(runner.execute(&off));
            assert!(result.off_confirmed, "{result:?}");
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
