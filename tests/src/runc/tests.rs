//! The bundle of the operator's own agent pod: what the container would get under runc.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use gpuval_crds::GpuValidation;
use gpuval_operator::settings::config::OperatorConfig;
use serde_json::Value;

use super::*;

fn validation(with_nccl: bool) -> GpuValidation {
    let mut gv: GpuValidation = serde_json::from_value(serde_json::json!({
        "apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuValidation",
        "metadata": {"name": "gate", "generation": 1, "uid": "0123456789"},
        "spec": {"checks": {"memory": {}}}
    }))
    .expect("a validation");
    if with_nccl {
        gv.spec.checks.nccl = Some(Default::default());
    }
    gv
}

/// A runtime whose CDI spec gives `/dev/null` as GPU 0 and `/dev/zero` as GPU 1 (character
/// devices every host has), and `/dev/full` to every GPU container.
fn runtime() -> Runtime {
    let cdi = serde_json::from_value(serde_json::json!({
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]}},
            {"name": "1", "annotations": {"gpuval.io/driver-proc": "/proc/driver/nvidia/gpus/0000:1b:00.0"},
             "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": "/dev/zero"}]}}
        ],
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/full"}],
            "mounts": [{"hostPath": "/usr/local/nvidia", "containerPath": "/usr/local/nvidia", "options": ["ro", "bind"]}]
        }
    }))
    .expect("a CDI spec");
    Runtime {
        runc: "runc".into(),
        state: "/run/gpuval-gate".into(),
        image: Image {
            rootfs: "/images/agent/rootfs".into(),
            env: vec!["LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64".into()],
            entrypoint: vec!["/usr/local/bin/gpuval-agent".into()],
            uid: 65532,
            gid: 65532,
        },
        cdi,
    }
}

fn config(
    gv: &GpuValidation,
    gpus: i32,
    share: Option<&[String]>,
) -> (Value, tempfile::TempDir, Prepared) {
    let mut pod =
        gpuval_operator::decide::pod::agent_pod(gv, "gpu-a", gpus, &OperatorConfig::default());
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some("gpu-a".into());
    }
    let container = pod.spec.as_ref().expect("spec").containers[0].clone();
    let dir = tempfile::tempdir().expect("tmp");
    let prepared = runtime()
        .prepare(
            &pod,
            &container,
            dir.path(),
            Inputs {
                env: crate::kubelet::container_env(&pod, &container),
                secrets: &HashMap::new(),
                kubeconfig: Path::new("/etc/kubeconfig"),
                share,
            },
        )
        .expect("a bundle");
    let text = std::fs::read_to_string(dir.path().join("config.json")).expect("config.json");
    (serde_json::from_str(&text).expect("JSON"), dir, prepared)
}

fn mount<'a>(config: &'a Value, destination: &str) -> Vec<&'a Value> {
    config["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter(|m| m["destination"] == destination)
        .collect()
}

#[test]
fn the_agent_pod_runs_locked_down_from_its_image_with_a_writable_tmp() {
    let (c, dir, prepared) = config(&validation(false), 1, None);
    assert_eq!(
        c["root"]["readonly"], true,
        "the pod asks for a read-only root"
    );
    assert_eq!(c["root"]["path"], "/images/agent/rootfs");
    let process = &c["process"];
    assert_eq!(process["user"]["uid"], 65532, "the image's user");
    assert_eq!(process["noNewPrivileges"], true);
    assert_eq!(process["capabilities"]["effective"], serde_json::json!([]));
    assert_eq!(
        process["args"],
        serde_json::json!(["/usr/local/bin/gpuval-agent", "k8s"])
    );
    let env: Vec<&str> = process["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in [
        "TMPDIR=/tmp",
        "NODE_NAME=gpu-a",
        "KUBECONFIG=/var/run/gpuval-gate/kubeconfig",
    ] {
        assert!(env.contains(&want), "{want} in {env:?}");
    }
    let tmp = mount(&c, "/tmp");
    assert_eq!(tmp.len(), 1, "the pod's tmp emptyDir: {c}");
    assert!(tmp[0]["options"].to_string().contains("\"rw\""));
    let source = PathBuf::from(tmp[0]["source"].as_str().expect("source"));
    assert!(source.starts_with(dir.path()));
    let mode = std::fs::metadata(&source)
        .expect("the emptyDir")
        .permissions();
    assert_eq!(mode.mode() & 0o777, 0o777, "any user may write an emptyDir");
    let shm = mount(&c, "/dev/shm");
    assert_eq!(shm.len(), 1);
    assert!(
        shm[0]["options"].to_string().contains("size=67108864"),
        "without NCCL the runtime's 64 MiB: {}",
        shm[0]
    );
    assert_eq!(prepared.devices, ["nvidia.com/gpu=0"]);
    assert_eq!(
        device_paths(&c),
        ["/dev/nvidia0", "/dev/nvidiactl"],
        "only its GPU's node"
    );
    assert_eq!(c["linux"]["devices"][0]["major"], 1, "/dev/null is 1:3");
    assert_eq!(c["linux"]["devices"][0]["minor"], 3);
    assert_eq!(
        mount(&c, "/usr/local/nvidia").len(),
        1,
        "the driver's files"
    );
}

#[test]
fn a_validation_that_runs_nccl_gets_its_memory_backed_dev_shm_instead() {
    let (c, _dir, prepared) = config(&validation(true), 2, None);
    let shm = mount(&c, "/dev/shm");
    assert_eq!(shm.len(), 1, "one /dev/shm: {shm:?}");
    assert_eq!(shm[0]["type"], "tmpfs");
    assert!(
        shm[0]["options"]
            .to_string()
            .contains(&format!("size={}", 4u64 << 30)),
        "{}",
        shm[0]
    );
    assert_eq!(prepared.devices, ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]);
}

/// The device nodes a configuration gives the container.
fn device_paths(c: &Value) -> Vec<&str> {
    c["linux"]["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .filter_map(|d| d["path"].as_str())
        .collect()
}

#[test]
fn a_node_s_container_gets_its_share_of_the_host_s_gpus_only() {
    let share = ["1".to_string()];
    let (c, _dir, prepared) = config(&validation(false), 1, Some(&share));
    assert_eq!(prepared.devices, ["nvidia.com/gpu=1"]);
    assert_eq!(
        device_paths(&c),
        ["/dev/nvidia1", "/dev/nvidiactl"],
        "never GPU 0's node"
    );
}
