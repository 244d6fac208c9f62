//! `upload`: shard write throughput against a plain object_store upload of the same bytes.
//!
//! `siphon-store-bench upload --output DIR [--total-mb 4096] [--shard-mb 256] [--repeats 3]
//! [--no-fsync] [--sealers N]` for local disk, or `--s3-moto PYTHON` (the venv python from
//! scripts/setup-python.sh) to start moto's S3 server on 127.0.0.1 and write there.
//!
//! Writer: pushes f32 batches (cloned from one template, clone timed; 2 hooks × 4096 wide, 8 × 128 tokens, ~32 MB each) and
//! stores them as f32, so shard bytes ≈ input bytes; the time runs from the first push to
//! `finish()` (every shard uploaded and committed). Plain: the writer's shard files, read back
//! into memory, uploaded one after another with object_store's `WriteMultipart` with the same
//! part size and request concurrency. Runs alternate; medians are reported.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, WriteMultipart};
use siphon_store::synthetic::SyntheticSpec;
use siphon_store::{DType, HostId, RunDescriptor, ShardWriter, StoreConfig, StoreLocation, UploadConfig};

pub struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub const HELP: &str = "\
siphon-store-bench upload: the shard writer against a plain object_store upload of the same bytes

  --output DIR        write to local disk under DIR
  --s3-moto PYTHON    start moto's S3 server on 127.0.0.1 (PYTHON: scripts/setup-python.sh's venv) and write there
  --total-mb N        megabytes of f32 activations (4096)
  --shard-mb N        shard size (256)
  --repeats N         rounds, writer and plain alternating; medians reported (3)
  --no-fsync          do not fsync local shards
  --sealers N         shards sealed side by side (4)";

pub fn run(args: Vec<String>) -> anyhow::Result<()> {
    let mut output = None;
    let mut moto_python = None;
    let mut total_mb = 4096u64;
    let mut shard_mb = 256u64;
    let mut repeats = 3usize;
    let mut fsync_local = true;
    let mut sealers = siphon_store::DEFAULT_SEALERS;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--output" => output = Some(value()?),
            "--s3-moto" => moto_python = Some(value()?),
            "--total-mb" => total_mb = value()?.parse().context("--total-mb")?,
            "--shard-mb" => shard_mb = value()?.parse().context("--shard-mb")?,
            "--repeats" => repeats = value()?.parse().context("--repeats")?,
            "--no-fsync" => fsync_local = false,
            "--sealers" => sealers = value()?.parse().context("--sealers")?,
            other => bail!("unexpected argument {other:?} (see --help)"),
        }
    }
    let mut _moto = None;
    let (base, options) = match (output, moto_python) {
        (Some(dir), None) => (dir, Vec::new()),
        (None, Some(python)) => {
            let (guard, options) = start_moto(&python)?;
            _moto = Some(guard);
            ("s3://bench".to_string(), options)
        }
        _ => bail!("give exactly one of --output DIR and --s3-moto PYTHON"),
    };

    let spec = SyntheticSpec::new(2, 8, 128, 4096);
    let template = spec.batch(0);
    let batch_bytes = template.hooks.iter().map(|h| h.data.len()).sum::<usize>() as u64;
    let n_batches = (total_mb << 20).div_ceil(batch_bytes);
    let upload = UploadConfig { fsync_local, ..UploadConfig::default() };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (mut writer_rates, mut plain_rates) = (Vec::new(), Vec::new());
    for repeat in 0..repeats {
        // Writer.
        let prefix = format!("{base}/bench-{repeat}");
        let mut config = StoreConfig::new(format!("{prefix}/writer"), "bench", HostId { machine: 0, host: 0 });
        config.options = options.clone();
        config.format.dtype = DType::F32;
        config.format.target_shard_bytes = shard_mb << 20;
        config.upload = upload.clone();
        config.sealers = sealers;
        let descriptor =
            RunDescriptor { hooks: spec.hooks.clone(), hook_shapes: spec.shapes.clone(), ..Default::default() };
        // The input batches exist before the clock starts, as the plain upload's bytes do: in a
        // run they are the device-to-host copies, which are the engine's work, not the writer's.
        // (Timing their allocation too charged the writer with page faults it does not cause.)
        let batches: Vec<_> = (0..n_batches)
            .map(|k| {
                let mut batch = template.clone();
                batch.first_sample = k * spec.batch as u64;
                batch.data_position_after = serde_json::json!({ "batch": k + 1 });
                batch
            })
            .collect();
        let mut writer = ShardWriter::open(config, descriptor)?;
        let start = Instant::now();
        for batch in batches {
            writer.push(batch)?;
        }
        let summary = writer.finish()?;
        let writer_secs = start.elapsed().as_secs_f64();
        let mb = summary.bytes as f64 / (1 << 20) as f64;
        writer_rates.push(mb / writer_secs);

        // Plain upload of the same bytes.
        let plain_secs = runtime.block_on(async {
            let source = StoreLocation::open(&format!("{prefix}/writer"), &options)?;
            let target = StoreLocation::open(&format!("{prefix}/plain"), &options)?;
            let dir = source.host_dir("bench", HostId { machine: 0, host: 0 });
            let mut shards = Vec::new();
            let listed: Vec<_> = source.store().list(Some(&dir)).try_collect().await?;
            for meta in listed.iter().filter(|m| m.location.as_ref().ends_with(".safetensors")) {
                shards.push((
                    meta.location.filename().unwrap().to_string(),
                    source.store().get(&meta.location).await?.bytes().await?,
                ));
            }
            let start = Instant::now();
            for (name, bytes) in shards {
                let upload_handle = target.store().put_multipart(&target.run_dir("plain").join(name.as_str())).await?;
                let mut write = WriteMultipart::new_with_chunk_size(upload_handle, upload.part_bytes);
                let mut offset = 0;
                while offset < bytes.len() {
                    let end = (offset + upload.part_bytes).min(bytes.len());
                    write.wait_for_capacity(upload.concurrency).await?;
                    write.put(bytes.slice(offset..end));
                    offset = end;
                }
                write.finish().await?;
            }
            let secs = start.elapsed().as_secs_f64();
            // Free the space before the next round.
            for loc in [&source, &target] {
                let all: Vec<_> = loc.store().list(None).try_collect().await?;
                for meta in all {
                    loc.store().delete(&meta.location).await?;
                }
            }
            anyhow::Ok(secs)
        })?;
        plain_rates.push(mb / plain_secs);
        eprintln!(
            "round {repeat}: {mb:.0} MB in {} shards; writer {:.0} MB/s, plain upload {:.0} MB/s",
            summary.shards,
            mb / writer_secs,
            mb / plain_secs
        );
    }
    let (w, p) = (median(&mut writer_rates), median(&mut plain_rates));
    println!(
        "target={} total_mb={total_mb} shard_mb={shard_mb} repeats={repeats} fsync={fsync_local}: writer {w:.0} MB/s, plain object_store upload {p:.0} MB/s, ratio {:.0}%",
        if base.starts_with("s3://") { "s3-moto" } else { "local" },
        100.0 * w / p
    );
    Ok(())
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn start_moto(python: &str) -> anyhow::Result<(KillOnDrop, Vec<(String, String)>)> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let moto = std::path::Path::new(python).parent().context("python path has no directory")?.join("moto_server");
    let child = Command::new(&moto)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", moto.display()))?;
    let guard = KillOnDrop(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("moto_server did not start");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    write!(stream, "PUT /bench HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    if !response.starts_with("HTTP/1.1 200") {
        bail!("creating the bucket: {}", response.lines().next().unwrap_or_default());
    }
    let options = [
        ("aws_endpoint", format!("http://127.0.0.1:{port}")),
        ("aws_allow_http", "true".to_string()),
        ("aws_access_key_id", "bench".to_string()),
        ("aws_secret_access_key", "bench".to_string()),
        ("aws_region", "us-east-1".to_string()),
        ("aws_virtual_hosted_style_request", "false".to_string()),
    ];
    Ok((guard, options.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}
