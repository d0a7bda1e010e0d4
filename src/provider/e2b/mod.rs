//! The E2B provider.

mod settings;

pub use settings::{DEFAULT_API_URL, E2bSettings};
