//! The S3 template store against a real SigV4-checking S3 server (s3s-fs, tests/setup/s3.sh).

mod harness;

use std::time::{Duration, Instant};

use sandbox_operator::provider::ErrorKind;
use sandbox_operator::templates::manifest::Keys;
use sandbox_operator::templates::store::TemplateStore;
use sandbox_operator::templates::transfer::{self, Limits};

fn store_with(prefix: &str, secret: Option<&str>) -> TemplateStore {
    harness::s3::store(prefix, secret)
}

fn prefix(name: &str) -> String {
    harness::unique(&format!("t-{name}"))
}

#[tokio::test]
async fn listing_follows_continuation_tokens_and_deletes_go_in_batches() {
    let p = prefix("paging");
    let store = store_with(&p, None);
    let keys: Vec<String> = (0..2100).map(|i| format!("{p}/obj/{i:05}")).collect();
    for chunk in keys.chunks(64) {
        let puts = chunk.iter().map(|k| store.put_text(k, "x", "text/plain"));
        for r in futures::future::join_all(puts).await {
            r.expect("put");
        }
    }
    let listed = store.list(&format!("{p}/obj/")).await.expect("list");
    assert_eq!(
        listed.len(),
        2100,
        "every page is followed (server pages at 1,000)"
    );
    store.remove(&keys).await.expect("remove 3 batches");
    assert!(
        store
            .list(&format!("{p}/obj/"))
            .await
            .expect("list")
            .is_empty()
    );
    // Removing what is already gone is a success.
    store.remove(&keys[..5]).await.expect("idempotent remove");
}

#[tokio::test]
async fn presigned_put_works_with_plain_curl_and_get_returns_the_bytes() {
    let p = prefix("presign");
    let store = store_with(&p, None);
    let key = format!("{p}/blob.bin");
    let url = store
        .presign_put(&key, Duration::from_secs(300))
        .await
        .expect("presign put");
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("in.bin");
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    std::fs::write(&file, &data).expect("write");
    let put = std::process::Command::new("curl")
        .args(["--fail-with-body", "-sS", "-X", "PUT", "-T"])
        .arg(&file)
        .arg(&url)
        .output()
        .expect("curl");
    assert!(
        put.status.success(),
        "plain curl -T PUT must satisfy the signature: {}",
        String::from_utf8_lossy(&put.stdout)
    );
    let head = store.head(&key).await.expect("head").expect("present");
    assert_eq!(head.size, 70_000);
    let get_url = store
        .presign_get(&key, Duration::from_secs(300))
        .await
        .expect("presign get");
    let got = std::process::Command::new("curl")
        .args(["--fail-with-body", "-sS"])
        .arg(&get_url)
        .output()
        .expect("curl");
    assert!(got.status.success());
    assert_eq!(got.stdout, data, "bytes cross unchanged");
    // A tampered signature is refused: the server really checks SigV4.
    let bad = get_url.replace("X-Amz-Signature=", "X-Amz-Signature=00");
    let refused = std::process::Command::new("curl")
        .args(["--fail", "-sS", "-o", "/dev/null"])
        .arg(&bad)
        .output()
        .expect("curl");
    assert!(
        !refused.status.success(),
        "tampered signature must be refused"
    );
    // Presign lifetimes are clamped to 7 days rather than producing a URL S3 refuses.
    let long = store
        .presign_get(&key, Duration::from_secs(30 * 24 * 3600))
        .await
        .expect("presign");
    assert!(long.contains("X-Amz-Expires=604800"), "{long}");
}

#[tokio::test]
async fn absent_is_none_but_a_failed_lookup_is_an_error() {
    let p = prefix("lookup");
    let good = store_with(&p, None);
    assert_eq!(good.head(&format!("{p}/nope")).await.expect("head"), None);
    assert_eq!(
        transfer::manifest(&good, "nope").await.expect("lookup"),
        None
    );
    let bad = store_with(&p, Some("wrong-secret"));
    let err = transfer::manifest(&bad, "nope")
        .await
        .expect_err("a failed lookup must not read as absent");
    assert!(err.is(ErrorKind::Transient), "{err:?}");
    let err = bad
        .list(&p)
        .await
        .expect_err("a failed enumeration is an error");
    assert!(err.to_string().contains("template store"), "{err}");
}

#[tokio::test]
async fn a_live_lease_blocks_removal_and_a_stale_one_ages_out() {
    let p = prefix("lease");
    let store = store_with(&p, None);
    let keys = Keys::new(&p, "tpl");
    store
        .put_text(&keys.manifest(), "{}", "application/json")
        .await
        .expect("manifest");
    store
        .put_text(&keys.archive(), "x", "application/gzip")
        .await
        .expect("archive");
    store
        .put_text(&keys.lease("l1"), "now", "text/plain")
        .await
        .expect("lease");
    let long = Limits {
        transfer: Duration::from_secs(900),
        ..Limits::default()
    };
    let err = transfer::remove(&store, "tpl", long)
        .await
        .expect_err("live lease");
    assert!(err.is(ErrorKind::Conflict), "{err:?}");
    assert!(
        store.head(&keys.archive()).await.expect("head").is_some(),
        "nothing removed"
    );
    // With a 1 s budget and no grace the same lease is stale once a second has passed.
    let short = Limits {
        transfer: Duration::from_secs(1),
        lease_grace: Duration::ZERO,
        ..Limits::default()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match transfer::remove(&store, "tpl", short).await {
            Ok(()) => break,
            Err(e) if e.is(ErrorKind::Conflict) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            Err(e) => panic!("stale lease never aged out: {e}"),
        }
    }
    assert!(
        store.list(&keys.root()).await.expect("list").is_empty(),
        "manifest, archive and leases removed"
    );
    transfer::remove(&store, "tpl", short)
        .await
        .expect("removing an absent template succeeds");
}
