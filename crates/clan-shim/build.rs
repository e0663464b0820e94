// Builds shim.c into a shared object (`libclanshim.so` in OUT_DIR) with the C compiler the
// cc crate finds; lib.rs embeds it, and cland writes it into its state directory.
fn main() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let so = out.join("libclanshim.so");
    // The shim is preloaded into the system's programs, which link glibc: it is built for the
    // host even when clan itself is built for another libc (a musl `clan` CLI, for instance).
    let host = std::env::var("HOST").expect("HOST");
    // Never `-static` (which cc adds when the target has `crt-static`, as a statically
    // linked `clan` does): a shared object can not take it.
    #[allow(deprecated)]
    let compiler = cc::Build::new()
        .target(&host)
        .static_flag(false)
        .get_compiler();
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
