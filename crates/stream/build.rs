//! Generates the gRPC messages and service stubs from `proto/stream.proto` (protox: no
//! `protoc` binary needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/stream.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    // `bytes` fields as `Bytes`: a batch is sent without a copy.
    tonic_prost_build::configure().bytes(".").build_server(true).build_client(true).compile_fds(descriptors)?;
    Ok(())
}
