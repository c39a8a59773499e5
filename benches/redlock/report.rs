//! The report: each row printed as a table line, kept for the text and
//! Markdown tables and as JSON, and the latency curves for the chart.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::json;

#[derive(Default)]
pub(crate) struct Report {
    rows: Vec<serde_json::Value>,
    text: String,
    md: String,
    /// (label, CDF points) for the chart
    pub(crate) curves: Vec<(String, Vec<(f64, f64)>)>,
}

impl Report {
    pub(crate) fn section(&mut self, title: &str, header: &[&str]) {
        let _ = writeln!(self.text, "\n{title}");
        let _ = writeln!(self.text, "  {}", header.join(" | "));
        let _ = writeln!(self.md, "\n### {title}\n");
        let _ = writeln!(self.md, "| {} |", header.join(" | "));
        let _ = writeln!(self.md, "|{}", "---|".repeat(header.len()));
        print!("\n{title}\n  {}\n", header.join(" | "));
    }

    pub(crate) fn line(&mut self, cells: &[String], row: serde_json::Value) {
        let line = cells.join(" | ");
        println!("  {line}");
        let _ = writeln!(self.text, "  {line}");
        let _ = writeln!(self.md, "| {line} |");
        self.rows.push(row);
    }

    /// Writes the rows as `redlock.json` and the tables as `redlock.md` into
    /// `dir`.
    pub(crate) fn save(&self, dir: &Path, machine: &str, quick: bool) {
        let json = json!({"machine": machine, "quick": quick, "rows": self.rows});
        let _ = std::fs::write(
            dir.join("redlock.json"),
            serde_json::to_string_pretty(&json).unwrap(),
        );
        let md = format!(
            "## redlock-quorum benchmark\n\nMachine: {machine}. Command: `cargo bench -p redlock-bench --bench redlock{}`.\n{}",
            if quick { " -- --quick" } else { "" },
            self.md
        );
        let _ = std::fs::write(dir.join("redlock.md"), md);
    }

    /// The tables in Markdown, one `###` heading per scenario.
    pub(crate) fn markdown(&self) -> &str {
        &self.md
    }

    pub(crate) fn note(&mut self, text: &str) {
        println!("  {text}");
        let _ = writeln!(self.text, "  {text}");
        let _ = writeln!(self.md, "\n{text}");
    }
}

pub(crate) fn f(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

pub(crate) fn ratio(a: f64, b: f64) -> String {
    if a.is_nan() || b.is_nan() || b == 0.0 {
        "-".into()
    } else {
        format!("{:.2}x", a / b)
    }
}
