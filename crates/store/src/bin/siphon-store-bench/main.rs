//! Benchmarks of the shard writer; `siphon-store-bench --help` lists them.
//!
//! - `host`: the host side of the output path alone, fed from host buffers shaped as the device
//!   hands them, into a store that discards the bytes (the writer's own cost), object_store's
//!   in-memory store, or a local directory beside a plain write of the same bytes; core-seconds
//!   per GB by stage, with 1, 2 and N sealing threads.
//! - `upload`: the writer against a plain object_store upload of the same bytes (local or S3).

mod discard;
mod host;
mod upload;

const HELP: &str = "\
siphon-store-bench: benchmarks of siphon's shard writer

usage: siphon-store-bench host [OPTIONS]     the writer alone from host buffers, core-seconds per GB by stage
       siphon-store-bench upload [OPTIONS]   the writer against a plain object_store upload of the same bytes
       siphon-store-bench COMMAND --help     a command's options

(`siphon-store-bench --output DIR ...` without a command is `upload`, as before.)";

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let command = match args.first().map(String::as_str) {
        None | Some("-h" | "--help" | "help") => {
            println!("{HELP}");
            return Ok(());
        }
        Some("host" | "upload") => args.remove(0),
        Some(flag) if flag.starts_with("--") => "upload".to_string(),
        Some(other) => anyhow::bail!("unknown command {other:?}: give host or upload (see --help)"),
    };
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{}", if command == "host" { host::HELP } else { upload::HELP });
        return Ok(());
    }
    match command.as_str() {
        "host" => host::run(args),
        _ => upload::run(args),
    }
}
