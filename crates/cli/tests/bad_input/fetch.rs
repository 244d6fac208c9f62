//! A model or dictionary URL whose host does not answer (an offline machine, a mirror that is
//! down) fails within seconds naming the host, instead of after the store client's retries.

use std::time::Duration;

use crate::common::free_port;
use crate::{extract_args, run, setup, siphon};

#[test]
fn an_unreachable_hub_fails_within_seconds_naming_the_host() {
    let s = setup();
    let port = free_port();
    for (endpoint, why) in [
        (format!("http://127.0.0.1:{port}"), format!("cannot reach 127.0.0.1:{port}: no connection")),
        (
            "http://siphon-test.invalid".to_string(),
            "cannot reach siphon-test.invalid:80: its name does not resolve".into(),
        ),
    ] {
        for (flag, value) in [("--model", "hf://org/model"), ("--sae", "hf://org/saes/layer_1")] {
            let mut command = siphon(&extract_args(&s, "r", &[flag, value]));
            command.env("HF_ENDPOINT", &endpoint).env("SIPHON_CACHE_DIR", s.root.join("cache"));
            let (output, took) = run(command, Duration::from_secs(60));
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                !output.status.success() && took < Duration::from_secs(10),
                "{flag} {endpoint} ({took:?}): {stderr}"
            );
            assert!(stderr.contains(&why) && stderr.contains("offline"), "{flag} {endpoint}: {stderr}");
        }
    }
}
