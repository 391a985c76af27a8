//! The data connections of a TCP measurement, after its group's `go`: the member opens them to
//! the host's rendezvous listener, and each proves the validation's key as a hello does. The
//! host greets every connection on it with a fresh [`Challenge`]; the member answers with a
//! [`Greeting::Data`] tag (its node, round, group and stream number) carrying a MAC of the
//! challenge and the tag ([`Auth::data_mac`]); the host answers `go` and only then does the
//! member send data. A connection without the key, with another key, of another pair or
//! round, or that says nothing by its greeting deadline is refused (and logged) without
//! holding up the member's streams, within the same bounds as the rendezvous
//! ([`greeting`](super::greeting)).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use super::Assignment;
use super::greeting::{self, Limits};
use super::member_key::{Auth, DataId};
use super::rendezvous::{
    Answer, Challenge, Control, Greeting, NetError, challenged, connect_until,
};

/// The member's `streams` data connections to the host, each proven and answered `go`.
pub fn open(
    a: &Assignment,
    auth: &Auth,
    streams: usize,
    limits: &Limits,
) -> Result<Vec<TcpStream>, NetError> {
    (0..streams)
        .map(|stream| open_one(a, auth, stream, limits))
        .collect()
}

fn open_one(
    a: &Assignment,
    auth: &Auth,
    stream: usize,
    limits: &Limits,
) -> Result<TcpStream, NetError> {
    let what = "open a TCP data stream to";
    let addr = &a.rendezvous;
    let by = limits.greet_by(Instant::now(), a.deadline);
    let mut ctl = Control::new(connect_until(addr, what, by)?, addr.clone())?;
    let Challenge { challenge } = ctl.recv(by)?;
    let node = &a.nodes[a.rank];
    let id = DataId {
        node,
        round: a.round,
        group: a.group,
        stream,
    };
    let tag = Greeting::Data {
        node: node.clone(),
        round: a.round,
        group: a.group,
        stream,
        mac: auth.data_mac(&challenge, id),
    };
    ctl.send(&tag, by)?;
    let refused = |why: String| NetError::Protocol {
        what: what.into(),
        addr: addr.clone(),
        why: format!("the host refused data stream {stream}: {why}"),
    };
    match ctl.recv::<Answer>(by)? {
        Answer::Go => raw(ctl),
        Answer::Reject { why } | Answer::OtherRound { why } => Err(refused(why)),
        Answer::Abort { missing } => Err(refused(format!("{} missing", missing.join(", ")))),
    }
}

/// The connection under `ctl`, for raw data: nothing may wait in its reader (the other side
/// sends data only after `go`).
fn raw(ctl: Control) -> Result<TcpStream, NetError> {
    let peer = ctl.peer.clone();
    let (reader, writer) = ctl.into_parts();
    if !reader.buffer().is_empty() {
        return Err(NetError::Protocol {
            what: "start a TCP data stream with".into(),
            addr: peer,
            why: "data arrived before its go".into(),
        });
    }
    Ok(writer)
}

/// The host's side: the `streams` data connections of the pair's member (`a.nodes[1]`), each
/// proven with the key, by the greeting and stall limits (all by `a.deadline`); every other
/// connection is refused.
pub fn accept(
    listener: &TcpListener,
    a: &Assignment,
    auth: &Auth,
    streams: usize,
    limits: &Limits,
) -> Result<Vec<TcpStream>, NetError> {
    let member = a.nodes.get(1).cloned().unwrap_or_default();
    let by = (Instant::now() + limits.greet + limits.stall).min(a.deadline);
    let greet = {
        let (a, auth, member) = (a.clone(), auth.clone(), member.clone());
        Arc::new(move |s: TcpStream, peer: SocketAddr, by: Instant| {
            greet_stream(s, peer, by, (&a, &auth), (&member, streams))
        })
    };
    let got = greeting::gather(listener, (0, streams), by, limits, greet).map_err(|why| {
        NetError::Io {
            what: "accept TCP data streams from".into(),
            addr: member.clone(),
            why,
        }
    })?;
    let arrived = got.iter().flatten().count();
    if arrived < streams {
        return Err(NetError::Timeout {
            what: format!("accept {streams} TCP data streams (got {arrived}) from"),
            addr: member,
        });
    }
    Ok(got.into_iter().flatten().collect())
}

/// One connection to the host's listener during the measurement, on a thread of its own: its
/// stream number and connection once its tag proves the key and names this pair's member,
/// round and group and a stream it has; otherwise None (logged, and the refusal sent back).
fn greet_stream(
    stream: TcpStream,
    addr: SocketAddr,
    by: Instant,
    (a, auth): (&Assignment, &Auth),
    (member, streams): (&str, usize),
) -> Option<(usize, TcpStream)> {
    let mut ctl = Control::new(stream, addr.to_string()).ok()?;
    let (challenge, greeting) = challenged(&mut ctl, addr, by)?;
    let (number, refused) = match &greeting {
        Greeting::Data {
            node,
            round,
            group,
            stream,
            mac,
        } => {
            let id = DataId {
                node,
                round: *round,
                group: *group,
                stream: *stream,
            };
            // The key first: a stranger learns nothing about the pair.
            let refused = auth
                .verify_data(&challenge, id, mac.as_deref())
                .err()
                .map(|why| Answer::Reject { why })
                .or_else(|| check_stream(a, id, member, streams));
            (*stream, refused)
        }
        Greeting::Hello { .. } => {
            let why = format!(
                "the rendezvous of round {} group {} is over: its TCP measurement runs",
                a.round, a.group
            );
            (0, Some(Answer::OtherRound { why }))
        }
    };
    if let Some(answer) = refused {
        tracing::warn!(peer = %addr, ?answer, "TCP test: connection refused");
        let _ = ctl.send(&answer, by);
        return None;
    }
    if let Err(e) = ctl.send(&Answer::Go, by) {
        tracing::warn!(peer = %addr, error = %e, "TCP test: data stream lost before its go");
        return None;
    }
    match raw(ctl) {
        Ok(s) => Some((number, s)),
        Err(e) => {
            tracing::warn!(peer = %addr, error = %e, "TCP test: data stream refused");
            None
        }
    }
}

/// Why a data stream that proved the key is not one of this pair's.
fn check_stream(a: &Assignment, id: DataId<'_>, member: &str, streams: usize) -> Option<Answer> {
    if id.round != a.round || id.group != a.group {
        let why = format!(
            "this is round {} group {}'s TCP measurement, not round {} group {}'s",
            a.round, a.group, id.round, id.group
        );
        return Some(Answer::OtherRound { why });
    }
    if id.node != member {
        let why = format!("{} is not the member of this pair ({member} is)", id.node);
        return Some(Answer::Reject { why });
    }
    if id.stream >= streams {
        let why = format!("stream {} of {streams}", id.stream);
        return Some(Answer::Reject { why });
    }
    None
}
