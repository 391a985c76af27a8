//! How each node's agent pod gets its GPUs (pure): the device plugin's `nvidia.com/gpu`
//! extended resource, or a Dynamic Resource Allocation claim (`resource.k8s.io/v1`) for every
//! GPU a DRA driver published for the node in its ResourceSlices. The shell lists the slices;
//! this module decides from them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};

pub use crate::settings::allocation_config::{
    Allocation, DEFAULT_DEVICE_CLASS, DEFAULT_DRIVER, Mode,
};

/// One GPU a DRA driver published for a node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DraGpu {
    pub pool: String,
    pub device: String,
    /// The device's `uuid` attribute (NVIDIA's driver sets it), when it has one.
    pub uuid: Option<String>,
}

/// The GPUs of one driver per node, from the newest generation of each pool (older slices of
/// a pool that is being republished are ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraInventory {
    nodes: BTreeMap<String, Vec<DraGpu>>,
}

/// A device attribute by its name, qualified with the driver's domain or not.
fn attribute<'a>(d: &'a Device, driver: &str, name: &str) -> Option<&'a str> {
    let attrs = d.attributes.as_ref()?;
    attrs
        .get(name)
        .or_else(|| attrs.get(&format!("{driver}/{name}")))
        .and_then(|a| a.string.as_deref())
}

/// True for a whole GPU: a device whose `type` attribute is `gpu`, or that has none (NVIDIA's
/// driver also publishes MIG devices, `type: mig`, which the agent does not claim).
fn is_gpu(d: &Device, driver: &str) -> bool {
    attribute(d, driver, "type").is_none_or(|t| t == "gpu")
}

impl DraInventory {
    /// The GPUs `driver` published, by node. Slices of other drivers, and devices not bound to
    /// one node (`allNodes`, a node selector), are left out.
    pub fn from_slices<'a>(
        driver: &str,
        slices: impl IntoIterator<Item = &'a ResourceSlice>,
    ) -> DraInventory {
        let slices: Vec<&ResourceSlice> = slices
            .into_iter()
            .filter(|s| s.spec.driver == driver)
            .collect();
        let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
        for s in &slices {
            let g = newest.entry(s.spec.pool.name.as_str()).or_insert(i64::MIN);
            *g = (*g).max(s.spec.pool.generation);
        }
        let mut nodes: BTreeMap<String, Vec<DraGpu>> = BTreeMap::new();
        for s in slices {
            if newest.get(s.spec.pool.name.as_str()) != Some(&s.spec.pool.generation) {
                continue;
            }
            for d in s.spec.devices.iter().flatten() {
                let node = d.node_name.as_ref().or(s.spec.node_name.as_ref());
                let Some(node) = node.filter(|_| is_gpu(d, driver)) else {
                    continue;
                };
                nodes.entry(node.clone()).or_default().push(DraGpu {
                    pool: s.spec.pool.name.clone(),
                    device: d.name.clone(),
                    uuid: attribute(d, driver, "uuid").map(str::to_string),
                });
            }
        }
        nodes.values_mut().for_each(|g| g.sort());
        DraInventory { nodes }
    }

    /// The GPUs published for `node` (none when it has no slice).
    pub fn gpus(&self, node: &str) -> &[DraGpu] {
        self.nodes.get(node).map(Vec::as_slice).unwrap_or_default()
    }
}

/// How one node's agent pod gets its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAllocation {
    /// `nvidia.com/gpu`, as many as the node has allocatable.
    ExtendedResource,
    /// A claim for all of the node's GPUs of the device class; these are the ones published.
    Dra(Vec<DraGpu>),
}

impl NodeAllocation {
    /// The GPUs the node offers its agent this way (0: it cannot run one).
    pub fn gpus(&self, node: &Node) -> i32 {
        match self {
            NodeAllocation::ExtendedResource => crate::decide::selection::allocatable_gpus(node),
            NodeAllocation::Dra(g) => i32::try_from(g.len()).unwrap_or(i32::MAX),
        }
    }
}

/// How `node` gets its GPUs under `allocation`, from the slices in `inventory`.
pub fn decide(allocation: &Allocation, node: &str, inventory: &DraInventory) -> NodeAllocation {
    let published = inventory.gpus(node);
    match allocation.mode {
        Mode::ExtendedResource => NodeAllocation::ExtendedResource,
        Mode::Auto if published.is_empty() => NodeAllocation::ExtendedResource,
        Mode::Auto | Mode::Dra => NodeAllocation::Dra(published.to_vec()),
    }
}

/// Why a node with no GPU to offer is not selected, in words.
pub fn no_gpus_reason(allocation: &Allocation) -> String {
    match allocation.mode {
        Mode::ExtendedResource => format!("no allocatable {}", gpuval_crds::GPU_RESOURCE),
        Mode::Dra => format!("no GPU in ResourceSlices of driver {}", allocation.driver),
        Mode::Auto => format!(
            "no allocatable {} and no GPU in ResourceSlices of driver {}",
            gpuval_crds::GPU_RESOURCE,
            allocation.driver
        ),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourcePool, ResourceSliceSpec};

    use super::*;

    /// A device named `name`, with `uuid` and `type` attributes when given.
    pub fn device(name: &str, uuid: Option<&str>, ty: Option<&str>) -> Device {
        let text = |v: &str| DeviceAttribute {
            string: Some(v.into()),
            ..Default::default()
        };
        let mut attrs = BTreeMap::new();
        if let Some(u) = uuid {
            attrs.insert("uuid".to_string(), text(u));
        }
        if let Some(t) = ty {
            attrs.insert("type".to_string(), text(t));
        }
        Device {
            name: name.into(),
            attributes: Some(attrs),
            ..Default::default()
        }
    }

    /// A slice of `driver` for `node`, pool `pool` at `generation`.
    pub fn slice(
        driver: &str,
        node: &str,
        pool: &str,
        generation: i64,
        devices: Vec<Device>,
    ) -> ResourceSlice {
        ResourceSlice {
            metadata: Default::default(),
            spec: ResourceSliceSpec {
                driver: driver.into(),
                node_name: Some(node.into()),
                pool: ResourcePool {
                    name: pool.into(),
                    generation,
                    resource_slice_count: 1,
                },
                devices: Some(devices),
                ..Default::default()
            },
        }
    }

    fn gpus(inv: &DraInventory, node: &str) -> Vec<(String, Option<String>)> {
        inv.gpus(node)
            .iter()
            .map(|g| (g.device.clone(), g.uuid.clone()))
            .collect()
    }

    #[test]
    fn the_inventory_keeps_the_drivers_whole_gpus_of_the_newest_pool_generation() {
        let slices = [
            slice(
                DEFAULT_DRIVER,
                "a",
                "a",
                2,
                vec![
                    device("gpu-1", Some("GPU-1"), Some("gpu")),
                    device("gpu-0", Some("GPU-0"), Some("gpu")),
                    device("gpu-0-mig-1g", Some("MIG-0"), Some("mig")),
                ],
            ),
            // An older generation of the same pool, still listed while it is replaced.
            slice(
                DEFAULT_DRIVER,
                "a",
                "a",
                1,
                vec![device("gpu-9", Some("GPU-9"), None)],
            ),
            slice(
                "other.example.com",
                "b",
                "b",
                1,
                vec![device("nic-0", None, None)],
            ),
        ];
        let inv = DraInventory::from_slices(DEFAULT_DRIVER, &slices);
        assert_eq!(
            gpus(&inv, "a"),
            [
                ("gpu-0".to_string(), Some("GPU-0".to_string())),
                ("gpu-1".to_string(), Some("GPU-1".to_string()))
            ]
        );
        assert!(inv.gpus("b").is_empty(), "another driver's devices");
    }

    #[test]
    fn a_qualified_uuid_attribute_is_read_too() {
        let mut d = device("gpu-0", None, None);
        d.attributes.as_mut().unwrap().insert(
            format!("{DEFAULT_DRIVER}/uuid"),
            DeviceAttribute {
                string: Some("GPU-Q".into()),
                ..Default::default()
            },
        );
        let inv = DraInventory::from_slices(
            DEFAULT_DRIVER,
            &[slice(DEFAULT_DRIVER, "a", "a", 1, vec![d])],
        );
        assert_eq!(inv.gpus("a")[0].uuid.as_deref(), Some("GPU-Q"));
    }

    #[test]
    fn auto_takes_dra_where_slices_list_gpus_and_the_extended_resource_elsewhere() {
        let inv = DraInventory::from_slices(
            DEFAULT_DRIVER,
            &[slice(
                DEFAULT_DRIVER,
                "dra-node",
                "dra-node",
                1,
                vec![device("gpu-0", Some("GPU-0"), Some("gpu"))],
            )],
        );
        let mut a = Allocation::default();
        assert!(matches!(
            decide(&a, "dra-node", &inv),
            NodeAllocation::Dra(g) if g.len() == 1
        ));
        assert_eq!(
            decide(&a, "plain-node", &inv),
            NodeAllocation::ExtendedResource
        );
        a.mode = Mode::ExtendedResource;
        assert_eq!(
            decide(&a, "dra-node", &inv),
            NodeAllocation::ExtendedResource
        );
        a.mode = Mode::Dra;
        assert_eq!(
            decide(&a, "plain-node", &inv),
            NodeAllocation::Dra(Vec::new())
        );
        assert!(!a.reads_slices() || a.mode == Mode::Dra);
    }

    #[test]
    fn modes_parse_their_flag_spelling_and_name_the_choices_otherwise() {
        for m in [Mode::Auto, Mode::ExtendedResource, Mode::Dra] {
            assert_eq!(Mode::parse(m.as_str()), Ok(m));
        }
        let err = Mode::parse("device-plugin").unwrap_err();
        assert!(err.contains("auto, extendedResource or dra"), "{err}");
    }
}
