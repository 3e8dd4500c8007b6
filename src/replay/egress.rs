//! The network a replay runs with: the attempt's recorded responses, served in the order
//! its guest asks for them, and never the network. The tape is fetched and checked (its
//! digest, then every record against its pin) before the guest runs; a guest that asks
//! for anything else than the attempt did there is stopped, and the replay says where.

use anyhow::Context;
use flint_executor::sandbox::{Divergence, Egress, Replayer};
use flint_protocol::api::{ReplayBundle, ReplayEgress};
use flint_protocol::{EgressPin, NetworkGrant};

use crate::client::Client;

/// The replay's egress, and what tells afterwards whether its guest left the record.
pub(super) async fn egress(
    client: &Client,
    bundle: &ReplayBundle,
) -> anyhow::Result<(Egress, Divergence)> {
    let Some(network) = &bundle.network else {
        // No grant: every request is refused, as the attempt's were.
        return Ok((Egress::default(), Divergence::default()));
    };
    let pins = (bundle.egress.iter())
        .enumerate()
        .map(|(at, recorded)| {
            pin(recorded).with_context(|| format!("the bundle's request {}", at + 1))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let tape = match &bundle.egress_tape {
        Some(source) => Some(super::fetch(client, "the recorded responses", source).await?),
        None => None,
    };
    let grant = NetworkGrant {
        allow: network.allow.clone(),
        tenant_allow: network.tenant_allow.clone(),
        max_requests: network.max_requests,
        max_bytes: network.max_bytes,
        max_concurrent: network.max_concurrent,
    };
    let replayer = Replayer::new(&grant, pins, tape.as_deref())
        .context("replaying the attempt's outbound requests")?;
    let divergence = replayer.divergence();
    Ok((Egress::Replay(replayer), divergence))
}

fn pin(recorded: &ReplayEgress) -> anyhow::Result<EgressPin> {
    let digest = |text: &str, what: &str| {
        (text.parse()).map_err(|e| anyhow::anyhow!("its {what} {text:?} is not a sha256: {e}"))
    };
    Ok(EgressPin {
        method: recorded.method.clone(),
        url: recorded.url.clone(),
        request_sha256: digest(&recorded.request_sha256, "request_sha256")?,
        status: recorded.status,
        response: digest(&recorded.response_sha256, "response_sha256")?,
        offset: recorded.offset,
        len: recorded.len,
    })
}
