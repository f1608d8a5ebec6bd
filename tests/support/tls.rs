//! Certificates made with the real `openssl` command (Debian package `openssl`), as an
//! operator or cert-manager would make them: a CA, and server certificates it signs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A certificate and its key, PEM files.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(args: &[&str]) -> Result<(), String> {
    let output = Command::new("openssl")
        .args(args)
        .output()
        .map_err(|error| format!("openssl cannot run: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn path(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

impl Pair {
    /// The controller configuration's `tls` setting for the report endpoint, serving
    /// this pair.
    pub fn reports_setting(&self) -> String {
        format!(
            "tls: {{certFile: {}, keyFile: {}}}",
            self.cert.display(),
            self.key.display()
        )
    }
}

/// A self-signed CA named `name` in `dir` (`name.crt`, `name.key`).
pub fn certificate_authority(dir: &Path, name: &str) -> Result<Pair, String> {
    let pair = Pair {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        &format!("/CN={name}"),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        path(&pair.key),
        "-out",
        path(&pair.cert),
    ])?;
    Ok(pair)
}

/// A server certificate for 127.0.0.1 and `localhost`, signed by `ca`, written to
/// `dir/name.crt` and `dir/name.key`.
pub fn server_certificate(dir: &Path, name: &str, ca: &Pair) -> Result<Pair, String> {
    server_certificate_for(dir, name, ca, &[])
}

/// [`server_certificate`], valid for the IP addresses `more` as well.
pub fn server_certificate_for(
    dir: &Path,
    name: &str,
    ca: &Pair,
    more: &[&str],
) -> Result<Pair, String> {
    let pair = Pair {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    let request = dir.join(format!("{name}.csr"));
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        &format!("/CN={name}"),
        "-keyout",
        path(&pair.key),
        "-out",
        path(&request),
    ])?;
    let extensions = dir.join(format!("{name}.ext"));
    std::fs::write(
        &extensions,
        format!(
            "subjectAltName=IP:127.0.0.1,DNS:localhost{}\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
            more.iter().map(|ip| format!(",IP:{ip}")).collect::<String>()
        ),
    )
    .map_err(|error| error.to_string())?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        path(&request),
        "-CA",
        path(&ca.cert),
        "-CAkey",
        path(&ca.key),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        path(&extensions),
        "-out",
        path(&pair.cert),
    ])?;
    Ok(pair)
}

/// Replaces `into`'s files with `from`'s as a Secret volume update does: each file is
/// renamed into place, so a reader sees the old file or the new one, never half of one.
pub fn install(from: &Pair, into: &Pair) {
    for (source, target) in [(&from.cert, &into.cert), (&from.key, &into.key)] {
        let staged = target.with_extension("staged");
        std::fs::copy(source, &staged).expect("stage the file");
        std::fs::rename(&staged, target).expect("rename it into place");
    }
}
