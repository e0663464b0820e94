//! The `clan` binary: see the `clan_cli` library.

/// The allocator of Rust's own wasm targets (dlmalloc), here for the deployed build, which
/// links musl (scripts/build-release.sh): musl's allocator maps and unmaps memory for a
/// few small allocations at a time, and a `clan run` makes thousands of them (its
/// arguments, the tokio runtime, the request), 0.2 ms of its start. With glibc it serves
/// as well.
#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() -> std::process::ExitCode {
    clan_cli::main()
}
