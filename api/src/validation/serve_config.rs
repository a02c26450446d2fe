//! `spec.serveConfigV2`: Ray Serve's multi-application config, written as YAML text.

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    sync::{Arc, Mutex},
};

use serde_json::Value;

use super::{FieldError, Verdict};

const FIELD: &str = "spec.serveConfigV2";

/// Parses serveConfigV2 into JSON (what the Ray dashboard's PUT takes).
pub fn parse_serve_config(text: &str) -> Result<Value, yaml_serde::Error> {
    yaml_serde::from_str(text)
}

/// serveConfigV2 texts already parsed, by their text, shared by every clone. The YAML parse is a third of a
/// review's CPU (BENCHMARKS.md, webhook cost), and the same text comes back on every update that leaves the
/// config alone (labels, annotations, a pause, kubectl apply of another field). Off by default; the webhook
/// turns it on. Full, it starts over: the texts in use are few (one per RayService revision).
#[derive(Clone, Default)]
pub struct ServeConfigMemo(Option<Arc<Mutex<Parsed>>>);

/// A parsed config (shared, never copied), or why it did not parse.
type Parse = Result<Arc<Value>, String>;

#[derive(Default)]
struct Parsed {
    capacity: usize,
    bytes: usize,
    /// The parsed config, or the parser's message.
    by_text: HashMap<Box<str>, Parse>,
}

/// Text this long is parsed every time: a memo of a few such texts would hold megabytes.
const MEMO_TEXT_LIMIT: usize = 64 * 1024;
const MEMO_BYTES: usize = 4 * 1024 * 1024;

impl ServeConfigMemo {
    /// Keeps up to `capacity` parsed texts.
    pub fn with_capacity(capacity: usize) -> Self {
        let parsed = Parsed {
            capacity,
            ..Parsed::default()
        };
        Self(Some(Arc::new(Mutex::new(parsed))))
    }

    fn parse(&self, text: &str) -> Parse {
        let parse = || parse_serve_config(text).map(Arc::new).map_err(|e| e.to_string());
        let Some(memo) = self.0.as_ref().filter(|_| text.len() <= MEMO_TEXT_LIMIT) else {
            return parse();
        };
        if let Some(hit) = memo.lock().ok().and_then(|m| m.by_text.get(text).cloned()) {
            return hit;
        }
        // Parsed outside the lock: another review's parse of the same text at once is only wasted work.
        let parsed = parse();
        if let Ok(mut m) = memo.lock() {
            if m.by_text.len() >= m.capacity || m.bytes + text.len() > MEMO_BYTES {
                m.by_text.clear();
                m.bytes = 0;
            }
            m.bytes += text.len();
            m.by_text.insert(text.into(), parsed.clone());
        }
        parsed
    }
}

impl fmt::Debug for ServeConfigMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let texts = self
            .0
            .as_ref()
            .and_then(|m| m.lock().ok().map(|m| m.by_text.len()));
        f.debug_struct("ServeConfigMemo").field("texts", &texts).finish()
    }
}

/// Checks the config parses and names its applications well enough for Serve to accept it; returns it
/// parsed, for the rules that read it further.
pub(crate) fn check(
    text: Option<&str>,
    incremental: bool,
    memo: &ServeConfigMemo,
    v: &mut Verdict,
) -> Option<Arc<Value>> {
    let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
        v.error(FieldError::required(
            FIELD,
            "serve-config-required",
            "a RayService needs at least one Serve application: the service is Ready only when its \
             applications are RUNNING",
        ));
        return None;
    };
    match memo.parse(text) {
        Ok(config) => {
            check_parsed(&config, incremental, v);
            Some(config)
        }
        Err(e) => {
            v.error(FieldError::invalid(
                FIELD,
                "<yaml>",
                "serve-config-yaml",
                format!("must be valid YAML: {e}"),
            ));
            None
        }
    }
}

fn check_parsed(config: &Value, incremental: bool, v: &mut Verdict) {
    let Some(apps) = config.get("applications").and_then(Value::as_array) else {
        v.error(FieldError::required(
            format!("{FIELD}.applications"),
            "serve-config-applications",
            "serveConfigV2 must be a YAML mapping with an `applications` list",
        ));
        return;
    };
    if apps.is_empty() {
        v.error(FieldError::required(
            format!("{FIELD}.applications"),
            "serve-config-applications",
            "must list at least one application",
        ));
    }
    check_applications(apps, v);
    if incremental && config.get("target_capacity").is_some_and(|t| !t.is_null()) {
        v.warn(
            format!("{FIELD}.target_capacity"),
            "serve-config-target-capacity",
            "target_capacity is managed by the incremental upgrade and will be overwritten",
        );
    }
}

/// Serve rejects a config whose apps lack `import_path` or repeat a name or route prefix.
fn check_applications(apps: &[Value], v: &mut Verdict) {
    let mut names = BTreeSet::new();
    let mut prefixes = BTreeSet::new();
    for (i, app) in apps.iter().enumerate() {
        let at = format!("{FIELD}.applications[{i}]");
        if !app.is_object() {
            v.error(FieldError::invalid(
                at,
                app.clone(),
                "serve-config-application",
                "must be a mapping",
            ));
            continue;
        }
        if app
            .get("import_path")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            v.error(FieldError::required(
                format!("{at}.import_path"),
                "serve-config-import-path",
                "every Serve application needs an import_path",
            ));
        }
        let name = app.get("name").and_then(Value::as_str).unwrap_or("default");
        if !names.insert(name.to_string()) {
            v.error(FieldError::invalid(
                format!("{at}.name"),
                name,
                "serve-config-duplicate-name",
                "application names must be unique",
            ));
        }
        if let Some(prefix) = app.get("route_prefix").and_then(Value::as_str)
            && !prefixes.insert(prefix.to_string())
        {
            v.error(FieldError::invalid(
                format!("{at}.route_prefix"),
                prefix,
                "serve-config-duplicate-route",
                "route prefixes must be unique across applications",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "applications:\n- name: a\n  import_path: m:app\n  route_prefix: /\n";
    const DUPLICATE: &str = "applications:\n- name: a\n  import_path: m:app\n- name: a\n  import_path: m:b\n";
    const NOT_YAML: &str = "applications: [\n";

    fn checked(text: &str, memo: &ServeConfigMemo) -> (Verdict, Option<Value>) {
        let mut v = Verdict::default();
        let parsed = check(Some(text), true, memo, &mut v);
        (v, parsed.map(|p| p.as_ref().clone()))
    }

    #[test]
    fn a_kept_parse_answers_as_a_new_one() {
        let memo = ServeConfigMemo::with_capacity(8);
        for text in [GOOD, DUPLICATE, NOT_YAML] {
            let fresh = checked(text, &ServeConfigMemo::default());
            assert_eq!(checked(text, &memo), fresh, "first review of {text:?}");
            assert_eq!(checked(text, &memo), fresh, "second review of {text:?}");
        }
        assert!(!checked(DUPLICATE, &memo).0.allowed());
        assert!(!checked(NOT_YAML, &memo).0.allowed());
        assert_eq!(memo.0.as_ref().unwrap().lock().unwrap().by_text.len(), 3);
    }

    #[test]
    fn a_full_memo_starts_over_and_long_texts_are_not_kept() {
        let memo = ServeConfigMemo::with_capacity(2);
        let kept = || memo.0.as_ref().unwrap().lock().unwrap().by_text.len();
        checked(GOOD, &memo);
        checked(DUPLICATE, &memo);
        assert_eq!(kept(), 2);
        checked(NOT_YAML, &memo);
        assert_eq!(kept(), 1);
        let long = format!("{GOOD}# {}\n", "x".repeat(MEMO_TEXT_LIMIT));
        assert!(checked(&long, &memo).0.allowed());
        assert_eq!(kept(), 1);
    }

    #[test]
    fn clones_share_what_they_keep() {
        let memo = ServeConfigMemo::with_capacity(4);
        let first = memo.parse(GOOD).unwrap();
        assert!(Arc::ptr_eq(&first, &memo.clone().parse(GOOD).unwrap()));
        let off = ServeConfigMemo::default();
        assert!(!Arc::ptr_eq(&off.parse(GOOD).unwrap(), &off.parse(GOOD).unwrap()));
    }
}
