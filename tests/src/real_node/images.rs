//! The images `tests/scripts/build-images.sh` built (the Dockerfile's operator and agent
//! targets, and the node's sandbox image), as OCI archives with an `images.env` beside them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The directory the build script writes to: `$GPUVAL_IMAGES_DIR`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/gpuval/images` (keep in sync with the script).
pub fn images_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("GPUVAL_IMAGES_DIR") {
        return PathBuf::from(dir);
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("gpuval/images")
}

/// An image: its reference and the archive it is imported from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// `localhost/gpuval-agent:ci`.
    pub reference: String,
    pub archive: PathBuf,
    /// Uncompressed size as buildah reports it (`967 MB`).
    pub size: String,
    /// The archive's size (compressed layers: what a registry would transfer).
    pub archive_bytes: u64,
}

impl Image {
    /// `localhost/gpuval-agent` of `localhost/gpuval-agent:ci`.
    pub fn repository(&self) -> &str {
        self.reference
            .rsplit_once(':')
            .map_or(self.reference.as_str(), |(r, _)| r)
    }

    /// `ci` of `localhost/gpuval-agent:ci`.
    pub fn tag(&self) -> &str {
        self.reference.rsplit_once(':').map_or("", |(_, t)| t)
    }
}

#[derive(Debug, Clone)]
pub struct Images {
    pub operator: Image,
    pub agent: Image,
    /// The pod sandbox image (containerd's `sandbox_image`).
    pub pause: Image,
}

const BUILD_HINT: &str =
    "run `make images` (after `make release sbom`; it runs tests/scripts/build-images.sh)";

impl Images {
    /// Reads `dir/images.env`; Err says what is missing or stale and how to build it.
    pub fn load(dir: &Path) -> Result<Self, String> {
        let env_file = dir.join("images.env");
        let text = std::fs::read_to_string(&env_file)
            .map_err(|e| format!("no images at {} ({e}): {BUILD_HINT}", env_file.display()))?;
        let vars = parse_env(&text);
        let image = |kind: &str, file: &str| -> Result<Image, String> {
            let reference = vars.get(&format!("{kind}_IMAGE")).cloned().ok_or_else(|| {
                format!("{} names no {kind}_IMAGE: {BUILD_HINT}", env_file.display())
            })?;
            let archive = dir.join(file);
            if !archive.is_file() {
                return Err(format!("{} is missing: {BUILD_HINT}", archive.display()));
            }
            let size = vars
                .get(&format!("{kind}_SIZE"))
                .cloned()
                .unwrap_or_default();
            let archive_bytes = vars
                .get(&format!("{kind}_ARCHIVE_BYTES"))
                .and_then(|b| b.parse().ok())
                .unwrap_or(0);
            Ok(Image {
                reference,
                archive,
                size,
                archive_bytes,
            })
        };
        let images = Self {
            operator: image("OPERATOR", "gpuval-operator.tar")?,
            agent: image("AGENT", "gpuval-agent.tar")?,
            pause: image("PAUSE", "gpuval-pause.tar")?,
        };
        check_current(&vars, &crate::crds::repo_root().join("target/dist"))?;
        Ok(images)
    }

    pub fn archives(&self) -> [&Path; 3] {
        [
            &self.pause.archive,
            &self.operator.archive,
            &self.agent.archive,
        ]
    }
}

/// `KEY=value` lines.
fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The images hold the binaries now in `dist` (when there is one): images older than the last
/// `make release` would test code that is no longer there.
fn check_current(vars: &BTreeMap<String, String>, dist: &Path) -> Result<(), String> {
    for binary in ["gpuval-operator", "gpuval-agent"] {
        let path = dist.join(binary);
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let key = format!("DIST_SHA256_{}", binary.to_uppercase().replace('-', "_"));
        let recorded = vars.get(&key).map(String::as_str).unwrap_or("");
        if recorded != sha256_hex(&bytes) {
            return Err(format!(
                "the images hold another {binary} than {}: {BUILD_HINT}",
                path.display()
            ));
        }
    }
    Ok(())
}

/// SHA-256 of `data`, lower-case hex (as sha256sum prints it).
fn sha256_hex(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_splits_into_repository_and_tag() {
        let i = Image {
            reference: "localhost:5000/gpuval-agent:ci".into(),
            archive: PathBuf::new(),
            size: String::new(),
            archive_bytes: 0,
        };
        assert_eq!(
            (i.repository(), i.tag()),
            ("localhost:5000/gpuval-agent", "ci")
        );
    }

    #[test]
    fn images_of_other_binaries_are_stale() {
        let dist = tempfile::tempdir().unwrap();
        std::fs::write(dist.path().join("gpuval-agent"), b"agent v2").unwrap();
        let mut vars = parse_env("AGENT_IMAGE=localhost/gpuval-agent:ci\n");
        let err = check_current(&vars, dist.path()).unwrap_err();
        assert!(
            err.contains("gpuval-agent") && err.contains("make images"),
            "{err}"
        );
        vars.insert("DIST_SHA256_GPUVAL_AGENT".into(), sha256_hex(b"agent v2"));
        check_current(&vars, dist.path()).expect("current");
        // No dist at all: nothing to compare with.
        check_current(&vars, &dist.path().join("none")).expect("no dist");
    }

    #[test]
    fn sha256_matches_sha256sum() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
