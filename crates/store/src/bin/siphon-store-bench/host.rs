//! `host`: the host side of the output path alone. Batches shaped as the device hands them
//! (`hooks` × `[batch, seq, width]` in the stored dtype, each sequence's first token excluded as
//! a BOS is) are made once and pushed again and again (as a run reuses its pinned buffers), so the
//! clock runs over the writer's work only: taking the kept rows into shard columns, sealing
//! (statistics, CRC32C, header), and handing the bytes to the store. CPU time is the process's
//! (user + system, from /proc/self/stat); the convert and seal stages are their threads' busy
//! time, the rest (the uploads and the store's own work) is the difference.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use bytes::Bytes;
use object_store::path::Path;
use siphon_store::{
    BatchActivations, DType, HookActivations, HostId, RunDescriptor, ShardWriter, StoreConfig, StoreLocation,
};

use super::discard::Discard;
use super::upload::median;

pub const HELP: &str = "\
siphon-store-bench host: the writer alone, from host buffers, core-seconds per GB by stage

  --dtype LIST        stored dtypes: bf16, fp8, f32 (bf16)
  --store LIST        discard (bytes handed to a store that drops them: the writer's own cost),
                      memory (object_store's InMemory), or a directory (local disk, fsync-ed, with a
                      plain write of the same bytes beside it) (discard)
  --threads LIST      sealing threads (1,2,N with N the cores)
  --hooks N           hooks (4)
  --width N           elements per token of each hook (4096)
  --batch N --seq N   sequences per batch and tokens per sequence (32 x 1024)
  --gb N              activation gigabytes per round (4)
  --shard-mb N        shard size (256)
  --repeats N         rounds of every configuration, interleaved; medians reported (3)";

struct Options {
    dtypes: Vec<DType>,
    stores: Vec<String>,
    threads: Vec<usize>,
    hooks: usize,
    width: usize,
    batch: usize,
    seq: usize,
    gb: f64,
    shard_mb: u64,
    repeats: usize,
}

fn parse(args: Vec<String>) -> anyhow::Result<Options> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut o = Options {
        dtypes: vec![DType::Bf16],
        stores: vec!["discard".into()],
        threads: vec![1, 2, cores],
        hooks: 4,
        width: 4096,
        batch: 32,
        seq: 1024,
        gb: 4.0,
        shard_mb: 256,
        repeats: 3,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let value = args.next().with_context(|| format!("{arg} needs a value (see --help)"))?;
        let number = |v: &str| v.parse::<usize>().with_context(|| format!("{arg} {v:?}: not a whole number"));
        match arg.as_str() {
            "--dtype" => {
                o.dtypes = value
                    .split(',')
                    .map(|d| match d {
                        "bf16" => Ok(DType::Bf16),
                        "fp8" => Ok(DType::Fp8),
                        "f32" => Ok(DType::F32),
                        other => bail!("--dtype {other:?}: give bf16, fp8 or f32"),
                    })
                    .collect::<anyhow::Result<_>>()?
            }
            "--store" => o.stores = value.split(',').map(str::to_string).collect(),
            "--threads" => o.threads = value.split(',').map(number).collect::<anyhow::Result<_>>()?,
            "--hooks" => o.hooks = number(&value)?,
            "--width" => o.width = number(&value)?,
            "--batch" => o.batch = number(&value)?,
            "--seq" => o.seq = number(&value)?,
            "--gb" => o.gb = value.parse().with_context(|| format!("--gb {value:?}"))?,
            "--shard-mb" => o.shard_mb = number(&value)? as u64,
            "--repeats" => o.repeats = number(&value)?,
            other => bail!("unexpected argument {other:?} (see --help)"),
        }
    }
    if o.threads.contains(&0) || o.hooks == 0 || o.width == 0 || o.batch == 0 || o.seq < 2 || o.repeats == 0 {
        bail!("--threads, --hooks, --width, --batch and --repeats must be > 0 and --seq > 1");
    }
    Ok(o)
}

/// One configuration's measurements per round.
#[derive(Default)]
struct Rounds {
    wall: Vec<f64>,
    cpu: Vec<f64>,
    convert: Vec<f64>,
    seal: Vec<f64>,
    plain: Vec<f64>,
}

pub fn run(args: Vec<String>) -> anyhow::Result<()> {
    let o = parse(args)?;
    let mut configs: Vec<(DType, String, usize)> = Vec::new();
    for &dtype in &o.dtypes {
        for store in &o.stores {
            configs.extend(o.threads.iter().map(|&threads| (dtype, store.clone(), threads)));
        }
    }
    let mut templates = std::collections::HashMap::new();
    for &dtype in &o.dtypes {
        templates.insert(dtype.name(), template(&o, dtype));
    }
    let batch_bytes: usize = templates.values().next().expect("a dtype").hooks.iter().map(|h| h.data.len()).sum();
    eprintln!(
        "{} hooks x {} wide, batches of {} x {}; {:.2} GB per round",
        o.hooks,
        o.width,
        o.batch,
        o.seq,
        o.gb.max(batch_bytes as f64 / 1e9)
    );
    let mut results: Vec<Rounds> = configs.iter().map(|_| Rounds::default()).collect();
    for repeat in 0..o.repeats {
        for ((dtype, store, threads), rounds) in configs.iter().zip(&mut results) {
            let template = &templates[dtype.name()];
            round(&o, template, store, *threads, repeat, rounds)?;
        }
    }
    println!(
        "{:<5} {:<8} {:>7} | {:>6} {:>7} | {:>8} {:>8} {:>8} {:>8} | {:>10}",
        "dtype", "store", "threads", "GB/s", "per core", "convert", "seal", "hand-off", "total", "plain GB/s"
    );
    println!("{:<22} | {:>16} | {:^35} |", "", "(wall)", "core-seconds per GB");
    for ((dtype, store, threads), r) in configs.iter().zip(&mut results) {
        let (wall, cpu, convert, seal) =
            (median(&mut r.wall), median(&mut r.cpu), median(&mut r.convert), median(&mut r.seal));
        let plain = if r.plain.is_empty() { "-".to_string() } else { format!("{:.2}", median(&mut r.plain)) };
        let store = if ["discard", "memory"].contains(&store.as_str()) { store.as_str() } else { "disk" };
        println!(
            "{:<5} {:<8} {:>7} | {:>6.2} {:>7.2} | {:>8.3} {:>8.3} {:>8.3} {:>8.3} | {:>10}",
            dtype.name(),
            store,
            threads,
            1.0 / wall,
            1.0 / cpu,
            convert,
            seal,
            (cpu - convert - seal).max(0.0),
            cpu,
            plain
        );
    }
    Ok(())
}

/// Batches pushed (and committed) before the clock starts, besides one per sealing thread: more
/// than the shards a writer holds at once (one building, the sealing ones, one waiting, two
/// uploading).
const WARMUP_SHARDS: u64 = 6;

/// One round: a fresh run, every batch pushed, finished; seconds per GB into `rounds`.
fn round(
    o: &Options,
    template: &BatchActivations,
    store: &str,
    threads: usize,
    repeat: usize,
    rounds: &mut Rounds,
) -> anyhow::Result<()> {
    let batch_bytes: usize = template.hooks.iter().map(|h| h.data.len()).sum();
    let n_batches = ((o.gb * 1e9) / batch_bytes as f64).ceil().max(1.0) as u64;
    let run = format!("bench-{repeat}-{threads}");
    let mut config = StoreConfig::new(store, run.clone(), HostId { machine: 0, host: 0 });
    config.format.dtype = template.hooks[0].dtype;
    config.format.target_shard_bytes = o.shard_mb << 20;
    config.sealers = threads;
    let descriptor = RunDescriptor {
        hooks: template.hooks.iter().map(|h| h.hook.clone()).collect(),
        hook_shapes: template.hooks.iter().map(|h| h.shape.clone()).collect(),
        ..Default::default()
    };
    let writer = match store {
        "discard" => ShardWriter::open_at(
            StoreLocation::from_store(Arc::new(Discard::default()), Path::from("bench"), "discard://bench"),
            config,
            descriptor,
        )?,
        "memory" => ShardWriter::open_at(
            StoreLocation::from_store(
                Arc::new(object_store::memory::InMemory::new()),
                Path::from("bench"),
                "memory://",
            ),
            config,
            descriptor,
        )?,
        _ => ShardWriter::open(config, descriptor)?,
    };
    // Warm-up: the first shards' columns are new memory whose pages fault in on first touch;
    // a run reuses them from then on (for hours), so the clock starts once they are reused.
    let warmup = WARMUP_SHARDS + threads as u64;
    let mut writer = writer;
    let push = |writer: &mut ShardWriter, k: u64| {
        let mut batch = template.clone();
        batch.first_sample = k * o.batch as u64;
        batch.data_position_after = serde_json::json!({ "batch": k + 1 });
        writer.push(batch)
    };
    for k in 0..warmup {
        push(&mut writer, k)?;
    }
    // Until every warm-up shard is committed and its columns are back for reuse.
    while (writer.timing().upload_bytes as f64) < 0.99 * (warmup * batch_bytes as u64) as f64 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (before, cpu_start, start) = (writer.timing(), cpu_seconds()?, Instant::now());
    for k in warmup..warmup + n_batches {
        push(&mut writer, k)?;
    }
    let summary = writer.finish()?;
    let (wall, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds()? - cpu_start);
    let gb = (summary.timing.convert_bytes - before.convert_bytes) as f64 / 1e9;
    rounds.wall.push(wall / gb);
    rounds.cpu.push(cpu / gb);
    rounds.convert.push((summary.timing.convert_s - before.convert_s) / gb);
    rounds.seal.push((summary.timing.seal_s - before.seal_s) / gb);
    if !["discard", "memory"].contains(&store) {
        let dir = std::path::Path::new(store).join(&run);
        rounds.plain.push(plain_write(&dir.join("plain"), summary.bytes)?);
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// Writes `bytes` bytes as 256 MiB files with a plain `write` and `fsync` each: the disk's own
/// speed, beside the writer's. GB/s.
fn plain_write(dir: &std::path::Path, bytes: u64) -> anyhow::Result<f64> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let buffer = vec![0x5au8; 256 << 20];
    let start = Instant::now();
    let mut left = bytes;
    for n in 0.. {
        if left == 0 {
            break;
        }
        let len = left.min(buffer.len() as u64) as usize;
        let mut file = std::fs::File::create(dir.join(format!("plain_{n:06}")))?;
        file.write_all(&buffer[..len])?;
        file.sync_all()?;
        left -= len as u64;
    }
    Ok(bytes as f64 / 1e9 / start.elapsed().as_secs_f64())
}

/// The process's CPU time so far (user + system), from /proc/self/stat.
fn cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat (Linux only)")?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').context("/proc/self/stat")?.1.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// One batch as the device hands it: every hook's rows in `dtype`, values spread like
/// activations (fp8 rows: a scale, then e4m3 bytes), each sequence's first token excluded.
fn template(o: &Options, dtype: DType) -> BatchActivations {
    let tokens = o.batch * o.seq;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let hooks = (0..o.hooks)
        .map(|h| {
            let mut data = Vec::with_capacity(tokens * dtype.row_bytes(o.width));
            for _ in 0..tokens {
                if dtype == DType::Fp8 {
                    data.extend_from_slice(&(1.0f32 / 64.0).to_le_bytes());
                }
                for _ in 0..o.width {
                    let r = next();
                    let v = ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0;
                    match dtype {
                        DType::Bf16 => data.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
                        DType::F32 => data.extend_from_slice(&v.to_le_bytes()),
                        // Any byte but the two NaNs (0x7f, 0xff).
                        _ => data.push(if r as u8 & 0x7f == 0x7f { 0x38 } else { r as u8 }),
                    }
                }
            }
            HookActivations {
                hook: format!("blocks.{h}.hook_resid_post"),
                dtype,
                shape: vec![o.width],
                data: Bytes::from(data),
            }
        })
        .collect();
    BatchActivations {
        first_sample: 0,
        batch: o.batch,
        seq: o.seq,
        hooks,
        latents: Vec::new(),
        outputs: Vec::new(),
        token_ids: (0..tokens as i32).collect(),
        doc_index: (0..tokens).map(|t| (t / o.seq) as i64).collect(),
        position: (0..tokens).map(|t| (t % o.seq) as i32).collect(),
        keep: (0..tokens).map(|t| t % o.seq != 0).collect(),
        roles: None,
        pooled: None,
        documents: Vec::new(),
        data_position_after: serde_json::Value::Null,
    }
}
