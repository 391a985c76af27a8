//! The node's result kept on the pod's filesystem (`GPUVAL_STATE_DIR`, an emptyDir the
//! operator mounts) from the moment the checks end until it is stored: whoever looks into the
//! pod while the API server is out of reach finds it there, and an agent started again in
//! the same pod stores it instead of running the checks a second time.

use std::path::{Path, PathBuf};

use gpuval_crds::NodeReport;
use serde::{Deserialize, Serialize};

/// The file name in the state directory.
pub const FILE: &str = "result.json";

/// A report and the run and pod it belongs to (so that a file from another run is never taken).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedResult {
    pub validation_uid: String,
    pub generation: i64,
    pub pod_name: String,
    pub pod_uid: Option<String>,
    pub report: NodeReport,
}

/// Why the result could not be kept on disk (the agent goes on with it in memory).
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error("write {path}: {source} (is GPUVAL_STATE_DIR a writable volume?)")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serialise the result: {0}")]
    Json(#[from] serde_json::Error),
}

/// Writes `saved` to `dir`/[`FILE`] atomically (a temporary file renamed over it).
pub fn save(dir: &Path, saved: &SavedResult) -> Result<PathBuf, SaveError> {
    let path = dir.join(FILE);
    let tmp = dir.join(format!(".{FILE}.tmp"));
    let body = serde_json::to_vec(saved)?;
    let write = |p: &Path| std::fs::write(p, &body);
    write(&tmp)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|source| SaveError::Write {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}

/// The result saved in `dir` by this same pod of this same run, if there is one. A file of
/// another run or pod, or one that cannot be read, is ignored (with a log line).
pub fn load(dir: &Path, wanted: &SavedResult) -> Option<NodeReport> {
    let path = dir.join(FILE);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the saved result; running the checks");
            return None;
        }
    };
    let saved: SavedResult = match serde_json::from_slice(&text) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the saved result is unreadable; running the checks");
            return None;
        }
    };
    let same_run = saved.validation_uid == wanted.validation_uid
        && saved.generation == wanted.generation
        && saved.pod_name == wanted.pod_name
        && saved.pod_uid == wanted.pod_uid;
    if !same_run {
        tracing::info!(path = %path.display(), "the saved result belongs to another run or pod; running the checks");
        return None;
    }
    Some(saved.report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::Verdict;

    fn saved(generation: i64, verdict: Verdict) -> SavedResult {
        SavedResult {
            validation_uid: "uid-1".into(),
            generation,
            pod_name: "gpuval-quick-gpu-0-g1".into(),
            pod_uid: Some("pod-uid-1".into()),
            report: NodeReport {
                verdict,
                simulated: true,
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_saved_result_comes_back_for_the_same_pod_and_run_only() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path(), &saved(1, Verdict::Pass)), None);
        let path = save(dir.path(), &saved(1, Verdict::Fail)).unwrap();
        assert!(path.ends_with(FILE));
        let back = load(dir.path(), &saved(1, Verdict::Pass)).expect("same pod, same run");
        assert_eq!(
            back.verdict,
            Verdict::Fail,
            "the saved report, not the wanted one"
        );
        assert_eq!(
            load(dir.path(), &saved(2, Verdict::Pass)),
            None,
            "another generation"
        );
        let mut other_pod = saved(1, Verdict::Pass);
        other_pod.pod_uid = Some("pod-uid-2".into());
        assert_eq!(
            load(dir.path(), &other_pod),
            None,
            "another pod of the same name"
        );
    }

    #[test]
    fn an_unreadable_file_is_ignored_and_an_unwritable_dir_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), b"{not json").unwrap();
        assert_eq!(load(dir.path(), &saved(1, Verdict::Pass)), None);
        let missing = dir.path().join("absent");
        let err = save(&missing, &saved(1, Verdict::Pass)).unwrap_err();
        assert!(err.to_string().contains("GPUVAL_STATE_DIR"), "{err}");
    }
}
