//! The news path against the whole view: random runs (a seeded generator: pods that start,
//! finish, fail, vanish; results of every verdict, some late from an earlier generation; nodes
//! deleted; time that passes the result grace and the deadline) driven three ways side by
//! side: by [`next_on_news`] with the nodes touched since the last step, by [`next`] with
//! everything and the kept record, and by [`next`] with everything and no record (a restart
//! before every step). Every step must decide the same.

use std::collections::{BTreeMap, BTreeSet};

use gpuval_crds::{GpuValidation, NodeVerdict, Verdict};
use k8s_openapi::jiff::Timestamp;

use super::{News, PodPhase, PodView, ResultView, RunNodes, Step, World, next, next_on_news};
use crate::decide::selection::Selection;

/// SplitMix64: small, seeded, and good enough to shuffle events.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

const GENERATION: i64 = 2;
const DEADLINE_SECS: i64 = 600;

/// The cluster as the API server holds it, and the nodes touched since the last step. An
/// agent stores its result once a generation (a result rewritten with another verdict after
/// its node's line is final is not followed, and a restart that recovers the run would).
struct Cluster {
    nodes: BTreeSet<String>,
    pods: BTreeMap<String, PodView>,
    results: BTreeMap<String, ResultView>,
    touched: BTreeSet<String>,
    secs: i64,
}

impl Cluster {
    fn new(n: usize, rng: &mut Rng) -> Self {
        let mut c = Cluster {
            nodes: (0..n).map(|i| format!("gpu-{i:02}")).collect(),
            pods: BTreeMap::new(),
            results: BTreeMap::new(),
            touched: BTreeSet::new(),
            secs: 0,
        };
        // What the previous generation left behind.
        for node in c.nodes.clone() {
            if rng.chance(20) {
                c.put_pod(&node, 1, PodPhase::Running);
            }
            if rng.chance(20) {
                c.put_result(&node, 1, Verdict::Pass, "");
            }
        }
        c.touched.clear();
        c
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_second(1_790_000_000 + self.secs).unwrap()
    }

    fn everything(&self) -> World {
        World {
            nodes: self.nodes.clone(),
            pods: self.pods.values().cloned().collect(),
            results: self.results.values().cloned().collect(),
            rounds: Vec::new(),
            fabric_port: 0,
            pending_limit: None,
        }
    }

    /// The news since the last step, as the shell gathers it.
    fn news(&mut self) -> News {
        let nodes = std::mem::take(&mut self.touched);
        let about = |node: &String| nodes.contains(node);
        let world = World {
            nodes: self.nodes.iter().filter(|n| about(n)).cloned().collect(),
            pods: self
                .pods
                .values()
                .filter(|p| about(&p.node))
                .cloned()
                .collect(),
            results: self
                .results
                .values()
                .filter(|r| about(&r.node))
                .cloned()
                .collect(),
            rounds: Vec::new(),
            fabric_port: 0,
            pending_limit: None,
        };
        News { nodes, world }
    }

    fn selection(&self) -> Selection {
        Selection::of_nodes(self.nodes.iter().cloned(), 8)
    }

    fn put_pod(&mut self, node: &str, generation: i64, phase: PodPhase) {
        let name = format!("pod-{node}-g{generation}");
        self.pods.insert(
            name.clone(),
            PodView {
                name,
                node: node.into(),
                generation,
                phase,
                ..Default::default()
            },
        );
        self.touched.insert(node.into());
    }

    fn put_result(&mut self, node: &str, generation: i64, verdict: Verdict, summary: &str) {
        let name = format!("v-{node}");
        let r = ResultView {
            name: name.clone(),
            node: node.into(),
            generation,
            verdict,
            summary: summary.into(),
            fabric: Vec::new(),
            ports: None,
            facts: Default::default(),
        };
        self.results.insert(name, r);
        self.touched.insert(node.into());
    }

    /// Carries out what a step asked for.
    fn apply(&mut self, step: &Step) {
        for (node, _) in &step.create_pods {
            self.put_pod(node, GENERATION, PodPhase::Pending);
        }
        for name in &step.delete_pods {
            if let Some(p) = self.pods.remove(name) {
                self.touched.insert(p.node);
            }
        }
        for name in &step.delete_results {
            if let Some(r) = self.results.remove(name) {
                self.touched.insert(r.node);
            }
        }
    }

    /// Something happens to a random node's pod, result or Node, or time passes.
    fn event(&mut self, rng: &mut Rng) {
        let nodes: Vec<String> = self.nodes.iter().cloned().collect();
        if nodes.is_empty() {
            self.secs += 5;
            return;
        }
        let node = nodes[rng.below(nodes.len())].clone();
        let pod_name = format!("pod-{node}-g{GENERATION}");
        let now = self.now();
        // An agent stores its node's result once a generation.
        let reported = self.results.contains_key(&format!("v-{node}"));
        match rng.below(100) {
            0..=29 => self.advance_pod(&pod_name, rng, now),
            30..=54 if !reported => {
                let (verdict, summary) = match rng.below(6) {
                    0 => (
                        Verdict::Fail,
                        format!("GPU{} memory: 2 words", rng.below(8)),
                    ),
                    1 => (Verdict::Error, "compute: the kernel did not start".into()),
                    2 => (Verdict::Warn, "GPU1 throttled: 3 times".into()),
                    _ => (Verdict::Pass, String::new()),
                };
                self.put_result(&node, GENERATION, verdict, &summary);
            }
            55..=56 if !reported => {
                self.put_result(&node, 1, Verdict::Fail, "late from the last run")
            }
            57..=58 => {
                self.nodes.remove(&node);
                self.touched.insert(node);
            }
            59..=60 => self.secs += 35,
            61 => self.secs += DEADLINE_SECS / 2,
            _ => self.secs += rng.below(6) as i64,
        }
    }

    fn advance_pod(&mut self, name: &str, rng: &mut Rng, now: Timestamp) {
        let Some(p) = self.pods.get_mut(name) else {
            return;
        };
        self.touched.insert(p.node.clone());
        match rng.below(10) {
            0..=3 => p.phase = PodPhase::Running,
            4..=5 => {
                p.phase = PodPhase::Succeeded;
                p.finished_at = Some(now);
            }
            6 => {
                p.phase = PodPhase::Failed;
                p.reason = Some("OOMKilled (exit code 137)".into());
            }
            7 => {
                p.phase = PodPhase::Pending;
                p.reason = Some("Unschedulable: 0/9 nodes are available".into());
            }
            8 => p.deleting = true,
            _ => {
                self.pods.remove(name);
            }
        }
    }
}

/// One way of driving the steps: its validation (with the status fed back) and its record.
struct Driver {
    gv: GpuValidation,
    record: Option<RunNodes>,
}

impl Driver {
    fn new() -> Self {
        let spec = serde_json::from_value(serde_json::json!({
            "checks": {"memory": {}},
            "deadline": format!("{DEADLINE_SECS}s"),
        }))
        .unwrap();
        let mut gv = GpuValidation::new("acceptance", spec);
        gv.metadata.generation = Some(GENERATION);
        Driver { gv, record: None }
    }

    fn keep(&mut self, mut step: Step) -> Step {
        self.record = step.record.take();
        self.gv.status = Some(step.status.clone());
        step
    }
}

/// What two steps must agree on (`verdicts`: also the new verdicts, which a recovered run
/// counts again for the nodes that passed).
fn assert_same(a: &Step, b: &Step, verdicts: bool, what: &str) {
    assert_eq!(a.status, b.status, "{what}: status");
    assert_eq!(a.create_pods, b.create_pods, "{what}: pods to create");
    assert_eq!(a.delete_pods, b.delete_pods, "{what}: pods to delete");
    assert_eq!(
        a.delete_results, b.delete_results,
        "{what}: results to delete"
    );
    assert_eq!(a.events, b.events, "{what}: events");
    assert_eq!(a.newly_failed, b.newly_failed, "{what}: failed nodes");
    assert_eq!(a.requeue_after, b.requeue_after, "{what}: requeue");
    if verdicts {
        assert_eq!(a.new_verdicts, b.new_verdicts, "{what}: new verdicts");
        assert_eq!(a.close_results, b.close_results, "{what}: results to close");
    }
}

/// A line as a recovered record must have it (a recovered node the selection no longer
/// selects has 0 GPUs), and the nodes whose result is awaited.
type Sketch = (
    Vec<(String, NodeVerdict, Option<String>, Option<String>)>,
    Vec<usize>,
);

fn sketch(r: &RunNodes) -> Sketch {
    let lines = r
        .lines()
        .iter()
        .map(|l| {
            (
                l.name.clone(),
                l.verdict,
                l.message.clone(),
                l.result.clone(),
            )
        })
        .collect();
    (lines, r.awaiting())
}

/// Runs one random run; returns how many steps it took and whether it ended.
fn one_run(seed: u64) -> (usize, bool) {
    let mut rng = Rng(seed);
    let n = 1 + rng.below(40);
    let mut cluster = Cluster::new(n, &mut rng);
    let (mut news, mut whole, mut restarted) = (Driver::new(), Driver::new(), Driver::new());
    for i in 0..300 {
        let now = cluster.now();
        let world = cluster.everything();
        let sel = cluster.selection();
        let heard = cluster.news();
        let a = next_on_news(
            &news.gv,
            &heard,
            now,
            news.record.take(),
            || world.clone(),
            || sel.clone(),
        );
        let b = next(&whole.gv, &world, now, whole.record.take(), || sel.clone());
        let c = next(&restarted.gv, &world, now, None, || sel.clone());
        let what = format!("seed {seed}, step {i}");
        assert_same(&a, &b, true, &format!("{what}, news against everything"));
        assert_same(&a, &c, false, &format!("{what}, news against a restart"));
        assert_eq!(a.record, b.record, "{what}: record");
        assert_eq!(
            a.record.as_ref().map(sketch),
            c.record.as_ref().map(sketch),
            "{what}: recovered record"
        );
        let a = news.keep(a);
        whole.keep(b);
        restarted.keep(c);
        cluster.apply(&a);
        if a.status.phase.is_some_and(gpuval_crds::Phase::is_terminal) {
            return (i + 1, true);
        }
        for _ in 0..=rng.below(3) {
            cluster.event(&mut rng);
        }
    }
    (300, false)
}

#[test]
fn the_news_decide_as_everything_does_in_random_runs() {
    let mut ended = 0;
    let mut steps = 0;
    for seed in 0..200 {
        let (s, done) = one_run(seed);
        steps += s;
        ended += usize::from(done);
    }
    assert!(ended > 170, "most runs end ({ended} of 200)");
    assert!(steps > 2_000, "the runs took {steps} steps in all");
}
