//! The fabric rendezvous key of a validation: a Secret of random bytes in the agent namespace,
//! owned by the validation (it goes with it), and mounted read-only into that validation's
//! fabric agent pods alone. The agents prove they hold it at every rendezvous (the agent's
//! `fabric::member_key`); the agent service account cannot read Secrets, so only the pods
//! that mount it have it.

use std::collections::BTreeMap;

use gpuval_crds::{GpuValidation, agent_env, labels};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    EnvVar, KeyToPath, Pod, Secret, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use ring::rand::{SecureRandom, SystemRandom};

/// The key's length in bytes.
pub const KEY_BYTES: usize = 32;
/// The Secret's data key, and the file name under [`MOUNT`].
pub const FILE: &str = "key";
/// Where the Secret is mounted in fabric agent pods.
pub const MOUNT: &str = "/var/run/gpuval-fabric";
/// The pod volume's name.
pub const VOLUME: &str = "fabric-key";
/// Read-only for the agent, whatever user it runs as (the pod has no other container).
const MODE: i32 = 0o444;

/// The Secret's name: one-to-one in the validation's name (a fixed suffix).
pub fn secret_name(validation: &str) -> String {
    gpuval_crds::result::shortened(
        format!("{validation}-fabric-key"),
        gpuval_crds::names::DNS1123_SUBDOMAIN_MAX,
    )
}

/// Fresh random key bytes.
pub fn new_key() -> Result<Vec<u8>, String> {
    let mut key = vec![0u8; KEY_BYTES];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| "the system's random number generator failed".to_string())?;
    Ok(key)
}

/// The key Secret of `gv` holding `key`, in `namespace`, owned by the validation, immutable.
pub fn secret(gv: &GpuValidation, namespace: &str, key: Vec<u8>) -> Secret {
    let validation = gv.metadata.name.clone().unwrap_or_default();
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&validation)),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (
                    labels::MANAGED_BY_KEY.to_string(),
                    labels::MANAGED_BY.to_string(),
                ),
                (
                    labels::VALIDATION.to_string(),
                    labels::node_value(&validation),
                ),
            ])),
            owner_references: gv.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(BTreeMap::from([(FILE.to_string(), ByteString(key))])),
        ..Default::default()
    }
}

/// Whether `secret` is `gv`'s own (owned by this validation, not by an earlier one of the same
/// name that is still being deleted).
pub fn belongs_to(secret: &Secret, gv: &GpuValidation) -> bool {
    let uid = gv.metadata.uid.as_deref();
    secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

/// Mounts `gv`'s key Secret into its agent pod and names the file to the agent, when the
/// validation runs the fabric; other pods get nothing.
pub fn add_to_pod(pod: &mut Pod, gv: &GpuValidation) {
    if gv.spec.fabric.is_none() {
        return;
    }
    let validation = gv.metadata.name.clone().unwrap_or_default();
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.volumes.get_or_insert_default().push(Volume {
        name: VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret_name(&validation)),
            default_mode: Some(MODE),
            items: Some(vec![KeyToPath {
                key: FILE.into(),
                path: FILE.into(),
                mode: None,
            }]),
            optional: Some(false),
        }),
        ..Default::default()
    });
    for c in &mut spec.containers {
        c.volume_mounts.get_or_insert_default().push(VolumeMount {
            name: VOLUME.into(),
            mount_path: MOUNT.into(),
            read_only: Some(true),
            ..Default::default()
        });
        c.env.get_or_insert_default().push(EnvVar {
            name: agent_env::FABRIC_KEY_FILE.into(),
            value: Some(format!("{MOUNT}/{FILE}")),
            value_from: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gv(fabric: bool) -> GpuValidation {
        let mut spec = crate::decide::selection::tests::spec();
        if fabric {
            spec.fabric = Some(serde_json::from_value(serde_json::json!({"tcp": {}})).unwrap());
        }
        let mut g = GpuValidation::new("acceptance", spec);
        g.metadata.generation = Some(1);
        g.metadata.uid = Some("uid-1".into());
        g
    }

    #[test]
    fn the_secret_is_the_validation_s_own_and_goes_with_it() {
        let key = new_key().unwrap();
        assert_eq!(key.len(), KEY_BYTES);
        assert_ne!(key, new_key().unwrap(), "every key is fresh");
        let s = secret(&gv(true), "gpuval-system", key.clone());
        assert_eq!(s.metadata.name.as_deref(), Some("acceptance-fabric-key"));
        assert_eq!(s.data.as_ref().unwrap()[FILE].0, key);
        assert_eq!(s.immutable, Some(true));
        assert!(belongs_to(&s, &gv(true)));
        let mut successor = gv(true);
        successor.metadata.uid = Some("uid-2".into());
        assert!(!belongs_to(&s, &successor), "an earlier validation's");
        assert_ne!(secret_name("a-b"), secret_name("a"));
        assert!(secret_name(&"v".repeat(253)).len() <= 253);
    }

    #[test]
    fn only_a_fabric_validation_s_pods_mount_the_key() {
        let cfg = crate::settings::config::OperatorConfig::default();
        let plain = crate::decide::pod::agent_pod(&gv(false), "gpu-a", 8, &cfg);
        let text = serde_json::to_string(&plain).unwrap();
        assert!(!text.contains(VOLUME) && !text.contains(agent_env::FABRIC_KEY_FILE));
        let pod = crate::decide::pod::agent_pod(&gv(true), "gpu-a", 8, &cfg);
        let spec = pod.spec.unwrap();
        let vol = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == VOLUME)
            .expect("the key volume");
        let source = vol.secret.as_ref().expect("a secret volume");
        assert_eq!(source.secret_name.as_deref(), Some("acceptance-fabric-key"));
        let c = &spec.containers[0];
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == VOLUME)
            .expect("mounted");
        assert_eq!(mount.read_only, Some(true));
        let env = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == agent_env::FABRIC_KEY_FILE)
            .expect("named to the agent");
        assert_eq!(env.value.as_deref(), Some("/var/run/gpuval-fabric/key"));
    }
}
