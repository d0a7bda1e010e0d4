//! Test doubles of the remote sandbox APIs the operator talks to. Each is written from the
//! vendor's published API and backs every sandbox with a real local Docker container, so exec,
//! files, ports and pause are real. Test code only: the operator binary never links this crate.

pub mod e2b;
pub mod fly;
pub mod pid_label;
pub mod sprites;
