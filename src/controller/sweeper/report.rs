//! What a pass did, for logs, the `sweep` command's table and tests.
//!
//! A report lists every resource the pass deleted (or would delete), deferred, failed on or
//! kept for a reason worth a look (young, attached, retained, in use, unreadable owner).
//! Resources that are simply healthy — owner alive — are only counted: a pass over thousands
//! of sandboxes must not print thousands of rows.

use std::fmt::Write as _;
use std::time::Duration;

use super::decide::{Category, ResourceKind};

/// What happened to one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Deleted in this pass.
    Deleted,
    /// Would be deleted; this was a dry run.
    WouldDelete,
    /// Eligible, left for a later pass by the per-pass cap.
    Deferred,
    /// The deletion was attempted and failed (or the provider refused it).
    Failed(String),
    /// Eligible at decision time, but the direct read of the owner right before the
    /// deletion said otherwise (or could not be made), so it was not deleted.
    Skipped(String),
    /// Kept, for the reason given in the row.
    Kept,
}

impl Action {
    /// The table word.
    pub fn label(&self) -> String {
        match self {
            Action::Deleted => "deleted".into(),
            Action::WouldDelete => "would delete".into(),
            Action::Deferred => "deferred (cap)".into(),
            Action::Failed(e) => format!("FAILED: {e}"),
            Action::Skipped(e) => format!("skipped: {e}"),
            Action::Kept => "kept".into(),
        }
    }
}

/// One line of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Kind of resource.
    pub kind: ResourceKind,
    /// Its provider id.
    pub id: String,
    /// `Kind namespace/name` of the owner its labels name, when complete.
    pub owner: Option<String>,
    /// Why it is reclaimed, when it is eligible.
    pub category: Option<Category>,
    /// The reason, in words.
    pub why: String,
    /// Its age, when known.
    pub age: Option<Duration>,
    /// What happened.
    pub action: Action,
}

/// How a pass ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Everything eligible was handled (deleted, or listed in a dry run).
    Completed,
    /// The per-pass cap was reached: the deferred rows are left for a later pass.
    CapReached {
        /// How many eligible resources were left.
        deferred: usize,
    },
    /// The picture could not be completed; nothing was deleted.
    Aborted {
        /// What failed.
        reason: String,
    },
}

/// The result of one pass over one provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassReport {
    /// Provider name.
    pub provider: String,
    /// Operator instance swept for.
    pub instance: String,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// How it ended.
    pub outcome: Outcome,
    /// Listed resources (see the module docs for which).
    pub rows: Vec<Row>,
    /// Resources of this instance enumerated, by kind: sandboxes, volumes, templates.
    pub enumerated: [usize; 3],
    /// Resources kept silently because their owner exists.
    pub owner_alive: usize,
    /// Wall time of the pass.
    pub elapsed: Duration,
}

impl PassReport {
    /// An aborted pass: nothing was deleted.
    pub fn aborted(
        provider: &str,
        instance: &str,
        dry_run: bool,
        reason: String,
        elapsed: Duration,
    ) -> Self {
        PassReport {
            provider: provider.into(),
            instance: instance.into(),
            dry_run,
            outcome: Outcome::Aborted { reason },
            rows: Vec::new(),
            enumerated: [0; 3],
            owner_alive: 0,
            elapsed,
        }
    }

    /// Rows with this action.
    pub fn with_action(&self, action: &Action) -> impl Iterator<Item = &Row> {
        let action = action.clone();
        self.rows.iter().filter(move |r| r.action == action)
    }

    /// Ids of the resources deleted (or, in a dry run, that would be), as `kind/id`.
    pub fn reclaimed(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .rows
            .iter()
            .filter(|r| matches!(r.action, Action::Deleted | Action::WouldDelete))
            .map(|r| format!("{}/{}", r.kind, r.id))
            .collect();
        out.sort();
        out
    }

    /// Rows whose deletion failed.
    pub fn failures(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| matches!(r.action, Action::Failed(_)))
            .count()
    }

    /// The summary line.
    pub fn summary(&self) -> String {
        let head = format!(
            "provider {} (instance {}){}",
            self.provider,
            self.instance,
            if self.dry_run { ", DRY RUN" } else { "" }
        );
        let count = |a: Action| self.with_action(&a).count();
        let skipped = self
            .rows
            .iter()
            .filter(|r| matches!(r.action, Action::Skipped(_)))
            .count();
        let kept = count(Action::Kept);
        let reclaimed = if self.dry_run {
            format!("{} would be deleted", count(Action::WouldDelete))
        } else {
            format!("{} deleted", count(Action::Deleted))
        };
        let body = format!(
            "{reclaimed}, {} failed, {} skipped, {} deferred, {kept} kept, {} with a live owner; \
             enumerated {} sandboxes, {} volumes, {} templates in {:.3}s",
            self.failures(),
            skipped,
            count(Action::Deferred),
            self.owner_alive,
            self.enumerated[0],
            self.enumerated[1],
            self.enumerated[2],
            self.elapsed.as_secs_f64(),
        );
        match &self.outcome {
            Outcome::Completed => format!("{head}: pass completed: {body}"),
            Outcome::CapReached { deferred } => format!(
                "{head}: pass stopped at the deletion cap, {deferred} left for the next pass: {body}"
            ),
            Outcome::Aborted { reason } => {
                format!("{head}: pass ABORTED, nothing deleted: {reason}")
            }
        }
    }

    /// The readable table: a summary line, then one row per listed resource.
    pub fn render_table(&self) -> String {
        let mut out = self.summary();
        out.push('\n');
        if self.rows.is_empty() {
            return out;
        }
        let header = ["WHAT", "OWNER", "WHY", "AGE", "ACTION"];
        let cells: Vec<[String; 5]> = self
            .rows
            .iter()
            .map(|r| {
                let why = match r.category {
                    Some(c) => format!("{c}: {}", r.why),
                    None => r.why.clone(),
                };
                [
                    format!("{} {}", r.kind, r.id),
                    r.owner.clone().unwrap_or_else(|| "-".into()),
                    why,
                    r.age.map_or_else(|| "?".into(), human_age),
                    r.action.label(),
                ]
            })
            .collect();
        let mut width = header.map(str::len);
        for row in &cells {
            for (w, cell) in width.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut line = |cols: [&str; 5]| {
            let mut text = String::new();
            for (i, col) in cols.iter().enumerate() {
                if i + 1 == cols.len() {
                    text.push_str(col);
                } else {
                    let _ = write!(text, "{col:<w$}  ", w = width[i]);
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(header);
        for row in &cells {
            line([&row[0], &row[1], &row[2], &row[3], &row[4]]);
        }
        out
    }
}

/// `45s`, `12m5s`, `3h7m`, `4d2h`: the two largest units.
pub fn human_age(age: Duration) -> String {
    let s = age.as_secs();
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{sec}s")
    } else {
        format!("{sec}s")
    }
}

/// The `sweep` command's exit code for a set of passes: `0` every pass completed, `1` a pass
/// was aborted (it deleted nothing), `2` passes ran but left work (cap reached or a deletion
/// failed) — run it again.
pub fn exit_code(reports: &[PassReport]) -> u8 {
    if reports
        .iter()
        .any(|r| matches!(r.outcome, Outcome::Aborted { .. }))
    {
        1
    } else if reports
        .iter()
        .any(|r| matches!(r.outcome, Outcome::CapReached { .. }) || r.failures() > 0)
    {
        2
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(outcome: Outcome, rows: Vec<Row>) -> PassReport {
        PassReport {
            provider: "docker".into(),
            instance: "ops".into(),
            dry_run: false,
            outcome,
            rows,
            enumerated: [3, 1, 0],
            owner_alive: 2,
            elapsed: Duration::from_millis(420),
        }
    }

    fn row(id: &str, action: Action) -> Row {
        Row {
            kind: ResourceKind::Sandbox,
            id: id.into(),
            owner: Some("Sandbox ns/web".into()),
            category: Some(Category::Orphan),
            why: "owner Sandbox ns/web does not exist".into(),
            age: Some(Duration::from_secs(3725)),
            action,
        }
    }

    #[test]
    fn table_has_a_summary_a_header_and_aligned_rows() {
        let r = report(
            Outcome::Completed,
            vec![
                row("sbx-1", Action::Deleted),
                Row {
                    kind: ResourceKind::Volume,
                    id: "sbxv-2".into(),
                    owner: None,
                    category: None,
                    why: "reclaim policy Retain".into(),
                    age: None,
                    action: Action::Kept,
                },
            ],
        );
        let text = r.render_table();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "provider docker (instance ops): pass completed: 1 deleted, 0 failed, 0 skipped, 0 deferred, \
             1 kept, 2 with a live owner; enumerated 3 sandboxes, 1 volumes, 0 templates in 0.420s"
        );
        assert!(lines[1].starts_with("WHAT "), "{}", lines[1]);
        assert_eq!(lines[2].find("Sandbox ns/web"), lines[1].find("OWNER"));
        assert!(lines[2].contains("orphan: owner Sandbox ns/web does not exist"));
        assert!(lines[2].contains("1h2m"));
        assert!(lines[2].ends_with("deleted"));
        assert!(lines[3].starts_with("volume sbxv-2"));
        let owner_col = lines[1].find("OWNER").expect("OWNER column");
        assert!(lines[3][owner_col..].starts_with("- "), "{}", lines[3]);
        assert!(lines[3].contains(" ? "));
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn aborted_and_capped_summaries_say_so() {
        let r = PassReport::aborted(
            "docker",
            "ops",
            true,
            "listing volumes failed".into(),
            Duration::ZERO,
        );
        assert!(
            r.render_table()
                .contains("pass ABORTED, nothing deleted: listing volumes failed")
        );
        let r = report(
            Outcome::CapReached { deferred: 3 },
            vec![row("a", Action::Deferred)],
        );
        assert!(r.summary().contains("stopped at the deletion cap, 3 left"));
    }

    #[test]
    fn exit_codes_say_whether_the_passes_completed() {
        let done = report(Outcome::Completed, vec![row("a", Action::Deleted)]);
        let capped = report(Outcome::CapReached { deferred: 1 }, vec![]);
        let failed = report(
            Outcome::Completed,
            vec![row("a", Action::Failed("x".into()))],
        );
        let aborted = PassReport::aborted("d", "i", false, "x".into(), Duration::ZERO);
        assert_eq!(exit_code(std::slice::from_ref(&done)), 0);
        assert_eq!(exit_code(&[]), 0);
        assert_eq!(exit_code(&[done.clone(), capped]), 2);
        assert_eq!(exit_code(&[failed]), 2);
        assert_eq!(exit_code(&[done, aborted]), 1);
    }

    #[test]
    fn reclaimed_lists_deleted_and_would_delete() {
        let r = report(
            Outcome::Completed,
            vec![
                row("b", Action::WouldDelete),
                row("a", Action::Deleted),
                row("c", Action::Deferred),
                row("d", Action::Skipped("owner exists".into())),
            ],
        );
        assert_eq!(r.reclaimed(), vec!["sandbox/a", "sandbox/b"]);
    }

    #[test]
    fn ages_read_well() {
        assert_eq!(human_age(Duration::from_secs(45)), "45s");
        assert_eq!(human_age(Duration::from_secs(725)), "12m5s");
        assert_eq!(human_age(Duration::from_secs(3 * 3600 + 7 * 60)), "3h7m");
        assert_eq!(
            human_age(Duration::from_secs(4 * 86_400 + 2 * 3600 + 5)),
            "4d2h"
        );
    }
}
