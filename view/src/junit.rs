//! A run as JUnit XML, the report CI systems read (Jenkins, GitLab, GitHub's test reporters):
//! one `<testsuite>` per node, and in it one `<testcase>` per check on each GPU (`memory`,
//! `compute`, `hostTransfer`, and `health` where the GPU has findings of its own; classname
//! `<node>.GPU<index>`), one per node-wide check (`topology`, `p2p`, `io`, `nccl`, `training`;
//! classname `<node>`) and one for the node's verdict (its final line in the validation, which
//! also holds what only the fabric test between nodes found).
//!
//! A Fail is a `<failure>`, an Error (the check could not measure: busy, no evidence, could not
//! run) an `<error>`, a check that did not run `<skipped>`; each names its codes, messages and
//! recommended actions (`[MemoryMismatch] ... (action: ReplaceHardware)`). A node without a
//! report is its verdict's test case alone, an `<error>` saying why. Warnings are written to the
//! test case's `<system-out>`: a Warn passes.

use gpuval_crds::reason::Action;
use gpuval_crds::{NodeReport, Reason, Verdict};

use crate::{Document, NodeEntry, worst_first};

/// One test case: what it is, its verdict and the findings behind it.
struct Case<'a> {
    classname: String,
    name: String,
    verdict: Verdict,
    reasons: Vec<&'a Reason>,
    /// Words for a case without findings to name (a node with no report).
    note: Option<String>,
}

impl Case<'_> {
    fn counts(&self) -> Counts {
        let mut c = Counts {
            tests: 1,
            ..Counts::default()
        };
        match self.verdict {
            Verdict::Fail => c.failures = 1,
            Verdict::Error => c.errors = 1,
            Verdict::Skipped => c.skipped = 1,
            Verdict::Pass | Verdict::Warn => {}
        }
        c
    }
}

#[derive(Default, Clone, Copy)]
struct Counts {
    tests: usize,
    failures: usize,
    errors: usize,
    skipped: usize,
}

impl Counts {
    fn add(self, o: Counts) -> Counts {
        Counts {
            tests: self.tests + o.tests,
            failures: self.failures + o.failures,
            errors: self.errors + o.errors,
            skipped: self.skipped + o.skipped,
        }
    }

    fn attrs(self) -> String {
        format!(
            r#"tests="{}" failures="{}" errors="{}" skipped="{}""#,
            self.tests, self.failures, self.errors, self.skipped
        )
    }
}

/// The document as JUnit XML.
pub fn junit(doc: &Document) -> String {
    let suites: Vec<(String, Counts)> = doc.nodes.iter().map(suite).collect();
    let total = suites.iter().fold(Counts::default(), |a, (_, c)| a.add(*c));
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str(&format!(
        "<testsuites name=\"{}\" {}>\n",
        xml(&title(doc)),
        total.attrs()
    ));
    for (s, _) in suites {
        out.push_str(&s);
    }
    out.push_str("</testsuites>\n");
    out
}

fn title(doc: &Document) -> String {
    let simulated = if doc.simulated() {
        " [SIMULATED backend: not real GPUs]"
    } else {
        ""
    };
    format!("gpuval {}{simulated}", doc.title)
}

/// One node's suite and its counts.
fn suite(n: &NodeEntry) -> (String, Counts) {
    let cases = cases(n);
    let counts = cases
        .iter()
        .fold(Counts::default(), |a, c| a.add(c.counts()));
    let mut s = format!("  <testsuite name=\"{}\" {}", xml(&n.node), counts.attrs());
    if let Some(r) = &n.report
        && !r.finished_at.is_empty()
    {
        s.push_str(&format!(" timestamp=\"{}\"", xml(&r.finished_at)));
    }
    s.push_str(">\n");
    s.push_str(&properties(n));
    for c in &cases {
        s.push_str(&case(c));
    }
    s.push_str("  </testsuite>\n");
    (s, counts)
}

fn properties(n: &NodeEntry) -> String {
    let mut props: Vec<(&str, String)> = vec![("verdict", n.verdict().as_str().to_string())];
    if let Some(l) = &n.line {
        props.push(("evidence", l.evidence.clone()));
    }
    if let Some(r) = &n.report {
        props.push(("action", r.action.as_str().to_string()));
        props.push(("backend", r.backend.clone()));
        props.push(("simulated", r.simulated.to_string()));
        props.push(("agentVersion", r.agent_version.clone()));
    }
    if let Some(result) = &n.result {
        props.push(("result", result.clone()));
    }
    let mut s = String::from("    <properties>\n");
    for (k, v) in props {
        s.push_str(&format!(
            "      <property name=\"{k}\" value=\"{}\"/>\n",
            xml(&v)
        ));
    }
    s.push_str("    </properties>\n");
    s
}

/// The node's test cases: each GPU's checks, the node-wide checks, then its verdict.
fn cases(n: &NodeEntry) -> Vec<Case<'_>> {
    let mut out = Vec::new();
    if let Some(r) = &n.report {
        gpu_cases(&n.node, r, &mut out);
        node_cases(&n.node, r, &mut out);
    }
    let (verdict, _, headline) = n.headline();
    let reasons = n
        .report
        .as_ref()
        .map(|r| worst_first(&r.failures))
        .unwrap_or_default();
    out.push(Case {
        classname: n.node.clone(),
        name: "node verdict".into(),
        verdict: n.verdict(),
        note: (!headline.is_empty() && reasons.is_empty() || n.report.is_none())
            .then(|| format!("{verdict}: {headline}")),
        reasons,
    });
    out
}

/// The checks a case is written for on each GPU, and once a node, in [`CHECK_SECTIONS`]'s
/// names (a test holds the two lists to it, so a new check fails it until it has its case).
///
/// [`CHECK_SECTIONS`]: gpuval_crds::rules::CHECK_SECTIONS
const GPU_CHECKS: [&str; 3] = ["memory", "compute", "hostTransfer"];
const NODE_CHECKS: [&str; 5] = ["topology", "p2p", "io", "nccl", "training"];

/// A check's name and, where it ran, its verdict and findings.
type Checked<'a> = (&'static str, Option<(Verdict, &'a [Reason])>);

/// Each check that ran, as a case of `classname`.
fn push_checks<'a>(classname: &str, checks: &[Checked<'a>], out: &mut Vec<Case<'a>>) {
    for (name, check) in checks {
        let Some((verdict, reasons)) = check else {
            continue;
        };
        out.push(Case {
            classname: classname.to_string(),
            name: (*name).into(),
            verdict: *verdict,
            reasons: worst_first(reasons),
            note: None,
        });
    }
}

fn gpu_cases<'a>(node: &str, r: &'a NodeReport, out: &mut Vec<Case<'a>>) {
    for g in &r.gpus {
        let classname = format!("{node}.GPU{}", g.index);
        let [memory, compute, host] = GPU_CHECKS;
        let checks: [Checked<'a>; 3] = [
            (
                memory,
                g.memory.as_ref().map(|m| (m.verdict, &m.reasons[..])),
            ),
            (
                compute,
                g.compute.as_ref().map(|m| (m.verdict, &m.reasons[..])),
            ),
            (
                host,
                g.host_transfer
                    .as_ref()
                    .map(|m| (m.verdict, &m.reasons[..])),
            ),
        ];
        push_checks(&classname, &checks, out);
        // Findings of the GPU's own (health, Xids, other work on it) that no check holds.
        let in_checks: Vec<&Reason> = checks
            .iter()
            .filter_map(|(_, c)| c.map(|(_, rs)| rs))
            .flatten()
            .collect();
        let own: Vec<&Reason> = worst_first(&g.reasons)
            .into_iter()
            .filter(|x| !in_checks.contains(x))
            .collect();
        if !own.is_empty() || g.health.is_some() {
            out.push(Case {
                classname,
                name: "health".into(),
                verdict: own
                    .iter()
                    .map(|x| x.severity.verdict())
                    .max()
                    .unwrap_or_default(),
                reasons: own,
                note: None,
            });
        }
    }
}

fn node_cases<'a>(node: &str, r: &'a NodeReport, out: &mut Vec<Case<'a>>) {
    let [topology, p2p, io, nccl, training] = NODE_CHECKS;
    let checks: [Checked<'a>; 5] = [
        (
            topology,
            r.topology.as_ref().map(|c| (c.verdict, &c.reasons[..])),
        ),
        (p2p, r.p2p.as_ref().map(|c| (c.verdict, &c.reasons[..]))),
        (io, r.io.as_ref().map(|c| (c.verdict, &c.reasons[..]))),
        (nccl, r.nccl.as_ref().map(|c| (c.verdict, &c.reasons[..]))),
        (
            training,
            r.training.as_ref().map(|c| (c.verdict, &c.reasons[..])),
        ),
    ];
    push_checks(node, &checks, out);
}

/// `[MemoryMismatch] GPU1 ... (action: ReplaceHardware)`.
fn finding(r: &Reason) -> String {
    match r.action {
        Action::None => format!("[{}] {}", r.code.as_str(), r.message),
        a => format!("[{}] {} (action: {a})", r.code.as_str(), r.message),
    }
}

fn case(c: &Case<'_>) -> String {
    let head = format!(
        "    <testcase classname=\"{}\" name=\"{}\"",
        xml(&c.classname),
        xml(&c.name)
    );
    let lines: Vec<String> = c
        .note
        .iter()
        .cloned()
        .chain(c.reasons.iter().map(|r| finding(r)))
        .collect();
    let first = lines.first().cloned().unwrap_or_default();
    let codes: Vec<&str> = c.reasons.iter().map(|r| r.code.as_str()).collect();
    let kind = if codes.is_empty() {
        c.verdict.as_str().to_string()
    } else {
        codes.join(",")
    };
    let body = |tag: &str| {
        format!(
            "      <{tag} message=\"{}\" type=\"{}\">{}</{tag}>\n",
            xml(&first),
            xml(&kind),
            xml(&lines.join("\n"))
        )
    };
    let inner = match c.verdict {
        Verdict::Fail => body("failure"),
        Verdict::Error => body("error"),
        Verdict::Skipped => format!("      <skipped message=\"{}\"/>\n", xml(&first)),
        Verdict::Warn if !lines.is_empty() => format!(
            "      <system-out>{}</system-out>\n",
            xml(&lines.join("\n"))
        ),
        Verdict::Pass | Verdict::Warn => String::new(),
    };
    if inner.is_empty() {
        format!("{head}/>\n")
    } else {
        format!("{head}>\n{inner}    </testcase>\n")
    }
}

/// Text as XML character data or an attribute value: markup escaped, and the control
/// characters XML 1.0 cannot hold dropped.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\t' | '\r' => out.push(ch),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LineView, sample};

    #[test]
    fn every_check_of_the_api_has_its_case() {
        let mut ours: Vec<&str> = GPU_CHECKS.iter().chain(&NODE_CHECKS).copied().collect();
        let mut api = gpuval_crds::rules::CHECK_SECTIONS.to_vec();
        ours.sort_unstable();
        api.sort_unstable();
        assert_eq!(ours, api, "a new check needs its JUnit case");
    }

    #[test]
    fn markup_and_control_characters_never_break_the_xml() {
        assert_eq!(
            xml("a<b>&\"c\"'\u{1}d\ne"),
            "a&lt;b&gt;&amp;&quot;c&quot;&apos;d&#10;e"
        );
    }

    #[test]
    fn each_check_on_each_gpu_is_a_case_and_a_fault_is_a_failure_with_its_code_and_action() {
        let doc = Document::single("report.json", sample::report());
        let x = junit(&doc);
        let r = doc.nodes[0].report.as_ref().expect("a report");
        let gpus = r.gpus.len();
        assert!(x.starts_with("<?xml"), "{x}");
        assert_eq!(x.matches("<testsuite ").count(), 1, "one suite a node: {x}");
        let memory_cases = x.matches("name=\"memory\"").count();
        assert_eq!(memory_cases, gpus, "{x}");
        let bad = r
            .gpus
            .iter()
            .find(|g| {
                g.memory
                    .as_ref()
                    .is_some_and(|m| m.verdict == Verdict::Fail)
            })
            .expect("a failing GPU in the sample");
        let code = bad.memory.as_ref().expect("memory").reasons[0]
            .code
            .as_str();
        assert!(x.contains(&format!("type=\"{code}")), "{x}");
        assert!(x.contains("(action: "), "{x}");
        assert!(x.contains("name=\"node verdict\""), "{x}");
    }

    #[test]
    fn a_node_without_a_report_is_an_error_saying_why() {
        let doc = Document {
            title: "validation quick".into(),
            validation: None,
            nodes: vec![NodeEntry {
                node: "gpu-b".into(),
                message: Some("Unschedulable: 0/3 nodes are available".into()),
                line: Some(LineView {
                    verdict: Verdict::Error,
                    evidence: "Infrastructure".into(),
                    message: String::new(),
                }),
                ..Default::default()
            }],
        };
        let x = junit(&doc);
        assert!(
            x.contains(r#"tests="1" failures="0" errors="1" skipped="0""#),
            "{x}"
        );
        assert!(x.contains("Unschedulable: 0/3 nodes are available"), "{x}");
        assert!(
            x.contains("<property name=\"evidence\" value=\"Infrastructure\"/>"),
            "{x}"
        );
    }
}
