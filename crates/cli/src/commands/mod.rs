pub mod bench_model;
pub mod fetch;
pub mod generate;
pub mod tokenize;
