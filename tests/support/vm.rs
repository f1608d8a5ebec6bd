//! A qemu virtual machine, for what no test may do to the machine it runs on: let a
//! watchdog reset it, call `reboot(2)`. Software emulation (TCG: this machine's KVM cannot
//! run a stock kernel), Debian's kernel as `scripts/test` unpacks it
//! (`NODEKEEPER_VM_KERNEL_ROOT`), qboot as the firmware, and an initramfs the test builds:
//! a static busybox (the one `scripts/test` unpacks for the containerd tests), the
//! nodekeeper binary under test with the libraries it links, the kernel's watchdog
//! modules, the files the test gives and its `/init` script. The machine has an emulated
//! Intel 6300ESB watchdog, which pauses it when it fires, and `-no-reboot`: a reset ends
//! qemu. Its QMP events say which came.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// What a machine is made of, found on this host.
pub struct VmParts {
    qemu: PathBuf,
    firmware: PathBuf,
    kernel: PathBuf,
    /// The watchdog core and the 6300ESB driver, in load order, each as the kernel
    /// package has it (`.ko`, or `.ko.xz` where modules are compressed).
    modules: Vec<PathBuf>,
    busybox: PathBuf,
}

/// The kernel modules the machine loads, in order.
const MODULES: [&str; 2] = ["watchdog", "i6300esb"];

/// `name`'s module in `directory`, plain or xz-compressed.
fn module(directory: &Path, name: &str) -> Result<PathBuf, String> {
    ["ko", "ko.xz"]
        .iter()
        .map(|extension| directory.join(format!("{name}.{extension}")))
        .find(|path| path.exists())
        .ok_or_else(|| {
            format!(
                "no {name}.ko in {} (the kernel package's watchdog modules)",
                directory.display()
            )
        })
}

/// The parts, or what is missing (and which package has it).
pub fn parts() -> Result<VmParts, String> {
    let found = |path: PathBuf, what: &str| {
        if path.exists() {
            Ok(path)
        } else {
            Err(format!("no {} ({what})", path.display()))
        }
    };
    let kernel_root = PathBuf::from(
        std::env::var_os("NODEKEEPER_VM_KERNEL_ROOT")
            .unwrap_or_else(|| "/var/cache/nodekeeper-test/vm-kernel".into()),
    );
    let kernel = std::fs::read_dir(kernel_root.join("boot"))
        .map_err(|e| {
            format!(
                "{}/boot: {e} (Debian's linux-image-*-amd64, unpacked there by scripts/test)",
                kernel_root.display()
            )
        })?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("vmlinuz-"))
        })
        .ok_or_else(|| format!("no vmlinuz-* in {}/boot", kernel_root.display()))?;
    let version = kernel
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(|name| name.strip_prefix("vmlinuz-"))
        .unwrap_or_default()
        .to_string();
    let containerd_root = PathBuf::from(
        std::env::var_os("NODEKEEPER_CONTAINERD_ROOT")
            .unwrap_or_else(|| "/var/cache/nodekeeper-test/containerd".into()),
    );
    Ok(VmParts {
        qemu: found(
            "/usr/bin/qemu-system-x86_64".into(),
            "Debian package qemu-system-x86",
        )?,
        firmware: found(
            "/usr/share/qemu/qboot.rom".into(),
            "Debian package qemu-system-data",
        )?,
        modules: {
            let directory =
                kernel_root.join(format!("lib/modules/{version}/kernel/drivers/watchdog"));
            MODULES
                .iter()
                .map(|name| module(&directory, name))
                .collect::<Result<_, _>>()?
        },
        kernel,
        busybox: found(
            containerd_root.join("bin/busybox"),
            "Debian package busybox-static, unpacked by scripts/test",
        )?,
    })
}

/// The busybox programs an `/init` script may call.
const APPLETS: [&str; 12] = [
    "sh", "mount", "mkdir", "sleep", "cat", "echo", "insmod", "kill", "ls", "test", "[", "ip",
];

/// Builds `dir/initramfs.cpio`: busybox, the nodekeeper binary under test (stripped) and
/// the libraries it links, the watchdog modules in `/lib/modules`, the host's CA bundle
/// (the Kubernetes client loads the system's roots at its start), `files` (path in the
/// machine, contents) and `/init`.
pub fn initramfs(
    dir: &Path,
    parts: &VmParts,
    init: &str,
    files: &[(&str, String)],
) -> Result<PathBuf, String> {
    let root = dir.join("initramfs");
    let make =
        |path: &Path| std::fs::create_dir_all(path).map_err(|e| format!("{}: {e}", path.display()));
    for sub in [
        "bin",
        "proc",
        "sys",
        "dev",
        "run",
        "tmp",
        "usr/bin",
        "lib/modules",
    ] {
        make(&root.join(sub))?;
    }
    let copy = |from: &Path, to: &Path| {
        make(to.parent().unwrap_or(Path::new("/")))?;
        std::fs::copy(from, to)
            .map(|_| ())
            .map_err(|e| format!("{} to {}: {e}", from.display(), to.display()))
    };
    copy(&parts.busybox, &root.join("bin/busybox"))?;
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet))
            .map_err(|e| format!("bin/{applet}: {e}"))?;
    }
    let binary = Path::new(super::agent_process::BINARY);
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(root.join("usr/bin/nodekeeper"))
        .arg(binary)
        .status()
        .map_err(|e| format!("strip (Debian package binutils): {e}"))?;
    if !stripped.success() {
        return Err(format!("strip {}: {stripped}", binary.display()));
    }
    for library in linked_libraries(binary)? {
        copy(
            &library,
            &root.join(library.strip_prefix("/").unwrap_or(&library)),
        )?;
    }
    for (name, path) in MODULES.iter().zip(&parts.modules) {
        let to = root.join("lib/modules").join(format!("{name}.ko"));
        if path.extension().is_some_and(|extension| extension == "xz") {
            let plain = Command::new("xz")
                .args(["-dc"])
                .arg(path)
                .output()
                .map_err(|e| format!("xz (Debian package xz-utils): {e}"))?;
            if !plain.status.success() {
                return Err(format!("xz -dc {}: {}", path.display(), plain.status));
            }
            std::fs::write(&to, plain.stdout).map_err(|e| format!("{}: {e}", to.display()))?;
        } else {
            copy(path, &to)?;
        }
    }
    copy(
        Path::new("/etc/ssl/certs/ca-certificates.crt"),
        &root.join("etc/ssl/certs/ca-certificates.crt"),
    )?;
    for (path, contents) in files {
        let path = root.join(path.trim_start_matches('/'));
        make(path.parent().unwrap_or(&root))?;
        std::fs::write(&path, contents).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let init_path = root.join("init");
    std::fs::write(&init_path, init).map_err(|e| format!("init: {e}"))?;
    std::fs::set_permissions(
        &init_path,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .map_err(|e| format!("init: {e}"))?;
    let archive = dir.join("initramfs.cpio");
    let output =
        std::fs::File::create(&archive).map_err(|e| format!("{}: {e}", archive.display()))?;
    let packed = Command::new("sh")
        .arg("-c")
        .arg("find . | cpio --quiet -o -H newc")
        .current_dir(&root)
        .stdout(output)
        .status()
        .map_err(|e| format!("cpio (Debian package cpio): {e}"))?;
    if !packed.success() {
        return Err(format!("cpio: {packed}"));
    }
    Ok(archive)
}

/// The shared libraries `binary` links, the dynamic loader included, as `ldd` names them.
fn linked_libraries(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| format!("ldd: {e}"))?;
    if !output.status.success() {
        return Err(format!("ldd {}: {}", binary.display(), output.status));
    }
    let listed = String::from_utf8_lossy(&output.stdout);
    if let Some(missing) = listed.lines().find(|line| line.contains("not found")) {
        return Err(format!("{}: {}", binary.display(), missing.trim()));
    }
    Ok(listed
        .lines()
        .filter_map(|line| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no file.
            let path = line.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// What an `/init` script writes on the console when it cannot go on.
pub const GUEST_FAILED: &str = "guest: failed:";

/// A line the machine wrote on its serial console, or a QMP event, with when the test
/// read it.
type Seen<T> = Arc<Mutex<Vec<(Instant, T)>>>;

/// A running machine; ended (by the PID of the qemu this test started) when dropped.
pub struct Vm {
    qemu: Child,
    console: Seen<String>,
    events: Seen<Value>,
    stderr: Arc<Mutex<String>>,
}

impl Vm {
    /// Boots `initramfs` on the parts' kernel: one CPU, 512 MiB, the 6300ESB watchdog
    /// (which, when it fires, pauses the machine: qemu stays up to deliver its QMP event,
    /// and is killed on drop), the console on the serial port, QMP on a socket in `dir`.
    pub fn boot(dir: &Path, parts: &VmParts, initramfs: &Path) -> Result<Vm, String> {
        let qmp = dir.join("qmp.sock");
        let mut qemu = Command::new(&parts.qemu)
            .args(["-machine", "q35,accel=tcg", "-m", "512", "-smp", "1"])
            .arg("-bios")
            .arg(&parts.firmware)
            .arg("-kernel")
            .arg(&parts.kernel)
            .arg("-initrd")
            .arg(initramfs)
            .args(["-append", "console=ttyS0 panic=-1 quiet"])
            .args(["-device", "i6300esb", "-action", "watchdog=pause"])
            .args([
                "-display", "none", "-vga", "none", "-monitor", "none", "-nic", "none",
            ])
            .args(["-serial", "stdio", "-no-reboot"])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", parts.qemu.display()))?;
        let console: Seen<String> = Arc::default();
        let lines = console.clone();
        let stdout = qemu.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line).trim_end().to_string();
                lines.lock().expect("console").push((Instant::now(), line));
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let errors = stderr.clone();
        let pipe = qemu.stderr.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut errors = errors.lock().expect("stderr");
                errors.push_str(&line);
                errors.push('\n');
            }
        });
        let vm = Vm {
            qemu,
            console,
            events: Arc::default(),
            stderr,
        };
        vm.listen_to_qmp(&qmp)?;
        Ok(vm)
    }

    /// Connects to QMP (qemu makes the socket as it starts) and keeps its events.
    fn listen_to_qmp(&self, socket: &Path) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let stream = loop {
            match std::os::unix::net::UnixStream::connect(socket) {
                Ok(stream) => break stream,
                Err(error) if Instant::now() > deadline => {
                    return Err(format!(
                        "QMP {}: {error}; qemu: {}",
                        socket.display(),
                        self.stderr()
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let mut writer = stream.try_clone().map_err(|e| format!("QMP: {e}"))?;
        writer
            .write_all(b"{\"execute\": \"qmp_capabilities\"}\n")
            .map_err(|e| format!("QMP: {e}"))?;
        let events = self.events.clone();
        std::thread::spawn(move || {
            let _writer = writer;
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if let Ok(message) = serde_json::from_str::<Value>(&line)
                    && message.get("event").is_some()
                {
                    events
                        .lock()
                        .expect("events")
                        .push((Instant::now(), message));
                }
            }
        });
        Ok(())
    }

    /// The first console line containing `text`, and when it was read; fails after
    /// `within`, or at once when the machine's `/init` says it failed (a line with
    /// [`GUEST_FAILED`]) or the machine stopped (a QMP event), with the console so far.
    pub fn wait_for_line(&self, text: &str, within: Duration) -> (Instant, String) {
        let deadline = Instant::now() + within;
        loop {
            let console = self.console.lock().expect("console").clone();
            if let Some(found) = console.iter().find(|(_, line)| line.contains(text)) {
                return found.clone();
            }
            assert!(
                !console.iter().any(|(_, line)| line.contains(GUEST_FAILED)),
                "the machine's /init failed\n{}",
                self.transcript()
            );
            if let Some((_, event)) = self.stops().first() {
                panic!(
                    "the machine stopped ({}) before a console line with {text:?}\n{}",
                    event["event"],
                    self.transcript()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no console line with {text:?} within {within:?}\n{}",
                self.transcript()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The QMP events so far (`SHUTDOWN`, `WATCHDOG`, ...), with when each was read.
    pub fn events(&self) -> Vec<(Instant, Value)> {
        self.events.lock().expect("events").clone()
    }

    /// The QMP events that stop or reset the machine: its watchdog, a reset, a power-off,
    /// a panic.
    pub fn stops(&self) -> Vec<(Instant, Value)> {
        self.events()
            .into_iter()
            .filter(|(_, event)| {
                [
                    "WATCHDOG",
                    "SHUTDOWN",
                    "RESET",
                    "POWERDOWN",
                    "GUEST_PANICKED",
                ]
                .iter()
                .any(|name| event["event"] == *name)
            })
            .collect()
    }

    /// The first QMP event named `name`; fails after `within`.
    pub fn wait_for_event(&self, name: &str, within: Duration) -> (Instant, Value) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(found) = self
                .events()
                .into_iter()
                .find(|(_, event)| event["event"] == name)
            {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no QMP event {name} within {within:?}\n{}",
                self.transcript()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether qemu has ended (the machine was powered off or reset).
    pub fn ended(&mut self) -> bool {
        matches!(self.qemu.try_wait(), Ok(Some(_)))
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr").clone()
    }

    /// The console, the QMP events and qemu's own errors, for a failure's message.
    pub fn transcript(&self) -> String {
        let console: Vec<String> = self
            .console
            .lock()
            .expect("console")
            .iter()
            .map(|(_, line)| line.clone())
            .collect();
        let events: Vec<String> = self
            .events()
            .iter()
            .map(|(_, event)| event.to_string())
            .collect();
        format!(
            "console:\n{}\nQMP events:\n{}\nqemu's errors:\n{}",
            console.join("\n"),
            events.join("\n"),
            self.stderr()
        )
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
    }
}
