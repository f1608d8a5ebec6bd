//! A node with no fence device, cut off from the cluster, end to end on real parts (issue
//! 13, part 5): a qemu machine boots Debian's kernel and a Debian tree with systemd, runs
//! the agent as the packaged systemd unit (`systemd/nodekeeper-agent.service`, its
//! sandbox included), a stand-in kubelet and a pod's containers laid out as the systemd
//! cgroup driver lays them out, and holds an emulated Intel 6300ESB watchdog. The agent
//! reports to the real controller (a process of this test, no fence configuration for
//! the node) and reads its node's Lease from the test API server, both on this host's
//! loopback, reached over qemu's restricted user-mode network.
//!
//! The test pulls the machine's cable (QMP `set_link`). The agent, hearing neither the
//! controller nor its Lease for `isolateAfter`, isolates the node by itself through
//! systemd: the kubelet stopped and masked, every pod process killed. The watchdog stays
//! petted: an isolated node is not reset. The controller, which never sees any of this,
//! releases the node's pods only once the agent's promise and the margin have run out,
//! and by then the pod's processes on the machine are gone.
//!
//! While the agent guards its isolation, its budget spent (a node found not isolated now
//! would be reset at once), the machine's wall clock is set an hour forward every second
//! for twelve seconds, then twelve hours back: the isolation's evidence is aged on the
//! boot clock, so the node is neither reset nor let go.

mod support;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use serde_json::json;

use support::controller::{
    ControllerProcess, executions, fence_of, node_on_boot, taint_keys, wait_for_within,
};
use support::node_units::{STAND_IN_KUBELET, pod_unit};
use support::reports::{PromiseRig, token_of};
use support::vm::{Forward, Machine, RootFile, Vm};

/// The node the machine is; the rig's node with a database and no fence configuration.
const NODE: &str = "worker-2";

/// Where the machine reaches the controller's report endpoint and the API server.
const CONTROLLER_IN_GUEST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);
const API_SERVER_IN_GUEST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 101);

/// The agent's `isolateAfter`: the shortest it accepts with these settings (at least
/// three Lease reads every `apiProbeInterval` 8 s, and three report intervals).
const ISOLATE_AFTER: Duration = Duration::from_secs(30);

/// The agent's `stopTimeout` for the kubelet; its isolation budget is twice this and 70 s.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the agent has to isolate the node once it begins; past it, a node it finds
/// not isolated is reset at once.
const BUDGET: Duration = Duration::from_secs(2 * STOP_TIMEOUT.as_secs() + 70);

/// How long after the machine shows itself isolated its wall clock begins to jump: past
/// the budget, which counts from the agent's start of the isolation, before the machine
/// shows it done; 6 s to spare besides.
const JUMPS_AFTER: Duration = Duration::from_secs(80);

/// How many times the clock is set an hour forward, a second apart. Once would do in
/// theory, but the isolator checks its evidence (stamping it with the jumped wall time)
/// every report interval, 2 s, and the guardian looks every 2.5 s: a guardian that aged
/// the evidence by its wall time would see it two hours old only until the next check,
/// and could miss that. An hour every second keeps the evidence's wall time an hour
/// behind for most of twelve seconds (fresh only from a check to the next jump).
const JUMPS: u64 = 12;

/// The watchdog's timeout (as in watchdog_vm.rs: room for an agent's late pets under
/// emulation on a busy machine).
const WATCHDOG_TIMEOUT: Duration = Duration::from_secs(10);

/// The controller's `silenceTimeout` and `selfIsolationMargin`.
const SILENCE: Duration = Duration::from_secs(10);
const MARGIN: Duration = Duration::from_secs(5);

/// How long the machine may take to boot systemd and arm the agent under emulation
/// (about 30 s on an idle machine; the test prints it).
const BOOT_WAIT: Duration = Duration::from_secs(240);

/// The pod's slice, as the systemd cgroup driver names a Burstable pod's.
const POD_SLICE: &str = "kubepods-burstable-pod3c4d.slice";

fn agent_config(controller_port: u16) -> String {
    format!(
        "apiVersion: nodekeeper.io/v1alpha1
kind: AgentConfiguration
nodeName: {NODE}
evictionHard: {{memory.available: 100Mi}}
kubernetes:
  cgroupDriver: systemd
  kubeconfig: /etc/nodekeeper/kubeconfig
  apiProbeInterval: 8s
  apiProbeTimeout: 4s
report:
  controllerURL: https://{CONTROLLER_IN_GUEST}:{controller_port}
  interval: 2s
  tokenFile: /etc/nodekeeper/token
  caFile: /etc/nodekeeper/ca.crt
  isolation:
    isolateAfter: {}s
    stopTimeout: {}s
    watchdogTimeout: {}s
",
        ISOLATE_AFTER.as_secs(),
        STOP_TIMEOUT.as_secs(),
        WATCHDOG_TIMEOUT.as_secs()
    )
}

/// What the machine tells the test on its console: its boot ID, then, at every change,
/// the kubelet unit's state (`ActiveState`, `UnitFileState`) and how many processes the
/// pods cgroup holds; it starts the clock jumper once the node is isolated. One look a
/// second, one `systemctl` call each: the machine has one emulated CPU, which the agent's
/// isolation needs.
const OBSERVER: &str = r#"#!/bin/sh
echo "guest: boot $(cat /proc/sys/kernel/random/boot_id)"
last=
jumping=
while :; do
    pods=$(find /sys/fs/cgroup/kubepods.slice -name cgroup.procs -exec cat {} + 2>/dev/null | wc -l)
    # A call that fails says nothing; the next look asks again.
    if ! shown=$(systemctl show --property=ActiveState --property=UnitFileState kubelet.service); then
        sleep 1
        continue
    fi
    unit=$(echo "$shown" | sort | tr '\n' ' ')
    now="kubelet: ${unit}pods=$pods"
    if [ "$now" != "$last" ]; then
        echo "guest: $now"
        last=$now
    fi
    # Once isolated, the wall clock jumps (see clock_jumper).
    case "$now" in
    *"masked-runtime pods=0")
        if [ -z "$jumping" ]; then
            /usr/local/bin/jump-clock &
            jumping=yes
        fi
        ;;
    esac
    sleep 1
done
"#;

/// Sets the machine's wall clock an hour forward every second, `JUMPS` times, then back
/// by as many hours (`date -s`, to the nanosecond; the monotonic and boot clocks are
/// not moved, and `sleep` counts on the monotonic clock), after waiting `JUMPS_AFTER`.
fn clock_jumper() -> String {
    format!(
        r#"#!/bin/sh
# Sets the wall clock $1 seconds forward (back if negative).
shift_clock() {{
    now=$(date +%s%N)
    date -s "@$(( now / 1000000000 + $1 )).$(printf %09d $(( now % 1000000000 )))" > /dev/null
}}
sleep {after}
echo "guest: clock set forward from $(date -u +%FT%T.%NZ)"
i=0
while [ $i -lt {jumps} ]; do
    shift_clock 3600
    i=$((i + 1))
    sleep 1
done
shift_clock -$(( {jumps} * 3600 ))
echo "guest: clock set back to $(date -u +%FT%T.%NZ)"
"#,
        after = JUMPS_AFTER.as_secs(),
        jumps = JUMPS
    )
}

/// The observer's line for a kubelet that runs, enabled, beside a pod of two processes.
const RUNNING: &str = "guest: kubelet: ActiveState=active UnitFileState=enabled pods=2";

/// The end of the observer's line for an isolated node: the kubelet masked for the boot,
/// no pod process left.
const ISOLATED: &str = "UnitFileState=masked-runtime pods=0";

const OBSERVER_UNIT: &str = "[Unit]
Description=tells the test what runs

[Service]
ExecStart=/usr/local/bin/observe
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
";

/// The packaged agent unit as an operator runs it, with its log on the console (for the
/// test) and started once the pod runs (its pods cgroup exists, which arming needs).
const AGENT_DROP_IN: &str = "[Unit]
After=pod-db.service

[Service]
Environment=RUST_LOG=info,kube=warn NO_COLOR=1
StandardOutput=journal+console
StandardError=journal+console
";

/// The units the machine starts.
const ENABLED: [&str; 4] = [
    "nodekeeper-agent.service",
    "kubelet.service",
    "pod-db.service",
    "observe.service",
];

/// The machine's root file system: the Debian tree with the units and the agent's files.
fn root_files(
    agent_yaml: String,
    kubeconfig: String,
    ca: &std::path::Path,
) -> (Vec<RootFile>, Vec<(String, String)>) {
    let packaged_unit = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/nodekeeper-agent.service"),
    )
    .expect("the packaged agent unit");
    let files = vec![
        RootFile::new("/etc/hostname", format!("{NODE}\n")),
        RootFile::new("/etc/nodekeeper/agent.yaml", agent_yaml),
        RootFile::new("/etc/nodekeeper/kubeconfig", kubeconfig),
        RootFile::new("/etc/nodekeeper/token", token_of(NODE)),
        RootFile::new(
            "/etc/nodekeeper/ca.crt",
            std::fs::read(ca).expect("the CA certificate"),
        ),
        RootFile::new(
            "/etc/systemd/system/nodekeeper-agent.service",
            packaged_unit,
        ),
        RootFile::new(
            "/etc/systemd/system/nodekeeper-agent.service.d/test.conf",
            AGENT_DROP_IN,
        ),
        RootFile::new("/etc/systemd/system/kubelet.service", STAND_IN_KUBELET),
        RootFile::new("/etc/systemd/system/pod-db.service", pod_unit(POD_SLICE)),
        RootFile::new("/etc/systemd/system/observe.service", OBSERVER_UNIT),
        RootFile::program("/usr/local/bin/observe", OBSERVER),
        RootFile::program("/usr/local/bin/jump-clock", clock_jumper()),
    ];
    let mut links: Vec<(String, String)> = ENABLED
        .iter()
        .map(|unit| {
            (
                format!("/etc/systemd/system/multi-user.target.wants/{unit}"),
                format!("/etc/systemd/system/{unit}"),
            )
        })
        .collect();
    // No login prompts on the console the test reads; no calendar timers (a daily
    // backup, apt's updates) set off by the clock's jumps on the machine's one CPU.
    for masked in [
        "serial-getty@ttyS0.service",
        "getty@tty1.service",
        "timers.target",
    ] {
        links.push((
            format!("/etc/systemd/system/{masked}"),
            "/dev/null".to_string(),
        ));
    }
    (files, links)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_by_its_link_isolates_itself_and_its_pods_are_released_only_after() {
    let parts = require!("qemu, a Debian kernel", support::vm::parts());
    require!("root", support::real::root());
    require!("openssl", support::real::program("openssl", "openssl"));
    require!("mke2fs", support::real::program("mke2fs", "e2fsprogs"));
    let tree = require!(
        "a Debian tree with systemd",
        tokio::task::spawn_blocking(support::debian::cached_tree)
            .await
            .expect("the tree")
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rig = PromiseRig::start(dir.path()).await;
    rig.served = support::tls::server_certificate_for(
        dir.path(),
        "controller-for-the-machine",
        &rig.ca,
        &[&CONTROLLER_IN_GUEST.to_string()],
    )
    .expect("the controller's certificate");
    let config = rig.controller_config(dir.path(), SILENCE, MARGIN);
    let controller = ControllerProcess::start(dir.path(), &rig.server, &config);
    controller.synced().await;
    let controller_port = support::port_of(&controller.reports_address());
    let api_port = support::port_of(&rig.server.url());

    let kubeconfig = rig
        .server
        .kubeconfig_yaml_naming_ca(Some(&rig.ca.cert))
        .replace(
            &format!("127.0.0.1:{api_port}"),
            &format!("{API_SERVER_IN_GUEST}:{api_port}"),
        );
    assert!(
        kubeconfig.contains(&format!("http://{API_SERVER_IN_GUEST}:{api_port}")),
        "the machine's kubeconfig names the API server where the machine reaches it: {kubeconfig}"
    );
    let (files, links) = root_files(agent_config(controller_port), kubeconfig, &rig.ca.cert);
    let machine_dir = dir.path().join("machine");
    std::fs::create_dir_all(&machine_dir).expect("the machine's directory");
    let building = Instant::now();
    let links: Vec<(&str, &str)> = links
        .iter()
        .map(|(path, target)| (path.as_str(), target.as_str()))
        .collect();
    let image = support::vm::root_image(&machine_dir, &tree, &files, &links)
        .expect("the machine's root file system");
    let initramfs =
        support::vm::root_initramfs(&machine_dir, &parts, &support::vm::switch_root_init())
            .expect("the machine's initramfs");
    let machine = Machine {
        memory_mib: 1024,
        disk: Some(image),
        forwards: vec![
            Forward {
                guest: SocketAddrV4::new(CONTROLLER_IN_GUEST, controller_port),
                host_port: controller_port,
            },
            Forward {
                guest: SocketAddrV4::new(API_SERVER_IN_GUEST, api_port),
                host_port: api_port,
            },
        ],
    };
    let started = Instant::now();
    println!(
        "the machine's disk and initramfs built in {:.1}s",
        started.duration_since(building).as_secs_f64()
    );
    let vm = Vm::boot_machine(&machine_dir, &parts, &initramfs, &machine).expect("the machine");

    // The node's kubelet reports the machine's boot: the controller trusts a promise
    // only from the boot the kubelet last reported.
    let (_, line) = vm.wait_for_line("guest: boot ", BOOT_WAIT);
    let boot = line
        .split("guest: boot ")
        .nth(1)
        .expect("a boot ID")
        .trim()
        .to_string();
    rig.server.seed(&node_on_boot(
        NODE,
        "True",
        k8s_openapi::jiff::Timestamp::now(),
        &boot,
    ));
    let (armed, armed_line) =
        vm.wait_for_line_unless("self-isolation armed", Some("not armed"), BOOT_WAIT);
    println!(
        "booted and armed in {:.1}s: {armed_line}",
        armed.duration_since(started).as_secs_f64()
    );
    assert!(
        armed_line.contains("i6300ESB"),
        "the agent holds the machine's watchdog: {armed_line}"
    );
    let view = wait_for_within(&controller, "the agent's promise", BOOT_WAIT, || {
        controller
            .agent_view(NODE)
            .filter(|view| view["report"]["selfIsolation"]["armed"] == true)
    })
    .await;
    assert_eq!(view["report"]["bootId"], json!(boot), "{view:#}");
    let within = Duration::from_millis(
        view["report"]["selfIsolation"]["withinMillis"]
            .as_u64()
            .expect("the promise"),
    );
    assert_eq!(
        within,
        ISOLATE_AFTER + BUDGET + WATCHDOG_TIMEOUT,
        "isolateAfter, the isolation's budget and the watchdog's timeout: {view:#}"
    );
    vm.wait_for_line(RUNNING, Duration::from_secs(30));
    tokio::time::sleep(SILENCE).await;
    assert!(
        fence_of(&rig.server, NODE).is_none(),
        "a node that is heard is not fenced"
    );

    // The cable is pulled; the node's kubelet, on the far side of it, renews no more.
    vm.set_link(false).expect("the link down");
    rig.kubelets.stop(NODE);
    let cut = Instant::now();

    let (isolating, line) = vm.wait_for_line(
        "isolating the node by itself",
        ISOLATE_AFTER + Duration::from_secs(30),
    );
    let after_cut = isolating.duration_since(cut);
    println!(
        "the agent began isolating the node {:.1}s after the cut: {line}",
        after_cut.as_secs_f64()
    );
    // Its last contact, the sending of its last report the controller answered, came at
    // most a report interval (2 s) and that report's way there and back under emulation
    // before the cut.
    assert!(
        after_cut + Duration::from_secs(5) >= ISOLATE_AFTER,
        "isolated {after_cut:?} after the cut\n{}",
        vm.transcript()
    );
    // The log says the agent began it, not the controller, which cannot be reached.
    vm.wait_for_line(
        "isolating the node by itself: the kubelet is stopped",
        Duration::from_secs(10),
    );
    let (isolated, line) = vm.wait_for_line(ISOLATED, BUDGET);
    // Stopped: on its own (inactive), or killed after `stopTimeout` (failed).
    assert!(
        line.contains("ActiveState=inactive") || line.contains("ActiveState=failed"),
        "the kubelet is not stopped: {line}\n{}",
        vm.transcript()
    );
    println!(
        "the kubelet stopped and masked and no pod process left {:.1}s after the cut: {line}",
        isolated.duration_since(cut).as_secs_f64()
    );
    let (confirmed, line) = vm.wait_for_line("the node is isolated", Duration::from_secs(10));
    println!(
        "the agent found its isolation done {:.1}s after it began: {line}\nthe console meanwhile:\n{}",
        confirmed.duration_since(isolating).as_secs_f64(),
        vm.lines_after(isolating).join("\n")
    );
    assert!(
        !taint_keys(&rig.server, NODE).contains(&"node.kubernetes.io/out-of-service".to_string()),
        "nothing was released before the node was isolated"
    );

    let released = wait_for_within(
        &controller,
        "the release",
        within + MARGIN + Duration::from_secs(60),
        || {
            assert!(
                vm.stops().is_empty(),
                "the isolated machine was stopped or reset\n{}",
                vm.transcript()
            );
            taint_keys(&rig.server, NODE)
                .contains(&"node.kubernetes.io/out-of-service".to_string())
                .then(Instant::now)
        },
    )
    .await;
    let waited = released.duration_since(cut);
    println!(
        "released {:.1}s after the cut (the promise {}s, the margin {}s), {:.1}s after the node was isolated",
        waited.as_secs_f64(),
        within.as_secs(),
        MARGIN.as_secs(),
        released.duration_since(isolated).as_secs_f64()
    );
    // The controller last heard the node at the cut, give or take its last report's
    // interval and the kubelet's renewal the test stopped, counted in whole seconds; it
    // adds one per cent of the promise to the margin.
    assert!(
        waited + Duration::from_secs(3) >= within + MARGIN,
        "released {waited:?} after the cut"
    );
    assert!(
        waited <= within + MARGIN + Duration::from_secs(15),
        "released {waited:?} after the cut, long after the promise and the margin"
    );
    let fence = fence_of(&rig.server, NODE).expect("the NodeFence");
    assert!(
        fence
            .pointer("/status/confirmedBy")
            .and_then(|said| said.as_str())
            .is_some_and(|said| said.starts_with("self-isolation:")),
        "released on the promise: {fence:#}"
    );
    assert!(
        executions(&fence).is_empty(),
        "no fence agent ran: {fence:#}"
    );

    // The wall clock jumps while the agent guards the isolation, past its budget.
    let (forward, line) = vm.wait_for_line(
        "guest: clock set forward",
        JUMPS_AFTER + Duration::from_secs(60),
    );
    assert!(
        forward >= isolating + BUDGET,
        "the clock jumped {:.1}s after the agent began isolating, within its budget of {}s\n{}",
        forward.duration_since(isolating).as_secs_f64(),
        BUDGET.as_secs(),
        vm.transcript()
    );
    let (back, line_back) = vm.wait_for_line(
        "guest: clock set back",
        Duration::from_secs(JUMPS) + Duration::from_secs(30),
    );
    println!(
        "the machine's wall clock began to jump {:.1}s after the agent began isolating, for {:.1}s: {line}; then {line_back}",
        forward.duration_since(isolating).as_secs_f64(),
        back.duration_since(forward).as_secs_f64()
    );

    // The isolated node was never reset, and stays isolated: the kubelet never ran again.
    // A reset the jumps had caused would have come within the watchdog's timeout of them.
    tokio::time::sleep(
        (back + WATCHDOG_TIMEOUT + Duration::from_secs(5))
            .saturating_duration_since(Instant::now()),
    )
    .await;
    assert!(
        vm.lines_after(isolated)
            .iter()
            .all(|line| !line.contains("resetting the node")),
        "the agent reset its isolated node\n{}",
        vm.transcript()
    );
    assert!(
        vm.stops().is_empty(),
        "the isolated machine was stopped or reset\n{}",
        vm.transcript()
    );
    let changes: Vec<String> = vm
        .lines_after(isolated)
        .into_iter()
        .filter(|line| line.contains("guest: kubelet:"))
        .collect();
    assert!(
        changes.is_empty(),
        "the kubelet or a pod ran again: {changes:?}\n{}",
        vm.transcript()
    );
}
