//! One planned step, worked through: four sessions on a Qwen2.5-Coder-1.5B
//! verifier with the cost curve such a verifier measured at start on a
//! 2-core AVX-512 VNNI VM (`measured the verify cost curve` and `measured
//! the plain step` in its log: a 77.9 ms one-token forward, 4 / 8 / 16
//! tokens at 1.36 / 1.43 / 2.53 of it) and the 1.0 ms outside its forward
//! that its planner measured (`specmesh_planner_fixed_step_seconds`).
//!
//! `cargo run --release -p specmesh-planner --example worked_step`

use specmesh_planner::{Offer, Planner, StepModel};
use specmesh_tree::{TokenTree, TreeBuilder, TreeLimits};

/// A tree from (parent, score) pairs.
fn tree(nodes: &[(usize, f32)]) -> TokenTree {
    let mut b = TreeBuilder::new(1, TreeLimits::new(64, 16, 1000)).unwrap();
    for (i, &(parent, score)) in nodes.iter().enumerate() {
        b.push(parent, 10 + i as u32, score).unwrap();
    }
    b.build()
}

fn main() {
    let curve = [
        (1, 1.0),
        (2, 1.164),
        (4, 1.364),
        (8, 1.430),
        (16, 2.534),
        (32, 4.811),
        (64, 10.269),
    ];
    let mut model = StepModel::from_curve(0.0779, &curve).unwrap();
    for _ in 0..100 {
        model.observe_fixed(0.001);
    }
    let sessions = [
        (
            "code edit, prompt lookup chain",
            tree(&[
                (0, 0.97),
                (1, 0.95),
                (2, 0.93),
                (3, 0.9),
                (4, 0.88),
                (5, 0.85),
                (6, 0.8),
                (7, 0.75),
            ]),
        ),
        (
            "code completion, suffix tree",
            tree(&[(0, 0.8), (0, 0.1), (1, 0.6), (3, 0.45), (4, 0.3), (5, 0.2)]),
        ),
        (
            "chat, recycled tokens",
            tree(&[(0, 0.35), (0, 0.15), (1, 0.12), (1, 0.08)]),
        ),
        ("chat, nothing drafted", tree(&[])),
    ];
    let estimates: Vec<Vec<f64>> = sessions
        .iter()
        .map(|(_, t)| (0..t.len()).map(|i| f64::from(t.score(i))).collect())
        .collect();
    let offers: Vec<Offer<'_>> = sessions
        .iter()
        .zip(&estimates)
        .map(|((_, t), e)| Offer {
            tree: t,
            estimates: e,
            whole: false,
        })
        .collect();
    let plan = Planner::default().plan(&offers, &model, 0, 512).unwrap();
    println!(
        "step model: forward(4) = {:.1} ms, forward(16) = {:.1} ms, fixed {:.1} ms",
        model.forward(4) * 1e3,
        model.forward(16) * 1e3,
        model.fixed() * 1e3
    );
    for ((name, _), g) in sessions.iter().zip(&plan.grants) {
        println!(
            "{name:<32} offered {:>2}, granted {:>2}, expected accepted {:.2}",
            g.offered, g.nodes, g.expected
        );
    }
    println!(
        "forward of {} tokens: {:.1} ms predicted, {:.2} tokens expected: {:.1} tok/s against {:.1} plain ({:.2}x)",
        plan.tokens,
        plan.seconds * 1e3,
        plan.expected_tokens,
        plan.goodput(),
        plan.plain_goodput(),
        plan.goodput() / plan.plain_goodput()
    );
    // Granting every offered node instead:
    let all: usize = plan.grants.iter().map(|g| g.offered).sum::<usize>() + plan.grants.len();
    let gain: f64 = estimates.iter().map(|e| e.iter().sum::<f64>()).sum();
    println!(
        "every node instead: {all} tokens, {:.1} ms, {:.2} tokens: {:.1} tok/s",
        model.step(all) * 1e3,
        gain,
        gain / model.step(all)
    );
}
