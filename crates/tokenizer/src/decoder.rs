//! Streaming detokenization: turns ids into text one token at a time without
//! ever emitting half of a UTF-8 character.
//!
//! Byte-level vocabularies split multi-byte characters (emoji, CJK) across
//! tokens, so a token's bytes alone are often not valid UTF-8. The decoder
//! buffers an incomplete trailing sequence until the bytes that complete it
//! arrive. Invalid bytes are replaced exactly as `String::from_utf8_lossy`
//! replaces them in a whole-sequence decode, so the concatenation of every
//! chunk plus [`IncrementalDecoder::finish`] equals [`Tokenizer::decode`].

use crate::{Tokenizer, TokenizerError};

/// Incremental detokenizer; see the module docs.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    tokenizer: Tokenizer,
    skip_special: bool,
    /// Bytes of a character whose remaining bytes have not arrived yet.
    pending: Vec<u8>,
    /// Whether any byte has been produced yet (for the leading-space strip).
    started: bool,
}

impl IncrementalDecoder {
    pub(crate) fn new(tokenizer: Tokenizer, skip_special: bool) -> Self {
        Self {
            tokenizer,
            skip_special,
            pending: Vec::new(),
            started: false,
        }
    }

    /// Feed one id; returns the text it completed, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        let Some(bytes) = self.tokenizer.bytes_of(id, self.skip_special)? else {
            return Ok(None);
        };
        let mut bytes = bytes;
        if !self.started && !bytes.is_empty() {
            self.started = true;
            // Mirrors `decode`, which drops the first byte of the whole output
            // when it is the space a SentencePiece encoder prepended.
            if self.tokenizer.strips_leading_space()
                && let Some(rest) = bytes.strip_prefix(b" ")
            {
                bytes = rest;
            }
        }
        self.pending.extend_from_slice(bytes);
        let text = self.drain_complete();
        Ok((!text.is_empty()).then_some(text))
    }

    /// Feed several ids; returns the concatenated completed text.
    pub fn push_all(&mut self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut out = String::new();
        for &id in ids {
            if let Some(text) = self.push(id)? {
                out.push_str(&text);
            }
        }
        Ok(out)
    }

    /// Flush whatever is buffered (an incomplete character becomes U+FFFD)
    /// and reset the decoder for a new sequence.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.started = false;
        rest
    }

    /// Whether bytes of an incomplete character are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Decode the longest prefix of `pending` whose meaning cannot change,
    /// keeping only a trailing sequence that more bytes could still complete.
    fn drain_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    out.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(err) => {
                    let (valid, after) = rest.split_at(err.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(valid));
                    match err.error_len() {
                        Some(len) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = after.get(len..).unwrap_or_default();
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let kept = rest.len();
        let drop = self.pending.len() - kept;
        self.pending.drain(..drop);
        out
    }
}
