//! NVLink error counters read before and after the peer-to-peer check, summed per GPU.

use crate::backend::LinkErrors;
use crate::judge::plural;

/// A link whose replay and CRC counters together rise by more than this during the check is
/// worth a look. Healthy H200 links showed CRC-data counts of up to about 70 per link over this
/// check's traffic (corrected by the link layer, no replays), so this is well above noise.
pub const LINK_ERROR_WARN: u64 = 1000;

/// What the NVLink error counters did during the check.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinkErrorMoves {
    /// One line per GPU whose counters moved (`GPU0: CRC data +378 (18 links, at most +51 on
    /// link 11)`), for the report.
    pub notes: Vec<String>,
    /// Links far above the noise: a Warn.
    pub warnings: Vec<String>,
    /// Recovery events (a link retrained): a Fail.
    pub failures: Vec<String>,
}

impl LinkErrorMoves {
    /// Adds one GPU's readings before and after the check.
    pub fn add(&mut self, gpu: u32, before: &[LinkErrors], after: &[LinkErrors]) {
        let names = ["replay", "recovery", "CRC flit", "CRC data"];
        let mut totals = [0u64; 4];
        let mut worst = [(0u64, 0u32); 4];
        let mut links = 0;
        for a in after {
            let b = before
                .iter()
                .find(|b| b.link == a.link)
                .copied()
                .unwrap_or(LinkErrors {
                    link: a.link,
                    ..Default::default()
                });
            let d = [
                a.replay.saturating_sub(b.replay),
                a.recovery.saturating_sub(b.recovery),
                a.crc_flit.saturating_sub(b.crc_flit),
                a.crc_data.saturating_sub(b.crc_data),
            ];
            if d.iter().all(|v| *v == 0) {
                continue;
            }
            links += 1;
            for k in 0..4 {
                totals[k] += d[k];
                if d[k] > worst[k].0 {
                    worst[k] = (d[k], a.link);
                }
            }
            if d[1] > 0 {
                self.failures.push(format!(
                    "GPU{gpu} NVLink {}: {} recovery event{} during the check (the link retrained)",
                    a.link,
                    d[1],
                    plural(d[1])
                ));
            }
            let noisy = d[0] + d[2] + d[3];
            if noisy > LINK_ERROR_WARN {
                self.warnings.push(format!(
                    "GPU{gpu} NVLink {}: {noisy} replay/CRC errors during the check (> {LINK_ERROR_WARN})",
                    a.link
                ));
            }
        }
        if links == 0 {
            return;
        }
        let parts: Vec<String> = (0..4)
            .filter(|k| totals[*k] > 0)
            .map(|k| {
                format!(
                    "{} +{} (at most +{} on link {})",
                    names[k], totals[k], worst[k].0, worst[k].1
                )
            })
            .collect();
        self.notes.push(format!(
            "GPU{gpu}: {} over {links} link{}",
            parts.join(", "),
            plural(links)
        ));
    }
}
