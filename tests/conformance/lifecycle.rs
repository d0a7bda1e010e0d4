//! The core trait: identity, create, find, the lifecycle and exec.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sandbox_operator::provider::labels::{KIND, MANAGED_BY, OWNER, OWNER_UID};
use sandbox_operator::provider::{
    ErrorKind, ExecRequest, PortRequest, RestartPolicy, SandboxQuery, SandboxState,
};

use super::Fixture;
use super::support::{
    Check, OrFail, create, describe, expect_kind, ids, running, sh, sorted, stop_or_refused,
    unique_hex, wait_until,
};

/// Every capability accessor answers as the factory declared, on the live provider and on
/// its unreachable twin: a capability is never silently missing, never silently added.
pub async fn capabilities_are_exactly_the_declared_set(fx: &Fixture) -> Check {
    let e = &fx.expect;
    for (which, p) in [
        ("provider", &fx.provider),
        ("unreachable twin", &fx.unreachable),
    ] {
        let offered = [
            ("hibernation", p.hibernation().is_some(), e.hibernation),
            ("volumes", p.volumes().is_some(), e.volumes),
            ("templates", p.templates().is_some(), e.templates),
            ("set_resources", p.resources().is_some(), e.set_resources),
            ("capacity", p.capacity().is_some(), e.capacity),
            ("files", p.files().is_some(), e.files),
            ("bulk_files", p.bulk_files().is_some(), e.bulk_files),
            ("egress", p.egress().is_some(), e.egress),
            ("events", p.events().is_some(), e.events),
            (
                "egress_policy",
                p.egress_policy().is_some(),
                e.egress_policy,
            ),
            (
                "streaming_exec",
                p.streaming_exec().is_some(),
                e.streaming_exec,
            ),
            ("logs", p.logs().is_some(), e.logs),
            ("port_forward", p.port_forward().is_some(), e.port_forward),
        ];
        for (name, got, want) in offered {
            ensure!(
                got == want,
                "{which}: {name}() is {} but the factory declares it {}",
                if got { "Some" } else { "None" },
                if want { "offered" } else { "absent" }
            );
        }
    }
    ensure!(!fx.provider.name().is_empty(), "the provider has no name");
    ensure!(
        fx.provider.kind() == fx.unreachable.kind(),
        "the unreachable twin is a different kind of provider"
    );
    Ok(())
}

/// After create, the provider's id is the handle: `find` by the owner-uid label returns
/// exactly that id, `describe` by it returns the owner labels, and start/stop go by it.
pub async fn identity_after_create_is_the_provider_id(fx: &Fixture) -> Check {
    let request = fx.request();
    let d = create(fx, &request).await?;
    let found = fx
        .provider
        .find(&fx.owner_query(&request.owner))
        .await
        .or_fail("find by owner uid")?;
    ensure!(
        ids(&found) == vec![d.id.clone()],
        "find by the owner-uid label must return exactly {}: {found:?}",
        d.id
    );
    let by_uid_only = SandboxQuery {
        labels: BTreeMap::from([(OWNER_UID.to_string(), request.owner.uid.clone())]),
        ..Default::default()
    };
    let found = fx
        .provider
        .find(&by_uid_only)
        .await
        .or_fail("find by uid")?;
    ensure!(
        ids(&found) == vec![d.id.clone()],
        "find by uid alone: {found:?}"
    );
    let described = describe(fx, &d.id).await?;
    ensure!(
        described.id == d.id,
        "describe({}) returned id {}",
        d.id,
        described.id
    );
    for (key, value) in request.owner.labels() {
        ensure!(
            described.labels.get(&key) == Some(&value),
            "owner label {key}={value} is not stored: {:?}",
            described.labels
        );
    }
    fx.provider.start(&d.id).await.or_fail("start by id")?;
    ensure!(
        describe(fx, &d.id).await?.state == SandboxState::Running,
        "start by id did not run it"
    );
    stop_or_refused(fx, &d.id).await?;
    Ok(())
}

/// Create stores the caller's labels, the owner labels, env and the restart policy, and
/// reports them back.
pub async fn create_stores_labels_env_and_restart_policy(fx: &Fixture) -> Check {
    let mut request = fx.request();
    request.labels = BTreeMap::from([("team".to_string(), "blue".to_string())]);
    request.env = BTreeMap::from([("GREETING".to_string(), "hello world".to_string())]);
    request.restart_policy = RestartPolicy::OnFailure;
    let d = create(fx, &request).await?;
    ensure!(
        d.labels.get("team").map(String::as_str) == Some("blue"),
        "labels: {:?}",
        d.labels
    );
    ensure!(
        d.labels.get(MANAGED_BY) == Some(&fx.instance)
            && d.labels.get(OWNER_UID) == Some(&request.owner.uid)
            && d.labels.get(KIND).map(String::as_str) == Some("Sandbox")
            && d.labels.get(OWNER)
                == Some(&format!(
                    "{}.{}",
                    request.owner.namespace, request.owner.name
                )),
        "owner labels: {:?}",
        d.labels
    );
    ensure!(
        d.env.get("GREETING").map(String::as_str) == Some("hello world"),
        "env: {:?}",
        d.env
    );
    ensure!(
        d.restart_policy == RestartPolicy::OnFailure,
        "restart policy: {:?}",
        d.restart_policy
    );
    ensure!(
        d.template_ref.is_none(),
        "booted from no template: {:?}",
        d.template_ref
    );
    fx.provider.start(&d.id).await.or_fail("start")?;
    let greeting = wait_until("env to reach the sandbox", fx.patience, || {
        sh(fx, &d.id, "printf %s \"$GREETING\"")
    })
    .await?;
    ensure!(
        greeting == "hello world",
        "GREETING inside the sandbox is {greeting:?}"
    );
    Ok(())
}

/// Creating a name that already exists is `Conflict`, and the first sandbox is untouched.
pub async fn create_of_a_taken_name_is_a_conflict(fx: &Fixture) -> Check {
    let first = fx.request();
    let d = create(fx, &first).await?;
    let mut second = fx.request();
    second.name = first.name.clone();
    expect_kind(
        fx.provider.create(&second).await,
        &[ErrorKind::Conflict],
        "creating a taken name",
    )?;
    let again = describe(fx, &d.id).await?;
    ensure!(
        again.labels.get(OWNER_UID) == Some(&first.owner.uid),
        "the first sandbox changed hands: {:?}",
        again.labels
    );
    let found = fx
        .provider
        .find(&fx.owner_query(&second.owner))
        .await
        .or_fail("find")?;
    ensure!(found.is_empty(), "the refused create left {found:?}");
    Ok(())
}

/// A template that does not exist is an error, never a boot from the base image; nothing
/// is created.
pub async fn a_missing_template_or_image_creates_nothing(fx: &Fixture) -> Check {
    let mut request = fx.request();
    request.template = Some(format!("ct-{}", unique_hex()));
    let result = fx.provider.create(&request).await;
    let kinds = [
        ErrorKind::NotFound,
        ErrorKind::Invalid,
        ErrorKind::Unsupported,
    ];
    expect_kind(result, &kinds, "create from an absent template")?;
    let left = fx
        .provider
        .find(&fx.owner_query(&request.owner))
        .await
        .or_fail("find")?;
    ensure!(left.is_empty(), "a failed create left {left:?}");
    Ok(())
}

/// `find` narrows by labels (all must match), states and owner.
pub async fn find_narrows_by_labels_states_and_owner(fx: &Fixture) -> Check {
    let p = &fx.provider;
    let mut ra = fx.request();
    ra.labels.insert("role".into(), "web".into());
    let mut rb = fx.request();
    rb.labels.insert("role".into(), "db".into());
    rb.owner.namespace = ra.owner.namespace.clone();
    rb.owner.name = ra.owner.name.clone();
    let mut rc = fx.request();
    rc.labels.insert("role".into(), "web".into());
    let a = create(fx, &ra).await?.id;
    let b = create(fx, &rb).await?.id;
    let c = create(fx, &rc).await?.id;
    p.start(&a).await.or_fail("start")?;

    let find = |labels: BTreeMap<String, String>,
                states: Option<Vec<SandboxState>>,
                owner: Option<String>| {
        let query = SandboxQuery {
            labels,
            states,
            owner,
        };
        async move {
            p.find(&query)
                .await
                .or_fail(&format!("find {query:?}"))
                .map(|f| ids(&f))
        }
    };
    let all = find(fx.instance_labels(), None, None).await?;
    ensure!(
        all == sorted(vec![a.clone(), b.clone(), c.clone()]),
        "all: {all:?}"
    );
    let mut web = fx.instance_labels();
    web.insert("role".into(), "web".into());
    let got = find(web, None, None).await?;
    ensure!(
        got == sorted(vec![a.clone(), c.clone()]),
        "role=web: {got:?}"
    );
    let got = find(
        fx.instance_labels(),
        Some(vec![SandboxState::Running]),
        None,
    )
    .await?;
    ensure!(got == vec![a.clone()], "running: {got:?}");
    let got = find(
        fx.instance_labels(),
        Some(vec![SandboxState::Creating]),
        None,
    )
    .await?;
    ensure!(
        got == sorted(vec![b.clone(), c.clone()]),
        "creating: {got:?}"
    );
    let owner = format!("{}.{}", ra.owner.namespace, ra.owner.name);
    let got = find(fx.instance_labels(), None, Some(owner)).await?;
    ensure!(
        got == sorted(vec![a.clone(), b.clone()]),
        "by owner: {got:?}"
    );
    let got = find(
        fx.instance_labels(),
        Some(vec![SandboxState::Sleeping]),
        None,
    )
    .await?;
    ensure!(got.is_empty(), "looked for sleeping ones and found {got:?}");
    Ok(())
}

/// `find` (and the sweeper's `inventory`) sees a sandbox carrying our labels that the
/// provider did not create itself (how a crashed create is adopted), and never returns one
/// carrying another instance's labels or none at all. Needs a planter; a provider without one is covered by the other checks.
pub async fn find_sees_planted_resources_and_keeps_foreign_ones_out(fx: &Fixture) -> Check {
    let Some(planter) = &fx.planter else {
        println!("no planter for this provider: planted-resource checks not run");
        return Ok(());
    };
    let ours = fx.owner("Sandbox");
    let adopted = planter.plant(&ours.labels()).await?;
    let mut foreign = ours.clone();
    foreign.instance = format!("other-{}", unique_hex());
    let foreign_id = planter.plant(&foreign.labels()).await?;
    let _bare = planter.plant(&BTreeMap::new()).await?;

    let found = fx.provider.find(&fx.query()).await.or_fail("find")?;
    ensure!(
        ids(&found) == vec![adopted.clone()],
        "find by our instance must return exactly the planted sandbox {adopted}: {found:?}"
    );
    ensure!(
        found[0].started_at.time().is_none(),
        "a planted, never-started sandbox claims no start: {found:?}"
    );
    let inventory = fx
        .provider
        .inventory(&fx.instance_labels())
        .await
        .or_fail("inventory")?;
    ensure!(
        inventory.sandboxes == found,
        "the inventory's sandboxes are exactly what find returns: {:?} vs {found:?}",
        inventory.sandboxes
    );
    let found = fx
        .provider
        .find(&fx.owner_query(&ours))
        .await
        .or_fail("find")?;
    ensure!(
        ids(&found) == vec![adopted.clone()],
        "by owner uid: {found:?}"
    );
    let d = describe(fx, &foreign_id).await?;
    ensure!(
        d.labels.get(MANAGED_BY) == Some(&foreign.instance),
        "describe reports a foreign sandbox's own labels: {:?}",
        d.labels
    );
    Ok(())
}

/// start/stop/sleep/wake are idempotent; a sleeping sandbox can be stopped and destroyed.
pub async fn lifecycle_transitions_are_idempotent(fx: &Fixture) -> Check {
    let p = &fx.provider;
    let id = running(fx).await?;
    p.start(&id).await.or_fail("starting a running sandbox")?;
    let state = |want: &'static [SandboxState], what: &'static str| {
        let id = id.clone();
        async move {
            let d = describe(fx, &id).await?;
            ensure!(
                want.contains(&d.state),
                "{what}: state {:?}, want {want:?}",
                d.state
            );
            Ok::<(), String>(())
        }
    };
    state(&[SandboxState::Running], "after start").await?;
    if fx.expect.parks_itself {
        expect_kind(p.sleep(&id).await, &[ErrorKind::Unsupported], "sleep")?;
        ensure!(!stop_or_refused(fx, &id).await?, "stop was not refused");
        p.wake(&id).await.or_fail("waking an awake sandbox")?;
        state(&[SandboxState::Running], "after the refusals and a wake").await?;
        p.destroy(&id).await.or_fail("destroy")?;
        let gone = p.describe(&id).await.or_fail("describe")?;
        ensure!(gone.is_none(), "destroyed, yet described: {gone:?}");
        return Ok(());
    }
    p.sleep(&id).await.or_fail("sleep")?;
    p.sleep(&id).await.or_fail("sleeping a sleeping sandbox")?;
    state(
        &[SandboxState::Sleeping, SandboxState::Stopped],
        "after sleep",
    )
    .await?;
    p.wake(&id).await.or_fail("wake")?;
    p.wake(&id).await.or_fail("waking an awake sandbox")?;
    state(&[SandboxState::Running], "after wake").await?;
    wait_until("the woken sandbox to run commands", fx.patience, || {
        sh(fx, &id, "true")
    })
    .await?;
    p.sleep(&id).await.or_fail("sleep")?;
    p.stop(&id).await.or_fail("stopping a sleeping sandbox")?;
    p.stop(&id).await.or_fail("stopping a stopped sandbox")?;
    state(&[SandboxState::Stopped], "after stop").await?;
    p.wake(&id).await.or_fail("waking a stopped sandbox")?;
    state(&[SandboxState::Running], "after waking a stopped one").await?;
    p.sleep(&id).await.or_fail("sleep")?;
    p.destroy(&id)
        .await
        .or_fail("destroying a sleeping sandbox")?;
    let gone = p.describe(&id).await.or_fail("describe")?;
    ensure!(gone.is_none(), "destroyed, yet described: {gone:?}");
    Ok(())
}

/// Everything that needs a sandbox says `NotFound` (the dead-machine signal) when it is
/// gone; `describe` says `None`.
pub async fn operations_on_an_absent_sandbox_are_not_found(fx: &Fixture) -> Check {
    let p = &fx.provider;
    let d = create(fx, &fx.request()).await?;
    p.destroy(&d.id).await.or_fail("destroy")?;
    let never = format!("sbx-{}", unique_hex());
    for id in [d.id.as_str(), never.as_str()] {
        let described = p.describe(id).await.or_fail("describe")?;
        ensure!(
            described.is_none(),
            "describe({id}) of an absent sandbox: {described:?}"
        );
        let nf = [ErrorKind::NotFound];
        expect_kind(p.start(id).await, &nf, "start of an absent sandbox")?;
        expect_kind(p.stop(id).await, &nf, "stop of an absent sandbox")?;
        expect_kind(p.sleep(id).await, &nf, "sleep of an absent sandbox")?;
        expect_kind(p.wake(id).await, &nf, "wake of an absent sandbox")?;
        let exec = ExecRequest::shell("true", Duration::from_secs(10));
        expect_kind(p.exec(id, &exec).await, &nf, "exec in an absent sandbox")?;
    }
    Ok(())
}

/// Exec returns stdout, stderr and a non-zero exit as data; argv crosses without
/// re-parsing; cwd and env apply to that command only; a stopped sandbox is not "absent".
pub async fn exec_returns_output_and_exit_code_as_data(fx: &Fixture) -> Check {
    let p = &fx.provider;
    let id = running(fx).await?;
    let script = "printf 'to out'; printf 'to err' >&2; exit 3";
    let out = p
        .exec(&id, &ExecRequest::shell(script, Duration::from_secs(30)))
        .await
        .or_fail("exec")?;
    ensure!(
        out.stdout == b"to out" && out.stderr == b"to err" && out.exit_code == 3,
        "exec output: {out:?}"
    );
    let request = ExecRequest {
        argv: [
            "sh",
            "-c",
            "pwd; printf '%s|%s' \"$GREETING\" \"$1\"",
            "argv0",
            "a b;c",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        cwd: Some("/tmp".into()),
        env: BTreeMap::from([("GREETING".to_string(), "hello world".to_string())]),
        timeout: Duration::from_secs(30),
    };
    let out = p
        .exec(&id, &request)
        .await
        .or_fail("exec with cwd and env")?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text == "/tmp\nhello world|a b;c" && out.exit_code == 0,
        "argv/cwd/env: {out:?}"
    );
    let leaked = sh(fx, &id, "printf %s \"$GREETING\"").await?;
    ensure!(
        leaked.is_empty(),
        "exec env leaked into later commands: {leaked:?}"
    );
    let missing = ExecRequest {
        argv: vec!["conf-no-such-program".into()],
        cwd: None,
        env: BTreeMap::new(),
        timeout: Duration::from_secs(30),
    };
    let out = p
        .exec(&id, &missing)
        .await
        .or_fail("exec of a missing program")?;
    ensure!(
        matches!(out.exit_code, 126 | 127),
        "a missing program is exit 126/127, got {out:?}"
    );
    if !stop_or_refused(fx, &id).await? {
        return Ok(());
    }
    match p
        .exec(&id, &ExecRequest::shell("true", Duration::from_secs(10)))
        .await
    {
        Ok(out) => Err(format!("exec in a stopped sandbox succeeded: {out:?}")),
        Err(e) if e.is(ErrorKind::NotFound) => Err(format!(
            "a stopped sandbox is not absent (NotFound is the dead-machine signal): {e}"
        )),
        Err(_) => Ok(()),
    }
}

/// An exec that outlives its timeout is `Transient`, names the command, and returns within
/// its bound (plus slack for a slow machine).
pub async fn exec_timeout_is_transient_and_bounded(fx: &Fixture) -> Check {
    let id = running(fx).await?;
    let started = Instant::now();
    let result = fx
        .provider
        .exec(&id, &ExecRequest::shell("sleep 30", Duration::from_secs(1)))
        .await;
    let elapsed = started.elapsed();
    expect_kind(
        result.clone(),
        &[ErrorKind::Transient],
        "an exec past its timeout",
    )?;
    if let Err(e) = result {
        ensure!(
            mentions_command(e.message()),
            "the timeout error does not name the command: {e}"
        );
    }
    ensure!(
        elapsed < Duration::from_secs(15),
        "a 1 s exec bound took {elapsed:?}"
    );
    Ok(())
}

fn mentions_command(message: &str) -> bool {
    message.contains("sleep 30")
}

/// A tiny TCP server for the base image (perl is part of Debian's essential set): answers
/// every connection with one line.
const SERVER: &str = "cat > /tmp/conf-server.pl <<'PERL'
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 5, ReuseAddr => 1) or die $!;
while (my $c = $s->accept) { print $c \"hello-from-sandbox\\n\"; close $c }
PERL
nohup perl /tmp/conf-server.pl > /dev/null 2>&1 &";

/// A requested port is published once the sandbox runs (not before) and reaches the
/// sandbox's server from outside.
pub async fn published_ports_are_reachable(fx: &Fixture) -> Check {
    let mut request = fx.request();
    request.ports = vec![PortRequest {
        sandbox_port: 8080,
        protocol: "tcp".into(),
    }];
    let created = create(fx, &request).await?;
    ensure!(
        created.ports.is_empty(),
        "a never-started sandbox has no reachable ports: {:?}",
        created.ports
    );
    let id = created.id;
    fx.provider.start(&id).await.or_fail("start")?;
    wait_until("the sandbox to run commands", fx.patience, || {
        sh(fx, &id, "true")
    })
    .await?;
    sh(fx, &id, SERVER).await?;
    let ports = describe(fx, &id).await?.ports;
    ensure!(
        ports.len() == 1
            && ports[0].sandbox_port == 8080
            && ports[0].protocol == "tcp"
            && ports[0].port != 0
            && !ports[0].host.is_empty(),
        "port mappings of a running sandbox: {ports:?}"
    );
    let (host, port) = (ports[0].host.clone(), ports[0].port);
    let answer = wait_until("the sandbox's server to answer", fx.patience, || {
        let host = host.clone();
        async move {
            tokio::task::spawn_blocking(move || read_line_from(&host, port))
                .await
                .map_err(|e| e.to_string())?
        }
    })
    .await?;
    ensure!(
        answer == "hello-from-sandbox\n",
        "the server answered {answer:?}"
    );
    Ok(())
}

/// Connects to `host:port` and reads until the peer closes; an empty answer is an error
/// (a port proxy may accept before the server listens, then close).
fn read_line_from(host: &str, port: u16) -> Result<String, String> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect((host, port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    ensure!(!answer.is_empty(), "connected, but nothing was sent");
    Ok(answer)
}
