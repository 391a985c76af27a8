//! The table of reason codes in docs/checks-and-reasons.md (where the README's reference moved) lists every code with its default severity and action, so
//! a new code cannot go undocumented.

use gpuval_crds::Code;

#[test]
fn every_reason_code_is_in_the_readme_with_its_severity_and_action() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/checks-and-reasons.md");
    let readme = std::fs::read_to_string(path).expect("docs/checks-and-reasons.md");
    let missing: Vec<String> = Code::ALL
        .into_iter()
        .map(|c| format!("| `{c}` | {} | {} |", c.severity(), c.action()))
        .filter(|row| !readme.contains(row.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/checks-and-reasons.md's table of reason codes lacks (or disagrees on):\n{}",
        missing.join("\n")
    );
}
