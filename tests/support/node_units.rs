//! systemd units for a node booted with systemd-nspawn (`nspawn.rs`): the agent under
//! test, a stand-in kubelet and pods laid out as the systemd cgroup driver lays them out.

/// A stand-in kubelet: a unit systemd restarts whenever it ends on its own, as the real
/// kubelet's unit is. (Lease renewals, where a test needs them, are played by
/// `kubelet::Kubelets`.)
pub const STAND_IN_KUBELET: &str = "\
[Unit]
Description=kubelet (stand-in)

[Service]
ExecStart=/bin/sleep infinity
Restart=always
RestartSec=100ms

[Install]
WantedBy=multi-user.target
";

/// A pod's containers in `slice` under `kubepods.slice` (the QoS tier in the name, as
/// `kubepods-burstable-pod<uid>.slice`), two processes. systemd does not restart them;
/// on a real node neither does anything else once the kubelet is stopped.
pub fn pod_unit(slice: &str) -> String {
    format!(
        "[Unit]\nDescription=a pod's containers\n\n[Service]\nSlice={slice}\n\
         ExecStart=/bin/sh -c 'sleep infinity & exec sleep infinity'\n\n\
         [Install]\nWantedBy=multi-user.target\n"
    )
}

/// The agent under test as a systemd unit, in Kubernetes mode with `/shared/agent.yaml`
/// and `/shared/kubeconfig`, logging to `/shared/agent.log`; started after `after`.
pub fn agent_unit(after: &str) -> String {
    format!(
        "[Unit]\nDescription=nodekeeper agent\nWants=dbus.service\n\
         After=dbus.service systemd-logind.service {after}\n\n\
         [Service]\n\
         ExecStart=/usr/local/bin/nodekeeper agent --config /shared/agent.yaml --kubeconfig /shared/kubeconfig --metrics-addr 127.0.0.1:0\n\
         Environment=RUST_LOG=info,kube=warn\nEnvironment=NO_COLOR=1\n\
         Restart=always\nRestartSec=200ms\n\
         StandardOutput=append:/shared/agent.log\nStandardError=append:/shared/agent.log\n\n\
         [Install]\nWantedBy=multi-user.target\n"
    )
}
