//! Forward-pass benchmark server, driven by `scripts/bench/bench_forward.py` (run through
//! `scripts/bench-forward.sh`), which interleaves it with Hugging Face transformers on the
//! same weights and input.
//!
//! `bench_forward DIR [--hooks all|last] [--dtype f32|bf16]` reads `DIR/config.json`,
//! `DIR/model.safetensors` and `DIR/input_ids.bin` (i32, `[batch, seq]` with `batch` and
//! `seq` in `DIR/input_shape.txt`), builds and compiles the forward on the located PJRT
//! plugin (the CPU plugin, or CUDA's on a GPU machine), uploads the weights, prints
//! `ready compile_s=… pinned=…`, then answers each stdin line `run` with `ms=… device_ms=…
//! host_ms=…`: the whole step, the program until every output is ready on the device, and
//! the copy of every output to the host — in the compute dtype (a bf16 program returns bf16,
//! as HF's side does), into host buffers allocated once and reused (pinned for DMA where the
//! plugin allows), as `siphon extract` copies them. `dump PATH` writes the last output (f32,
//! row-major) to PATH. `SIPHON_BENCH_MEMORY_FRACTION` sets the share of a GPU's memory XLA
//! takes.

use std::io::{BufRead, Write};
use std::time::Instant;

use siphon_hlo::DType;
use siphon_models::{ForwardSpec, HfConfig, HookKind, HookPoint, build_forward};
use siphon_runtime::{
    Client, ClientOptions, CompileOptions, ElementType, HostArray, OptionValue, Plugin, PluginLocator,
};

/// The runtime's element type of an output dtype (f32 or bf16 here).
fn element_type(dtype: DType) -> ElementType {
    if dtype == DType::BF16 { ElementType::BF16 } else { ElementType::F32 }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir =
        std::path::PathBuf::from(args.get(1).ok_or("usage: bench_forward DIR [--hooks all|last] [--dtype f32|bf16]")?);
    let opt = |name: &str, default: &str| -> String {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_else(|| default.to_string())
    };
    let hooks_kind = opt("--hooks", "all");
    let dtype = DType::parse(&opt("--dtype", "f32")).ok_or("--dtype must be f32 or bf16")?;

    let config = HfConfig::from_json(&std::fs::read_to_string(dir.join("config.json"))?)?.into_config()?;
    let shape_text = std::fs::read_to_string(dir.join("input_shape.txt"))?;
    let shape: Vec<usize> = shape_text.split_whitespace().map(|t| t.parse()).collect::<Result<_, _>>()?;
    let (batch, seq) = (shape[0], shape[1]);
    let ids: Vec<i32> = std::fs::read(dir.join("input_ids.bin"))?
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    if ids.len() != batch * seq {
        return Err(format!("input_ids.bin holds {} ids, input_shape.txt says {batch}x{seq}", ids.len()).into());
    }

    // Like HF output_hidden_states: the embeddings and every block's input, plus the final
    // norm (25 tensors for 24 layers); `last` returns only the final norm.
    let hooks: Vec<HookPoint> = match hooks_kind.as_str() {
        "all" => (0..config.n_layers)
            .map(|l| HookPoint::block(l, HookKind::ResidPre))
            .chain([HookPoint::model(HookKind::LnFinalOut)])
            .collect(),
        "last" => vec![HookPoint::model(HookKind::LnFinalOut)],
        other => return Err(format!("--hooks {other:?}: use all or last").into()),
    };
    let plugin = Plugin::load(&PluginLocator::new().locate()?.path)?;
    let mut options = ClientOptions::new().cpu_device_count(1);
    // On a GPU shared with the peer in the same run, the share of its memory XLA takes.
    if let Ok(fraction) = std::env::var("SIPHON_BENCH_MEMORY_FRACTION") {
        options = options.option("memory_fraction", OptionValue::Float(fraction.parse()?));
    }
    let client = Client::new(&plugin, options)?;

    let mut spec = ForwardSpec::new(batch, seq, hooks);
    spec.compute_dtype = dtype;
    spec.output_dtype = dtype;
    spec.cpu_kernels = client.cpu_kernels();
    // A mixture's experts as cuBLAS's grouped products on a CUDA plugin, unless
    // SIPHON_CUDA_KERNELS=0 (XLA's expert loop, to compare the two).
    spec.grouped_experts = client.cuda_kernels();
    // Full rows: cuDNN's fused attention where a block takes it, on a CUDA plugin, unless
    // SIPHON_BENCH_XLA_ATTENTION is set (XLA's form, to compare the two).
    spec.cudnn_attention = client.platform_name() == "cuda" && std::env::var_os("SIPHON_BENCH_XLA_ATTENTION").is_none();
    // The MLP over the sequence in chunks on a CUDA plugin, as `siphon extract` runs it.
    spec.mlp_chunk = (client.platform_name() == "cuda").then_some(siphon_models::MLP_CHUNK_ELEMENTS);
    let program = build_forward(&config, &spec)?;
    if spec.cudnn_attention {
        eprintln!("attention: {}", siphon_models::cudnn::summary(&program.attention));
    }
    if let Ok(path) = std::env::var("SIPHON_BENCH_DUMP_HLO") {
        std::fs::write(path, &program.text)?;
    }
    let t0 = Instant::now();
    let exe = client.compile(&program.text, &CompileOptions::single_device(None))?;
    let compile_s = t0.elapsed().as_secs_f64();
    let device = exe.device_ids()[0];

    // The loader cuts fused tensors and transposes Conv1D ones as the program wants them.
    let model = siphon_models::LoadedModel::open(&dir)?;
    let mut buffers = Vec::new();
    for p in &program.params {
        let values = model.weights.load(p, siphon_models::DType::F32)?.to_f32_vec();
        let array = match dtype {
            DType::BF16 => {
                let v: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
                HostArray::from_slice(&p.shape, &v)?
            }
            _ => HostArray::from_slice(&p.shape, &values)?,
        };
        buffers.push(client.upload(&array, device)?);
    }
    let mask = vec![1i32; batch * seq];
    let pos: Vec<i32> = (0..batch).flat_map(|_| 0..seq as i32).collect();
    for data in [&ids, &mask, &pos] {
        buffers.push(client.upload(&HostArray::from_slice(&[batch, seq], data)?, device)?);
    }
    let mut hosts = program
        .outputs
        .iter()
        .map(|o| client.host_buffer(o.shape.iter().product::<usize>() * o.dtype.byte_size()))
        .collect::<Result<Vec<_>, _>>()?;
    let pinned = hosts.iter().all(|h| h.is_pinned());
    println!("ready compile_s={compile_s:.3} outputs={} pinned={pinned}", program.outputs.len());
    std::io::stdout().flush()?;

    let mut ran = false;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        match words.next() {
            Some("run") => {
                let t = Instant::now();
                let outs = exe.execute(&[buffers.iter().collect()])?;
                for out in &outs[0] {
                    out.wait_ready()?;
                }
                let device_ms = t.elapsed().as_secs_f64() * 1e3;
                let copies = outs[0]
                    .iter()
                    .zip(hosts.iter_mut())
                    .map(|(out, host)| out.to_host_into(host.as_mut_slice()))
                    .collect::<Result<Vec<_>, _>>()?;
                for copy in copies {
                    copy.wait()?;
                }
                let ms = t.elapsed().as_secs_f64() * 1e3;
                ran = true;
                println!("ms={ms:.2} device_ms={device_ms:.2} host_ms={:.2}", ms - device_ms);
            }
            Some("dump") => {
                let path = words.next().ok_or("dump needs a path")?;
                let (last, info) = hosts.last().zip(program.outputs.last()).filter(|_| ran).ok_or("dump before run")?;
                let array = HostArray::from_bytes(element_type(info.dtype), &info.shape, last.as_slice().to_vec())?;
                let bytes: Vec<u8> = array.to_f32().iter().flat_map(|v| v.to_le_bytes()).collect();
                std::fs::write(path, bytes)?;
                println!("dumped");
            }
            Some("quit") | None => break,
            Some(other) => println!("error unknown command {other}"),
        }
        std::io::stdout().flush()?;
    }
    Ok(())
}
