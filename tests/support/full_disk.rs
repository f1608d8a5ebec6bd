//! A filesystem of the test's own that it can fill to the last byte and free again: a
//! small tmpfs mounted (as root) on a directory the test created, unmounted when dropped.
//! Full is a real full disk: the kernel answers writes with `ENOSPC`, part-way through a
//! write when only part of it fits.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct FullDisk {
    mountpoint: PathBuf,
    fillers: usize,
}

impl FullDisk {
    /// Mount a tmpfs of `size_kib` KiB on `mountpoint` (created if missing).
    pub fn mount(mountpoint: &Path, size_kib: u64) -> Result<FullDisk, String> {
        super::real::root()?;
        std::fs::create_dir_all(mountpoint)
            .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size_kib}k,mode=0755"))
            .arg("nodekeeper-test-full-disk")
            .arg(mountpoint)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "mount -t tmpfs on {}: {}",
                mountpoint.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(FullDisk {
            mountpoint: mountpoint.to_path_buf(),
            fillers: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// Fill every byte left with a file of its own; returns how many bytes it took.
    pub fn fill(&mut self) -> u64 {
        let path = self.mountpoint.join(format!(".filler-{}", self.fillers));
        self.fillers += 1;
        let mut file = std::fs::File::create(&path).expect("create the filler file");
        let block = [0xa5u8; 512];
        let mut taken = 0u64;
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(n) => taken += n as u64,
                Err(error) if error.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(error) => panic!("filling {}: {error}", path.display()),
            }
        }
        // Bytes less than a block may still fit.
        while let Ok(1) = file.write(&block[..1]) {
            taken += 1;
        }
        taken
    }

    /// Whether not even one more byte can be written to a new file.
    pub fn is_full(&self) -> bool {
        let probe = self.mountpoint.join(".probe");
        let full = std::fs::File::create(&probe)
            .and_then(|mut file| file.write_all(b"x"))
            .is_err();
        let _ = std::fs::remove_file(&probe);
        full
    }

    /// Remove what [`fill`](Self::fill) wrote.
    pub fn free(&mut self) {
        for index in 0..self.fillers {
            let _ = std::fs::remove_file(self.mountpoint.join(format!(".filler-{index}")));
        }
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        // Lazily: a process of the test's that still has a file open there must not keep
        // the mount on the host.
        let _ = Command::new("umount")
            .arg("--lazy")
            .arg(&self.mountpoint)
            .status();
    }
}
