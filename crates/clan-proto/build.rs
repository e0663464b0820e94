// Compiles ../../proto/clan.proto with the protoc that protoc-bin-vendored ships in its crate,
// so building clan needs no system protobuf compiler.
fn main() {
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("vendored protoc");
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=../../proto/clan.proto");
    prost_build::Config::new()
        // Rarely sent and larger than the rest of a reply: boxed, so that every reply that
        // can hold a ProcReply does not grow by it.
        .boxed(".clan.v1.ProcReply.stat")
        .compile_protos(&["../../proto/clan.proto"], &["../../proto"])
        .expect("compile proto/clan.proto");
}
