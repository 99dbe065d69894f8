//! `DraftSources` on the wire and [`Sources`], what a request may draft
//! with, both ways.

use specmesh_tree::Sources;

use crate::field::FieldError;
use crate::v1;

impl From<v1::DraftSources> for Sources {
    fn from(s: v1::DraftSources) -> Sources {
        match s {
            v1::DraftSources::Auto => Sources::Auto,
            v1::DraftSources::ModelFree => Sources::ModelFree,
            v1::DraftSources::DraftModel => Sources::DraftModel,
            v1::DraftSources::Combined => Sources::Combined,
        }
    }
}

impl From<Sources> for v1::DraftSources {
    fn from(s: Sources) -> v1::DraftSources {
        match s {
            Sources::Auto => v1::DraftSources::Auto,
            Sources::ModelFree => v1::DraftSources::ModelFree,
            Sources::DraftModel => v1::DraftSources::DraftModel,
            Sources::Combined => v1::DraftSources::Combined,
        }
    }
}

/// `sources` from the wire; `field` names it in the error.
pub fn sources_from_wire(field: &str, sources: i32) -> Result<Sources, FieldError> {
    v1::DraftSources::try_from(sources)
        .map(Sources::from)
        .map_err(|_| {
            FieldError::new(
                field,
                format!(
                    "is {sources}, not a DraftSources value (0 auto, 1 model-free, 2 draft model, 3 combined)"
                ),
            )
        })
}
