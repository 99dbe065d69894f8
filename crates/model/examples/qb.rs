use specmesh_model::*;
use std::time::Instant;
fn main() {
    let path = std::env::var("M").unwrap();
    let threads: usize = std::env::var("T")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let isa = std::env::var("ISA").ok().and_then(|s| Isa::from_name(&s));
    let m = Model::load(
        path.as_ref(),
        &LoadOptions {
            threads: Some(threads),
            isa,
            progress: None,
            dequantize: false,
        },
    )
    .unwrap();
    let prompt: Vec<u32> = (0..512u32)
        .map(|i| 100 + (i * 2654435761u32) % 20000)
        .collect();
    let mut seq = m.new_sequence();
    let t = Instant::now();
    m.forward(
        &mut seq,
        &Block::chain(prompt.clone(), 0).unwrap().last_logits_only(),
    )
    .unwrap();
    println!("prefill {:.1} tok/s", 512.0 / t.elapsed().as_secs_f64());
    seq.commit(&(0..512).collect::<Vec<_>>()).unwrap();
    let mut one = 0.0;
    let ks: Vec<usize> = std::env::var("KS")
        .map(|s| s.split(",").map(|x| x.parse().unwrap()).collect())
        .unwrap_or(vec![1, 2, 4, 8, 16, 32, 64]);
    for &k in &ks {
        let b = Block::chain(prompt[..k].to_vec(), 512).unwrap();
        let mut ts = vec![];
        for _ in 0..std::env::var("R").map(|r| r.parse().unwrap()).unwrap_or(9) {
            let t = Instant::now();
            m.forward(&mut seq, &b).unwrap();
            ts.push(t.elapsed().as_secs_f64() * 1e3);
            seq.discard();
        }
        ts.sort_by(f64::total_cmp);
        let ms = ts[ts.len() / 2];
        if k == 1 {
            one = ms;
        }
        println!("k={k} {ms:.2} ms {:.2}x", ms / one);
    }
}
