//! Text from untrusted files: reading a file as UTF-8 with the offset of the first bad byte,
//! and showing a name read from a file (a GGUF key, a tensor name) safely in a message.

use std::path::Path;

/// Read the whole file at `path` as UTF-8.
///
/// Errors: the open/read error, or an [`std::io::ErrorKind::InvalidData`] error saying at which
/// byte offset the text stops being UTF-8 (`std::fs::read_to_string` only says "stream did not
/// contain valid UTF-8").
pub fn read_utf8(path: &Path) -> std::io::Result<String> {
    let bytes = std::fs::read(path)?;
    String::from_utf8(bytes).map_err(|e| {
        let err = e.utf8_error();
        let at = err.valid_up_to();
        let bad = &e.as_bytes()[at..at + err.error_len().unwrap_or(e.as_bytes().len() - at)];
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not valid UTF-8: byte offset {at} starts an invalid sequence {bad:02x?}"),
        )
    })
}

/// Longest name [`shown`] prints in full.
const SHOWN_MAX_CHARS: usize = 80;

/// `name` (read from a file) as it should appear in a message: control and other
/// non-printable characters escaped (`\u{1b}`, `\n`), so a crafted key cannot write terminal
/// escapes or fake lines into the output, and cut after 80 characters with the full length.
pub fn shown(name: &str) -> String {
    let mut out: String = name
        .chars()
        .take(SHOWN_MAX_CHARS)
        .flat_map(|c| {
            let printable = !c.is_control() && !matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}');
            let escaped: Vec<char> = if printable {
                vec![c]
            } else {
                c.escape_default().collect()
            };
            escaped
        })
        .collect();
    let n = name.chars().count();
    if n > SHOWN_MAX_CHARS {
        out.push_str(&format!("… ({} bytes)", name.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_utf8_names_the_offset_of_the_bad_byte() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, b"{\"a\": \"\xff\"}").unwrap();
        let e = read_utf8(&p).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(
            e.to_string(),
            "not valid UTF-8: byte offset 7 starts an invalid sequence [ff]"
        );
        std::fs::write(&p, "héllo").unwrap();
        assert_eq!(read_utf8(&p).unwrap(), "héllo");
    }

    #[test]
    fn shown_escapes_control_characters_and_cuts_long_names() {
        assert_eq!(shown("blk.0.attn_q.weight"), "blk.0.attn_q.weight");
        assert_eq!(shown("a\u{1b}[2Jb\n"), "a\\u{1b}[2Jb\\n");
        assert_eq!(shown("x\u{202e}y"), "x\\u{202e}y");
        let long = "k".repeat(1000);
        assert_eq!(shown(&long), format!("{}… (1000 bytes)", "k".repeat(80)));
    }
}
