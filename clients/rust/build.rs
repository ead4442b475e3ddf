//! Generates the inferwire.v1 messages and client stub from the repository's
//! proto at build time, so the crate can never hold stale generated code.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let proto = proto_root.join("inferwire/v1/inference.proto");

    // A vendored protoc, so a build needs nothing beyond cargo; an explicit
    // PROTOC (for a platform the vendored crate lacks) still wins.
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY: build scripts are single-threaded; nothing else reads the
        // environment concurrently.
        unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    }

    // prost-build emits no rerun-if-changed, and cargo's default (any file of
    // this package) misses the proto, which lives outside it.
    println!("cargo:rerun-if-changed={}", proto_root.display());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PROTOC");

    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&[proto], &[proto_root])?;
    Ok(())
}
