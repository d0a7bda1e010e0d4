//! `sandbox-double`: runs one of the doubles on loopback, for `make demo`-style manual use and
//! for the benchmarks.

use std::net::SocketAddr;

fn usage() -> ! {
    eprintln!(
        "usage: sandbox-double <fly|e2b|sprites> [--listen 127.0.0.1:PORT] [--envd-listen 127.0.0.1:PORT]"
    );
    std::process::exit(2);
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

/// The value after `flag`, parsed as an address.
fn addr_arg(args: &[String], flag: &str) -> Option<SocketAddr> {
    let at = args.iter().position(|a| a == flag)?;
    match args.get(at + 1).map(|v| v.parse()) {
        Some(Ok(addr)) => Some(addr),
        _ => usage(),
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("fly") => run_fly(&args[1..]).await,
        Some("e2b") => run_e2b(&args[1..]).await,
        Some("sprites") => run_sprites().await,
        _ => usage(),
    }
}

/// The Fly Machines double until Ctrl-C or SIGTERM; prints its URL, app and token, and
/// removes its containers and volumes on the way out.
async fn run_fly(args: &[String]) {
    let mut options = sandbox_doubles::fly::FlyDoubleOptions::default();
    if let Some(addr) = addr_arg(args, "--listen") {
        options.listen = addr;
    }
    let double = match sandbox_doubles::fly::spawn(options).await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("sandbox-double fly: {e}");
            std::process::exit(1);
        }
    };
    println!("FLY_API_URL={}", double.base_url());
    println!("FLY_APP={}", double.app());
    println!("FLY_API_TOKEN={}", double.token());
    wait_for_signal().await;
    double.shutdown().await;
}

async fn run_e2b(args: &[String]) {
    let mut options = sandbox_doubles::e2b::E2bDoubleOptions::default();
    if let Some(addr) = addr_arg(args, "--listen") {
        options.api_listen = addr;
    }
    if let Some(addr) = addr_arg(args, "--envd-listen") {
        options.envd_listen = addr;
    }
    if let Ok(key) = std::env::var("E2B_API_KEY") {
        options.api_key = key;
    }
    let double = match sandbox_doubles::e2b::spawn(options).await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("sandbox-double e2b: {e}");
            std::process::exit(1);
        }
    };
    // The key goes to stdout only because this is a local test double whose key was either
    // given by the caller or generated for this run.
    println!("E2B_API_URL={}", double.api_url());
    println!("E2B_SANDBOX_URL={}", double.envd_url());
    println!("E2B_API_KEY={}", double.api_key());
    wait_for_signal().await;
    match double.shutdown().await {
        Ok(removed) => eprintln!("sandbox-double e2b: removed {removed} containers"),
        Err(e) => eprintln!("sandbox-double e2b: cleanup failed: {e}"),
    }
}

/// Ctrl-C or SIGTERM, so the containers are removed either way.
async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
