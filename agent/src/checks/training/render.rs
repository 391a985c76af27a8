//! The check's table section and headline part.

use gpuval_crds::TrainingResult;

/// The table section: the shape, the step figures, the replicas' comparison.
pub fn section(r: &TrainingResult) -> String {
    let s = &r.shape;
    let mut out = format!(
        "\nTRAINING ({:?}) {} GPU(s), {} blocks of hidden {} ×{} ({:.2} G parameters), {} × {} tokens per GPU, {} bucket(s) of ≤{} MiB, {} timed steps\n",
        r.verdict,
        r.gpus.len(),
        s.layers,
        s.hidden_size,
        s.ffn_multiplier,
        s.parameters as f64 / 1e9,
        s.batch_size,
        s.sequence_length,
        s.buckets,
        s.bucket_mib,
        r.steps
    );
    if let Some(f) = &r.figures {
        out.push_str(&format!(
            "  step {:.1} ms (p99 {:.1}), compute only {:.1} ms, one GPU alone {:.1} ms\n",
            f.step_millis, f.step_millis_p99, f.compute_only_step_millis, f.single_gpu_step_millis
        ));
        out.push_str(&format!(
            "  {:.1} samples/s per GPU, {:.1} for the node; exposed communication {:.1} ms ({:.1}%); scaling efficiency {:.3}; {:.0} TFLOP/s per GPU\n",
            f.samples_per_second_per_gpu,
            f.samples_per_second,
            f.exposed_comm_millis,
            f.exposed_comm_fraction * 100.0,
            f.scaling_efficiency,
            f.tflops_per_gpu
        ));
    }
    let rep = &r.replicas;
    out.push_str(&match &rep.divergence {
        Some(d) => format!(
            "  replicas DIVERGED at step {}: GPU {}\n",
            d.step,
            d.gpus
                .iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => format!(
            "  replicas bitwise identical at {} comparison(s)\n",
            rep.comparisons
        ),
    });
    for why in &r.reasons {
        out.push_str(&format!("  ! {why}\n"));
    }
    for note in &r.notes {
        out.push_str(&format!("  note: {note}\n"));
    }
    out
}

/// The headline's part: `training 41.2 samples/s/GPU, scaling 0.97`.
pub fn headline(r: &TrainingResult) -> Option<String> {
    let f = r.figures.as_ref()?;
    Some(format!(
        "training {:.1} samples/s/GPU, scaling {:.2}",
        f.samples_per_second_per_gpu, f.scaling_efficiency
    ))
}
