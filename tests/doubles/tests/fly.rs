//! The Fly Machines double against its own contract: every test talks plain HTTP to a fresh
//! double (real Docker underneath) and checks what the published API says should happen.
//! Run with `cargo test -p sandbox-doubles --test fly`.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use sandbox_doubles::fly::{FlyDouble, FlyDoubleOptions, Matcher, spawn};
use serde_json::{Value, json};

const IMAGE: &str = "sandbox-operator/base:bookworm";

struct Api {
    http: reqwest::Client,
    base: String,
    app: String,
    token: String,
}

struct Reply {
    status: StatusCode,
    body: Value,
    retry_after: Option<String>,
}

impl Api {
    fn of(double: &FlyDouble) -> Api {
        Api {
            http: reqwest::Client::new(),
            base: double.base_url().to_string(),
            app: double.app().to_string(),
            token: double.token().to_string(),
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        nonce: Option<&str>,
    ) -> Result<Reply, reqwest::Error> {
        let url = format!("{}/v1/apps/{}{path}", self.base, self.app);
        let mut req = self.http.request(method, url).bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        if let Some(n) = nonce {
            req = req.header("fly-machine-lease-nonce", n);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let text = resp.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Reply {
            status,
            body,
            retry_after,
        })
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        self.send(method, path, body, None).await.expect("request")
    }

    async fn create(&self, config: Value) -> String {
        let r = self
            .call(
                Method::POST,
                "/machines",
                Some(json!({"config": config, "skip_launch": true})),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.body["state"], "created");
        r.body["id"].as_str().unwrap().to_string()
    }

    async fn wait(&self, id: &str, state: &str) {
        let r = self
            .call(
                Method::GET,
                &format!("/machines/{id}/wait?state={state}&timeout=30"),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "waiting for {state}: {}", r.body);
    }

    async fn started(&self, config: Value) -> String {
        let id = self.create(config).await;
        let r = self
            .call(Method::POST, &format!("/machines/{id}/start"), None)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        self.wait(&id, "started").await;
        id
    }

    async fn exec(&self, id: &str, script: &str) -> Value {
        let r = self
            .call(
                Method::POST,
                &format!("/machines/{id}/exec"),
                Some(json!({"command": ["sh", "-c", script], "timeout": 20})),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "exec {script}: {}", r.body);
        r.body
    }

    async fn state(&self, id: &str) -> String {
        let r = self
            .call(Method::GET, &format!("/machines/{id}"), None)
            .await;
        r.body["state"].as_str().unwrap_or("").to_string()
    }
}

fn sleeper() -> Value {
    json!({"image": IMAGE, "init": {"exec": ["sleep", "infinity"]}})
}

async fn double() -> FlyDouble {
    spawn(FlyDoubleOptions::default()).await.expect("double")
}

#[tokio::test]
async fn requests_need_a_valid_token_and_errors_have_the_api_shape() {
    let double = double().await;
    let api = Api::of(&double);
    let url = format!("{}/v1/apps/{}/machines", api.base, api.app);
    let anonymous = api.http.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let body: Value = anonymous.json().await.unwrap();
    assert!(body["error"].is_string(), "{body}");
    let wrong = api.http.get(&url).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);

    let missing = api.call(Method::GET, "/machines/0000", None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.body["error"].as_str().unwrap().contains("0000"));

    double.revoke_tokens();
    let revoked = api.call(Method::GET, "/machines", None).await;
    assert_eq!(revoked.status, StatusCode::UNAUTHORIZED);
    double.shutdown().await;
}

#[tokio::test]
async fn a_machine_walks_its_state_machine_on_a_real_container() {
    let double = spawn(FlyDoubleOptions {
        transition_delay: Duration::from_millis(300),
        ..Default::default()
    })
    .await
    .unwrap();
    let api = Api::of(&double);
    let id = api.create(sleeper()).await;
    assert!(double.container_name(&id).is_some());

    let r = api
        .call(Method::POST, &format!("/machines/{id}/start"), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["previous_state"], "created");
    assert_eq!(
        api.state(&id).await,
        "starting",
        "transient state is visible"
    );
    api.wait(&id, "started").await;
    let out = api.exec(&id, "echo out; echo err >&2; exit 7").await;
    assert_eq!(out["stdout"], "out\n");
    assert_eq!(out["stderr"], "err\n");
    assert_eq!(out["exit_code"], 7);

    let r = api
        .call(
            Method::POST,
            &format!("/machines/{id}/stop"),
            Some(json!({"timeout": "1s"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    api.wait(&id, "stopped").await;
    let timed_out = api
        .call(
            Method::GET,
            &format!("/machines/{id}/wait?state=started&timeout=1"),
            None,
        )
        .await;
    assert_eq!(timed_out.status, StatusCode::REQUEST_TIMEOUT);
    let not_running = api
        .call(
            Method::POST,
            &format!("/machines/{id}/exec"),
            Some(json!({"command": ["true"]})),
        )
        .await;
    assert_eq!(not_running.status, StatusCode::PRECONDITION_FAILED);

    let events = api
        .call(Method::GET, &format!("/machines/{id}"), None)
        .await;
    let kinds: Vec<&str> = events.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["stop", "start", "launch"], "newest first");

    let r = api
        .call(Method::DELETE, &format!("/machines/{id}"), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    api.wait(&id, "destroyed").await;
    let listed = api.call(Method::GET, "/machines", None).await;
    assert_eq!(listed.body.as_array().unwrap().len(), 0);
    let with_deleted = api
        .call(Method::GET, "/machines?include_deleted=true", None)
        .await;
    assert_eq!(with_deleted.body[0]["state"], "destroyed");
    assert!(double.live_machines(double.app()).is_empty());
    double.shutdown().await;
}

#[tokio::test]
async fn a_running_machine_is_destroyed_only_with_force() {
    let double = double().await;
    let api = Api::of(&double);
    let id = api.started(sleeper()).await;
    let refused = api
        .call(Method::DELETE, &format!("/machines/{id}"), None)
        .await;
    assert_eq!(refused.status, StatusCode::PRECONDITION_FAILED);
    let forced = api
        .call(Method::DELETE, &format!("/machines/{id}?force=true"), None)
        .await;
    assert_eq!(forced.status, StatusCode::OK);
    api.wait(&id, "destroyed").await;
    let gone = api
        .call(Method::GET, &format!("/machines/{id}"), None)
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    double.shutdown().await;
}

#[tokio::test]
async fn a_lease_shuts_out_every_other_client() {
    let double = double().await;
    let api = Api::of(&double);
    let id = api.started(sleeper()).await;
    let lease = api
        .call(
            Method::POST,
            &format!("/machines/{id}/lease"),
            Some(json!({"ttl": 60})),
        )
        .await;
    assert_eq!(lease.status, StatusCode::OK, "{}", lease.body);
    let nonce = lease.body["data"]["nonce"].as_str().unwrap().to_string();

    let other = api
        .call(Method::POST, &format!("/machines/{id}/lease"), None)
        .await;
    assert_eq!(other.status, StatusCode::CONFLICT);
    let stop = format!("/machines/{id}/stop");
    let refused = api.call(Method::POST, &stop, None).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    let meta = api
        .call(
            Method::POST,
            &format!("/machines/{id}/metadata/k"),
            Some(json!({"value": "v"})),
        )
        .await;
    assert_eq!(meta.status, StatusCode::CONFLICT);

    let allowed = api
        .send(Method::POST, &stop, None, Some(&nonce))
        .await
        .unwrap();
    assert_eq!(allowed.status, StatusCode::OK);
    api.wait(&id, "stopped").await;
    let released = api
        .send(
            Method::DELETE,
            &format!("/machines/{id}/lease"),
            None,
            Some(&nonce),
        )
        .await
        .unwrap();
    assert_eq!(released.status, StatusCode::OK);
    let shown = api
        .call(Method::GET, &format!("/machines/{id}/lease"), None)
        .await;
    assert_eq!(shown.status, StatusCode::NOT_FOUND);
    let start = api
        .call(Method::POST, &format!("/machines/{id}/start"), None)
        .await;
    assert_eq!(start.status, StatusCode::OK);
    double.shutdown().await;
}

#[tokio::test]
async fn suspend_keeps_processes_and_a_lost_snapshot_boots_cold() {
    let double = double().await;
    let api = Api::of(&double);
    let id = api.started(sleeper()).await;
    let pid = api.exec(&id, "sleep 1000 >/dev/null 2>&1 & echo $!").await["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .to_string();
    let alive = format!("kill -0 {pid}");

    let suspend = format!("/machines/{id}/suspend");
    assert_eq!(
        api.call(Method::POST, &suspend, None).await.status,
        StatusCode::OK
    );
    api.wait(&id, "suspended").await;
    let start = format!("/machines/{id}/start");
    let r = api.call(Method::POST, &start, None).await;
    assert_eq!(r.body["previous_state"], "suspended");
    api.wait(&id, "started").await;
    assert_eq!(
        api.exec(&id, &alive).await["exit_code"],
        0,
        "resumed from the snapshot"
    );

    api.exec(&id, "echo kept > /root/marker").await;
    api.call(Method::POST, &suspend, None).await;
    api.wait(&id, "suspended").await;
    assert!(double.lose_snapshot(&id));
    api.call(Method::POST, &start, None).await;
    api.wait(&id, "started").await;
    assert_ne!(
        api.exec(&id, &alive).await["exit_code"],
        0,
        "a cold boot ends the old processes"
    );
    assert_eq!(
        api.exec(&id, "cat /root/marker").await["stdout"],
        "kept\n",
        "a cold boot from suspended keeps the root filesystem"
    );
    double.shutdown().await;
}

#[tokio::test]
async fn a_stopped_machine_boots_a_fresh_rootfs_unless_it_persists() {
    let double = double().await;
    let api = Api::of(&double);
    let mut persistent = sleeper();
    persistent["guest"] = json!({"persist_rootfs": "always"});
    let plain = api.started(sleeper()).await;
    let kept = api.started(persistent).await;
    for id in [&plain, &kept] {
        api.exec(id, "echo x > /root/file").await;
        api.call(Method::POST, &format!("/machines/{id}/stop"), None)
            .await;
        api.wait(id, "stopped").await;
        api.call(Method::POST, &format!("/machines/{id}/start"), None)
            .await;
        api.wait(id, "started").await;
    }
    assert_ne!(api.exec(&plain, "cat /root/file").await["exit_code"], 0);
    assert_eq!(api.exec(&kept, "cat /root/file").await["stdout"], "x\n");
    double.shutdown().await;
}

#[tokio::test]
async fn a_main_process_that_exits_stops_the_machine_with_its_code() {
    let double = double().await;
    let api = Api::of(&double);
    let id = api
        .create(json!({"image": IMAGE, "init": {"exec": ["sh", "-c", "sleep 0.3; exit 3"]}}))
        .await;
    api.call(Method::POST, &format!("/machines/{id}/start"), None)
        .await;
    api.wait(&id, "stopped").await;
    let m = api
        .call(Method::GET, &format!("/machines/{id}"), None)
        .await;
    let exit = &m.body["events"][0];
    assert_eq!(exit["type"], "exit", "{}", m.body["events"]);
    assert_eq!(exit["request"]["exit_event"]["exit_code"], 3);
    double.shutdown().await;
}

#[tokio::test]
async fn listing_filters_by_metadata_and_pages_with_a_cursor() {
    let double = double().await;
    let api = Api::of(&double);
    let mut ids = Vec::new();
    for i in 0..5 {
        let mut config = sleeper();
        config["metadata"] = json!({"team": if i < 3 { "a" } else { "b" }});
        ids.push(api.create(config).await);
    }
    let team_a = api
        .call(Method::GET, "/machines?metadata.team=a", None)
        .await;
    assert_eq!(team_a.body.as_array().unwrap().len(), 3);

    let mut seen = Vec::new();
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let page = api
            .call(
                Method::GET,
                &format!("/machines?limit=2&cursor={cursor}"),
                None,
            )
            .await;
        pages += 1;
        for m in page.body["machines"].as_array().unwrap() {
            seen.push(m["id"].as_str().unwrap().to_string());
        }
        match page.body["next_cursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids, "every machine exactly once");
    double.shutdown().await;
}

#[tokio::test]
async fn public_service_ports_reach_the_machine() {
    let double = double().await;
    let api = Api::of(&double);
    let port = sandbox_doubles::ports::quiet_port();
    let server = "perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new(LocalPort=>8080,Listen=>5,ReuseAddr=>1) or die; \
        while($c=$s->accept){<$c>; print $c \"HTTP/1.0 200 OK\\r\\n\\r\\nhello $ENV{FLY_MACHINE_ID}\"; close $c}'";
    let id = api
        .started(json!({
            "image": IMAGE,
            "init": {"exec": ["sh", "-c", server]},
            "services": [{"protocol": "tcp", "internal_port": 8080, "ports": [{"port": port}]}],
        }))
        .await;
    let url = format!("http://{}:{port}/", double.publish_host());
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        match reqwest::get(&url).await {
            Ok(r) => break r.text().await.unwrap(),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{url} never answered: {e}"),
        }
    };
    assert_eq!(body, format!("hello {id}"));
    double.shutdown().await;
}

#[tokio::test]
async fn a_volume_attaches_to_one_machine_and_outlives_it() {
    let double = double().await;
    let api = Api::of(&double);
    let bad = api
        .call(Method::POST, "/volumes", Some(json!({"name": "Has-Dash"})))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let vol = api
        .call(
            Method::POST,
            "/volumes",
            Some(json!({"name": "data", "size_gb": 1})),
        )
        .await;
    assert_eq!(vol.status, StatusCode::OK, "{}", vol.body);
    let vol_id = vol.body["id"].as_str().unwrap().to_string();
    let mut config = sleeper();
    config["mounts"] = json!([{"volume": vol_id, "path": "/data"}]);
    let id = api.started(config.clone()).await;
    api.exec(&id, "echo persisted > /data/f").await;
    let shown = api
        .call(Method::GET, &format!("/volumes/{vol_id}"), None)
        .await;
    assert_eq!(shown.body["attached_machine_id"], id.as_str());

    let second = api
        .call(
            Method::POST,
            "/machines",
            Some(json!({"config": config, "skip_launch": true})),
        )
        .await;
    assert_eq!(second.status, StatusCode::UNPROCESSABLE_ENTITY);
    let refused = api
        .call(Method::DELETE, &format!("/volumes/{vol_id}"), None)
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT);

    api.call(Method::DELETE, &format!("/machines/{id}?force=true"), None)
        .await;
    api.wait(&id, "destroyed").await;
    let again = api.started(config).await;
    assert_eq!(
        api.exec(&again, "cat /data/f").await["stdout"],
        "persisted\n"
    );
    api.call(
        Method::DELETE,
        &format!("/machines/{again}?force=true"),
        None,
    )
    .await;
    api.wait(&again, "destroyed").await;
    let deleted = api
        .call(Method::DELETE, &format!("/volumes/{vol_id}"), None)
        .await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.body);
    let listed = api.call(Method::GET, "/volumes", None).await;
    assert_eq!(
        listed.body[0]["state"], "destroyed",
        "the list keeps destroyed volumes"
    );
    double.shutdown().await;
}

#[tokio::test]
async fn armed_faults_fire_exactly_as_often_as_asked() {
    let double = double().await;
    let api = Api::of(&double);
    double.faults().rate_limit(Matcher::path("/machines"), 2, 7);
    for _ in 0..2 {
        let r = api.call(Method::GET, "/machines", None).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.retry_after.as_deref(), Some("7"));
        assert!(r.body["error"].is_string());
    }
    assert_eq!(
        api.call(Method::GET, "/machines", None).await.status,
        StatusCode::OK
    );

    double
        .faults()
        .fail(Matcher::path("/machines"), 1, StatusCode::BAD_GATEWAY);
    assert_eq!(
        api.call(Method::GET, "/machines", None).await.status,
        StatusCode::BAD_GATEWAY
    );

    double
        .faults()
        .drop_connection(Matcher::path("/machines"), 1);
    let dropped = api.send(Method::GET, "/machines", None, None).await;
    assert!(dropped.is_err(), "no response at all");

    let id = api.create(sleeper()).await;
    double.faults().truncate(Matcher::path(&id), 1);
    let url = format!("{}/v1/apps/{}/machines/{id}", api.base, api.app);
    let cut = api.http.get(&url).bearer_auth(&api.token).send().await;
    let body = match cut {
        Ok(resp) => resp.bytes().await,
        Err(e) => Err(e),
    };
    assert!(
        body.is_err(),
        "a truncated body is an error, not a short JSON"
    );

    double.faults().insufficient_capacity(1);
    let full = api
        .call(
            Method::POST,
            "/machines",
            Some(json!({"config": sleeper(), "skip_launch": true})),
        )
        .await;
    assert_eq!(full.body["status"], "insufficient_capacity");

    let gets = double
        .requests()
        .count(&Matcher::on(Method::GET, "/machines"));
    // 2 rate-limited, 1 answered, 1 failed, 1 dropped, 1 truncated.
    assert_eq!(gets, 6, "every request is logged, faulted or not");
    double.shutdown().await;
}

#[tokio::test]
async fn update_replaces_the_config_and_reboots_a_running_machine() {
    let double = double().await;
    let api = Api::of(&double);
    let id = api.started(sleeper()).await;
    let before = api
        .call(Method::GET, &format!("/machines/{id}"), None)
        .await;
    let mut config = before.body["config"].clone();
    config["guest"] = json!({"cpus": 2, "memory_mb": 512});
    config["metadata"] = json!({"k": "v"});
    let r = api
        .call(
            Method::POST,
            &format!("/machines/{id}"),
            Some(json!({"config": config})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_ne!(r.body["instance_id"], before.body["instance_id"]);
    api.wait(&id, "started").await;
    let cgroup = api
        .exec(
            &id,
            "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
        )
        .await;
    assert_eq!(cgroup["stdout"], format!("{}\n", 512 * 1024 * 1024));
    let meta = api
        .call(Method::GET, &format!("/machines/{id}/metadata"), None)
        .await;
    assert_eq!(meta.body, json!({"k": "v"}));
    double.shutdown().await;
}
