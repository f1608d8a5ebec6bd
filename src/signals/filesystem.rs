//! Filesystem signals from statvfs(3), with cAdvisor's arithmetic.

use std::path::{Path, PathBuf};

use super::error::FileProblem;
use crate::config::{FilesystemLayout, HostPaths};

/// One statvfs sample reduced to what the eviction signals use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// `f_frsize * f_bavail`: what unprivileged writers can still use.
    pub available_bytes: u64,
    /// `f_frsize * f_blocks`.
    pub capacity_bytes: u64,
    /// `f_ffree`.
    pub inodes_free: u64,
    /// `f_files`.
    pub inodes: u64,
}

pub(crate) fn stat_filesystem(path: &Path) -> Result<FsStats, FileProblem> {
    let stat = nix::sys::statvfs::statvfs(path)
        .map_err(|errno| FileProblem::Io(std::io::Error::from(errno)))?;
    let fragment = stat.fragment_size() as u64;
    Ok(FsStats {
        available_bytes: fragment.saturating_mul(stat.blocks_available() as u64),
        capacity_bytes: fragment.saturating_mul(stat.blocks() as u64),
        inodes_free: stat.files_free() as u64,
        inodes: stat.files() as u64,
    })
}

/// A filesystem to measure: the configured path, or its nearest existing ancestor when the
/// path does not exist yet (a host without a kubelet has no `/var/lib/kubelet`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsTarget {
    pub configured: PathBuf,
    pub measured: PathBuf,
}

impl FsTarget {
    pub fn resolve(configured: &Path) -> Self {
        let measured = configured
            .ancestors()
            .find(|candidate| !candidate.as_os_str().is_empty() && candidate.exists())
            .unwrap_or(configured)
            .to_path_buf();
        FsTarget {
            configured: configured.to_path_buf(),
            measured,
        }
    }

    pub fn is_fallback(&self) -> bool {
        self.configured != self.measured
    }
}

/// A filesystem as cAdvisor tells filesystems apart, which the kubelet compares to find
/// its layout (`HasDedicatedImageFs`, `HasDedicatedContainerFs`): by the device number
/// of the path (`GetDirFsDevice`), except on btrfs, where each subvolume has an
/// anonymous number of its own and cAdvisor names the block device the mount came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsDevice {
    /// `major:minor` of the path's `st_dev`.
    Number { major: u64, minor: u64 },
    /// The block device (`/dev/sda2`) of the btrfs mount the path is on.
    Btrfs(String),
}

impl std::fmt::Display for FsDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsDevice::Number { major, minor } => write!(f, "{major}:{minor}"),
            FsDevice::Btrfs(source) => write!(f, "btrfs {source}"),
        }
    }
}

/// One line of `/proc/self/mountinfo`, the fields the device comparison needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub major: u64,
    pub minor: u64,
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// The mounts in a `mountinfo` text (proc(5)); a line that does not parse is left out,
/// since one odd mount must not stop the others from being found, and so is a last line
/// cut short (no newline), whose source or type could be the start of another.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    super::parse::complete_lines(text)
        .lines()
        .filter_map(parse_mount_line)
        .collect()
}

fn parse_mount_line(line: &str) -> Option<Mount> {
    // `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw`: any number
    // of optional fields come before the `-`.
    let fields: Vec<&str> = line.split_ascii_whitespace().collect();
    let separator = fields.iter().position(|field| *field == "-")?;
    if separator < 6 {
        return None;
    }
    let (major, minor) = fields[2].split_once(':')?;
    Some(Mount {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        mount_point: PathBuf::from(unescape_mount_field(fields[4])),
        fs_type: (*fields.get(separator + 1)?).to_string(),
        source: unescape_mount_field(fields.get(separator + 2)?),
    })
}

/// The kernel writes space, tab, newline and backslash in mountinfo as `\ooo`.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)))
            .map(|digits| digits.iter().fold(0u32, |n, d| n * 8 + u32::from(d - b'0')));
        match octal.and_then(|n| u8::try_from(n).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The filesystem `path` is on. `mounts` (from mountinfo) only matter on btrfs; without
/// them the device number decides.
pub fn device_of(path: &Path, mounts: &[Mount]) -> std::io::Result<FsDevice> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path)?.dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let canonical = path.canonicalize()?;
    Ok(identify(
        major,
        minor,
        mount_of(major, minor, &canonical, mounts),
    ))
}

/// The mount a path with device `major:minor` (at `canonical`) is on: the one listing
/// its device number, else the deepest mount point above it (a btrfs subvolume that is
/// not mounted on its own has a number no mount lists; cAdvisor's `mountInfoFromDir`
/// walks up the same way).
fn mount_of<'a>(
    major: u64,
    minor: u64,
    canonical: &Path,
    mounts: &'a [Mount],
) -> Option<&'a Mount> {
    mounts
        .iter()
        .rev()
        .find(|mount| mount.major == major && mount.minor == minor)
        .or_else(|| {
            mounts
                .iter()
                .filter(|mount| canonical.starts_with(&mount.mount_point))
                .max_by_key(|mount| mount.mount_point.components().count())
        })
}

/// cAdvisor's rule: a btrfs mount with an anonymous device number (major 0) and a block
/// device for its source is that block device; anything else is its device number.
fn identify(major: u64, minor: u64, mount: Option<&Mount>) -> FsDevice {
    match mount {
        Some(mount)
            if mount.fs_type == "btrfs" && major == 0 && mount.source.starts_with("/dev/") =>
        {
            FsDevice::Btrfs(mount.source.clone())
        }
        _ => FsDevice::Number { major, minor },
    }
}

/// The node's filesystems as the kubelet sees them: each configured one (at its nearest
/// existing ancestor) with its device, and the layout those devices make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filesystems {
    pub layout: FilesystemLayout,
    /// `nodefs`, then `imagefs` and `containerfs` where configured: the path measured
    /// and its device.
    pub devices: Vec<(&'static str, PathBuf, FsDevice)>,
}

impl Filesystems {
    /// Compare the devices of the configured filesystems, as the kubelet's first
    /// synchronize does. Mountinfo (under `procRoot`) is read only to recognise btrfs;
    /// without it the device numbers decide.
    pub fn detect(paths: &HostPaths) -> Result<Filesystems, String> {
        let mounts = std::fs::read_to_string(paths.proc_root.join("self/mountinfo"))
            .map(|text| parse_mountinfo(&text))
            .unwrap_or_default();
        let device = |name: &'static str, configured: &Path| {
            let measured = FsTarget::resolve(configured).measured;
            match device_of(&measured, &mounts) {
                Ok(device) => Ok((name, measured, device)),
                Err(error) => Err(format!(
                    "cannot tell which device {name} {} is on: {error}",
                    measured.display()
                )),
            }
        };
        let nodefs = device("nodefs", &paths.nodefs)?;
        let imagefs = paths
            .imagefs
            .as_deref()
            .map(|p| device("imagefs", p))
            .transpose()?;
        let containerfs = (paths.containerfs.as_deref())
            .map(|p| device("containerfs", p))
            .transpose()?;
        let layout = FilesystemLayout::of(
            &nodefs.2,
            imagefs.as_ref().map(|found| &found.2),
            containerfs.as_ref().map(|found| &found.2),
        );
        let devices = [Some(nodefs), imagefs, containerfs]
            .into_iter()
            .flatten()
            .collect();
        Ok(Filesystems { layout, devices })
    }

    /// `one filesystem (...): nodefs /var/lib/kubelet on 254:0, imagefs ... on 254:0`
    pub fn describe(&self) -> String {
        let devices: Vec<String> = self
            .devices
            .iter()
            .map(|(name, path, device)| format!("{name} {} on {device}", path.display()))
            .collect();
        format!("{}: {}", self.layout.describe(), devices.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_path_falls_back_to_nearest_existing_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("var/lib/kubelet");
        let target = FsTarget::resolve(&missing);
        assert_eq!(target.measured, dir.path());
        assert!(target.is_fallback());
        let present = FsTarget::resolve(dir.path());
        assert!(!present.is_fallback());
    }

    #[test]
    fn statvfs_reports_consistent_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let stats = stat_filesystem(dir.path()).unwrap();
        assert!(stats.capacity_bytes > 0);
        assert!(stats.available_bytes <= stats.capacity_bytes);
        assert!(stats.inodes_free <= stats.inodes);
        assert!(stat_filesystem(&dir.path().join("absent")).is_err());
    }

    #[test]
    fn mountinfo_lines_give_device_mount_point_type_and_source() {
        let text = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
29 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
36 29 0:34 /@containers /var/lib/my\\040images rw master:1 shared:2 - btrfs /dev/sdb2 rw,subvol=/@containers
not a mount line
40 29 0:35 / /broken rw
";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 3, "{mounts:?}");
        assert_eq!(
            mounts[2],
            Mount {
                major: 0,
                minor: 34,
                mount_point: PathBuf::from("/var/lib/my images"),
                fs_type: "btrfs".to_string(),
                source: "/dev/sdb2".to_string(),
            }
        );
        assert_eq!(mounts[1].source, "/dev/vda");
        assert_eq!(unescape_mount_field("a\\134b\\11"), "a\\b\\11");
    }

    fn btrfs(major: u64, minor: u64, mount_point: &str, source: &str) -> Mount {
        Mount {
            major,
            minor,
            mount_point: PathBuf::from(mount_point),
            fs_type: "btrfs".to_string(),
            source: source.to_string(),
        }
    }

    #[test]
    fn btrfs_subvolumes_of_one_device_are_one_filesystem_as_cadvisor_sees_them() {
        // Two subvolumes of /dev/sdb2, each mounted with its own anonymous number.
        let mounts = [
            btrfs(254, 0, "/", "/dev/vda"),
            btrfs(0, 34, "/var/lib/kubelet", "/dev/sdb2"),
            btrfs(0, 35, "/var/lib/containerd", "/dev/sdb2"),
            Mount {
                fs_type: "tmpfs".to_string(),
                ..btrfs(0, 40, "/run", "tmpfs")
            },
        ];
        let device = |major, minor, path: &str| {
            identify(
                major,
                minor,
                mount_of(major, minor, Path::new(path), &mounts),
            )
        };
        let kubelet = device(0, 34, "/var/lib/kubelet");
        assert_eq!(kubelet, FsDevice::Btrfs("/dev/sdb2".to_string()));
        assert_eq!(device(0, 35, "/var/lib/containerd/io"), kubelet);
        // A nested subvolume no mount lists: the deepest mount above it.
        assert_eq!(device(0, 77, "/var/lib/containerd/snap/1"), kubelet);
        // btrfs with a real device number, and other filesystems, go by the number.
        assert_eq!(
            device(254, 0, "/etc"),
            FsDevice::Number {
                major: 254,
                minor: 0
            }
        );
        assert_eq!(
            device(0, 40, "/run/x"),
            FsDevice::Number {
                major: 0,
                minor: 40
            }
        );
        // A source that is not a block device keeps the number.
        let odd = [btrfs(0, 50, "/data", "none")];
        assert_eq!(
            identify(0, 50, mount_of(0, 50, Path::new("/data"), &odd)),
            FsDevice::Number {
                major: 0,
                minor: 50
            }
        );
    }

    #[test]
    fn a_real_path_is_its_device_number() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let dev = std::fs::metadata(dir.path()).unwrap().dev();
        let number = FsDevice::Number {
            major: nix::sys::stat::major(dev),
            minor: nix::sys::stat::minor(dev),
        };
        assert_eq!(device_of(dir.path(), &[]).unwrap(), number);
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        assert_eq!(
            device_of(&dir.path().join("sub"), &[]).unwrap(),
            device_of(dir.path(), &[]).unwrap()
        );
        assert!(device_of(&dir.path().join("absent"), &[]).is_err());
    }
}
