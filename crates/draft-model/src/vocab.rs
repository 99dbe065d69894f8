//! Refusing a draft model whose tokenizer differs from the target's.
//!
//! Draft tokens are verified by id: a draft model that maps ids to
//! different strings proposes nonsense the target rejects (or, worse, that
//! it accepts by accident), so the mismatch has to be caught when the draft
//! model is chosen, not noticed as a poor acceptance rate.

use specmesh_tokenizer::Tokenizer;

/// How the draft model's vocabulary differs from the target's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VocabMismatch {
    #[error(
        "the draft model's vocabulary has {draft} tokens but the target's has {target}: \
         use a draft model with the target's tokenizer (a smaller model of the same family, \
         or a layer-truncated self-draft of the target)"
    )]
    Size { target: usize, draft: usize },
    #[error(
        "token {id} is {target} in the target's vocabulary but {draft} in the draft model's: \
         the draft model uses a different tokenizer; use a draft model with the target's \
         tokenizer (a smaller model of the same family, or a layer-truncated self-draft of the target)"
    )]
    Piece {
        id: u32,
        /// The target's piece, quoted (`<none>` for an unused id).
        target: String,
        /// The draft's piece, quoted (`<none>` for an unused id).
        draft: String,
    },
}

/// Checks that `draft` maps every id to the same piece as `target`.
pub fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<(), VocabMismatch> {
    compare(
        target.vocab_size(),
        draft.vocab_size(),
        |id| target.token_piece(id),
        |id| draft.token_piece(id),
    )
}

/// [`check_vocab`] over plain piece lists (`None` for an unused id), for
/// vocabularies that do not come as a [`Tokenizer`].
pub fn check_pieces(target: &[Option<&str>], draft: &[Option<&str>]) -> Result<(), VocabMismatch> {
    let piece = |list: &[Option<&str>], id: u32| list[id as usize].map(str::to_owned);
    compare(
        target.len(),
        draft.len(),
        |id| piece(target, id),
        |id| piece(draft, id),
    )
}

fn compare(
    target_len: usize,
    draft_len: usize,
    target: impl Fn(u32) -> Option<String>,
    draft: impl Fn(u32) -> Option<String>,
) -> Result<(), VocabMismatch> {
    if target_len != draft_len {
        return Err(VocabMismatch::Size {
            target: target_len,
            draft: draft_len,
        });
    }
    for id in 0..target_len as u32 {
        let (t, d) = (target(id), draft(id));
        if t != d {
            return Err(VocabMismatch::Piece {
                id,
                target: quote(t),
                draft: quote(d),
            });
        }
    }
    Ok(())
}

fn quote(piece: Option<String>) -> String {
    piece.map_or_else(|| "<none>".to_owned(), |p| format!("{p:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_lists_pass() {
        let v = [Some("a"), None, Some("Ġb")];
        assert_eq!(check_pieces(&v, &v), Ok(()));
    }

    #[test]
    fn the_first_difference_is_reported_with_both_pieces() {
        let t = [Some("a"), Some("b"), Some("c"), Some("d")];
        let d = [Some("a"), Some("b"), Some("x"), None];
        let e = check_pieces(&t, &d).unwrap_err();
        assert_eq!(
            e,
            VocabMismatch::Piece {
                id: 2,
                target: "\"c\"".into(),
                draft: "\"x\"".into()
            }
        );
        let msg = e.to_string();
        assert!(msg.contains("token 2 is \"c\"") && msg.contains("\"x\" in the draft"));
        let e = check_pieces(&t[..3], &[Some("a"), Some("b"), None]).unwrap_err();
        assert!(e.to_string().contains("<none>"));
    }

    #[test]
    fn sizes_are_compared_first() {
        let e = check_pieces(&[Some("a")], &[Some("a"), Some("b")]).unwrap_err();
        assert_eq!(
            e,
            VocabMismatch::Size {
                target: 1,
                draft: 2
            }
        );
        assert!(
            e.to_string()
                .contains("has 2 tokens but the target's has 1")
        );
    }
}
