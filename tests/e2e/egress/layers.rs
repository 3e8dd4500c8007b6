//! The three layers of the egress policy: at submit (a job beyond its tenant's
//! `egress_allow` or the operator's `--egress-allow`, or asking for more than its
//! tenant's maxima, is refused) and per request in the executor (each redirect hop, the
//! address a name resolves to, the Host header).

use serde_json::{Value, json};

use super::{cluster, counted, job, names, response_line, succeeded, used};
use crate::common::{Api, DevCluster, Origin, Reply, free_port, guests, sha256_hex};

const TOKEN: &str = "token-of-t";

/// Checks a refusal: `status`, the error's `kind`, and its message naming `words`.
fn refused((status, body): (u16, Value), want: (u16, &str), words: &[&str]) {
    assert_eq!(status, want.0, "{body}");
    assert_eq!(body["error"]["kind"], want.1, "{body}");
    names(body["error"]["message"].as_str().unwrap(), words);
}

#[test]
fn a_job_beyond_its_tenants_or_the_operators_list_or_maxima_is_refused_at_submit() {
    let allowed = Origin::start(&[("/x", Reply::Body(b"for t".to_vec()))]);
    // The operator allows it too, the tenant does not.
    let operator_only = Origin::start(&[]);
    let nobodys = format!("http://127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    // A tenants file holds the SHA-256 of each token, as `flint hash-token` prints it.
    let tenants = format!(
        "[[tenant]]\nname = \"t\"\ntokens = [\"sha256:{}\"]\negress_allow = [\"{}\"]\n\
         [tenant.limits]\nmax_egress_requests = 5\nmax_egress_bytes = 100000\n\
         max_egress_concurrent = 2\n",
        sha256_hex(TOKEN.as_bytes()),
        allowed.origin
    );
    std::fs::write(&file, tenants).unwrap();
    let operator = format!("{},{}", allowed.origin, operator_only.origin);
    let cluster = DevCluster::start_with(
        1,
        1,
        &[
            "--token",
            "admin-token",
            "--cluster-secret",
            "secret",
            "--tenants",
            file.to_str().unwrap(),
            "--egress-allow",
            &operator,
        ],
    );
    let t = Api::new(cluster.http.clone(), Some(TOKEN.into()));
    let module = t.upload(&guests().testkit);
    let url = allowed.url("/x");
    let submit = |allow: &[&str], more: Value| {
        let mut spec = job(&module, &["http-get", &url], "", allow);
        for (key, value) in more.as_object().unwrap() {
            spec[key] = value.clone();
        }
        t.post_raw("/v1/jobs", spec.to_string())
    };

    // Within every layer: the request is made, and counted for the tenant.
    let ran = t.run_job(job(&module, &["http-get", &url], "", &[&allowed.origin]));
    let (text, task) = succeeded(&t, &ran);
    assert_eq!(text, response_line(200, b"for t") + "for t");
    let (bytes_sent, bytes_received) = counted(&allowed, &allowed.log()[0], &[]);
    let usage = t.get("/v1/tenants/t/usage").1;
    assert_eq!(usage["egress_requests"], 1, "{usage}");
    assert_eq!(usage["egress_bytes_sent"], bytes_sent, "{usage}");
    assert_eq!(usage["egress_bytes_received"], bytes_received, "{usage}");
    assert_eq!(used(&task, "egress_bytes_sent"), bytes_sent);
    for (family, value) in [
        ("requests", 1),
        ("bytes_sent", bytes_sent),
        ("bytes_received", bytes_received),
    ] {
        let series = format!("flint_tenant_task_egress_{family}_total{{tenant=\"t\"}}");
        assert_eq!(cluster.metric(&series), value as f64, "{series}");
    }

    // Beyond the tenant's list, though within the operator's.
    let port = operator_only.port().to_string();
    refused(
        submit(&[&operator_only.origin], json!({})),
        (422, "invalid_spec"),
        &[&port, "egress_allow"],
    );
    // The admin has no tenant layer: the same list is the operator's to judge, and passes.
    let admins = job(&module, &["noop"], "", &[&operator_only.origin]);
    let (status, body) = cluster.post_raw("/v1/jobs", admins.to_string());
    assert_eq!(status, 202, "{body}");
    // Beyond the operator's.
    refused(
        submit(&[&nobodys], json!({})),
        (422, "invalid_spec"),
        &[
            nobodys.trim_start_matches("http://127.0.0.1"),
            "--egress-allow",
        ],
    );
    // Limits above the tenant's maxima; at them, accepted.
    for (field, over, maximum) in [
        ("max_requests", 6, "max_egress_requests is 5"),
        ("max_bytes", 100_001, "max_egress_bytes is 100000"),
        ("max_concurrent", 3, "max_egress_concurrent is 2"),
    ] {
        refused(
            submit(
                &[&allowed.origin],
                json!({"resources": {"egress": {field: over}}}),
            ),
            (429, "quota_exceeded"),
            &[maximum],
        );
    }
    let (status, body) = submit(
        &[&allowed.origin],
        json!({"resources": {"egress": {"max_requests": 5, "max_bytes": 100_000, "max_concurrent": 2}}}),
    );
    assert_eq!(status, 202, "{body}");
    // A memoized task must be a function of its inputs alone; one with network is not.
    refused(
        submit(&[&allowed.origin], json!({"memoize": true})),
        (422, "invalid_spec"),
        &["memoize", "network"],
    );
}

#[test]
fn a_redirect_to_a_refused_origin_and_a_host_header_naming_another_host_are_denied() {
    let elsewhere = Origin::start(&[("/x", Reply::Body(b"elsewhere".to_vec()))]);
    let server = Origin::start(&[
        ("/away", Reply::Redirect(elsewhere.url("/x"))),
        ("/near", Reply::Redirect("/final".into())),
        ("/final", Reply::Body(b"followed".to_vec())),
        ("/x", Reply::Body(b"plain".to_vec())),
    ]);
    // The operator allows both origins; the job lists only `server`'s, so that its own
    // list is what the hop must be judged by.
    let cluster = cluster(&[&server.origin, &elsewhere.origin]);
    let module = cluster.upload(&guests().testkit);
    let allow = [server.origin.as_str()];
    let run = |args: &[&str]| succeeded(&cluster, &cluster.run_job(job(&module, args, "", &allow)));

    // A redirect within the allowed origin is followed, each hop a request.
    let (text, task) = run(&["http-get", &server.url("/near")]);
    assert_eq!(text, response_line(200, b"followed") + "followed");
    assert_eq!(used(&task, "egress_requests"), 2);

    // To another origin: denied at that hop, which never connects.
    let (text, task) = run(&["http-get", &server.url("/away")]);
    let line = text.strip_prefix("error: Denied: ").unwrap_or_else(|| {
        panic!("expected a denial at the hop, got {text:?}");
    });
    names(
        line,
        &[&format!("GET {}", elsewhere.url("/x")), "network.allow"],
    );
    assert_eq!(server.hits("/away"), 1);
    assert_eq!(
        used(&task, "egress_requests"),
        1,
        "the refused hop is not counted"
    );
    assert_eq!(elsewhere.connections(), 0);

    // A Host header naming another host: refused before connecting.
    let before = server.connections();
    let url = server.url("/x");
    let (text, _) = run(&["http-req", "GET", &url, "Host:evil.test"]);
    let line = text.strip_prefix("error: Denied: ").unwrap_or_else(|| {
        panic!("expected the Host header refused, got {text:?}");
    });
    names(line, &[&format!("GET {url}"), "evil.test", "Host"]);
    assert_eq!(server.connections(), before);
    // The URL's own authority as Host is no other host: sent, and what the server saw.
    let authority = server.origin.trim_start_matches("http://");
    let (text, _) = run(&["http-req", "GET", &url, &format!("Host:{authority}")]);
    assert_eq!(text, response_line(200, b"plain") + "plain");
    let last = server.log().pop().unwrap();
    assert_eq!(
        (last.path.as_str(), last.host.as_deref()),
        ("/x", Some(authority))
    );
}

#[test]
fn a_name_resolving_to_loopback_is_denied_at_connect_unless_the_operator_lists_the_address() {
    let server = Origin::start(&[("/x", Reply::Body(b"by name".to_vec()))]);
    let port = server.port();
    let by_name = format!("http://localhost:{port}");
    let url = format!("{by_name}/x");
    // The operator lists the name, not the address it resolves to.
    let cluster = cluster(&[&by_name]);
    let module = cluster.upload(&guests().testkit);
    let (text, task) = succeeded(
        &cluster,
        &cluster.run_job(job(&module, &["http-get", &url], "", &[&by_name])),
    );
    let line = text.strip_prefix("error: Denied: ").unwrap_or_else(|| {
        panic!("expected a denial at connect, got {text:?}");
    });
    names(
        line,
        &[
            &format!("GET {url}"),
            "localhost resolves to",
            "loopback",
            "--egress-allow",
        ],
    );
    assert_eq!(used(&task, "egress_requests"), 0);
    assert_eq!(server.connections(), 0);
    drop(cluster);

    // With the addresses listed too (whichever localhost has here), the same request is
    // made by name.
    let (v4, v6) = (
        format!("http://127.0.0.1:{port}"),
        format!("http://[::1]:{port}"),
    );
    let cluster = super::cluster(&[&by_name, &v4, &v6]);
    let module = cluster.upload(&guests().testkit);
    let (text, _) = succeeded(
        &cluster,
        &cluster.run_job(job(&module, &["http-get", &url], "", &[&by_name])),
    );
    assert_eq!(text, response_line(200, b"by name") + "by name");
    assert_eq!(
        server.log()[0].host.as_deref(),
        Some(&*format!("localhost:{port}"))
    );
}
