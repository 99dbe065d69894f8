//! Turning vocabulary strings into the raw bytes each token stands for.
//!
//! Decoding is done per token on bytes rather than through `tokenizers`'
//! decoder chain: a token can hold half of a multi-byte character, and only a
//! byte-exact table lets [`crate::IncrementalDecoder`] emit exactly the text
//! that a whole-sequence decode produces.

use std::sync::OnceLock;

/// How a vocabulary encodes bytes in its token strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PieceEncoding {
    /// GPT-2 byte-level BPE: every byte is mapped to a printable character.
    ByteLevel,
    /// SentencePiece: `▁` stands for a space and `<0xNN>` tokens for raw bytes.
    SentencePiece,
}

/// GPT-2's `bytes_to_unicode` inverse: char code (< 324) to the byte it encodes.
fn char_to_byte_table() -> &'static [Option<u8>; 324] {
    static TABLE: OnceLock<[Option<u8>; 324]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = [None; 324];
        let mut next_unprintable = 256usize;
        for byte in 0u8..=255 {
            let printable = matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            if printable {
                table[usize::from(byte)] = Some(byte);
            } else {
                table[next_unprintable] = Some(byte);
                next_unprintable += 1;
            }
        }
        table
    })
}

/// Map a byte to its GPT-2 byte-level character.
#[cfg(test)]
pub(crate) fn byte_to_char(byte: u8) -> char {
    let table = char_to_byte_table();
    table
        .iter()
        .position(|b| *b == Some(byte))
        .and_then(|code| u32::try_from(code).ok())
        .and_then(char::from_u32)
        .unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// Undo GPT-2 byte-level encoding; `None` if a char is outside the alphabet
/// (added tokens are usually stored as plain text).
pub(crate) fn byte_level_decode(piece: &str) -> Option<Vec<u8>> {
    let table = char_to_byte_table();
    piece
        .chars()
        .map(|c| table.get(c as usize).copied().flatten())
        .collect()
}

/// Parse a SentencePiece byte token such as `<0x0A>`.
pub(crate) fn parse_byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The bytes one token contributes to decoded text.
///
/// `raw` marks tokens whose string is literal text (control and user-defined
/// tokens); `byte` marks SentencePiece byte tokens.
pub(crate) fn piece_bytes(encoding: PieceEncoding, piece: &str, raw: bool, byte: bool) -> Vec<u8> {
    if raw {
        return piece.as_bytes().to_vec();
    }
    match encoding {
        // Same fallback as `tokenizers`' ByteLevel decoder: a string that is not
        // byte-level encoded is taken literally.
        PieceEncoding::ByteLevel => {
            byte_level_decode(piece).unwrap_or_else(|| piece.as_bytes().to_vec())
        }
        PieceEncoding::SentencePiece => {
            if byte && let Some(b) = parse_byte_token(piece) {
                return vec![b];
            }
            piece.replace('\u{2581}', " ").into_bytes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_round_trips_every_byte() {
        for byte in 0u8..=255 {
            let c = byte_to_char(byte);
            assert_eq!(byte_level_decode(&c.to_string()), Some(vec![byte]));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
    }

    #[test]
    fn byte_level_rejects_plain_text_outside_the_alphabet() {
        assert_eq!(byte_level_decode("a b"), None);
        assert_eq!(
            piece_bytes(PieceEncoding::ByteLevel, "a b", false, false),
            b"a b"
        );
    }

    #[test]
    fn sentencepiece_pieces() {
        let sp = PieceEncoding::SentencePiece;
        assert_eq!(piece_bytes(sp, "▁Hello", false, false), b" Hello");
        assert_eq!(piece_bytes(sp, "<0x0A>", false, true), b"\n");
        assert_eq!(piece_bytes(sp, "<0xZZ>", false, true), b"<0xZZ>");
        assert_eq!(piece_bytes(sp, "<s>", true, false), b"<s>");
        assert_eq!(parse_byte_token("<0xE2>"), Some(0xE2));
        assert_eq!(parse_byte_token("<0x2>"), None);
    }
}
