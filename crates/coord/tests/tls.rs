//! The coordination service over TLS, in one process on port 0 of 127.0.0.1, with certificates
//! made at test time: a job works; a client that trusts another CA is refused at once with a
//! clear error; a wrong job token is still refused; a TLS client meets a plaintext service
//! with a clear error too.

use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use siphon_coord::service::{self, CoordinatorHandle, ServiceConfig};
use siphon_coord::{Client, ClientOptions, CoordError, TlsOptions};

const TOKEN: &str = "tls-test-token";

/// A CA and a certificate it signed for 127.0.0.1 and localhost: (CA PEM, cert PEM, key PEM).
fn make_pki() -> (String, String, String) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

fn tls(ca: &str, identity: Option<(&str, &str)>) -> TlsOptions {
    let identity = identity.map(|(cert, key)| (cert.as_bytes().to_vec(), key.as_bytes().to_vec()));
    TlsOptions::from_pem(ca.as_bytes().to_vec(), identity).unwrap()
}

async fn start(num_tasks: u32, tls: Option<TlsOptions>) -> CoordinatorHandle {
    let mut config = ServiceConfig::new(num_tasks, TOKEN);
    config.tls = tls;
    let (handle, server) = service::bind(config, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    tokio::spawn(server);
    handle
}

fn options(tls: Option<TlsOptions>) -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_secs(10),
        register_timeout: Duration::from_secs(5),
        heartbeat_interval: Duration::from_millis(200),
        tls,
        ..ClientOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_over_tls() {
    let (ca, cert, key) = make_pki();
    let handle = start(2, Some(tls(&ca, Some((&cert, &key))))).await;
    let address = handle.local_addr().to_string();
    let joins = (0..2).map(|task| {
        let address = address.clone();
        let options = options(Some(tls(&ca, None)));
        async move { Client::connect(&address, task, TOKEN, &options).await.unwrap() }
    });
    let clients = futures::future::join_all(joins).await;
    let waits = clients.iter().map(|c| c.barrier("step", Duration::from_secs(5)));
    for result in futures::future::join_all(waits).await {
        result.unwrap();
    }
    clients[0].kv_set("k", b"over tls", false).await.unwrap();
    assert_eq!(clients[1].kv_get("k", Duration::from_secs(5)).await.unwrap(), b"over tls");
    // A connection of its own (what the blocking API uses) is TLS too.
    let own = clients[1].with_own_connection().await.unwrap();
    assert_eq!(own.kv_try_get("k").await.unwrap().unwrap(), b"over tls");
    let shutdowns = clients.iter().map(|c| c.shutdown(Duration::from_secs(5)));
    for result in futures::future::join_all(shutdowns).await {
        result.unwrap();
    }
    handle.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_another_ca_is_refused_at_once() {
    let (ca, cert, key) = make_pki();
    let (other_ca, _, _) = make_pki();
    let handle = start(1, Some(tls(&ca, Some((&cert, &key))))).await;
    let started = Instant::now();
    let error = Client::connect(&handle.local_addr().to_string(), 0, TOKEN, &options(Some(tls(&other_ca, None))))
        .await
        .err()
        .expect("a server signed by another CA must be refused");
    assert!(matches!(error, CoordError::Unauthenticated(_)), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("TLS") && text.contains("certificate") && text.contains("--coordinator-ca"), "{text}");
    // Not retried until the connect timeout: a certificate does not change by waiting.
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    handle.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_over_tls() {
    let (ca, cert, key) = make_pki();
    let handle = start(1, Some(tls(&ca, Some((&cert, &key))))).await;
    let error =
        Client::connect_only(&handle.local_addr().to_string(), 0, "wrong-token", &options(Some(tls(&ca, None))))
            .await
            .err()
            .expect("a wrong token must be refused");
    assert!(matches!(error, CoordError::Unauthenticated(ref m) if m.contains("job token")), "{error:?}");
    handle.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_meeting_a_plaintext_service_is_told_so() {
    let (ca, _, _) = make_pki();
    let handle = start(1, None).await;
    let error = Client::connect_only(&handle.local_addr().to_string(), 0, TOKEN, &options(Some(tls(&ca, None))))
        .await
        .err()
        .expect("TLS to a plaintext service must fail");
    assert!(matches!(error, CoordError::Unauthenticated(ref m) if m.contains("TLS")), "{error:?}");
    handle.stop();
}

#[test]
fn bad_pem_files_are_named_before_any_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, _) = make_pki();
    let ca_path = dir.path().join("ca.pem");
    let cert_path = dir.path().join("cert.pem");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&ca_path, ca).unwrap();
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&junk, "not a pem file").unwrap();
    let text = |e: CoordError| e.to_string();
    let err = text(TlsOptions::from_files(&junk, None, None).unwrap_err());
    assert!(err.contains("junk.pem") && err.contains("no PEM certificate"), "{err}");
    let err = text(TlsOptions::from_files(&ca_path, Some(&cert_path), None).unwrap_err());
    assert!(err.contains("give both"), "{err}");
    let err = text(TlsOptions::from_files(&ca_path, Some(&cert_path), Some(&junk)).unwrap_err());
    assert!(err.contains("private key"), "{err}");
    let err = text(TlsOptions::from_files(&dir.path().join("missing.pem"), None, None).unwrap_err());
    assert!(err.contains("missing.pem"), "{err}");
    assert!(!TlsOptions::from_files(&ca_path, None, None).unwrap().can_serve());
    // A FIFO would block the read forever, a device never ends, a directory is no file: each
    // is refused before it is opened, named.
    let fifo = dir.path().join("fifo.pem");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for special in [fifo.as_path(), std::path::Path::new("/dev/zero"), dir.path()] {
        let err = text(TlsOptions::from_files(special, None, None).unwrap_err());
        assert!(err.contains(&special.display().to_string()) && err.contains("not a regular file"), "{err}");
        let err = text(TlsOptions::from_files(&ca_path, Some(&cert_path), Some(special)).unwrap_err());
        assert!(err.contains("coordinator key") && err.contains("not a regular file"), "{err}");
    }
}
