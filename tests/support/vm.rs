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
    /// The watchdog's modules ([`WATCHDOG_MODULES`] and what they depend on), in an
    /// order `insmod` can load them: each module's name and its contents, uncompressed.
    modules: Vec<(String, Vec<u8>)>,
    /// The kernel package's module tree (`lib/modules/<version>/kernel`).
    module_tree: PathBuf,
    busybox: PathBuf,
}

/// The kernel modules every machine loads: the 6300ESB watchdog's driver.
const WATCHDOG_MODULES: [&str; 1] = ["i6300esb"];

/// What a machine that boots a root file system loads as well: the virtio disk and
/// network drivers, and ext4.
const ROOT_MODULES: [&str; 4] = ["virtio_pci", "virtio_blk", "virtio_net", "ext4"];

/// Loaded first where the kernel has it as a module: the crc32c that the ext4 and jbd2
/// modules ask the crypto layer for (a soft dependency, which `insmod` does not follow).
/// Other kernels build it in, or name it otherwise: a kernel whose ext4 then finds no
/// crc32c says so on the console, and the machine's `/init` fails at the mount.
const OPTIONAL_ROOT_MODULES: [&str; 1] = ["crc32c_generic"];

/// A module file's contents, uncompressed (`.ko`, or `.ko.xz` where the kernel package
/// compresses its modules).
fn module_contents(path: &Path) -> Result<Vec<u8>, String> {
    if path.extension().is_some_and(|extension| extension == "xz") {
        let plain = Command::new("xz")
            .args(["-dc"])
            .arg(path)
            .output()
            .map_err(|e| format!("xz (Debian package xz-utils): {e}"))?;
        if !plain.status.success() {
            return Err(format!("xz -dc {}: {}", path.display(), plain.status));
        }
        Ok(plain.stdout)
    } else {
        std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The modules a module says it depends on: the `depends=` entry of its `.modinfo`
/// section (what `modinfo -F depends` prints; this machine may have no kmod, and the
/// kernel package as unpacked has no `modules.dep`).
fn dependencies(contents: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    contents
        .windows(KEY.len())
        .position(|window| window == KEY)
        .map(|at| {
            let value = &contents[at + KEY.len()..];
            let end = value
                .iter()
                .position(|byte| *byte == 0)
                .unwrap_or(value.len());
            String::from_utf8_lossy(&value[..end])
                .split(',')
                .filter(|name| !name.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `optional` (those `tree` has), then `wanted`, and the modules they depend on, from the
/// kernel package's module tree `tree`, each after the modules it depends on.
fn modules_in_load_order(
    tree: &Path,
    optional: &[&str],
    wanted: &[&str],
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut files = std::collections::HashMap::new();
    let mut directories = vec![tree.to_path_buf()];
    while let Some(directory) = directories.pop() {
        let entries =
            std::fs::read_dir(&directory).map_err(|e| format!("{}: {e}", directory.display()))?;
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                directories.push(path);
            } else if let Some(name) = path.file_name().and_then(|name| name.to_str())
                && let Some(stem) = name
                    .strip_suffix(".ko")
                    .or_else(|| name.strip_suffix(".ko.xz"))
            {
                // The kernel treats `-` and `_` in module names alike.
                files.insert(stem.replace('-', "_"), path);
            }
        }
    }
    let mut loaded: Vec<(String, Vec<u8>)> = Vec::new();
    // Depth first: a module goes in once everything it depends on is in.
    fn visit(
        name: &str,
        files: &std::collections::HashMap<String, PathBuf>,
        loaded: &mut Vec<(String, Vec<u8>)>,
        path_here: &mut Vec<String>,
    ) -> Result<(), String> {
        if loaded.iter().any(|(done, _)| done == name) {
            return Ok(());
        }
        if path_here.iter().any(|on_the_way| on_the_way == name) {
            return Err(format!(
                "modules depend on each other: {path_here:?} and {name}"
            ));
        }
        let path = files
            .get(name)
            .ok_or_else(|| format!("no module {name} in the kernel package"))?;
        let contents = module_contents(path)?;
        path_here.push(name.to_string());
        for dependency in dependencies(&contents) {
            visit(&dependency.replace('-', "_"), files, loaded, path_here)?;
        }
        path_here.pop();
        loaded.push((name.to_string(), contents));
        Ok(())
    }
    for name in optional
        .iter()
        .filter(|name| files.contains_key(**name))
        .chain(wanted)
    {
        visit(name, &files, &mut loaded, &mut Vec::new())?;
    }
    Ok(loaded)
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
    let module_tree = kernel_root.join(format!("lib/modules/{version}/kernel"));
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
        modules: modules_in_load_order(&module_tree, &[], &WATCHDOG_MODULES)?,
        module_tree,
        kernel,
        busybox: found(
            containerd_root.join("bin/busybox"),
            "Debian package busybox-static, unpacked by scripts/test",
        )?,
    })
}

/// The busybox programs an `/init` script may call.
const APPLETS: [&str; 15] = [
    "sh",
    "mount",
    "mkdir",
    "sleep",
    "cat",
    "echo",
    "insmod",
    "kill",
    "ls",
    "test",
    "[",
    "ip",
    "switch_root",
    "nc",
    "wc",
];

/// What an `/init` script runs first to load the kernel modules (a script in the
/// initramfs: one `insmod` per module, in load order); it fails if one does not load.
pub const LOAD_MODULES: &str = "/bin/sh -e /lib/modules/load";

/// Builds `dir/initramfs.cpio`: busybox, the nodekeeper binary under test (stripped) and
/// the libraries it links, the kernel modules ([`LOAD_MODULES`]), the host's CA bundle
/// (the Kubernetes client loads the system's roots at its start), `files` (path in the
/// machine, contents) and `/init`.
pub fn initramfs(
    dir: &Path,
    parts: &VmParts,
    init: &str,
    files: &[(&str, String)],
) -> Result<PathBuf, String> {
    let root = base_initramfs(dir, &parts.busybox, &parts.modules, init)?;
    let binary = Path::new(super::agent_process::BINARY);
    make_dir(&root.join("usr/bin"))?;
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
    copy(
        Path::new("/etc/ssl/certs/ca-certificates.crt"),
        &root.join("etc/ssl/certs/ca-certificates.crt"),
    )?;
    for (path, contents) in files {
        let path = root.join(path.trim_start_matches('/'));
        make_dir(path.parent().unwrap_or(&root))?;
        std::fs::write(&path, contents).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    pack(dir, &root)
}

/// Builds `dir/initramfs.cpio` for a machine that boots a root file system: busybox,
/// the kernel modules ([`LOAD_MODULES`]: the watchdog's, the disk's, the network card's
/// and ext4's) and `/init` (see [`switch_root_init`]).
pub fn root_initramfs(dir: &Path, parts: &VmParts, init: &str) -> Result<PathBuf, String> {
    let wanted: Vec<&str> = WATCHDOG_MODULES
        .iter()
        .chain(&ROOT_MODULES)
        .copied()
        .collect();
    let modules = modules_in_load_order(&parts.module_tree, &OPTIONAL_ROOT_MODULES, &wanted)?;
    let root = base_initramfs(dir, &parts.busybox, &modules, init)?;
    pack(dir, &root)
}

fn make_dir(path: &Path) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    make_dir(to.parent().unwrap_or(Path::new("/")))?;
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("{} to {}: {e}", from.display(), to.display()))
}

/// An initramfs tree in `dir/initramfs` with `busybox`, `modules` and their load script,
/// and `init` as `/init`.
fn base_initramfs(
    dir: &Path,
    busybox: &Path,
    modules: &[(String, Vec<u8>)],
    init: &str,
) -> Result<PathBuf, String> {
    let root = dir.join("initramfs");
    for sub in ["bin", "proc", "sys", "dev", "run", "tmp", "lib/modules"] {
        make_dir(&root.join(sub))?;
    }
    copy(busybox, &root.join("bin/busybox"))?;
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet))
            .map_err(|e| format!("bin/{applet}: {e}"))?;
    }
    let mut load = String::new();
    for (name, contents) in modules {
        let path = root.join("lib/modules").join(format!("{name}.ko"));
        std::fs::write(&path, contents).map_err(|e| format!("{}: {e}", path.display()))?;
        load.push_str(&format!("insmod /lib/modules/{name}.ko\n"));
    }
    let load_path = root.join("lib/modules/load");
    std::fs::write(&load_path, load).map_err(|e| format!("{}: {e}", load_path.display()))?;
    let init_path = root.join("init");
    std::fs::write(&init_path, init).map_err(|e| format!("init: {e}"))?;
    std::fs::set_permissions(
        &init_path,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .map_err(|e| format!("init: {e}"))?;
    Ok(root)
}

/// Packs the tree `root` into `dir/initramfs.cpio`.
fn pack(dir: &Path, root: &Path) -> Result<PathBuf, String> {
    let archive = dir.join("initramfs.cpio");
    let output =
        std::fs::File::create(&archive).map_err(|e| format!("{}: {e}", archive.display()))?;
    let packed = Command::new("sh")
        .arg("-c")
        .arg("find . | cpio --quiet -o -H newc")
        .current_dir(root)
        .stdout(output)
        .status()
        .map_err(|e| format!("cpio (Debian package cpio): {e}"))?;
    if !packed.success() {
        return Err(format!("cpio: {packed}"));
    }
    Ok(archive)
}

/// The `/init` of a machine with a root file system on its disk ([`root_image`]) and a
/// network card: it loads the modules, gives `eth0` [`GUEST_ADDRESS`] (qemu's user-mode
/// network has no DHCP to speak of once restricted, and the tree has no client), mounts
/// `/dev/vda` and hands the machine to the tree's systemd.
pub fn switch_root_init() -> String {
    format!(
        "#!/bin/sh
fail() {{ echo \"{GUEST_FAILED} $1\"; sleep 600; }}
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
{LOAD_MODULES} || fail 'the kernel modules did not load'
ip link set eth0 up || fail 'no network card'
ip addr add {GUEST_ADDRESS}/24 dev eth0 || fail 'no address'
waited=0
while [ ! -b /dev/vda ] && [ $waited -lt 100 ]; do sleep 0.1; waited=$((waited + 1)); done
mkdir /root-fs
mount -t ext4 /dev/vda /root-fs || fail 'the root file system did not mount'
for fs in dev proc sys; do mount -o move /$fs /root-fs/$fs || fail \"moving /$fs\"; done
exec switch_root /root-fs /lib/systemd/systemd
"
    )
}

/// A file of a machine's root file system: where, its contents and its mode.
pub struct RootFile {
    pub path: String,
    pub contents: Vec<u8>,
    pub mode: u32,
}

impl RootFile {
    /// A file readable by all (0644).
    pub fn new(path: &str, contents: impl Into<Vec<u8>>) -> RootFile {
        RootFile {
            path: path.to_string(),
            contents: contents.into(),
            mode: 0o644,
        }
    }

    /// A program (0755).
    pub fn program(path: &str, contents: impl Into<Vec<u8>>) -> RootFile {
        RootFile {
            mode: 0o755,
            ..RootFile::new(path, contents)
        }
    }
}

/// `dir/root.img`: an ext4 image (`mke2fs -d`, no mount needed) of a copy of the Debian
/// tree `tree` ([`super::debian::cached_tree`]) with the nodekeeper binary under test as
/// `/usr/bin/nodekeeper`, `files`, and `links` (path, target: a unit enabled, or masked
/// with `/dev/null`). The copy is removed once the image is made.
pub fn root_image(
    dir: &Path,
    tree: &Path,
    files: &[RootFile],
    links: &[(&str, &str)],
) -> Result<PathBuf, String> {
    let root = dir.join("root-fs");
    let copied = Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(tree)
        .arg(&root)
        .status()
        .map_err(|e| format!("cp: {e}"))?;
    if !copied.success() {
        return Err(format!("copying {}: {copied}", tree.display()));
    }
    let inside = |path: &str| root.join(path.trim_start_matches('/'));
    copy(
        Path::new(super::agent_process::BINARY),
        &inside("/usr/bin/nodekeeper"),
    )?;
    for file in files {
        let path = inside(&file.path);
        make_dir(path.parent().unwrap_or(&root))?;
        std::fs::write(&path, &file.contents).map_err(|e| format!("{}: {e}", path.display()))?;
        std::fs::set_permissions(
            &path,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(file.mode),
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    for (path, target) in links {
        let path = inside(path);
        make_dir(path.parent().unwrap_or(&root))?;
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(target, &path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let image = dir.join("root.img");
    let made = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-d"])
        .arg(&root)
        .arg(&image)
        .arg("2G")
        .output()
        .map_err(|e| format!("mke2fs (Debian package e2fsprogs): {e}"))?;
    let _ = std::fs::remove_dir_all(&root);
    if !made.status.success() {
        return Err(format!(
            "mke2fs -d {}: {}: {}",
            root.display(),
            made.status,
            String::from_utf8_lossy(&made.stderr)
        ));
    }
    Ok(image)
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

/// What a machine has beyond its kernel, initramfs and watchdog.
#[derive(Default)]
pub struct Machine {
    /// Its memory in MiB (512 when 0).
    pub memory_mib: u32,
    /// A raw disk image, its virtio disk `/dev/vda` (see [`root_image`]).
    pub disk: Option<PathBuf>,
    /// With any, a virtio network card (`eth0` in the machine, `nic0` to QMP, see
    /// [`Vm::set_link`]) on qemu's user-mode network, restricted: the machine reaches
    /// nothing but these ports of the host's loopback, each at an address of its own.
    pub forwards: Vec<Forward>,
}

/// A port of the host's loopback the machine reaches at `guest`: qemu hands each
/// connection there to a busybox `nc` it starts, connected to 127.0.0.1:`host_port`.
pub struct Forward {
    pub guest: std::net::SocketAddrV4,
    pub host_port: u16,
}

/// The machine's own address on its user-mode network (qemu's default network,
/// 10.0.2.0/24).
pub const GUEST_ADDRESS: &str = "10.0.2.15";

/// A running machine; ended (by the PID of the qemu this test started) when dropped.
pub struct Vm {
    qemu: Child,
    console: Seen<String>,
    events: Seen<Value>,
    /// QMP's answers, each with the `id` of its command.
    answers: Seen<Value>,
    /// The QMP socket's writing end, once connected, and the last command's `id`.
    commands: Mutex<Option<(std::os::unix::net::UnixStream, u64)>>,
    stderr: Arc<Mutex<String>>,
}

impl Vm {
    /// Boots `initramfs` on the parts' kernel: one CPU, 512 MiB, the 6300ESB watchdog
    /// (which, when it fires, pauses the machine: qemu stays up to deliver its QMP event,
    /// and is killed on drop), the console on the serial port, QMP on a socket in `dir`.
    pub fn boot(dir: &Path, parts: &VmParts, initramfs: &Path) -> Result<Vm, String> {
        Vm::boot_machine(dir, parts, initramfs, &Machine::default())
    }

    /// [`boot`](Self::boot) with `machine`'s memory, disk and network.
    pub fn boot_machine(
        dir: &Path,
        parts: &VmParts,
        initramfs: &Path,
        machine: &Machine,
    ) -> Result<Vm, String> {
        let qmp = dir.join("qmp.sock");
        let memory = if machine.memory_mib == 0 {
            512
        } else {
            machine.memory_mib
        };
        let mut command = Command::new(&parts.qemu);
        command
            .args(["-machine", "q35,accel=tcg", "-smp", "1"])
            .args(["-m", &memory.to_string()])
            .arg("-bios")
            .arg(&parts.firmware)
            .arg("-kernel")
            .arg(&parts.kernel)
            .arg("-initrd")
            .arg(initramfs)
            .args(["-append", "console=ttyS0 panic=-1 quiet"])
            .args(["-device", "i6300esb", "-action", "watchdog=pause"])
            .args(["-display", "none", "-vga", "none", "-monitor", "none"])
            .args(["-serial", "stdio", "-no-reboot"]);
        if let Some(disk) = &machine.disk {
            command.arg("-drive").arg(format!(
                "file={},format=raw,if=virtio,cache=unsafe",
                disk.display()
            ));
        }
        if machine.forwards.is_empty() {
            command.args(["-nic", "none"]);
        } else {
            // qemu splits its options at commas and the command at white space: the
            // busybox path must have neither. Each connection's `nc` is qemu's child,
            // not this test's; it ends when the host side closes (the controller or API
            // server ends, at the latest with this test's process).
            let busybox = parts.busybox.display().to_string();
            if busybox.contains([',', ' ', '\t', '"', '\'', '\\']) {
                return Err(format!(
                    "{busybox}: a comma, a blank or a quote in the path of the busybox qemu runs for each connection"
                ));
            }
            let forwards: String = machine
                .forwards
                .iter()
                .map(|forward| {
                    format!(
                        ",guestfwd=tcp:{}-cmd:{busybox} nc 127.0.0.1 {}",
                        forward.guest, forward.host_port
                    )
                })
                .collect();
            command
                .arg("-netdev")
                .arg(format!("user,id=net0,restrict=on{forwards}"))
                .args(["-device", "virtio-net-pci,netdev=net0,id=nic0"]);
        }
        let mut qemu = command
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
            answers: Arc::default(),
            commands: Mutex::new(None),
            stderr,
        };
        vm.listen_to_qmp(&qmp)?;
        Ok(vm)
    }

    /// Runs the QMP command `execute` with `arguments` and returns its answer's
    /// `return`; fails on an error answer or none within 10 s. Answers are told apart by
    /// their command's `id`: one that comes too late is never taken for the next's.
    pub fn qmp(&self, execute: &str, arguments: Value) -> Result<Value, String> {
        let mut commands = self.commands.lock().expect("QMP");
        let (stream, last_id) = commands.as_mut().ok_or("QMP is not connected")?;
        *last_id += 1;
        let id = *last_id;
        let command = serde_json::json!({"execute": execute, "arguments": arguments, "id": id});
        stream
            .write_all(format!("{command}\n").as_bytes())
            .map_err(|e| format!("QMP {execute}: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answer = self
                .answers
                .lock()
                .expect("answers")
                .iter()
                .find(|(_, answer)| answer["id"] == id)
                .map(|(_, answer)| answer.clone());
            if let Some(answer) = answer {
                return match answer.get("return") {
                    Some(returned) => Ok(returned.clone()),
                    None => Err(format!("QMP {execute}: {answer}")),
                };
            }
            if Instant::now() > deadline {
                return Err(format!("QMP {execute}: no answer within 10 s"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Connects (`up`) or disconnects the machine's network card from its network, as a
    /// cable pulled out or plugged in: the machine sees its link go down, and nothing
    /// passes either way.
    pub fn set_link(&self, up: bool) -> Result<(), String> {
        self.qmp("set_link", serde_json::json!({"name": "nic0", "up": up}))
            .map(|_| ())
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
        let answers = self.answers.clone();
        std::thread::spawn(move || {
            // The greeting, then events and answers (the test's commands' carry their
            // `id`; qmp_capabilities' has none).
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let Ok(message) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if message.get("event").is_some() {
                    events
                        .lock()
                        .expect("events")
                        .push((Instant::now(), message));
                } else if message.get("return").is_some() || message.get("error").is_some() {
                    answers
                        .lock()
                        .expect("answers")
                        .push((Instant::now(), message));
                }
            }
        });
        *self.commands.lock().expect("QMP") = Some((writer, 0));
        Ok(())
    }

    /// The first console line containing `text`, and when it was read; fails after
    /// `within`, or at once when the machine's `/init` says it failed (a line with
    /// [`GUEST_FAILED`]) or the machine stopped (a QMP event), with the console so far.
    pub fn wait_for_line(&self, text: &str, within: Duration) -> (Instant, String) {
        self.wait_for_line_unless(text, None, within)
    }

    /// [`wait_for_line`](Self::wait_for_line), failing at once, with the console so far,
    /// on a line containing `failure` before one containing `text`.
    pub fn wait_for_line_unless(
        &self,
        text: &str,
        failure: Option<&str>,
        within: Duration,
    ) -> (Instant, String) {
        let deadline = Instant::now() + within;
        loop {
            let console = self.console.lock().expect("console").clone();
            let mut lines = console.iter().filter(|(_, line)| {
                line.contains(text) || failure.is_some_and(|failure| line.contains(failure))
            });
            if let Some((at, line)) = lines.next() {
                assert!(
                    line.contains(text),
                    "{line}\n(before a console line with {text:?})\n{}",
                    self.transcript()
                );
                return (*at, line.clone());
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

    /// The console lines read after `instant`.
    pub fn lines_after(&self, instant: Instant) -> Vec<String> {
        self.console
            .lock()
            .expect("console")
            .iter()
            .filter(|(at, _)| *at > instant)
            .map(|(_, line)| line.clone())
            .collect()
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
