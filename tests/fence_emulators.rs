//! The fence-device emulators of `tests/support/fence_emulators.rs`, proven with the real
//! ClusterLabs fence agents (Debian package `fence-agents`) invoked directly, with every
//! option on stdin as `key=value` lines and no arguments: the agents read stdin only when
//! argv is empty, and without `action=` they reboot. Needs the emulators (`openipmi`, and
//! the venv `scripts/test` builds); fails under `CI=true` without them, skips otherwise.
//!
//! The agents' exit codes: 0 for success and for status ON, 2 for status OFF, 1 for any
//! failure.

mod support {
    pub mod fence_emulators;
    #[allow(dead_code)]
    pub mod real;
}

use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use support::fence_emulators::{
    self, AgentRun, IpmiOptions, IpmiSim, LOOPBACK, PduKind, Redfish, SnmpPdu,
};

const STATUS_ON: i32 = 0;
const SUCCESS: i32 = 0;
const FAILED: i32 = 1;
const STATUS_OFF: i32 = 2;

/// The installed agent, or why not.
fn fence_agent(name: &str) -> Result<PathBuf, String> {
    let path = Path::new("/usr/sbin").join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is not installed (apt-get install -y fence-agents)",
            path.display()
        ))
    }
}

/// [`fence_emulators::run_agent`], with what it did printed for the test's log.
fn run_agent(agent: &Path, options: &[(&str, &str)]) -> AgentRun {
    let run = fence_emulators::run_agent(agent, options);
    let action = options
        .iter()
        .find(|(key, _)| *key == "action")
        .map_or("?", |(_, value)| value);
    eprintln!(
        "{} action={action}: exit {} in {:.2?}: {}",
        agent.display(),
        run.exit_code,
        run.took,
        run.output.trim().replace('\n', " | ")
    );
    run
}

#[track_caller]
fn assert_exit(run: &AgentRun, exit_code: i32, output: &str) {
    assert_eq!(
        run.exit_code, exit_code,
        "exit code; the agent said: {}",
        run.output
    );
    assert!(
        run.output.contains(output),
        "expected {output:?} in the agent's output: {}",
        run.output
    );
}

/// The emulator process `pid` no longer exists (it was stopped and reaped).
#[track_caller]
fn assert_gone(pid: u32) {
    let raw = i32::try_from(pid).expect("a PID fits an i32");
    assert_eq!(
        kill(Pid::from_raw(raw), None),
        Err(Errno::ESRCH),
        "process {pid} still exists after its emulator was dropped"
    );
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
}

fn timed<T>(what: &str, start: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let value = start();
    eprintln!("{what} took {:.2?}", started.elapsed());
    value
}

// ------------------------------------------------------------------ ipmi_sim

fn ipmilan_options<'a>(bmc_port: &'a str, action: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("action", action),
        ("ip", LOOPBACK),
        ("ipport", bmc_port),
        ("username", IpmiSim::USER),
        ("password", IpmiSim::PASSWORD),
        // No pause between the power command and the status check: the simulated chassis
        // switches at once.
        ("power_wait", "0"),
    ]
}

#[test]
fn fence_ipmilan_switches_ipmi_sim_power() {
    let agent = require!("fence-agents", fence_agent("fence_ipmilan"));
    let dir = tempfile::tempdir().expect("temp dir");
    let bmc = require!(
        "ipmi_sim",
        timed("ipmi_sim start", || IpmiSim::start(dir.path()))
    );
    let port = bmc.port().to_string();
    let pid = bmc.pid();
    assert!(bmc.power_is_on(), "the BMC starts with the power on");

    let status = run_agent(&agent, &ipmilan_options(&port, "status"));
    assert_exit(&status, STATUS_ON, "Status: ON");

    let off = run_agent(&agent, &ipmilan_options(&port, "off"));
    assert_exit(&off, SUCCESS, "Powered OFF");
    assert!(!bmc.power_is_on(), "the power file says off after off");
    assert!(
        bmc.chassis_log().contains("set power 0"),
        "the BMC saw the power-off: {}",
        bmc.chassis_log()
    );

    let status = run_agent(&agent, &ipmilan_options(&port, "status"));
    assert_exit(&status, STATUS_OFF, "Status: OFF");

    let on = run_agent(&agent, &ipmilan_options(&port, "on"));
    assert_exit(&on, SUCCESS, "Powered ON");
    assert!(bmc.power_is_on(), "the power file says on after on");

    // Power switched behind the BMC's back shows in its status.
    bmc.set_power(false);
    let status = run_agent(&agent, &ipmilan_options(&port, "status"));
    assert_exit(&status, STATUS_OFF, "Status: OFF");

    timed("ipmi_sim stop", || drop(bmc));
    assert_gone(pid);
}

#[test]
fn fence_ipmilan_off_fails_against_a_stuck_relay() {
    let agent = require!("fence-agents", fence_agent("fence_ipmilan"));
    let dir = tempfile::tempdir().expect("temp dir");
    let options = IpmiOptions {
        ignore_power_off: true,
    };
    let bmc = require!("ipmi_sim", IpmiSim::start_with(dir.path(), options));
    let port = bmc.port().to_string();
    let pid = bmc.pid();

    let mut off_options = ipmilan_options(&port, "off");
    // The agent polls the status until this timeout; the default is 20 s.
    off_options.push(("power_timeout", "3"));
    let off = run_agent(&agent, &off_options);
    assert!(
        bmc.chassis_log().contains("set power 0"),
        "the BMC accepted the power-off: {}",
        bmc.chassis_log()
    );
    assert!(bmc.power_is_on(), "the stuck relay kept the power on");
    assert_exit(&off, FAILED, "Timed out waiting to power OFF");

    drop(bmc);
    assert_gone(pid);
}

// ------------------------------------------------------------------ sushy-emulator

#[test]
fn fence_redfish_powers_off_a_sushy_system() {
    let agent = require!("fence-agents", fence_agent("fence_redfish"));
    let dir = tempfile::tempdir().expect("temp dir");
    let redfish = require!(
        "sushy-emulator",
        timed("sushy-emulator start", || Redfish::start(dir.path()))
    );
    let port = redfish.port().to_string();
    let systems_uri = redfish.systems_uri();
    let pid = redfish.pid();
    assert_eq!(redfish.power_state().as_deref(), Ok("On"));

    let options = |action| {
        vec![
            ("action", action),
            ("ip", LOOPBACK),
            ("ipport", port.as_str()),
            ("username", Redfish::USER),
            ("password", Redfish::PASSWORD),
            // The emulator's certificate is self-signed.
            ("ssl_insecure", "1"),
            ("systems_uri", systems_uri.as_str()),
        ]
    };
    let status = run_agent(&agent, &options("status"));
    assert_exit(&status, STATUS_ON, "Status: ON");

    // The fake driver applies the change 1-11 s later; the agent polls until it has.
    let off = run_agent(&agent, &options("off"));
    assert_exit(&off, SUCCESS, "Powered OFF");
    assert_eq!(redfish.power_state().as_deref(), Ok("Off"));

    let status = run_agent(&agent, &options("status"));
    assert_exit(&status, STATUS_OFF, "Status: OFF");

    timed("sushy-emulator stop", || drop(redfish));
    assert_gone(pid);
}

// ------------------------------------------------------------------ snmpsim

fn snmp_options<'a>(port: &'a str, action: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("action", action),
        ("ip", LOOPBACK),
        ("ipport", port),
        ("community", SnmpPdu::COMMUNITY),
        ("plug", "1"),
    ]
}

#[test]
fn fence_apc_snmp_switches_an_outlet() {
    let agent = require!("fence-agents", fence_agent("fence_apc_snmp"));
    let dir = tempfile::tempdir().expect("temp dir");
    let pdu = require!(
        "snmpsim",
        timed("snmpsim (APC) start", || SnmpPdu::start(
            dir.path(),
            PduKind::Apc
        ))
    );
    let port = pdu.port().to_string();
    let pid = pdu.pid();
    let outlets: Vec<bool> = (1..=4)
        .map(|plug| pdu.outlet_is_on(plug).expect("read an outlet"))
        .collect();
    assert_eq!(outlets, [true, true, false, true], "the initial outlets");

    let status = run_agent(&agent, &snmp_options(&port, "status"));
    assert_exit(&status, STATUS_ON, "Status: ON");

    let off = run_agent(&agent, &snmp_options(&port, "off"));
    assert_exit(&off, SUCCESS, "Powered OFF");
    assert_eq!(pdu.outlet_is_on(1), Ok(false));
    assert_eq!(pdu.outlet_is_on(2), Ok(true), "only plug 1 was switched");

    let status = run_agent(&agent, &snmp_options(&port, "status"));
    assert_exit(&status, STATUS_OFF, "Status: OFF");

    let on = run_agent(&agent, &snmp_options(&port, "on"));
    assert_exit(&on, SUCCESS, "Powered ON");
    assert_eq!(pdu.outlet_is_on(1), Ok(true));

    timed("snmpsim stop", || drop(pdu));
    assert_gone(pid);
}

#[test]
fn fence_eaton_snmp_switches_an_outlet() {
    let agent = require!("fence-agents", fence_agent("fence_eaton_snmp"));
    let dir = tempfile::tempdir().expect("temp dir");
    let pdu = require!(
        "snmpsim",
        timed("snmpsim (Eaton) start", || SnmpPdu::start(
            dir.path(),
            PduKind::Eaton
        ))
    );
    let port = pdu.port().to_string();
    let pid = pdu.pid();
    let outlets: Vec<bool> = (1..=4)
        .map(|plug| pdu.outlet_is_on(plug).expect("read an outlet"))
        .collect();
    assert_eq!(outlets, [true, true, false, true], "the initial outlets");

    let status = run_agent(&agent, &snmp_options(&port, "status"));
    assert_exit(&status, STATUS_ON, "Status: ON");

    let mut off_options = snmp_options(&port, "off");
    off_options.push(("power_wait", "0")); // the agent's default is a 2 s pause
    let off = run_agent(&agent, &off_options);
    assert_exit(&off, SUCCESS, "Powered OFF");
    assert_eq!(pdu.outlet_is_on(1), Ok(false));
    assert_eq!(pdu.outlet_is_on(2), Ok(true), "only plug 1 was switched");

    let status = run_agent(&agent, &snmp_options(&port, "status"));
    assert_exit(&status, STATUS_OFF, "Status: OFF");

    drop(pdu);
    assert_gone(pid);
}

// ------------------------------------------------------------------ the harness itself

#[test]
fn emulators_of_one_kind_run_side_by_side_on_their_own_ports() {
    let dir_a = tempfile::tempdir().expect("temp dir");
    let dir_b = tempfile::tempdir().expect("temp dir");
    let bmc_a = require!("ipmi_sim", IpmiSim::start(dir_a.path()));
    let bmc_b = require!("ipmi_sim", IpmiSim::start(dir_b.path()));
    assert_ne!(bmc_a.port(), bmc_b.port());
    bmc_b.set_power(false);
    assert!(bmc_a.power_is_on());
    assert!(!bmc_b.power_is_on());
}
