//! Every pure decision of the operator: the world and the time are parameters, nothing is
//! read or written here. A validation's next step ([`reconcile`]) and what it rests on (the
//! nodes it selects, the agent pod, a pod's reading, the expected GPU count, the fabric key,
//! the DRA claim), a node's record and marks ([`failure_record`], [`node_evidence`],
//! [`node_marks`]), the certificates, a schedule's and an admission's plan, the busy pods of
//! `idleOnly`, and the leader election's rules.

pub mod admission;
pub mod busy;
pub mod certificates;
pub mod claims;
pub mod expected;
pub mod fabric_key;
pub mod failure_record;
pub mod leader;
pub mod node_evidence;
pub mod node_marks;
pub mod node_state;
pub mod pod;
pub mod pod_reading;
pub mod reconcile;
pub mod schedule;
pub mod selection;
