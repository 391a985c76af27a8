//! The API server's audit log (started with [`Options::audit_log`](crate::Options)): one
//! JSON event per write request, read back to count and order writes independently of what
//! the writers say of themselves.

use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

/// One write request as the API server saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The HTTP status the API server answered.
    pub code: u16,
    pub received: Timestamp,
}

impl Write {
    /// True when the API server carried the write out (2xx).
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    verb: String,
    user: User,
    object_ref: Option<ObjectRef>,
    response_status: Option<ResponseStatus>,
    request_received_timestamp: String,
}

#[derive(Deserialize)]
struct User {
    username: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    resource: Option<String>,
    subresource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    code: Option<u16>,
}

/// Every write in the audit log at `path`, in the order logged (lines that are not events are
/// skipped), the files it was rotated into first ([`pieces`]): a count that read only `path`
/// would miss whatever the API server had already moved aside.
pub fn writes(path: &Path) -> Result<Vec<Write>, String> {
    let mut all = Vec::new();
    for piece in pieces(path)? {
        let text = std::fs::read_to_string(&piece)
            .map_err(|e| format!("read {}: {e}", piece.display()))?;
        all.extend(text.lines().filter_map(parse));
    }
    Ok(all)
}

/// The files of the audit log at `path`, oldest first: those it was rotated into
/// (`<stem>-<time>.<ext>` beside it, whose names sort by time), then `path` itself. The API
/// server rotates its log at 100 MB unless told `--audit-log-maxsize=0`.
pub fn pieces(path: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let (Some(dir), Some(stem), ext) = (
        path.parent(),
        path.file_stem().and_then(|s| s.to_str()),
        path.extension()
            .and_then(|s| s.to_str())
            .unwrap_or_default(),
    ) else {
        return Err(format!("{} names no audit log file", path.display()));
    };
    let prefix = format!("{stem}-");
    let suffix = format!(".{ext}");
    let mut rotated: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("list {}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(&suffix))
        })
        .collect();
    rotated.sort();
    rotated.push(path.to_path_buf());
    Ok(rotated)
}

fn parse(line: &str) -> Option<Write> {
    let e: Event = serde_json::from_str(line).ok()?;
    if matches!(e.verb.as_str(), "get" | "list" | "watch") {
        return None;
    }
    let r = e.object_ref.unwrap_or(ObjectRef {
        resource: None,
        subresource: None,
        namespace: None,
        name: None,
    });
    Some(Write {
        user: e.user.username,
        verb: e.verb,
        resource: r.resource.unwrap_or_default(),
        subresource: r.subresource,
        namespace: r.namespace,
        name: r.name,
        code: e.response_status.and_then(|s| s.code).unwrap_or(0),
        received: e.request_received_timestamp.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(name: &str, at: &str) -> String {
        format!(
            r#"{{"kind":"Event","verb":"create","user":{{"username":"op"}},"objectRef":{{"resource":"pods","name":"{name}"}},"responseStatus":{{"code":201}},"requestReceivedTimestamp":"{at}"}}"#
        )
    }

    #[test]
    fn writes_moved_aside_by_rotation_are_counted_oldest_first() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let current = dir.path().join("audit.log");
        let put = |file: &str, lines: &[String]| {
            std::fs::write(dir.path().join(file), lines.join("\n")).expect("write a log file");
        };
        put(
            "audit-2026-01-02T03-04-06.000.log",
            &[line("b", "2026-01-02T03:04:06Z")],
        );
        put(
            "audit-2026-01-02T03-04-05.000.log",
            &[line("a", "2026-01-02T03:04:05Z")],
        );
        put("audit.log", &[line("c", "2026-01-02T03:04:07Z")]);
        put("audit-policy.yaml", &["rules: []".to_string()]);
        let names: Vec<_> = writes(&current)
            .expect("read the log")
            .into_iter()
            .filter_map(|w| w.name)
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn an_audit_event_reads_as_a_write() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/apis/gpuval.io/v1alpha1/gpuvalidations/v/status","verb":"patch","user":{"username":"system:serviceaccount:gpuval-system:replica-a","groups":["system:serviceaccounts"]},"objectRef":{"resource":"gpuvalidations","name":"v","apiGroup":"gpuval.io","apiVersion":"v1alpha1","subresource":"status"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-01-02T03:04:05.123456Z","stageTimestamp":"2026-01-02T03:04:05.200000Z"}"#;
        let w = parse(line).expect("a write");
        assert_eq!(w.verb, "patch");
        assert_eq!(w.resource, "gpuvalidations");
        assert_eq!(w.subresource.as_deref(), Some("status"));
        assert_eq!(w.user, "system:serviceaccount:gpuval-system:replica-a");
        assert!(w.succeeded());
        assert_eq!(w.received.to_string(), "2026-01-02T03:04:05.123456Z");
        assert_eq!(parse(&line.replace("\"patch\"", "\"get\"")), None);
        assert_eq!(parse("not json"), None);
    }
}
