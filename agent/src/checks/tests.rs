//! A check added through one row: `--checks`, its flags, the runner (its turn, its progress
//! lines, the look for other work before it, its judging, the node's verdict), the check for
//! missing results, the table and the headline all take it with nothing else changed.
//!
//! The API's report has a field per check, so the check added here keeps its settings and its
//! result where the io check keeps its own, and the rows it is added to are every row but io's.

use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use gpuval_crds::{Checks, Code, IoCheck, IoResult, MemoryCheck, NodeReport, Thresholds, Verdict};

use super::row::{FlagSet, Pending, Row, Slot, Step, parsed};
use super::{Plan, ROWS, Rows};
use crate::backend::{Backend, sim::SimBackend};
use crate::check::Stage;
use crate::judge::Says;

/// The check added: "scratch", measured once for the node; it fails below `--scratch-floor`.
const SCRATCH: Row = Row {
    name: "scratch",
    settings: crate::settings_in!(io),
    slot: crate::node_slot!(io),
    plan: |plan, _| {
        let spec = plan.checks.io.as_ref()?;
        Some(Box::new(ScratchStep {
            floor: spec.min_write_mbps,
            measures: spec.files > 0,
        }))
    },
    flags: Some(FlagSet {
        add: <ScratchFlags as clap::Args>::augment_args,
        apply: |given, checks| {
            let f: ScratchFlags = parsed(given)?;
            if let Some(s) = checks.io.as_mut() {
                s.min_write_mbps = f.scratch_floor.or(s.min_write_mbps);
            }
            Ok(())
        },
    }),
    compare: None,
    column: None,
    section: |report| {
        report
            .io
            .as_ref()
            .map(|r| format!("scratch: {:?} at {} MB/s\n", r.verdict, r.write_mbps))
            .unwrap_or_default()
    },
    headline: |report| {
        report
            .io
            .iter()
            .map(|r| format!("scratch {} MB/s", r.write_mbps))
            .collect()
    },
};

/// Its flags.
#[derive(clap::Args, Debug, Default)]
#[group(skip)]
struct ScratchFlags {
    /// scratch: fail below this many MB/s.
    #[arg(long)]
    scratch_floor: Option<i32>,
}

struct ScratchStep {
    floor: Option<i32>,
    /// False (asked for no files): it brings no measurement back, as a check whose thread was
    /// lost.
    measures: bool,
}

/// What the scratch check measures, always.
const SCRATCH_MBPS: f64 = 50.0;

impl Step for ScratchStep {
    fn name(&self) -> &'static str {
        "scratch"
    }
    fn measure(&self, stage: &Stage<'_>) -> Pending<'_> {
        if !self.measures {
            return Box::new(|_, _| {});
        }
        let mbps = stage.timed("scratch", |_| Ok(SCRATCH_MBPS));
        Box::new(move |_, report| {
            let mut r = IoResult {
                verdict: Verdict::Pass,
                write_mbps: mbps.unwrap_or_default(),
                ..Default::default()
            };
            if let Some(floor) = self.floor.filter(|f| r.write_mbps < f64::from(*f)) {
                r.verdict = Verdict::Fail;
                let why = format!("scratch {} MB/s < {floor} MB/s", r.write_mbps);
                r.reasons.push(Code::IoSlow.says(why));
            }
            report.io = Some(r);
        })
    }
}

/// Every row but io's, and the scratch check last.
fn rows() -> Rows {
    let mut rows: Vec<&'static Row> = ROWS.into_iter().filter(|r| r.name != "io").collect();
    rows.push(&SCRATCH);
    Rows(Vec::leak(rows))
}

/// Runs `checks` through the rows on a simulated node of two GPUs: the report and the lines.
fn run(checks: Checks) -> (NodeReport, Vec<String>) {
    let backend = Backend::Simulated(SimBackend::new("gpus=2".parse().expect("sim spec")));
    let mut plan = Plan::new(checks, Thresholds::default());
    plan.rows = rows();
    let lines = Mutex::new(Vec::new());
    let sink = |l: &str| lines.lock().expect("lines").push(l.to_string());
    let report = crate::runner::run(&backend, &plan, &AtomicBool::new(false), &sink);
    (report, lines.into_inner().expect("lines"))
}

#[test]
fn checks_and_flags_name_the_added_check() {
    let rows = rows();
    let mut checks = Checks::default();
    let names = ["memory".to_string(), "SCRATCH".to_string()];
    rows.select(&mut checks, &names).expect("both are known");
    assert!(checks.memory.is_some() && checks.io.is_some());
    assert!(checks.compute.is_none() && checks.topology.is_none());
    let unknown = rows.select(&mut checks, &["fan".to_string()]);
    assert!(
        unknown.as_ref().is_err_and(|e| e.contains("scratch")),
        "the error lists the added check: {unknown:?}"
    );

    let cmd = rows.flags(clap::Command::new("agent"));
    let given = cmd
        .try_get_matches_from(["agent", "--scratch-floor", "80", "--memory-passes", "2"])
        .expect("the added check's flag parses beside the others");
    rows.apply_flags(&given, &mut checks).expect("flags apply");
    assert_eq!(checks.io.as_ref().and_then(|s| s.min_write_mbps), Some(80));
    assert_eq!(checks.memory.as_ref().map(|m| m.passes), Some(2));
}

#[test]
fn the_runner_measures_judges_and_shows_the_added_check_in_its_turn() {
    let checks = Checks {
        memory: Some(MemoryCheck::default()),
        io: Some(IoCheck {
            min_write_mbps: Some(80),
            ..Default::default()
        }),
        ..Default::default()
    };
    let (report, lines) = run(checks);
    let at = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in {lines:#?}"))
    };
    assert!(
        at("[memory] finished") < at("[scratch] starting"),
        "in its row's turn"
    );
    let io = report.io.as_ref().expect("its result");
    assert_eq!(io.verdict, Verdict::Fail, "{:?}", io.reasons);
    assert_eq!(io.write_mbps, SCRATCH_MBPS);
    assert_eq!(report.verdict, Verdict::Fail, "its Fail is the node's");
    assert!(report.failures.iter().any(|f| f.contains("scratch 50")));

    let rows = rows();
    assert!(rows.sections(&report).contains("scratch: Fail at 50 MB/s"));
    assert!(
        rows.headline_parts(&report)
            .contains(&"scratch 50 MB/s".to_string())
    );
}

#[test]
fn an_added_check_that_brings_nothing_back_is_an_error() {
    let checks = Checks {
        io: Some(IoCheck {
            files: 0,
            ..Default::default()
        }),
        ..Default::default()
    };
    let (report, _) = run(checks);
    let io = report.io.as_ref().expect("an Error in its place");
    assert_eq!(io.verdict, Verdict::Error);
    assert_eq!(report.verdict, Verdict::Error);
}

#[test]
fn each_row_names_its_own_section_of_the_spec_and_its_own_result() {
    for row in ROWS {
        let mut checks = Checks::default();
        row.keep(&mut checks, true);
        assert!(row.asked(&checks), "{}", row.name);
        let on = serde_json::to_value(&checks).expect("checks serialize");
        let keys: Vec<&String> = on.as_object().expect("an object").keys().collect();
        assert_eq!(keys, [row.name], "its settings are its own section");

        let mut report = NodeReport {
            gpus: vec![Default::default()],
            ..Default::default()
        };
        let before = serde_json::to_value(&report).expect("report serializes");
        row.slot.fill_missing(&mut report, row.name);
        let after = serde_json::to_value(&report).expect("report serializes");
        let (before, after) = match row.slot {
            Slot::Gpu(_) => (&before["gpus"][0], &after["gpus"][0]),
            Slot::Node(_) => (&before, &after),
        };
        let added: Vec<&String> = after
            .as_object()
            .expect("an object")
            .keys()
            .filter(|k| before.get(k.as_str()) != after.get(k.as_str()))
            .collect();
        assert_eq!(added, [row.name], "its result is its own field");
    }
}

#[test]
fn the_rows_are_the_api_s_check_sections_and_the_views_checks() {
    let sorted = |mut v: Vec<&'static str>| {
        v.sort_unstable();
        v
    };
    let rows = sorted(Rows(&ROWS).names());
    assert_eq!(rows, sorted(gpuval_crds::rules::CHECK_SECTIONS.to_vec()));
    let views = gpuval_view::checks::CHECK_VIEWS.iter().map(|v| v.section);
    assert_eq!(rows, sorted(views.collect()));
}
