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
