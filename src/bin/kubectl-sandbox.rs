//! `kubectl-sandbox`: the `kubectl sandbox` plugin (put it on PATH; kubectl finds it by name).
//! Its logic lives in the library, `sandbox_operator::plugin`.

fn main() {
    std::process::exit(sandbox_operator::plugin::main());
}
