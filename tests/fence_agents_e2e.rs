//! nodekeeper's fence toolkit driving real ClusterLabs fence agents against real device
//! emulators on loopback: the fire drill (`fence-config check --probe`) and `fence run`
//! powering a node off (confirmed by status) and on, through IPMI, Redfish and SNMP
//! PDUs, with a wrong password, a stuck relay and a failing first alternative. Every
//! credential comes from a Secret and must never show.

mod support;

use std::path::Path;

use support::fence_emulators::{IpmiOptions, IpmiSim, LOOPBACK, PduKind, Redfish, SnmpPdu};
use support::fence_manifests::{config_map, nodekeeper, secret, text};
use support::real;

/// `fence-config check` or `fence run` on `dir`'s files; fails the test if any credential
/// in `secrets` shows in the output or the log.
fn run(args: &[&str], dir: &Path, secrets: &[&str]) -> (Option<i32>, String) {
    let dir = dir.display().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--from", &dir]);
    let output = nodekeeper(&all, "debug");
    let stdout = text(&output.stdout);
    let everything = stdout.clone() + &text(&output.stderr);
    for secret in secrets {
        assert!(
            !everything.contains(secret),
            "{secret} shown:\n{everything}"
        );
    }
    (output.status.code(), everything)
}

/// `fence run --node NODE --step STEP --yes EXTRA...` on `dir`'s files (see [`run`]).
fn fence_run(
    node: &str,
    step: &str,
    extra: &[&str],
    dir: &Path,
    secrets: &[&str],
) -> (Option<i32>, String) {
    let mut args = vec!["fence", "run", "--node", node, "--step", step, "--yes"];
    args.extend_from_slice(extra);
    run(&args, dir, secrets)
}

/// `fence-config check --node NODE --probe` on `dir`'s files (see [`run`]).
fn probe(node: &str, dir: &Path, secrets: &[&str]) -> (Option<i32>, String) {
    run(
        &["fence-config", "check", "--node", node, "--probe"],
        dir,
        secrets,
    )
}

/// A node fenced over IPMI: power off for power management, on for recovery.
fn ipmi_config(dir: &Path, bmc: &IpmiSim, password: &str) {
    let yaml = config_map(
        "fence-config-worker-1",
        "config.properties",
        "node_name=worker-1\npower_management=ipmi-off\nrecovery=ipmi-on",
    ) + &config_map(
        "fence-method-ipmi-off-worker-1",
        "method.properties",
        &format!(
            "template=fence-method-template-ipmi\nipport={}\naction=off",
            bmc.port()
        ),
    ) + &config_map(
        "fence-method-ipmi-on-worker-1",
        "method.properties",
        &format!(
            "template=fence-method-template-ipmi\nipport={}\naction=on",
            bmc.port()
        ),
    ) + &config_map(
        "fence-method-template-ipmi",
        "template.properties",
        &format!(
            "agent_name=fence_ipmilan\nip={LOOPBACK}\nusername={}\npassword_secret=bmc-worker-1/password\npower_wait=0\npower_timeout=3",
            IpmiSim::USER
        ),
    ) + &secret("bmc-worker-1", "password", password);
    std::fs::write(dir.join("worker-1.yaml"), yaml).expect("write config");
}

#[test]
fn ipmi_probe_then_power_off_confirmed_then_on() {
    require!(
        "fence-agents",
        real::program("fence_ipmilan", "fence-agents")
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let config = dir.path().join("config");
    std::fs::create_dir(&config).expect("config dir");
    ipmi_config(&config, &bmc, IpmiSim::PASSWORD);
    let secrets = [IpmiSim::PASSWORD];

    let (code, out) = probe("worker-1", &config, &secrets);
    assert_eq!(code, Some(0), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("ipmi-off "))
        .unwrap_or_else(|| panic!("no probe row:\n{out}"));
    assert!(
        row.contains("fence_ipmilan  status  ok: reachable, credentials accepted  ON"),
        "{row}"
    );
    assert!(bmc.power_is_on(), "the probe never changes power");
    assert!(
        !bmc.chassis_log().contains("set"),
        "no power command: {}",
        bmc.chassis_log()
    );

    let (code, out) = fence_run("worker-1", "power-management", &[], &config, &secrets);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("ipmi-off (fence_ipmilan off): ok, OFF confirmed by status"),
        "{out}"
    );
    assert!(
        out.contains("fence_ipmilan status: exit code 2: Status: OFF, power OFF"),
        "{out}"
    );
    assert!(!bmc.power_is_on());

    let (code, out) = fence_run("worker-1", "recovery", &[], &config, &secrets);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("ipmi-on (fence_ipmilan on): ok in"), "{out}");
    assert!(bmc.power_is_on());
}

#[test]
fn ipmi_with_a_wrong_password_fails_the_probe_and_the_fence_without_showing_it() {
    require!(
        "fence-agents",
        real::program("fence_ipmilan", "fence-agents")
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let config = dir.path().join("config");
    std::fs::create_dir(&config).expect("config dir");
    let wrong = "Wr0ng-Passw0rd-xyz";
    ipmi_config(&config, &bmc, wrong);
    let secrets = [wrong, IpmiSim::PASSWORD];

    let (code, out) = probe("worker-1", &config, &secrets);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("ipmi-off ") && l.contains("FAILED")),
        "{out}"
    );
    let (code, out) = fence_run("worker-1", "power-management", &[], &config, &secrets);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("Step power-management FAILED: no alternative succeeded."),
        "{out}"
    );
    assert!(bmc.power_is_on(), "nothing was powered off");
}

#[test]
fn a_stuck_relay_is_never_taken_for_a_fence() {
    require!(
        "fence-agents",
        real::program("fence_ipmilan", "fence-agents")
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!(
        "ipmi_sim",
        IpmiSim::start_with(
            dir.path(),
            IpmiOptions {
                ignore_power_off: true
            }
        )
    );
    let config = dir.path().join("config");
    std::fs::create_dir(&config).expect("config dir");
    ipmi_config(&config, &bmc, IpmiSim::PASSWORD);
    let (code, out) = fence_run(
        "worker-1",
        "power-management",
        &[],
        &config,
        &[IpmiSim::PASSWORD],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(!out.contains("confirmed"), "{out}");
    assert!(
        out.contains("ipmi-off (fence_ipmilan off): FAILED"),
        "{out}"
    );
    assert!(bmc.power_is_on());
    assert!(
        bmc.chassis_log().contains("set power 0"),
        "the off was sent: {}",
        bmc.chassis_log()
    );
}

#[test]
fn a_failing_bmc_hands_over_to_two_pdu_outlets() {
    require!(
        "fence-agents",
        real::program("fence_apc_snmp", "fence-agents")
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("ipmi_sim", IpmiSim::start(dir.path()));
    let pdu = require!("snmpsim", SnmpPdu::start(dir.path(), PduKind::Apc));
    let config = dir.path().join("config");
    std::fs::create_dir(&config).expect("config dir");
    let wrong = "not-the-bmc-password";
    let yaml = config_map(
        "fence-config-worker-2",
        "config.properties",
        "power_management=ipmi-off | pdu-a-off pdu-b-off",
    ) + &config_map(
        "fence-method-ipmi-off-worker-2",
        "method.properties",
        &format!(
            "agent_name=fence_ipmilan\nip={LOOPBACK}\nipport={}\nusername=admin\npassword_secret=bmc/password\npower_wait=0",
            bmc.port()
        ),
    ) + &config_map(
        "fence-method-pdu-a-off-worker-2",
        "method.properties",
        "template=fence-method-template-apc\nplug=1",
    ) + &config_map(
        "fence-method-pdu-b-off-worker-2",
        "method.properties",
        "template=fence-method-template-apc\nplug=2",
    ) + &config_map(
        "fence-method-template-apc",
        "template.properties",
        &format!(
            "agent_name=fence_apc_snmp\nip={LOOPBACK}\nipport={}\ncommunity_secret=pdu/community",
            pdu.port()
        ),
    ) + &secret("bmc", "password", wrong)
        + &secret("pdu", "community", SnmpPdu::COMMUNITY);
    std::fs::write(config.join("worker-2.yaml"), yaml).expect("write config");

    let (code, out) = fence_run("worker-2", "power-management", &[], &config, &[wrong]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("  alternative 1: failed\n    ipmi-off (fence_ipmilan off): FAILED"),
        "{out}"
    );
    assert!(
        out.contains("pdu-a-off (fence_apc_snmp off): ok, OFF confirmed by status"),
        "{out}"
    );
    assert!(
        out.contains("pdu-b-off (fence_apc_snmp off): ok, OFF confirmed by status"),
        "{out}"
    );
    assert!(bmc.power_is_on(), "the BMC refused the wrong password");
    assert_eq!(pdu.outlet_is_on(1), Ok(false));
    assert_eq!(pdu.outlet_is_on(2), Ok(false));
    assert_eq!(pdu.outlet_is_on(4), Ok(true), "other outlets untouched");
}

#[test]
fn redfish_over_https_is_probed_and_powered_off_with_confirmation() {
    require!(
        "fence-agents",
        real::program("fence_redfish", "fence-agents")
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!("sushy-emulator", Redfish::start(dir.path()));
    let config = dir.path().join("config");
    std::fs::create_dir(&config).expect("config dir");
    let yaml = config_map(
        "fence-config-worker-3",
        "config.properties",
        "power_management=redfish-off",
    ) + &config_map(
        "fence-method-redfish-off-worker-3",
        "method.properties",
        &format!(
            "agent_name=fence_redfish\nip={LOOPBACK}\nipport={}\nusername={}\npassword_secret=redfish/password\nssl_insecure=1\nsystems_uri={}",
            bmc.port(),
            Redfish::USER,
            bmc.systems_uri()
        ),
    ) + &secret("redfish", "password", Redfish::PASSWORD);
    std::fs::write(config.join("worker-3.yaml"), yaml).expect("write config");
    let secrets = [Redfish::PASSWORD];

    let (code, out) = probe("worker-3", &config, &secrets);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("redfish-off ")
            && l.contains("ok: reachable, credentials accepted  ON")),
        "{out}"
    );
    // The emulator applies a power change 1 to 11 s after the request; fence_redfish
    // waits for it (power_timeout 20 s), and the runner's status confirms it.
    let (code, out) = fence_run("worker-3", "power-management", &[], &config, &secrets);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("redfish-off (fence_redfish off): ok, OFF confirmed by status"),
        "{out}"
    );
    assert_eq!(bmc.power_state().as_deref(), Ok("Off"));
}

#[test]
fn storage_isolation_runs_as_its_own_step_before_power() {
    // No SCSI device can be made on this machine (no configfs for LIO, no scsi_debug
    // module), so fence_scsi cannot run here; the isolation path is the same code with
    // the fence_dummy agent standing in for the storage fabric.
    require!("fence-agents", real::program("fence_dummy", "fence-agents"));
    let dir = tempfile::tempdir().expect("temp dir");
    let fabric = dir.path().join("fabric.port");
    std::fs::write(&fabric, "on").expect("port enabled");
    let yaml = config_map(
        "fence-config-worker-4",
        "config.properties",
        "isolation=fabric-off\npower_management=fabric-off\nrecovery=fabric-on",
    ) + &config_map(
        "fence-method-fabric-off-worker-4",
        "method.properties",
        &format!("agent_name=fence_dummy\nstatus_file={}", fabric.display()),
    ) + &config_map(
        "fence-method-fabric-on-worker-4",
        "method.properties",
        &format!("agent_name=fence_dummy\nstatus_file={}", fabric.display()),
    );
    std::fs::write(dir.path().join("worker-4.yaml"), yaml).expect("write config");
    let (code, out) = fence_run(
        "worker-4",
        "isolation",
        &[
            // fence_dummy keeps its state in a file: a test rig's option, allowed here.
            "--allow-option",
            "status_file",
        ],
        dir.path(),
        &[],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("Step isolation succeeded; OFF confirmed by status."),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&fabric).expect("read"), "off");
    let (code, out) = fence_run(
        "worker-4",
        "recovery",
        &["--allow-option", "status_file"],
        dir.path(),
        &[],
    );
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(std::fs::read_to_string(&fabric).expect("read"), "on");
}
