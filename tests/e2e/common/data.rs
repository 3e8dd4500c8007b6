//! Test data: digests, and streams generated here independently of the guests that
//! generate them too.

use sha2::{Digest, Sha256};

/// The SHA-256 of `bytes`, in lowercase hex as the API writes digests.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A command's output as text, any bad UTF-8 replaced (for messages and `contains`).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What the hashgen guest writes for `seed` and `mib`: a splitmix64 stream.
pub fn splitmix_stream(seed: u64, mib: usize) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(mib << 20);
    while out.len() < mib << 20 {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out
}
