//! The resolver's check, on answers a test scripts: rebinding is a second answer.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use reqwest::dns::{Name, Resolve};

use crate::AddressClass;
use crate::egress::resolver::{ForbiddenAnswer, GuardedResolver, Lookup};

/// Answers from a script, one list per lookup (the last repeated), and the name of the
/// thread each lookup ran on.
pub(super) struct Scripted {
    answers: Vec<Vec<IpAddr>>,
    asked: AtomicUsize,
    pub(super) threads: Mutex<Vec<String>>,
}

impl Scripted {
    pub(super) fn new(answers: Vec<Vec<IpAddr>>) -> Arc<Scripted> {
        Arc::new(Scripted {
            answers,
            asked: AtomicUsize::new(0),
            threads: Mutex::new(Vec::new()),
        })
    }
}

impl Lookup for Scripted {
    fn lookup(&self, _host: &str) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
        let n = self.asked.fetch_add(1, Ordering::SeqCst);
        let answer = self.answers[n.min(self.answers.len() - 1)].clone();
        let thread = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned();
        self.threads.lock().unwrap().push(thread);
        Box::pin(async move { Ok(answer) })
    }
}

const PUBLIC: IpAddr = IpAddr::V4(Ipv4Addr::new(93, 184, 216, 34));
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

#[tokio::test]
async fn a_name_that_rebinds_to_loopback_is_refused_at_the_next_connect() {
    let lookup = Scripted::new(vec![vec![PUBLIC], vec![LOOPBACK]]);
    let resolver = GuardedResolver::new(lookup, Arc::from(Vec::new()));
    let first = resolver
        .resolve(Name::from_str("rebind.test").unwrap())
        .await;
    let addrs: Vec<_> = first.unwrap().collect();
    assert_eq!(addrs, vec![std::net::SocketAddr::new(PUBLIC, 0)]);
    let second = match resolver
        .resolve(Name::from_str("rebind.test").unwrap())
        .await
    {
        Ok(addrs) => panic!("rebound to {:?}", addrs.collect::<Vec<_>>()),
        Err(e) => e,
    };
    let answer = second
        .downcast_ref::<ForbiddenAnswer>()
        .expect("the refusal itself, for the client to find");
    assert_eq!(
        (answer.host.as_str(), answer.addr, answer.class),
        ("rebind.test", LOOPBACK, AddressClass::Loopback)
    );
}

#[test]
fn one_forbidden_address_refuses_the_whole_answer_unless_the_operator_listed_it() {
    let lookup = Scripted::new(vec![vec![]]);
    let metadata: IpAddr = "169.254.169.254".parse().unwrap();
    let strict = GuardedResolver::new(lookup.clone(), Arc::from(Vec::new()));
    let err = strict.check("two.test", &[PUBLIC, metadata]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "two.test resolves to 169.254.169.254, a link-local address (169.254.0.0/16) the operator did not list"
    );
    assert!(strict.check("one.test", &[PUBLIC]).is_ok());
    let listed = GuardedResolver::new(lookup, Arc::from(vec![metadata]));
    assert!(listed.check("two.test", &[PUBLIC, metadata]).is_ok());
    // The mapped form of a listed address is another address.
    let mapped = IpAddr::V6(Ipv4Addr::new(169, 254, 169, 254).to_ipv6_mapped());
    assert!(listed.check("mapped.test", &[mapped]).is_err());
}

#[tokio::test]
async fn an_empty_answer_is_an_error_not_an_empty_list() {
    let resolver = GuardedResolver::new(Scripted::new(vec![vec![]]), Arc::from(Vec::new()));
    let err = resolver.resolve_checked("none.test").await.unwrap_err();
    assert!(
        err.to_string().contains("none.test has no addresses"),
        "{err}"
    );
}
