//! `nodekeeper fence-config check` and `nodekeeper fence run` as an operator runs them:
//! the merged plan with masked credentials, precise errors and exit codes, the fire
//! drill, a step with alternatives, the cluster as the source, and no password ever in
//! the output, the logs or an agent's argv.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use support::apiserver::{RbacAccess, cluster};
use support::fake_fence_agents::{install, install_switch};
use support::fence_manifests::{self, config_dir, config_map, secret, text};
use support::real;

const ORIGINAL: &str = "tests/fixtures/fencing/original-design";

fn nodekeeper(args: &[&str]) -> Output {
    fence_manifests::nodekeeper(args, "warn")
}

/// The standard output of a run that must exit 0; both outputs are shown if it did not.
fn stdout_of_success(output: &Output) -> String {
    let stdout = text(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        text(&output.stderr)
    );
    stdout
}

/// `nodekeeper args --from dir --agents-dir agents` with `RUST_LOG=level`.
fn from_files(args: &[&str], dir: &Path, agents: &Path, level: &str) -> Output {
    let dir = dir.display().to_string();
    let agents = agents.display().to_string();
    let mut all = args.to_vec();
    all.extend(["--from", &dir, "--agents-dir", &agents]);
    fence_manifests::nodekeeper(&all, level)
}

#[test]
fn check_prints_the_original_designs_plan_and_names_its_real_mistake() {
    require!(
        "fence-agents",
        real::program("fence_eaton_snmp", "fence-agents")
    );
    let output = nodekeeper(&[
        "fence-config",
        "check",
        "--node",
        "lago-kube-host1",
        "--from",
        ORIGINAL,
    ]);
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    for expected in [
        "Fence plan for node lago-kube-host1 (ConfigMap fence-config-lago-kube-host1)",
        "isolation:\n  method fc-off: fence_brocade off  [fence-method-fc-off-lago-kube-host1, template fence-method-template-fc-switch-brocade]",
        "power-management:\n  method eaton-off: fence_eaton_snmp off",
        "recovery:\n  method fc-on: fence_brocade on",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in\n{stdout}"
        );
    }
    assert!(
        stdout.lines().any(|l| l.trim_start().starts_with("plug")
            && l.contains(" 2 ")
            && l.ends_with("node")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("password")
                && l.contains("***")
                && l.ends_with("template")),
        "{stdout}"
    );
    assert_eq!(
        stderr,
        "error: node lago-kube-host1, method eaton-off, ConfigMap fence-method-template-eaton-pdu, key template.properties: agent fence_eaton_snmp has no parameter inet4-only (see fence_eaton_snmp -o metadata)\n\
         error: node lago-kube-host1, method eaton-on, ConfigMap fence-method-template-eaton-pdu, key template.properties: agent fence_eaton_snmp has no parameter inet4-only (see fence_eaton_snmp -o metadata)\n"
    );
    for password in ["brocade_password", "eaton_password", "eaton_snmp_passwd"] {
        assert!(
            !stdout.contains(password) && !stderr.contains(password),
            "{password} shown"
        );
    }
}

#[test]
fn check_as_json_for_programs() {
    let dir = config_dir(&[(
        "node.yaml",
        &(config_map("fence-config-n1", "config.properties", "power_management=m")
            + &config_map(
                "fence-method-m-n1",
                "method.properties",
                "agent_name=fence_nowhere\nplug=1\npassword_secret=bmc/password",
            )
            + &secret("bmc", "password", "s3cret-json")),
    )]);
    let agents = tempfile::tempdir().expect("agents dir");
    let output = from_files(
        &["fence-config", "check", "--node", "n1", "--output", "json"],
        dir.path(),
        agents.path(),
        "warn",
    );
    let stdout = stdout_of_success(&output);
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["valid"], true);
    assert_eq!(json["notInstalled"], serde_json::json!(["fence_nowhere"]));
    let method = &json["plan"]["steps"][0]["alternatives"][0]["methods"][0];
    assert_eq!(method["agent"], "fence_nowhere");
    assert_eq!(method["action"], "off");
    let password = method["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .find(|p| p["name"] == "password")
        .expect("password");
    assert_eq!(password["value"], "***");
    assert_eq!(
        password["secret"],
        serde_json::json!({"secret": "bmc", "key": "password"})
    );
    assert!(!stdout.contains("s3cret-json"));
}

#[test]
fn check_fails_with_each_error_on_its_own_line() {
    let dir = config_dir(&[(
        "node.yaml",
        &(config_map(
            "fence-config-n1",
            "config.properties",
            "isolation=a\npower_management=b",
        ) + &config_map("fence-method-a-n1", "method.properties", "plug=1")),
    )]);
    let output = nodekeeper(&[
        "fence-config",
        "check",
        "--node",
        "n1",
        "--from",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(text(&output.stdout), "");
    assert_eq!(
        text(&output.stderr),
        "error: node n1, method a, ConfigMap fence-method-a-n1, key method.properties: no agent_name, neither in the method nor in its template\n\
         error: node n1, ConfigMap fence-config-n1, key config.properties: method b of step power-management is not defined: no ConfigMap fence-method-b-n1 (key method.properties) and no key fence-method-b in fence-config-n1\n"
    );
    let missing = nodekeeper(&[
        "fence-config",
        "check",
        "--node",
        "n1",
        "--from",
        "/nonexistent-dir",
    ]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).starts_with("error: cannot read /nonexistent-dir:"),
        "{}",
        text(&missing.stderr)
    );
    let no_cluster = nodekeeper(&["fence-config", "check", "--node", "n1"]);
    assert_eq!(no_cluster.status.code(), Some(1));
    assert!(text(&no_cluster.stderr).contains("no cluster to read the fence configuration from"));
}

/// A node whose power management tries fence_dummy first (its status file holds garbage,
/// so it fails), then two switch outlets.
fn alternatives_setup() -> (tempfile::TempDir, tempfile::TempDir, PathBuf) {
    let agents = tempfile::tempdir().expect("agents dir");
    std::os::unix::fs::symlink("/usr/sbin/fence_dummy", agents.path().join("fence_dummy"))
        .expect("link fence_dummy");
    let state = install_switch(agents.path());
    let dummy_status = agents.path().join("dummy.status");
    std::fs::write(&dummy_status, "garbage").expect("broken dummy");
    let dir = config_dir(&[(
        "fencing.yaml",
        &(config_map(
            "fence-config-n1",
            "config.properties",
            "power_management=dummy-off | outlet-a outlet-b",
        ) + &config_map(
            "fence-method-dummy-off-n1",
            "method.properties",
            &format!(
                "agent_name=fence_dummy\nstatus_file={}",
                dummy_status.display()
            ),
        ) + &config_map(
            "fence-method-outlet-a-n1",
            "method.properties",
            "template=fence-method-template-switch\nplug=1",
        ) + &config_map(
            "fence-method-outlet-b-n1",
            "method.properties",
            "template=fence-method-template-switch\nplug=2",
        ) + &config_map(
            "fence-method-template-switch",
            "template.properties",
            &format!(
                "agent_name=fence_switch\nstate_dir={}\nusername=admin\npassword_secret=switch/password",
                state.display()
            ),
        ) + &secret("switch", "password", "sw1tch-pw")),
    )]);
    (agents, dir, state)
}

/// `fence run` on node n1's `step` in the [`alternatives_setup`] rig, with `--yes` if `yes`.
fn run_alternatives(
    agents: &tempfile::TempDir,
    dir: &tempfile::TempDir,
    step: &str,
    yes: bool,
) -> Output {
    let mut args = vec!["fence", "run", "--node", "n1", "--step", step];
    if yes {
        args.push("--yes");
    }
    // fence_dummy keeps its state in a file: a test rig's option, allowed here.
    args.extend(["--allow-option", "status_file"]);
    from_files(&args, dir.path(), agents.path(), "warn")
}

#[test]
fn fence_run_without_yes_only_says_what_it_would_do() {
    require!("fence-agents", real::program("fence_dummy", "fence-agents"));
    let (agents, dir, state) = alternatives_setup();
    let output = run_alternatives(&agents, &dir, "power-management", false);
    let stdout = stdout_of_success(&output);
    assert!(
        stdout.contains("alternative 1 (tried first):\n    method dummy-off: fence_dummy off"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "alternative 2 (if the one before failed):\n    method outlet-a: fence_switch off"
        ),
        "{stdout}"
    );
    assert!(
        stdout.ends_with("Nothing was done; add --yes to run these agents.\n"),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(state.join("power")).expect("power"),
        "on\n",
        "nothing ran"
    );
}

#[test]
fn fence_run_falls_back_to_the_second_alternative_and_confirms_off() {
    require!("fence-agents", real::program("fence_dummy", "fence-agents"));
    let (agents, dir, state) = alternatives_setup();
    let output = run_alternatives(&agents, &dir, "power-management", true);
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("  alternative 1: failed\n    dummy-off (fence_dummy off): FAILED"),
        "{stdout}"
    );
    assert!(stdout.contains("  alternative 2: succeeded\n    outlet-a (fence_switch off): ok, OFF confirmed by status"), "{stdout}");
    assert!(
        stdout.contains("    outlet-b (fence_switch off): ok, OFF confirmed by status"),
        "{stdout}"
    );
    assert!(
        stdout.ends_with("Step power-management succeeded; OFF confirmed by status.\n"),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(state.join("power")).expect("power"),
        "off\n"
    );
    assert!(!stdout.contains("sw1tch-pw") && !stderr.contains("sw1tch-pw"));

    // Recovery is not configured for this node: a precise refusal, nothing run.
    let output = run_alternatives(&agents, &dir, "recovery", true);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        text(&output.stderr),
        "error: node n1: ConfigMap fence-config-n1 has no recovery step\n"
    );
}

#[test]
fn a_password_never_appears_in_output_logs_or_an_agents_argv_right_or_wrong() {
    let agents = tempfile::tempdir().expect("agents dir");
    let spy = agents.path().join("spy");
    std::fs::create_dir(&spy).expect("spy dir");
    // A chatty device that echoes the password it was given and refuses it.
    install(
        agents.path(),
        "fence_spy",
        &format!(
            r#"spy={spy}
printf '%s\n' "$0" "$@" >> "$spy/argv"
tr '\0' '\n' < /proc/$$/environ >> "$spy/environ"
echo "login as admin with password '$password'"
echo "Failed: wrong password $password" >&2
exit 1"#,
            spy = spy.display()
        ),
    );
    let password = "Corr3ct-Horse-Battery";
    let dir = config_dir(&[(
        "fencing.yaml",
        &(config_map(
            "fence-config-n1",
            "config.properties",
            "power_management=bmc",
        ) + &config_map(
            "fence-method-bmc-n1",
            "method.properties",
            "agent_name=fence_spy\nip=10.0.0.1\nusername=admin\npassword_secret=bmc/password",
        ) + &secret("bmc", "password", password)),
    )]);
    let check = ["fence-config", "check", "--node", "n1", "--probe"];
    let fence_run = [
        "fence",
        "run",
        "--node",
        "n1",
        "--step",
        "power-management",
        "--yes",
    ];
    let as_json = |args: &[&'static str]| [args, &["--output", "json"]].concat();
    let probe = from_files(&check, dir.path(), agents.path(), "warn");
    let probe_json = from_files(&as_json(&check), dir.path(), agents.path(), "warn");
    let run = from_files(&fence_run, dir.path(), agents.path(), "trace");
    let run_json = from_files(&as_json(&fence_run), dir.path(), agents.path(), "warn");

    assert_eq!(probe.status.code(), Some(1), "the device refused");
    let probe_out = text(&probe.stdout);
    assert!(
        probe_out.contains("bmc     fence_spy  status  FAILED"),
        "{probe_out}"
    );
    assert!(
        probe_out.contains("exit code 1: Failed: wrong password ***"),
        "{probe_out}"
    );
    assert_eq!(run.status.code(), Some(1));
    let log = text(&run.stderr);
    assert!(
        log.contains("running fence agent") && log.contains("\"password\""),
        "parameter names are logged: {log}"
    );
    for output in [&probe, &probe_json, &run, &run_json] {
        let all = text(&output.stdout) + &text(&output.stderr);
        assert!(!all.contains(password), "password shown:\n{all}");
        assert!(
            all.contains("***"),
            "the agent's echo was redacted, not dropped:\n{all}"
        );
    }
    let argv = std::fs::read_to_string(spy.join("argv")).expect("agent ran");
    let environ = std::fs::read_to_string(spy.join("environ")).expect("agent ran");
    assert!(
        argv.lines().all(|line| line.ends_with("fence_spy")),
        "arguments passed: {argv}"
    );
    assert!(!environ.contains(password));
}

#[test]
fn the_probe_reports_power_without_changing_it() {
    let agents = tempfile::tempdir().expect("agents dir");
    let state = install_switch(agents.path());
    let dir = config_dir(&[(
        "fencing.yaml",
        &(config_map(
            "fence-config-n1",
            "config.properties",
            "power_management=outlet\nrecovery=outlet-on",
        ) + &config_map(
            "fence-method-outlet-n1",
            "method.properties",
            &format!("agent_name=fence_switch\nstate_dir={}", state.display()),
        ) + &config_map(
            "fence-method-outlet-on-n1",
            "method.properties",
            &format!(
                "agent_name=fence_switch\nstate_dir={}\naction=on",
                state.display()
            ),
        )),
    )]);
    let output = from_files(
        &["fence-config", "check", "--node", "n1", "--probe"],
        dir.path(),
        agents.path(),
        "warn",
    );
    let stdout = stdout_of_success(&output);
    assert!(
        stdout.contains("Probe (status only; power was not changed):"),
        "{stdout}"
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("fence_switch  status"))
        .collect();
    assert_eq!(rows.len(), 2, "one row per method: {stdout}");
    assert!(
        rows.iter()
            .all(|r| r.contains("ok: reachable, credentials accepted  ON")),
        "{rows:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(state.join("power")).expect("power"),
        "on\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_is_read_from_the_cluster_with_secrets_fetched_by_name() {
    let cluster = cluster().await;
    let client = cluster.client();
    let namespace = cluster.namespace();
    let suffix = std::process::id();
    let node = format!("fence-test-{suffix}");
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let objects: Vec<ConfigMap> = [
        (
            format!("fence-config-{node}"),
            "config.properties",
            "power_management=ipmi".to_string(),
        ),
        (
            format!("fence-method-ipmi-{node}"),
            "method.properties",
            format!("template=fence-method-template-ipmi-{suffix}\nip=10.0.0.7"),
        ),
        (
            format!("fence-method-template-ipmi-{suffix}"),
            "template.properties",
            format!(
                "agent_name=fence_ipmilan\nusername=admin\npassword_secret=bmc-{suffix}/password"
            ),
        ),
        (format!("unrelated-{suffix}"), "other", "x".to_string()),
        // Another node's method: its Secret is not read when fencing this node.
        (
            format!("fence-method-ipmi-other-node-{suffix}"),
            "method.properties",
            format!("agent_name=fence_ipmilan\npassword_secret=other-bmc-{suffix}/password"),
        ),
    ]
    .into_iter()
    .map(|(name, key, text)| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name),
            ..Default::default()
        },
        data: Some([(key.to_string(), text)].into()),
        ..Default::default()
    })
    .collect();
    for object in &objects {
        config_maps
            .create(&PostParams::default(), object)
            .await
            .expect("create ConfigMap");
    }
    let bmc = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("bmc-{suffix}")),
            labels: Some(
                [(
                    "fencing.nodekeeper.io/credentials".to_string(),
                    "true".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        string_data: Some([("password".to_string(), "cluster-s3cret".to_string())].into()),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &bmc)
        .await
        .expect("create Secret");

    let loaded =
        nodekeeper::kubernetes::fencing::load_fence_objects(&client, &namespace, &node).await;
    let plan = loaded
        .as_ref()
        .map_err(ToString::to_string)
        .and_then(|objects| {
            nodekeeper::fencing::resolve(objects, &node).map_err(|e| e.to_string())
        });

    if let Some(fake) = cluster.fake() {
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        fake.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        let output = nodekeeper(&[
            "fence-config",
            "check",
            "--node",
            &node,
            "--namespace",
            &namespace,
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--output",
            "json",
        ]);
        let stdout = text(&output.stdout);
        let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
        let parameters = json["plan"]["steps"][0]["alternatives"][0]["methods"][0]["parameters"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let ip = parameters.iter().find(|p| p["name"] == "ip");
        assert_eq!(
            ip.map(|p| &p["value"]),
            Some(&serde_json::json!("10.0.0.7")),
            "{stdout}"
        );
        assert!(!stdout.contains("cluster-s3cret"));
        let other = format!("other-bmc-{suffix}");
        assert!(
            fake.requests().iter().all(|r| !r.path.contains(&other)),
            "another node's Secret was read"
        );
        let accesses = fake.rbac_accesses();
        let access = |verb: &str, resource: &str| RbacAccess {
            verb: verb.to_string(),
            group: String::new(),
            resource: resource.to_string(),
        };
        assert!(
            accesses.contains(&access("list", "configmaps")),
            "{accesses:?}"
        );
        assert!(accesses.contains(&access("get", "secrets")), "{accesses:?}");
        assert!(
            !accesses.contains(&access("list", "secrets")),
            "Secrets are read by name only"
        );
    }

    for object in &objects {
        let name = object.metadata.name.as_deref().unwrap_or_default();
        let _ = config_maps.delete(name, &DeleteParams::default()).await;
    }
    let _ = secrets
        .delete(&format!("bmc-{suffix}"), &DeleteParams::default())
        .await;

    let plan = plan.expect("the plan resolves from the cluster");
    let (_, method) = plan.methods().next().expect("one method");
    assert_eq!(
        method.parameter("ip").map(|p| p.value.shown()),
        Some("10.0.0.7")
    );
    assert_eq!(
        method.parameter("password").map(|p| p.value.expose()),
        Some("cluster-s3cret")
    );
}

/// The execution document the controller writes into a Job (its wire format, version
/// 1): switch plug 3 off, the password read from Secret `bmc`, key `password`.
fn job_execution(state: &Path, version: u32) -> String {
    serde_json::json!({
        "version": version,
        "node": "n1",
        "method": "outlet-off",
        "configMap": "fence-method-outlet-off-n1",
        "agent": "fence_switch",
        "action": "off",
        "mode": "act",
        "parameters": [
            {"name": "state_dir", "written": "state_dir", "configMap": "fence-method-outlet-off-n1",
             "key": "method.properties", "value": state.display().to_string()},
            {"name": "plug", "written": "plug", "configMap": "fence-method-outlet-off-n1",
             "key": "method.properties", "value": "3"},
            {"name": "password", "written": "password_secret", "configMap": "fence-method-outlet-off-n1",
             "key": "method.properties", "secret": {"secret": "bmc", "key": "password"}}
        ],
        "callTimeoutSeconds": 10,
        "verifyTimeoutSeconds": 5
    })
    .to_string()
}

#[test]
fn the_job_wrapper_gives_the_agent_the_mounted_credential_on_stdin_and_reports_the_confirmed_off() {
    let agents = tempfile::tempdir().expect("agents dir");
    let state = install_switch(agents.path());
    // The switch also records the password it was given, so the test can see it arrived.
    let spy = agents.path().join("fence_switch");
    let script = std::fs::read_to_string(&spy).expect("switch");
    std::fs::write(
        &spy,
        script.replacen(
            "power_file=",
            "printf '%s' \"$password\" > \"$state_dir/password\"\nprintf '%s\\n' \"$0\" \"$@\" >> \"$state_dir/argv\"\necho \"login with $password\"\npower_file=",
            1,
        ),
    )
    .expect("spy");
    let password = "Tr0ub4dor&3";
    let pod = tempfile::tempdir().expect("pod dir");
    let secrets = pod.path().join("secrets");
    std::fs::create_dir_all(secrets.join("bmc")).expect("volume");
    std::fs::write(secrets.join("bmc/password"), password).expect("key file");
    let result_file = pod.path().join("termination-log");
    let execute = |document: &str| {
        fence_manifests::nodekeeper(
            &[
                "fence",
                "execute",
                "--execution",
                document,
                "--secrets-dir",
                &secrets.display().to_string(),
                "--result-file",
                &result_file.display().to_string(),
                "--agents-dir",
                &agents.path().display().to_string(),
            ],
            "warn",
        )
    };

    let output = execute(&job_execution(&state, 1));
    let stdout = stdout_of_success(&output);
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result_file).expect("result"))
            .expect("json");
    assert_eq!(result["succeeded"], true, "{result}");
    assert_eq!(result["offConfirmed"], true, "{result}");
    assert_eq!(result["power"], "OFF", "{result}");
    assert_eq!(result["version"], 1);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(stdout.trim()).expect("stdout is the result"),
        result
    );
    assert_eq!(
        std::fs::read_to_string(state.join("power"))
            .expect("power")
            .trim(),
        "off"
    );
    assert_eq!(
        std::fs::read_to_string(state.join("password")).expect("the agent ran"),
        password,
        "the credential reached the agent"
    );
    let argv = std::fs::read_to_string(state.join("argv")).expect("argv");
    assert!(
        argv.lines().all(|line| line.ends_with("fence_switch")),
        "{argv}"
    );
    let all = stdout + &text(&output.stderr);
    assert!(!all.contains(password), "{all}");

    // Refused executions exit 1 with the reason in the result file, and switch nothing.
    let refused = |document: &str| {
        let output = execute(document);
        assert_eq!(output.status.code(), Some(1));
        std::fs::read_to_string(&result_file).expect("result")
    };
    let power = || {
        std::fs::read_to_string(state.join("power"))
            .expect("power")
            .trim()
            .to_string()
    };

    // A key missing from the volume: named, with no value, and nothing runs.
    std::fs::remove_file(secrets.join("bmc/password")).expect("remove key");
    std::fs::write(state.join("power"), "on\n").expect("power on");
    let result = refused(&job_execution(&state, 1));
    assert!(
        result.contains("method outlet-off: cannot read parameter password_secret from")
            && result.contains("bmc/password"),
        "{result}"
    );
    assert_eq!(power(), "on");

    // A pod started after the execution's start deadline runs nothing.
    std::fs::write(secrets.join("bmc/password"), password).expect("key file");
    let mut late: serde_json::Value =
        serde_json::from_str(&job_execution(&state, 1)).expect("json");
    late["startDeadline"] = "2026-01-01T00:00:00Z".into();
    let result = refused(&late.to_string());
    assert!(
        result.contains("not started: the execution had to start by"),
        "{result}"
    );
    assert_eq!(power(), "on");

    // A document from another release is refused by its version.
    let result = refused(&job_execution(&state, 2));
    assert!(result.contains("has version 2"), "{result}");
}
