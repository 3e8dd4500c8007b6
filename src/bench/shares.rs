//! `flint bench --simulated-executors 200 --tenants 10`: the scheduler's fairness between
//! tenants, on a driver in this process with simulated executors (see [`super::simulate`]).
//!
//! Tenant `i` has weight 1, 2 or 3 (`i % 3 + 1`). First one tenant alone runs a job of
//! `--simulated-tasks` tasks: the single-tenant rate. Then every tenant submits a job of
//! `--simulated-tasks / N` tasks at once, and the attempts each tenant's tasks ran are
//! counted until the first of those jobs ends (the heaviest tenant's, normally; until
//! then every tenant has a backlog). A tenant's share of those attempts is set against
//! its weight's share of the total weight: the goal is within 5 % of it, and a rate of
//! at least 90 % of the single tenant's.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flint_protocol::api::{InputSpec, JobSpec};

use super::NOOP_WASM;
use super::args::BenchArgs;
use super::measure::{ensure_succeeded, wait_for_alive};
use super::procfs::{cpu_model, num_cpus};
use super::simulate;
use crate::client::Client;
use crate::dev::Cluster;

const ADMIN: &str = "bench-admin";
const SECRET: &str = "bench-secret";

fn token(i: u32) -> String {
    format!("bench-tenant-{i}")
}

fn weight(i: u32) -> f64 {
    f64::from(i % 3 + 1)
}

/// The tenants file: `held`, each with `max_cores = 0`.
fn tenants_file(n: u32, held: bool) -> String {
    let mut text = String::new();
    for i in 0..n {
        text += &format!(
            "[[tenant]]\nname = \"t{i}\"\ntokens = [\"{}\"]\nweight = {:.1}\n",
            flint_driver::tenants::hash_token(&token(i)),
            weight(i)
        );
        if held {
            text += "[tenant.limits]\nmax_cores = 0\n";
        }
        text += "\n";
    }
    text
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.tenants;
    println!(
        "flint bench: fair shares between {n} tenants (weights 1, 2, 3, ...), simulated executors of {} cores, {} tasks{}",
        args.cores,
        args.simulated_tasks,
        simulate::task_length(args),
    );
    println!("  machine: {} cpus, {}", num_cpus(), cpu_model());
    for &executors in &args.simulated_executors {
        one_size(args, executors)
            .await
            .with_context(|| format!("{executors} simulated executors, {n} tenants"))?;
    }
    Ok(())
}

async fn one_size(args: &BenchArgs, executors: u32) -> anyhow::Result<()> {
    let n = args.tenants;
    let data_dir = tempfile::tempdir()?;
    let file = data_dir.path().join("tenants.toml");
    // Every tenant starts held (`max_cores = 0`): its job waits until all are in and
    // the executors have registered, then all are let go at once.
    std::fs::write(&file, tenants_file(n, true))?;
    let more = [
        format!("--tenants={}", file.display()),
        format!("--token={ADMIN}"),
        format!("--cluster-secret={SECRET}"),
    ];
    let cluster = Cluster::start(&args.dev_args_with(data_dir.path(), &more)?).await?;
    let result = measure(args, &cluster, executors).await;
    cluster.stop().await?;
    let mut simulators = result?;
    for child in &mut simulators {
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
    Ok(())
}

/// The tenants' jobs from their release to the first one's end: the attempts each
/// tenant's tasks ran meanwhile, and how long that was.
struct Shares {
    ran: Vec<u64>,
    total: u64,
    elapsed: Duration,
}

async fn measure(
    args: &BenchArgs,
    cluster: &Cluster,
    executors: u32,
) -> anyhow::Result<Vec<tokio::process::Child>> {
    let n = args.tenants;
    let clients: Vec<Client> = (0..n)
        .map(|i| Client::new(&cluster.http_url).with_token(Some(token(i))))
        .collect();
    let simulators = simulate::spawn(args, cluster, executors, Some(SECRET))?;
    wait_for_alive(cluster, executors as usize, Duration::from_secs(60)).await?;
    let tasks = args.simulated_tasks as usize;
    let (modules, ids) = submit_held(&clients, (tasks / n as usize).max(1)).await?;
    let shares = release_until_the_first_job_ends(cluster, n, &ids).await?;
    // Then one tenant alone, on the same (now warm) executors.
    let single_rate = one_tenant_rate(cluster, &clients[0], &modules[0], tasks).await?;
    print_shares(executors, n, single_rate, &shares);
    Ok(simulators)
}

fn job(module: &str, tasks: usize) -> JobSpec {
    JobSpec {
        name: Some("bench-tenants".into()),
        module: module.to_owned(),
        inputs: Some(vec![InputSpec::Text(String::new()); tasks]),
        ..JobSpec::default()
    }
}

/// Every tenant's job of `each` tasks, each on its own upload of the module (the admin's
/// would be no tenant's to use): the modules and the job ids, in tenant order. All are
/// in before any runs: submitting one takes longer than running a small one, and a job
/// that ran alone would measure nothing.
async fn submit_held(
    clients: &[Client],
    each: usize,
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let mut modules = Vec::new();
    let mut ids = Vec::new();
    for client in clients {
        let module = client
            .upload_module(NOOP_WASM.to_vec())
            .await?
            .id
            .to_string();
        ids.push(
            client
                .submit(&job(&module, each), None)
                .await?
                .id
                .to_string(),
        );
        modules.push(module);
    }
    Ok((modules, ids))
}

/// The attempts each of the `n` tenants has spent so far.
fn attempts_spent(cluster: &Cluster, n: u32) -> Vec<u64> {
    cluster.driver.read(|s| {
        (0..n)
            .map(|i| {
                s.tenant_spent
                    .get(&Some(format!("t{i}")))
                    .map_or(0, |spent| spent.attempts)
            })
            .collect()
    })
}

/// Lets every held tenant go at once and counts what each ran until the first job
/// ended (until then every tenant has a backlog); then kills the jobs still running.
async fn release_until_the_first_job_ends(
    cluster: &Cluster,
    n: u32,
    ids: &[String],
) -> anyhow::Result<Shares> {
    let mut endings = cluster.driver.job_endings();
    endings.borrow_and_update();
    let before = attempts_spent(cluster, n);
    let t0 = Instant::now();
    let free = flint_driver::tenants::Tenants::parse(&tenants_file(n, false), false)
        .map_err(anyhow::Error::msg)?;
    cluster.driver.set_tenants(free);
    tokio::time::timeout(Duration::from_secs(600), endings.changed())
        .await
        .context("no tenant's job ended within 600 s")??;
    let elapsed = t0.elapsed();
    let after = attempts_spent(cluster, n);
    let admin = Client::new(&cluster.http_url).with_token(Some(ADMIN.into()));
    for id in ids {
        let _ = admin.kill(id).await;
    }
    let ran: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let total: u64 = ran.iter().sum();
    if total == 0 {
        bail!("no attempt ran while every tenant had a backlog: give more --simulated-tasks");
    }
    Ok(Shares {
        ran,
        total,
        elapsed,
    })
}

/// Tasks per second of one tenant's job of `tasks` tasks, run alone.
async fn one_tenant_rate(
    cluster: &Cluster,
    client: &Client,
    module: &str,
    tasks: usize,
) -> anyhow::Result<f64> {
    let wait = Some(Duration::from_secs(600));
    let mut endings = cluster.driver.job_endings();
    endings.borrow_and_update();
    let t0 = Instant::now();
    let alone = client.submit(&job(module, tasks), None).await?;
    tokio::time::timeout(Duration::from_secs(600), endings.changed())
        .await
        .context("the single tenant's job did not end within 600 s")??;
    let single_rate = tasks as f64 / t0.elapsed().as_secs_f64();
    ensure_succeeded(
        client.job(&alone.id.to_string(), wait).await?.state,
        "the single tenant's job",
    )?;
    Ok(single_rate)
}

/// The rates, then each tenant's share of the attempts against its weight's.
fn print_shares(executors: u32, n: u32, single_rate: f64, shares: &Shares) {
    let Shares {
        ran,
        total,
        elapsed,
    } = shares;
    let multi_rate = *total as f64 / elapsed.as_secs_f64();
    let weights: f64 = (0..n).map(weight).sum();
    println!(
        "  {executors:>5} executors: one tenant {single_rate:.0} tasks/s; {n} tenants {multi_rate:.0} tasks/s, {:.1} % of one (goal >= 90 %); {total} attempts until the first job ended, in {:.2} s",
        100.0 * multi_rate / single_rate,
        elapsed.as_secs_f64(),
    );
    let mut worst = 0.0f64;
    println!("    tenant  weight  its share  got      off by");
    for (i, ran) in ran.iter().enumerate() {
        let fair = weight(i as u32) / weights;
        let got = *ran as f64 / *total as f64;
        let off = (got - fair) / fair;
        worst = worst.max(off.abs());
        println!(
            "    t{i:<5}  {:>6.0}  {:>8.2} %  {:>6.2} %  {:>+6.1} %",
            weight(i as u32),
            100.0 * fair,
            100.0 * got,
            100.0 * off
        );
    }
    println!(
        "    worst share off its weight's by {:.1} % of it (goal <= 5 %)",
        100.0 * worst
    );
}
