//! `siphon launch`: identities handed to each local host, prefixed output, failure propagated.

use std::process::Command;

const SIPHON: &str = env!("CARGO_BIN_EXE_siphon");

fn launch(args: &[&str]) -> std::process::Output {
    Command::new(SIPHON)
        .arg("launch")
        .args(args)
        .env_remove("SIPHON_PROCESS_ID")
        .env_remove("SIPHON_NUM_PROCESSES")
        .env_remove("SIPHON_COORDINATOR")
        .env_remove("SIPHON_JOB_TOKEN")
        .output()
        .expect("run siphon launch")
}

#[test]
fn each_host_gets_its_identity_and_a_prefix() {
    let out = launch(&["--local-hosts", "3", "--", "cluster", "info", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for id in 0..3 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("[host {id}] ")))
            .unwrap_or_else(|| panic!("no output of host {id}: {stdout}"));
        let json: serde_json::Value = serde_json::from_str(line.split_once("] ").unwrap().1).unwrap();
        assert_eq!(json["process_id"], id, "{line}");
        assert_eq!(json["num_processes"], 3, "{line}");
        assert!(json["coordinator"].as_str().unwrap().starts_with("127.0.0.1:"), "{line}");
    }
    assert!(!stdout.contains("SIPHON_JOB_TOKEN=") && !String::from_utf8_lossy(&out.stderr).contains("token="));
}

#[test]
fn a_failing_host_fails_the_launch() {
    let out = launch(&["--local-hosts", "2", "--", "doctor", "--plugin", "/nonexistent/libpjrt.so"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("failed (exit code 1)"), "{stderr}");
    assert!(stderr.contains("/nonexistent/libpjrt.so"), "the host's own error should come through: {stderr}");
}

#[test]
fn zero_hosts_is_an_error() {
    let out = launch(&["--local-hosts", "0", "--", "doctor"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 1"));
}
