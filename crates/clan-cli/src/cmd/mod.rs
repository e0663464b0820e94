//! One module per `clan` subcommand.
pub mod job;
pub mod kill;
pub mod loadmgr;
pub mod logs;
pub mod node;
pub mod nodes;
pub mod proc;
pub mod ps;
pub mod run;
pub mod shell;
pub mod sigsend;
pub mod stats;
pub mod up;
pub mod wait;

/// Bytes as K/M/G with one decimal.
pub fn human_kb(kb: u64) -> String {
    let b = kb as f64 * 1024.0;
    if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1}G", b / (1024.0 * 1024.0 * 1024.0))
    } else if b >= 1024.0 * 1024.0 {
        format!("{:.1}M", b / (1024.0 * 1024.0))
    } else {
        format!("{:.0}K", b / 1024.0)
    }
}
