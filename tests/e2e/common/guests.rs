//! The guest-examples (and the C and Zig examples), built once per test process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The guest-examples, built once per test process (cargo's lock makes concurrent test
/// processes wait for one build).
pub struct Guests {
    pub wordcount: PathBuf,
    pub wordcount_reduce: PathBuf,
    pub grep: PathBuf,
    pub hashgen: PathBuf,
    pub testkit: PathBuf,
    /// The same guests built for wasm32-wasip2: command components.
    pub wordcount_component: PathBuf,
    pub testkit_component: PathBuf,
}

/// The guests, built on the first call.
pub fn guests() -> &'static Guests {
    static GUESTS: OnceLock<Guests> = OnceLock::new();
    GUESTS.get_or_init(build_guests)
}

fn build_guests() -> Guests {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("guests");
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .expect("running rustup");
    let installed = String::from_utf8_lossy(&installed.stdout).into_owned();
    for target in ["wasm32-wasip1", "wasm32-wasip2"] {
        if !installed.contains(target) {
            let status = Command::new("rustup")
                .args(["target", "add", target])
                .status()
                .expect("running rustup target add");
            assert!(status.success(), "rustup target add {target} failed");
        }
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        // The guests' own .cargo/config.toml is found from the working directory.
        .current_dir(root.join("guest-examples"))
        .args(["build", "--release"])
        .args(["--target", "wasm32-wasip1", "--target", "wasm32-wasip2"])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("running cargo for the guests");
    assert!(
        output.status.success(),
        "building guest-examples failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let p1 = target_dir.join("wasm32-wasip1/release");
    let p2 = target_dir.join("wasm32-wasip2/release");
    Guests {
        wordcount: p1.join("wordcount.wasm"),
        wordcount_reduce: p1.join("wordcount-reduce.wasm"),
        grep: p1.join("grep.wasm"),
        hashgen: p1.join("hashgen.wasm"),
        testkit: p1.join("testkit.wasm"),
        wordcount_component: p2.join("wordcount.wasm"),
        testkit_component: p2.join("testkit.wasm"),
    }
}

/// The C example (`guest-examples/c-wc`) built with Debian's clang and wasi-libc, as
/// its build.sh does; `scripts/test` installs them.
pub fn c_wc() -> &'static Path {
    static WASM: OnceLock<PathBuf> = OnceLock::new();
    WASM.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-wc.wasm");
        let output = Command::new(root.join("guest-examples/c-wc/build.sh"))
            .arg(&out)
            .output()
            .expect("running guest-examples/c-wc/build.sh (needs clang; see scripts/test)");
        assert!(
            output.status.success(),
            "building the C example failed (apt-get install clang lld wasi-libc \
             libclang-rt-dev-wasm32):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        out
    })
}

/// The Zig example (`guest-examples/zig-sha256`), built with the zig that `FLINT_ZIG`
/// names (a command line, e.g. `python -m ziglang` in the venv scripts/test makes) or
/// with `zig` on the PATH.
pub fn zig_sha256() -> &'static Path {
    static WASM: OnceLock<PathBuf> = OnceLock::new();
    WASM.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("zig-sha256");
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("sha256.wasm");
        let zig = std::env::var("FLINT_ZIG").unwrap_or_else(|_| "zig".into());
        let mut words = zig.split_whitespace();
        let program = words.next().expect("FLINT_ZIG is empty");
        let output = Command::new(program)
            .args(words)
            .arg("build-exe")
            .arg(root.join("guest-examples/zig-sha256/sha256.zig"))
            .args(["-target", "wasm32-wasi", "-O", "ReleaseSmall"])
            .arg(format!("-femit-bin={}", out.display()))
            .current_dir(&dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("running `{zig}` ({e}); set FLINT_ZIG or run scripts/test's setup")
            });
        assert!(
            output.status.success(),
            "building the Zig example failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        out
    })
}
