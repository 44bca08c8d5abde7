//! `gpumem_tag_*{tag}`: live memory by allocation tag, in-process and for every collected
//! process. Only the largest few tags of each device carry their own name (the snapshot and the
//! collector fold the rest into `other`, `--top-tags` sets how many), so the label stays bounded.

use super::{def, sample, Def, Families, GAUGE};
use gpumem_wire::{ProcessTag, Snapshot, TagGroup};
use prometheus::proto::Metric;

const TAG: &[&str] = &["gpu", "uuid", "tag"];

type GroupValue = fn(&TagGroup) -> f64;
type PublishedValue = fn(&ProcessTag) -> Option<f64>;

/// Each family, with its value in-process and in a published file.
pub(super) const TAG_METRICS: &[(Def, GroupValue, PublishedValue)] = &[
    (
        def("gpumem_tag_live_bytes", GAUGE, TAG, "Requested bytes of the live allocations with this tag (the largest tags by bytes, the rest summed as tag=\"other\")."),
        |g| g.bytes as f64,
        |t| t.live_bytes.map(|v| v as f64),
    ),
    (
        def("gpumem_tag_live_allocations", GAUGE, TAG, "Live allocations with this tag (the largest tags by bytes, the rest summed as tag=\"other\")."),
        |g| g.count as f64,
        |t| t.live_allocations.map(|v| v as f64),
    ),
    (
        def("gpumem_tag_leak_suspect_bytes", GAUGE, TAG, "Requested bytes of this tag's leak suspects: live allocations older than the leak age, tag not long-lived."),
        |g| g.leak_suspect_bytes as f64,
        |t| t.leak_suspect_bytes.map(|v| v as f64),
    ),
    (
        def("gpumem_tag_leak_suspect_allocations", GAUGE, TAG, "Leak suspects with this tag: live allocations older than the leak age, tag not long-lived."),
        |g| g.leak_suspect_count as f64,
        |t| t.leak_suspect_allocations.map(|v| v as f64),
    ),
];

/// The tag families of this snapshot: its own devices' tags, then each collected process's.
pub(super) fn add_families(snapshot: &Snapshot, out: &mut Families) {
    for (def, own, published) in TAG_METRICS {
        let mut samples: Vec<Metric> = Vec::new();
        for device in &snapshot.devices {
            let gpu = device.index.to_string();
            for group in &device.by_tag {
                let labels = [
                    ("gpu", gpu.as_str()),
                    ("uuid", device.uuid.as_str()),
                    ("tag", group.tag.as_str()),
                ];
                samples.push(sample(GAUGE, &labels, own(group)));
            }
        }
        samples.extend(super::collected::process_tag_samples(
            snapshot.collected(),
            *published,
        ));
        out.add(def, samples);
    }
}
