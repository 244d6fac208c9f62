//! Fixtures shared by the end-to-end tests: a tiny random Llama, a generated corpus, the
//! PJRT CPU plugin's path and the repository root.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Hidden width of the tiny model.
pub const HIDDEN: usize = 32;
/// Layers of the tiny model.
pub const LAYERS: usize = 2;

pub fn plugin() -> String {
    std::env::var("SIPHON_PJRT_PLUGIN").unwrap_or_else(|_| {
        let cache = std::env::var("SIPHON_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/siphon"));
        let path = cache.join("pjrt/xla-cpu-2026.6.23/libpjrt_cpu.so");
        assert!(path.exists(), "no PJRT CPU plugin: run scripts/install-plugin.sh or set SIPHON_PJRT_PLUGIN");
        path.display().to_string()
    })
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A tiny Llama with random weights and a vocabulary that covers the fixture tokenizer's 260 ids.
pub fn make_model(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({
        "model_type": "llama", "vocab_size": 264, "hidden_size": HIDDEN, "intermediate_size": 64,
        "num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
        "tie_word_embeddings": true, "hidden_act": "silu"
    });
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let parsed = siphon_models::HfConfig::from_json(&config.to_string()).unwrap().into_config().unwrap();
    let mut seed = 0x9e3779b97f4a7c15u64;
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = parsed
        .params(LAYERS, false)
        .into_iter()
        .map(|p| {
            let n: usize = p.shape.iter().product();
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let unit = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                    if p.class == siphon_models::ParamClass::Norm { 1.0 + 0.2 * unit } else { 0.4 * unit }
                })
                .collect();
            (p.name, p.shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            (name.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

/// Four text files of short lines (each line a document).
pub fn make_corpus(dir: &Path, lines_per_file: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let words = ["the", "river", "ran", "cold", "under", "a", "grey", "sky", "and", "birds", "sang", "of", "rain"];
    let mut seed = 7u64;
    for file in 0..4 {
        let mut text = String::new();
        for _ in 0..lines_per_file {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let n = 3 + (seed >> 60) as usize;
            for w in 0..n {
                let i = ((seed >> (w * 4 % 56)) as usize) % words.len();
                text.push_str(words[i]);
                text.push(' ');
            }
            text.push('\n');
        }
        std::fs::write(dir.join(format!("part-{file}.txt")), text).unwrap();
    }
}

/// A child process killed and reaped when dropped.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port on 127.0.0.1 free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `python3` with the arguments `args` gives for a free port, a server on 127.0.0.1
/// at that port, and waits until it accepts connections.
pub fn python_server(args: impl FnOnce(u16) -> Vec<std::ffi::OsString>) -> (Guard, u16) {
    let port = free_port();
    let args = args(port);
    let server = Guard(
        Command::new("python3")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("python3 {args:?}: {e}")),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "python3 {args:?} did not start serving");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, port)
}

/// The `siphon` binary with `args`, on the CPU plugin, outside any job the environment names,
/// its output piped.
pub fn siphon_command(args: &[String]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_siphon"));
    command
        .args(args)
        .env("SIPHON_PJRT_PLUGIN", plugin())
        .env("TF_CPP_MIN_LOG_LEVEL", "2")
        .env_remove("SIPHON_PROCESS_ID")
        .env_remove("SIPHON_NUM_PROCESSES")
        .env_remove("SIPHON_COORDINATOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Waits for the child to end within `limit` (else kills it and fails the test), draining its
/// pipes on threads so a chatty child never blocks on a full pipe.
pub fn wait_with_limit(mut guard: Guard, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    let stdout = guard.0.stdout.take().unwrap();
    let stderr = guard.0.stderr.take().unwrap();
    let out = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let status = loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = guard.0.kill();
            let _ = guard.0.wait();
            let (out, err) = (out.join().unwrap(), err.join().unwrap());
            panic!("siphon did not finish within {limit:?}\nstdout:\n{out}\nstderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: out.join().unwrap().into_bytes(), stderr: err.join().unwrap().into_bytes() }
}
