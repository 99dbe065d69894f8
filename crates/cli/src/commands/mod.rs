pub mod api_key;
pub mod client;
pub mod fetch;
pub mod generate;
pub mod tokenize;
pub mod up;
