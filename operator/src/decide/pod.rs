//! The agent pod for one node of one run (pure).

use std::collections::BTreeMap;

use gpuval_crds::{
    FabricRoundSpec, GPU_RESOURCE, GpuFabricRound, GpuValidation, agent_env, labels,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HostPathVolumeSource, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, Pod, PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile,
    SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::settings::config::OperatorConfig;

/// Where the I/O volume is mounted in the agent container (the agent's `GPUVAL_IO_DIR`).
pub const IO_MOUNT: &str = "/var/lib/gpuval-io";
/// Where the agent keeps its result until it is stored (an emptyDir; the root is read-only).
pub const STATE_MOUNT: &str = "/var/lib/gpuval-agent";
/// The state volume's size limit (a report is tens of kilobytes).
pub const STATE_SIZE: &str = "16Mi";
/// The agent's temporary directory (an emptyDir; the root is read-only): `TMPDIR` names it, so
/// the working directories of the NCCL, training and fabric child processes, NCCL's logs and
/// its library link are made there, and `CUDA_CACHE_PATH` puts the driver's kernel cache there.
pub const SCRATCH_MOUNT: &str = "/tmp";
/// The temporary directory's size limit: NCCL's logs and the kernel cache are megabytes; a pod
/// over it is evicted, so it is generous.
pub const SCRATCH_SIZE: &str = "1Gi";
/// The `app.kubernetes.io/name` of agent pods.
pub const APP_LABEL: &str = labels::AGENT_APP;

/// Deterministic pod name: [`gpuval_crds::result::agent_pod_name`] (one-to-one in validation
/// and node, at most 63 characters: pod names become hostnames).
pub fn pod_name(validation: &str, node: &str, generation: i64) -> String {
    gpuval_crds::result::agent_pod_name(validation, node, generation)
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                api_version: None,
            }),
            ..Default::default()
        }),
    }
}

/// The labels every agent pod of a run carries.
/// The object of a fabric round: named for its validation, generation and number (the end
/// marker `end`), labelled like the agent pods, owned by the validation.
pub fn fabric_round(gv: &GpuValidation, spec: &FabricRoundSpec) -> GpuFabricRound {
    let suffix = if spec.end {
        format!("g{}-end", spec.generation)
    } else if spec.shards > 1 {
        format!("g{}-r{}-p{}", spec.generation, spec.round, spec.shard)
    } else {
        format!("g{}-r{}", spec.generation, spec.round)
    };
    let name = gpuval_crds::result::shortened(
        format!("{}-{suffix}", spec.validation),
        gpuval_crds::names::DNS1123_SUBDOMAIN_MAX,
    );
    let mut labels = BTreeMap::from([
        (
            labels::MANAGED_BY_KEY.to_string(),
            labels::MANAGED_BY.to_string(),
        ),
        (
            labels::VALIDATION.to_string(),
            labels::node_value(&spec.validation),
        ),
        (labels::GENERATION.to_string(), spec.generation.to_string()),
        (labels::ROUND.to_string(), spec.round.to_string()),
    ]);
    labels.retain(|_, v| !v.is_empty());
    GpuFabricRound {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            owner_references: gv.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: spec.clone(),
    }
}

pub fn pod_labels(validation: &str, node: &str, generation: i64) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::APP_NAME_KEY.to_string(), APP_LABEL.to_string()),
        (
            labels::MANAGED_BY_KEY.to_string(),
            labels::MANAGED_BY.to_string(),
        ),
        (
            labels::VALIDATION.to_string(),
            labels::node_value(validation),
        ),
        (labels::NODE.to_string(), labels::node_value(node)),
        (labels::GENERATION.to_string(), generation.to_string()),
    ])
}

/// The agent's environment: its run, its node and pod (downward API), the I/O directory when
/// the admin set one, then the admin's extra variables.
fn container_env(gv: &GpuValidation, cfg: &OperatorConfig) -> Vec<EnvVar> {
    let mut envs = vec![
        env(
            agent_env::VALIDATION,
            gv.metadata.name.clone().unwrap_or_default(),
        ),
        env(
            agent_env::GENERATION,
            gv.metadata.generation.unwrap_or(0).to_string(),
        ),
        env(
            agent_env::VALIDATION_UID,
            gv.metadata.uid.clone().unwrap_or_default(),
        ),
        field_env(agent_env::NODE_NAME, "spec.nodeName"),
        field_env(agent_env::POD_NAMESPACE, "metadata.namespace"),
        field_env(agent_env::POD_NAME, "metadata.name"),
        field_env(agent_env::POD_UID, "metadata.uid"),
        env(agent_env::STATE_DIR, STATE_MOUNT),
        env("TMPDIR", SCRATCH_MOUNT),
        env("CUDA_CACHE_PATH", format!("{SCRATCH_MOUNT}/cuda-cache")),
    ];
    if cfg.io_host_path.is_some() {
        envs.push(env(agent_env::IO_DIR, IO_MOUNT));
    }
    if !cfg.agent_result_jitter.is_zero() {
        let ms = cfg.agent_result_jitter.as_millis().to_string();
        envs.push(env(agent_env::RESULT_JITTER_MS, ms));
    }
    if cfg.agent_allow_shared_gpus {
        envs.push(env(agent_env::ALLOW_SHARED_GPUS, "true"));
    }
    if cfg.agent_pod_resources {
        envs.push(env(agent_env::POD_RESOURCES_SOCKET, POD_RESOURCES_SOCKET));
    }
    envs.extend(cfg.agent_env.iter().map(|(k, v)| env(k, v.clone())));
    envs
}

/// The I/O check's host directory and its mount, when the admin configured one.
fn io_volume(cfg: &OperatorConfig) -> Option<(Volume, VolumeMount)> {
    let path = cfg.io_host_path.as_ref()?;
    let volume = Volume {
        name: "io".into(),
        host_path: Some(HostPathVolumeSource {
            path: path.display().to_string(),
            type_: Some("DirectoryOrCreate".into()),
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: "io".into(),
        mount_path: IO_MOUNT.into(),
        ..Default::default()
    };
    Some((volume, mount))
}

/// The agent's own scratch directory, where it keeps its result until the API server has it.
fn state_volume() -> (Volume, VolumeMount) {
    let volume = Volume {
        name: "state".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: None,
            size_limit: Some(Quantity(STATE_SIZE.into())),
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: "state".into(),
        mount_path: STATE_MOUNT.into(),
        ..Default::default()
    };
    (volume, mount)
}

/// The agent's temporary directory ([`SCRATCH_MOUNT`], `TMPDIR`): every file the agent, its
/// child processes and the libraries they load write outside the state and I/O volumes.
fn scratch_volume() -> (Volume, VolumeMount) {
    let volume = Volume {
        name: "tmp".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: None,
            size_limit: Some(Quantity(SCRATCH_SIZE.into())),
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: "tmp".into(),
        mount_path: SCRATCH_MOUNT.into(),
        ..Default::default()
    };
    (volume, mount)
}

/// Memory-backed `/dev/shm` for every validation whose steps run NCCL (the nccl check, the
/// training check, the fabric test): NCCL's shared-memory transport (and the P2P-off sweep)
/// needs more than a container runtime's 64 MiB default. It needs no privilege; the memory
/// counts against the pod.
pub const SHM_SIZE: &str = "4Gi";

/// Where the host's `/sys/class` is mounted in fabric agent pods (the agent reads
/// `infiniband/` under it).
pub const HOST_SYS_CLASS: &str = "/host/sys/class";

/// The host's device classes, read-only, when the validation runs the fabric test on pods the
/// administrator gave the fabric (`agent.fabric`: the host's network or RDMA devices): the
/// agent reads its InfiniBand/RoCE ports (`infiniband/<dev>/ports/<n>/`) before and after the
/// rounds. Without that opt-in there are no RDMA ports to read, and the pod stays within Pod
/// Security `restricted`, which refuses any hostPath. The parent is mounted because
/// `/sys/class/infiniband` exists only where RDMA drivers are loaded, and a hostPath that is
/// missing keeps the pod from starting.
fn infiniband_volume(gv: &GpuValidation, cfg: &OperatorConfig) -> Option<(Volume, VolumeMount)> {
    gv.spec.fabric.as_ref()?;
    if !cfg.fabric.host_network && cfg.fabric.resources.is_empty() {
        return None;
    }
    let volume = Volume {
        name: "sys-class".into(),
        host_path: Some(HostPathVolumeSource {
            path: "/sys/class".into(),
            type_: Some("Directory".into()),
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: "sys-class".into(),
        mount_path: HOST_SYS_CLASS.into(),
        read_only: Some(true),
        ..Default::default()
    };
    Some((volume, mount))
}

/// Where the kubelet serves its PodResources API (the same path in the agent container).
pub const POD_RESOURCES_DIR: &str = "/var/lib/kubelet/pod-resources";
/// The socket in [`POD_RESOURCES_DIR`].
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The kubelet's PodResources directory, read-only, when the administrator opted in
/// (`agent.podResources`): a GPU found busy then names the pods that hold it.
fn pod_resources_volume(cfg: &OperatorConfig) -> Option<(Volume, VolumeMount)> {
    if !cfg.agent_pod_resources {
        return None;
    }
    let volume = Volume {
        name: "pod-resources".into(),
        host_path: Some(HostPathVolumeSource {
            path: POD_RESOURCES_DIR.into(),
            type_: Some("Directory".into()),
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: "pod-resources".into(),
        mount_path: POD_RESOURCES_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    };
    Some((volume, mount))
}

/// The kubelet makes its PodResources socket root's alone: with the socket mounted, the agent
/// runs as uid 0, every capability still dropped and escalation still refused.
fn with_pod_resources_user(mut sc: SecurityContext, cfg: &OperatorConfig) -> SecurityContext {
    if cfg.agent_pod_resources && !cfg.agent_privileged {
        sc.run_as_user = Some(0);
        sc.run_as_non_root = Some(false);
    }
    sc
}

/// True when a step of the validation runs NCCL in the agent's pod.
fn runs_nccl(gv: &GpuValidation) -> bool {
    let checks = &gv.spec.checks;
    checks.nccl.is_some() || checks.training.is_some() || gv.spec.fabric.is_some()
}

fn shm_volume(gv: &GpuValidation) -> Option<(Volume, VolumeMount)> {
    if !runs_nccl(gv) {
        return None;
    }
    let volume = Volume {
        name: "dshm".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity(SHM_SIZE.into())),
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: "dshm".into(),
        mount_path: "/dev/shm".into(),
        ..Default::default()
    };
    Some((volume, mount))
}

/// Pinned to the node through the scheduler, so GPU capacity is accounted for and a cordoned or
/// full node keeps the pod Pending with a reason instead of failing it.
fn pinned_to(node: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.to_string()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The GPU taint toleration, gpuval's own failure taint (`gpuval.io/failed`: it keeps
/// workloads off a failed node, not the run that may prove it healthy again), then the admin's.
fn tolerations(cfg: &OperatorConfig) -> Vec<Toleration> {
    let no_schedule = |key: &str| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    };
    let mut tolerations = vec![
        no_schedule(GPU_RESOURCE),
        no_schedule(gpuval_crds::labels::FAILED_NODE),
    ];
    tolerations.extend(cfg.tolerations.iter().cloned());
    tolerations
}

/// Every GPU of the node (at least one), one CPU and 1 GiB.
fn resources(gpus: i32) -> ResourceRequirements {
    let gpu_qty = Quantity(gpus.max(1).to_string());
    ResourceRequirements {
        limits: Some(BTreeMap::from([(
            GPU_RESOURCE.to_string(),
            gpu_qty.clone(),
        )])),
        requests: Some(BTreeMap::from([
            (GPU_RESOURCE.to_string(), gpu_qty),
            ("cpu".to_string(), Quantity("1".into())),
            ("memory".to_string(), Quantity("1Gi".into())),
        ])),
        ..Default::default()
    }
}

/// The administrator's fabric device resources, for validations with `spec.fabric`.
fn with_fabric_resources(
    mut r: ResourceRequirements,
    gv: &GpuValidation,
    cfg: &OperatorConfig,
) -> ResourceRequirements {
    if gv.spec.fabric.is_none() {
        return r;
    }
    for (name, qty) in &cfg.fabric.resources {
        for map in [
            r.limits.get_or_insert_with(BTreeMap::new),
            r.requests.get_or_insert_with(BTreeMap::new),
        ] {
            map.insert(name.clone(), Quantity(qty.clone()));
        }
    }
    r
}

/// The administrator's fabric capabilities, for validations with `spec.fabric` (all others
/// stay dropped).
fn with_fabric_capabilities(
    mut sc: SecurityContext,
    gv: &GpuValidation,
    cfg: &OperatorConfig,
) -> SecurityContext {
    if gv.spec.fabric.is_some()
        && !cfg.fabric.capabilities.is_empty()
        && let Some(caps) = sc.capabilities.as_mut()
    {
        caps.add = Some(cfg.fabric.capabilities.clone());
    }
    sc
}

/// Least privilege (no capabilities, read-only root, not root, the runtime's seccomp profile:
/// what Pod Security `restricted` asks) unless the admin opted into privileged.
fn security_context(privileged: bool) -> SecurityContext {
    SecurityContext {
        privileged: Some(privileged),
        allow_privilege_escalation: Some(privileged),
        capabilities: (!privileged).then(|| Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        read_only_root_filesystem: Some(true),
        run_as_non_root: (!privileged).then_some(true),
        seccomp_profile: (!privileged).then(runtime_default_seccomp),
        ..Default::default()
    }
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    }
}

/// The agent pod's own security context: not root (unless `root`: the PodResources socket
/// asks for uid 0), the runtime's seccomp profile (Pod Security `restricted`), unless the admin
/// opted into privileged.
fn pod_security_context(privileged: bool, root: bool) -> Option<PodSecurityContext> {
    (!privileged).then(|| PodSecurityContext {
        run_as_non_root: (!root).then_some(true),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    })
}

/// The agent pod for `node` (with `gpus` allocatable GPUs, all of which it requests).
pub fn agent_pod(gv: &GpuValidation, node: &str, gpus: i32, cfg: &OperatorConfig) -> Pod {
    let name = gv.metadata.name.clone().unwrap_or_default();
    let generation = gv.metadata.generation.unwrap_or(0);
    let owner: Option<OwnerReference> = gv.controller_owner_ref(&());
    let (volumes, mounts): (Vec<Volume>, Vec<VolumeMount>) = [state_volume(), scratch_volume()]
        .into_iter()
        .chain(io_volume(cfg))
        .chain(shm_volume(gv))
        .chain(infiniband_volume(gv, cfg))
        .chain(pod_resources_volume(cfg))
        .unzip();
    let container = Container {
        name: "agent".into(),
        image: Some(cfg.agent_image.clone()),
        image_pull_policy: cfg.agent_image_pull_policy.clone(),
        args: Some(vec!["k8s".into()]),
        env: Some(container_env(gv, cfg)),
        resources: Some(with_fabric_resources(resources(gpus), gv, cfg)),
        security_context: Some(with_pod_resources_user(
            with_fabric_capabilities(security_context(cfg.agent_privileged), gv, cfg),
            cfg,
        )),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Default::default()
    };
    let mut pod = Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&name, node, generation)),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(pod_labels(&name, node, generation)),
            annotations: Some(BTreeMap::from([(
                labels::NODE.to_string(),
                node.to_string(),
            )])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            service_account_name: Some(cfg.agent_service_account.clone()),
            priority_class_name: cfg.agent_priority_class.clone(),
            termination_grace_period_seconds: Some(30),
            affinity: Some(pinned_to(node)),
            tolerations: Some(tolerations(cfg)),
            containers: vec![container],
            security_context: pod_security_context(cfg.agent_privileged, cfg.agent_pod_resources),
            volumes: (!volumes.is_empty()).then_some(volumes),
            host_network: (gv.spec.fabric.is_some() && cfg.fabric.host_network).then_some(true),
            dns_policy: (gv.spec.fabric.is_some() && cfg.fabric.host_network)
                .then(|| "ClusterFirstWithHostNet".to_string()),
            ..Default::default()
        }),
        status: None,
    };
    crate::decide::fabric_key::add_to_pod(&mut pod, gv);
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gv() -> GpuValidation {
        let mut g = GpuValidation::new("acceptance", crate::decide::selection::tests::spec());
        g.metadata.generation = Some(3);
        g.metadata.uid = Some("uid-1".into());
        g
    }

    /// The capabilities container `c` asks for.
    fn capabilities(c: &Container) -> &Capabilities {
        c.security_context
            .as_ref()
            .unwrap()
            .capabilities
            .as_ref()
            .unwrap()
    }

    /// The administrator's PriorityClass goes on every agent pod; none set, the pod names none
    /// (the cluster's default) and an invalid name is refused at start.
    #[test]
    fn agent_pods_carry_the_administrators_priority_class() {
        let cfg = OperatorConfig::default();
        let spec = agent_pod(&gv(), "gpu-a", 8, &cfg).spec.unwrap();
        assert_eq!(spec.priority_class_name, None);
        let cfg = OperatorConfig {
            agent_priority_class: Some("gpu-validation".into()),
            ..OperatorConfig::default()
        };
        let spec = agent_pod(&gv(), "gpu-a", 8, &cfg).spec.unwrap();
        assert_eq!(spec.priority_class_name.as_deref(), Some("gpu-validation"));
        assert!(cfg.validate().is_ok());
        let bad = OperatorConfig {
            agent_priority_class: Some("Not A Name".into()),
            ..OperatorConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(crate::settings::config::ConfigError::PriorityClass(_))
        ));
    }

    #[test]
    fn the_pod_is_pinned_owned_and_takes_every_gpu() {
        let cfg = OperatorConfig::default();
        let p = agent_pod(&gv(), "gpu-a", 8, &cfg);
        assert_eq!(
            p.metadata.name.as_deref(),
            Some("gpuval-acceptance-gpu-a-10-g3")
        );
        assert_eq!(p.metadata.namespace.as_deref(), Some("gpuval-system"));
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("GpuValidation", "acceptance", Some(true))
        );
        let spec = p.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let na = spec.affinity.unwrap().node_affinity.unwrap();
        let term = &na
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms[0];
        assert_eq!(
            term.match_fields.as_ref().unwrap()[0].values,
            Some(vec!["gpu-a".to_string()])
        );
        let c = &spec.containers[0];
        assert_eq!(
            c.resources.as_ref().unwrap().limits.as_ref().unwrap()[GPU_RESOURCE].0,
            "8"
        );
        let env: Vec<_> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        for want in [
            "GPUVAL_VALIDATION",
            "GPUVAL_GENERATION",
            "GPUVAL_VALIDATION_UID",
            "NODE_NAME",
            "POD_NAMESPACE",
            "POD_UID",
            "GPUVAL_STATE_DIR",
        ] {
            assert!(env.contains(&want), "{want} missing");
        }
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.privileged, Some(false));
        // Pod Security `restricted`: not root, a seccomp profile, no escalation.
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault")
        );
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        let volumes: Vec<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(
            volumes,
            ["state", "tmp"],
            "the agent's state and temporary directories; no I/O volume unless the admin configured one"
        );
        let mounts: Vec<(&str, &str)> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(mounts, [("state", STATE_MOUNT), ("tmp", SCRATCH_MOUNT)]);
        let value = |name: &str| {
            c.env
                .iter()
                .flatten()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(value("TMPDIR").as_deref(), Some(SCRATCH_MOUNT));
        assert!(
            value("CUDA_CACHE_PATH").is_some_and(|p| p.starts_with(SCRATCH_MOUNT)),
            "the driver's kernel cache is in the temporary directory"
        );
        assert_eq!(sc.read_only_root_filesystem, Some(true));
    }

    #[test]
    fn io_volume_only_from_operator_config() {
        let cfg = OperatorConfig {
            io_host_path: Some("/data/gpuval".into()),
            io_allowed_paths: vec!["/data".into()],
            ..Default::default()
        };
        let p = agent_pod(&gv(), "gpu-a", 8, &cfg);
        let volumes = p.spec.unwrap().volumes.unwrap();
        let v = volumes.iter().find(|v| v.name == "io").unwrap();
        assert_eq!(v.host_path.as_ref().unwrap().path, "/data/gpuval");
    }

    #[test]
    fn every_step_that_runs_nccl_gets_a_memory_backed_dev_shm_and_nothing_else_does() {
        let cfg = OperatorConfig::default();
        let plain = agent_pod(&gv(), "gpu-a", 8, &cfg).spec.unwrap();
        let dev_shm = |v: &Volume| v.name == "dshm";
        assert!(!plain.volumes.iter().flatten().any(dev_shm));
        let mut with_training = gv();
        with_training.spec.checks.training = Some(Default::default());
        let mut with_fabric = gv();
        with_fabric.spec.fabric = Some(Default::default());
        for (what, g) in [("training", with_training), ("fabric", with_fabric)] {
            let spec = agent_pod(&g, "gpu-a", 8, &cfg).spec.unwrap();
            assert!(spec.volumes.iter().flatten().any(dev_shm), "{what}");
        }
        let mut with_nccl = gv();
        with_nccl.spec.checks.nccl = Some(Default::default());
        let spec = agent_pod(&with_nccl, "gpu-a", 8, &cfg).spec.unwrap();
        let volumes = spec.volumes.unwrap();
        assert_eq!(
            volumes.len(),
            3,
            "the agent's state, its temporary directory and /dev/shm"
        );
        let dir = volumes
            .iter()
            .find(|v| dev_shm(v))
            .unwrap()
            .empty_dir
            .as_ref()
            .unwrap();
        assert_eq!(dir.medium.as_deref(), Some("Memory"));
        assert_eq!(dir.size_limit, Some(Quantity(SHM_SIZE.into())));
        let mounts = spec.containers[0].volume_mounts.as_ref().unwrap();
        assert!(mounts.iter().any(|m| m.mount_path == "/dev/shm"));
        let sc = spec.containers[0].security_context.as_ref().unwrap();
        assert_ne!(sc.privileged, Some(true));
    }

    #[test]
    fn the_pod_resources_socket_is_mounted_read_only_only_when_the_admin_opts_in() {
        let plain = agent_pod(&gv(), "gpu-a", 8, &OperatorConfig::default());
        let spec = plain.spec.as_ref().unwrap();
        assert!(
            !spec
                .volumes
                .iter()
                .flatten()
                .any(|v| v.name == "pod-resources")
        );
        let c = &spec.containers[0];
        assert!(
            !c.env
                .iter()
                .flatten()
                .any(|e| e.name == agent_env::POD_RESOURCES_SOCKET)
        );
        assert_eq!(
            spec.security_context.as_ref().unwrap().run_as_non_root,
            Some(true)
        );

        let cfg = OperatorConfig {
            agent_pod_resources: true,
            ..OperatorConfig::default()
        };
        let pod = agent_pod(&gv(), "gpu-a", 8, &cfg);
        let spec = pod.spec.as_ref().unwrap();
        let v = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "pod-resources")
            .expect("the kubelet's directory");
        assert_eq!(
            v.host_path.as_ref().map(|h| h.path.as_str()),
            Some(POD_RESOURCES_DIR)
        );
        let c = &spec.containers[0];
        let m = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "pod-resources")
            .expect("mounted");
        assert_eq!(m.read_only, Some(true));
        let socket = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == agent_env::POD_RESOURCES_SOCKET)
            .and_then(|e| e.value.as_deref());
        assert_eq!(socket, Some(POD_RESOURCES_SOCKET));
        // uid 0 to open the kubelet's root-only socket, and nothing more: every capability
        // dropped, no escalation, read-only root, the runtime's seccomp profile.
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!((sc.run_as_user, sc.run_as_non_root), (Some(0), Some(false)));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_string()])
        );
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, None);
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault")
        );
    }

    #[test]
    fn the_result_jitter_reaches_the_agent_only_when_set() {
        let jitter = |p: &Pod| {
            p.spec.as_ref().unwrap().containers[0]
                .env
                .iter()
                .flatten()
                .find(|e| e.name == agent_env::RESULT_JITTER_MS)
                .and_then(|e| e.value.clone())
        };
        let off = agent_pod(&gv(), "gpu-a", 8, &OperatorConfig::default());
        assert_eq!(jitter(&off), None);
        let cfg = OperatorConfig {
            agent_result_jitter: std::time::Duration::from_secs(20),
            ..Default::default()
        };
        let on = agent_pod(&gv(), "gpu-a", 8, &cfg);
        assert_eq!(jitter(&on).as_deref(), Some("20000"));
    }

    #[test]
    fn shared_gpus_reach_the_agent_only_when_the_administrator_allows_them() {
        let allowed = |p: &Pod| {
            p.spec.as_ref().unwrap().containers[0]
                .env
                .iter()
                .flatten()
                .any(|e| {
                    e.name == agent_env::ALLOW_SHARED_GPUS && e.value.as_deref() == Some("true")
                })
        };
        assert!(!allowed(&agent_pod(
            &gv(),
            "gpu-a",
            8,
            &OperatorConfig::default()
        )));
        let cfg = OperatorConfig {
            agent_allow_shared_gpus: true,
            ..Default::default()
        };
        assert!(allowed(&agent_pod(&gv(), "gpu-a", 8, &cfg)));
    }

    #[test]
    fn names_and_labels_stay_within_limits() {
        let node = "a-very-long-node-name.with.many.dns.labels.in.a.big.cluster.example.com";
        let n = pod_name("acceptance", node, 12);
        assert!(n.len() <= 63, "{n}");
        assert_eq!(n, pod_name("acceptance", node, 12));
        assert_ne!(n, pod_name("acceptance", node, 13));
        let l = labels::node_value(node);
        assert!(l.len() <= 63 && l != node);
        assert_eq!(pod_labels("v", node, 1)[labels::NODE], l);
    }

    #[test]
    fn fabric_pod_settings_apply_only_to_fabric_validations() {
        let cfg = OperatorConfig {
            fabric: crate::settings::config::FabricPods {
                host_network: true,
                resources: vec![("rdma/ib".into(), "1".into())],
                capabilities: vec!["IPC_LOCK".into()],
                port: 0,
            },
            ..Default::default()
        };
        let plain = agent_pod(&gv(), "gpu-a", 8, &cfg);
        let spec = plain.spec.as_ref().unwrap();
        assert_eq!(spec.host_network, None);
        let c = &spec.containers[0];
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert!(!limits.contains_key("rdma/ib"));
        let caps = capabilities(c);
        assert_eq!(caps.add, None);

        let mut g = gv();
        g.spec.fabric = Some(gpuval_crds::fabric::FabricSpec {
            tcp: Some(gpuval_crds::fabric::FabricTcp {
                streams: 1,
                duration: gpuval_crds::Duration::from_secs(1),
                min_gbps: None,
                max_latency_micros: None,
            }),
            ..Default::default()
        });
        let fab = agent_pod(&g, "gpu-a", 8, &cfg);
        let spec = fab.spec.as_ref().unwrap();
        assert_eq!(spec.host_network, Some(true));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
        let c = &spec.containers[0];
        let r = c.resources.as_ref().unwrap();
        for map in [r.limits.as_ref().unwrap(), r.requests.as_ref().unwrap()] {
            assert_eq!(map.get("rdma/ib"), Some(&Quantity("1".into())));
        }
        let caps = capabilities(c);
        assert_eq!(caps.add.as_deref(), Some(&["IPC_LOCK".to_string()][..]));
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        // The host's RDMA ports, read-only, for the port health before and after the rounds.
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "sys-class")
            .expect("the host's /sys/class is mounted");
        assert_eq!(mount.mount_path, HOST_SYS_CLASS);
        assert_eq!(mount.read_only, Some(true));
        let plain_mounts = plain.spec.as_ref().unwrap().containers[0]
            .volume_mounts
            .clone();
        assert!(
            !plain_mounts.iter().flatten().any(|m| m.name == "sys-class"),
            "only fabric validations see the host's device classes"
        );
        // A fabric validation on pods the administrator gave no fabric (no host network, no
        // RDMA devices) has no ports to read, and keeps Pod Security `restricted`: no hostPath.
        let unprivileged = agent_pod(&g, "gpu-a", 8, &OperatorConfig::default());
        let spec = unprivileged.spec.as_ref().unwrap();
        assert!(
            !spec.volumes.iter().flatten().any(|v| v.name == "sys-class"),
            "no hostPath without the administrator's fabric opt-in"
        );
    }

    #[test]
    fn fabric_settings_are_checked_at_start() {
        use crate::settings::config::{ConfigError, parse_resource};
        assert_eq!(
            parse_resource("rdma/ib=1").unwrap(),
            ("rdma/ib".into(), "1".into())
        );
        for bad in ["rdma/ib", "ib=1", "rdma/ib=one", "nvidia.com/gpu=1"] {
            assert!(
                matches!(parse_resource(bad), Err(ConfigError::FabricResource(_))),
                "{bad}"
            );
        }
        let cfg = OperatorConfig {
            fabric: crate::settings::config::FabricPods {
                capabilities: vec!["SYS_ADMIN".into()],
                ..Default::default()
            },
            ..Default::default()
        };
        let e = cfg.validate().unwrap_err();
        assert!(e.to_string().contains("SYS_ADMIN"), "{e}");
    }
}
