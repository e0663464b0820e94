//! Rows of results, each optionally compared with a baseline row of the same run.

use crate::stats::{fmt, Samples};
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub group: String,
    pub name: String,
    /// Median in microseconds (or a rate for `unit` = "req/s").
    pub value: f64,
    pub unit: String,
    pub p10: f64,
    pub p90: f64,
    pub n: usize,
    pub baseline: Option<String>,
    pub ratio: Option<f64>,
}

/// 5.26, 0.34, and small ratios with enough digits to tell them from 0: 0.0018.
fn ratio(x: f64) -> String {
    if x > 0.0 && x < 0.01 {
        format!("{x:.4}")
    } else {
        format!("{x:.2}")
    }
}

#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
    /// Text that follows the table (summaries in another shape).
    pub notes: Vec<String>,
}

impl Report {
    /// Adds a latency row; `baseline` names an earlier row of the same group.
    pub fn latency(&mut self, group: &str, name: &str, s: &Samples, baseline: Option<&str>) {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let value = us(s.median());
        self.push(Row {
            group: group.into(),
            name: name.into(),
            value,
            unit: "µs".into(),
            p10: us(s.quantile(0.1)),
            p90: us(s.quantile(0.9)),
            n: s.len(),
            baseline: baseline.map(str::to_string),
            ratio: None,
        });
        println!(
            "  {name:<48} median {:>10}  p10 {:>10}  p90 {:>10}  n={}{}",
            fmt(s.median()),
            fmt(s.quantile(0.1)),
            fmt(s.quantile(0.9)),
            s.len(),
            self.ratio_text()
        );
    }

    /// Adds a rate row (higher is better).
    pub fn rate(
        &mut self,
        group: &str,
        name: &str,
        per_sec: f64,
        n: usize,
        baseline: Option<&str>,
    ) {
        self.push(Row {
            group: group.into(),
            name: name.into(),
            value: per_sec,
            unit: "req/s".into(),
            p10: per_sec,
            p90: per_sec,
            n,
            baseline: baseline.map(str::to_string),
            ratio: None,
        });
        println!(
            "  {name:<48} {per_sec:>12.0} req/s  n={n}{}",
            self.ratio_text()
        );
    }

    /// Adds a row of rates (higher is better), one per run: median, p10 and p90 of them.
    pub fn rates(
        &mut self,
        group: &str,
        name: &str,
        runs: &[f64],
        unit: &str,
        baseline: Option<&str>,
    ) {
        let mut v = runs.to_vec();
        v.sort_by(f64::total_cmp);
        let q = |q: f64| {
            v.get(((v.len().max(1) - 1) as f64 * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let value = q(0.5);
        self.push(Row {
            group: group.into(),
            name: name.into(),
            value,
            unit: unit.into(),
            p10: q(0.1),
            p90: q(0.9),
            n: v.len(),
            baseline: baseline.map(str::to_string),
            ratio: None,
        });
        println!(
            "  {name:<48} median {value:>10.0} {unit}  p10 {:>10.0}  p90 {:>10.0}  n={}{}",
            q(0.1),
            q(0.9),
            v.len(),
            self.ratio_text()
        );
    }

    /// Text for after the table.
    pub fn note(&mut self, text: &str) {
        self.notes.push(text.to_string());
    }

    fn push(&mut self, mut row: Row) {
        if let Some(b) = &row.baseline {
            if let Some(base) = self
                .rows
                .iter()
                .find(|r| r.group == row.group && &r.name == b)
            {
                if base.value > 0.0 {
                    row.ratio = Some(row.value / base.value);
                }
            }
        }
        self.rows.push(row);
    }

    fn ratio_text(&self) -> String {
        let r = self.rows.last().expect("just pushed");
        match (&r.baseline, r.ratio) {
            (Some(b), Some(x)) => format!("   = {}x {b}", ratio(x)),
            _ => String::new(),
        }
    }

    /// A Markdown table of every row, for docs/performance.md.
    pub fn markdown(&self) -> String {
        let mut s = String::from("| group | measurement | median | p10 | p90 | n | ratio |\n|---|---|---|---|---|---|---|\n");
        for r in &self.rows {
            let v = |x: f64| {
                if r.unit == "µs" {
                    fmt(Duration::from_secs_f64(x / 1e6))
                } else {
                    format!("{x:.0} {}", r.unit)
                }
            };
            let vs = match (&r.baseline, r.ratio) {
                (Some(b), Some(x)) => format!("{}x {b}", ratio(x)),
                _ => "baseline".into(),
            };
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                r.group,
                r.name,
                v(r.value),
                v(r.p10),
                v(r.p90),
                r.n,
                vs
            ));
        }
        for n in &self.notes {
            s.push('\n');
            s.push_str(n);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ratios() {
        assert_eq!(super::ratio(5.256), "5.26");
        assert_eq!(super::ratio(0.0018), "0.0018");
        assert_eq!(super::ratio(0.0), "0.00");
    }
}
