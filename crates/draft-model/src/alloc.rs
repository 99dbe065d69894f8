//! Spending the node budget level by level.
//!
//! A tree is grown one depth per forward, but the budget is best spent
//! best-first over the whole tree, where deeper nodes compete with
//! shallower siblings. At each level we know the real distributions of the
//! nodes being expanded, and only estimates below: the average probability
//! of the r-th most likely token over the nodes this drafter has expanded
//! (`est`). So each level runs best-first over the real candidates and a
//! virtual subtree under each of them scored with the estimates; the real
//! candidates it picks are this level's children, and the budget the
//! virtual nodes took is left for the levels below.
//!
//! The counts depend only on the parents' distributions and scores, never
//! on which tokens are then drawn as children: a sampled node's number of
//! children must not depend on the draws themselves, or the children would
//! not be a plain sample without replacement and verification would not be
//! lossless.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A node whose children are being allotted: its path score and its
/// candidate probabilities, most likely first.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frontier<'a> {
    pub score: f32,
    pub probs: &'a [f32],
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// The `rank`-th candidate child of frontier node `node`.
    Real { node: usize, rank: usize },
    /// The `rank`-th child of a (real or virtual) node scoring `parent`,
    /// with `below` more levels allowed under it.
    Virtual {
        parent: f32,
        rank: usize,
        below: usize,
    },
}

#[derive(Clone, Copy, Debug)]
struct Cand {
    score: f32,
    /// Insertion order: earlier wins ties, so real candidates (pushed
    /// first) and likelier ranks win.
    order: u64,
    kind: Kind,
}

impl PartialEq for Cand {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Cand {}

impl PartialOrd for Cand {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Cand {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.order.cmp(&self.order))
    }
}

/// How many children each frontier node gets out of `budget` nodes, when
/// `below` more levels may follow this one and no node may have more than
/// `max_children` children. Uses all of `budget` unless the candidates run
/// out.
pub(crate) fn allocate(
    frontier: &[Frontier<'_>],
    est: &[f32],
    budget: usize,
    below: usize,
    max_children: usize,
) -> Vec<usize> {
    let mut counts = vec![0; frontier.len()];
    let est = &est[..est.len().min(max_children)];
    let mut heap = BinaryHeap::new();
    let mut order = 0u64;
    let mut push = |heap: &mut BinaryHeap<Cand>, score: f32, kind: Kind| {
        let score = if score.is_finite() {
            score.max(0.0)
        } else {
            0.0
        };
        heap.push(Cand { score, order, kind });
        order += 1;
    };
    for (node, f) in frontier.iter().enumerate() {
        if let Some(&p) = f.probs.first()
            && max_children > 0
        {
            push(&mut heap, f.score * p, Kind::Real { node, rank: 0 });
        }
    }
    for _ in 0..budget {
        let Some(c) = heap.pop() else { break };
        match c.kind {
            Kind::Real { node, rank } => {
                counts[node] += 1;
                let f = frontier[node];
                if rank + 1 < f.probs.len().min(max_children) {
                    let s = f.score * f.probs[rank + 1];
                    push(
                        &mut heap,
                        s,
                        Kind::Real {
                            node,
                            rank: rank + 1,
                        },
                    );
                }
                if below > 0 && !est.is_empty() {
                    let kind = Kind::Virtual {
                        parent: c.score,
                        rank: 0,
                        below: below - 1,
                    };
                    push(&mut heap, c.score * est[0], kind);
                }
            }
            Kind::Virtual {
                parent,
                rank,
                below,
            } => {
                if rank + 1 < est.len() {
                    let kind = Kind::Virtual {
                        parent,
                        rank: rank + 1,
                        below,
                    };
                    push(&mut heap, parent * est[rank + 1], kind);
                }
                if below > 0 {
                    let kind = Kind::Virtual {
                        parent: c.score,
                        rank: 0,
                        below: below - 1,
                    };
                    push(&mut heap, c.score * est[0], kind);
                }
            }
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confident_frontier_spends_the_budget_in_depth() {
        let probs = [0.95, 0.03, 0.01];
        let f = [Frontier {
            score: 1.0,
            probs: &probs,
        }];
        // Deep levels expected to be as confident: one child now, the rest
        // left for below.
        assert_eq!(allocate(&f, &probs, 6, 5, 8), vec![1]);
        // The last level takes everything it can.
        assert_eq!(allocate(&f, &probs, 6, 0, 8), vec![3]);
        assert_eq!(allocate(&f, &probs, 6, 0, 2), vec![2]);
    }

    #[test]
    fn a_flat_frontier_spends_it_in_width() {
        let probs = [0.3, 0.25, 0.2, 0.15, 0.1];
        let est = [0.3, 0.25, 0.2];
        let f = [Frontier {
            score: 1.0,
            probs: &probs,
        }];
        let c = allocate(&f, &est, 4, 3, 8);
        assert!(c[0] >= 3, "{c:?}");
    }

    #[test]
    fn better_nodes_get_more_children() {
        let probs = [0.5, 0.3, 0.2];
        let f = [
            Frontier {
                score: 0.8,
                probs: &probs,
            },
            Frontier {
                score: 0.1,
                probs: &probs,
            },
        ];
        let c = allocate(&f, &[], 4, 0, 8);
        assert_eq!(c, vec![3, 1]);
        assert_eq!(allocate(&f, &[], 0, 0, 8), vec![0, 0]);
        assert_eq!(
            allocate(&f, &[], 10, 0, 8),
            vec![3, 3],
            "candidates run out"
        );
        assert_eq!(allocate(&f, &[], 10, 0, 0), vec![0, 0]);
    }

    #[test]
    fn bad_scores_do_not_panic() {
        let probs = [f32::NAN, 0.5];
        let f = [Frontier {
            score: f32::INFINITY,
            probs: &probs,
        }];
        let c = allocate(&f, &[f32::NAN], 3, 2, 8);
        assert!(c[0] <= 2);
    }
}
