//! A vindex changed after its build: `verify` catches a flipped byte in any file (the data
//! files by their recorded sha256, `index.json` by its own `index_sha256`), and a vindex
//! written by an incompatible infer is refused naming the version that wrote it.

mod common;

use std::path::Path;

use common::{mock_source, MockDims};
use infer_vindex::{
    build, files, verify, BuildOptions, Dtype, Vindex, VindexError, VindexIndex, FORMAT_VERSION,
    INFER_VERSION,
};

const DIMS: MockDims = MockDims {
    vocab: 64,
    hidden: 32,
    inter: 64,
    layers: 2,
    tied: false,
};

fn built() -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("m.vindex");
    let opts = BuildOptions {
        dtype: Dtype::F16,
        ..Default::default()
    };
    build(&mock_source(&DIMS), &target, &opts).unwrap();
    (root, target)
}

/// Deterministic positions (a 64-bit LCG; no `rand` dependency needed for a test).
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

/// Every file the index lists: 8 flipped bytes each (random positions, random non-zero XOR
/// masks), one at a time. Each is reported as a mismatch of exactly that file.
#[test]
fn verify_catches_a_flipped_byte_in_any_data_file() {
    let (_root, target) = built();
    let report = verify(&target).unwrap();
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.index_json_ok, Some(true));
    let index = Vindex::open(&target).unwrap().index().clone();
    let mut rng = Lcg(21);
    for f in &index.files {
        let p = target.join(&f.name);
        let original = std::fs::read(&p).unwrap();
        for _ in 0..8 {
            let mut bytes = original.clone();
            let at = rng.below(bytes.len());
            bytes[at] ^= 1 + rng.below(255) as u8;
            std::fs::write(&p, &bytes).unwrap();
            let report = verify(&target).unwrap();
            assert_eq!(report.problems(), 1, "{}[{at}]: {report}", f.name);
            assert_eq!(report.mismatches[0].file, f.name, "{report}");
            assert!(
                report.to_string().contains(&format!("MISMATCH {}", f.name)),
                "{report}"
            );
        }
        std::fs::write(&p, &original).unwrap();
    }
    assert!(verify(&target).unwrap().is_ok());
}

/// `index.json` itself, every byte flipped by one bit (0x01) and, on a sample of positions,
/// by other masks. What `verify` does with index.json is: parse it (a failure is a named
/// error), then compare its content with the `index_sha256` it records. So each flip must be
/// caught that way, or have changed nothing the index means (e.g. renamed an absent optional
/// key): then the parsed index equals the original. Every 50th flip runs the whole `verify`.
#[test]
fn verify_catches_every_meaningful_flip_in_index_json() {
    let (_root, target) = built();
    let p = target.join(files::INDEX_JSON);
    let original = std::fs::read(&p).unwrap();
    let parse = |b: &[u8]| {
        std::str::from_utf8(b)
            .ok()
            .and_then(|t| VindexIndex::parse(&p, t).ok())
    };
    let want = parse(&original).unwrap();
    let unsealed = |i: &VindexIndex| VindexIndex {
        index_sha256: None,
        ..i.clone()
    };
    let (mut caught, mut harmless, mut n) = (0, 0, 0);
    for at in 0..original.len() {
        let masks: &[u8] = if at % 13 == 0 {
            &[0x01, 0x20, 0xff]
        } else {
            &[0x01]
        };
        for &mask in masks {
            let mut bytes = original.clone();
            bytes[at] ^= mask;
            let seen = match parse(&bytes) {
                None => false,
                Some(i) => i.index_sha256.as_deref() == Some(i.content_sha256().as_str()),
            };
            if seen {
                assert_eq!(
                    unsealed(&parse(&bytes).unwrap()),
                    unsealed(&want),
                    "byte {at} ^ {mask:#x} changed the index unnoticed"
                );
                harmless += 1;
            } else {
                caught += 1;
            }
            n += 1;
            if n % 50 == 0 {
                std::fs::write(&p, &bytes).unwrap();
                match verify(&target) {
                    Err(e) => assert!(!seen && e.to_string().contains("index.json"), "{e}"),
                    Ok(r) => assert_eq!(r.is_ok(), seen, "byte {at} ^ {mask:#x}: {r}"),
                }
            }
        }
    }
    std::fs::write(&p, &original).unwrap();
    assert!(verify(&target).unwrap().is_ok());
    assert!(
        caught > original.len() * 9 / 10,
        "{caught} caught, {harmless} harmless"
    );
}

fn edit_index(target: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = target.join(files::INDEX_JSON);
    let mut j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut j);
    std::fs::write(&p, serde_json::to_string_pretty(&j).unwrap()).unwrap();
}

/// A vindex of another format version is refused by open and verify, naming the infer
/// version that wrote it; this build records its own version.
#[test]
fn vindex_of_an_incompatible_infer_is_refused_naming_its_version() {
    let (_root, target) = built();
    let ix = Vindex::open(&target).unwrap().index().clone();
    assert_eq!(ix.provenance.infer_version, INFER_VERSION);
    assert_eq!(ix.format_version, FORMAT_VERSION);
    edit_index(&target, |j| {
        j["format_version"] = (FORMAT_VERSION + 1).into();
        j["provenance"]["infer_version"] = "9.4.0".into();
    });
    for e in [
        Vindex::open(&target).err().unwrap(),
        verify(&target).err().unwrap(),
    ] {
        assert!(matches!(e, VindexError::BadVersion { .. }), "{e}");
        let s = e.to_string();
        assert!(
            s.contains("index.json")
                && s.contains("written by infer 9.4.0")
                && s.contains(&format!("this infer {INFER_VERSION}"))
                && s.contains("rebuild"),
            "{s}"
        );
    }
}

/// An index.json edited to keep valid JSON and valid sizes (so `Vindex::open` accepts it) is
/// still caught by verify; one without `index_sha256` (an older build) is reported as unchecked.
#[test]
fn edited_or_unsealed_index_json_is_reported() {
    let (_root, target) = built();
    edit_index(&target, |j| j["model_name"] = "renamed".into());
    Vindex::open(&target).unwrap();
    let r = verify(&target).unwrap();
    assert_eq!(r.index_json_ok, Some(false), "{r}");
    assert!(r.to_string().contains("MISMATCH index.json"), "{r}");
    edit_index(&target, |j| {
        j.as_object_mut().unwrap().remove("index_sha256");
    });
    let r = verify(&target).unwrap();
    assert_eq!(r.index_json_ok, None, "{r}");
    assert!(
        !r.is_ok() && r.to_string().contains("UNSEALED index.json"),
        "{r}"
    );
}

/// A data file deleted from the vindex is reported as missing, by name, apart from changed
/// files: not as a sha256 mismatch.
#[test]
fn a_missing_data_file_is_reported_as_missing_not_as_changed() {
    let (_root, target) = built();
    let index = Vindex::open(&target).unwrap().index().clone();
    for f in &index.files {
        let p = target.join(&f.name);
        let original = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        let r = verify(&target).unwrap();
        assert_eq!(r.missing, vec![f.name.clone()], "{r}");
        assert!(r.mismatches.is_empty(), "{r}");
        assert_eq!(r.problems(), 1, "{r}");
        let text = r.to_string();
        assert!(
            text.contains(&format!("MISSING  {}", f.name))
                && text.contains("1 missing")
                && !text.contains("MISMATCH")
                && !text.contains("mismatched"),
            "{text}"
        );
        std::fs::write(&p, &original).unwrap();
    }
    // One changed and one missing: each under its own name.
    let [a, b, ..] = &index.files[..] else {
        panic!("a vindex of fewer than two files")
    };
    let pa = target.join(&a.name);
    let mut bytes = std::fs::read(&pa).unwrap();
    bytes[0] ^= 0x10;
    std::fs::write(&pa, &bytes).unwrap();
    std::fs::remove_file(target.join(&b.name)).unwrap();
    let r = verify(&target).unwrap();
    assert_eq!(
        (
            r.mismatches.len(),
            r.mismatches[0].file.as_str(),
            &r.missing[..]
        ),
        (1, a.name.as_str(), &[b.name.clone()][..]),
        "{r}"
    );
    assert!(r.to_string().contains("1 mismatched, 1 missing"), "{r}");
}

/// Byte ranges of the object keys of JSON `text` (the characters between the quotes of every
/// string followed by `:`). Plain scan: the index's strings hold no escaped quotes.
fn key_ranges(text: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'"' {
            let start = i + 1;
            let end = start + text[start..].iter().position(|&c| c == b'"').unwrap();
            let after = text[end + 1..].iter().find(|c| !c.is_ascii_whitespace());
            if after == Some(&b':') {
                out.push(start..end);
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// A flipped byte inside a key of index.json — the JSON still parses but the key's name is
/// wrong, or (the byte turned into a quote) it no longer parses — is reported by verify and
/// open as index.json changed since it was written (it records its own sha256), never as
/// "corrupt JSON". A renamed key the index does without (an optional one at its default)
/// changes nothing and verifies.
#[test]
fn a_flipped_byte_in_a_key_of_index_json_is_reported_as_a_change() {
    let (_root, target) = built();
    let p = target.join(files::INDEX_JSON);
    let original = std::fs::read(&p).unwrap();
    let want = VindexIndex::parse(&p, std::str::from_utf8(&original).unwrap()).unwrap();
    let keys = key_ranges(&original);
    assert!(keys.len() > 50, "{} keys", keys.len());
    let changed = |s: &str| {
        s.contains("index.json: changed after it was written")
            && s.contains("sha256")
            && !s.contains("corrupt JSON")
    };
    let (mut errors, mut mismatches, mut harmless) = (0, 0, 0);
    for (n, r) in keys.iter().enumerate() {
        let at = r.start + r.len() / 2;
        // Still JSON (a letter's case or low bit), or no longer JSON (a quote).
        for mask in [0x01, original[at] ^ b'"'] {
            let mut bytes = original.clone();
            bytes[at] ^= mask;
            std::fs::write(&p, &bytes).unwrap();
            let what = format!(
                "key {n} {:?} byte {at} ^ {mask:#x}",
                String::from_utf8_lossy(&original[r.clone()])
            );
            match verify(&target) {
                Err(e) => {
                    assert!(changed(&e.to_string()), "{what}: {e}");
                    errors += 1;
                }
                Ok(rep) if rep.is_ok() => {
                    let now = VindexIndex::parse(&p, std::str::from_utf8(&bytes).unwrap());
                    assert_eq!(now.unwrap(), want, "{what}: changed the index unnoticed");
                    harmless += 1;
                }
                Ok(rep) => {
                    assert_eq!(rep.index_json_ok, Some(false), "{what}: {rep}");
                    let text = rep.to_string();
                    assert!(
                        text.starts_with("MISMATCH index.json: changed after it was written"),
                        "{what}: {text}"
                    );
                    mismatches += 1;
                }
            }
            if let Err(e) = Vindex::open(&target) {
                assert!(changed(&e.to_string()), "{what}: open: {e}");
            }
        }
    }
    std::fs::write(&p, &original).unwrap();
    assert!(verify(&target).unwrap().is_ok());
    eprintln!("{errors} errors, {mismatches} mismatches, {harmless} harmless");
    assert!(
        errors > keys.len() && mismatches > 0,
        "{errors} errors, {mismatches} mismatches, {harmless} harmless"
    );
}

/// index.json cut short is reported as changed, the seal being at its start.
#[test]
fn a_truncated_index_json_is_reported_as_changed() {
    let (_root, target) = built();
    let p = target.join(files::INDEX_JSON);
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, &text[..text.len() / 2]).unwrap();
    for e in [
        Vindex::open(&target).err().unwrap(),
        verify(&target).err().unwrap(),
    ] {
        assert!(matches!(e, VindexError::IndexChanged { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("index.json: changed after it was written"),
            "{e}"
        );
    }
}
