//! Generates the gRPC messages and service stubs from `proto/coord.proto`.
//! protox parses the .proto in pure Rust, so no `protoc` binary is needed anywhere.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/coord.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(descriptors)?;
    Ok(())
}
