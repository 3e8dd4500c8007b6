//! `flint submit`: upload a module, submit one task per input, wait, print the results.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::ArgMatches;
use flint_protocol::api::{InputSpec, JobSpec, JobState, ResourcesSpec};

#[derive(clap::Args, Clone, Debug)]
pub struct SubmitArgs {
    /// The task: a wasm32-wasip1 module.
    module: PathBuf,
    /// A file whose bytes are one task's input (repeat for more tasks).
    #[arg(long = "input", value_name = "PATH")]
    inputs: Vec<PathBuf>,
    /// A task's input given as text (repeat for more tasks).
    #[arg(long = "input-text", value_name = "TEXT")]
    input_texts: Vec<String>,
    /// An argument for every task (repeat for more).
    #[arg(long = "arg", value_name = "ARG", allow_hyphen_values = true)]
    args: Vec<String>,
    /// The job's name (the guest's argv[0]).
    #[arg(long)]
    name: Option<String>,
    /// Cores each task needs.
    #[arg(long)]
    cores: Option<u32>,
    /// Wait for the job to end and print each task's result, in task order.
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    url: crate::jobs::DriverUrl,
}

/// Inputs in the order they were given on the command line, files and texts mixed.
fn inputs_in_order(args: &SubmitArgs, matches: &ArgMatches) -> anyhow::Result<Vec<InputSpec>> {
    let mut ordered: Vec<(usize, InputSpec)> = Vec::new();
    let file_positions = matches.indices_of("inputs").into_iter().flatten();
    for (position, path) in file_positions.zip(&args.inputs) {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let input = match String::from_utf8(bytes) {
            Ok(text) => InputSpec::Text(text),
            Err(e) => {
                use base64::Engine as _;
                InputSpec::Base64(base64::engine::general_purpose::STANDARD.encode(e.as_bytes()))
            }
        };
        ordered.push((position, input));
    }
    let text_positions = matches.indices_of("input_texts").into_iter().flatten();
    for (position, text) in text_positions.zip(&args.input_texts) {
        ordered.push((position, InputSpec::Text(text.clone())));
    }
    ordered.sort_by_key(|(position, _)| *position);
    Ok(ordered.into_iter().map(|(_, input)| input).collect())
}

pub async fn run(args: SubmitArgs, matches: &ArgMatches) -> anyhow::Result<i32> {
    let wasm = std::fs::read(&args.module)
        .with_context(|| format!("reading {}", args.module.display()))?;
    let mut inputs = inputs_in_order(&args, matches)?;
    if inputs.is_empty() {
        // One task with empty stdin, so `flint submit task.wasm` just runs it.
        inputs.push(InputSpec::Text(String::new()));
    }
    let client = args.url.client();
    let module = client.upload_module(wasm).await?;
    let name = args.name.clone().or_else(|| {
        args.module
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
    });
    let spec = JobSpec {
        name,
        module: module.id.to_string(),
        args: args.args.clone(),
        inputs: Some(inputs),
        resources: ResourcesSpec {
            cores: args.cores,
            ..ResourcesSpec::default()
        },
        ..JobSpec::default()
    };
    let job = client.submit(&spec, None).await?;
    if !args.wait {
        println!("{}", job.id);
        return Ok(0);
    }
    let mut job = job;
    while !job.state.is_final() {
        job = client.job(&job.id.0, Some(Duration::from_secs(30))).await?;
    }
    let tasks = client.tasks(&job.id.0).await?;
    let mut stdout = std::io::stdout().lock();
    for task in &tasks {
        if task.result.is_some() {
            let bytes = client.result(&job.id.0, task.index).await?;
            stdout.write_all(&bytes)?;
            if !bytes.ends_with(b"\n") {
                stdout.write_all(b"\n")?;
            }
        }
    }
    stdout.flush()?;
    if job.state == JobState::Succeeded {
        return Ok(0);
    }
    eprintln!(
        "job {} {}: {}",
        job.id,
        serde_json::to_string(&job.state)?.trim_matches('"'),
        job.error.map(|e| e.message).unwrap_or_default()
    );
    for task in tasks.iter().filter(|t| t.error.is_some()) {
        let error = task.error.as_ref().expect("filtered");
        eprintln!("  task {}: {}: {}", task.index, error.kind, error.message);
    }
    Ok(1)
}
