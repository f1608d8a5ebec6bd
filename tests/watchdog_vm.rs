//! Self-isolation's last resort against real parts (issue 13, part 5): the agent binary
//! in a qemu machine with an emulated Intel 6300ESB watchdog (Debian's kernel and its
//! `i6300esb` driver), armed for self-isolation as on a node with no fence device. What
//! no test may do to the machine it runs on, the machine does here: a hung agent stops
//! petting the watchdog, which resets the node; an isolation the agent cannot carry out
//! ends in `reboot(2)`. The machine runs no systemd and reaches no API server nor
//! controller: it is a node cut off from both from its first second.
//!
//! qemu's QMP events say what stopped the machine: `WATCHDOG` for the watchdog (which
//! pauses it), `SHUTDOWN` with reason `guest-reset` for `reboot(2)` (`-no-reboot`).

mod support;

use std::time::{Duration, Instant};

use support::vm::{Vm, VmParts};

/// The watchdog's timeout the agent sets (`isolation.watchdogTimeout`). The agent pets
/// it every quarter of it; under emulation on a busy machine the agent's pets may come
/// seconds late, so the timeout leaves room for that.
const WATCHDOG_TIMEOUT: Duration = Duration::from_secs(10);

/// The machine's `/init`: the file systems the agent reads, a cgroup v2 tree with the
/// pods cgroup, the watchdog driver, then the agent (its log on the console), then `rest`.
fn init(rest: &str) -> String {
    format!(
        "#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
# The loopback up, so that the agent's API server and controller refuse connections, as
# on a node they are cut off from, rather than being unreachable.
ip link set lo up
echo '+memory +pids' > /sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/kubepods /run/nodekeeper
{load_modules} || echo 'guest: failed: the kernel modules did not load'
RUST_LOG=info NO_COLOR=1 /usr/bin/nodekeeper agent --config /etc/nodekeeper/agent.yaml \\
    --kubeconfig /etc/nodekeeper/kubeconfig --metrics-addr 127.0.0.1:0 &
AGENT=$!
echo \"guest: agent $AGENT started\"
# The agent records its arming in contact.json before it reports its promise.
while [ ! -e /run/nodekeeper/contact.json ]; do
    kill -0 $AGENT || echo 'guest: failed: the agent exited'
    sleep 0.2
done
echo 'guest: the agent armed'
{rest}
sleep 600
",
        load_modules = support::vm::LOAD_MODULES
    )
}

/// The agent's files: Kubernetes mode with an API server and a controller that never
/// answer (nothing listens on this loopback), reports over TLS, self-isolation after
/// `isolate_after`, the watchdog at [`WATCHDOG_TIMEOUT`].
fn agent_files(isolate_after: Duration) -> Vec<(&'static str, String)> {
    vec![
        (
            "/etc/nodekeeper/agent.yaml",
            format!(
                "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
nodeName: vm-node
shutdownGracePeriod: 0s
cgroupRoot: /sys/fs/cgroup
kubernetes:
  cgroupDriver: cgroupfs
  stateFile: /run/nodekeeper/api-writes.json
  apiProbeInterval: 8s
  apiProbeTimeout: 4s
report:
  controllerURL: https://127.0.0.1:9849
  interval: 2s
  tokenFile: /etc/nodekeeper/token
  caFile: /etc/ssl/certs/ca-certificates.crt
  isolation:
    isolateAfter: {}s
    watchdogTimeout: {}s
",
                isolate_after.as_secs(),
                WATCHDOG_TIMEOUT.as_secs()
            ),
        ),
        (
            "/etc/nodekeeper/kubeconfig",
            "apiVersion: v1
kind: Config
clusters:
- name: unreachable
  cluster: {server: \"http://127.0.0.1:6443\"}
users:
- name: node
  user: {token: node-token}
contexts:
- name: node
  context: {cluster: unreachable, user: node}
current-context: node
"
            .to_string(),
        ),
        (
            "/etc/nodekeeper/token",
            "vm-node-token-0123456789abcdef".to_string(),
        ),
    ]
}

/// Boots a machine whose `/init` runs the armed agent and then `rest`, and waits until
/// the agent says it armed: the machine, when the test read that, and the line.
fn boot_armed(
    dir: &std::path::Path,
    parts: &VmParts,
    isolate_after: Duration,
    rest: &str,
) -> (Vm, Instant, String) {
    let booted = Instant::now();
    let initramfs = support::vm::initramfs(dir, parts, &init(rest), &agent_files(isolate_after))
        .expect("the machine's initramfs");
    let vm = Vm::boot(dir, parts, &initramfs).expect("the machine");
    let (armed, line) = vm.wait_for_line("self-isolation armed", BOOT_WAIT);
    println!(
        "booted and armed in {:.1}s",
        armed.duration_since(booted).as_secs_f64()
    );
    (vm, armed, line)
}

/// How long the machine may take to boot and arm the agent under emulation (about 6 s on
/// an idle machine; the tests print it, from the start of the initramfs's build).
const BOOT_WAIT: Duration = Duration::from_secs(180);

/// Armed, the agent pets the watchdog: the machine runs on for three timeouts. Stopped
/// (SIGSTOP, as a hung process), it no longer does, and the watchdog resets the machine
/// one timeout after the last pet.
#[test]
fn a_hung_agent_has_its_node_reset_by_the_watchdog() {
    let parts = require!("qemu, a Debian kernel", support::vm::parts());
    let dir = tempfile::tempdir().expect("temp dir");
    let (vm, _, armed) = boot_armed(
        dir.path(),
        &parts,
        Duration::from_secs(600),
        &format!(
            "sleep {}\necho 'guest: stopping the agent'\n\
             kill -STOP $AGENT || echo 'guest: failed: the agent was gone before it was stopped'\n\
             echo 'guest: the agent is stopped'",
            3 * WATCHDOG_TIMEOUT.as_secs()
        ),
    );
    let timeout = format!("timeout={}s", WATCHDOG_TIMEOUT.as_secs());
    assert!(
        armed.contains("i6300ESB") && armed.contains(&timeout),
        "the agent holds the emulated 6300ESB, with {timeout}: {armed}"
    );
    let (stopped, _) = vm.wait_for_line(
        "guest: the agent is stopped",
        4 * WATCHDOG_TIMEOUT + Duration::from_secs(30),
    );
    let early: Vec<_> = vm
        .stops()
        .into_iter()
        .filter(|(at, _)| *at < stopped)
        .collect();
    assert!(
        early.is_empty(),
        "the machine was reset while the agent ran: {early:?}\n{}",
        vm.transcript()
    );
    let (fired, event) = vm.wait_for_event("WATCHDOG", WATCHDOG_TIMEOUT + Duration::from_secs(20));
    let after = fired.duration_since(stopped);
    println!(
        "the watchdog ({}s) fired {:.2}s after the agent was stopped: {event}",
        WATCHDOG_TIMEOUT.as_secs(),
        after.as_secs_f64()
    );
    // The last pet came at most a quarter of the timeout before the stop, and the test
    // reads the stop's line up to a second late; the event may be read a little late too.
    assert!(
        after + WATCHDOG_TIMEOUT / 4 + Duration::from_secs(1) >= WATCHDOG_TIMEOUT
            && after < WATCHDOG_TIMEOUT + Duration::from_secs(5),
        "fired {after:?} after the stop\n{}",
        vm.transcript()
    );
    assert_eq!(event["data"]["action"], "pause", "{event}");
}

/// `isolateAfter` in the test below: the shortest the agent accepts (at least three Lease
/// reads, every `apiProbeInterval`, and three report intervals).
const ISOLATE_AFTER: Duration = Duration::from_secs(30);

/// Cut off from the controller and its node's Lease for `isolateAfter`, the agent
/// isolates the node; with no systemd to stop the kubelet through, the isolation fails,
/// and the agent resets the node itself with `reboot(2)`, well before the watchdog would.
#[test]
fn an_isolation_the_agent_cannot_carry_out_ends_in_a_reboot() {
    let parts = require!("qemu, a Debian kernel", support::vm::parts());
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut vm, armed, _) = boot_armed(dir.path(), &parts, ISOLATE_AFTER, "");
    vm.wait_for_line(
        "isolating the node by itself",
        ISOLATE_AFTER + Duration::from_secs(30),
    );
    let (resetting, line) = vm.wait_for_line("resetting the node", Duration::from_secs(60));
    let (reset, event) = vm.wait_for_event("SHUTDOWN", Duration::from_secs(30));
    println!(
        "isolateAfter {}s: the agent isolated the node {:.1}s after it armed, and the machine was reset {:.2}s later: {line}; {event}",
        ISOLATE_AFTER.as_secs(),
        resetting.duration_since(armed).as_secs_f64(),
        reset.duration_since(resetting).as_secs_f64()
    );
    assert_eq!(
        event["data"]["reason"],
        "guest-reset",
        "{}",
        vm.transcript()
    );
    assert!(
        line.contains("could not be isolated"),
        "reset because the isolation failed, not for its budget: {line}"
    );
    // reboot(2) right after the file systems' sync, well before the watchdog (no longer
    // petted) would.
    assert!(
        reset.duration_since(resetting) < Duration::from_secs(3),
        "the machine was reset {:?} after the agent said it would\n{}",
        reset.duration_since(resetting),
        vm.transcript()
    );
    assert!(
        vm.events()
            .iter()
            .all(|(_, event)| event["event"] != "WATCHDOG"),
        "the watchdog fired: {}",
        vm.transcript()
    );
    assert!(
        resetting.duration_since(armed) + Duration::from_secs(1) >= ISOLATE_AFTER,
        "the agent gave up on the node {:?} after it armed\n{}",
        resetting.duration_since(armed),
        vm.transcript()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !vm.ended() {
        assert!(Instant::now() < deadline, "qemu did not end at the reset");
        std::thread::sleep(Duration::from_millis(50));
    }
}
