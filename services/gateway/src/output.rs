//! Committed tokens → the text and token ids the caller sees.
//!
//! Tokens are detokenized incrementally (a UTF-8 character split across
//! tokens waits for its last byte; special tokens produce no text, as in
//! `specmesh generate --json`), then pass the stop-string matcher, which may
//! hold back a tail. A token is released to the caller together with the
//! last byte of its text, so every chunk's `token_ids` are exactly the
//! tokens whose text has been sent so far.
//!
//! When a stop string cuts the text, `token_ids` holds the tokens whose
//! text lies entirely before the cut. A token whose text straddles the cut
//! (`"x</"` for the stop `"</s>"`) contributes its text before the cut
//! (`"x"`) but is not listed, nor is any later token. So `decode(token_ids)`
//! is always a prefix of `text`, and differs from it by less than one token.

use specmesh_proto::v1::{TokenLogprob, ToolCall};
use specmesh_tokenizer::{IncrementalDecoder, Tokenizer, TokenizerError};

use crate::stop::{Scan, StopMatcher};

mod calls;

pub use calls::Calls;

/// Text and tokens released since the previous delta.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delta {
    pub text: String,
    pub token_ids: Vec<u32>,
    /// With logprobs asked: one per token id, with its text.
    pub logprobs: Vec<TokenLogprob>,
    /// With tools offered: the calls completed (their text is not in
    /// `text`).
    pub tool_calls: Vec<ToolCall>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.token_ids.is_empty() && self.tool_calls.is_empty()
    }
}

/// Builds the caller's view of a generation; see the module docs.
#[derive(Debug)]
pub struct OutputBuilder {
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    /// Every token committed by the verifiers, the authoritative output.
    committed: Vec<u32>,
    /// With logprobs asked: one per committed token (the tokenizer names
    /// their text).
    logprobs: Option<(Tokenizer, Vec<TokenLogprob>)>,
    /// `ends[i]`: byte offset in the decoded text where `committed[i]`'s
    /// text ends. Known only once no byte of the token is pending in the
    /// decoder, so it may be shorter than `committed`.
    ends: Vec<usize>,
    /// Bytes the decoder has produced.
    decoded: usize,
    /// Bytes released to the caller.
    released: usize,
    /// Tokens released to the caller.
    reported: usize,
    stopped: bool,
    /// With tools offered: splits the released text into content and calls.
    calls: Option<Calls>,
}

impl OutputBuilder {
    pub fn new(tokenizer: &Tokenizer, stop: Vec<String>) -> Self {
        OutputBuilder {
            decoder: tokenizer.incremental_decoder_with(true),
            stop: StopMatcher::new(stop),
            committed: Vec::new(),
            logprobs: None,
            ends: Vec::new(),
            decoded: 0,
            released: 0,
            reported: 0,
            stopped: false,
            calls: None,
        }
    }

    /// Parses tool calls out of the text.
    pub fn with_calls(mut self, calls: Calls) -> Self {
        self.calls = Some(calls);
        self
    }

    /// Whether the output made tool calls.
    pub fn called(&self) -> bool {
        self.calls.as_ref().is_some_and(|c| c.made() > 0)
    }

    /// Reports each token's log-probability (given with [`Self::push`]).
    pub fn with_logprobs(mut self, tokenizer: &Tokenizer) -> Self {
        self.logprobs = Some((tokenizer.clone(), Vec::new()));
        self
    }

    /// Every token committed so far (what a resumed session must be given).
    pub fn committed(&self) -> &[u32] {
        &self.committed
    }

    /// Tokens released to the caller so far.
    pub fn reported(&self) -> usize {
        self.reported
    }

    /// Whether a stop string ended the output.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds committed tokens. After a stop string matched, the rest of the
    /// step (and anything later) is ignored.
    /// `logprobs` are the tokens' own (one per token when asked, else
    /// ignored; a missing one reads as an empty entry).
    pub fn push(
        &mut self,
        tokens: &[u32],
        logprobs: &[TokenLogprob],
    ) -> Result<Delta, TokenizerError> {
        let mut text = String::new();
        for (i, &id) in tokens.iter().enumerate() {
            if self.stopped {
                break;
            }
            self.committed.push(id);
            if let Some((tokenizer, out)) = self.logprobs.as_mut() {
                let mut l = logprobs.get(i).cloned().unwrap_or_default();
                l.token_id = id;
                named(tokenizer, &mut l);
                out.push(l);
            }
            let piece = self.decoder.push(id)?.unwrap_or_default();
            self.decoded += piece.len();
            if !self.decoder.has_pending() {
                self.resolve();
            }
            self.scan(&piece, &mut text);
        }
        Ok(self.release(text))
    }

    /// Ends the output (length or EOS): flushes the decoder and the stop
    /// matcher's held-back tail, and releases every token.
    pub fn finish(&mut self) -> Delta {
        let mut text = String::new();
        if !self.stopped {
            let rest = self.decoder.finish();
            self.decoded += rest.len();
            self.resolve();
            self.scan(&rest, &mut text);
        }
        if !self.stopped {
            let tail = self.stop.finish();
            self.released += tail.len();
            text.push_str(&tail);
        }
        let mut delta = self.release(text);
        if let Some(calls) = self.calls.as_mut() {
            calls.finish(&mut delta.text, &mut delta.tool_calls);
        }
        delta
    }

    /// Records the text end of every token whose bytes are all decoded.
    fn resolve(&mut self) {
        let end = self.decoded;
        let pending = self.committed.len() - self.ends.len();
        self.ends.extend(std::iter::repeat_n(end, pending));
    }

    /// Passes decoded text through the stop matcher into `out`.
    fn scan(&mut self, piece: &str, out: &mut String) {
        if piece.is_empty() {
            return;
        }
        let released = match self.stop.push(piece) {
            Scan::Pass(t) => t,
            Scan::Stop(t) => {
                self.stopped = true;
                t
            }
        };
        self.released += released.len();
        out.push_str(&released);
    }

    /// Pairs released text with the tokens it completes.
    fn release(&mut self, text: String) -> Delta {
        let start = self.reported;
        while self
            .ends
            .get(self.reported)
            .is_some_and(|&end| end <= self.released)
        {
            self.reported += 1;
        }
        let (text, tool_calls) = match self.calls.as_mut() {
            None => (text, Vec::new()),
            Some(calls) => {
                let (mut content, mut made) = (String::new(), Vec::new());
                calls.push(&text, &mut content, &mut made);
                (content, made)
            }
        };
        Delta {
            text,
            token_ids: self.committed[start..self.reported].to_vec(),
            logprobs: self
                .logprobs
                .as_ref()
                .map(|(_, l)| l[start..self.reported].to_vec())
                .unwrap_or_default(),
            tool_calls,
        }
    }
}

/// Fills in the text of a log-probability's token and its alternatives.
fn named(tokenizer: &Tokenizer, l: &mut TokenLogprob) {
    let text =
        |id| String::from_utf8_lossy(tokenizer.token_bytes(id).unwrap_or_default()).into_owned();
    l.token = text(l.token_id);
    for t in &mut l.top_logprobs {
        t.token = text(t.token_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{self, HE, IM_START, ids};

    fn builder(stop: &[&str]) -> OutputBuilder {
        OutputBuilder::new(
            &testing::tokenizer(),
            stop.iter().map(|s| (*s).to_owned()).collect(),
        )
    }

    #[test]
    fn without_stops_every_token_is_released_with_its_text() {
        let mut b = builder(&[]);
        let d = b.push(&ids("ab"), &[]).unwrap();
        assert_eq!(
            d,
            Delta {
                text: "ab".into(),
                token_ids: ids("ab"),
                ..Default::default()
            }
        );
        let d = b.finish();
        assert!(d.is_empty());
        assert_eq!(b.reported(), 2);
    }

    #[test]
    fn a_split_character_waits_for_its_last_byte_and_so_does_its_token() {
        let mut b = builder(&[]);
        let e = ids("é"); // two byte tokens
        let d = b.push(&e[..1], &[]).unwrap();
        assert_eq!(d, Delta::default());
        let d = b.push(&e[1..], &[]).unwrap();
        assert_eq!(
            d,
            Delta {
                text: "é".into(),
                token_ids: e,
                ..Default::default()
            }
        );
    }

    #[test]
    fn held_back_text_holds_back_its_tokens() {
        let mut b = builder(&["</s>"]);
        let d = b.push(&ids("hi <"), &[]).unwrap();
        assert_eq!(
            d,
            Delta {
                text: "hi ".into(),
                token_ids: ids("hi "),
                ..Default::default()
            }
        );
        // A false start: "<b" is released with both tokens.
        let d = b.push(&ids("b"), &[]).unwrap();
        assert_eq!(
            d,
            Delta {
                text: "<b".into(),
                token_ids: ids("<b"),
                ..Default::default()
            }
        );
        let d = b.push(&ids("</"), &[]).unwrap();
        assert!(d.is_empty());
        let d = b.finish();
        assert_eq!(
            d,
            Delta {
                text: "</".into(),
                token_ids: ids("</"),
                ..Default::default()
            }
        );
        assert!(!b.stopped());
    }

    #[test]
    fn a_stop_cut_reports_only_tokens_before_it() {
        let mut b = builder(&["</s>"]);
        let d = b.push(&ids("ok</s>more"), &[]).unwrap();
        assert_eq!(
            d,
            Delta {
                text: "ok".into(),
                token_ids: ids("ok"),
                ..Default::default()
            }
        );
        assert!(b.stopped());
        // The matching step's later tokens are not even recorded.
        assert_eq!(b.committed(), ids("ok</s>").as_slice());
        assert!(b.push(&ids("x"), &[]).unwrap().is_empty());
        assert!(b.finish().is_empty());
    }

    #[test]
    fn a_token_straddling_the_cut_gives_its_text_but_not_its_id() {
        let mut b = builder(&["e!"]);
        // HE decodes to "he": its "h" is before the stop, its "e" starts it.
        let d = b.push(&[u32::from(b'x'), HE], &[]).unwrap();
        assert_eq!(
            d,
            Delta {
                text: "xh".into(),
                token_ids: ids("x"),
                ..Default::default()
            }
        );
        let d = b.push(&ids("!"), &[]).unwrap();
        assert!(d.is_empty());
        assert!(b.stopped());
        assert_eq!(b.reported(), 1);
        assert!(b.finish().is_empty());
    }

    #[test]
    fn special_tokens_add_no_text_but_are_reported() {
        let mut b = builder(&[]);
        let d = b
            .push(&[u32::from(b'a'), IM_START, u32::from(b'b')], &[])
            .unwrap();
        assert_eq!(
            d,
            Delta {
                text: "ab".into(),
                token_ids: vec![u32::from(b'a'), IM_START, u32::from(b'b')],
                ..Default::default()
            }
        );
    }

    #[test]
    fn an_incomplete_character_at_the_end_is_flushed() {
        let mut b = builder(&[]);
        let e = ids("é");
        assert!(b.push(&e[..1], &[]).unwrap().is_empty());
        let d = b.finish();
        assert_eq!(
            d,
            Delta {
                text: "\u{fffd}".into(),
                token_ids: e[..1].to_vec(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn logprobs_travel_with_their_tokens_and_carry_their_text() {
        let tok = testing::tokenizer();
        let mut b = OutputBuilder::new(&tok, vec!["</s>".into()]).with_logprobs(&tok);
        let lp = |id: u32, logprob: f32| TokenLogprob {
            token_id: id,
            logprob,
            top_logprobs: vec![TokenLogprob {
                token_id: u32::from(b'z'),
                logprob: -0.5,
                ..Default::default()
            }],
            ..Default::default()
        };
        let tokens = ids("ok</");
        let given: Vec<TokenLogprob> = tokens.iter().map(|&t| lp(t, -0.25)).collect();
        let d = b.push(&tokens, &given).unwrap();
        // "</" is held back with its logprobs.
        assert_eq!(d.token_ids, ids("ok"));
        assert_eq!(d.logprobs.len(), 2);
        assert_eq!(d.logprobs[0].token, "o");
        assert_eq!(d.logprobs[0].top_logprobs[0].token, "z");
        let d = b.finish();
        assert_eq!(d.logprobs.len(), d.token_ids.len());
    }

    #[test]
    fn an_out_of_vocabulary_token_is_an_error() {
        let mut b = builder(&[]);
        assert!(b.push(&[100_000], &[]).is_err());
    }
}
