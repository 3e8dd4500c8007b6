//! Hostile URLs against egress, as `blocks.rs`'s `urls_the_policy_refuses_are_never_requested`
//! does for fetches: internal addresses in every spelling a URL parser takes, and names
//! that resolve to internal addresses inside a network namespace. Each is denied and
//! none reaches a server, which counts connections.

use std::fs::File;
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use super::{gets_job, job, names, result_text};
use crate::common::netns::{Host, Lan};
use crate::common::{DevCluster, Origin, Process, Reply, guests, process, wait_until};

/// The origin the operator and the job list: public-looking, never requested.
const PUBLIC: &str = "http://api.example.com";

#[test]
fn internal_addresses_in_any_spelling_are_denied_and_never_requested() {
    let server = Origin::start(&[("/", Reply::Body(b"secret".to_vec()))]);
    let p = server.port();
    let cluster = super::cluster(&[PUBLIC]);
    let module = cluster.upload(&guests().testkit);
    let urls = [
        format!("http://127.0.0.1:{p}/"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://10.0.0.1/".to_owned(),
        format!("http://[::ffff:127.0.0.1]:{p}/"),
        // 127.0.0.1 as hexadecimal parts, and as one decimal number.
        format!("http://0x7f.1:{p}/"),
        format!("http://2130706433:{p}/"),
    ];
    // One job, a task per URL; a short deadline, so that one that got through to an
    // address where nothing answers fails fast rather than hangs the test.
    let mut spec = gets_job(&module, &urls, &[PUBLIC]);
    spec["resources"] = json!({"timeout_ms": 10_000});
    let ran = cluster.run_job(spec);
    assert_eq!(ran["state"], "succeeded", "{ran}");
    for (index, url) in urls.iter().enumerate() {
        let text = result_text(&cluster, &ran, index as u64).unwrap();
        let line = text.strip_prefix("error: Denied: ").unwrap_or_else(|| {
            panic!("{url}: expected a denial, got {text:?}");
        });
        // The job's list is the first to refuse; the address rule behind it is the
        // operator's, reached only by what the job's own list admits.
        names(line, &["GET http://", "network.allow"]);
    }
    for task in cluster.tasks(&ran) {
        assert_eq!(task["usage"]["egress_requests"], 0, "{task}");
    }
    assert_eq!(server.connections(), 0);

    // Nor may a job list any of them: each is outside the operator's list.
    for url in &urls {
        let origin = url
            .trim_end_matches('/')
            .trim_end_matches("/latest/meta-data");
        let asking = job(&module, &["noop"], "", &[origin]);
        let (status, body) = cluster.post_raw("/v1/jobs", asking.to_string());
        assert_eq!(status, 422, "{origin}: {body}");
        names(
            body["error"]["message"].as_str().unwrap(),
            &["--egress-allow"],
        );
    }
}

/// Accepts a connection to `server`'s port at `ip` from inside the host, as a check
/// that the listener is there and counts.
fn connect_inside(host: &Host, ip: &str, server: &Origin) {
    let addr = format!("{ip}:{}", server.port());
    host.inside(|| TcpStream::connect(&addr).unwrap());
    wait_until(Duration::from_secs(5), "the probe's connection", || {
        server.connections() == 1
    });
}

#[test]
fn names_of_internal_addresses_in_an_executors_namespace_are_denied_at_connect() {
    // One host on a LAN: the executor runs there, with listeners on the host's own LAN
    // address and on a metadata address on its loopback, and names for both in the
    // hosts file of its namespace.
    let lan = Lan::create(1);
    let host = &lan.hosts[0];
    host.add_address("169.254.169.254/32", "lo");
    let routes = [("/latest/meta-data/", Reply::Body(b"secret".to_vec()))];
    let on_lan = host.inside(|| Origin::start_at(&format!("{}:0", host.address), &routes));
    let metadata = host.inside(|| Origin::start_at("169.254.169.254:80", &routes));
    host.hosts_file(&format!(
        "127.0.0.1 localhost\n{} lan.test\n169.254.169.254 meta.test\n",
        host.address
    ));
    let resolved = host
        .command("getent")
        .args(["hosts", "meta.test"])
        .output()
        .unwrap();
    let resolved = String::from_utf8_lossy(&resolved.stdout);
    assert!(resolved.starts_with("169.254.169.254"), "{resolved:?}");

    // The operator lists the names, not the addresses; so does the job.
    let (lan_origin, meta_origin) = (
        format!("http://lan.test:{}", on_lan.port()),
        "http://meta.test",
    );
    let mut args = lan.driver_args();
    args.extend([
        "--egress-allow".into(),
        format!("{lan_origin},{meta_origin}"),
    ]);
    let cluster = DevCluster::driver(&args);
    let work = cluster.data_dir.path().join("exec-ns");
    std::fs::create_dir_all(&work).unwrap();
    let _executor = Process::spawn(
        process::executor_in_netns(&host.netns, &cluster.executor_url(), "exec-ns", &work)
            .stdout(Stdio::null())
            .stderr(File::create(work.join("stderr")).unwrap()),
    );
    cluster.wait_for_alive_executors(1);
    let module = cluster.upload(&guests().testkit);
    let cases = [
        (
            format!("{lan_origin}/latest/meta-data/"),
            host.address.as_str(),
            "private",
        ),
        (
            format!("{meta_origin}/latest/meta-data/"),
            "169.254.169.254",
            "link-local",
        ),
    ];
    let urls = cases
        .iter()
        .map(|(url, _, _)| url.clone())
        .collect::<Vec<_>>();
    let ran = cluster.run_job(gets_job(&module, &urls, &[&lan_origin, meta_origin]));
    assert_eq!(ran["state"], "succeeded", "{ran}");
    for (index, (url, addr, class)) in cases.iter().enumerate() {
        let text = result_text(&cluster, &ran, index as u64).unwrap();
        let line = text.strip_prefix("error: Denied: ").unwrap_or_else(|| {
            panic!("{url}: expected a denial at connect, got {text:?}");
        });
        names(
            line,
            &[&format!("GET {url}"), &format!("resolves to {addr}"), class],
        );
    }
    assert_eq!((on_lan.connections(), metadata.connections()), (0, 0));

    // Both listeners were there to be reached, and count what reaches them.
    connect_inside(host, &host.address, &on_lan);
    connect_inside(host, "169.254.169.254", &metadata);
}
