// Builds shim.c into a shared object (`libclanshim.so` in OUT_DIR) with the C compiler the
// cc crate finds; lib.rs embeds it, and cland writes it into its state directory.
fn main() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let so = out.join("libclanshim.so");
    // The shim is preloaded into the system's programs, which link glibc: it is built for the
    // host even when clan itself is built for another libc (a musl `clan` CLI, for instance).
    let host = std::env::var("HOST").expect("HOST");
    let compiler = cc::Build::new().target(&host).get_compiler();
    // The compiler alone, without the flags cc derives from the target's: a `clan` built
    // with `crt-static` would otherwise get `-static`, which a shared object can not take.
    let status = std::process::Command::new(compiler.path())
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
