//! Wire framing: LSP `Content-Length` headers or newline-delimited JSON.
//!
//! Both decoders are total: malformed input becomes a [`Frame::Bad`] and decoding goes on, so a
//! garbled frame costs one error reply, never the connection. Memory stays bounded: an oversized
//! frame is skipped byte by byte as it arrives instead of being buffered.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use super::outbox::Message;

/// Largest frame body accepted (16 MiB).
pub const MAX_FRAME: usize = 16 * 1024 * 1024;
/// Largest LSP header section accepted before we call it garbage.
const MAX_HEADER: usize = 8 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length: N\r\n\r\n<body>` (LSP base protocol).
    ContentLength,
    /// One compact JSON value per line.
    Ndjson,
}

impl Framing {
    /// Chooses the framing from the first non-blank byte of a stream.
    pub fn sniff(first: u8) -> Framing {
        match first {
            b'C' | b'c' => Framing::ContentLength,
            _ => Framing::Ndjson,
        }
    }
}

/// One unit read from the wire.
#[derive(Debug, PartialEq)]
pub enum Frame {
    Body(Bytes),
    /// Unusable bytes; the reason is reported to the client, decoding continues.
    Bad(FrameError),
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("bad header: {0}")]
    BadHeader(String),
    #[error("unexpected bytes between frames")]
    Garbage,
    #[error("stream ended inside a frame")]
    TruncatedAtEof,
}

/// Decoder + encoder for both framings.
#[derive(Debug)]
pub struct Codec {
    framing: Framing,
    /// Content-Length: an error was reported and no good frame has followed yet.
    in_bad_run: bool,
    /// NDJSON: inside an over-long line, dropping until the next newline.
    dropping_line: bool,
    /// Content-Length: header read, waiting for this many body bytes.
    body_len: Option<usize>,
}

impl Codec {
    pub fn new(framing: Framing) -> Self {
        Codec {
            framing,
            in_bad_run: false,
            dropping_line: false,
            body_len: None,
        }
    }

    pub fn framing(&self) -> Framing {
        self.framing
    }

    fn decode_ndjson(&mut self, src: &mut BytesMut) -> Option<Frame> {
        loop {
            let newline = src.iter().position(|b| *b == b'\n');
            if self.dropping_line {
                match newline {
                    Some(i) => {
                        src.advance(i + 1);
                        self.dropping_line = false;
                        continue;
                    }
                    None => {
                        src.clear();
                        return None;
                    }
                }
            }
            let Some(i) = newline else {
                if src.len() > MAX_FRAME {
                    let n = src.len();
                    src.clear();
                    self.dropping_line = true;
                    return Some(Frame::Bad(FrameError::TooLarge(n)));
                }
                return None;
            };
            let mut line = src.split_to(i + 1);
            line.truncate(i);
            if line.last() == Some(&b'\r') {
                line.truncate(i - 1);
            }
            if line.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            if line.len() > MAX_FRAME {
                return Some(Frame::Bad(FrameError::TooLarge(line.len())));
            }
            return Some(Frame::Body(line.freeze()));
        }
    }

    fn decode_content_length(&mut self, src: &mut BytesMut) -> Option<Frame> {
        loop {
            if let Some(length) = self.body_len {
                if src.len() < length {
                    src.reserve(length - src.len());
                    return None;
                }
                self.body_len = None;
                self.in_bad_run = false;
                return Some(Frame::Body(src.split_to(length).freeze()));
            }
            let start = src
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .unwrap_or(src.len());
            src.advance(start);
            match header_start(src) {
                HeaderStart::NeedMore => return None,
                HeaderStart::No => {
                    // Garbage: drop up to the next header start (keeping a tail that may be
                    // the beginning of one) and report the run once.
                    let keep = next_header(src, 1).unwrap_or(src.len().saturating_sub(MARKER_MAX));
                    src.advance(keep.max(1).min(src.len()));
                    if let Some(bad) = self.bad(FrameError::Garbage) {
                        return Some(bad);
                    }
                    continue;
                }
                HeaderStart::Yes => {}
            }
            let Some(end) = find(src, b"\r\n\r\n") else {
                if src.len() > MAX_HEADER {
                    let next = next_header(src, 1).unwrap_or(src.len() - MARKER_MAX);
                    src.advance(next);
                    if let Some(bad) = self.bad(FrameError::BadHeader(
                        "header section too long or unterminated".into(),
                    )) {
                        return Some(bad);
                    }
                    continue;
                }
                return None;
            };
            let parsed = parse_headers(&src[..end]);
            src.advance(end + 4);
            // A bad or oversized length says nothing about where the body ends: what follows
            // is skipped up to the next header (resynchronisation), as one bad run.
            let error = match parsed {
                Ok(n) if n <= MAX_FRAME => {
                    self.body_len = Some(n);
                    continue;
                }
                Ok(n) => FrameError::TooLarge(n),
                Err(e) => e,
            };
            if let Some(bad) = self.bad(error) {
                return Some(bad);
            }
        }
    }

    /// Reports the first error of a bad run; later ones in the same run stay quiet, so the
    /// replies to garbage never outgrow the garbage.
    fn bad(&mut self, error: FrameError) -> Option<Frame> {
        if self.in_bad_run {
            return None;
        }
        self.in_bad_run = true;
        Some(Frame::Bad(error))
    }
}

/// Header names a frame may start with (compared ignoring ASCII case).
const MARKERS: [&[u8]; 2] = [b"content-length:", b"content-type:"];
const MARKER_MAX: usize = 15;

enum HeaderStart {
    Yes,
    No,
    NeedMore,
}

fn header_start(src: &[u8]) -> HeaderStart {
    if src.is_empty() {
        return HeaderStart::NeedMore;
    }
    let mut partial = false;
    for m in MARKERS {
        let n = m.len().min(src.len());
        if src[..n].eq_ignore_ascii_case(&m[..n]) {
            if n == m.len() {
                return HeaderStart::Yes;
            }
            partial = true;
        }
    }
    if partial {
        HeaderStart::NeedMore
    } else {
        HeaderStart::No
    }
}

/// Offset of the next complete header marker at or after `from`.
fn next_header(src: &[u8], from: usize) -> Option<usize> {
    (from..src.len()).find(|&i| matches!(header_start(&src[i..]), HeaderStart::Yes))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads `Content-Length` (required, once) and accepts `Content-Type`; other headers are ignored.
fn parse_headers(raw: &[u8]) -> Result<usize, FrameError> {
    let text = std::str::from_utf8(raw)
        .map_err(|_| FrameError::BadHeader("header is not valid UTF-8".into()))?;
    let mut length = None;
    for line in text.split("\r\n") {
        let Some((name, value)) = line.split_once(':') else {
            return Err(FrameError::BadHeader(format!(
                "malformed header line {line:?}"
            )));
        };
        if name.trim().eq_ignore_ascii_case("content-length") {
            if length.is_some() {
                return Err(FrameError::BadHeader("Content-Length given twice".into()));
            }
            let v = value.trim();
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(FrameError::BadHeader(format!(
                    "Content-Length {v:?} is not a number"
                )));
            }
            length = Some(v.parse::<usize>().unwrap_or(usize::MAX));
        }
    }
    length.ok_or_else(|| FrameError::BadHeader("missing Content-Length".into()))
}

impl Decoder for Codec {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        Ok(match self.framing {
            Framing::Ndjson => self.decode_ndjson(src),
            Framing::ContentLength => self.decode_content_length(src),
        })
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        if let Some(frame) = self.decode(src)? {
            return Ok(Some(frame));
        }
        if self.framing == Framing::Ndjson && !self.dropping_line && !src.is_empty() {
            // A last line without its newline is still a whole message.
            let line = src.split().freeze();
            if line.iter().all(|b| b.is_ascii_whitespace()) {
                return Ok(None);
            }
            return Ok(Some(Frame::Body(line)));
        }
        let pending = !src.is_empty() || self.body_len.is_some();
        src.clear();
        self.body_len = None;
        self.dropping_line = false;
        let report = pending && !self.in_bad_run;
        self.in_bad_run = false;
        Ok(report.then_some(Frame::Bad(FrameError::TruncatedAtEof)))
    }
}

impl Codec {
    /// Frames the body made of `pieces` (in order) onto `dst`.
    fn encode_pieces(&self, pieces: &[&[u8]], dst: &mut BytesMut) {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        match self.framing {
            Framing::ContentLength => {
                dst.reserve(len + 32);
                dst.put_slice(format!("Content-Length: {len}\r\n\r\n").as_bytes());
            }
            Framing::Ndjson => dst.reserve(len + 1),
        }
        for piece in pieces {
            dst.put_slice(piece);
        }
        if self.framing == Framing::Ndjson {
            dst.put_u8(b'\n');
        }
    }
}

impl Encoder<Message> for Codec {
    type Error = std::io::Error;

    fn encode(&mut self, msg: Message, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        self.encode_pieces(&msg.pieces().map(str::as_bytes), dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn drain(codec: &mut Codec, input: &[u8], chunk: usize) -> Vec<Frame> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in input.chunks(chunk.max(1)) {
            buf.extend_from_slice(piece);
            while let Some(f) = codec.decode(&mut buf).expect("decode is infallible") {
                out.push(f);
            }
        }
        while let Some(f) = codec.decode_eof(&mut buf).expect("decode is infallible") {
            out.push(f);
            if buf.is_empty() {
                break;
            }
        }
        out
    }

    fn encode_all(framing: Framing, bodies: &[Vec<u8>]) -> Vec<u8> {
        let codec = Codec::new(framing);
        let mut dst = BytesMut::new();
        for b in bodies {
            codec.encode_pieces(&[b], &mut dst);
        }
        dst.to_vec()
    }

    /// A reply spliced from its pieces is framed as its whole text would be: the length
    /// counts every piece, and the frame reads back as the joined text.
    #[test]
    fn a_spliced_message_frames_as_its_whole_text() {
        for framing in [Framing::ContentLength, Framing::Ndjson] {
            let spliced = || Message::Spliced {
                head: r#"{"jsonrpc":"2.0","id":7,"result":"#.to_string(),
                body: r#"{"kind":"é","n":[1,2]}"#.to_string(),
                tail: "}",
            };
            let whole = spliced().into_string();
            let mut codec = Codec::new(framing);
            let mut dst = BytesMut::new();
            codec.encode(spliced(), &mut dst).expect("encode");
            assert_eq!(dst.to_vec(), encode_all(framing, &[whole.clone().into()]));
            assert_eq!(
                drain(&mut codec, &dst, 3),
                vec![Frame::Body(Bytes::from(whole))]
            );
        }
    }

    #[test]
    fn content_length_roundtrip_and_content_type() {
        let wire = b"Content-Length: 2\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n{}Content-Length: 3\r\n\r\n[1]";
        let frames = drain(&mut Codec::new(Framing::ContentLength), wire, 5);
        assert_eq!(
            frames,
            vec![
                Frame::Body(Bytes::from_static(b"{}")),
                Frame::Body(Bytes::from_static(b"[1]"))
            ]
        );
    }

    #[test]
    fn content_length_counts_bytes_not_chars() {
        let body = "{\"k\":\"é\"}".as_bytes();
        let wire = encode_all(Framing::ContentLength, &[body.to_vec()]);
        assert!(String::from_utf8_lossy(&wire).starts_with("Content-Length: 10\r\n"));
        let frames = drain(&mut Codec::new(Framing::ContentLength), &wire, 3);
        assert_eq!(frames, vec![Frame::Body(Bytes::copy_from_slice(body))]);
    }

    #[test]
    fn bad_headers_garbage_and_oversize_are_reported_and_skipped() {
        let mut wire = Vec::new();
        wire.extend_from_slice(b"Content-Length: abc\r\n\r\n");
        wire.extend_from_slice(b"xx garbage\r\n");
        wire.extend_from_slice(format!("Content-Length: {}\r\n\r\n", MAX_FRAME + 1).as_bytes());
        wire.extend(std::iter::repeat_n(b'a', MAX_FRAME + 1));
        wire.extend_from_slice(b"Content-Length: 2\r\n\r\n{}");
        let frames = drain(&mut Codec::new(Framing::ContentLength), &wire, 1 << 16);
        // One bad run (bad header, garbage, oversized frame), one report, then the good frame.
        assert!(matches!(frames[0], Frame::Bad(FrameError::BadHeader(_))));
        assert_eq!(frames[1], Frame::Body(Bytes::from_static(b"{}")));
        assert_eq!(frames.len(), 2);
        let mut wire = format!("Content-Length: {}\r\n\r\n", MAX_FRAME + 1).into_bytes();
        wire.extend_from_slice(b"Content-Length: 2\r\n\r\n{}");
        let frames = drain(&mut Codec::new(Framing::ContentLength), &wire, 7);
        assert!(matches!(frames[0], Frame::Bad(FrameError::TooLarge(_))));
        assert_eq!(frames[1], Frame::Body(Bytes::from_static(b"{}")));
    }

    #[test]
    fn a_garbage_run_is_reported_once_however_long() {
        let mut wire = vec![b'C'; 300_000];
        wire.extend_from_slice(b"Content-Length: 2\r\n\r\n{}");
        for chunk in [1usize, 4096, 1 << 20] {
            let frames = drain(&mut Codec::new(Framing::ContentLength), &wire, chunk);
            assert_eq!(frames.len(), 2, "chunk {chunk}: {frames:?}");
            assert!(matches!(frames[0], Frame::Bad(_)));
            assert_eq!(frames[1], Frame::Body(Bytes::from_static(b"{}")));
        }
    }

    #[test]
    fn bad_lengths_resynchronise_at_the_next_header() {
        let huge = b"Content-Length: 1180591620717411303424\r\n\r\n{\"jsonrpc\":\"2.0\"}";
        let short = b"Content-Length: 3\r\n\r\n{\"jsonrpc\":\"2.0\",\"c\":\"Content\"}";
        for bad in [&huge[..], &short[..]] {
            let mut wire = bad.to_vec();
            wire.extend_from_slice(b"Content-Length: 2\r\n\r\n{}");
            let frames = drain(&mut Codec::new(Framing::ContentLength), &wire, 5);
            assert_eq!(frames.last(), Some(&Frame::Body(Bytes::from_static(b"{}"))));
            assert!(frames.len() <= 3, "{frames:?}");
        }
    }

    #[test]
    fn eof_mid_frame_is_reported() {
        let frames = drain(
            &mut Codec::new(Framing::ContentLength),
            b"Content-Length: 10\r\n\r\n{\"a\"",
            4,
        );
        assert_eq!(frames, vec![Frame::Bad(FrameError::TruncatedAtEof)]);
    }

    #[test]
    fn ndjson_lines_blank_lines_crlf_and_overlong() {
        let frames = drain(
            &mut Codec::new(Framing::Ndjson),
            b"{}\r\n\n  \n[2]\n{\"x\":1}",
            2,
        );
        assert_eq!(
            frames,
            vec![
                Frame::Body(Bytes::from_static(b"{}")),
                Frame::Body(Bytes::from_static(b"[2]")),
                Frame::Body(Bytes::from_static(b"{\"x\":1}")),
            ]
        );
        let mut wire = vec![b'x'; MAX_FRAME + 10];
        wire.extend_from_slice(b"\n{}\n");
        let frames = drain(&mut Codec::new(Framing::Ndjson), &wire, 1 << 20);
        assert!(matches!(frames[0], Frame::Bad(FrameError::TooLarge(_))));
        assert_eq!(frames[1], Frame::Body(Bytes::from_static(b"{}")));
    }

    #[test]
    fn sniffing() {
        assert_eq!(Framing::sniff(b'C'), Framing::ContentLength);
        assert_eq!(Framing::sniff(b'{'), Framing::Ndjson);
        assert_eq!(Framing::sniff(b'['), Framing::Ndjson);
    }

    proptest! {
        #[test]
        fn any_bodies_roundtrip_in_any_chunking(
            bodies in proptest::collection::vec("[a-z0-9{}\\[\\]\":, ]{1,60}", 0..8),
            chunk in 1usize..64,
            lsp in any::<bool>(),
        ) {
            let framing = if lsp { Framing::ContentLength } else { Framing::Ndjson };
            // NDJSON bodies are single lines and never blank.
            let bodies: Vec<Vec<u8>> = bodies
                .into_iter()
                .map(|b| format!("{{{b}}}").into_bytes())
                .collect();
            let wire = encode_all(framing, &bodies);
            let frames = drain(&mut Codec::new(framing), &wire, chunk);
            let expect: Vec<Frame> = bodies.iter().map(|b| Frame::Body(Bytes::copy_from_slice(b))).collect();
            prop_assert_eq!(frames, expect);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_stay_bounded(
            data in proptest::collection::vec(any::<u8>(), 0..2048),
            chunk in 1usize..97,
            lsp in any::<bool>(),
        ) {
            let framing = if lsp { Framing::ContentLength } else { Framing::Ndjson };
            let frames = drain(&mut Codec::new(framing), &data, chunk);
            let total: usize = frames.iter().map(|f| match f { Frame::Body(b) => b.len(), Frame::Bad(_) => 0 }).sum();
            prop_assert!(total <= data.len());
        }
    }
}
