// Builds shim.c into a shared object (`libclanshim.so` in OUT_DIR) with the C compiler the
// cc crate finds; lib.rs embeds it, and cland writes it into its state directory.
fn main() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let so = out.join("libclanshim.so");
    let compiler = cc::Build::new().get_compiler();
    let status = compiler
        .to_command()
        .args([
            "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o",
        ])
        .arg(&so)
        .args(["shim.c", "walk.c"])
        .arg("-ldl")
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "compiling shim.c failed");
    for f in ["shim.c", "walk.c", "shim.h"] {
        println!("cargo:rerun-if-changed={f}");
    }
}
