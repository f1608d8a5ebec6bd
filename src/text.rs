//! Plain-text output shared by the commands that print tables for people.

use std::fmt::Write as _;

/// Rows as columns padded to their widest cell, two spaces apart, like kubectl; the last
/// cell of a row is not padded and trailing blanks are trimmed.
pub fn aligned(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|row| row.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ", width = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_line_up_on_the_widest_cell() {
        let rows = vec![
            vec!["NODE".to_string(), "READY".to_string(), "X".to_string()],
            vec![
                "worker-10".to_string(),
                "Unknown".to_string(),
                "".to_string(),
            ],
        ];
        assert_eq!(
            super::aligned(&rows),
            "NODE       READY    X\nworker-10  Unknown\n"
        );
    }
}
