//! Writes the CRDs as YAML: `crdgen` prints them; `crdgen --write` updates every committed copy
//! (deploy/crds/ for plain `kubectl apply`, and the Helm chart's crds/ directory) and the JSON
//! schemas of the attestations' predicates (docs/attestation/).

use std::{path::PathBuf, process::ExitCode};

fn main() -> ExitCode {
    let yaml = match gpuval_crds::crds_yaml() {
        Ok(y) => y,
        Err(e) => {
            eprintln!("error: could not serialise the CRDs: {e}");
            return ExitCode::FAILURE;
        }
    };
    if std::env::args().any(|a| a == "--write") {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        for rel in gpuval_crds::CRD_COPIES {
            let path = root.join(rel);
            if let Err(e) = std::fs::write(&path, &yaml) {
                eprintln!("error: could not write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            eprintln!("wrote {}", path.display());
        }
        let schemas = match gpuval_crds::attestation::predicate_schemas() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: could not serialise the predicates' schemas: {e}");
                return ExitCode::FAILURE;
            }
        };
        for (rel, text) in gpuval_crds::attestation::SCHEMA_FILES.iter().zip(schemas) {
            let path = root.join(rel);
            let written = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::write(&path, text));
            if let Err(e) = written {
                eprintln!("error: could not write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            eprintln!("wrote {}", path.display());
        }
    } else {
        print!("{yaml}");
    }
    ExitCode::SUCCESS
}
