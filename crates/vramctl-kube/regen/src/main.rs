//! Writes `src/generated/v1.rs` of vramctl-kube from the vendored pod-resources proto.
use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let proto_dir = crate_dir.join("proto");
    let out_dir = crate_dir.join("src/generated");
    let files = protox::compile(["podresources/v1/api.proto"], [&proto_dir])?;
    tonic_prost_build::configure()
        // The server is generated too: the tests answer from a server of the same proto.
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(&out_dir)
        .compile_fds(files)?;
    println!("wrote {}", out_dir.join("v1.rs").display());
    Ok(())
}
