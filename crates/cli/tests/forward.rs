//! `siphon forward` end to end on the tiny llama fixture: output file layout, values against
//! HF's golden activations, and clean failures on bad input.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// (header JSON, data) of a safetensors file.
fn read_safetensors(path: &Path) -> (serde_json::Value, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, bytes[8 + n..].to_vec())
}

fn tensor_f32(header: &serde_json::Value, data: &[u8], name: &str) -> (Vec<usize>, Vec<f32>) {
    let t = &header[name];
    assert_eq!(t["dtype"], "F32", "{name}");
    let shape = t["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let (a, b) = (t["data_offsets"][0].as_u64().unwrap() as usize, t["data_offsets"][1].as_u64().unwrap() as usize);
    let values = data[a..b].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    (shape, values)
}

/// The golden's first row of `input_ids` (unpadded in every golden) written as `--ids` JSON in
/// `dir`, and its length.
fn first_row(header: &serde_json::Value, data: &[u8], dir: &Path) -> (PathBuf, usize) {
    let t = &header["input_ids"];
    let (a, b) = (t["data_offsets"][0].as_u64().unwrap() as usize, t["data_offsets"][1].as_u64().unwrap() as usize);
    let ids: Vec<i32> = data[a..b].chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
    let seq = t["shape"][1].as_u64().unwrap() as usize;
    let file = dir.join("ids.json");
    std::fs::write(&file, serde_json::to_string(&vec![ids[..seq].to_vec()]).unwrap()).unwrap();
    (file, seq)
}

/// A scratch directory removed on drop (the cli crate has no tempfile dev-dependency).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("siphon-forward-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn siphon(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_siphon")).args(args).env("TF_CPP_MIN_LOG_LEVEL", "2").output().unwrap()
}

#[test]
fn forward_writes_hooks_matching_hf() {
    let model = repo().join("fixtures/models/tiny-llama");
    let (golden_header, golden_data) = read_safetensors(&model.join("golden-right.safetensors"));
    // Row 0 of the right-padded golden batch is unpadded: run it alone.
    let (_, ids) = {
        let t = &golden_header["input_ids"];
        let (a, b) = (t["data_offsets"][0].as_u64().unwrap() as usize, t["data_offsets"][1].as_u64().unwrap() as usize);
        let ids: Vec<i32> =
            golden_data[a..b].chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
        ((), ids)
    };
    let seq = golden_header["input_ids"]["shape"][1].as_u64().unwrap() as usize;
    let tmp = Scratch::new("ok");
    let ids_file = tmp.path().join("ids.json");
    std::fs::write(&ids_file, serde_json::to_string(&vec![ids[..seq].to_vec()]).unwrap()).unwrap();
    let out = tmp.path().join("acts.safetensors");
    // HF's hidden states, and a per-head hook (patterns and aliases as --hooks takes them).
    let hooks = "blocks.0.hook_attn_out,blocks.2.hook_resid_post,ln_final.hook_out";
    let all = format!("{hooks},blocks.{{1,2}}.attn.o.hook_in");
    let o = siphon(&[
        "forward",
        "--model",
        model.to_str().unwrap(),
        "--ids",
        ids_file.to_str().unwrap(),
        "--hooks",
        &all,
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("ln_final.hook_out: f32[1, 8, 64]"), "{stdout}");
    let (header, data) = read_safetensors(&out);
    for layer in [1, 2] {
        // Stored under the TransformerLens name, [batch, seq, heads, d_head].
        let (shape, _) = tensor_f32(&header, &data, &format!("blocks.{layer}.attn.hook_z"));
        assert_eq!(shape, vec![1, seq, 4, 16]);
    }
    for hook in hooks.split(',') {
        let (shape, got) = tensor_f32(&header, &data, hook);
        assert_eq!(shape, vec![1, seq, 64], "{hook}");
        let (_, want) = tensor_f32(&golden_header, &golden_data, hook);
        let diff = got.iter().zip(&want[..seq * 64]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff <= 1e-4, "{hook}: {diff:e}");
    }
    assert!(header["__metadata__"]["token_ids"].as_str().unwrap().starts_with("[["));
}

#[test]
fn forward_rejects_bad_input_without_writing() {
    let model = repo().join("fixtures/models/tiny-llama");
    let tmp = Scratch::new("bad");
    let ids_file = tmp.path().join("ids.json");
    let out = tmp.path().join("acts.safetensors");
    let cases: [(&str, &str, &str); 4] = [
        ("[[1,2,3],[4,5]]", "blocks.0.hook_resid_post", "row 1 has 2 ids"),
        ("[[1,2,3]]", "blocks.7.hook_resid_post", "out of range"),
        ("{\"a\": 1}", "blocks.0.hook_resid_post", "list of lists"),
        ("[[1,2,3]]", "blocks.0.hook_resid_post", "no tokenizer"),
    ];
    for (i, (ids, hooks, want)) in cases.iter().enumerate() {
        std::fs::write(&ids_file, ids).unwrap();
        let input = if i == 3 { ["--text", "hello"] } else { ["--ids", ids_file.to_str().unwrap()] };
        let o = siphon(&[
            "forward",
            "--model",
            model.to_str().unwrap(),
            input[0],
            input[1],
            "--hooks",
            hooks,
            "--out",
            out.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "case {i} succeeded");
        assert!(stderr.contains(want), "case {i}: {stderr}");
        assert!(!out.exists(), "case {i} left an output file");
    }
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1, "only ids.json remains");
}

/// `--outputs`: the model's next-token outputs beside the hooks, each under its name, equal to
/// HF's (`golden-next-token.safetensors`: log-softmax of its logits in f64) on the golden's first row,
/// whose last token has no next (NaN); a bad list is refused naming it, before any work.
#[test]
fn forward_writes_next_token_outputs_matching_hf() {
    let model = repo().join("fixtures/models/tiny-gemma2");
    let (golden_header, golden_data) = read_safetensors(&model.join("golden-next-token.safetensors"));
    let tmp = Scratch::new("outputs");
    let (ids_file, seq) = first_row(&golden_header, &golden_data, tmp.path());
    let out = tmp.path().join("next.safetensors");
    let run = |outputs: &str| {
        let (model, ids) = (model.to_str().unwrap(), ids_file.to_str().unwrap());
        siphon(&["forward", "--model", model, "--ids", ids, "--outputs", outputs, "--out", out.to_str().unwrap()])
    };
    let o = run("nll,entropy,topk=3");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    let (header, data) = read_safetensors(&out);
    let (shape, nll) = tensor_f32(&header, &data, "output.nll");
    assert_eq!(shape, vec![1, seq]);
    let (_, want) = tensor_f32(&golden_header, &golden_data, "output.nll");
    for p in 0..seq - 1 {
        assert!((nll[p] - want[p]).abs() <= 1e-4 * want[p].abs().max(1.0), "position {p}: {} {}", nll[p], want[p]);
    }
    assert!(nll[seq - 1].is_nan(), "the row's last token has no next");
    let (shape, _) = tensor_f32(&header, &data, "output.topk_logprobs");
    assert_eq!(shape, vec![1, seq, 3]);
    assert_eq!(header["output.topk_ids"]["dtype"], "I32");
    assert!(header.get("output.entropy").is_some());
    std::fs::remove_file(&out).unwrap();
    for (bad, named) in [("topk=0", "topk=0 is not a count"), ("logits", "\"logits\" is not an output")] {
        let o = run(bad);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--outputs") && stderr.contains(named), "{bad}: {stderr}");
        assert!(!out.exists());
    }
}

/// `--steer`: two vectors (one read with a scale) added where HF's forward hooks add them give
/// HF's final norm output (`golden-steered.safetensors`); a hook that is not steered is refused by name.
#[test]
fn forward_steers_as_hfs_forward_hooks() {
    let model = repo().join("fixtures/models/tiny-llama");
    let (golden_header, golden_data) = read_safetensors(&model.join("golden-steered.safetensors"));
    let tmp = Scratch::new("steer");
    let (ids_file, seq) = first_row(&golden_header, &golden_data, tmp.path());
    // Each vector in its own one-tensor file; the first halved, read back with scale 2.
    let mut steer = Vec::new();
    for (hook, scale) in [("blocks.1.hook_resid_pre", 2.0f32), ("blocks.2.hook_resid_post", 1.0)] {
        let (_, v) = tensor_f32(&golden_header, &golden_data, &format!("steer.{hook}"));
        let data: Vec<u8> = v.iter().flat_map(|x| (x / scale).to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![v.len()], &data).unwrap();
        let file = tmp.path().join(format!("{hook}.safetensors"));
        std::fs::write(&file, safetensors::serialize([("v", view)], None).unwrap()).unwrap();
        steer.push(format!("{hook}={}:{scale}", file.display()));
    }
    let out = tmp.path().join("acts.safetensors");
    let run = |steer: &[String]| {
        let (model, ids) = (model.to_str().unwrap(), ids_file.to_str().unwrap());
        let mut args = vec!["forward", "--model", model, "--ids", ids, "--hooks", "ln_final.hook_out"];
        args.extend(steer.iter().flat_map(|s| ["--steer", s.as_str()]));
        args.extend(["--out", out.to_str().unwrap()]);
        siphon(&args)
    };
    let o = run(&steer);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (header, data) = read_safetensors(&out);
    let (_, got) = tensor_f32(&header, &data, "ln_final.hook_out");
    let (_, want) = tensor_f32(&golden_header, &golden_data, "ln_final.hook_out");
    let diff = got.iter().zip(&want[..seq * 64]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff <= 1e-4, "ln_final.hook_out steered: {diff:e}");
    std::fs::remove_file(&out).unwrap();
    let file = steer[1].split_once('=').unwrap().1.to_string();
    for (bad, named) in [
        (format!("blocks.0.attn.hook_z={file}"), "steering at blocks.0.attn.hook_z"),
        ("blocks.0.hook_resid_pre".to_string(), "expected HOOK=FILE"),
        (format!("blocks.*.hook_resid_pre={file}"), "one expected"),
    ] {
        let o = run(std::slice::from_ref(&bad));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && stderr.contains(named), "{bad}: {stderr}");
        assert!(!out.exists());
    }
}

/// The command of issue 36: one Gemma 4 block's residual alone (its per-layer inputs read a
/// norm outside the blocks) equals that hook in the run of every block's residual and the
/// final norm.
#[test]
fn forward_writes_one_gemma4_block_alone() {
    let model = repo().join("fixtures/models/tiny-gemma4");
    let tmp = Scratch::new("gemma4");
    let ids_file = tmp.path().join("ids.json");
    std::fs::write(&ids_file, "[[2, 17, 33, 101, 7, 64]]").unwrap();
    let hook = "blocks.1.hook_resid_post";
    let mut outputs = Vec::new();
    for (name, hooks) in [("alone", hook), ("all", "blocks.*.hook_resid_post,ln_final.hook_out")] {
        let out = tmp.path().join(format!("{name}.safetensors"));
        let o = siphon(&[
            "forward",
            "--model",
            model.to_str().unwrap(),
            "--ids",
            ids_file.to_str().unwrap(),
            "--hooks",
            hooks,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        let (header, data) = read_safetensors(&out);
        outputs.push(tensor_f32(&header, &data, hook));
    }
    let ((shape, alone), (_, all)) = (&outputs[0], &outputs[1]);
    assert_eq!(shape[..2], [1, 6]);
    let diff = alone.iter().zip(all).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let scale = all.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(scale > 0.1 && diff <= 1e-6 * scale, "{hook} alone differs by {diff:e} (scale {scale})");
}

/// `--sae`: dictionaries saved by SAELens (and Gemma Scope's file) read on the devices from the
/// hooks they name; each token's latents equal the library's on TransformerLens's values of
/// the same tokens (the fixtures' goldens), two dictionaries on one hook told apart by name; a
/// token firing more latents than `--latent-cap` fails the run, writing nothing.
#[test]
fn forward_writes_dictionary_latents_matching_the_librarys() {
    let model = repo().join("fixtures/models/tiny-llama");
    let (tl_header, tl_data) = read_safetensors(&model.join("golden-tl.safetensors"));
    let t = &tl_header["input_ids"];
    let (a, b) = (t["data_offsets"][0].as_u64().unwrap() as usize, t["data_offsets"][1].as_u64().unwrap() as usize);
    let width = if t["dtype"] == "I64" { 8 } else { 4 };
    let ids: Vec<i64> = tl_data[a..b]
        .chunks_exact(width)
        .map(|c| {
            if width == 8 {
                i64::from_le_bytes(c.try_into().unwrap())
            } else {
                i32::from_le_bytes(c.try_into().unwrap()) as i64
            }
        })
        .collect();
    let seq = t["shape"][1].as_u64().unwrap() as usize;
    // Row 0 of TransformerLens's batch has no padding: its tokens are the goldens' first rows.
    let tmp = Scratch::new("sae");
    let ids_file = tmp.path().join("ids.json");
    std::fs::write(&ids_file, serde_json::to_string(&vec![ids[..seq].to_vec()]).unwrap()).unwrap();
    let dicts = repo().join("fixtures/dictionaries");
    let topk = dicts.join("saelens-topk");
    let gemma = dicts.join("gemma-scope-2b-pt-res/layer_1/width_16k/average_l0_7");
    let transcoder = dicts.join("saelens-transcoder");
    let out = tmp.path().join("latents.safetensors");
    let sae = format!("{},{},{}", topk.display(), gemma.display(), transcoder.display());
    let o = siphon(&[
        "forward",
        "--model",
        model.to_str().unwrap(),
        "--ids",
        ids_file.to_str().unwrap(),
        "--sae",
        &sae,
        "--latent-cap",
        "96",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (header, data) = read_safetensors(&out);
    for (dir, name, cap) in [
        // A TopK keeps its k (6), whatever the larger cap.
        (&topk, "blocks.1.hook_resid_post.hook_sae_acts_post.saelens-topk", 6),
        (&gemma, "blocks.1.hook_resid_post.hook_sae_acts_post.layer_1_width_16k_average_l0_7", 96),
        (&transcoder, "blocks.1.ln2.hook_normalized.hook_sae_acts_post", 96),
    ] {
        let (golden_header, golden_data) = read_safetensors(&dir.join("golden.safetensors"));
        let (shape, want) = tensor_f32(&golden_header, &golden_data, "latents");
        let n = shape[1];
        let (got_shape, values) = tensor_f32(&header, &data, &format!("{name}.values"));
        assert_eq!(got_shape, [1, seq, cap], "{name}");
        let index = &header[format!("{name}.indices")];
        assert_eq!(index["dtype"], "I32", "{name}");
        let (a, b) =
            (index["data_offsets"][0].as_u64().unwrap() as usize, index["data_offsets"][1].as_u64().unwrap() as usize);
        let indices: Vec<i32> = data[a..b].chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for token in 0..seq {
            let mut dense = vec![0f32; n];
            for j in 0..cap {
                if indices[token * cap + j] >= 0 {
                    dense[indices[token * cap + j] as usize] = values[token * cap + j];
                }
            }
            for (latent, (g, w)) in dense.iter().zip(&want[token * n..][..n]).enumerate() {
                assert!((g - w).abs() <= 1e-4 * scale, "{name} token {token} latent {latent}: {g} vs {w}");
                assert_eq!(*g > 0.0, *w > 0.0, "{name} token {token} latent {latent}");
            }
        }
    }

    // A cap below some token's firings: an error naming the dictionary, and no file; a
    // dictionary of another hook's width; a path that holds none.
    let refused = tmp.path().join("refused.safetensors");
    let fails = |sae: &str, cap: &str| {
        let o = siphon(&[
            "forward",
            "--model",
            model.to_str().unwrap(),
            "--ids",
            ids_file.to_str().unwrap(),
            "--sae",
            sae,
            "--latent-cap",
            cap,
            "--out",
            refused.to_str().unwrap(),
        ]);
        assert!(!o.status.success() && !refused.exists(), "{sae}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = fails(dicts.join("saelens-standard").to_str().unwrap(), "3");
    assert!(err.contains("saelens-standard") && err.contains("more than the 3 kept"), "{err}");
    let err = fails(&format!("{}@blocks.1.ln1.hook_scale", gemma.display()), "96");
    assert!(err.contains("reads 64 values a token, blocks.1.ln1.hook_scale has 1"), "{err}");
    let err = fails("/nonexistent/sae", "96");
    assert!(err.contains("not a dictionary siphon reads"), "{err}");
}

/// `--sae hf://OWNER/NAME[@REVISION]/PATH`: a dictionary's files fetched from a Hub endpoint
/// (`HF_ENDPOINT`, a server of the Hub's layout on 127.0.0.1) once into siphon's cache, under
/// the repository's own path — so Gemma Scope's hook comes from its layout there as on disk —
/// and the same latents as from the directory itself; a path with no dictionary is named.
#[test]
fn forward_reads_dictionaries_from_the_hub() {
    let model = repo().join("fixtures/models/tiny-llama");
    let tmp = Scratch::new("hub");
    let ids_file = tmp.path().join("ids.json");
    std::fs::write(&ids_file, "[[115, 114, 45, 118, 79, 223, 139, 149]]").unwrap();
    let dicts = repo().join("fixtures/dictionaries");
    let served = tmp.path().join("hub");
    let copy = |from: &Path, to: &Path, files: &[&str]| {
        for f in files {
            std::fs::create_dir_all(to.join(f).parent().unwrap()).unwrap();
            std::fs::copy(from.join(f), to.join(f)).unwrap();
        }
    };
    let gemma = "layer_1/width_16k/average_l0_7";
    copy(
        &dicts.join("gemma-scope-2b-pt-res").join(gemma),
        &served.join("google/gemma-scope-2b-pt-res/resolve/main").join(gemma),
        &["params.npz"],
    );
    copy(
        &dicts.join("saelens-topk"),
        &served.join("org/saes/resolve/v1/topk"),
        &["cfg.json", "sae_weights.safetensors"],
    );
    copy(
        &dicts.join("llama-scope/tiny-llama-L1R"),
        &served.join("fnlp/llama-scope/resolve/main/L1R"),
        &["hyperparams.json", "checkpoints/final.safetensors"],
    );
    let (_server, port) = common::python_server(|port| {
        let mut args: Vec<std::ffi::OsString> =
            ["-m", "http.server", "--bind", "127.0.0.1", &port.to_string(), "--directory"].map(Into::into).to_vec();
        args.push(served.clone().into());
        args
    });
    let cache = tmp.path().join("cache");
    let run = |sae: &str, out: &Path| {
        Command::new(env!("CARGO_BIN_EXE_siphon"))
            .args(["forward", "--model", model.to_str().unwrap(), "--ids", ids_file.to_str().unwrap(), "--sae", sae])
            .args(["--out", out.to_str().unwrap()])
            .env("TF_CPP_MIN_LOG_LEVEL", "2")
            .env("HF_ENDPOINT", format!("http://127.0.0.1:{port}"))
            .env("SIPHON_CACHE_DIR", &cache)
            .output()
            .unwrap()
    };
    let (hub, local) = (tmp.path().join("hub.safetensors"), tmp.path().join("local.safetensors"));
    // Llama Scope's by a bare Hub id (no such directory here).
    let from_hub = format!("hf://google/gemma-scope-2b-pt-res/{gemma},hf://org/saes@v1/topk,fnlp/llama-scope/L1R");
    let o = run(&from_hub, &hub);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let on_disk = format!(
        "{},{},{}",
        dicts.join("gemma-scope-2b-pt-res").join(gemma).display(),
        dicts.join("saelens-topk").display(),
        dicts.join("llama-scope/tiny-llama-L1R").display()
    );
    let o = run(&on_disk, &local);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ((hub_header, hub_data), (local_header, local_data)) = (read_safetensors(&hub), read_safetensors(&local));
    let tensors = |h: &serde_json::Value| {
        let mut names: Vec<String> = h.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect();
        names.sort();
        names
    };
    // Two dictionaries on one hook: told apart by their names (the Hub copy's own).
    assert_eq!(tensors(&hub_header).len(), 9, "{hub_header}");
    assert!(tensors(&hub_header).iter().any(|n| n.starts_with("blocks.1.hook_resid_post.hook_sae_acts_post.")));
    let bytes = |h: &serde_json::Value, d: &[u8]| -> Vec<Vec<u8>> {
        let mut all: Vec<(String, Vec<u8>)> = tensors(h)
            .into_iter()
            .map(|n| {
                let (a, b) = (
                    h[&n]["data_offsets"][0].as_u64().unwrap() as usize,
                    h[&n]["data_offsets"][1].as_u64().unwrap() as usize,
                );
                (n.rsplit('.').next().unwrap().to_string() + &h[&n]["shape"].to_string(), d[a..b].to_vec())
            })
            .collect();
        all.sort();
        all.into_iter().map(|(_, b)| b).collect()
    };
    assert_eq!(
        bytes(&hub_header, &hub_data),
        bytes(&local_header, &local_data),
        "the Hub's copy gives the same latents"
    );
    assert!(cache.join("models/hf___google_gemma-scope-2b-pt-res_main").join(gemma).join("params.npz").is_file());

    let o = run("hf://org/saes@v1/missing", &tmp.path().join("none.safetensors"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("neither cfg.json") && err.contains("hf://org/saes@v1/missing"),
        "{err}"
    );
    let o = run("org/saes@v1/missing", &tmp.path().join("none.safetensors"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("org/saes@v1/missing is no directory here, so it was read as a Hub id"),
        "{err}"
    );
}
