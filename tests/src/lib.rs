//! Test support: a real control plane per test.
//!
//! [`ControlPlane::start`] launches etcd and kube-apiserver (built by
//! `tests/scripts/build-control-plane.sh`) on 127.0.0.1 with free ports and a temporary
//! directory, waits until the API server is ready, and hands out a [`kube::Client`] and a
//! kubeconfig file. kube-controller-manager, kube-scheduler and kwok start when asked
//! ([`Options`]). Everything is torn down on drop, also when the test panics; on a panic the
//! tail of each component's log is printed.
//!
//! [`FakeKubelet`] runs gpuval agent pods as local processes (kwok runs the fake GPU nodes
//! they are scheduled to, made with [`nodes::create_gpu_node`]).
//!
//! [`real_node::RealNode`] is a real node instead: kubelet and containerd running the images
//! CI builds, for the test that proves the packaging.

mod control_plane;
mod tools;

pub use control_plane::{ControlPlane, Error, InClusterApi, Options};
pub use kubelet::{FakeKubelet, KubeletOptions, agent_binary};
pub use tools::{Tools, tools_dir};
pub mod api_faults;
pub mod audit;
pub mod auth;
pub mod bench;
pub mod binaries;
pub mod browser;
pub mod chart;
pub mod crds;
pub mod dra;
pub mod kubelet;
pub mod layers;
pub mod nodes;
pub mod operator;
pub mod pod_resources;
pub mod proxy;
pub mod real_node;
pub mod replica;
pub mod results;
pub mod runc;
pub mod scenario;
pub mod waits;
