//! Stop strings over streamed text.
//!
//! Text arrives a token at a time, and a stop string can span tokens, so
//! the matcher holds back the longest tail of the text that could still
//! grow into a stop string and releases everything before it. On a match,
//! the text before the stop string is released and the rest is dropped.
//! The earliest match wins; a match is acted on as soon as it completes,
//! as a streaming client would see it.
//!
//! ```text
//! stops: ["</s>"]      pushed        released   held
//!                      "Hello <"  →  "Hello "    "<"
//!                      "/"        →  ""          "</"
//!                      "s> more"  →  stop: ""    (dropped)
//! ```
//!
//! Positions are bytes; cuts always fall on character boundaries, since
//! both the text and the stop strings are UTF-8.

/// Finds stop strings in text pushed piece by piece.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text not yet released: the tail a stop string could still start in.
    held: String,
}

/// What a push released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan {
    /// No stop string yet; this text is final.
    Pass(String),
    /// A stop string matched; this is the text before it, and nothing
    /// more may be released.
    Stop(String),
}

impl StopMatcher {
    /// Matches `stops`; empty strings are ignored (validation refuses them).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Appends `text` and returns what can be released.
    pub fn push(&mut self, text: &str) -> Scan {
        if self.stops.is_empty() {
            return Scan::Pass(text.to_owned());
        }
        self.held.push_str(text);
        if let Some(at) = self.earliest_match() {
            let before = self.held[..at].to_owned();
            self.held.clear();
            return Scan::Stop(before);
        }
        let cut = self.held.len() - self.partial_match_len();
        Scan::Pass(self.held.drain(..cut).collect())
    }

    /// Releases the held-back tail: the text ended without a match.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Start of the earliest complete stop string in the held text.
    fn earliest_match(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
    }

    /// Length of the longest tail of the held text that is a proper prefix
    /// of some stop string (the text a later push could complete).
    fn partial_match_len(&self) -> usize {
        let held = self.held.as_bytes();
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let first = held.len().saturating_sub(longest.saturating_sub(1));
        (first..held.len())
            .filter(|&start| self.held.is_char_boundary(start))
            .find(|&start| {
                let tail = &held[start..];
                self.stops.iter().any(|s| s.as_bytes().starts_with(tail))
            })
            .map_or(0, |start| held.len() - start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| (*s).to_owned()).collect())
    }

    fn pass(s: &str) -> Scan {
        Scan::Pass(s.to_owned())
    }

    #[test]
    fn without_stops_text_passes_through() {
        let mut m = matcher(&[]);
        assert_eq!(m.push("abc"), pass("abc"));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn a_stop_string_split_over_pushes_is_held_back_then_cut() {
        let mut m = matcher(&["</s>"]);
        assert_eq!(m.push("Hello <"), pass("Hello "));
        assert_eq!(m.push("/"), pass(""));
        assert_eq!(m.push("s> more"), Scan::Stop(String::new()));
    }

    #[test]
    fn a_false_start_is_released_once_it_cannot_match() {
        let mut m = matcher(&["</s>"]);
        assert_eq!(m.push("a </"), pass("a "));
        assert_eq!(m.push("b>"), pass("</b>"));
        assert_eq!(m.push("<"), pass(""));
        assert_eq!(m.finish(), "<");
    }

    #[test]
    fn the_text_before_the_match_in_the_same_push_is_kept() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(
            m.push("one two STOP three"),
            Scan::Stop("one two ".to_owned())
        );
    }

    #[test]
    fn the_earliest_match_wins() {
        let mut m = matcher(&["cd", "bcde"]);
        assert_eq!(m.push("abcdef"), Scan::Stop("a".to_owned()));
        // A longer stop still open does not delay a completed shorter one.
        let mut m = matcher(&["abcX", "b"]);
        assert_eq!(m.push("ab"), Scan::Stop("a".to_owned()));
    }

    #[test]
    fn the_holdback_covers_the_longest_possible_start() {
        let mut m = matcher(&["aab"]);
        assert_eq!(m.push("xaa"), pass("x"));
        assert_eq!(m.push("a"), pass("a"));
        assert_eq!(m.push("b!"), Scan::Stop(String::new()));
    }

    #[test]
    fn multi_byte_characters_are_never_split() {
        // "é" is C3 A9; a stop "éa" must hold back the whole "é".
        let mut m = matcher(&["éa"]);
        assert_eq!(m.push("café"), pass("caf"));
        assert_eq!(m.push("b"), pass("éb"));
        assert_eq!(m.push("é"), pass(""));
        assert_eq!(m.push("a"), Scan::Stop(String::new()));
        // A tail sharing only a byte prefix with a stop is not held: "é"
        // (C3 A9) and "ê" (C3 AA) share C3, but a char boundary never falls
        // inside the character.
        let mut m = matcher(&["ê"]);
        assert_eq!(m.push("é"), pass("é"));
        let mut m = matcher(&["🙂!"]);
        assert_eq!(m.push("x🙂"), pass("x"));
        assert_eq!(m.push("!"), Scan::Stop(String::new()));
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let mut m = matcher(&[""]);
        assert_eq!(m.push("abc"), pass("abc"));
    }
}
