//! Fence agents written for the tests as shell scripts, for behaviour no real agent and
//! emulator shows on demand: hanging with children, lying about an off, spying on how it
//! was called. Each reads its `key=value` options from standard input as ClusterLabs
//! agents do, and answers `metadata` in their XML format.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The metadata every fake agent prints: an address, a plug, a password and the actions
/// of a power switch.
const METADATA: &str = r#"<?xml version="1.0" ?>
<resource-agent name="AGENT" shortdesc="a test agent">
<parameters>
  <parameter name="action" unique="0" required="1"><getopt mixed="-o, --action=[action]" /><content type="string" default="reboot" /></parameter>
  <parameter name="ip" unique="0" required="0"><getopt mixed="-a, --ip=[ip]" /><content type="string" /></parameter>
  <parameter name="plug" unique="0" required="0"><getopt mixed="-n, --plug=[id]" /><content type="string" /></parameter>
  <parameter name="username" unique="0" required="0"><getopt mixed="-l, --username=[name]" /><content type="string" /></parameter>
  <parameter name="password" unique="0" required="0"><getopt mixed="-p, --password=[password]" /><content type="string" /></parameter>
  <parameter name="ssl_insecure" unique="0" required="0"><getopt mixed="--ssl-insecure" /><content type="boolean" /></parameter>
  <parameter name="state_dir" unique="0" required="0"><getopt mixed="--state-dir=[dir]" /><content type="string" /></parameter>
</parameters>
<actions><action name="on" /><action name="off" /><action name="reboot" /><action name="status" /><action name="monitor" /><action name="metadata" /></actions>
</resource-agent>"#;

/// Writes agent `name` (e.g. `fence_hang`) into `agents_dir`. `body` is shell run after
/// the options are read: `$action`, `$password`, `$plug`, `$state_dir` and `$input` (all
/// of standard input) are set.
pub fn install(agents_dir: &Path, name: &str, body: &str) -> PathBuf {
    let metadata = METADATA.replace("AGENT", name);
    let script = format!(
        r#"#!/bin/sh
input=$(cat)
value() {{ printf '%s\n' "$input" | sed -n "s/^$1=//p" | tail -n 1; }}
action=$(value action)
password=$(value password)
plug=$(value plug)
state_dir=$(value state_dir)
if [ "$action" = metadata ]; then
cat <<'XML'
{metadata}
XML
exit 0
fi
{body}
"#
    );
    let path = agents_dir.join(name);
    std::fs::write(&path, script).expect("write the fake agent");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .expect("make the fake agent executable");
    path
}

/// A switch whose power is the file `$state_dir/power` (`on` or `off`); `off` is
/// ignored when `$state_dir/stuck` exists (a relay that reports success but never opens).
pub const SWITCH: &str = r#"
power_file="$state_dir/power"
case "$action" in
  status|monitor)
    if [ "$(cat "$power_file")" = off ]; then echo "Status: OFF"; exit 2; fi
    echo "Status: ON"; exit 0;;
  off)
    [ -e "$state_dir/stuck" ] || echo off > "$power_file"
    echo "Success: Powered OFF"; exit 0;;
  on)
    echo on > "$power_file"; echo "Success: Powered ON"; exit 0;;
  *) echo "Failed: Unrecognised action '$action'"; exit 1;;
esac
"#;

/// Installs `fence_switch` ([`SWITCH`]) into `agents_dir` with its power on, and returns
/// its state directory (the value for its `state_dir` option).
pub fn install_switch(agents_dir: &Path) -> PathBuf {
    install(agents_dir, "fence_switch", SWITCH);
    let state = agents_dir.join("state");
    std::fs::create_dir(&state).expect("state dir");
    std::fs::write(state.join("power"), "on\n").expect("power on");
    state
}
