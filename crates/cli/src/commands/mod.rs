pub mod api_key;
pub mod client;
pub mod export;
pub mod fetch;
pub mod generate;
pub mod token_ranking;
pub mod tokenize;
pub mod up;
