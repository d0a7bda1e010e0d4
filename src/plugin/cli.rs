//! The command line: `kubectl sandbox [-n NS] [--context C] [--kubeconfig F] COMMAND …`, with
//! kubectl's spelling of every flag so that muscle memory from `kubectl exec/logs/cp/port-forward`
//! carries over.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Reach a Sandbox with your own Kubernetes identity: exec, logs, cp and port-forward through
/// the aggregated API `subresources.sandboxes.dev`.
#[derive(Debug, Parser)]
#[command(name = "kubectl-sandbox", bin_name = "kubectl sandbox", version)]
pub struct Cli {
    /// The namespace (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a Sandbox: `exec [-i] [-t] NAME -- CMD [ARG…]`.
    Exec(ExecArgs),
    /// Attach to a Sandbox's main process: `attach [-i] [-t] NAME`.
    Attach(AttachArgs),
    /// Print (and with -f follow) a Sandbox's main-process output.
    Logs(LogsArgs),
    /// Copy files and trees (with their modes) in or out: `cp LOCAL [NS/]NAME:PATH` or back.
    Cp(CpArgs),
    /// Forward local ports to a Sandbox: `port-forward NAME [LOCAL:]REMOTE…`.
    PortForward(PortForwardArgs),
}

/// `exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Pass stdin to the process.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Give the process a terminal (stdin must be one; the local terminal goes raw).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The Sandbox.
    pub name: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// `attach`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Pass stdin to the process.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// The main process has a terminal.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The Sandbox.
    pub name: String,
}

/// `logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Keep streaming new output.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Only the last N lines (-1: all).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub tail: i64,
    /// Only output newer than this (e.g. 30s, 5m, 2h).
    #[arg(long, value_parser = parse_duration)]
    pub since: Option<Duration>,
    /// Prefix each line with its RFC 3339 time.
    #[arg(long)]
    pub timestamps: bool,
    /// The Sandbox.
    pub name: String,
}

/// `cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// Source: a local path, or `[NS/]NAME:PATH`.
    pub src: String,
    /// Destination: a local path, or `[NS/]NAME:PATH`.
    pub dst: String,
}

/// `port-forward`.
#[derive(Debug, Args)]
pub struct PortForwardArgs {
    /// The Sandbox.
    pub name: String,
    /// `LOCAL:REMOTE`, `REMOTE` (the same port locally) or `:REMOTE` (any free local port).
    #[arg(required = true, num_args = 1..)]
    pub ports: Vec<String>,
    /// The local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: String,
}

/// `30s`, `5m`, `2h`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 30s, 5m, 2h)"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("{s:?} is not a duration (e.g. 30s, 5m, 2h)")),
    };
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("kubectl-sandbox").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn exec_takes_combined_flags_and_the_command_after_the_dashes() {
        let cli = parse(&["exec", "-it", "demo", "-n", "a", "--", "sh", "-c", "ls -l"]);
        assert_eq!(cli.namespace.as_deref(), Some("a"));
        let Command::Exec(e) = cli.command else {
            panic!("not exec")
        };
        assert!(e.stdin && e.tty);
        assert_eq!(e.name, "demo");
        assert_eq!(e.command, ["sh", "-c", "ls -l"]);
    }

    #[test]
    fn exec_without_a_command_is_refused() {
        assert!(Cli::try_parse_from(["k", "exec", "demo"]).is_err());
        assert!(Cli::try_parse_from(["k", "exec", "demo", "--"]).is_err());
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        let cli = parse(&[
            "--context",
            "c1",
            "--kubeconfig",
            "/k",
            "logs",
            "-f",
            "demo",
            "-n",
            "b",
        ]);
        assert_eq!(cli.context.as_deref(), Some("c1"));
        assert_eq!(cli.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(cli.namespace.as_deref(), Some("b"));
        let Command::Logs(l) = cli.command else {
            panic!("not logs")
        };
        assert!(l.follow && !l.timestamps);
        assert_eq!(l.tail, -1);
    }

    #[test]
    fn logs_options_parse_like_kubectls() {
        let Command::Logs(l) = parse(&["logs", "--tail=5", "--since", "2m", "x"]).command else {
            panic!("not logs")
        };
        assert_eq!((l.tail, l.since), (5, Some(Duration::from_secs(120))));
        assert!(parse_duration("5x").is_err());
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
    }

    #[test]
    fn port_forward_and_cp_take_their_operands() {
        let Command::PortForward(p) = parse(&["port-forward", "demo", "8080:80", ":81"]).command
        else {
            panic!("not port-forward")
        };
        assert_eq!(p.ports, ["8080:80", ":81"]);
        assert_eq!(p.address, "127.0.0.1");
        let Command::Cp(c) = parse(&["cp", "./a", "ns/demo:/tmp/a"]).command else {
            panic!("not cp")
        };
        assert_eq!((c.src.as_str(), c.dst.as_str()), ("./a", "ns/demo:/tmp/a"));
    }
}
