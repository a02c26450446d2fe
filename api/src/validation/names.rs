//! Kubernetes name and label syntax (apimachinery's `validation` package rules).

const DNS_LABEL_MAX: usize = 63;
const LABEL_VALUE_MAX: usize = 63;
const QUALIFIED_NAME_MAX: usize = 63;
const DNS_SUBDOMAIN_MAX: usize = 253;

/// RFC 1035 label: lower-case alphanumerics and '-', starting with a letter, ending alphanumeric.
pub fn is_dns1035_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= DNS_LABEL_MAX
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// RFC 1123 label: like 1035 but may start with a digit.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= DNS_LABEL_MAX
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// RFC 1123 subdomain: dot-separated 1123 labels, at most 253 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= DNS_SUBDOMAIN_MAX
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= QUALIFIED_NAME_MAX
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Problems with a label key (`[prefix/]name`); empty when valid.
pub fn qualified_name_errors(key: &str) -> Vec<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let mut errs = Vec::new();
    if let Some(p) = prefix
        && !is_dns1123_subdomain(p)
    {
        errs.push("prefix part must be a lowercase RFC 1123 subdomain".to_string());
    }
    if name.contains('/') || !is_name_part(name) {
        errs.push(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end \
             with an alphanumeric character (at most 63 characters)"
                .to_string(),
        );
    }
    errs
}

/// Problems with a label value; empty when valid (the empty string is a valid value).
pub fn label_value_errors(value: &str) -> Vec<String> {
    if value.is_empty() {
        return Vec::new();
    }
    if value.len() > LABEL_VALUE_MAX || !is_name_part(value) {
        return vec![
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or \
             '.', and must start and end with an alphanumeric character (at most 63 characters)"
                .to_string(),
        ];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(is_dns1035_label("rayservice-sample"));
        assert!(!is_dns1035_label("1abc"));
        assert!(is_dns1123_label("1abc"));
        assert!(!is_dns1035_label("Abc"));
        assert!(!is_dns1035_label("abc-"));
        assert!(!is_dns1035_label(""));
        assert!(!is_dns1035_label(&"a".repeat(64)));
    }

    #[test]
    fn labels() {
        assert!(qualified_name_errors("ray.io/node-type").is_empty());
        assert!(qualified_name_errors("app").is_empty());
        assert!(!qualified_name_errors("-bad").is_empty());
        assert!(!qualified_name_errors("Bad_Prefix/x").is_empty());
        assert!(label_value_errors("").is_empty());
        assert!(label_value_errors("v1.2_3").is_empty());
        assert!(!label_value_errors("bad value").is_empty());
    }
}
