//! CRD generation (placeholder).
use std::path::Path;
/// Writes the CRDs.
pub fn write(_out: Option<&Path>) -> Result<(), String> {
    Err("not implemented yet".into())
}
