//! `flint bench --floor`: each end-to-end figure next to the floor this machine sets for
//! it, both measured in the same run (these machines are too noisy to compare runs):
//!
//! - no-op tasks per second through the whole system against the executor-only floor
//!   (the same module through the executor's task runner in this process), for the
//!   built-in minimal module and for `--module` (a real Rust guest, testkit's `noop`);
//! - a single-task job's submit-to-result p50 against its physical floor: one run
//!   through the task runner plus two loopback round trips (client to driver, driver to
//!   executor), each measured here;
//! - large results served to a client (8 x 8 MiB by default) against a raw loopback
//!   copy of as many bytes over as many connections, read the same way.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::NOOP_WASM;
use super::args::BenchArgs;
use super::measure::{NoopFigures, noop_figures, quantile, result_figures};
use super::procfs::{cpu_model, num_cpus};
use crate::dev::Cluster;

pub async fn run(
    args: &BenchArgs,
    cluster: &Cluster,
    guest: Vec<u8>,
    data_dir: &Path,
) -> anyhow::Result<()> {
    let Some(guest_name) = &args.module else {
        bail!("--floor needs --module testkit.wasm (the real Rust guest, and the results)");
    };
    let minimal = noop_figures(args, cluster, NOOP_WASM.to_vec()).await?;
    let rust = noop_figures(args, cluster, guest.clone()).await?;
    let hop = loopback_round_trip(args.latency_jobs.max(100)).await?;
    let mib = args.results_mib.unwrap_or(8);
    let results = result_figures(args, cluster, guest, mib, data_dir).await?;
    let raw = raw_loopback_copy(results.tasks, (mib as u64) << 20).await?;

    println!(
        "flint bench --floor: {} executor(s) x {} core(s); machine: {} cpus, {}",
        args.executors,
        args.cores,
        num_cpus(),
        cpu_model()
    );
    let throughput = |name: &str, f: &NoopFigures| {
        println!(
            "  no-op throughput, {name}: {:.0} tasks/s end to end, executor-only floor {:.0}: {:.2}x (goal >= 0.80x)",
            f.rate,
            f.local_rate,
            f.rate / f.local_rate
        );
    };
    throughput(
        &format!("built-in minimal module ({} bytes)", NOOP_WASM.len()),
        &minimal,
    );
    throughput(&format!("{} noop", guest_name.display()), &rust);
    for (name, f) in [("minimal module", &minimal), ("Rust guest", &rust)] {
        let e2e = quantile(&f.latencies, 0.5);
        let floor = quantile(&f.local_trips, 0.5) + hop * 2;
        println!(
            "  round trip p50, {name}: {:.3} ms end to end; floor {:.3} ms (task runner {:.3} ms + 2 loopback round trips of {:.3} ms): {:.1}x (goal <= 0.300 ms)",
            ms(e2e),
            ms(floor),
            ms(quantile(&f.local_trips, 0.5)),
            ms(hop),
            e2e.as_secs_f64() / floor.as_secs_f64()
        );
    }
    let gb = |d: Duration| results.gbs(d);
    println!(
        "  results to a client, {} x {mib} MiB: {:.2} GB/s; raw loopback copy of the same bytes over {} connections: {:.2} GB/s: {:.2}x (goals >= 1 GB/s, >= 0.80x)",
        results.tasks,
        gb(results.read),
        results.tasks,
        gb(raw),
        raw.as_secs_f64() / results.read.as_secs_f64()
    );
    println!(
        "  results end to end (the job writing them, then the client reading them): {:.2} GB/s; tasks to the block store alone {:.2} GB/s",
        gb(results.produced + results.read),
        gb(results.produced)
    );
    Ok(())
}

/// The p50 of a small request and its answer between two sockets on loopback, as the
/// client's request to the driver and the driver's launch to an executor are: the
/// answering end is a thread of its own blocked in `read`, as another process would
/// be, so that each trip pays a wake-up on either side as those hops do.
async fn loopback_round_trip(trips: usize) -> anyhow::Result<Duration> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || -> anyhow::Result<()> {
        let (mut socket, _) = listener.accept()?;
        socket.set_nodelay(true)?;
        let mut buf = [0u8; 256];
        loop {
            match socket.read(&mut buf)? {
                0 => return Ok(()),
                n => socket.write_all(&buf[..n])?,
            }
        }
    });
    let mut socket = TcpStream::connect(addr).await?;
    socket.set_nodelay(true)?;
    let request = [7u8; 200];
    let mut answer = [0u8; 200];
    let mut trips_taken = Vec::with_capacity(trips);
    for _ in 0..trips {
        let t = Instant::now();
        socket.write_all(&request).await?;
        socket.read_exact(&mut answer).await?;
        trips_taken.push(t.elapsed());
    }
    drop(socket);
    server
        .join()
        .map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    trips_taken.sort();
    Ok(quantile(&trips_taken, 0.5))
}

/// `streams` connections on loopback at once, each carrying `bytes` from memory to a
/// reader that keeps them as the result fetch does (pieces of `Bytes`): the fastest a
/// client could get those bytes from another process on this machine.
async fn raw_loopback_copy(streams: usize, bytes: u64) -> anyhow::Result<Duration> {
    const PIECE: usize = 1 << 20;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let piece = Bytes::from(vec![0x5au8; PIECE]);
    let server = tokio::spawn(async move {
        let mut senders = Vec::with_capacity(streams);
        for _ in 0..streams {
            let (mut socket, _) = listener.accept().await?;
            let piece = piece.clone();
            senders.push(tokio::spawn(async move {
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(PIECE as u64) as usize;
                    socket.write_all(&piece[..n]).await?;
                    left -= n as u64;
                }
                anyhow::Ok(())
            }));
        }
        for sender in senders {
            sender.await??;
        }
        anyhow::Ok(())
    });
    let t = Instant::now();
    let readers = (0..streams).map(|_| {
        tokio::spawn(async move {
            let mut socket = TcpStream::connect(addr).await?;
            let mut chunks = Vec::new();
            let mut got = 0u64;
            loop {
                let mut buf = BytesMut::with_capacity(64 << 10);
                match socket.read_buf(&mut buf).await? {
                    0 => break,
                    n => got += n as u64,
                }
                chunks.push(buf.freeze());
            }
            anyhow::Ok((got, chunks.len()))
        })
    });
    let read = futures_util::future::join_all(readers).await;
    let elapsed = t.elapsed();
    server.await??;
    for r in read {
        let (got, _) = r??;
        if got != bytes {
            bail!("the raw loopback copy carried {got} bytes of {bytes}");
        }
    }
    Ok(elapsed)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_raw_copy_carries_every_byte_and_the_round_trip_is_measured() {
        let copied = raw_loopback_copy(3, (2 << 20) + 5).await.unwrap();
        assert!(copied > Duration::ZERO);
        let hop = loopback_round_trip(20).await.unwrap();
        assert!(hop > Duration::ZERO && hop < Duration::from_secs(5));
    }
}
