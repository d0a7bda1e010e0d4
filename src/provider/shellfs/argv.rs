//! An exec API without a working directory or environment field still runs a request's
//! `cwd` and `env`: the argv is wrapped, never re-parsed.

use crate::provider::ExecRequest;

/// The argv with `cwd` and `env` applied: `sh -c 'cd -- "$0" && exec env "$@"' CWD K=V… ARGV…`
/// with a `cwd`, `env K=V… ARGV…` with only an environment, the argv itself otherwise.
pub fn wrap(request: &ExecRequest) -> Vec<String> {
    let env = request.env.iter().map(|(k, v)| format!("{k}={v}"));
    let mut argv = match &request.cwd {
        Some(cwd) => vec![
            "sh".to_string(),
            "-c".into(),
            r#"cd -- "$0" && exec env "$@""#.into(),
            cwd.clone(),
        ],
        None if request.env.is_empty() => return request.argv.clone(),
        None => vec!["env".to_string()],
    };
    argv.extend(env);
    argv.extend(request.argv.iter().cloned());
    argv
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::time::Duration;

    #[test]
    fn cwd_and_env_wrap_the_argv_without_reparsing_it() {
        let mut request = ExecRequest::shell("echo $A", Duration::from_secs(1));
        assert_eq!(wrap(&request), ["sh", "-c", "echo $A"]);
        request.env = BTreeMap::from([("A".into(), "x y".into())]);
        assert_eq!(wrap(&request), ["env", "A=x y", "sh", "-c", "echo $A"]);
        request.cwd = Some("/tmp/a b".into());
        let argv = wrap(&request);
        assert_eq!(&argv[..3], ["sh", "-c", r#"cd -- "$0" && exec env "$@""#]);
        assert_eq!(&argv[3..], ["/tmp/a b", "A=x y", "sh", "-c", "echo $A"]);
    }
}
