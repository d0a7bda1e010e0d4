//! `sandbox-double`: runs one of the doubles on loopback, for `make demo`-style manual use and
//! for the benchmarks.

use std::net::SocketAddr;

const USAGE: &str = "usage: sandbox-double <fly|e2b|sprites> [--listen 127.0.0.1:PORT]";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let listen = match args.iter().position(|a| a == "--listen") {
        Some(i) => match args.get(i + 1).map(|a| a.parse::<SocketAddr>()) {
            Some(Ok(addr)) => Some(addr),
            _ => fail("--listen needs an address such as 127.0.0.1:4280"),
        },
        None => None,
    };
    match args.first().map(String::as_str) {
        Some("fly") => run_fly(listen).await,
        Some("sprites") => run_sprites().await,
        _ => fail(USAGE),
    }
}

/// Runs the Fly Machines double until Ctrl-C, then removes its containers and volumes.
async fn run_fly(listen: Option<SocketAddr>) {
    let mut options = sandbox_doubles::fly::FlyDoubleOptions::default();
    if let Some(addr) = listen {
        options.listen = addr;
    }
    let double = match sandbox_doubles::fly::spawn(options).await {
        Ok(d) => d,
        Err(e) => fail(&e.to_string()),
    };
    println!("FLY_API_URL={}", double.base_url());
    println!("FLY_APP={}", double.app());
    println!("FLY_API_TOKEN={}", double.token());
    let _ = tokio::signal::ctrl_c().await;
    double.shutdown().await;
}

/// The Sprites double on a free loopback port until Ctrl-C; prints its URL and token.
async fn run_sprites() {
    let image = std::env::var("SANDBOX_BASE_IMAGE")
        .unwrap_or_else(|_| "sandbox-operator/base:bookworm".into());
    let double =
        sandbox_doubles::sprites::spawn(sandbox_doubles::sprites::SpritesOptions::new(image)).await;
    println!("SPRITES_API_URL={}", double.base_url);
    println!("SPRITES_TOKEN={}", double.token);
    let _ = tokio::signal::ctrl_c().await;
    double.shutdown().await;
}

fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(2);
}
