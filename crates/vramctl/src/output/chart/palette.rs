//! Colours. Processes get a colour from their label, so the same process keeps its colour
//! across panels and across charts; red and grey are kept out of the palette because they
//! mean "leak" and "idle / other".

use plotters::style::RGBColor;

/// Device used memory: dark navy, drawn bold over a light fill.
pub(crate) const DEVICE: RGBColor = RGBColor(0x1d, 0x35, 0x57);
/// A second device series in one panel (unusual): slate.
pub(crate) const DEVICE_ALT: RGBColor = RGBColor(0x47, 0x55, 0x69);
/// The total-memory ceiling.
pub(crate) const CEILING: RGBColor = RGBColor(0x37, 0x41, 0x51);
/// Leak onset marks.
pub(crate) const LEAK: RGBColor = RGBColor(0xd6, 0x27, 0x28);
/// Idle bands.
pub(crate) const IDLE: RGBColor = RGBColor(0x9c, 0xa3, 0xaf);
/// Gap bands and their hatching.
pub(crate) const GAP: RGBColor = RGBColor(0xb8, 0xbe, 0xc8);
/// Processes beyond the legend.
pub(crate) const OTHER: RGBColor = RGBColor(0xa8, 0xae, 0xb8);
/// Axis labels and secondary text.
pub(crate) const MUTED: RGBColor = RGBColor(0x4b, 0x55, 0x63);
/// Titles.
pub(crate) const INK: RGBColor = RGBColor(0x11, 0x18, 0x27);

/// Distinct on white and from each other, after the Tableau 10 and D3 category palettes
/// without their red and grey.
const PROCESS: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4), // blue
    RGBColor(0xff, 0x7f, 0x0e), // orange
    RGBColor(0x2c, 0xa0, 0x2c), // green
    RGBColor(0x94, 0x67, 0xbd), // purple
    RGBColor(0x8c, 0x56, 0x4b), // brown
    RGBColor(0xe3, 0x77, 0xc2), // pink
    RGBColor(0x17, 0xbe, 0xcf), // cyan
    RGBColor(0xbc, 0xbd, 0x22), // olive
    RGBColor(0x39, 0x3b, 0x79), // indigo
    RGBColor(0xb0, 0x7a, 0x1a), // ochre
];

/// FNV-1a: tiny, and fixed across Rust versions (unlike `DefaultHasher`), so a label maps
/// to the same colour in every build.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Colours for `labels`, given in priority order (largest first). Each label prefers the
/// slot its hash picks; a label whose slot is taken by a higher-priority one moves to the
/// next free slot, so the first ten never share a colour.
pub(crate) fn assign<'a>(labels: impl IntoIterator<Item = &'a str>) -> Vec<RGBColor> {
    let mut taken = [false; PROCESS.len()];
    labels
        .into_iter()
        .map(|label| {
            let preferred = usize::try_from(fnv1a(label) % PROCESS.len() as u64).unwrap_or(0);
            let slot = (0..PROCESS.len())
                .map(|offset| (preferred + offset) % PROCESS.len())
                .find(|&slot| !taken[slot])
                .unwrap_or(preferred);
            taken[slot] = true;
            PROCESS[slot]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_are_stable_and_distinct_for_the_first_ten() {
        let labels: Vec<String> = (0..10).map(|i| format!("python job{i}.py [{i}]")).collect();
        let first = assign(labels.iter().map(String::as_str));
        let again = assign(labels.iter().map(String::as_str));
        assert_eq!(first, again);
        for (i, a) in first.iter().enumerate() {
            for b in &first[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn a_lone_process_keeps_its_colour_in_another_chart() {
        let alone = assign(["trainer [4711]"]);
        let crowd = assign(["trainer [4711]", "other [1]", "other [2]"]);
        assert_eq!(alone[0], crowd[0]);
    }

    #[test]
    fn more_labels_than_colours_reuse_the_palette() {
        let labels: Vec<String> = (0..30).map(|i| format!("p{i}")).collect();
        let colours = assign(labels.iter().map(String::as_str));
        assert_eq!(colours.len(), 30);
        // The first ten take every colour once; the rest reuse them, never a reserved one.
        let first: std::collections::HashSet<_> = colours[..PROCESS.len()]
            .iter()
            .map(|c| (c.0, c.1, c.2))
            .collect();
        assert_eq!(first.len(), PROCESS.len());
        assert!(colours.iter().all(|c| PROCESS.contains(c)));
    }

    #[test]
    fn palette_avoids_the_reserved_colours() {
        assert!(!PROCESS.contains(&LEAK));
        assert!(!PROCESS.contains(&IDLE));
        assert!(!PROCESS.contains(&OTHER));
    }
}
