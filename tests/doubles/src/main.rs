//! `sandbox-double`: runs one of the doubles on loopback, for `make demo`-style manual use and
//! for the benchmarks.

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("sprites") => run_sprites(),
        _ => {
            eprintln!("usage: sandbox-double <fly|e2b|sprites> [--listen 127.0.0.1:PORT]");
            std::process::exit(2);
        }
    }
}

/// The Sprites double on a free loopback port until Ctrl-C; prints its URL and token.
fn run_sprites() {
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    runtime.block_on(async {
        let image = std::env::var("SANDBOX_BASE_IMAGE")
            .unwrap_or_else(|_| "sandbox-operator/base:bookworm".into());
        let double =
            sandbox_doubles::sprites::spawn(sandbox_doubles::sprites::SpritesOptions::new(image))
                .await;
        println!("SPRITES_API_URL={}", double.base_url);
        println!("SPRITES_TOKEN={}", double.token);
        let _ = tokio::signal::ctrl_c().await;
        double.shutdown().await;
    });
}
