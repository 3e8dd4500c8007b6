//! Outbound HTTP made by tasks themselves, under three allow lists.
//!
//! - **Lists** ([`AllowList`], `rules.rs`): origins `scheme://host[:port]`, `*.` as a
//!   whole first label only; the operator's `--egress-allow` is the ceiling, a tenant's
//!   `egress_allow` and a job's `network.allow` each narrow the one above
//!   ([`AllowList::outside`] names what a narrower list asks beyond its ceiling).
//! - **Policy** ([`EgressPolicy`], `policy.rs`): a request passes the job's, the tenant's
//!   and the operator's list, in that order, the refusal naming the first that says no;
//!   then its Host header and connection-level headers are checked. Every
//!   [`EgressRefusal`] names the method, the URL and the rule.
//! - **Addresses** (`resolver.rs`): stricter than fetches' (where an allowed origin may
//!   be anywhere), a special-purpose address ([`crate::addresses`]) is reached only when
//!   the operator lists that exact IP literal. An IP-literal URL is judged by the policy
//!   (as `url` parsed it: `0x7f.1` is 127.0.0.1), a name by the resolver at connect, so
//!   no DNS answer, first or later, leads elsewhere.
//! - **Client** ([`EgressClient`], `client.rs`, `exchange.rs`): one per executor, pooled,
//!   on its own runtime, or on the caller's with a pool per thread (`inline.rs`, what a
//!   task thread uses, [`close_abandoned`] run after a stop); no proxy from the
//!   environment, no cookies, redirects returned to the guest (each hop is a new
//!   request, judged in full); request and response bytes counted against the
//!   caller's `max_bytes`, a body cut at the cap. A task's requests in flight at once
//!   share one [`ByteBudget`] (`budget.rs`), so that they stay within its `max_bytes`
//!   together.
//!
//! Invariant: nothing leaves the host for a request `judge` refused, and no connection
//! is made to an address the resolver refused.

mod budget;
mod client;
mod exchange;
mod inline;
mod policy;
mod resolver;
mod rules;
#[cfg(test)]
mod tests;

pub use budget::ByteBudget;
pub use client::EgressClient;
pub use exchange::{EgressError, EgressRequest, EgressResponse, WireBytes};
pub use inline::close_abandoned;
pub use policy::{EgressPolicy, EgressRefusal, Layer, RequestLine};
pub use rules::AllowList;
