//! The `grpc-status` of a gRPC-Web response, read off its body as it
//! passes: gRPC-Web sends the trailers as the body's last frame (the
//! gRPC-Web protocol, `PROTOCOL-WEB.md`), a frame whose flag byte has its
//! top bit (0x80) set, holding the trailers as HTTP/1 header lines.
//!
//! Frames are `flag (1 byte) | length (4 bytes, big-endian) | payload`.
//! Message frames are skipped as they pass, never kept; only the trailer
//! frame's payload is kept, up to [`MAX_TRAILERS`] bytes. In
//! `application/grpc-web-text` the whole body is base64, in segments that
//! may each end with padding, so it is decoded four characters at a time.
//!
//! What cannot be read (a compressed or oversized trailer frame, base64
//! that is not, a body in more pieces than one frame can be looked at) ends
//! the reading: the call is then never refunded. So nothing a response
//! sends here can refund a call that its status does not name.

use std::io::IoSlice;

use base64::{Engine, engine::general_purpose::STANDARD};
use bytes::Buf;
use http::HeaderValue;

use super::grpc_code;

/// The largest trailer frame read; a larger one is not (the call stays
/// charged). tonic's trailers are a few dozen bytes.
const MAX_TRAILERS: usize = 16 * 1024;

/// The most pieces of one data frame looked at.
const MAX_SLICES: usize = 64;

/// What the reader has found so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Nothing yet: read on.
    Nothing,
    /// The trailer frame, and the `grpc-status` code it names (`None` for
    /// none or one that is not a code: 2 `UNKNOWN` to gRPC).
    Status(Option<u8>),
    /// A body it cannot read: the call stays charged.
    Unreadable,
}

/// Reads a gRPC-Web body's frames to its trailer frame.
#[derive(Debug)]
pub(crate) struct WebTrailers {
    /// `application/grpc-web-text`: base64 around the frames.
    text: bool,
    /// Base64 characters not yet decoded (fewer than four).
    quad: [u8; 4],
    quad_len: usize,
    /// The frame header read so far.
    head: [u8; 5],
    head_len: usize,
    /// Payload bytes of the current frame still to come (its header read).
    left: usize,
    /// Whether the current frame is the trailer frame, kept in `trailers`.
    in_trailers: bool,
    trailers: Vec<u8>,
    found: Found,
}

impl WebTrailers {
    /// A reader for a response with `content_type`, if that is gRPC-Web's
    /// (`application/grpc-web` or `application/grpc-web-text`, each with
    /// any `+suffix` or parameters).
    pub(crate) fn for_content_type(content_type: Option<&HeaderValue>) -> Option<Self> {
        let text = crate::respond::grpc_web_text(content_type?.as_bytes())?;
        Some(Self {
            text,
            quad: [0; 4],
            quad_len: 0,
            head: [0; 5],
            head_len: 0,
            left: 0,
            in_trailers: false,
            trailers: Vec::new(),
            found: Found::Nothing,
        })
    }

    /// Reads one data frame of the body.
    pub(crate) fn read(&mut self, data: &impl Buf) -> Found {
        let mut slices = [IoSlice::new(&[]); MAX_SLICES];
        let n = data.chunks_vectored(&mut slices);
        let seen: usize = slices[..n].iter().map(|s| s.len()).sum();
        if seen != data.remaining() {
            self.found = Found::Unreadable;
        }
        for slice in &slices[..n] {
            if self.found != Found::Nothing {
                break;
            }
            if self.text {
                self.decode(slice);
            } else {
                self.frames(slice);
            }
        }
        self.found
    }

    /// Decodes base64 four characters at a time, reading what each gives.
    fn decode(&mut self, mut chars: &[u8]) {
        while !chars.is_empty() && self.found == Found::Nothing {
            let take = (4 - self.quad_len).min(chars.len());
            self.quad[self.quad_len..self.quad_len + take].copy_from_slice(&chars[..take]);
            self.quad_len += take;
            chars = &chars[take..];
            if self.quad_len == 4 {
                self.quad_len = 0;
                let mut out = [0; 3];
                match STANDARD.decode_slice(self.quad, &mut out) {
                    Ok(n) => self.frames(&out[..n]),
                    Err(_) => self.found = Found::Unreadable,
                }
            }
        }
    }

    /// Reads frame bytes: headers, skipped messages, the trailer frame.
    fn frames(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.found == Found::Nothing {
            if self.left == 0 && self.head_len < 5 {
                let take = (5 - self.head_len).min(bytes.len());
                self.head[self.head_len..self.head_len + take].copy_from_slice(&bytes[..take]);
                self.head_len += take;
                bytes = &bytes[take..];
                if self.head_len == 5 {
                    self.start_frame();
                }
                continue;
            }
            let take = self.left.min(bytes.len());
            if self.in_trailers {
                self.trailers.extend_from_slice(&bytes[..take]);
            }
            self.left -= take;
            bytes = &bytes[take..];
            if self.left == 0 {
                self.end_frame();
            }
        }
    }

    /// A frame's header is read: what follows is a message to skip or the
    /// trailers to keep.
    fn start_frame(&mut self) {
        let [flag, len @ ..] = self.head;
        let len = u32::from_be_bytes(len) as usize;
        self.in_trailers = flag & 0x80 != 0;
        if self.in_trailers && (flag & 0x01 != 0 || len > MAX_TRAILERS) {
            // Compressed trailers, or more than any server sends.
            self.found = Found::Unreadable;
            return;
        }
        self.left = len;
        if len == 0 {
            self.end_frame();
        }
    }

    fn end_frame(&mut self) {
        self.head_len = 0;
        if self.in_trailers {
            self.found = Found::Status(status_in(&self.trailers));
        }
    }
}

/// The `grpc-status` of a trailer frame's header lines, as a code: the
/// first such line's, as HTTP/2 trailers are read (`HeaderMap::get`), so a
/// later line never overrides one that is not a code.
fn status_in(block: &[u8]) -> Option<u8> {
    let value = block.split(|&b| b == b'\n').find_map(|line| {
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        name.trim_ascii()
            .eq_ignore_ascii_case(b"grpc-status")
            .then_some(value)
    })?;
    grpc_code(value.trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(flag: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn reader(content_type: &'static str) -> WebTrailers {
        WebTrailers::for_content_type(Some(&HeaderValue::from_static(content_type))).unwrap()
    }

    /// The body in pieces of `size` bytes, to the first finding.
    fn read_in(mut r: WebTrailers, body: &[u8], size: usize) -> Found {
        for piece in body.chunks(size) {
            let found = r.read(&bytes::Bytes::copy_from_slice(piece));
            if found != Found::Nothing {
                return found;
            }
        }
        Found::Nothing
    }

    #[test]
    fn finds_the_status_in_the_trailer_frame_in_any_pieces() {
        let mut body = frame(0, b"message one");
        body.extend(frame(0, b""));
        body.extend(frame(0x80, b"grpc-message: x\r\nGrpc-Status: 13\r\n"));
        for size in [1, 2, 3, 5, 7, body.len()] {
            let found = read_in(reader("application/grpc-web+proto"), &body, size);
            assert_eq!(found, Found::Status(Some(13)), "pieces of {size}");
        }
        let text = STANDARD.encode(&body);
        for size in [1, 3, 4, 9, text.len()] {
            let found = read_in(reader("application/grpc-web-text"), text.as_bytes(), size);
            assert_eq!(found, Found::Status(Some(13)), "text in pieces of {size}");
        }
    }

    /// grpc-web-text segments each padded, as a server that encodes frame by
    /// frame sends them.
    #[test]
    fn reads_base64_segments_each_padded() {
        let mut text = STANDARD.encode(frame(0, b"mm"));
        text.push_str(&STANDARD.encode(frame(0x80, b"grpc-status:0\r\n")));
        assert!(text[..text.len() - 4].contains('='), "{text}");
        let found = read_in(
            reader("application/grpc-web-text+proto"),
            text.as_bytes(),
            5,
        );
        assert_eq!(found, Found::Status(Some(0)));
    }

    #[test]
    fn what_it_cannot_read_never_names_a_status() {
        let no_status = frame(0x80, b"grpc-message: x\r\n");
        assert_eq!(
            read_in(reader("application/grpc-web"), &no_status, 4),
            Found::Status(None)
        );
        let not_a_code = frame(0x80, b"grpc-status: 0x\r\n");
        assert_eq!(
            read_in(reader("application/grpc-web"), &not_a_code, 4),
            Found::Status(None)
        );
        // The first grpc-status line decides, as in HTTP/2 trailers.
        let twice = frame(0x80, b"grpc-status: x\r\ngrpc-status: 0\r\n");
        assert_eq!(
            read_in(reader("application/grpc-web"), &twice, 4),
            Found::Status(None)
        );
        let compressed = frame(0x81, b"grpc-status: 0\r\n");
        assert_eq!(
            read_in(reader("application/grpc-web"), &compressed, 100),
            Found::Unreadable
        );
        let mut huge = vec![0x80];
        huge.extend_from_slice(&(MAX_TRAILERS as u32 + 1).to_be_bytes());
        assert_eq!(
            read_in(reader("application/grpc-web"), &huge, 100),
            Found::Unreadable
        );
        assert_eq!(
            read_in(reader("application/grpc-web-text"), b"!!!!", 4),
            Found::Unreadable
        );
        // Messages only: nothing found, read on.
        assert_eq!(
            read_in(reader("application/grpc-web"), &frame(0, b"abc"), 2),
            Found::Nothing
        );
        assert!(
            WebTrailers::for_content_type(Some(&HeaderValue::from_static("application/grpc")))
                .is_none()
        );
        assert!(WebTrailers::for_content_type(None).is_none());
    }
}
