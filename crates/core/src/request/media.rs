//! Images and audio in chat messages: the content parts that carry them
//! (the library's `{ type: 'image' | 'audio', data }`, OpenAI's `image_url`
//! with a `data:` URL and `input_audio`, Responses' `input_image`), their
//! bytes decoded and checked before any decoder sees them: a known format
//! (PNG, JPEG, GIF, BMP; WAV, MP3, FLAC), a size read from its header within
//! bounds, at most so many per request. Each part becomes the marker
//! `MEDIA_MARKER` in the message's text; the engine's projector turns the
//! markers back into the media's own tokens, in order.

use serde_json::{Map, Value as Json};

use crate::error::{EngineError, Result};
use crate::json::describe::{truncate, type_name};

/// Where a media part stands in a rendered prompt. Text that contains it is
/// refused (it would take a media's place).
pub const MEDIA_MARKER: &str = "<__llama_engine_media__>";
/// Media parts in one request.
pub const MAX_MEDIA_PARTS: usize = 16;
/// Bytes of one media file (decoded from base64).
pub const MAX_MEDIA_BYTES: usize = 20 << 20;
/// Pixels of one image (width × height, as its header says) and its longest side.
pub const MAX_IMAGE_PIXELS: u64 = 8192 * 8192;
pub const MAX_IMAGE_SIDE: u32 = 16384;

/// The ids a media chunk's tokens have in a prompt's token list: 30 bits
/// of its content hash, below -1 (never a vocabulary id, never llama.cpp's
/// null token -1).
pub const MEDIA_TOKEN_MAX: i32 = -2;
pub const MEDIA_TOKEN_MIN: i32 = -2 - 0x3fff_ffff;

/// Whether `t` is a media chunk's token id (`MEDIA_TOKEN_MIN..=MEDIA_TOKEN_MAX`).
pub fn is_media_token(t: i32) -> bool {
    (MEDIA_TOKEN_MIN..=MEDIA_TOKEN_MAX).contains(&t)
}

/// The media token id of the media whose SHA-256 (hex) is `id`.
pub fn media_token_id(id: &str) -> i32 {
    let bits = u32::from_str_radix(id.get(..8).unwrap_or("0"), 16).unwrap_or(0) & 0x3fff_ffff;
    MEDIA_TOKEN_MAX - bits as i32
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaKind {
    Image,
    Audio,
}

impl MediaKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MediaKind::Image => "image",
            MediaKind::Audio => "audio",
        }
    }
}

/// One media part: its bytes, what they are, and where it was given (the
/// field path errors name).
#[derive(Clone, PartialEq)]
pub struct MediaInput {
    pub kind: MediaKind,
    /// The file format its header says (`png`, `jpeg`, `wav`, …).
    pub format: &'static str,
    pub bytes: Vec<u8>,
    pub at: String,
}

impl std::fmt::Debug for MediaInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MediaInput({} {} bytes at {})", self.format, self.bytes.len(), self.at)
    }
}

/// Whether a content part's `type` is one of the media parts.
pub fn is_media_part(ty: &str) -> bool {
    matches!(ty, "image" | "audio" | "image_url" | "input_image" | "input_audio")
}

/// Reads the media part `part` (at field path `at`).
pub fn parse_media_part(part: &Map<String, Json>, ty: &str, at: &str) -> Result<MediaInput> {
    let field = |name: &str| format!("{at}.{name}");
    let (want, bytes) = match ty {
        "image" | "audio" => {
            let want = if ty == "image" { MediaKind::Image } else { MediaKind::Audio };
            let data = match part.get("data") {
                Some(Json::String(s)) => s,
                Some(other) => {
                    return Err(EngineError::invalid(
                        &field("data"),
                        format!("expected base64 text (or bytes, in JavaScript), got {}", type_name(other)),
                    ))
                }
                None => return Err(EngineError::invalid(&field("data"), "required: the file's bytes (base64)")),
            };
            let data = data.strip_prefix("data:").map_or(Ok(data.as_str()), |_| data_url_payload(data, &field("data")))?;
            (want, decode_base64(data).map_err(|why| EngineError::invalid(&field("data"), why))?)
        }
        "image_url" | "input_image" => {
            let (url, name) = match part.get("image_url") {
                Some(Json::String(u)) => (u, "image_url"),
                Some(Json::Object(o)) => match o.get("url") {
                    Some(Json::String(u)) => (u, "image_url.url"),
                    _ => return Err(EngineError::invalid(&field("image_url.url"), "required: a data: URL")),
                },
                _ => return Err(EngineError::invalid(&field("image_url"), "required: { url } with a data: URL")),
            };
            let payload = data_url_payload(url, &field(name))?;
            (MediaKind::Image, decode_base64(payload).map_err(|why| EngineError::invalid(&field(name), why))?)
        }
        "input_audio" => {
            let o = part
                .get("input_audio")
                .and_then(Json::as_object)
                .ok_or_else(|| EngineError::invalid(&field("input_audio"), "required: { data, format }"))?;
            let data = o
                .get("data")
                .and_then(Json::as_str)
                .ok_or_else(|| EngineError::invalid(&field("input_audio.data"), "required: the audio file's bytes (base64)"))?;
            (MediaKind::Audio, decode_base64(data).map_err(|why| EngineError::invalid(&field("input_audio.data"), why))?)
        }
        other => return Err(EngineError::invalid(&field("type"), format!("not a media part: {:?}", truncate(other, 40)))),
    };
    let (kind, format) = sniff(&bytes).map_err(|why| EngineError::invalid(at, why))?;
    if kind != want {
        return Err(EngineError::invalid(at, format!("a {ty} part holds {} data ({format})", kind.as_str())));
    }
    Ok(MediaInput { kind, format, bytes, at: at.to_string() })
}

/// llama-server's marker of a media file's place in a prompt's text.
pub const LLAMA_MEDIA_MARKER: &str = "<__media__>";

/// llama-server's multimodal prompt, `{ prompt_string, multimodal_data:
/// [base64 | data: URL, …] }` (at `at`): its text with each
/// `<__media__>` as the engine's marker, and one file per marker, in
/// order (an image or an audio clip, as its bytes say).
pub fn multimodal_prompt(obj: &Map<String, Json>, at: &str) -> Result<(String, Vec<MediaInput>)> {
    let text = match obj.get("prompt_string") {
        Some(Json::String(t)) => t,
        _ => return Err(EngineError::invalid(&format!("{at}.prompt_string"), "required: the prompt's text")),
    };
    if text.contains(MEDIA_MARKER) {
        return Err(EngineError::invalid(&format!("{at}.prompt_string"), format!("text must not contain {MEDIA_MARKER}")));
    }
    let files = match obj.get("multimodal_data") {
        None | Some(Json::Null) => &Vec::new(),
        Some(Json::Array(f)) => f,
        Some(other) => {
            return Err(EngineError::invalid(
                &format!("{at}.multimodal_data"),
                format!("expected an array of files in base64, got {}", type_name(other)),
            ))
        }
    };
    let markers = text.matches(LLAMA_MEDIA_MARKER).count();
    if markers != files.len() {
        return Err(EngineError::invalid(
            &format!("{at}.multimodal_data"),
            format!("{} file(s) for {markers} {LLAMA_MEDIA_MARKER} marker(s) in prompt_string: one file per marker", files.len()),
        ));
    }
    if files.len() > MAX_MEDIA_PARTS {
        return Err(EngineError::invalid(
            &format!("{at}.multimodal_data"),
            format!("at most {MAX_MEDIA_PARTS} images and audio files per request"),
        ));
    }
    let media = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let here = format!("{at}.multimodal_data[{i}]");
            let Json::String(data) = f else {
                return Err(EngineError::invalid(&here, format!("expected a file in base64, got {}", type_name(f))));
            };
            let payload = if data.starts_with("data:") { data_url_payload(data, &here)? } else { data.as_str() };
            let bytes = decode_base64(payload).map_err(|why| EngineError::invalid(&here, why))?;
            let (kind, format) = sniff(&bytes).map_err(|why| EngineError::invalid(&here, why))?;
            Ok(MediaInput { kind, format, bytes, at: here })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((text.replace(LLAMA_MEDIA_MARKER, MEDIA_MARKER), media))
}

/// The base64 payload of a `data:` URL.
fn data_url_payload<'a>(url: &'a str, at: &str) -> Result<&'a str> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Err(EngineError::invalid(
            at,
            "remote media are fetched only by a server started with --allow-remote-media: send the bytes in a data: URL",
        ));
    }
    let rest = url.strip_prefix("data:").ok_or_else(|| EngineError::invalid(at, "expected a data: URL (data:image/png;base64,…)"))?;
    let (head, payload) = rest.split_once(',').ok_or_else(|| EngineError::invalid(at, "a data: URL needs a comma before its data"))?;
    if !head.ends_with(";base64") {
        return Err(EngineError::invalid(at, "only base64 data: URLs are read (data:…;base64,…)"));
    }
    Ok(payload)
}

/// Standard or URL-safe base64, padding optional, whitespace ignored.
pub fn decode_base64(text: &str) -> std::result::Result<Vec<u8>, String> {
    if text.len() / 4 * 3 > MAX_MEDIA_BYTES + 3 {
        return Err(format!("at most {} MiB per media file", MAX_MEDIA_BYTES >> 20));
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits, mut ended) = (0u32, 0u32, false);
    for (i, c) in text.bytes().enumerate() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => {
                ended = true;
                continue;
            }
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return Err(format!("not base64: byte {c:#04x} at {i}")),
        };
        if ended {
            return Err(format!("not base64: data after '=' padding at {i}"));
        }
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits >= 6 {
        return Err("not base64: its length is not a whole number of bytes".into());
    }
    if out.is_empty() {
        return Err("is empty".into());
    }
    Ok(out)
}

/// What a file's header says it is; its dimensions checked for images.
pub fn sniff(b: &[u8]) -> std::result::Result<(MediaKind, &'static str), String> {
    if b.len() > MAX_MEDIA_BYTES {
        return Err(format!("{} bytes: at most {} MiB per media file", b.len(), MAX_MEDIA_BYTES >> 20));
    }
    let image = |format: &'static str, size: Option<(u32, u32)>| -> std::result::Result<(MediaKind, &'static str), String> {
        let (w, h) = size.ok_or_else(|| format!("a truncated or damaged {format}: no image size in its header"))?;
        if w == 0 || h == 0 {
            return Err(format!("a {format} of {w}x{h} pixels"));
        }
        if w > MAX_IMAGE_SIDE || h > MAX_IMAGE_SIDE || u64::from(w) * u64::from(h) > MAX_IMAGE_PIXELS {
            return Err(format!("a {w}x{h} {format}: at most {MAX_IMAGE_PIXELS} pixels and {MAX_IMAGE_SIDE} per side"));
        }
        Ok((MediaKind::Image, format))
    };
    let be32 = |i: usize| b.get(i..i + 4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]));
    let le16 = |i: usize| b.get(i..i + 2).map(|s| u32::from(u16::from_le_bytes([s[0], s[1]])));
    let le32 = |i: usize| b.get(i..i + 4).map(|s| i32::from_le_bytes([s[0], s[1], s[2], s[3]]));
    if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        let size = (b.get(12..16) == Some(b"IHDR")).then(|| be32(16).zip(be32(20))).flatten();
        return image("png", size);
    }
    if b.starts_with(&[0xff, 0xd8, 0xff]) {
        return image("jpeg", jpeg_size(b));
    }
    if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
        return image("gif", le16(6).zip(le16(8)));
    }
    if b.starts_with(b"BM") {
        let size = le32(18).zip(le32(22)).map(|(w, h)| (w.unsigned_abs(), h.unsigned_abs()));
        return image("bmp", size);
    }
    if b.len() >= 12 && &b[0..4] == b"RIFF" && &b[8..12] == b"WAVE" {
        return Ok((MediaKind::Audio, "wav"));
    }
    if b.starts_with(b"fLaC") {
        return Ok((MediaKind::Audio, "flac"));
    }
    if b.starts_with(b"ID3") || (b.len() >= 2 && b[0] == 0xff && b[1] & 0xe0 == 0xe0) {
        return Ok((MediaKind::Audio, "mp3"));
    }
    Err("not an image or audio file this engine reads (PNG, JPEG, GIF, BMP; WAV, MP3, FLAC)".into())
}

/// A JPEG's size, from its first start-of-frame segment.
fn jpeg_size(b: &[u8]) -> Option<(u32, u32)> {
    let mut i = 2;
    while i + 4 <= b.len() {
        if b[i] != 0xff {
            return None;
        }
        let marker = b[i + 1];
        if marker == 0xff {
            i += 1;
            continue;
        }
        let len = usize::from(u16::from_be_bytes([b[i + 2], b[i + 3]]));
        let sof = matches!(marker, 0xc0..=0xcf) && !matches!(marker, 0xc4 | 0xc8 | 0xcc);
        if sof {
            let s = b.get(i + 5..i + 9)?;
            return Some((u32::from(u16::from_be_bytes([s[2], s[3]])), u32::from(u16::from_be_bytes([s[0], s[1]]))));
        }
        if len < 2 {
            return None;
        }
        i += 2 + len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend(w.to_be_bytes());
        b.extend(h.to_be_bytes());
        b.extend([8, 2, 0, 0, 0]);
        b
    }

    fn b64(bytes: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for c in bytes.chunks(3) {
            let n = (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
            for k in 0..4 {
                s.push(if k <= c.len() { A[(n >> (18 - 6 * k)) as usize & 63] as char } else { '=' });
            }
        }
        s
    }

    #[test]
    fn base64_round_trips_and_refuses_garbage() {
        for n in 1..40 {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(decode_base64(&b64(&bytes)).unwrap(), bytes);
        }
        assert!(decode_base64("").is_err());
        assert!(decode_base64("ab$d").is_err());
        assert!(decode_base64("QQ==QQ").is_err());
        assert!(decode_base64("Q").is_err());
    }

    #[test]
    fn headers_give_kind_and_bounded_size() {
        assert_eq!(sniff(&png(64, 48)).unwrap(), (MediaKind::Image, "png"));
        assert!(sniff(&png(0, 48)).is_err());
        assert!(sniff(&png(100_000, 100_000)).unwrap_err().contains("at most"));
        assert!(sniff(&png(64, 48)[..14]).unwrap_err().contains("truncated"));
        let jpeg = [0xff, 0xd8, 0xff, 0xe0, 0, 4, 0, 0, 0xff, 0xc0, 0, 11, 8, 0, 32, 0, 64, 3];
        assert_eq!(sniff(&jpeg).unwrap(), (MediaKind::Image, "jpeg"));
        assert!(sniff(&jpeg[..10]).is_err());
        assert_eq!(sniff(b"RIFF\0\0\0\0WAVEfmt ").unwrap(), (MediaKind::Audio, "wav"));
        assert!(sniff(b"hello").is_err());
    }

    #[test]
    fn parts_of_every_shape_are_read() {
        let data = b64(&png(8, 8));
        let url = format!("data:image/png;base64,{data}");
        for part in [
            json!({ "type": "image", "data": data }),
            json!({ "type": "image", "data": url }),
            json!({ "type": "image_url", "image_url": { "url": url } }),
            json!({ "type": "input_image", "image_url": url }),
        ] {
            let ty = part["type"].as_str().unwrap().to_string();
            let m = parse_media_part(part.as_object().unwrap(), &ty, "messages[0].content[1]").unwrap();
            assert_eq!((m.kind, m.format, m.bytes.len()), (MediaKind::Image, "png", 29));
        }
        let remote = json!({ "type": "image_url", "image_url": { "url": "https://example.com/a.png" } });
        let e = parse_media_part(remote.as_object().unwrap(), "image_url", "m[0].content[0]").unwrap_err();
        assert!(e.message.contains("--allow-remote-media"), "{}", e.message);
        let wrong = json!({ "type": "audio", "data": data });
        assert!(parse_media_part(wrong.as_object().unwrap(), "audio", "x").unwrap_err().message.contains("holds image data"));
    }
}
