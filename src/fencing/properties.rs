//! The `key=value` properties text of the original node-fencing design's ConfigMaps
//! (`config.properties`, `method.properties`, `template.properties`).
//!
//! One property per line; blank lines and lines starting with `#` or `!` are comments;
//! the first `=` splits key from value and both are trimmed. A key may be spelled with
//! `-` or `_` (`snmp-priv-prot` = `snmp_priv_prot`), as the fence agents themselves
//! accept, so keys are compared in their `_` form and a key given twice in either
//! spelling is an error rather than a silent override.

use std::fmt;

/// One parsed property, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Property {
    /// The key with every `-` turned into `_`.
    pub key: String,
    /// The key as written, for messages.
    pub written: String,
    pub value: String,
    /// 1-based line number in the properties text.
    pub line: usize,
}

/// Why a properties text could not be read; the caller adds the ConfigMap and data key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PropertiesError {
    /// A line that is neither a comment nor `key=value`.
    NotKeyValue { line: usize, text: String },
    /// A key with characters other than letters, digits, `-` and `_`.
    BadKey { line: usize, key: String },
    /// The same key (in either spelling) twice.
    Duplicate {
        key: String,
        first_line: usize,
        line: usize,
    },
}

impl fmt::Display for PropertiesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PropertiesError::NotKeyValue { line, text } => {
                write!(f, "line {line}: expected key=value, found {text:?}")
            }
            PropertiesError::BadKey { line, key } => write!(
                f,
                "line {line}: key {key:?} may hold only letters, digits, '-' and '_'"
            ),
            PropertiesError::Duplicate {
                key,
                first_line,
                line,
            } => write!(
                f,
                "line {line}: {key} is already set on line {first_line} ('-' and '_' are the same in keys)"
            ),
        }
    }
}

/// The `_` spelling of a key: how keys are compared.
pub fn normalize_key(key: &str) -> String {
    key.trim().replace('-', "_")
}

/// Parses a properties text into its properties, in order, rejecting duplicates.
pub fn parse(text: &str) -> Result<Vec<Property>, PropertiesError> {
    let mut properties: Vec<Property> = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('!') {
            continue;
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            return Err(PropertiesError::NotKeyValue {
                line,
                text: trimmed.to_string(),
            });
        };
        let written = key.trim();
        let valid = !written.is_empty()
            && written
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(PropertiesError::BadKey {
                line,
                key: written.to_string(),
            });
        }
        let key = normalize_key(written);
        if let Some(first) = properties.iter().find(|p| p.key == key) {
            return Err(PropertiesError::Duplicate {
                key: written.to_string(),
                first_line: first.line,
                line,
            });
        }
        properties.push(Property {
            key,
            written: written.to_string(),
            value: value.trim().to_string(),
            line,
        });
    }
    Ok(properties)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_keys_values_and_skips_comments() {
        let text =
            "# a comment\n! another\n\n  node_name = worker-1 \nisolation=fc-off\nrecovery=\n";
        let properties = parse(text).expect("valid properties");
        let pairs: Vec<(&str, &str)> = properties
            .iter()
            .map(|p| (p.key.as_str(), p.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("node_name", "worker-1"),
                ("isolation", "fc-off"),
                ("recovery", "")
            ]
        );
        assert_eq!(properties[0].line, 4);
    }

    #[test]
    fn splits_at_the_first_equals_sign_only() {
        let properties = parse("password=a=b==c").expect("valid");
        assert_eq!(properties[0].value, "a=b==c");
    }

    #[test]
    fn both_spellings_of_a_key_are_one_key() {
        let properties = parse("snmp-priv-prot=AES").expect("valid");
        assert_eq!(properties[0].key, "snmp_priv_prot");
        assert_eq!(properties[0].written, "snmp-priv-prot");
        let error = parse("snmp-priv-prot=AES\nsnmp_priv_prot=DES").expect_err("duplicate");
        assert_eq!(
            error,
            PropertiesError::Duplicate {
                key: "snmp_priv_prot".into(),
                first_line: 1,
                line: 2
            }
        );
    }

    #[test]
    fn rejects_lines_without_a_key() {
        assert_eq!(
            parse("plug 2"),
            Err(PropertiesError::NotKeyValue {
                line: 1,
                text: "plug 2".into()
            })
        );
        assert!(matches!(
            parse("=value"),
            Err(PropertiesError::BadKey { line: 1, .. })
        ));
        assert!(matches!(
            parse("pass word=x"),
            Err(PropertiesError::BadKey { line: 1, .. })
        ));
    }
}
