//! Flint example task: writes a large result derived from a seed, for checking that big
//! results arrive intact.
//!
//! Input: JSON `{"seed": S, "mib": N}`. Result: N MiB of a SplitMix64 stream started at
//! S (each 64-bit output little-endian), written to stdout in 64 KiB pieces as it is
//! generated, so the task never holds the whole result. The log gets
//! `sha256 <hex> bytes <n>`, which the host can compare with the SHA-256 the driver
//! reports and with its own.

use flint_sdk::{Context, Error, Output};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::process::ExitCode;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    seed: u64,
    mib: u32,
}

/// Bytes written per call: large enough to keep the per-write cost small, small enough
/// not to matter in the task's memory.
const PIECE: usize = 64 * 1024;

fn main() -> ExitCode {
    flint_sdk::run_streaming(|ctx: &Context, request: Request, out: &mut Output| {
        let digest = generate(request.seed, request.mib, |piece| {
            out.write_all(piece)
                .map_err(|e| Error::io(format!("writing the result: {e}")))
        })?;
        ctx.log(format_args!(
            "sha256 {digest} bytes {}",
            u64::from(request.mib) << 20
        ));
        Ok(())
    })
}

/// Feeds `mib` MiB of the stream to `sink`, returns their SHA-256 in hex.
fn generate(
    seed: u64,
    mib: u32,
    mut sink: impl FnMut(&[u8]) -> Result<(), Error>,
) -> Result<String, Error> {
    let mut state = seed;
    let mut hasher = Sha256::new();
    let mut piece = vec![0u8; PIECE];
    for _ in 0..(u64::from(mib) << 20) / PIECE as u64 {
        for word in piece.chunks_exact_mut(8) {
            word.copy_from_slice(&splitmix64(&mut state).to_le_bytes());
        }
        hasher.update(&piece);
        sink(&piece)?;
    }
    Ok(hex(&hasher.finalize()))
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_splitmix64_little_endian() {
        let mut first = Vec::new();
        generate(0, 1, |piece| {
            if first.is_empty() {
                first = piece[..8].to_vec();
            }
            Ok(())
        })
        .unwrap();
        // SplitMix64's first output for seed 0.
        assert_eq!(first, 0xE220_A839_7B1D_CDAFu64.to_le_bytes());
    }

    #[test]
    fn the_digest_covers_every_byte() {
        let mut all = Vec::new();
        let digest = generate(7, 1, |piece| {
            all.extend_from_slice(piece);
            Ok(())
        })
        .unwrap();
        assert_eq!(all.len(), 1 << 20);
        assert_eq!(digest, hex(&Sha256::digest(&all)));
    }
}
