//! The Fly Machines provider.

mod settings;

pub use settings::{DEFAULT_API_URL, FlySettings};
