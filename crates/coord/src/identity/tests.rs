use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn no_flags() -> IdentityFlags {
    IdentityFlags::default()
}

/// A GCE metadata server stub on 127.0.0.1 answering from a map; records the requests.
struct MetadataStub {
    host: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl MetadataStub {
    fn start(attributes: &[(&str, &str)]) -> MetadataStub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let attributes: HashMap<String, String> =
            attributes.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request_line = String::new();
                reader.read_line(&mut request_line).unwrap();
                let mut flavor = false;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line.trim().is_empty() {
                        break;
                    }
                    flavor |= line.to_ascii_lowercase().starts_with("metadata-flavor: google");
                }
                let path = request_line.split_whitespace().nth(1).unwrap_or("").to_string();
                seen.lock().unwrap().push(path.clone());
                let key = path.strip_prefix("/computeMetadata/v1/instance/attributes/");
                let (status, body) = match (flavor, key.and_then(|k| attributes.get(k))) {
                    (false, _) => ("403 Forbidden", String::new()),
                    (true, Some(value)) => ("200 OK", value.clone()),
                    (true, None) => ("404 Not Found", String::new()),
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        MetadataStub { host, requests }
    }

    fn fetcher(&self) -> GceMetadata {
        GceMetadata::from_env(&env(&[("GCE_METADATA_HOST", &self.host)]))
    }
}

#[test]
fn nothing_set_means_a_single_local_process() {
    let identity = resolve(&no_flags(), &env(&[]), None).unwrap();
    assert_eq!((identity.process_id, identity.num_processes), (0, 1));
    assert_eq!(identity.coordinator, "127.0.0.1:0");
    assert_eq!(identity.source, Source::Default);
    assert_eq!((identity.machine_id, identity.total_machines), (0, 1));
}

#[test]
fn flags_win_over_every_environment() {
    let flags = IdentityFlags {
        process_id: Some(2),
        num_processes: Some(4),
        coordinator: Some("10.0.0.9:1234".into()),
        machine_id: Some(1),
        total_machines: Some(3),
    };
    let identity =
        resolve(&flags, &env(&[("SIPHON_PROCESS_ID", "1"), ("RANK", "3"), ("SIPHON_MACHINE_ID", "0")]), None).unwrap();
    assert_eq!((identity.process_id, identity.num_processes), (2, 4));
    assert_eq!(identity.coordinator, "10.0.0.9:1234");
    assert_eq!(identity.source, Source::Flags);
    assert_eq!((identity.machine_id, identity.total_machines), (1, 3));
}

#[test]
fn siphon_env_and_per_field_fallback() {
    let vars = env(&[
        ("SIPHON_PROCESS_ID", "3"),
        ("SIPHON_NUM_PROCESSES", "8"),
        ("MASTER_ADDR", "head"),
        ("MASTER_PORT", "29500"),
        ("SIPHON_MACHINE_ID", "1"),
        ("SIPHON_TOTAL_MACHINES", "2"),
    ]);
    let identity = resolve(&no_flags(), &vars, None).unwrap();
    assert_eq!((identity.process_id, identity.num_processes), (3, 8));
    assert_eq!(identity.coordinator, "head:29500");
    assert_eq!(identity.field_sources, [Source::SiphonEnv, Source::SiphonEnv, Source::Torchrun]);
    assert_eq!((identity.machine_id, identity.total_machines), (1, 2));
}

#[test]
fn cloud_tpu_from_env() {
    let vars = env(&[("TPU_WORKER_ID", "1"), ("TPU_WORKER_HOSTNAMES", "t-w-0,t-w-1,t-w-2,t-w-3")]);
    let identity = resolve(&no_flags(), &vars, None).unwrap();
    assert_eq!((identity.process_id, identity.num_processes), (1, 4));
    assert_eq!(identity.coordinator, format!("t-w-0:{DEFAULT_PORT}"));
    assert_eq!(identity.source, Source::CloudTpu);
    let vars = env(&[("CLOUD_TPU_TASK_ID", "2"), ("TPU_WORKER_HOSTNAMES", "a,b,c")]);
    assert_eq!(resolve(&no_flags(), &vars, None).unwrap().process_id, 2);
}

#[test]
fn cloud_tpu_from_the_metadata_server_stub() {
    let stub = MetadataStub::start(&[
        ("agent-worker-number", "3"),
        ("worker-network-endpoints", "uid0:w0:10.130.0.2,uid1:w1:10.130.0.3,uid2:w2:10.130.0.4,uid3:w3:10.130.0.5"),
    ]);
    let fetcher = stub.fetcher();
    let vars = env(&[("TPU_ACCELERATOR_TYPE", "v5litepod-16")]);
    let identity = resolve(&no_flags(), &vars, Some(&fetcher)).unwrap();
    assert_eq!((identity.process_id, identity.num_processes), (3, 4));
    assert_eq!(identity.coordinator, format!("10.130.0.2:{DEFAULT_PORT}"));
    assert_eq!(identity.source, Source::CloudTpu);
    let requests = stub.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert!(requests[0].ends_with("/agent-worker-number"), "{requests:?}");
}

#[test]
fn metadata_is_not_queried_when_flags_are_complete_or_not_on_tpu() {
    let stub = MetadataStub::start(&[("agent-worker-number", "3")]);
    let fetcher = stub.fetcher();
    let flags = IdentityFlags {
        process_id: Some(0),
        num_processes: Some(2),
        coordinator: Some("h:1".into()),
        ..Default::default()
    };
    resolve(&flags, &env(&[("TPU_ACCELERATOR_TYPE", "v4-16")]), Some(&fetcher)).unwrap();
    resolve(&no_flags(), &env(&[]), Some(&fetcher)).unwrap();
    assert!(stub.requests.lock().unwrap().is_empty());
}

#[test]
fn metadata_server_down_is_a_clear_error() {
    // A port nobody listens on: bind, read the port, close.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let fetcher = GceMetadata::from_env(&env(&[("GCE_METADATA_HOST", &format!("127.0.0.1:{port}"))]));
    let error = resolve(&no_flags(), &env(&[("TPU_ACCELERATOR_TYPE", "v4-8")]), Some(&fetcher)).unwrap_err();
    assert!(error.to_string().contains("GCE metadata server"), "{error}");
}

#[test]
fn gke_indexed_job() {
    let vars = env(&[("JOB_COMPLETION_INDEX", "2"), ("TPU_WORKER_HOSTNAMES", "job-0.svc,job-1.svc,job-2.svc")]);
    let identity = resolve(&no_flags(), &vars, None).unwrap();
    assert_eq!((identity.process_id, identity.num_processes), (2, 3));
    assert_eq!(identity.coordinator, format!("job-0.svc:{DEFAULT_PORT}"));
    assert_eq!(identity.source, Source::Gke);
}

#[test]
fn slurm_with_compressed_node_list() {
    let vars = env(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "16"), ("SLURM_STEP_NODELIST", "gpu[007-010,012],cpu1")]);
    let identity = resolve(&no_flags(), &vars, None).unwrap();
    assert_eq!((identity.process_id, identity.num_processes), (5, 16));
    assert_eq!(identity.coordinator, format!("gpu007:{DEFAULT_PORT}"));
    assert_eq!(identity.source, Source::Slurm);
    assert_eq!(first_slurm_host("node1,node2").unwrap(), "node1");
    assert_eq!(first_slurm_host("n[1-2]-ib,m3").unwrap(), "n1-ib");
    assert!(first_slurm_host("n[x]").is_err());
}

#[test]
fn open_mpi() {
    let vars = env(&[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_MCA_orte_hnp_uri", "1531576320.0;tcp://10.96.0.1,172.17.0.1:34911"),
    ]);
    let identity = resolve(&no_flags(), &vars, None).unwrap();
    assert_eq!((identity.process_id, identity.num_processes), (1, 2));
    assert_eq!(identity.coordinator, format!("10.96.0.1:{DEFAULT_PORT}"));
    assert_eq!(identity.source, Source::OpenMpi);
}

#[test]
fn torchrun() {
    let vars = env(&[("RANK", "3"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "10.1.1.1"), ("MASTER_PORT", "29500")]);
    let identity = resolve(&no_flags(), &vars, None).unwrap();
    assert_eq!((identity.process_id, identity.num_processes), (3, 4));
    assert_eq!(identity.coordinator, "10.1.1.1:29500");
    assert_eq!(identity.source, Source::Torchrun);
}

#[test]
fn bad_input_is_a_clear_error() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("SLURM_PROCID", "x")], "SLURM_PROCID='x'"),
        (&[("SIPHON_PROCESS_ID", "4"), ("SIPHON_NUM_PROCESSES", "4"), ("SIPHON_COORDINATOR", "h:1")], "not below"),
        (&[("SIPHON_PROCESS_ID", "1")], "process count"),
        (&[("SIPHON_PROCESS_ID", "1"), ("SIPHON_NUM_PROCESSES", "2")], "no coordinator address"),
        (&[("SIPHON_NUM_PROCESSES", "0")], "at least 1"),
        (&[("SIPHON_COORDINATOR", "h:notaport")], "bad port"),
        (&[("SIPHON_MACHINE_ID", "2"), ("SIPHON_TOTAL_MACHINES", "2")], "machine id 2"),
        // Counts no job has, from any source, before anything is allocated for them.
        (&[("SIPHON_NUM_PROCESSES", "4294967295"), ("SIPHON_COORDINATOR", "h:1")], "process count 4294967295"),
        (&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1048577")], "more than the 1048576 processes"),
        (&[("SIPHON_TOTAL_MACHINES", "4294967295")], "machine count 4294967295"),
    ];
    for (vars, expected) in cases {
        let error = resolve(&no_flags(), &env(vars), None).unwrap_err().to_string();
        assert!(error.contains(expected), "{vars:?}: {error}");
    }
}

#[test]
fn coordinator_addresses_get_the_default_port() {
    let port = |address| with_port(address, Source::Flags, DEFAULT_PORT).unwrap();
    assert_eq!(port("host"), format!("host:{DEFAULT_PORT}"));
    assert_eq!(port("host:9"), "host:9");
    assert_eq!(port("[::1]:9"), "[::1]:9");
    assert_eq!(port("::1"), format!("[::1]:{DEFAULT_PORT}"));
    assert_eq!(port("[::1]"), format!("[::1]:{DEFAULT_PORT}"));
}

#[test]
fn coordinator_port_env_replaces_the_default_port_only() {
    let slurm = [("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("SLURM_STEP_NODELIST", "gpu[007-008]")];
    let mut vars = env(&slurm);
    vars.insert(PORT_ENV.into(), "9100".into());
    assert_eq!(resolve(&no_flags(), &vars, None).unwrap().coordinator, "gpu007:9100");
    // An address that has a port keeps it.
    vars.insert("SIPHON_COORDINATOR".into(), "head:7000".into());
    assert_eq!(resolve(&no_flags(), &vars, None).unwrap().coordinator, "head:7000");
    for bad in ["0", "70000", "x"] {
        let mut vars = env(&slurm);
        vars.insert(PORT_ENV.into(), bad.into());
        let error = resolve(&no_flags(), &vars, None).unwrap_err().to_string();
        assert!(error.contains(PORT_ENV), "{bad}: {error}");
    }
}

#[test]
fn multislice_env_gives_the_machine() {
    let identity =
        resolve(&no_flags(), &env(&[("MEGASCALE_SLICE_ID", "1"), ("MEGASCALE_NUM_SLICES", "4")]), None).unwrap();
    assert_eq!((identity.machine_id, identity.total_machines), (1, 4));
}
