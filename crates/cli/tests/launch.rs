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
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--local-hosts") && stderr.contains("0 is not in 1..=256"), "{stderr}");
}

/// (CA, certificate for 127.0.0.1, its key) as PEM files in `dir`, named `{name}-ca.pem`, ….
fn make_pki(dir: &std::path::Path, name: &str) -> [std::path::PathBuf; 3] {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().signed_by(&key, &ca).unwrap();
    let paths = ["ca", "cert", "key"].map(|part| dir.join(format!("{name}-{part}.pem")));
    std::fs::write(&paths[0], ca.pem()).unwrap();
    std::fs::write(&paths[1], cert.pem()).unwrap();
    std::fs::write(&paths[2], key.serialize_pem()).unwrap();
    paths
}

/// The same job with the coordinator's TLS flags set through the environment on every host:
/// it runs; a host that trusts another CA is refused at once, saying why.
#[test]
fn a_job_over_tls_runs_and_a_host_trusting_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let [ca, cert, key] = make_pki(dir.path(), "job");
    let [other_ca, _, _] = make_pki(dir.path(), "other");
    let with_tls = |command: &mut Command, ca: &std::path::Path| {
        command
            .env("SIPHON_COORDINATOR_CA", ca)
            .env("SIPHON_COORDINATOR_CERT", &cert)
            .env("SIPHON_COORDINATOR_KEY", &key);
    };
    let mut command = Command::new(SIPHON);
    command
        .args(["launch", "--local-hosts", "2", "--", "cluster", "check", "--rounds", "5", "--timeout-s", "20"])
        .env_remove("SIPHON_PROCESS_ID")
        .env_remove("SIPHON_NUM_PROCESSES")
        .env_remove("SIPHON_COORDINATOR")
        .env_remove("SIPHON_JOB_TOKEN");
    with_tls(&mut command, &ca);
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Host 0 serves with the job's certificate; host 1 trusts another CA.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let host = |id: u32, ca: &std::path::Path| {
        let mut command = Command::new(SIPHON);
        command
            .args(["cluster", "check", "--rounds", "1", "--timeout-s", "20"])
            .env("SIPHON_PROCESS_ID", id.to_string())
            .env("SIPHON_NUM_PROCESSES", "2")
            .env("SIPHON_COORDINATOR", format!("127.0.0.1:{port}"))
            .env("SIPHON_JOB_TOKEN", "tls-test-token")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        with_tls(&mut command, ca);
        command.spawn().unwrap()
    };
    let mut host0 = host(0, &ca);
    let started = std::time::Instant::now();
    let out1 = host(1, &other_ca).wait_with_output().unwrap();
    let _ = host0.kill();
    let _ = host0.wait();
    let stderr = String::from_utf8_lossy(&out1.stderr);
    assert!(!out1.status.success());
    assert!(stderr.contains("TLS") && stderr.contains("--coordinator-ca"), "{stderr}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "refused after {:?}", started.elapsed());
}
