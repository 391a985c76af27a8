//! How a rendezvous host knows that a member belongs to the validation: the operator gives each
//! validation that runs the fabric a Secret of random key bytes, mounted (read-only) into that
//! validation's agent pods alone. The host opens every connection with a fresh random
//! challenge; the member answers with a hello that carries an HMAC-SHA256, under the key, of the
//! challenge and the hello's node, rank, round and group. Without the key no MAC can be made,
//! and a MAC seen on one connection is worthless on the next (its challenge is another). The
//! data connections of a TCP measurement prove the key the same way: each gets its own
//! challenge, and its tag carries a MAC of it and the tag's node, round, group and stream
//! number, under a context of its own, so that a hello's MAC never passes for a data stream's
//! nor the other way round.
//!
//! Where no key is given (an agent run outside Kubernetes by a launcher, a test), the rendezvous
//! is [`Auth::Open`]: anyone who reaches the port may join, and the host says so in its log.

use std::path::Path;

use gpuval_crds::seal::{hex, unhex};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The shortest key accepted, in bytes (the operator's keys have [`KEY_BYTES`]).
pub const MIN_KEY_BYTES: usize = 16;
/// The length of the operator's keys, in bytes.
pub const KEY_BYTES: usize = 32;
/// The length of a host's challenge, in random bytes (sent as hex).
const CHALLENGE_BYTES: usize = 32;
/// What a hello's MAC covers begins with this, so that it cannot stand for anything else.
const CONTEXT: &[u8] = b"gpuval rendezvous hello v1";
/// What a data stream's MAC covers begins with this.
const DATA_CONTEXT: &[u8] = b"gpuval tcp data stream v1";

/// Whether members must prove they hold the validation's key.
#[derive(Clone)]
pub enum Auth {
    /// Members prove that they hold this key.
    Key(hmac::Key),
    /// No key: anyone who reaches the rendezvous may join; `why` says why there is none.
    Open { why: String },
}

impl std::fmt::Debug for Auth {
    // Never the key itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Key(_) => f.write_str("Auth::Key(..)"),
            Auth::Open { why } => f.debug_struct("Auth::Open").field("why", why).finish(),
        }
    }
}

/// A key that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "read the fabric rendezvous key {path}: {why} (the operator mounts the validation's key \
         Secret there; without it this agent cannot prove it belongs to the validation)"
    )]
    Read { path: String, why: String },
    #[error(
        "no fabric rendezvous key: {} is not set, so this agent cannot prove it belongs to the \
         validation and takes no part in the fabric (the operator mounts the validation's key \
         into its fabric agent pods; a pod made otherwise has none)",
        gpuval_crds::agent_env::FABRIC_KEY_FILE
    )]
    NotGiven,
    #[error(
        "the fabric rendezvous key {path} has {len} bytes, fewer than {MIN_KEY_BYTES}: the \
         Secret was changed by hand or damaged; delete the validation's key Secret and run the \
         validation again"
    )]
    Short { path: String, len: usize },
}

/// The parts of a hello that its MAC covers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HelloId<'a> {
    pub node: &'a str,
    pub rank: usize,
    pub round: i32,
    pub group: i32,
}

/// The parts of a TCP measurement's data stream tag that its MAC covers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DataId<'a> {
    pub node: &'a str,
    pub round: i32,
    pub group: i32,
    pub stream: usize,
}

impl Auth {
    /// Members must hold `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        Auth::Key(hmac::Key::new(hmac::HMAC_SHA256, bytes))
    }

    /// The key in the file at `path` (the mounted Secret's key).
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| KeyError::Read {
            path: shown.clone(),
            why: e.to_string(),
        })?;
        if bytes.len() < MIN_KEY_BYTES {
            return Err(KeyError::Short {
                path: shown,
                len: bytes.len(),
            });
        }
        Ok(Self::from_bytes(&bytes))
    }

    /// No key, for the reason `why`.
    pub fn open(why: impl Into<String>) -> Self {
        Auth::Open { why: why.into() }
    }

    /// The MAC a member sends with its hello in answer to `challenge` (None without a key).
    pub fn mac(&self, challenge: &str, hello: HelloId<'_>) -> Option<String> {
        self.sign(&message(challenge, hello))
    }

    /// The MAC a member's data stream tag carries in answer to `challenge` (None without a key).
    pub fn data_mac(&self, challenge: &str, stream: DataId<'_>) -> Option<String> {
        self.sign(&data_message(challenge, stream))
    }

    fn sign(&self, message: &[u8]) -> Option<String> {
        match self {
            Auth::Key(key) => Some(hex(hmac::sign(key, message).as_ref())),
            Auth::Open { .. } => None,
        }
    }

    /// Whether `mac` proves that the member who sent data stream tag `stream` in answer to
    /// `challenge` holds the key; the reason when it does not. Without a key every tag passes.
    pub fn verify_data(
        &self,
        challenge: &str,
        stream: DataId<'_>,
        mac: Option<&str>,
    ) -> Result<(), String> {
        self.check(&data_message(challenge, stream), mac, "data stream")
    }

    /// Whether `mac` proves that the member who sent `hello` in answer to `challenge` holds the
    /// key; the reason when it does not. Without a key every hello passes.
    pub fn verify(
        &self,
        challenge: &str,
        hello: HelloId<'_>,
        mac: Option<&str>,
    ) -> Result<(), String> {
        self.check(&message(challenge, hello), mac, "hello")
    }

    /// Whether `mac` is this key's MAC of `message`; the reason, naming the `what` that
    /// carried it, when it is not.
    fn check(&self, message: &[u8], mac: Option<&str>, what: &str) -> Result<(), String> {
        let Auth::Key(key) = self else {
            return Ok(());
        };
        let Some(mac) = mac else {
            return Err(format!(
                "the {what} carries no MAC: the member has no rendezvous key, so it is not an \
                 agent of this validation (or runs without the key Secret mounted)"
            ));
        };
        let tag = unhex(mac).ok_or_else(|| format!("the {what}'s MAC is not hex"))?;
        hmac::verify(key, message, &tag).map_err(|_| {
            format!(
                "the {what}'s MAC is wrong: the member holds another key (another validation's \
                 agent, or a stranger) or answered another challenge"
            )
        })
    }
}

/// The key as the agent's environment names it: the file `key_file` (the value of
/// [`FABRIC_KEY_FILE`](gpuval_crds::agent_env::FABRIC_KEY_FILE)). Where none is named: in
/// Kubernetes an error (the operator mounts a key into every fabric agent pod), elsewhere an
/// open rendezvous.
pub fn from_env(key_file: Option<&Path>, in_kubernetes: bool) -> Result<Auth, KeyError> {
    match key_file.filter(|p| !p.as_os_str().is_empty()) {
        Some(path) => Auth::load(path),
        None if in_kubernetes => Err(KeyError::NotGiven),
        None => Ok(Auth::open(format!(
            "{} is not set: a launch outside Kubernetes without a shared key file",
            gpuval_crds::agent_env::FABRIC_KEY_FILE
        ))),
    }
}

/// A fresh random challenge (hex).
pub fn challenge() -> Result<String, String> {
    let mut bytes = [0u8; CHALLENGE_BYTES];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "the system's random number generator failed".to_string())?;
    Ok(hex(&bytes))
}

/// What a hello's MAC covers: the context, then each part with its length, so that no two
/// hellos read alike.
fn message(challenge: &str, hello: HelloId<'_>) -> Vec<u8> {
    let rank = hello.rank.to_string();
    let round = hello.round.to_string();
    let group = hello.group.to_string();
    framed(CONTEXT, &[challenge, hello.node, &rank, &round, &group])
}

/// What a data stream's MAC covers, framed as a hello's under its own context.
fn data_message(challenge: &str, stream: DataId<'_>) -> Vec<u8> {
    let round = stream.round.to_string();
    let group = stream.group.to_string();
    let number = stream.stream.to_string();
    framed(
        DATA_CONTEXT,
        &[challenge, stream.node, &round, &group, &number],
    )
}

/// `context`, then each part with its length before it.
fn framed(context: &[u8], parts: &[&str]) -> Vec<u8> {
    let mut m = context.to_vec();
    for part in parts {
        m.extend_from_slice(format!("\n{}:", part.len()).as_bytes());
        m.extend_from_slice(part.as_bytes());
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: HelloId<'static> = HelloId {
        node: "gpu-b",
        rank: 1,
        round: 3,
        group: 2,
    };

    #[test]
    fn a_mac_holds_for_its_challenge_and_hello_only() {
        let auth = Auth::from_bytes(&[7; KEY_BYTES]);
        let c = challenge().expect("random");
        let mac = auth.mac(&c, ID).expect("a keyed member signs");
        assert_eq!(auth.verify(&c, ID, Some(&mac)), Ok(()));
        let other = challenge().expect("random");
        assert_ne!(c, other, "every challenge is fresh");
        assert!(auth.verify(&other, ID, Some(&mac)).is_err(), "replayed");
        for changed in [
            HelloId {
                node: "gpu-c",
                ..ID
            },
            HelloId { rank: 2, ..ID },
            HelloId { round: 4, ..ID },
            HelloId { group: 1, ..ID },
        ] {
            assert!(auth.verify(&c, changed, Some(&mac)).is_err(), "{changed:?}");
        }
        let stranger = Auth::from_bytes(&[8; KEY_BYTES]);
        let forged = stranger.mac(&c, ID).expect("signs");
        let why = auth.verify(&c, ID, Some(&forged)).expect_err("another key");
        assert!(why.contains("wrong"), "{why}");
        let why = auth.verify(&c, ID, None).expect_err("no MAC");
        assert!(why.contains("no MAC"), "{why}");
        assert!(auth.verify(&c, ID, Some("zz")).is_err());
    }

    #[test]
    fn a_data_stream_s_mac_holds_for_its_challenge_and_tag_only_and_never_as_a_hello() {
        let auth = Auth::from_bytes(&[7; KEY_BYTES]);
        let data = DataId {
            node: "gpu-b",
            round: 3,
            group: 2,
            stream: 1,
        };
        let c = challenge().expect("random");
        let mac = auth.data_mac(&c, data).expect("a keyed member signs");
        assert_eq!(auth.verify_data(&c, data, Some(&mac)), Ok(()));
        for changed in [
            DataId {
                node: "gpu-c",
                ..data
            },
            DataId { round: 4, ..data },
            DataId { group: 1, ..data },
            DataId { stream: 0, ..data },
        ] {
            assert!(
                auth.verify_data(&c, changed, Some(&mac)).is_err(),
                "{changed:?}"
            );
        }
        let other = challenge().expect("random");
        assert!(
            auth.verify_data(&other, data, Some(&mac)).is_err(),
            "replayed"
        );
        // Same numbers, other context: a hello's MAC is no data stream's, nor the reverse.
        let hello = HelloId {
            node: "gpu-b",
            rank: 3,
            round: 2,
            group: 1,
        };
        let hello_mac = auth.mac(&c, hello).expect("signs");
        assert!(auth.verify_data(&c, data, Some(&hello_mac)).is_err());
        assert!(auth.verify(&c, hello, Some(&mac)).is_err());
        let stranger = Auth::from_bytes(&[8; KEY_BYTES]);
        let forged = stranger.data_mac(&c, data).expect("signs");
        let why = auth
            .verify_data(&c, data, Some(&forged))
            .expect_err("another key");
        assert!(why.contains("data stream's MAC is wrong"), "{why}");
        let why = auth.verify_data(&c, data, None).expect_err("no MAC");
        assert!(why.contains("data stream carries no MAC"), "{why}");
        assert_eq!(Auth::open("x").verify_data(&c, data, None), Ok(()));
    }

    #[test]
    fn an_open_rendezvous_signs_nothing_and_lets_every_hello_in() {
        let open = Auth::open("outside Kubernetes");
        assert_eq!(open.mac("c", ID), None);
        assert_eq!(open.verify("c", ID, None), Ok(()));
        assert!(!format!("{open:?}").is_empty());
        assert_eq!(
            format!("{:?}", Auth::from_bytes(b"secret-key-bytes")),
            "Auth::Key(..)"
        );
    }

    #[test]
    fn a_key_file_is_read_and_a_missing_or_short_one_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key");
        let e = Auth::load(&path).expect_err("missing");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        std::fs::write(&path, [1u8; 8]).expect("write");
        assert_eq!(
            Auth::load(&path).expect_err("short"),
            KeyError::Short {
                path: path.display().to_string(),
                len: 8
            }
        );
        std::fs::write(&path, [1u8; KEY_BYTES]).expect("write");
        let loaded = Auth::load(&path).expect("a full key");
        let same = Auth::from_bytes(&[1u8; KEY_BYTES]);
        assert_eq!(loaded.mac("c", ID), same.mac("c", ID));
        let named = from_env(Some(&path), true).expect("the named file");
        assert_eq!(named.mac("c", ID), same.mac("c", ID));
    }

    #[test]
    fn a_pod_without_a_key_refuses_and_a_launch_outside_kubernetes_runs_open() {
        assert_eq!(
            from_env(None, true).expect_err("no key in a pod"),
            KeyError::NotGiven
        );
        assert!(
            KeyError::NotGiven
                .to_string()
                .contains("GPUVAL_FABRIC_KEY_FILE")
        );
        let open = from_env(Some(Path::new("")), false).expect("open outside Kubernetes");
        assert!(matches!(open, Auth::Open { .. }), "{open:?}");
    }
}
