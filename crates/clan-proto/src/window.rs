//! The window of an attached session's streams: each end keeps the last [`WINDOW`] bytes it
//! sent and lets no more than that be unconfirmed, so that after a break (a cland
//! restarted) it can send again whatever the other end did not get. Confirmations
//! (`Taken` for input, `Ack` for output) come every [`ACK_EVERY`] bytes.

use std::collections::VecDeque;

/// Bytes of a stream kept for a resend, and the most that may be in flight.
pub const WINDOW: usize = 4 << 20;

/// How often the receiving end says how much of a stream it has.
pub const ACK_EVERY: u64 = 256 * 1024;

/// A stream's byte count and its last [`WINDOW`] bytes.
#[derive(Debug, Default)]
pub struct Kept {
    total: u64,
    last: VecDeque<u8>,
}

impl Kept {
    /// Counts `data` as sent and keeps it (dropping what falls out of the window).
    pub fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let data = &data[data.len().saturating_sub(WINDOW)..];
        let over = (self.last.len() + data.len()).saturating_sub(WINDOW);
        self.last.drain(..over);
        self.last.extend(data);
    }

    /// Bytes sent in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The offset of the oldest byte still kept.
    pub fn oldest(&self) -> u64 {
        self.total - self.last.len() as u64
    }

    /// `at` brought within what can be sent again: from the oldest byte kept to the end.
    pub fn clamp(&self, at: u64) -> u64 {
        at.clamp(self.oldest(), self.total)
    }

    /// The bytes from offset `at` (clamped) to the end.
    pub fn since(&self, at: u64) -> Vec<u8> {
        let skip = (self.clamp(at) - self.oldest()) as usize;
        self.last.range(skip..).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_window_and_counts_everything() {
        let mut k = Kept::default();
        k.push(&[1, 2, 3]);
        assert_eq!((k.total(), k.oldest()), (3, 0));
        assert_eq!(k.since(1), vec![2, 3]);
        k.push(&vec![9u8; WINDOW]);
        assert_eq!((k.total(), k.oldest()), (WINDOW as u64 + 3, 3));
        // Offsets outside what is kept are brought within it.
        assert_eq!(k.clamp(0), 3);
        assert_eq!(k.clamp(u64::MAX), k.total());
        assert_eq!(k.since(u64::MAX), Vec::<u8>::new());
        assert_eq!(k.since(WINDOW as u64 + 2), vec![9]);
    }
}
