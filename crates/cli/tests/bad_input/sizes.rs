//! Size flags at their edges, sequences past the context, shapes nothing can count.

use std::time::Duration;

use crate::common::repo_root;
use crate::{assert_no_crash, extract_args, run, setup, siphon};

#[test]
fn every_size_flag_at_its_edges_crashes_nothing() {
    let s = setup();
    let flags = [
        "--seq-len",
        "--batch-size",
        "--max-tokens",
        "--shard-size-mb",
        "--pipeline-depth",
        "--cpu-devices",
        "--data",
        "--fsdp",
        "--model-parallel",
        "--shuffle-tokens-window",
        "--stream-buffer",
        "--stream-keep",
        "--unit-bytes",
        "--tokenizer-threads",
        "--simulate-hosts",
        "--store-timeout",
        "--connect-timeout",
        "--register-timeout",
        "--stop-timeout",
    ];
    let values = ["0", "1", "2147483648", "9223372036854775808", "-1"];
    let cases: Vec<(&str, &str)> = flags.iter().flat_map(|f| values.iter().map(move |v| (*f, *v))).collect();
    // Two at a time: most are refused at once, the accepted ones run the tiny job.
    let accepted = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for (i, half) in cases.chunks(cases.len().div_ceil(2)).enumerate() {
            let (s, accepted) = (&s, &accepted);
            scope.spawn(move || {
                for (j, (flag, value)) in half.iter().enumerate() {
                    let (name, given) = (format!("r{i}-{j}"), format!("{flag}={value}"));
                    let (output, took) = run(siphon(&extract_args(s, &name, &[&given])), Duration::from_secs(120));
                    let what = format!("{given} ({took:?})");
                    assert_no_crash(&output, &what);
                    // A refused value is refused at once, naming its flag.
                    if !output.status.success() {
                        let stderr = String::from_utf8_lossy(&output.stderr);
                        let named = stderr.contains(flag) || (*flag == "--seq-len" && stderr.contains("at least 2"));
                        assert!(named, "{what}: the error does not name {flag}: {stderr}");
                        assert!(took < Duration::from_secs(5), "{what}: refused only after {took:?}");
                    } else {
                        accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let accepted = accepted.into_inner();
    // The values 1 of most flags run the job.
    assert!(accepted >= 10, "only {accepted} runs accepted");
}

#[test]
fn sequences_past_the_context_or_any_memory_are_refused_before_work_starts() {
    let s = setup();
    for (seq, allow) in
        [("1000000000", false), ("10000000", false), ("100000", false), ("100000", true), ("1000000000", true)]
    {
        let mut extra = vec!["--seq-len", seq];
        if allow {
            extra.push("--allow-long-context");
        }
        let (output, took) = run(siphon(&extract_args(&s, "r", &extra)), Duration::from_secs(30));
        let what = format!("--seq-len {seq} (allow {allow})");
        assert_no_crash(&output, &what);
        assert!(!output.status.success(), "{what}: accepted");
        assert!(took < Duration::from_secs(2), "{what}: refused only after {took:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        match allow {
            // The tiny model's context.
            false => {
                assert!(stderr.contains("--seq-len") && stderr.contains("max_position_embeddings 256"), "{stderr}")
            }
            // Past what the machine has, or what anything can count: the figures named.
            true => assert!(
                stderr.contains("--seq-len") && (stderr.contains("available") || stderr.contains("4 PiB")),
                "{stderr}"
            ),
        }
        assert!(!s.root.join("out/r").exists(), "{what}: a run directory was made");
    }
    // The 4 PiB refusal names the term.
    let (output, _) = run(
        siphon(&extract_args(&s, "r", &["--seq-len", "1000000000", "--allow-long-context"])),
        Duration::from_secs(30),
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("attention scores"));
}

#[test]
fn plan_refuses_shapes_it_cannot_count() {
    let config = repo_root().join("fixtures/configs/qwen2.5-7b.json");
    let plan = |extra: &[&str]| {
        let mut args: Vec<String> =
            ["plan", "--config", config.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        run(siphon(&args), Duration::from_secs(30)).0
    };
    for extra in [
        &["--batch", "99999999999", "--seq", "99999999999"][..],
        &["--batch", "4294967296", "--seq", "4294967296"],
        &["--batch", "65536", "--seq", "131072"],
    ] {
        let output = plan(extra);
        assert_no_crash(&output, &format!("{extra:?}"));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{extra:?} was planned: {}", String::from_utf8_lossy(&output.stdout));
        assert!(stderr.contains("--batch") || stderr.contains("--seq"), "{extra:?}: {stderr}");
    }
    let output = plan(&["--batch", "8", "--seq", "4096"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    // Past the context the plan is made (a plan computes nothing) and says extract refuses it.
    let output = plan(&["--batch", "1", "--seq", "200000"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && stdout.contains("max_position_embeddings 131072"), "{stdout}");
    assert!(stdout.contains("--allow-long-context"), "{stdout}");
}
