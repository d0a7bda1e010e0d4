//! The `multipart/form-data` bodies the SDKs upload to `/files` (pure): each part a file,
//! `name="file"`, its destination in `filename` (the SDKs put the sandbox path there), its
//! data sliced out of the body without a copy. Filenames are unquoted the way the SDKs'
//! HTTP clients quote them (`%22` for `"`, `\\` for `\`, `%XX` for control characters).

use bytes::Bytes;

/// One part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The form field's name.
    pub name: String,
    /// The part's filename, when it has one.
    pub filename: Option<String>,
    /// Its content.
    pub data: Bytes,
}

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.eq_ignore_ascii_case("boundary")
            .then(|| v.trim_matches('"').to_string())
            .filter(|b| !b.is_empty())
    })
}

/// The parts of `body`, or what is wrong with it.
pub fn parse(body: &Bytes, boundary: &str) -> Result<Vec<Part>, String> {
    let delimiter = format!("--{boundary}");
    let next = format!("\r\n--{boundary}");
    let mut at = find(body, delimiter.as_bytes(), 0).ok_or("no boundary in the body")?;
    at += delimiter.len();
    let mut parts = Vec::new();
    loop {
        match body.get(at..at + 2) {
            Some(b"--") => return Ok(parts),
            Some(b"\r\n") => at += 2,
            _ => return Err("a boundary is not followed by a line end".into()),
        }
        let head_end = find(body, b"\r\n\r\n", at).ok_or("a part's headers never end")?;
        let head = std::str::from_utf8(&body[at..head_end]).map_err(|_| "a header is not UTF-8")?;
        let data_start = head_end + 4;
        let data_end = find(body, next.as_bytes(), data_start).ok_or("the body is cut short")?;
        let (name, filename) = disposition(head)?;
        parts.push(Part {
            name,
            filename,
            data: body.slice(data_start..data_end),
        });
        at = data_end + next.len();
    }
}

/// The field name and filename of a part's `Content-Disposition`.
fn disposition(head: &str) -> Result<(String, Option<String>), String> {
    let line = head
        .split("\r\n")
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-disposition")
                .then_some(v)
        })
        .ok_or("a part has no Content-Disposition")?;
    let (mut name, mut filename) = (None, None);
    for param in params(line) {
        match param {
            ("name", v) => name = Some(unquote(v)),
            ("filename", v) => filename = Some(unquote(v)),
            _ => {}
        }
    }
    Ok((name.ok_or("a part has no name")?, filename))
}

/// `key=value` pairs after the disposition type, splitting on `;` outside quotes.
fn params(line: &str) -> Vec<(&str, &str)> {
    let (mut out, mut start, mut quoted) = (Vec::new(), 0, false);
    let bytes = line.as_bytes();
    for i in 0..=bytes.len() {
        match bytes.get(i) {
            Some(b'"') if i == 0 || bytes[i - 1] != b'\\' => quoted = !quoted,
            Some(b';') | None if !quoted => {
                if let Some((k, v)) = line[start..i].split_once('=') {
                    out.push((k.trim(), v.trim()));
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    out
}

/// A quoted parameter value, unescaped.
fn unquote(value: &str) -> String {
    let inner = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    let mut out = String::with_capacity(inner.len());
    let mut rest = inner;
    while let Some(c) = rest.chars().next() {
        let escaped = rest.get(1..3).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (c, escaped) {
            ('%', Some(b)) if b == b'"' || b < 0x20 => {
                out.push(char::from(b));
                rest = &rest[3..];
            }
            ('\\', _) if rest[1..].starts_with('\\') => {
                out.push('\\');
                rest = &rest[2..];
            }
            _ => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

/// The first `needle` in `hay` at or after `from`.
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let first = *needle.first()?;
    let mut i = from;
    while i + needle.len() <= hay.len() {
        let offset = hay[i..].iter().position(|b| *b == first)?;
        i += offset;
        if hay.get(i..i + needle.len()) == Some(needle) {
            return Some(i);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(parts: &[(&str, &str, &[u8])]) -> Bytes {
        let mut out = b"preamble\r\n".to_vec();
        for (name, filename, data) in parts {
            out.extend_from_slice(b"--XyZ\r\n");
            let head = format!(
                "Content-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            );
            out.extend_from_slice(head.as_bytes());
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"--XyZ--\r\n");
        Bytes::from(out)
    }

    #[test]
    fn the_boundary_comes_from_the_content_type() {
        let ct = "multipart/form-data; boundary=\"XyZ\"";
        assert_eq!(boundary(ct).as_deref(), Some("XyZ"));
        assert_eq!(
            boundary("multipart/form-data; boundary=a1").as_deref(),
            Some("a1")
        );
        assert_eq!(boundary("application/json; boundary=a1"), None);
        assert_eq!(boundary("multipart/form-data"), None);
    }

    #[test]
    fn several_files_come_out_whole_with_every_byte() {
        let binary: Vec<u8> = (0..=255).chain(b"\r\n--Xy".iter().copied()).collect();
        let b = body(&[
            ("file", "/tmp/a.txt", b"hello"),
            ("file", "/tmp/d/b.bin", &binary),
        ]);
        let parts = parse(&b, "XyZ").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "file");
        assert_eq!(parts[0].filename.as_deref(), Some("/tmp/a.txt"));
        assert_eq!(&parts[0].data[..], b"hello");
        assert_eq!(&parts[1].data[..], &binary[..]);
        assert_eq!(
            parse(&body(&[("file", "/e", b"")]), "XyZ").unwrap()[0]
                .data
                .len(),
            0
        );
    }

    #[test]
    fn quoted_filenames_are_unescaped() {
        let b = body(&[("file", "/tmp/a%22b;c\\\\d%0A", b"x")]);
        let parts = parse(&b, "XyZ").unwrap();
        assert_eq!(parts[0].filename.as_deref(), Some("/tmp/a\"b;c\\d\n"));
        assert_eq!(unquote("\"100%25\""), "100%25");
    }

    #[test]
    fn cut_or_foreign_bodies_are_refused() {
        let whole = body(&[("file", "/a", b"data")]);
        assert!(parse(&whole.slice(..whole.len() - 12), "XyZ").is_err());
        assert!(parse(&whole, "other").is_err());
        let nameless = Bytes::from_static(b"--B\r\nContent-Type: x\r\n\r\ndata\r\n--B--");
        assert!(parse(&nameless, "B").is_err());
    }
}
