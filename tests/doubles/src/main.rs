//! `sandbox-double`: runs one of the doubles on loopback, for `make demo`-style manual use and
//! for the benchmarks.

fn main() {
    eprintln!("usage: sandbox-double <fly|e2b> [--listen 127.0.0.1:PORT]");
    std::process::exit(2);
}
