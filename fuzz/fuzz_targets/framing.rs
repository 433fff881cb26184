//! Arbitrary bytes through both frame decoders, in arbitrary chunkings: never a panic, and
//! never more body bytes out than went in.
#![no_main]

use bytes::BytesMut;
use gaffer::rpc::framing::{Codec, Frame, Framing};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let chunk = (data[0] as usize % 64) + 1;
    for framing in [Framing::ContentLength, Framing::Ndjson] {
        let mut codec = Codec::new(framing);
        let mut buf = BytesMut::new();
        let mut out = 0usize;
        for piece in data[1..].chunks(chunk) {
            buf.extend_from_slice(piece);
            while let Ok(Some(frame)) = codec.decode(&mut buf) {
                if let Frame::Body(b) = frame {
                    out += b.len();
                }
            }
        }
        while let Ok(Some(frame)) = codec.decode_eof(&mut buf) {
            if let Frame::Body(b) = frame {
                out += b.len();
            }
            if buf.is_empty() {
                break;
            }
        }
        assert!(out <= data.len());
    }
});
