//! The host's identity for the certificate: DMI vendor, product and serial
//! (`/sys/class/dmi/id`) and the RDMA adapters with their firmware (`/sys/class/infiniband`),
//! each where readable (the DMI serial needs root). Nothing here fails: what cannot be read is
//! left out.

use std::path::Path;

use gpuval_crds::report::{HostIdentity, NicIdentity};

/// The DMI identity under `sys` (normally `/sys`), None when nothing is readable.
pub fn host(sys: &Path) -> Option<HostIdentity> {
    let dmi = sys.join("class/dmi/id");
    let h = HostIdentity {
        vendor: read(&dmi.join("sys_vendor")),
        product: read(&dmi.join("product_name")),
        serial: read(&dmi.join("product_serial")),
    };
    (h != HostIdentity::default()).then_some(h)
}

/// The RDMA adapters under `sys`, by name, with their firmware and node GUID.
pub fn nics(sys: &Path) -> Vec<NicIdentity> {
    let dir = sys.join("class/infiniband");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<NicIdentity> = entries
        .flatten()
        .map(|e| {
            let p = e.path();
            NicIdentity {
                name: e.file_name().to_string_lossy().into_owned(),
                firmware: read(&p.join("fw_ver")),
                node_guid: read(&p.join("node_guid")),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// A sysfs file's text, trimmed; None when unreadable or empty.
fn read(path: &Path) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_dmi_and_adapters_and_leaves_out_what_is_missing() {
        let sys = tempfile::tempdir().expect("temp dir");
        let dmi = sys.path().join("class/dmi/id");
        std::fs::create_dir_all(&dmi).expect("dmi dir");
        std::fs::write(dmi.join("product_name"), "DGX H100\n").expect("write");
        std::fs::write(dmi.join("product_serial"), "1234XYZ\n").expect("write");
        for (name, fw) in [("mlx5_1", "28.39.1002"), ("mlx5_0", "28.39.1002")] {
            let d = sys.path().join("class/infiniband").join(name);
            std::fs::create_dir_all(&d).expect("nic dir");
            std::fs::write(d.join("fw_ver"), format!("{fw}\n")).expect("write");
        }
        let h = host(sys.path()).expect("host identity");
        assert_eq!(h.product.as_deref(), Some("DGX H100"));
        assert_eq!(h.serial.as_deref(), Some("1234XYZ"));
        assert_eq!(h.vendor, None);
        let n = nics(sys.path());
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].name, "mlx5_0");
        assert_eq!(n[0].firmware.as_deref(), Some("28.39.1002"));
        assert_eq!(n[0].node_guid, None);
        let empty = tempfile::tempdir().expect("temp dir");
        assert_eq!(host(empty.path()), None);
        assert!(nics(empty.path()).is_empty());
    }
}
