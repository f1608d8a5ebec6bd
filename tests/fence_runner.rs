//! The fence-agent runner with real processes: options only on standard input, the
//! action always explicit, a timeout that kills the agent's whole process group, an off
//! confirmed by status, output redacted, and the real `fence_dummy` agent.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use nodekeeper::fencing::config::{Layer, Parameter, ParameterValue, Source};
use nodekeeper::fencing::{
    Exit, FenceAction, FenceObjects, FenceRunner, MethodPlan, ObjectOrigin, PowerState,
    RunnerSettings, SecretValue, Step, resolve,
};
use support::fake_fence_agents::{install, install_switch};
use support::real;

fn runner(agents_dir: &Path, call_timeout: Duration) -> FenceRunner {
    FenceRunner::new(RunnerSettings {
        agents_dir: agents_dir.to_path_buf(),
        call_timeout,
        verify_timeout: Duration::from_millis(1500),
        verify_interval: Duration::from_millis(100),
        ..RunnerSettings::default()
    })
}

fn text(name: &str, value: &str) -> Parameter {
    Parameter {
        name: name.to_string(),
        written: name.to_string(),
        value: ParameterValue::Text(value.to_string()),
        layer: Layer::Node,
        source: Source {
            config_map: "fence-method-m-n1".to_string(),
            key: "method.properties".to_string(),
        },
        secret: None,
    }
}

fn secret(name: &str, value: &str) -> Parameter {
    Parameter {
        value: ParameterValue::Sensitive(SecretValue::new(value)),
        ..text(name, "")
    }
}

fn method(agent: &str, action: FenceAction, parameters: Vec<Parameter>) -> MethodPlan {
    MethodPlan {
        name: "m".to_string(),
        source: Source {
            config_map: "fence-method-m-n1".to_string(),
            key: "method.properties".to_string(),
        },
        template: None,
        agent: agent.to_string(),
        action,
        action_layer: Layer::Node,
        must_succeed: true,
        parameters,
    }
}

fn process_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.contains(") Z "))
}

/// Waits (5 s at most) until the agent's child, whose pid it wrote to `pids`, is gone:
/// an orphaned child is reparented and reaped by init, which takes a moment.
async fn agent_child_ends(pids: &Path) {
    let child: i32 = std::fs::read_to_string(pids)
        .expect("the agent's child wrote its pid")
        .trim()
        .parse()
        .expect("a pid");
    support::poll::Wait::for_(
        &format!("the agent's child {child} to be gone"),
        Duration::from_secs(5),
    )
    .every(Duration::from_millis(50))
    .eventually_true(|| !process_exists(child))
    .await;
}

#[tokio::test]
async fn options_reach_the_agent_only_on_stdin_with_the_action_last() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spy = dir.path().join("spy");
    std::fs::create_dir(&spy).expect("spy dir");
    install(
        dir.path(),
        "fence_spy",
        &format!(
            r#"spy={spy}
printf '%s\n' "$0" "$@" > "$spy/argv"
cat /proc/$$/environ | tr '\0' '\n' > "$spy/environ"
printf '%s\n' "$input" > "$spy/stdin"
echo "debug: logging in with password $password"
echo "Failed: the device refused $password" >&2
exit 1"#,
            spy = spy.display()
        ),
    );
    let runner = runner(dir.path(), Duration::from_secs(20));
    let call = runner
        .call(
            "fence_spy",
            "status",
            &[text("ip", "10.0.0.1"), secret("password", "hunter2-pw")],
        )
        .await;

    let argv = std::fs::read_to_string(spy.join("argv")).expect("argv recorded");
    assert_eq!(argv.lines().count(), 1, "no arguments at all: {argv}");
    let environ = std::fs::read_to_string(spy.join("environ")).expect("environ recorded");
    assert!(!environ.contains("hunter2-pw"), "not in the environment");
    let stdin = std::fs::read_to_string(spy.join("stdin")).expect("stdin recorded");
    assert_eq!(stdin, "ip=10.0.0.1\npassword=hunter2-pw\naction=status\n");

    assert_eq!(call.exit, Exit::Code { code: 1 });
    assert!(!call.succeeded());
    assert_eq!(call.power, None);
    assert_eq!(
        call.output,
        "debug: logging in with password ***\nFailed: the device refused ***\n"
    );
    let json = serde_json::to_string(&call).expect("serializes");
    assert!(!json.contains("hunter2-pw"), "{json}");
}

#[tokio::test]
async fn a_hung_agent_times_out_and_its_whole_process_group_is_killed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pids = dir.path().join("pids");
    install(
        dir.path(),
        "fence_hang",
        &format!(
            r#"sleep 300 &
echo $! > {pids}
echo "Connecting to the device"
sleep 300"#,
            pids = pids.display()
        ),
    );
    let runner = runner(dir.path(), Duration::from_secs(1));
    let started = Instant::now();
    let call = runner.call("fence_hang", "off", &[]).await;
    let took = started.elapsed();

    assert_eq!(call.exit, Exit::TimedOut { seconds: 1.0 });
    assert!(!call.succeeded(), "a timeout is a failure");
    assert!(took < Duration::from_secs(5), "returned after {took:?}");
    assert_eq!(
        call.output, "Connecting to the device\n",
        "output kept up to the kill"
    );
    agent_child_ends(&pids).await;
}

#[tokio::test]
async fn an_off_counts_only_once_status_reports_off() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = install_switch(dir.path());
    let runner = runner(dir.path(), Duration::from_secs(20));
    let plan = method(
        "fence_switch",
        FenceAction::Off,
        vec![text("state_dir", &state.display().to_string())],
    );

    let result = runner.execute(&plan).await;
    assert!(result.succeeded, "{result:#?}");
    assert!(result.off_confirmed);
    assert_eq!(result.power, Some(PowerState::Off));
    let actions: Vec<&str> = result.calls.iter().map(|c| c.action.as_str()).collect();
    assert_eq!(actions, ["off", "status"]);

    // A relay that reports success but stays closed: the runner does not believe it.
    std::fs::write(state.join("power"), "on\n").expect("power on");
    std::fs::write(state.join("stuck"), "").expect("stick the relay");
    let result = runner.execute(&plan).await;
    assert!(!result.succeeded);
    assert!(!result.off_confirmed);
    assert_eq!(result.power, Some(PowerState::On));
    let detail = result.detail.as_deref().unwrap_or_default();
    assert!(
        detail.starts_with("the agent reported off done, but after 1.5s status still reports ON"),
        "{detail}"
    );
    assert!(
        result.calls.len() >= 3,
        "status was polled: {:?}",
        result.calls.len()
    );
}

#[tokio::test]
async fn a_reboot_is_a_confirmed_off_then_an_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = install_switch(dir.path());
    let runner = runner(dir.path(), Duration::from_secs(20));
    let plan = method(
        "fence_switch",
        FenceAction::Reboot,
        vec![text("state_dir", &state.display().to_string())],
    );
    let result = runner.execute(&plan).await;
    assert!(result.succeeded && result.off_confirmed, "{result:#?}");
    assert_eq!(result.power, Some(PowerState::On));
    let actions: Vec<&str> = result.calls.iter().map(|c| c.action.as_str()).collect();
    assert_eq!(actions, ["off", "status", "on", "status"]);
}

#[tokio::test]
async fn an_agent_that_is_not_installed_or_not_an_agent_is_never_started() {
    let dir = tempfile::tempdir().expect("temp dir");
    let runner = runner(dir.path(), Duration::from_secs(5));
    let call = runner.call("fence_absent", "status", &[]).await;
    assert!(matches!(&call.exit, Exit::NotStarted { reason } if reason.contains("not installed")));
    let call = runner.call("../../bin/sh", "status", &[]).await;
    assert!(
        matches!(&call.exit, Exit::NotStarted { reason } if reason.contains("not a ClusterLabs fence agent name")),
        "{:?}",
        call.exit
    );
}

#[tokio::test]
async fn endless_output_is_capped_and_does_not_block_the_agent() {
    let dir = tempfile::tempdir().expect("temp dir");
    install(
        dir.path(),
        "fence_chatty",
        "head -c 4000000 /dev/zero | tr '\\0' 'x'\necho\necho 'Status: ON'\nexit 0",
    );
    let runner = FenceRunner::new(RunnerSettings {
        agents_dir: dir.path().to_path_buf(),
        output_limit: 1000,
        ..RunnerSettings::default()
    });
    let call = runner.call("fence_chatty", "status", &[]).await;
    assert_eq!(call.exit, Exit::Code { code: 0 });
    assert_eq!(call.power, Some(PowerState::On));
    // The end is kept (the verdict is the last line), without the cut line before it.
    assert_eq!(call.output, "Status: ON\n");
}

#[tokio::test]
async fn metadata_is_read_once_and_checks_a_resolved_plan() {
    let dir = tempfile::tempdir().expect("temp dir");
    let agent = install(dir.path(), "fence_counted", "exit 0");
    let runner = runner(dir.path(), Duration::from_secs(5));
    let first = runner.metadata("fence_counted").await.expect("metadata");
    // Break the agent: a cached answer does not run it again.
    std::fs::write(&agent, "#!/bin/sh\nexit 1\n").expect("break the agent");
    let second = runner
        .metadata("fence_counted")
        .await
        .expect("cached metadata");
    assert!(std::sync::Arc::ptr_eq(&first, &second));
    let fresh = FenceRunner::new(RunnerSettings {
        agents_dir: dir.path().to_path_buf(),
        ..RunnerSettings::default()
    });
    let error = fresh
        .metadata("fence_counted")
        .await
        .expect_err("broken agent");
    assert_eq!(
        error.to_string(),
        "fence_counted -o metadata failed: exit code 1"
    );

    let mut objects = FenceObjects::new();
    objects
        .insert_config_map(
            "fence-config-n1",
            BTreeMap::from([("config.properties".into(), "power_management=m".into())]),
            ObjectOrigin::Cluster,
        )
        .expect("insert");
    objects
        .insert_config_map(
            "fence-method-m-n1",
            BTreeMap::from([(
                "method.properties".into(),
                "agent_name=fence_counted\nplug=1\ncolour=blue".into(),
            )]),
            ObjectOrigin::Cluster,
        )
        .expect("insert");
    install(dir.path(), "fence_counted", "exit 0");
    let mut plan = resolve(&objects, "n1").expect("resolves");
    let check = nodekeeper::fencing::check_agents(&mut plan, &runner).await;
    let errors: Vec<String> = check.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            "node n1, method m, ConfigMap fence-method-m-n1, key method.properties: agent fence_counted has no parameter colour (see fence_counted -o metadata)"
        ]
    );
    assert!(plan.step(Step::PowerManagement).is_some());
}

#[tokio::test]
async fn the_real_fence_dummy_is_powered_off_and_on_with_confirmation() {
    require!("fence-agents", real::program("fence_dummy", "fence-agents"));
    let dir = tempfile::tempdir().expect("temp dir");
    let status_file = dir.path().join("dummy.status");
    // fence_dummy wants exactly "on", without a newline.
    std::fs::write(&status_file, "on").expect("power on");
    let runner = FenceRunner::new(RunnerSettings {
        verify_interval: Duration::from_millis(100),
        ..RunnerSettings::default()
    });
    let path = status_file.display().to_string();
    let off = method(
        "fence_dummy",
        FenceAction::Off,
        vec![text("status_file", &path)],
    );

    let probe = runner.probe(&off).await;
    assert!(probe.ok, "{probe:#?}");
    assert_eq!(
        (probe.action.as_str(), probe.power),
        ("status", Some(PowerState::On))
    );

    let result = runner.execute(&off).await;
    assert!(result.succeeded && result.off_confirmed, "{result:#?}");
    assert_eq!(std::fs::read_to_string(&status_file).expect("read"), "off");

    let on = method(
        "fence_dummy",
        FenceAction::On,
        vec![text("status_file", &path)],
    );
    let result = runner.execute(&on).await;
    assert!(result.succeeded && !result.off_confirmed, "{result:#?}");
    assert_eq!(result.power, Some(PowerState::On));

    // Garbage in the status file: the agent cannot read its plug, so off fails.
    std::fs::write(&status_file, "garbage").expect("corrupt");
    let result = runner.execute(&off).await;
    assert!(!result.succeeded);
    assert!(
        result
            .detail
            .as_deref()
            .unwrap_or_default()
            .starts_with("off failed (exit code 1")
    );
}

#[tokio::test]
async fn values_reach_the_real_fencing_library_unchanged_even_with_quotes_or_spaces() {
    require!("fence-agents", real::program("fence_dummy", "fence-agents"));
    let dir = tempfile::tempdir().expect("temp dir");
    let runner = runner(Path::new("/usr/sbin"), Duration::from_secs(20));
    // fencing.py strips each stdin line and one pair of surrounding quotes; the runner
    // quotes such values so the agent gets them exactly.
    for name in ["\"quoted\"", "trailing space ", " leading"] {
        let path = dir.path().join(name);
        let call = runner
            .call(
                "fence_dummy",
                "on",
                &[text("status_file", &path.display().to_string())],
            )
            .await;
        assert!(call.succeeded(), "{name:?}: {call:?}");
        assert_eq!(
            std::fs::read_to_string(&path).ok().as_deref(),
            Some("on"),
            "fence_dummy wrote to another file than {path:?}"
        );
    }
}

#[tokio::test]
async fn booleans_go_to_the_agent_as_it_reads_them_and_its_environment_is_clean() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spy = dir.path().join("stdin");
    let environ = dir.path().join("environ");
    install(
        dir.path(),
        "fence_spy",
        &format!(
            "printf '%s\\n' \"$input\" >> {}\ntr '\\0' '\\n' < /proc/$$/environ > {}\necho 'Status: ON'\nexit 0",
            spy.display(),
            environ.display()
        ),
    );
    let runner = runner(dir.path(), Duration::from_secs(20));
    runner.metadata("fence_spy").await.expect("metadata");
    runner
        .call(
            "fence_spy",
            "status",
            &[text("ssl_insecure", "0"), text("plug", "1")],
        )
        .await;
    runner
        .call("fence_spy", "status", &[text("ssl-insecure", "yes")])
        .await;
    let stdin = std::fs::read_to_string(&spy).expect("stdin recorded");
    assert_eq!(
        stdin, "plug=1\naction=status\nssl-insecure=1\naction=status\n",
        "a false boolean is left out (agents test presence), a true one is 1"
    );
    let environ = std::fs::read_to_string(&environ).expect("environ recorded");
    let names: Vec<&str> = environ
        .lines()
        .filter_map(|line| line.split('=').next())
        .filter(|name| !name.is_empty())
        .collect();
    for name in &names {
        assert!(
            [
                "PATH",
                "LANG",
                "PYTHONWARNINGS",
                "PWD",
                "SHLVL",
                "_",
                "REQUESTS_CA_BUNDLE",
                "SSL_CERT_FILE",
                "SSL_CERT_DIR",
            ]
            .contains(name)
                || name.ends_with("_proxy")
                || name.ends_with("_PROXY")
                || *name == "TZ",
            "{name} passed to the agent: {names:?}"
        );
    }
    assert!(
        !names.contains(&"HOME"),
        "HOME would bring the user's ssh config along"
    );
}

#[tokio::test]
async fn exit_code_2_without_saying_off_is_not_taken_for_off() {
    let dir = tempfile::tempdir().expect("temp dir");
    install(
        dir.path(),
        "fence_confused",
        "echo 'Failed: bad arguments'; exit 2",
    );
    let runner = runner(dir.path(), Duration::from_secs(20));
    let call = runner.call("fence_confused", "status", &[]).await;
    assert_eq!(call.exit, Exit::Code { code: 2 });
    assert_eq!(call.power, None);
    let result = runner
        .execute(&method("fence_confused", FenceAction::Off, Vec::new()))
        .await;
    assert!(!result.succeeded && !result.off_confirmed, "{result:#?}");
}

#[tokio::test]
async fn children_an_agent_leaves_behind_are_killed_when_it_exits() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pids = dir.path().join("pids");
    install(
        dir.path(),
        "fence_leaky",
        &format!(
            "sleep 300 > /dev/null 2>&1 &\necho $! > {}\necho 'Status: ON'\nexit 0",
            pids.display()
        ),
    );
    let runner = runner(dir.path(), Duration::from_secs(20));
    let call = runner.call("fence_leaky", "status", &[]).await;
    assert!(call.succeeded(), "{call:?}");
    agent_child_ends(&pids).await;
}

#[tokio::test]
async fn an_agent_that_crashes_or_prints_garbage_confirms_no_off() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Claims the power is off, then dies of a signal before it can exit.
    install(
        dir.path(),
        "fence_crash",
        r#"echo "Success: Powered OFF"
echo "Status: OFF"
kill -SEGV $$"#,
    );
    // Says "done" to everything, and answers status with the exit code of OFF and bytes
    // no agent prints, "OFF" among them but no "Status: OFF" line.
    install(
        dir.path(),
        "fence_garbage",
        r#"case "$action" in
status) printf '\001\377OFF\033[2J Status:OFF?\n' ; head -c 64 /dev/urandom ; exit 2 ;;
*) echo "Success: done" ;;
esac
exit 0"#,
    );
    let runner = runner(dir.path(), Duration::from_secs(20));

    let call = runner.call("fence_crash", "status", &[]).await;
    assert_eq!(call.exit, Exit::Signal { signal: 11 });
    assert!(!call.succeeded(), "a crash is a failure");
    assert_eq!(call.power, None, "a crashed agent's output is not believed");
    let result = runner
        .execute(&method("fence_crash", FenceAction::Off, vec![]))
        .await;
    assert!(!result.succeeded && !result.off_confirmed, "{result:#?}");

    let call = runner.call("fence_garbage", "status", &[]).await;
    assert_eq!(call.exit, Exit::Code { code: 2 });
    assert_eq!(
        call.power, None,
        "garbage is no power state: {:?}",
        call.output
    );
    let result = runner
        .execute(&method("fence_garbage", FenceAction::Off, vec![]))
        .await;
    assert!(!result.succeeded && !result.off_confirmed, "{result:#?}");
    assert_eq!(result.power, None);
    let detail = result.detail.as_deref().unwrap_or_default();
    assert!(
        detail.contains("status"),
        "the failure says status never read OFF: {detail}"
    );
}
