//! Plain-text layout helpers shared by the table sections of every check.

/// `min-max` (or one value) with `decimals` decimals.
pub fn span(values: &[f64], decimals: usize) -> String {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (a, b) = (format!("{lo:.decimals$}"), format!("{hi:.decimals$}"));
    if a == b { a } else { format!("{a}-{b}") }
}

/// Every line indented by two spaces.
pub fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// Left-aligned columns two spaces apart, trailing spaces trimmed.
pub fn columns(rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let w = cell.chars().count();
            match widths.get_mut(i) {
                Some(max) => *max = (*max).max(w),
                None => widths.push(w),
            }
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The placeholder of a figure that is not there.
pub fn dash() -> String {
    "-".to_string()
}
