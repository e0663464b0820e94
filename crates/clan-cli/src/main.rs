//! The `clan` binary: see the `clan_cli` library.

fn main() -> std::process::ExitCode {
    clan_cli::main()
}
