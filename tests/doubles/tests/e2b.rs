//! The E2B double itself, spoken to over plain HTTP the way E2B's SDKs speak to E2B: auth,
//! the error body, list filters and paging, timeouts really enforced, pause and connect,
//! envd's files and process stream, and the injected faults. Needs a running Docker engine
//! and the base image (`tests/setup/docker.sh`, `tests/setup/base-image.sh`).

use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use sandbox_doubles::e2b::{self, E2bDouble, E2bDoubleOptions, FaultAction, Power};
use serde_json::{Value, json};

async fn double(options: E2bDoubleOptions) -> E2bDouble {
    e2b::spawn(options)
        .await
        .expect("the double starts (is Docker running?)")
}

fn api(d: &E2bDouble, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
    Client::new()
        .request(method, format!("{}{path}", d.api_url()))
        .header("X-API-Key", d.api_key())
}

async fn create(d: &E2bDouble, body: Value) -> Value {
    let response = api(d, reqwest::Method::POST, "/sandboxes")
        .json(&body)
        .send()
        .await
        .expect("create");
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json().await.expect("created body")
}

fn envd(
    d: &E2bDouble,
    created: &Value,
    method: reqwest::Method,
    path: &str,
) -> reqwest::RequestBuilder {
    let mut request = Client::new()
        .request(method, format!("{}{path}", d.envd_url()))
        .header("E2b-Sandbox-Id", created["sandboxID"].as_str().expect("id"))
        .header("E2b-Sandbox-Port", "49983");
    if let Some(token) = created["envdAccessToken"].as_str() {
        request = request.header("X-Access-Token", token);
    }
    request
}

/// Sends `start` (a StartRequest, enveloped) to Process.Start.
async fn start_process(d: &E2bDouble, created: &Value, start: &Value) -> reqwest::Response {
    let message = start.to_string();
    let mut body = vec![0u8];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(message.as_bytes());
    envd(d, created, reqwest::Method::POST, "/process.Process/Start")
        .header("Content-Type", "application/connect+json")
        .body(body)
        .send()
        .await
        .expect("start")
}

/// Runs `sh -c script` through Process.Start and returns every decoded message.
async fn run(d: &E2bDouble, created: &Value, script: &str) -> (u16, Vec<(u8, Value)>) {
    let start = json!({"process": {"cmd": "sh", "args": ["-c", script]}});
    let response = start_process(d, created, &start).await;
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap_or_default();
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 5 <= bytes.len() {
        let len = u32::from_be_bytes([bytes[at + 1], bytes[at + 2], bytes[at + 3], bytes[at + 4]])
            as usize;
        let json: Value = serde_json::from_slice(&bytes[at + 5..at + 5 + len]).expect("frame json");
        frames.push((bytes[at], json));
        at += 5 + len;
    }
    (status, frames)
}

#[tokio::test]
async fn the_api_refuses_missing_and_wrong_keys_with_its_error_body() {
    let d = double(E2bDoubleOptions::default()).await;
    let url = format!("{}/v2/sandboxes", d.api_url());
    for request in [
        Client::new().get(&url),
        Client::new().get(&url).header("X-API-Key", "e2b_wrong"),
    ] {
        let response = request.send().await.expect("answer");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let body: Value = response.json().await.expect("error body");
        assert_eq!(body["code"], 401);
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let health = Client::new()
        .get(format!("{}/health", d.api_url()))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), StatusCode::OK, "health needs no key");
    d.revoke_api_key(d.api_key());
    let response = api(&d, reqwest::Method::GET, "/v2/sandboxes")
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "a revoked key");
    d.shutdown().await.expect("cleanup");
}

#[tokio::test]
async fn lists_filter_by_metadata_and_state_and_page_with_next_tokens() {
    let d = double(E2bDoubleOptions {
        page_cap: 2,
        ..Default::default()
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let created = create(
            &d,
            json!({"templateID": "base", "metadata": {"app/owner": "a&b", "n": i.to_string()}}),
        )
        .await;
        ids.push(created["sandboxID"].as_str().expect("id").to_string());
    }
    create(
        &d,
        json!({"templateID": "base", "metadata": {"app/owner": "other"}}),
    )
    .await;
    let paused = &ids[0];
    let response = api(
        &d,
        reqwest::Method::POST,
        &format!("/sandboxes/{paused}/pause"),
    )
    .send()
    .await
    .expect("pause");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);

    // metadata = urlencode("app%2Fowner=a%26b"), as the SDKs send it.
    let filter = "app%2Fowner=a%26b";
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut query = vec![("metadata", filter.to_string())];
        if let Some(t) = &token {
            query.push(("nextToken", t.clone()));
        }
        let response = api(&d, reqwest::Method::GET, "/v2/sandboxes")
            .query(&query)
            .send()
            .await
            .expect("list");
        assert_eq!(response.status(), StatusCode::OK);
        token = response
            .headers()
            .get("x-next-token")
            .map(|v| v.to_str().expect("ascii").to_string());
        let page: Vec<Value> = response.json().await.expect("page");
        assert!(page.len() <= 2);
        seen.extend(
            page.iter()
                .map(|s| s["sandboxID"].as_str().expect("id").to_string()),
        );
        pages += 1;
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 2);
    seen.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(
        seen, want,
        "every matching sandbox exactly once, both states"
    );

    let running: Vec<Value> = api(&d, reqwest::Method::GET, "/v2/sandboxes")
        .query(&[("metadata", filter), ("state", "running"), ("limit", "100")])
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("page");
    assert_eq!(running.len(), 2);
    assert!(running.iter().all(|s| s["state"] == "running"));
    let bad = api(&d, reqwest::Method::GET, "/v2/sandboxes")
        .query(&[("limit", "101")])
        .send()
        .await
        .expect("list");
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    d.shutdown().await.expect("cleanup");
}

#[tokio::test]
async fn timeouts_really_kill_or_auto_pause_and_refreshes_move_them() {
    let d = double(E2bDoubleOptions::default()).await;
    let killed = create(&d, json!({"templateID": "base", "timeout": 1})).await;
    let paused = create(
        &d,
        json!({"templateID": "base", "timeout": 1, "autoPause": true}),
    )
    .await;
    let kept = create(&d, json!({"templateID": "base", "timeout": 1})).await;
    let kept_id = kept["sandboxID"].as_str().expect("id").to_string();
    let killed_id = killed["sandboxID"].as_str().expect("id").to_string();
    let paused_id = paused["sandboxID"].as_str().expect("id").to_string();
    let started = Instant::now();
    loop {
        // Keep one alive the way a client must.
        let response = api(
            &d,
            reqwest::Method::POST,
            &format!("/sandboxes/{kept_id}/timeout"),
        )
        .json(&json!({"timeout": 1}))
        .send()
        .await
        .expect("timeout");
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        let gone = d.sandbox(&killed_id).await.is_none();
        let frozen = d
            .sandbox(&paused_id)
            .await
            .is_some_and(|s| s.power == Power::Paused { memory: true });
        if gone && frozen {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "timeouts were not enforced"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        d.sandbox(&kept_id)
            .await
            .is_some_and(|s| s.power == Power::Running)
    );
    let detail: Value = api(&d, reqwest::Method::GET, &format!("/sandboxes/{killed_id}"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("body");
    assert_eq!(detail["code"], 404);
    let listed: Vec<Value> = api(&d, reqwest::Method::GET, "/v2/sandboxes")
        .query(&[("state", "paused")])
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("page");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["sandboxID"], paused_id.as_str());
    d.shutdown().await.expect("cleanup");
}

#[tokio::test]
async fn pause_and_connect_follow_the_spec_and_envd_answers_only_when_running() {
    let d = double(E2bDoubleOptions::default()).await;
    let created = create(
        &d,
        json!({"templateID": "base", "timeout": 60, "secure": true}),
    )
    .await;
    let id = created["sandboxID"].as_str().expect("id").to_string();
    let (status, frames) = run(&d, &created, "echo $$ > /tmp/pid; cat /tmp/pid").await;
    assert_eq!(status, 200);
    let pause = |memory: bool| {
        api(&d, reqwest::Method::POST, &format!("/sandboxes/{id}/pause"))
            .json(&json!({"memory": memory}))
    };
    assert_eq!(
        pause(true).send().await.expect("pause").status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        pause(true).send().await.expect("pause").status(),
        StatusCode::CONFLICT,
        "already paused"
    );
    let health = envd(&d, &created, reqwest::Method::GET, "/health")
        .send()
        .await
        .expect("health");
    assert_eq!(
        health.status(),
        StatusCode::BAD_GATEWAY,
        "envd of a paused sandbox is unreachable"
    );
    let connect = || {
        api(
            &d,
            reqwest::Method::POST,
            &format!("/sandboxes/{id}/connect"),
        )
        .json(&json!({"timeout": 60}))
    };
    assert_eq!(
        connect().send().await.expect("connect").status(),
        StatusCode::CREATED,
        "resumed"
    );
    assert_eq!(
        connect().send().await.expect("connect").status(),
        StatusCode::OK,
        "already running"
    );
    let health = envd(&d, &created, reqwest::Method::GET, "/health")
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), StatusCode::NO_CONTENT);
    let record = d.sandbox(&id).await.expect("kept");
    assert_eq!((record.pauses, record.resumes), (1, 1));
    assert!(
        frames.iter().any(|(flags, _)| *flags == 2),
        "the stream ended properly"
    );
    d.shutdown().await.expect("cleanup");
}

#[tokio::test]
async fn envd_files_are_exact_and_absent_is_404_and_tokens_are_required() {
    let d = double(E2bDoubleOptions::default()).await;
    let created = create(
        &d,
        json!({"templateID": "base", "timeout": 60, "secure": true}),
    )
    .await;
    let all: Vec<u8> = (0..=255u8).collect();
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(all.clone()).file_name("/w/deep/all.bin"),
    );
    let response = envd(&d, &created, reqwest::Method::POST, "/files")
        .multipart(form)
        .send()
        .await
        .expect("upload");
    assert_eq!(response.status(), StatusCode::OK);
    let written: Vec<Value> = response.json().await.expect("entries");
    assert_eq!(written[0]["path"], "/w/deep/all.bin");
    let back = envd(&d, &created, reqwest::Method::GET, "/files")
        .query(&[("path", "/w/deep/all.bin")])
        .send()
        .await
        .expect("read");
    assert_eq!(back.status(), StatusCode::OK);
    assert_eq!(back.bytes().await.expect("bytes").to_vec(), all);
    let absent = envd(&d, &created, reqwest::Method::GET, "/files")
        .query(&[("path", "/w/none")])
        .send()
        .await
        .expect("read");
    assert_eq!(absent.status(), StatusCode::NOT_FOUND);
    let dir = envd(&d, &created, reqwest::Method::GET, "/files")
        .query(&[("path", "/w")])
        .send()
        .await
        .expect("read");
    assert_eq!(dir.status(), StatusCode::BAD_REQUEST);
    let raw = envd(&d, &created, reqwest::Method::POST, "/files")
        .query(&[("path", "/w/raw.txt")])
        .header("Content-Type", "application/octet-stream")
        .body("raw body")
        .send()
        .await
        .expect("raw upload");
    assert_eq!(raw.status(), StatusCode::OK);

    let listed: Value = envd(
        &d,
        &created,
        reqwest::Method::POST,
        "/filesystem.Filesystem/ListDir",
    )
    .json(&json!({"path": "/w"}))
    .send()
    .await
    .expect("list")
    .json()
    .await
    .expect("entries");
    let mut names: Vec<&str> = listed["entries"]
        .as_array()
        .expect("array")
        .iter()
        .map(|e| e["name"].as_str().expect("name"))
        .collect();
    names.sort();
    assert_eq!(names, ["deep", "raw.txt"]);
    let missing = envd(
        &d,
        &created,
        reqwest::Method::POST,
        "/filesystem.Filesystem/ListDir",
    )
    .json(&json!({"path": "/nope"}))
    .send()
    .await
    .expect("list");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let body: Value = missing.json().await.expect("connect error");
    assert_eq!(body["code"], "not_found");

    let no_token = Client::new()
        .get(format!("{}/files", d.envd_url()))
        .query(&[("path", "/w/raw.txt")])
        .header("E2b-Sandbox-Id", created["sandboxID"].as_str().expect("id"))
        .send()
        .await
        .expect("answer");
    assert_eq!(no_token.status(), StatusCode::UNAUTHORIZED);
    d.shutdown().await.expect("cleanup");
}

#[tokio::test]
async fn process_start_streams_start_data_and_end_and_faults_cut_it() {
    let d = double(E2bDoubleOptions::default()).await;
    let created = create(
        &d,
        json!({"templateID": "base", "timeout": 60, "envVars": {"FROM_CREATE": "yes"}}),
    )
    .await;
    let (status, frames) = run(
        &d,
        &created,
        "printf out; printf err >&2; printf \"$FROM_CREATE\"; exit 4",
    )
    .await;
    assert_eq!(status, 200);
    assert!(frames[0].1["event"]["start"].is_object(), "{frames:?}");
    let decode = |key: &str| -> String {
        frames
            .iter()
            .filter_map(|(_, f)| f["event"]["data"][key].as_str())
            .map(|b| {
                use base64::Engine as _;
                String::from_utf8(
                    base64::engine::general_purpose::STANDARD
                        .decode(b)
                        .expect("b64"),
                )
                .expect("utf8")
            })
            .collect()
    };
    assert_eq!(decode("stdout"), "outyes");
    assert_eq!(decode("stderr"), "err");
    let end = frames
        .iter()
        .find_map(|(_, f)| f["event"].get("end"))
        .expect("end event");
    assert_eq!(end["exitCode"], 4);
    assert_eq!(frames.last().map(|(flags, _)| *flags), Some(2));

    d.faults().inject(
        None,
        "/process.Process/Start",
        FaultAction::TruncateStream,
        1,
    );
    let (_, cut) = run(&d, &created, "echo partial").await;
    assert!(
        cut.iter()
            .all(|(flags, f)| *flags == 0 && f["event"].get("end").is_none()),
        "{cut:?}"
    );

    d.faults()
        .inject(Some("GET"), "/sandboxes/*", FaultAction::Drop, 1);
    let id = created["sandboxID"].as_str().expect("id");
    let dropped = api(&d, reqwest::Method::GET, &format!("/sandboxes/{id}"))
        .send()
        .await;
    assert!(
        dropped.is_err(),
        "a dropped connection gets no response: {dropped:?}"
    );
    d.faults().inject(
        Some("GET"),
        "/sandboxes/*",
        FaultAction::Status {
            status: 429,
            retry_after: Some(3),
            error_code: None,
        },
        1,
    );
    let limited = api(&d, reqwest::Method::GET, &format!("/sandboxes/{id}"))
        .send()
        .await
        .expect("answer");
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["retry-after"], "3");
    let body: Value = limited.json().await.expect("error body");
    assert_eq!(body["code"], 429);
    assert_eq!(d.faults().pending(), 0);
    assert_eq!(
        d.api_counters().get("GET /sandboxes/{sandboxID}"),
        0,
        "faulted requests never reach a handler"
    );
    d.shutdown().await.expect("cleanup");
}

/// A Process.Start stream read as it arrives: frames decoded one by one.
struct Stream {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Stream {
    /// Starts `start` (a StartRequest) and reads up to its `start` event: the stream and pid.
    async fn start(d: &E2bDouble, created: &Value, start: Value) -> (Stream, u64) {
        let response = start_process(d, created, &start).await;
        assert_eq!(response.status(), StatusCode::OK);
        let mut stream = Stream {
            response,
            buffer: Vec::new(),
        };
        let (_, first) = stream.next().await.expect("a first frame");
        let pid = first["event"]["start"]["pid"]
            .as_u64()
            .unwrap_or_else(|| panic!("a start event first: {first}"));
        (stream, pid)
    }

    /// The next frame (flags, JSON), or `None` at the end of the body.
    async fn next(&mut self) -> Option<(u8, Value)> {
        loop {
            if self.buffer.len() >= 5 {
                let len = u32::from_be_bytes([
                    self.buffer[1],
                    self.buffer[2],
                    self.buffer[3],
                    self.buffer[4],
                ]) as usize;
                if self.buffer.len() >= 5 + len {
                    let frame: Vec<u8> = self.buffer.drain(..5 + len).collect();
                    let json = serde_json::from_slice(&frame[5..]).expect("frame json");
                    return Some((frame[0], json));
                }
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.response.chunk())
                .await
                .expect("a frame within 60 s")
                .expect("the body");
            self.buffer.extend_from_slice(&chunk?);
        }
    }

    /// Reads output (`stdout` or `pty`) until it contains `needle`; all of it.
    async fn read_until(&mut self, key: &str, needle: &str) -> String {
        let mut seen = String::new();
        while !seen.contains(needle) {
            let (_, frame) = self
                .next()
                .await
                .unwrap_or_else(|| panic!("ended: {seen:?}"));
            if let Some(b) = frame["event"]["data"][key].as_str() {
                seen.push_str(&decode(b));
            }
        }
        seen
    }

    /// Reads to the `end` event and the end of stream; the `end` event.
    async fn end(&mut self) -> Value {
        let mut end = None;
        while let Some((flags, frame)) = self.next().await {
            if flags == 2 {
                assert_eq!(frame, json!({}), "the stream ends cleanly");
                return end.expect("an end event before the end of stream");
            }
            if let Some(e) = frame["event"].get("end") {
                end = Some(e.clone());
            }
        }
        panic!("no end of stream");
    }
}

fn decode(b64: &str) -> String {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("b64");
    String::from_utf8_lossy(&bytes).into_owned()
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A unary call of the process service: (status, body).
async fn process_call(d: &E2bDouble, created: &Value, method: &str, body: Value) -> (u16, Value) {
    let response = envd(
        d,
        created,
        reqwest::Method::POST,
        &format!("/process.Process/{method}"),
    )
    .json(&body)
    .send()
    .await
    .expect("call");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

/// The pid is the program's own inside the sandbox; stdin crosses in order and CloseStdin
/// is its end; input for the wrong side and an unknown pid are refused as envd refuses them.
#[tokio::test]
async fn process_input_goes_to_the_pid_and_close_stdin_ends_it() {
    let d = double(E2bDoubleOptions::default()).await;
    let created = create(&d, json!({"templateID": "base", "timeout": 60})).await;
    let start = json!({"process": {"cmd": "sh", "args": ["-c", "echo $$"]}, "stdin": false});
    let (mut own, pid) = Stream::start(&d, &created, start).await;
    let printed = own.read_until("stdout", "\n").await;
    assert_eq!(
        printed.trim(),
        pid.to_string(),
        "the pid is the program's own"
    );
    assert_eq!(own.end().await["exitCode"], 0);

    let start = json!({"process": {"cmd": "cat"}, "stdin": true});
    let (mut cat, pid) = Stream::start(&d, &created, start).await;
    let input = |bytes: &[u8]| json!({"process": {"pid": pid}, "input": {"stdin": b64(bytes)}});
    let (status, _) = process_call(&d, &created, "SendInput", input(b"hello ")).await;
    assert_eq!(status, 200);
    assert_eq!(cat.read_until("stdout", "hello ").await, "hello ");
    let (status, _) = process_call(&d, &created, "SendInput", input(b"world")).await;
    assert_eq!(status, 200);
    let wrong = json!({"process": {"pid": pid}, "input": {"pty": b64(b"x")}});
    let (status, body) = process_call(&d, &created, "SendInput", wrong).await;
    assert_eq!((status, body["code"].as_str()), (500, Some("internal")));
    let (status, _) =
        process_call(&d, &created, "CloseStdin", json!({"process": {"pid": pid}})).await;
    assert_eq!(status, 200);
    assert_eq!(cat.read_until("stdout", "world").await, "world");
    let end = cat.end().await;
    assert_eq!(
        (end["exitCode"].clone(), end["exited"].clone()),
        (json!(0), json!(true))
    );
    let (status, body) = process_call(&d, &created, "SendInput", input(b"late")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    d.shutdown().await.expect("cleanup");
}

/// A PTY starts at its size, Update resizes it, its input and output are `pty`, and
/// CloseStdin is refused for it (^D is its end of input).
#[tokio::test]
async fn a_pty_has_its_size_resizes_and_takes_pty_input() {
    let d = double(E2bDoubleOptions::default()).await;
    let created = create(&d, json!({"templateID": "base", "timeout": 60})).await;
    let script = "stty size; read l; stty size; cat";
    let start = json!({
        "process": {"cmd": "sh", "args": ["-c", script]},
        "pty": {"size": {"cols": 80, "rows": 24}}
    });
    let (mut tty, pid) = Stream::start(&d, &created, start).await;
    assert!(tty.read_until("pty", "24 80").await.contains("24 80"));
    let resize = json!({"process": {"pid": pid}, "pty": {"size": {"cols": 132, "rows": 50}}});
    let (status, _) = process_call(&d, &created, "Update", resize).await;
    assert_eq!(status, 200);
    let line = json!({"process": {"pid": pid}, "input": {"pty": b64(b"go\n")}});
    let (status, _) = process_call(&d, &created, "SendInput", line).await;
    assert_eq!(status, 200);
    assert!(tty.read_until("pty", "50 132").await.contains("50 132"));
    let (status, body) =
        process_call(&d, &created, "CloseStdin", json!({"process": {"pid": pid}})).await;
    assert_eq!(status, 500, "{body}");
    let eot = json!({"process": {"pid": pid}, "input": {"pty": b64(&[4])}});
    let (status, _) = process_call(&d, &created, "SendInput", eot).await;
    assert_eq!(status, 200);
    assert_eq!(tty.end().await["exitCode"], 0, "cat ended at ^D");
    d.shutdown().await.expect("cleanup");
}

/// SendSignal knows TERM and KILL; a process they end reports envd's signal ending; any
/// other signal is `unimplemented`, and Update of a process without a PTY is refused.
#[tokio::test]
async fn signals_end_a_process_the_envd_way() {
    let d = double(E2bDoubleOptions::default()).await;
    let created = create(&d, json!({"templateID": "base", "timeout": 60})).await;
    for (signal, status) in [
        ("SIGNAL_SIGTERM", "signal: terminated"),
        ("SIGNAL_SIGKILL", "signal: killed"),
    ] {
        let start = json!({"process": {"cmd": "sleep", "args": ["600"]}, "stdin": false});
        let (mut sleep, pid) = Stream::start(&d, &created, start).await;
        let resize = json!({"process": {"pid": pid}, "pty": {"size": {"cols": 1, "rows": 1}}});
        let (code, _) = process_call(&d, &created, "Update", resize).await;
        assert_eq!(code, 500, "no PTY to resize");
        let other = json!({"process": {"pid": pid}, "signal": "SIGNAL_UNSPECIFIED"});
        let (code, body) = process_call(&d, &created, "SendSignal", other).await;
        assert_eq!((code, body["code"].as_str()), (501, Some("unimplemented")));
        let kill = json!({"process": {"pid": pid}, "signal": signal});
        let (code, _) = process_call(&d, &created, "SendSignal", kill).await;
        assert_eq!(code, 200);
        let end = sleep.end().await;
        assert_eq!(
            end,
            json!({"exitCode": -1, "exited": false, "status": status})
        );
    }
    let start = json!({"process": {"cmd": "sh", "args": ["-c", "exit 143"]}, "stdin": false});
    let (mut own, _) = Stream::start(&d, &created, start).await;
    assert_eq!(
        own.end().await["exitCode"],
        143,
        "an exit code of its own stays one"
    );
    d.shutdown().await.expect("cleanup");
}
