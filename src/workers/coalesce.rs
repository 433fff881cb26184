//! Turning a worker's raw output bytes into a few ordered text chunks per flush.
//!
//! Output is journalled in batches (one record per stream run per flush window) rather than
//! per read, which keeps the journal small under chatty workers. Reads may split a UTF-8
//! sequence; the tail is held back until the rest arrives, and bytes that are not UTF-8 become
//! U+FFFD.

use super::types::Stream;

/// Largest text of one output record; longer runs are split.
pub const MAX_CHUNK_BYTES: usize = 256 * 1024;

/// Decodes a byte stream that may be cut anywhere.
#[derive(Debug, Default)]
pub struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    /// Decodes what is complete so far and keeps an unfinished trailing sequence.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let keep = incomplete_tail(&self.pending);
        let cut = self.pending.len() - keep;
        let text = String::from_utf8_lossy(&self.pending[..cut]).into_owned();
        self.pending.drain(..cut);
        text
    }

    /// Decodes whatever is left (an unfinished sequence becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// Length of a trailing, possibly valid but unfinished UTF-8 sequence (0..=3).
fn incomplete_tail(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=3.min(n) {
        let b = bytes[n - back];
        if b & 0b1100_0000 == 0b1000_0000 {
            continue; // continuation byte: look further back for the lead
        }
        let need = if b & 0b1110_0000 == 0b1100_0000 {
            2
        } else if b & 0b1111_0000 == 0b1110_0000 {
            3
        } else if b & 0b1111_1000 == 0b1111_0000 {
            4
        } else {
            return 0;
        };
        return if need > back { back } else { 0 };
    }
    0
}

/// Output of one worker waiting for the next flush, in arrival order.
#[derive(Debug, Default)]
pub struct OutputBuffer {
    stdout: Utf8Carry,
    stderr: Utf8Carry,
    chunks: Vec<(Stream, String)>,
}

impl OutputBuffer {
    pub fn push(&mut self, stream: Stream, bytes: &[u8]) {
        let text = match stream {
            Stream::Stderr => self.stderr.push(bytes),
            _ => self.stdout.push(bytes),
        };
        self.append(stream, text);
    }

    fn append(&mut self, stream: Stream, text: String) {
        if text.is_empty() {
            return;
        }
        match self.chunks.last_mut() {
            Some((s, t)) if *s == stream && t.len() + text.len() <= MAX_CHUNK_BYTES => {
                t.push_str(&text)
            }
            _ => self.chunks.push((stream, text)),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Takes the chunks gathered since the last flush.
    pub fn take(&mut self) -> Vec<(Stream, String)> {
        std::mem::take(&mut self.chunks)
    }

    /// Takes everything, including unfinished sequences (the process has ended).
    pub fn finish(&mut self) -> Vec<(Stream, String)> {
        let out = self.stdout.finish();
        self.append(Stream::Stdout, out);
        let err = self.stderr.finish();
        self.append(Stream::Stderr, err);
        self.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn runs_of_one_stream_merge_and_order_is_kept() {
        let mut b = OutputBuffer::default();
        b.push(Stream::Stdout, b"a");
        b.push(Stream::Stdout, b"b");
        b.push(Stream::Stderr, b"E");
        b.push(Stream::Stdout, b"c");
        assert_eq!(
            b.take(),
            vec![
                (Stream::Stdout, "ab".into()),
                (Stream::Stderr, "E".into()),
                (Stream::Stdout, "c".into())
            ]
        );
        assert!(b.is_empty());
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut c = Utf8Carry::default();
        assert_eq!(c.push(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(c.push(b"\xe2\x82"), "");
        assert_eq!(c.finish(), "\u{fffd}");
    }

    proptest! {
        // However the bytes of valid text are cut, the decoded pieces join back to the text.
        #[test]
        fn split_utf8_reassembles(s in "\\PC{0,40}", cuts in prop::collection::vec(0usize..200, 0..6)) {
            let bytes = s.as_bytes();
            let mut points: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            points.sort();
            let mut c = Utf8Carry::default();
            let mut out = String::new();
            let mut prev = 0;
            for p in points.into_iter().chain(std::iter::once(bytes.len())) {
                out.push_str(&c.push(&bytes[prev..p]));
                prev = p;
            }
            out.push_str(&c.finish());
            prop_assert_eq!(out, s);
        }
    }
}
