//! A table of already-formatted cells, rendered aligned for the terminal
//! or as Markdown for a README, so both show the same numbers.

pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| (*h).to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len());
        self.rows.push(cells);
    }

    /// Columns padded to their widest cell; the first left-aligned, the
    /// rest (numbers) right-aligned.
    pub fn text(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                std::iter::once(&self.header)
                    .chain(&self.rows)
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let mut out = String::new();
            for (c, (cell, w)) in cells.iter().zip(&widths).enumerate() {
                let pad = w.saturating_sub(cell.chars().count());
                if c == 0 {
                    out.push_str(cell);
                    out.push_str(&" ".repeat(pad));
                } else {
                    out.push_str("  ");
                    out.push_str(&" ".repeat(pad));
                    out.push_str(cell);
                }
            }
            out.trim_end().to_string()
        };
        let mut out = line(&self.header);
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }

    pub fn markdown(&self) -> String {
        let mut out = format!("| {} |\n", self.header.join(" | "));
        out.push_str(&format!("|{}\n", "---|".repeat(self.header.len())));
        for r in &self.rows {
            out.push_str(&format!("| {} |\n", r.join(" | ")));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_aligned_text_and_markdown() {
        let mut t = Table::new(&["category", "tok/s"]);
        t.row(vec!["qa".into(), "101.5".into()]);
        t.row(vec!["translation".into(), "9.0".into()]);
        assert_eq!(
            t.text(),
            "category     tok/s\nqa           101.5\ntranslation    9.0\n"
        );
        assert_eq!(
            t.markdown(),
            "| category | tok/s |\n|---|---|\n| qa | 101.5 |\n| translation | 9.0 |\n"
        );
    }
}
