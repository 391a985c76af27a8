use super::*;
use serde_json::json;

fn depth(memory: Value, compute: Value) -> Depth {
    Depth {
        checks: BTreeMap::from([
            ("memory".to_string(), memory),
            ("compute".to_string(), compute),
        ]),
        relative_tolerance_percent: 15,
        overrides: BTreeMap::new(),
    }
}

fn deep() -> Depth {
    depth(
        json!({"fraction": 0.9, "passes": 2}),
        json!({"duration": "10m", "dtypes": ["fp32", "bf16"]}),
    )
}

fn failure() -> Failure {
    Failure {
        run: "deep".into(),
        validation_uid: "u-deep".into(),
        schedule: None,
        depth: deep(),
        gpus: vec!["GPU-1".into()],
        codes: "MemoryMismatch".into(),
        at: "2026-12-01T00:00:00Z".into(),
        generation: None,
        on_failure: NodeAction::Taint,
    }
}

fn at(s: &str) -> Timestamp {
    s.parse().expect("time")
}

#[test]
fn a_later_pass_as_deep_on_the_same_gpus_by_a_schedule_covers() {
    let gpus = BTreeSet::from(["GPU-0".to_string(), "GPU-1".to_string()]);
    let d = deep();
    let pass = Pass {
        validation_uid: "u-other",
        by_schedule: true,
        depth: &d,
        gpus: &gpus,
        at: at("2026-12-02T00:00:00Z"),
    };
    assert_eq!(covers(&pass, &failure()), Ok(()));
    let same = Pass {
        validation_uid: "u-deep",
        by_schedule: false,
        ..pass.clone()
    };
    assert_eq!(covers(&same, &failure()), Ok(()));
    let stranger = Pass {
        by_schedule: false,
        ..pass.clone()
    };
    assert!(covers(&stranger, &failure()).is_err());
    let older = Pass {
        at: at("2026-11-30T00:00:00Z"),
        ..pass
    };
    assert!(covers(&older, &failure()).is_err());
}

#[test]
fn a_shallower_pass_or_one_on_other_gpus_does_not_cover() {
    let gpus = BTreeSet::from(["GPU-0".to_string(), "GPU-1".to_string()]);
    let nightly = depth(
        json!({"fraction": 0.25, "passes": 2}),
        json!({"duration": "2m", "dtypes": ["fp32", "bf16"]}),
    );
    let pass = |d| Pass {
        validation_uid: "u-deep",
        by_schedule: true,
        depth: d,
        gpus: &gpus,
        at: at("2026-12-02T00:00:00Z"),
    };
    let why = covers(&pass(&nightly), &failure()).expect_err("shallow");
    assert!(why.contains("shallower"), "{why}");
    let fewer = depth(
        json!({"fraction": 0.9, "passes": 2}),
        json!({"duration": "10m", "dtypes": ["fp32"]}),
    );
    assert!(covers(&pass(&fewer), &failure()).is_err());
    let mut topology_only = deep();
    topology_only.checks.remove("memory");
    assert!(covers(&pass(&topology_only), &failure()).is_err());
    let mut lowered = deep();
    lowered.checks.insert(
        "memory".into(),
        json!({"fraction": 0.9, "passes": 2, "maxMismatches": 100}),
    );
    assert!(
        covers(&pass(&lowered), &failure()).is_err(),
        "a ceiling set"
    );
    let mut loose = deep();
    loose.relative_tolerance_percent = 40;
    assert!(covers(&pass(&loose), &failure()).is_err());
    let mut overridden = deep();
    overridden
        .overrides
        .insert("MemoryMismatch".into(), "Warn".into());
    assert!(covers(&pass(&overridden), &failure()).is_err());
    let d = deep();
    let other_gpus = BTreeSet::from(["GPU-0".to_string()]);
    let elsewhere = Pass {
        gpus: &other_gpus,
        ..pass(&d)
    };
    assert!(covers(&elsewhere, &failure()).is_err());
}

#[test]
fn only_a_newer_verdict_is_news_and_the_record_reads_back() {
    let e = |run: &str, when: &str, passed: bool| Evidence {
        validation: run.into(),
        uid: None,
        at: at(when),
        passed,
        category: gpuval_crds::Evidence::Hardware,
        reason: "Passed".into(),
        message: String::new(),
        action: gpuval_crds::Action::None,
        codes: String::new(),
        on_failure: NodeAction::None,
        run_created: None,
        generation: 0,
    };
    let mut r = Record::default();
    assert!(r.is_news(&e("a", "2026-12-01T00:00:00Z", true), None));
    r.judge(&e("b", "2026-12-02T00:00:00Z", false));
    assert!(
        !r.is_news(&e("a", "2026-12-01T00:00:00Z", true), None),
        "older"
    );
    assert!(
        !r.is_news(&e("b", "2026-12-02T00:00:00Z", false), None),
        "the same"
    );
    assert!(
        r.is_news(&e("c", "2026-12-02T00:00:00Z", true), None),
        "same second, another run"
    );
    assert!(r.is_news(&e("b", "2026-12-03T00:00:00Z", true), None));
    // A re-run of the same validation whose verdict lands in the same whole second: its later
    // generation is news (it was dropped, so a quick re-run could go unjudged).
    let rerun = Evidence {
        generation: 1,
        ..e("b", "2026-12-02T00:00:00Z", true)
    };
    assert!(r.is_news(&rerun, None), "same second, a later generation");
    let earlier_stamp = Evidence {
        generation: 1,
        ..e("b", "2026-12-01T23:59:59Z", true)
    };
    assert!(
        r.is_news(&earlier_stamp, None),
        "a later generation, whatever its time's precision says"
    );
    r.judge(&rerun);
    assert!(!r.is_news(&rerun, None), "that generation again");
    // A record written before generations were kept reads as before.
    let old = Record::parse(Some(
        r#"{"judged":{"run":"b","at":"2026-12-02T00:00:00Z","passed":false}}"#,
    ))
    .expect("an old record");
    assert!(!old.is_news(&rerun, None));
    r.fail(failure());
    r.fail(failure());
    assert_eq!(r.failures.len(), 1, "one failure a validation");
    let back = Record::parse(Some(&r.annotation())).expect("parses");
    assert_eq!(back, r);
    let carried = Some(at("2026-12-05T00:00:00Z"));
    assert!(!Record::default().is_news(&e("a", "2026-12-01T00:00:00Z", true), carried));
}

/// A verdict is its validation's (by UID) generation: the same failure read again with another
/// time (its result replaced by the next generation's, the line is dated by the run's end) is
/// no news, and judged again it keeps the depth it was first recorded with.
#[test]
fn the_same_verdict_dated_again_is_no_news_and_keeps_its_depth() {
    let line = |when: &str, generation: i64, uid: &str| Evidence {
        validation: "deep".into(),
        uid: Some(uid.into()),
        at: at(when),
        passed: false,
        category: gpuval_crds::Evidence::Hardware,
        reason: "Failed".into(),
        message: String::new(),
        action: gpuval_crds::Action::None,
        codes: "MemoryMismatch".into(),
        on_failure: NodeAction::Taint,
        run_created: None,
        generation,
    };
    let mut r = Record::default();
    let first = line("2026-12-01T00:00:00Z", 1, "u-deep");
    r.judge(&first);
    r.fail(Failure {
        generation: Some(1),
        ..failure()
    });
    let dated_by_its_end = line("2026-12-01T00:00:03Z", 1, "u-deep");
    assert!(!r.is_news(&dated_by_its_end, None), "the same verdict");
    assert!(
        r.is_news(&line("2026-12-01T00:00:03Z", 2, "u-deep"), None),
        "the next generation"
    );
    assert!(
        r.is_news(&line("2026-12-01T00:00:03Z", 1, "u-again"), None),
        "a validation created again under the name"
    );
    let shallow = depth(json!({"fraction": 0.1}), json!({"duration": "1m"}));
    r.fail(Failure {
        generation: Some(1),
        at: "2026-12-01T00:00:03Z".into(),
        depth: shallow,
        ..failure()
    });
    assert_eq!(r.failures.len(), 1);
    assert_eq!(r.failures[0].depth, deep(), "first recorded depth kept");
    assert_eq!(r.failures[0].at, "2026-12-01T00:00:00Z");
}

#[test]
fn a_record_that_counted_a_line_more_is_the_newer_of_two_judged_alike() {
    let quiet = |at: &str| Quiet {
        lines: 1,
        run: "scale".into(),
        at: at.into(),
        category: "NoEvidence".into(),
        message: "a simulated report".into(),
        unheld: 0,
    };
    let cached = Record::default();
    let written = Record {
        quiet: Some(quiet("2026-12-08T01:26:12Z")),
        ..Record::default()
    };
    // The cache has not caught up with the write: the write stands.
    assert_eq!(cached.clone().newer(written.clone()), written);
    assert_eq!(written.clone().newer(cached), written);
    let later = Record {
        quiet: Some(quiet("2026-12-08T01:30:00Z")),
        ..Record::default()
    };
    assert_eq!(written.clone().newer(later.clone()), later);
    // A record judged on a verdict stays newer than one that only counted lines.
    let judged = Record {
        judged: Some(Judged {
            run: "r".into(),
            at: "2026-12-08T01:00:00Z".into(),
            passed: true,
            generation: None,
            uid: None,
        }),
        ..Record::default()
    };
    assert_eq!(later.newer(judged.clone()), judged);
}
