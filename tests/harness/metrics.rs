//! Reading the Prometheus text the operator exposes, from its `/metrics` or from a
//! [`sandbox_operator::metrics::Metrics`] in the test process.

use super::operator::Operator;

/// The sum of the samples in `text` whose line starts with `sample`: a metric name sums its
/// whole family, a name with its full label set reads that one series. 0 when none match.
pub fn sum(text: &str, sample: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(sample))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// [`sum`] over what the operator's `/metrics` serves now (0 when it does not answer).
pub fn metric(op: &Operator, sample: &str) -> f64 {
    sum(&op.http_get("/metrics").unwrap_or_default(), sample)
}

/// Whether `text` holds exactly the line `line` (`name{labels} value`).
pub fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// The value of one series (`name{labels}` exactly as rendered) on the operator's
/// `/metrics`; `None` when the series is absent or the server does not answer.
pub fn sample(op: &Operator, series: &str) -> Option<f64> {
    let body = op.http_get("/metrics")?;
    body.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// `sandbox_operator_leader` of `op`: 1 while it leads, 0 while it stands by.
pub fn leader_gauge(op: &Operator) -> Option<f64> {
    sample(op, "sandbox_operator_leader")
}

/// Which sweep passes to count.
#[derive(Clone, Copy, Debug)]
pub enum Passes {
    /// Passes that completed.
    Completed,
    /// Passes that ended, completed or aborted (e.g. on a refused credential).
    Ended,
}

/// How many sweep passes of one kind an operator had made at one moment, to wait for more.
pub struct PassCount<'a> {
    op: &'a Operator,
    which: Passes,
    at: f64,
}

impl<'a> PassCount<'a> {
    /// The passes of `which` kind `op` has made so far.
    pub fn now(op: &'a Operator, which: Passes) -> Self {
        let completed = metric(op, "sandbox_operator_sweep_passes_total");
        let at = match which {
            Passes::Completed => completed,
            Passes::Ended => completed + metric(op, "sandbox_operator_sweep_aborted_total"),
        };
        PassCount { op, which, at }
    }

    /// Waits until the operator has made `more` passes of the same kind since this count.
    pub async fn wait_more(&self, more: f64, what: &str) {
        let want = self.at + more;
        super::wait_for(what, super::objects::READY_TIMEOUT, || async {
            let now = PassCount::now(self.op, self.which).at;
            (now >= want)
                .then_some(())
                .ok_or_else(|| format!("{now} passes ({:?}) of {want}", self.which))
        })
        .await;
    }
}
