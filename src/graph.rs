//! `flint graph`: submit a graph of jobs from a file (YAML, TOML or JSON) in one request,
//! follow it with one progress line per job, and read, kill or delete one. A job's
//! `module` (or a file of its `files`) given as a path to a local file is uploaded
//! first, the path read from the graph file's directory.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use flint_protocol::api::{GraphCreated, GraphView, JobState};
use serde_json::Value;

use crate::client::Client;
use crate::jobs::DriverUrl;

#[derive(clap::Args, Clone, Debug)]
pub struct GraphArgs {
    #[command(subcommand)]
    command: GraphCommand,
}

#[derive(clap::Subcommand, Clone, Debug)]
enum GraphCommand {
    /// Submit the graph in FILE (`{"jobs": {"<name>": <job spec>, ...}}`, as YAML, TOML
    /// or JSON by its extension): a job's input `{"results": {"job": "<name>"}}` reads
    /// another job of the graph, and waits for it. Prints the graph's id.
    Submit {
        file: PathBuf,
        /// Wait for every job to end, with one progress line per job on stderr; exit 1
        /// if the graph did not succeed.
        #[arg(long)]
        wait: bool,
        /// Print the answer (or with --wait, the ended graph) as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        url: DriverUrl,
    },
    /// A graph's state, each job's state and counts, and its edges.
    Status {
        graph: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        url: DriverUrl,
    },
    /// Submit a failed or killed graph again as a new one: with `"memoize": true` on its
    /// jobs, only what failed and what depends on it runs. Prints the new graph's id.
    Recover {
        graph: String,
        /// Wait for the new graph to end, as `submit --wait` does.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        url: DriverUrl,
    },
    /// Kill every job of a graph that has not ended.
    Kill {
        graph: String,
        #[command(flatten)]
        url: DriverUrl,
    },
    /// Delete a graph and all of its jobs (each must have ended: kill it first).
    Delete {
        graph: String,
        #[command(flatten)]
        url: DriverUrl,
    },
}

pub async fn run(args: GraphArgs) -> anyhow::Result<i32> {
    match args.command {
        GraphCommand::Submit {
            file,
            wait,
            json,
            url,
        } => submit(&file, wait, json, &url.client()).await,
        GraphCommand::Status { graph, json, url } => {
            let view = url.client().graph(&graph, None).await?;
            match json {
                true => println!("{}", serde_json::to_string_pretty(&view)?),
                false => print!("{}", describe(&view)),
            }
            Ok(0)
        }
        GraphCommand::Recover { graph, wait, url } => {
            let client = url.client();
            let created = client.recover_graph(&graph).await?;
            println!("{}", created.id);
            if !wait {
                return Ok(0);
            }
            let view = follow(&client, &created.id).await?;
            eprint!("{}", describe(&view));
            Ok(if view.state == JobState::Succeeded {
                0
            } else {
                1
            })
        }
        GraphCommand::Kill { graph, url } => {
            let view = url.client().kill_graph(&graph).await?;
            print!("{}", describe(&view));
            Ok(0)
        }
        GraphCommand::Delete { graph, url } => {
            url.client().delete_graph(&graph).await?;
            println!("deleted {graph}");
            Ok(0)
        }
    }
}

async fn submit(file: &Path, wait: bool, json: bool, client: &Client) -> anyhow::Result<i32> {
    let mut graph = read_graph(file)?;
    let base = file.parent().unwrap_or(Path::new("."));
    upload_local(&mut graph, base, client).await?;
    let created: GraphCreated = client.submit_graph(&graph).await?;
    if !wait {
        match json {
            true => println!("{}", serde_json::to_string_pretty(&created)?),
            false => println!("{}", created.id),
        }
        return Ok(0);
    }
    if !json {
        println!("{}", created.id);
    }
    let view = follow(client, &created.id).await?;
    match json {
        true => println!("{}", serde_json::to_string_pretty(&view)?),
        false => eprint!("{}", describe(&view)),
    }
    Ok(if view.state == JobState::Succeeded {
        0
    } else {
        1
    })
}

/// The graph file as JSON, by its extension: `.yaml`/`.yml`, `.toml`, else JSON.
fn read_graph(file: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
    let value: Value = match ext {
        "yaml" | "yml" => serde_yaml_ng::from_str(&text)
            .with_context(|| format!("{} is not a YAML graph", file.display()))?,
        "toml" => toml::from_str(&text)
            .with_context(|| format!("{} is not a TOML graph", file.display()))?,
        _ => serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON graph", file.display()))?,
    };
    if !value.get("jobs").is_some_and(Value::is_object) {
        bail!(
            "{}: a graph is {{\"jobs\": {{\"<name>\": <job spec>, ...}}}}",
            file.display()
        );
    }
    Ok(value)
}

/// Whether `given` names a local file rather than an upload or a URL.
fn local(given: &str, base: &Path) -> Option<PathBuf> {
    let remote = given.starts_with("sha256:") || given.contains("://");
    let path = base.join(given);
    (!remote && path.is_file()).then_some(path)
}

/// Uploads every module and file the graph names by local path, putting its id in
/// place; each path once.
async fn upload_local(graph: &mut Value, base: &Path, client: &Client) -> anyhow::Result<()> {
    let mut modules: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut files: BTreeMap<PathBuf, String> = BTreeMap::new();
    let jobs = graph["jobs"]
        .as_object_mut()
        .expect("checked by read_graph");
    for (name, job) in jobs.iter_mut() {
        if let Some(module) = job.get_mut("module")
            && let Some(path) = module.as_str().and_then(|m| local(m, base))
        {
            let id = match modules.get(&path) {
                Some(id) => id.clone(),
                None => {
                    let wasm = std::fs::read(&path)
                        .with_context(|| format!("jobs.{name}: reading {}", path.display()))?;
                    let id = client.upload_module(wasm).await?.id.to_string();
                    modules.insert(path.clone(), id.clone());
                    id
                }
            };
            *module = Value::String(id);
        }
        let Some(job_files) = job.get_mut("files").and_then(Value::as_object_mut) else {
            continue;
        };
        for (file_name, file) in job_files.iter_mut() {
            let Some(path) = file.as_str().and_then(|f| local(f, base)) else {
                continue;
            };
            let id = match files.get(&path) {
                Some(id) => id.clone(),
                None => {
                    let bytes = std::fs::read(&path).with_context(|| {
                        format!("jobs.{name}.files.{file_name}: reading {}", path.display())
                    })?;
                    let id = client.upload_file(bytes).await?.id.to_string();
                    files.insert(path.clone(), id.clone());
                    id
                }
            };
            *file = Value::String(id);
        }
    }
    Ok(())
}

/// Follows a graph until every job has ended, one progress line per job on stderr
/// (redrawn in place on a terminal, printed as they change otherwise).
async fn follow(client: &Client, id: &str) -> anyhow::Result<GraphView> {
    let terminal = std::io::stderr().is_terminal();
    let mut shown: BTreeMap<String, String> = BTreeMap::new();
    let mut drawn = 0;
    loop {
        let view = client.graph(id, Some(Duration::from_secs(1))).await?;
        let lines: BTreeMap<String, String> = (view.jobs.iter())
            .map(|(name, job)| (name.clone(), job_line(name, job)))
            .collect();
        if terminal {
            // Up over the lines drawn before, each cleared as it is written again.
            eprint!("{}", "\x1b[1A\x1b[2K".repeat(drawn));
            for line in lines.values() {
                eprintln!("{line}");
            }
            drawn = lines.len();
        } else {
            for (name, line) in &lines {
                if shown.get(name) != Some(line) {
                    eprintln!("{line}");
                }
            }
        }
        shown = lines;
        if view.jobs.values().all(|j| j.state.is_final()) {
            return Ok(view);
        }
    }
}

/// `map (job-…): 3/8 done, 2 running, 0 failed, 3 pending (running)`.
fn job_line(name: &str, job: &flint_protocol::api::GraphJobView) -> String {
    format!(
        "{name} ({}): {}",
        job.id,
        crate::progress::counts_line(&job.counts, job.tasks, job.state)
    )
}

/// A graph for a person: its state, a line per job (with its error), and its edges.
fn describe(view: &GraphView) -> String {
    let mut out = format!("{} ({})\n", view.id, view.state.as_str());
    for (name, job) in &view.jobs {
        out.push_str(&format!("  {}\n", job_line(name, job)));
        if let Some(error) = &job.error {
            out.push_str(&format!("    {}: {}\n", error.kind, error.message));
        }
    }
    for edge in &view.edges {
        out.push_str(&format!("  {} -> {}\n", edge.from, edge.to));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_file_is_read_by_its_extension() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = dir.path().join("g.yaml");
        std::fs::write(
            &yaml,
            "jobs:\n  map:\n    module: m.wasm\n    inputs: [{text: a}]\n",
        )
        .unwrap();
        let toml = dir.path().join("g.toml");
        std::fs::write(
            &toml,
            "[jobs.map]\nmodule = \"m.wasm\"\ninputs = [{text = \"a\"}]\n",
        )
        .unwrap();
        let json = dir.path().join("g.json");
        std::fs::write(
            &json,
            r#"{"jobs": {"map": {"module": "m.wasm", "inputs": [{"text": "a"}]}}}"#,
        )
        .unwrap();
        let expected = read_graph(&json).unwrap();
        assert_eq!(read_graph(&yaml).unwrap(), expected);
        assert_eq!(read_graph(&toml).unwrap(), expected);
        std::fs::write(&json, r#"{"map": {}}"#).unwrap();
        let refused = read_graph(&json).unwrap_err().to_string();
        assert!(refused.contains("a graph is"), "{refused}");
    }

    #[test]
    fn local_paths_are_told_from_uploads_and_urls() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.wasm"), b"\0asm").unwrap();
        assert_eq!(local("m.wasm", dir.path()), Some(dir.path().join("m.wasm")));
        assert_eq!(local("missing.wasm", dir.path()), None);
        assert_eq!(local("sha256:00", dir.path()), None);
        assert_eq!(local("https://host/m.wasm", dir.path()), None);
    }
}
