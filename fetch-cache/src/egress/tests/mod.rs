//! Egress: the lists and the policy as pure functions (unit tests and proptests), the
//! client against real servers on loopback (axum, or raw TCP where a test must see
//! the connection itself).

mod client;
mod inline;
mod policy;
mod resolver;
mod rules;

use std::sync::Arc;

use url::Url;

use super::{AllowList, EgressPolicy};

fn url(text: &str) -> Url {
    Url::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn list<S: AsRef<str>>(entries: &[S]) -> AllowList {
    AllowList::parse(entries).unwrap_or_else(|e| panic!("{e}"))
}

fn policy(operator: &[&str], tenant: Option<&[&str]>, job: &[&str]) -> EgressPolicy {
    EgressPolicy::new(Arc::new(list(operator)), tenant.map(list), list(job))
}
