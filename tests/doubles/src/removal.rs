//! What the doubles take as a container removed.

/// Whether a failed container removal leaves the container gone all the same: it was absent
/// (404), or a removal of it was already under way (409, "removal of container … is already in
/// progress"), which the engine finishes. A double's cleanup can meet the second while a
/// delete it served is still running (seen in CI: the E2B double's shutdown failed on it).
pub fn removed_anyway(err: &bollard::errors::Error) -> bool {
    match err {
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        } => true,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 409,
            message,
        } => message.contains("already in progress"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_or_already_being_removed_is_removed_and_nothing_else_is() {
        let err = |status_code, message: &str| bollard::errors::Error::DockerResponseServerError {
            status_code,
            message: message.to_string(),
        };
        assert!(removed_anyway(&err(404, "No such container: x")));
        assert!(removed_anyway(&err(
            409,
            "removal of container abc is already in progress"
        )));
        assert!(!removed_anyway(&err(409, "container is running")));
        assert!(!removed_anyway(&err(500, "already in progress")));
    }
}
