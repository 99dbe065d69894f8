pub mod accept;
pub mod bench_draft;
pub mod bench_model;
pub mod drafters;
pub mod fetch;
pub mod generate;
pub mod tokenize;
