//! The one list of what every check gives each view of a run: its part of the HTML page and of
//! the Markdown page, its key figures (drawn from the report by its entry's functions, which
//! [`node_figures`] reads; compared by `kubectl gpuval diff`, listed by
//! `kubectl gpuval report -o json`, exported by the operator as metrics, in the families named
//! here) and its entry in docs/checks-and-reasons.md. The list has one entry per section of
//! `spec.checks` ([`CHECK_SECTIONS`]): a new check does not compile until it has one, and the
//! tests below (and the operator's metrics tests) fail until each view shows it.

use gpuval_crds::rules::CHECK_SECTIONS;

use gpuval_crds::{GpuReport, NodeReport};

use crate::figures::{self, Kind};

/// What one check gives each view.
#[derive(Debug, Clone, Copy)]
pub struct CheckViews {
    /// Its section in `spec.checks`.
    pub section: &'static str,
    /// Text its part of the HTML page holds whenever the report has its result.
    pub html: &'static str,
    /// Text its part of the Markdown page holds whenever the report has its result.
    pub markdown: &'static str,
    /// Its key figures; empty only with `no_figures_because`.
    pub figures: &'static [Kind],
    /// The operator's metric families (without `gpuval_`) those figures are exported in.
    pub metric_families: &'static [&'static str],
    /// Its key figures in one GPU's report (a per-GPU check).
    pub gpu_figures: Option<fn(&GpuReport) -> Vec<figures::GpuFigure>>,
    /// Its key figures in the node's report (a node-wide check).
    pub node_figures: Option<fn(&NodeReport) -> Vec<figures::Figure>>,
    /// Why it has no key figure (its result is a yes or no, or not a rate).
    pub no_figures_because: Option<&'static str>,
    /// Its entry's opening in docs/checks-and-reasons.md.
    pub doc: &'static str,
}

/// Every check, in [`CHECK_SECTIONS`] order.
pub const CHECK_VIEWS: [CheckViews; CHECK_SECTIONS.len()] = [
    CheckViews {
        section: "topology",
        html: "<h3>Topology",
        markdown: "Topology: ",
        figures: &[],
        metric_families: &[],
        gpu_figures: None,
        node_figures: None,
        no_figures_because: Some("a matrix of link kinds, not a rate"),
        doc: "- **topology**",
    },
    CheckViews {
        section: "memory",
        html: "<th>memory GB/s",
        markdown: "memory GB/s",
        figures: &[Kind::MemoryGbps],
        metric_families: &["gpu_memory_gbps"],
        gpu_figures: Some(figures::memory),
        node_figures: None,
        no_figures_because: None,
        doc: "- **memory**",
    },
    CheckViews {
        section: "compute",
        html: "TFLOP/s",
        markdown: "TFLOP/s",
        figures: &[Kind::Tflops],
        metric_families: &["gpu_tflops"],
        gpu_figures: Some(figures::compute),
        node_figures: None,
        no_figures_because: None,
        doc: "- **compute**",
    },
    CheckViews {
        section: "p2p",
        html: "<h3>Peer to peer",
        markdown: "p2p over ",
        figures: &[Kind::P2pGbps],
        metric_families: &["p2p_gbps"],
        gpu_figures: None,
        node_figures: Some(figures::p2p),
        no_figures_because: None,
        doc: "- **p2p**",
    },
    CheckViews {
        section: "hostTransfer",
        html: "<h3>Host links",
        markdown: "host pinned GB/s",
        figures: &[Kind::HostGbps],
        metric_families: &["gpu_host_gbps"],
        gpu_figures: Some(figures::host),
        node_figures: None,
        no_figures_because: None,
        doc: "- **hostTransfer**",
    },
    CheckViews {
        section: "io",
        html: "<h3>File I/O",
        markdown: "File I/O: ",
        figures: &[],
        metric_families: &[],
        gpu_figures: None,
        node_figures: None,
        no_figures_because: Some(
            "a disk's throughput, judged against the spec's floor, says nothing of the GPUs",
        ),
        doc: "- **io**",
    },
    CheckViews {
        section: "nccl",
        html: "NCCL bus bandwidth against message size",
        markdown: "bus bandwidth at the largest size",
        figures: &[Kind::NcclBusbwGbps],
        metric_families: &["node_nccl_busbw_gbps"],
        gpu_figures: None,
        node_figures: Some(figures::nccl),
        no_figures_because: None,
        doc: "- **nccl**",
    },
    CheckViews {
        section: "training",
        html: "<h3>Training step",
        markdown: "Training step: ",
        figures: &[Kind::TrainingSamplesPerSecond],
        metric_families: &["node_training_samples_per_second"],
        gpu_figures: None,
        node_figures: Some(figures::training),
        no_figures_because: None,
        doc: "- **training**",
    },
];

/// Every key figure of `report`, GPUs in report order, then pairs, then the node's: each
/// check's, as its entry in [`CHECK_VIEWS`] extracts them.
pub fn node_figures(report: &NodeReport) -> Vec<figures::Figure> {
    let views = &CHECK_VIEWS;
    let mut out = Vec::new();
    for g in &report.gpus {
        let scope = figures::Scope::Gpu {
            index: g.index,
            uuid: g.uuid.clone(),
            model: g.name.clone(),
        };
        let of_gpu = views
            .iter()
            .filter_map(|c| c.gpu_figures)
            .flat_map(|f| f(g));
        out.extend(of_gpu.map(|(kind, qualifier, value)| figures::Figure {
            scope: scope.clone(),
            kind,
            qualifier: qualifier.into(),
            value,
        }));
    }
    for f in views.iter().filter_map(|c| c.node_figures) {
        out.extend(f(report));
    }
    out
}

#[cfg(test)]
mod tests {
    use gpuval_crds::{IoResult, NodeReport, TopologyReport, Verdict};

    use super::*;
    use crate::Document;

    /// The sample report with every check's result.
    fn every_check() -> NodeReport {
        let mut r = crate::sample::report();
        r.topology = Some(TopologyReport {
            verdict: Verdict::Pass,
            gpus: vec!["GPU0".into(), "GPU1".into()],
            matrix: vec![
                vec!["X".into(), "NV18".into()],
                vec!["NV18".into(), "X".into()],
            ],
            ..Default::default()
        });
        r.io = Some(IoResult {
            verdict: Verdict::Pass,
            dir: "/data".into(),
            files: 4,
            file_size_mib: 256,
            bytes: 1 << 30,
            write_mbps: 2100.0,
            read_mbps: 3400.0,
            ..Default::default()
        });
        r
    }

    #[test]
    fn the_list_follows_the_api_s_check_sections() {
        let listed: Vec<&str> = CHECK_VIEWS.iter().map(|c| c.section).collect();
        assert_eq!(listed, CHECK_SECTIONS);
        for c in CHECK_VIEWS {
            assert_eq!(
                c.figures.is_empty(),
                c.no_figures_because.is_some(),
                "{}: key figures, or a reason why none",
                c.section
            );
            assert_eq!(
                c.figures.is_empty(),
                c.metric_families.is_empty(),
                "{}",
                c.section
            );
        }
    }

    #[test]
    fn every_check_shows_in_the_html_and_markdown_pages() {
        let doc = Document::single("report.json", every_check());
        let page = crate::html::html(&doc);
        let md = crate::markdown::markdown(&doc);
        for c in CHECK_VIEWS {
            assert!(
                page.contains(c.html),
                "{}: the HTML page lacks {:?}",
                c.section,
                c.html
            );
            assert!(
                md.contains(c.markdown),
                "{}: Markdown lacks {:?}\n{md}",
                c.section,
                c.markdown
            );
        }
    }

    #[test]
    fn a_node_wide_check_s_part_goes_with_its_result() {
        let without = |strip: fn(&mut NodeReport)| {
            let mut r = every_check();
            strip(&mut r);
            let doc = Document::single("report.json", r);
            (crate::html::html(&doc), crate::markdown::markdown(&doc))
        };
        type Strip = fn(&mut NodeReport);
        let cases: [(&str, Strip); 5] = [
            ("topology", |r| r.topology = None),
            ("p2p", |r| r.p2p = None),
            ("io", |r| r.io = None),
            ("nccl", |r| r.nccl = None),
            ("training", |r| r.training = None),
        ];
        for (section, strip) in cases {
            let c = CHECK_VIEWS
                .iter()
                .find(|c| c.section == section)
                .expect("listed");
            let (page, md) = without(strip);
            assert!(
                !page.contains(c.html),
                "{section}: {:?} without its result",
                c.html
            );
            assert!(
                !md.contains(c.markdown),
                "{section}: {:?} without its result",
                c.markdown
            );
        }
    }

    #[test]
    fn every_check_gives_its_key_figures_and_only_those() {
        let r = every_check();
        let figures = node_figures(&r);
        for c in CHECK_VIEWS {
            for kind in c.figures {
                assert!(
                    figures.iter().any(|f| f.kind == *kind),
                    "{}: no {kind:?} figure",
                    c.section
                );
            }
            let own = r
                .gpus
                .iter()
                .flat_map(|g| c.gpu_figures.map(|f| f(g)).unwrap_or_default());
            let own: Vec<Kind> = own
                .map(|(k, _, _)| k)
                .chain(c.node_figures.iter().flat_map(|f| f(&r)).map(|f| f.kind))
                .collect();
            assert_eq!(own.is_empty(), c.figures.is_empty(), "{}", c.section);
            assert!(
                own.iter().all(|k| c.figures.contains(k)),
                "{}: {own:?} beyond {:?}",
                c.section,
                c.figures
            );
        }
    }

    #[test]
    fn every_check_has_its_entry_in_the_checks_document() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/checks-and-reasons.md");
        let text = std::fs::read_to_string(path).expect("docs/checks-and-reasons.md");
        for c in CHECK_VIEWS {
            assert!(
                text.contains(c.doc),
                "{}: docs/checks-and-reasons.md lacks {:?}",
                c.section,
                c.doc
            );
        }
    }
}
