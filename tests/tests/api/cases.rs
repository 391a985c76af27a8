//! The table of specs the API server must refuse (each with the field its message names) and
//! the edge cases it must accept. Shared by the API test and the validator test, which reads
//! every field but `single`.
#![allow(dead_code)]

use serde_json::{Value, json};

/// A spec the API server must refuse.
pub struct Bad {
    pub name: String,
    pub spec: Value,
    /// Text the message must contain: the field, with its index where there is one.
    pub field: String,
    /// The mistake must come back as exactly one message (true for every mistake that does not
    /// stop the API server's rules: bounds, patterns, durations, rules, duplicates).
    pub single: bool,
}

fn bad(name: impl Into<String>, spec: Value, field: impl Into<String>) -> Bad {
    Bad {
        name: name.into(),
        spec,
        field: field.into(),
        single: false,
    }
}

fn one(name: impl Into<String>, spec: Value, field: impl Into<String>) -> Bad {
    Bad {
        single: true,
        ..bad(name, spec, field)
    }
}

fn memory() -> Value {
    json!({"memory": {}})
}

/// `checks` with one section set to `body`.
fn check(section: &str, body: Value) -> Value {
    json!({"checks": {section: body}})
}

/// A spec with one field of one check section set.
fn field(section: &str, name: &str, value: Value) -> Value {
    check(section, json!({name: value}))
}

/// Every integer field at both ends: (section, field, one below the least, one above the most);
/// the message names `spec.checks.<section>.<field>`.
const INTEGER_BOUNDS: &[(&str, &str, i64, i64)] = &[
    ("topology", "minActiveLinks", -1, 65),
    ("memory", "passes", 0, 1001),
    ("memory", "maxMismatches", -1, 9_007_199_254_740_992),
    ("memory", "minGbps", 0, 100_001),
    ("compute", "matrixSize", 0, 33_024),
    ("p2p", "bufferMib", 0, 16_385),
    ("p2p", "iterations", 0, 10_001),
    ("p2p", "minUnidirectionalGbps", 0, 100_001),
    ("p2p", "minBidirectionalGbps", 0, 100_001),
    ("p2p", "maxLatencyMicros", 0, 1_000_001),
    ("hostTransfer", "bufferMib", 0, 65_537),
    ("hostTransfer", "minPinnedGbps", 0, 10_001),
    ("io", "fileSizeMib", 0, 1_048_577),
    ("io", "files", 0, 10_001),
    ("io", "concurrency", 0, 257),
    ("io", "minWriteMbps", 0, 1_000_001),
    ("io", "minReadMbps", 0, 1_000_001),
];

fn bounds() -> Vec<Bad> {
    let mut out = Vec::new();
    for &(section, name, below, above) in INTEGER_BOUNDS {
        let spec = |v: i64| field(section, name, json!(v));
        let path = format!("spec.checks.{section}.{name}");
        out.push(one(format!("{section}-{name}-below"), spec(below), &path));
        out.push(one(format!("{section}-{name}-above"), spec(above), path));
    }
    for dtype in ["bf16", "fp16", "tf32", "fp32"] {
        let path = format!("spec.checks.compute.minTflops.{dtype}");
        let spec = |v: i64| field("compute", "minTflops", json!({dtype: v}));
        out.push(one(format!("tflops-{dtype}-zero"), spec(0), &path));
        out.push(one(format!("tflops-{dtype}-above"), spec(100_001), path));
    }
    let tolerance =
        |v: i64| json!({"checks": memory(), "thresholds": {"relativeTolerancePercent": v}});
    let tol = "spec.thresholds.relativeTolerancePercent";
    out.push(one("tolerance-zero", tolerance(0), tol));
    out.push(one("tolerance-above", tolerance(91), tol));
    // One field of one section, out of its bounds: the message names
    // `spec.checks.<section>.<field>`.
    for (name, section, key, value) in [
        ("fraction-zero", "memory", "fraction", json!(0)),
        ("fraction-negative", "memory", "fraction", json!(-0.1)),
        ("fraction-above-one", "memory", "fraction", json!(1.000001)),
        (
            "int32-overflow",
            "memory",
            "passes",
            json!(3_000_000_000_i64),
        ),
        (
            "power-fraction-above-one",
            "compute",
            "minPowerFraction",
            json!(1.5),
        ),
        (
            "slowdown-fraction-negative",
            "compute",
            "maxSlowdownFraction",
            json!(-0.01),
        ),
    ] {
        let path = format!("spec.checks.{section}.{key}");
        out.push(one(name, field(section, key, value), path));
    }
    let pcie = |name: &str, v: i64| field("hostTransfer", "pcie", json!({name: v}));
    for (name, below, above) in [
        ("expectGen", 0, 8),
        ("expectWidth", 0, 33),
        ("maxReplays", -1, 1_000_000_001),
    ] {
        let path = format!("spec.checks.hostTransfer.pcie.{name}");
        out.push(one(format!("pcie-{name}-below"), pcie(name, below), &path));
        out.push(one(format!("pcie-{name}-above"), pcie(name, above), path));
    }
    let matrix = "spec.checks.compute.matrixSize";
    out.push(one(
        "matrix-not-multiple",
        field("compute", "matrixSize", json!(1000)),
        matrix,
    ));
    // Two mistakes at once: below the least and off the step.
    out.push(bad(
        "matrix-too-small",
        field("compute", "matrixSize", json!(128)),
        matrix,
    ));
    let dtypes = "spec.checks.compute.dtypes";
    out.push(bad(
        "no-dtypes",
        field("compute", "dtypes", json!([])),
        dtypes,
    ));
    out.push(bad(
        "five-dtypes",
        field(
            "compute",
            "dtypes",
            json!(["bf16", "fp16", "tf32", "fp32", "bf16"]),
        ),
        dtypes,
    ));
    out.push(one(
        "duplicate-dtype",
        field("compute", "dtypes", json!(["bf16", "bf16"])),
        "spec.checks.compute.dtypes[1]",
    ));
    out
}

fn durations() -> Vec<Bad> {
    let deadline = |d: &str| json!({"checks": memory(), "deadline": d});
    let burn = |d: &str| json!({"checks": {"compute": {"duration": d}}, "deadline": "720h"});
    let resample = |d: &str| field("topology", "resampleInterval", json!(d));
    let (dl, bn, rs) = (
        "spec.deadline",
        "spec.checks.compute.duration",
        "spec.checks.topology.resampleInterval",
    );
    vec![
        one("deadline-too-short", deadline("29s"), dl),
        one("deadline-too-long", deadline("720h1ms"), dl),
        one("deadline-negative", deadline("-5m"), dl),
        one("deadline-prose", deadline("5 minutes"), dl),
        one("deadline-no-unit", deadline("300"), dl),
        one("deadline-days", deadline("2d"), dl),
        one("deadline-overflows", deadline("9999999999999999h"), dl),
        one("deadline-trailing-newline", deadline("1h\n"), dl),
        bad(
            "deadline-over-32-characters",
            deadline("1m1m1m1m1m1m1m1m1m1m1m1m1m1m1m1m1m"),
            dl,
        ),
        one("burn-too-short", burn("9s"), bn),
        one("burn-too-long", burn("168h1m"), bn),
        one("burn-garbage", burn("abc"), bn),
        one("burn-capital-unit", burn("5M"), bn),
        one("resample-too-short", resample("999ms"), rs),
        one("resample-too-long", resample("1h1s"), rs),
        one("resample-zero", resample("0s"), rs),
        one(
            "pulse-period-too-short",
            field("compute", "pulse", json!({"period": "99ms"})),
            "spec.checks.compute.pulse.period",
        ),
        one(
            "pulse-too-short",
            field("compute", "pulse", json!({"duration": "9s"})),
            "spec.checks.compute.pulse.duration",
        ),
    ]
}

fn wrong_types() -> Vec<Bad> {
    vec![
        bad(
            "integer-as-string",
            field("memory", "passes", json!("2")),
            "spec.checks.memory.passes",
        ),
        bad(
            "integer-as-fraction",
            field("memory", "passes", json!(1.5)),
            "spec.checks.memory.passes",
        ),
        bad(
            "number-as-string",
            field("memory", "fraction", json!("abc")),
            "spec.checks.memory.fraction",
        ),
        bad(
            "boolean-as-string",
            field("hostTransfer", "pinned", json!("yes")),
            "spec.checks.hostTransfer.pinned",
        ),
        bad(
            "boolean-as-number",
            field("compute", "transcendentals", json!(1)),
            "spec.checks.compute.transcendentals",
        ),
        bad(
            "duration-as-number",
            json!({"checks": memory(), "deadline": 300}),
            "spec.deadline",
        ),
        bad(
            "enum-as-number",
            json!({"checks": memory(), "thresholds": {"profile": 100}}),
            "spec.thresholds.profile",
        ),
        bad(
            "list-as-string",
            field("compute", "dtypes", json!("bf16")),
            "spec.checks.compute.dtypes",
        ),
        bad(
            "list-item-as-number",
            field("compute", "dtypes", json!([16])),
            "spec.checks.compute.dtypes[0]",
        ),
        bad(
            "section-as-string",
            check("memory", json!("all")),
            "spec.checks.memory",
        ),
        bad(
            "section-as-list",
            check("topology", json!([])),
            "spec.checks.topology",
        ),
        bad(
            "checks-as-list",
            json!({"checks": ["memory"]}),
            "spec.checks",
        ),
        bad(
            "node-names-as-string",
            json!({"checks": memory(), "nodeNames": "gpu-0"}),
            "spec.nodeNames",
        ),
        bad(
            "match-labels-as-list",
            json!({"checks": memory(), "nodeSelector": {"matchLabels": ["a"]}}),
            "spec.nodeSelector.matchLabels",
        ),
        bad(
            "label-value-as-boolean",
            json!({"checks": memory(), "nodeSelector": {"matchLabels": {"a": true}}}),
            "spec.nodeSelector.matchLabels.a",
        ),
    ]
}

fn enums() -> Vec<Bad> {
    vec![
        bad(
            "unknown-dtype",
            field("compute", "dtypes", json!(["fp8"])),
            "spec.checks.compute.dtypes[0]",
        ),
        bad(
            "dtype-wrong-case",
            field("compute", "dtypes", json!(["BF16"])),
            "spec.checks.compute.dtypes[0]",
        ),
        bad(
            "unknown-memory-pattern",
            field("memory", "patterns", json!(["walkingOnes"])),
            "spec.checks.memory.patterns[0]",
        ),
        one(
            "duplicate-memory-pattern",
            field("memory", "patterns", json!(["random", "random"])),
            "spec.checks.memory.patterns[1]",
        ),
        bad(
            "unknown-profile",
            json!({"checks": memory(), "thresholds": {"profile": "B300"}}),
            "spec.thresholds.profile",
        ),
        bad(
            "unknown-node-action",
            json!({"checks": memory(), "onFailure": {"action": "Reboot"}}),
            "spec.onFailure.action",
        ),
        bad(
            "unknown-reason-code",
            json!({"checks": memory(), "severityOverrides": [{"code": "RowsRemaped", "severity": "Fail"}]}),
            "spec.severityOverrides[0].code",
        ),
        bad(
            "override-of-an-error-code",
            json!({"checks": memory(), "severityOverrides": [{"code": "MeasurementMissing", "severity": "Info"}]}),
            "spec.severityOverrides[0].code",
        ),
        bad(
            "override-to-error",
            json!({"checks": memory(), "severityOverrides": [{"code": "RowsRemapped", "severity": "Error"}]}),
            "spec.severityOverrides[0].severity",
        ),
        bad(
            "unknown-ecc-mode",
            json!({"checks": memory(), "expect": {"eccMode": "Yes"}}),
            "spec.expect.eccMode",
        ),
        one(
            "bus-id-without-function",
            json!({"checks": memory(), "expect": {"pciBusIds": ["18:00"]}}),
            "spec.expect.pciBusIds[0]",
        ),
        one(
            "gpu-count-zero",
            json!({"checks": memory(), "expect": {"gpuCount": 0}}),
            "spec.expect.gpuCount",
        ),
    ]
}

fn cross_field() -> Vec<Bad> {
    vec![
        one("no-checks-enabled", json!({"checks": {}}), "spec.checks"),
        one(
            "deadline-shorter-than-burn",
            json!({"checks": {"compute": {"duration": "10m"}}, "deadline": "5m"}),
            "spec.deadline",
        ),
        one(
            "deadline-equal-to-burn",
            json!({"checks": {"compute": {"duration": "10m"}}, "deadline": "10m"}),
            "spec.deadline",
        ),
        one(
            "default-deadline-shorter-than-burn",
            json!({"checks": {"compute": {"duration": "2h"}}}),
            "spec.deadline",
        ),
        one(
            "io-during-compute-without-compute",
            field("io", "duringCompute", json!(true)),
            "spec.checks.io.duringCompute",
        ),
        one(
            "p2p-bidirectional-below-unidirectional",
            check(
                "p2p",
                json!({"minUnidirectionalGbps": 300, "minBidirectionalGbps": 200}),
            ),
            "spec.checks.p2p.minBidirectionalGbps",
        ),
        one(
            "default-deadline-shorter-than-burn-and-pulse",
            json!({"checks": {"compute": {"duration": "40m", "pulse": {"duration": "20m"}}}}),
            "spec.deadline",
        ),
        one(
            "pulse-period-longer-than-the-pulse",
            field(
                "compute",
                "pulse",
                json!({"period": "20s", "duration": "10s"}),
            ),
            "spec.checks.compute.pulse.period",
        ),
        one(
            "host-transfer-nothing-to-measure",
            check("hostTransfer", json!({"pinned": false, "pageable": false})),
            "spec.checks.hostTransfer",
        ),
    ]
}

fn with_selector(selector: Value) -> Value {
    json!({"checks": memory(), "nodeSelector": selector})
}

fn requirement(key: &str, operator: &str, values: Option<Value>) -> Value {
    let mut r = json!({"key": key, "operator": operator});
    if let Some(v) = values {
        r["values"] = v;
    }
    with_selector(json!({"matchExpressions": [r]}))
}

fn selectors() -> Vec<Bad> {
    let labels = |l: Value| with_selector(json!({"matchLabels": l}));
    let (ml, key, values) = (
        "spec.nodeSelector.matchLabels",
        "spec.nodeSelector.matchExpressions[0].key",
        "spec.nodeSelector.matchExpressions[0].values",
    );
    let long_prefix = format!("{}.com/name", "a".repeat(250));
    let many_labels: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    let many_expressions: Vec<Value> = (0..65)
        .map(|i| json!({"key": format!("k{i}"), "operator": "Exists"}))
        .collect();
    let values_1025: Vec<String> = (0..1025).map(|i| format!("v{i}")).collect();
    let half: Vec<String> = (0..513).map(|i| format!("v{i}")).collect();
    vec![
        one(
            "label-key-with-space",
            labels(json!({"gpu type": "h100"})),
            ml,
        ),
        one("label-key-with-bang", labels(json!({"gpu!": "true"})), ml),
        one(
            "label-key-empty-prefix",
            labels(json!({"/gpu": "true"})),
            ml,
        ),
        one(
            "label-key-upper-case-prefix",
            labels(json!({"NVIDIA.com/gpu": "true"})),
            ml,
        ),
        one(
            "label-key-name-too-long",
            labels(json!({"a".repeat(64): "x"})),
            ml,
        ),
        one(
            "label-key-prefix-too-long",
            labels(json!({long_prefix.clone(): "x"})),
            ml,
        ),
        one(
            "label-value-with-space",
            labels(json!({"pool": "h 100"})),
            "spec.nodeSelector.matchLabels.pool",
        ),
        bad(
            "label-value-too-long",
            labels(json!({"pool": "v".repeat(64)})),
            "spec.nodeSelector.matchLabels.pool",
        ),
        bad("too-many-labels", labels(Value::Object(many_labels)), ml),
        one(
            "requirement-key-with-space",
            requirement("gpu type", "Exists", None),
            key,
        ),
        one(
            "requirement-key-with-bang",
            requirement("gpu!", "Exists", None),
            key,
        ),
        one(
            "requirement-key-two-slashes",
            requirement("a/b/c", "Exists", None),
            key,
        ),
        one(
            "requirement-key-prefix-too-long",
            requirement(&long_prefix, "Exists", None),
            key,
        ),
        bad(
            "requirement-key-over-317",
            requirement(&"k".repeat(318), "Exists", None),
            key,
        ),
        bad(
            "unknown-operator",
            requirement("zone", "Equals", Some(json!(["a"]))),
            "spec.nodeSelector.matchExpressions[0].operator",
        ),
        bad(
            "operator-wrong-case",
            requirement("zone", "in", Some(json!(["a"]))),
            "spec.nodeSelector.matchExpressions[0].operator",
        ),
        one("in-without-values", requirement("zone", "In", None), values),
        one(
            "in-with-empty-values",
            requirement("zone", "In", Some(json!([]))),
            values,
        ),
        one(
            "not-in-without-values",
            requirement("zone", "NotIn", None),
            values,
        ),
        one(
            "exists-with-values",
            requirement("zone", "Exists", Some(json!(["a"]))),
            values,
        ),
        one(
            "does-not-exist-with-values",
            requirement("zone", "DoesNotExist", Some(json!(["a"]))),
            values,
        ),
        one(
            "requirement-value-invalid",
            requirement("zone", "In", Some(json!(["us east"]))),
            "spec.nodeSelector.matchExpressions[0].values[0]",
        ),
        bad(
            "requirement-without-key",
            with_selector(json!({"matchExpressions": [{"operator": "Exists"}]})),
            key,
        ),
        bad(
            "requirement-without-operator",
            with_selector(json!({"matchExpressions": [{"key": "zone"}]})),
            "spec.nodeSelector.matchExpressions[0].operator",
        ),
        bad(
            "too-many-expressions",
            with_selector(json!({"matchExpressions": many_expressions})),
            "spec.nodeSelector.matchExpressions",
        ),
        bad(
            "too-many-values-in-one",
            requirement("zone", "In", Some(json!(values_1025))),
            values,
        ),
        one(
            "too-many-values-in-all",
            with_selector(json!({"matchExpressions": [
                {"key": "a", "operator": "In", "values": half},
                {"key": "b", "operator": "NotIn", "values": half},
            ]})),
            "spec.nodeSelector",
        ),
    ]
}

fn node_names() -> Vec<Bad> {
    let names = |n: Value| json!({"checks": memory(), "nodeNames": n});
    let many: Vec<String> = (0..5001).map(|i| format!("gpu-{i}")).collect();
    let long: Vec<String> = (0..1100)
        .map(|i| format!("{i:04}{}", "n".repeat(245)))
        .collect();
    vec![
        one("empty-node-name", names(json!([""])), "spec.nodeNames[0]"),
        one(
            "upper-case-node-name",
            names(json!(["Bad_Name"])),
            "spec.nodeNames[0]",
        ),
        one(
            "node-name-with-dot-dash",
            names(json!(["a.-b"])),
            "spec.nodeNames[0]",
        ),
        bad(
            "node-name-over-253",
            names(json!(["n".repeat(254)])),
            "spec.nodeNames[0]",
        ),
        one(
            "duplicate-node-names",
            names(json!(["gpu-0", "gpu-1", "gpu-0"])),
            "spec.nodeNames[2]",
        ),
        bad("too-many-node-names", names(json!(many)), "spec.nodeNames"),
        one(
            "node-names-over-256-kib",
            names(json!(long)),
            "spec.nodeNames",
        ),
    ]
}

fn nulls_and_unknown_fields() -> Vec<Bad> {
    vec![
        bad("checks-null", json!({"checks": null}), "spec.checks"),
        bad("checks-missing", json!({"deadline": "1h"}), "spec.checks"),
        one(
            "only-check-null",
            check("memory", Value::Null),
            "spec.checks",
        ),
        bad(
            "dtype-null",
            field("compute", "dtypes", json!([null])),
            "spec.checks.compute.dtypes[0]",
        ),
        bad(
            "node-name-null",
            json!({"checks": memory(), "nodeNames": [null]}),
            "spec.nodeNames[0]",
        ),
        bad(
            "requirement-null",
            with_selector(json!({"matchExpressions": [null]})),
            "spec.nodeSelector.matchExpressions[0]",
        ),
        bad(
            "requirement-value-null",
            requirement("zone", "In", Some(json!([null]))),
            "spec.nodeSelector.matchExpressions[0].values[0]",
        ),
        bad(
            "unknown-spec-field",
            json!({"checks": memory(), "paralellism": 4}),
            "spec.paralellism",
        ),
        bad(
            "unknown-check",
            json!({"checks": {"memory": {}, "gpuBurn": {}}}),
            "spec.checks.gpuBurn",
        ),
        bad(
            "unknown-check-field",
            field("memory", "fractoin", json!(0.5)),
            "spec.checks.memory.fractoin",
        ),
        bad(
            "unknown-selector-field",
            with_selector(json!({"matchFields": []})),
            "spec.nodeSelector.matchFields",
        ),
        bad(
            "unknown-requirement-field",
            with_selector(
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "value": "x"}]}),
            ),
            "spec.nodeSelector.matchExpressions[0].value",
        ),
    ]
}

/// Every spec the API server must refuse.
pub fn invalid() -> Vec<Bad> {
    let mut all = bounds();
    all.extend(durations());
    all.extend(wrong_types());
    all.extend(enums());
    all.extend(cross_field());
    all.extend(selectors());
    all.extend(node_names());
    all.extend(nulls_and_unknown_fields());
    all
}

/// Specs at the edges of what is allowed, which the API server must accept.
pub fn valid() -> Vec<(&'static str, Value)> {
    let prefix_253 = format!("{}.{}", "a".repeat(126), "b".repeat(126));
    vec![
        (
            "every-bound-at-its-least",
            json!({
                "checks": {
                    "topology": {"minActiveLinks": 0, "resampleInterval": "1s"},
                    "memory": {"fraction": 0.000001, "passes": 1, "maxMismatches": 0, "minGbps": 1, "patterns": ["address"]},
                    "compute": {"duration": "10s", "dtypes": ["bf16"], "matrixSize": 256,
                                "minTflops": {"bf16": 1, "fp16": 1, "tf32": 1, "fp32": 1},
                                "minPowerFraction": 0, "maxSlowdownFraction": 0,
                                "pulse": {"period": "100ms", "duration": "10s"}},
                    "p2p": {"bufferMib": 1, "iterations": 1, "minUnidirectionalGbps": 1, "minBidirectionalGbps": 1, "maxLatencyMicros": 1},
                    "hostTransfer": {"bufferMib": 1, "minPinnedGbps": 1, "pinned": true, "pageable": false,
                                     "pcie": {"maxReplays": 0, "maxCorrectableErrors": 0, "maxUncorrectableErrors": 0, "expectGen": 1, "expectWidth": 1}},
                    "io": {"fileSizeMib": 1, "files": 1, "concurrency": 1, "minWriteMbps": 1, "minReadMbps": 1},
                },
                "thresholds": {"relativeTolerancePercent": 1},
                "deadline": "30s",
            }),
        ),
        (
            "every-bound-at-its-most",
            json!({
                "checks": {
                    "topology": {"minActiveLinks": 64, "resampleInterval": "1h"},
                    "memory": {"fraction": 1, "passes": 1000, "maxMismatches": 9_007_199_254_740_991_i64, "minGbps": 100_000,
                               "patterns": ["address", "movingInversions", "random"]},
                    "compute": {"duration": "168h", "dtypes": ["bf16", "fp16", "tf32", "fp32"], "matrixSize": 32768,
                                "minTflops": {"bf16": 100_000, "fp16": 100_000, "tf32": 100_000, "fp32": 100_000},
                                "minPowerFraction": 1, "maxSlowdownFraction": 1,
                                "pulse": {"period": "60s", "duration": "168h"}},
                    "p2p": {"bufferMib": 16384, "iterations": 10000, "minUnidirectionalGbps": 100_000, "minBidirectionalGbps": 100_000, "maxLatencyMicros": 1_000_000},
                    "hostTransfer": {"bufferMib": 65536, "minPinnedGbps": 10000,
                                     "pcie": {"maxReplays": 1_000_000_000, "maxCorrectableErrors": 1_000_000_000, "maxUncorrectableErrors": 1_000_000_000, "expectGen": 7, "expectWidth": 32}},
                    "io": {"fileSizeMib": 1_048_576, "files": 10000, "concurrency": 256, "minWriteMbps": 1_000_000, "minReadMbps": 1_000_000, "duringCompute": true},
                },
                "thresholds": {"relativeTolerancePercent": 90},
                "deadline": "720h",
            }),
        ),
        (
            "burn-just-inside-the-default-deadline",
            json!({"checks": {"compute": {"duration": "59m59s"}}}),
        ),
        (
            "deadline-just-past-the-burn",
            json!({"checks": {"compute": {"duration": "10m"}}, "deadline": "10m1ms"}),
        ),
        (
            "durations-in-every-unit",
            json!({
                "checks": {"compute": {"duration": "0.5h"}, "topology": {"resampleInterval": "1500ms"}},
                "deadline": "1h30m15s250ms",
            }),
        ),
        (
            "duration-of-32-characters",
            json!({"checks": memory(), "deadline": "1m1m1m1m1m1m1m1m1m1m1m1m1m1m1m1m"}),
        ),
        (
            "whole-numbers-written-as-fractions",
            field("memory", "passes", json!(2.0)),
        ),
        (
            "nulls-read-as-absent",
            json!({
                "checks": {"memory": {"fraction": null, "minGbps": null}, "compute": null},
                "deadline": null, "thresholds": null, "nodeSelector": null,
            }),
        ),
        (
            "longest-node-name",
            json!({"checks": memory(), "nodeNames": ["n".repeat(253), "gpu-0"]}),
        ),
        (
            "longest-label-key-and-empty-value",
            with_selector(json!({"matchLabels": {
                format!("{prefix_253}/{}", "n".repeat(63)): "",
                "nvidia.com/gpu.present": "true",
            }})),
        ),
        (
            "every-operator",
            with_selector(json!({"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a", "b"]},
                {"key": "pool", "operator": "NotIn", "values": ["cpu"]},
                {"key": "nvidia.com/gpu.present", "operator": "Exists"},
                {"key": "gpuval.io/failed", "operator": "DoesNotExist", "values": []},
            ]})),
        ),
        (
            "label-value-of-63-characters",
            with_selector(json!({"matchLabels": {"pool": "p".repeat(63)}})),
        ),
    ]
}
