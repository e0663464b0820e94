//! `clan-shepherd run` (reads a ShepherdSpec on stdin) and `clan-shepherd node-init`.
fn main() -> std::process::ExitCode {
    clan_shepherd::main_with_args(std::env::args().skip(1).collect())
}
