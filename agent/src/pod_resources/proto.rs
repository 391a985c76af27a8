//! The few protobuf messages of the kubelet's PodResources API (`k8s.io/kubelet/pkg/apis/
//! podresources/v1`, `api.proto`) that name which pod holds which device, decoded from the wire
//! format by hand: fields this reader does not use are skipped whatever their type, so a newer
//! kubelet's additions do not break it.
//!
//! ```text
//! ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
//! PodResources            { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
//! ContainerResources      { string name = 1; repeated ContainerDevices devices = 2; }
//! ContainerDevices        { string resource_name = 1; repeated string device_ids = 2; }
//! ```

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed PodResources message: {0}")]
pub struct DecodeError(&'static str);

/// One device a container holds, by its device plugin's resource name and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldDevice {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub resource: String,
    pub device_id: String,
}

/// One field of a message: its number and its value.
enum Value<'a> {
    Varint,
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of one message, in order.
struct Fields<'a> {
    rest: &'a [u8],
}

fn varint(buf: &mut &[u8]) -> Result<u64, DecodeError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf
            .split_first()
            .ok_or(DecodeError("a varint runs off the end"))?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(DecodeError("a varint longer than 10 bytes"))
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], DecodeError> {
    if buf.len() < n {
        return Err(DecodeError("a field runs off the end"));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let mut field = || -> Result<(u64, Value<'a>), DecodeError> {
            let key = varint(&mut self.rest)?;
            let value = match key & 7 {
                0 => varint(&mut self.rest).map(|_| Value::Varint)?,
                1 => take(&mut self.rest, 8).map(|_| Value::Fixed)?,
                2 => {
                    let n = usize::try_from(varint(&mut self.rest)?)
                        .map_err(|_| DecodeError("a length beyond memory"))?;
                    Value::Bytes(take(&mut self.rest, n)?)
                }
                5 => take(&mut self.rest, 4).map(|_| Value::Fixed)?,
                _ => return Err(DecodeError("a wire type this reader does not know")),
            };
            Ok((key >> 3, value))
        };
        let item = field();
        if item.is_err() {
            self.rest = &[];
        }
        Some(item)
    }
}

fn fields(buf: &[u8]) -> Fields<'_> {
    Fields { rest: buf }
}

fn text(bytes: &[u8]) -> Result<String, DecodeError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError("a string that is not UTF-8"))
}

/// Every device every container of every pod holds, from a `ListPodResourcesResponse`.
pub fn held_devices(response: &[u8]) -> Result<Vec<HeldDevice>, DecodeError> {
    let mut out = Vec::new();
    for field in fields(response) {
        if let (1, Value::Bytes(pod)) = field? {
            pod_devices(pod, &mut out)?;
        }
    }
    Ok(out)
}

fn pod_devices(pod: &[u8], out: &mut Vec<HeldDevice>) -> Result<(), DecodeError> {
    let (mut name, mut namespace, mut containers) = (String::new(), String::new(), Vec::new());
    for field in fields(pod) {
        match field? {
            (1, Value::Bytes(b)) => name = text(b)?,
            (2, Value::Bytes(b)) => namespace = text(b)?,
            (3, Value::Bytes(b)) => containers.push(b),
            _ => {}
        }
    }
    for c in containers {
        let mut container = String::new();
        let mut devices = Vec::new();
        for field in fields(c) {
            match field? {
                (1, Value::Bytes(b)) => container = text(b)?,
                (2, Value::Bytes(b)) => devices.push(b),
                _ => {}
            }
        }
        for d in devices {
            let mut resource = String::new();
            let mut ids = Vec::new();
            for field in fields(d) {
                match field? {
                    (1, Value::Bytes(b)) => resource = text(b)?,
                    (2, Value::Bytes(b)) => ids.push(text(b)?),
                    _ => {}
                }
            }
            out.extend(ids.into_iter().map(|device_id| HeldDevice {
                namespace: namespace.clone(),
                pod: name.clone(),
                container: container.clone(),
                resource: resource.clone(),
                device_id,
            }));
        }
    }
    Ok(())
}

/// A protobuf encoder for the same messages, for tests (a fake kubelet).
#[cfg(test)]
pub mod encode {
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// Field `n`, length-delimited.
    pub fn bytes(n: u64, body: &[u8], out: &mut Vec<u8>) {
        varint(n << 3 | 2, out);
        varint(body.len() as u64, out);
        out.extend_from_slice(body);
    }

    /// Field `n`, a varint.
    pub fn number(n: u64, v: u64, out: &mut Vec<u8>) {
        varint(n << 3, out);
        varint(v, out);
    }

    /// One pod with one container holding `devices` (resource name, ids).
    pub fn pod(
        namespace: &str,
        name: &str,
        container: &str,
        devices: &[(&str, &[&str])],
    ) -> Vec<u8> {
        let mut c = Vec::new();
        bytes(1, container.as_bytes(), &mut c);
        for (resource, ids) in devices {
            let mut d = Vec::new();
            bytes(1, resource.as_bytes(), &mut d);
            for id in *ids {
                bytes(2, id.as_bytes(), &mut d);
            }
            // topology { nodes { ID: 0 } }: a field this reader skips.
            let mut topo = Vec::new();
            let mut node = Vec::new();
            number(1, 0, &mut node);
            bytes(1, &node, &mut topo);
            bytes(3, &topo, &mut d);
            bytes(2, &d, &mut c);
        }
        number(3, 7, &mut c); // cpu_ids (unpacked here): skipped
        let mut p = Vec::new();
        bytes(1, name.as_bytes(), &mut p);
        bytes(2, namespace.as_bytes(), &mut p);
        bytes(3, &c, &mut p);
        p
    }

    /// A `ListPodResourcesResponse` of these pods.
    pub fn response(pods: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in pods {
            bytes(1, p, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_device_of_every_container_with_its_pod() {
        let msg = encode::response(&[
            encode::pod(
                "ml",
                "trainer-0",
                "main",
                &[
                    ("nvidia.com/gpu", &["GPU-aaa", "GPU-bbb::1"]),
                    ("example.com/nic", &["mlx5_0"]),
                ],
            ),
            encode::pod(
                "gpuval",
                "agent-x",
                "agent",
                &[("nvidia.com/gpu", &["GPU-ccc"])],
            ),
        ]);
        let held = held_devices(&msg).expect("decodes");
        let ids: Vec<_> = held
            .iter()
            .map(|h| {
                format!(
                    "{}/{}/{} {} {}",
                    h.namespace, h.pod, h.container, h.resource, h.device_id
                )
            })
            .collect();
        assert_eq!(
            ids,
            [
                "ml/trainer-0/main nvidia.com/gpu GPU-aaa",
                "ml/trainer-0/main nvidia.com/gpu GPU-bbb::1",
                "ml/trainer-0/main example.com/nic mlx5_0",
                "gpuval/agent-x/agent nvidia.com/gpu GPU-ccc",
            ]
        );
    }

    #[test]
    fn a_truncated_or_strange_message_is_an_error_not_a_panic() {
        let msg = encode::response(&[encode::pod(
            "ml",
            "p",
            "c",
            &[("nvidia.com/gpu", &["GPU-a"])],
        )]);
        for cut in 1..msg.len() {
            assert!(held_devices(&msg[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(
            held_devices(&[0x0b]).err(),
            Some(DecodeError("a wire type this reader does not know"))
        );
        assert_eq!(held_devices(&[]).expect("an empty list"), []);
    }
}
