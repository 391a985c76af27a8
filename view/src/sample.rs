//! A small two-GPU report for the unit tests: GPU1 failed its memory check.

use gpuval_crds::*;

fn mismatch(m: &str) -> Reason {
    Reason::new(Code::MemoryMismatch, m)
}

/// One H200 of the sample: `gbps` memory throughput, `verdict` and `reasons` on its memory check.
fn gpu(index: i32, gbps: f64, verdict: Verdict, reasons: Vec<Reason>) -> GpuReport {
    GpuReport {
        index,
        uuid: format!("GPU-{index}"),
        name: "NVIDIA H200".into(),
        memory_total_mib: 143_771,
        verdict,
        reasons: reasons.clone(),
        memory: Some(MemoryResult {
            verdict,
            reasons,
            gbps,
            mismatches: i64::from(verdict == Verdict::Fail) * 2,
            ..Default::default()
        }),
        compute: Some(ComputeResult {
            gemms: vec![GemmResult {
                dtype: Dtype::Bf16,
                tflops: 680.0,
                iterations: 10,
                mismatches: 0,
                max_rel_error: 0.0,
                seconds: 60.0,
            }],
            ..Default::default()
        }),
        host_transfer: Some(HostTransferResult {
            pinned: Some(TransferRates {
                h2d_gbps: 55.0,
                d2h_gbps: 54.0,
            }),
            ..Default::default()
        }),
        telemetry: Some(TelemetrySummary {
            samples: 30,
            temperature_c: Some(Stat {
                min: 30.0,
                mean: 45.0,
                max: 61.0,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn report() -> NodeReport {
    let pair = |src, dst| P2pPair {
        src,
        dst,
        verdict: Verdict::Pass,
        peer_access: true,
        unidirectional_gbps: 390.0,
        bidirectional_gbps: 780.0,
        copy_latency_micros: 2.5,
        ..Default::default()
    };
    let row = |bytes: i64, busbw| NcclRow {
        bytes,
        count: bytes / 2,
        time_micros: 10.0,
        algbw_gbps: busbw,
        busbw_gbps: busbw,
        ..Default::default()
    };
    NodeReport {
        simulated: true,
        backend: "simulated".into(),
        agent_version: "0.1.0".into(),
        node: Some("gpu-a".into()),
        started_at: "2026-11-23T08:00:00Z".into(),
        finished_at: "2026-11-23T08:05:00Z".into(),
        verdict: Verdict::Fail,
        failures: vec![mismatch("GPU1 memory: 2 mismatched words")],
        gpus: vec![
            gpu(0, 4300.0, Verdict::Pass, vec![]),
            gpu(
                1,
                4100.0,
                Verdict::Fail,
                vec![mismatch("memory: 2 mismatched words")],
            ),
        ],
        p2p: Some(P2pResult {
            pairs: vec![pair(0, 1), pair(1, 0)],
            ..Default::default()
        }),
        nccl: Some(NcclResult {
            gpus: vec![0, 1],
            sweep: Some(NcclSweep {
                curves: vec![NcclCurve {
                    collective: Collective::AllReduce,
                    rows: vec![row(8, 0.001), row(1 << 20, 90.0), row(1 << 30, 300.0)],
                }],
                ..Default::default()
            }),
            ..Default::default()
        }),
        training: training(),
        ..Default::default()
    }
}

/// Its training figures: two GPUs, replicas identical.
fn training() -> Option<training::TrainingResult> {
    Some(training::TrainingResult {
        gpus: vec![0, 1],
        steps: 30,
        figures: Some(training::TrainingFigures {
            step_millis: 412.0,
            samples_per_second_per_gpu: 19.4,
            samples_per_second: 38.8,
            exposed_comm_fraction: 0.04,
            scaling_efficiency: 0.97,
            tflops_per_gpu: 610.0,
            ..Default::default()
        }),
        replicas: training::TrainingReplicas {
            comparisons: 4,
            identical: true,
            ..Default::default()
        },
        ..Default::default()
    })
}
