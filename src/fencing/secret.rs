//! A credential value that cannot be printed by accident: `Debug` and `Serialize` show
//! `***`, it has no `Display`, and the clear text is reachable only through
//! [`SecretValue::expose`], which the fence-agent runner calls to write the agent's
//! standard input and to redact the agent's output.

use std::fmt;

/// What a credential looks like wherever it is shown.
pub const MASK: &str = "***";

#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    pub fn new(value: impl Into<String>) -> SecretValue {
        SecretValue(value.into())
    }

    /// The clear text, for the agent's standard input and for redaction only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl serde::Serialize for SecretValue {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(MASK)
    }
}

/// Whether an agent option carries a credential, by its `_` spelling: passwords and
/// pass phrases, SNMP communities, IPMI Kg keys, API tokens and secret keys. Such a value
/// is masked in every listing, redacted from agent output, and draws a warning when it is
/// written in a ConfigMap instead of a Secret.
pub fn is_sensitive_option(name: &str) -> bool {
    let name = name.to_ascii_lowercase().replace('-', "_");
    name.contains("passw")
        || name.contains("community")
        || name.contains("secret")
        || name.contains("token")
        || name.ends_with("_kg")
        || name == "api_key"
        || name == "apikey"
        || name == "access_key"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_shows_the_clear_text() {
        let value = SecretValue::new("s3cret");
        assert_eq!(format!("{value:?}"), "***");
        assert_eq!(
            serde_json::to_string(&value).expect("serializes"),
            "\"***\""
        );
        assert_eq!(value.expose(), "s3cret");
    }

    #[test]
    fn knows_the_credential_options_of_the_common_agents() {
        for name in [
            "password",
            "passwd",
            "snmp_priv_passwd",
            "snmp-priv-passwd",
            "community",
            "hexadecimal_kg",
            "secret_key",
            "token",
            "api_key",
        ] {
            assert!(is_sensitive_option(name), "{name}");
        }
        for name in [
            "ip",
            "ipaddr",
            "username",
            "login",
            "plug",
            "ipport",
            "systems_uri",
        ] {
            assert!(!is_sensitive_option(name), "{name}");
        }
    }
}
