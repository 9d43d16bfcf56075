//! Atomic placement of a built vindex: build in `.NAME.tmp-PID` beside the target, then rename.
//! A killed build leaves only a hidden temp directory (removed by the next build of that target,
//! once its process is gone), never a directory at the target path.

use std::path::{Path, PathBuf};

use crate::files::{old_dir_name, temp_dir_name, temp_dir_prefix};
use crate::VindexError;

/// A temporary build directory, removed on drop unless [`TempBuildDir::commit`] succeeded.
pub struct TempBuildDir {
    dir: PathBuf,
    target: PathBuf,
    committed: bool,
}

/// Parent directory and file name of `target`. Errors: a target with no file name (`/`, `..`).
fn split_target(target: &Path) -> Result<(PathBuf, String), VindexError> {
    let name = target
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| VindexError::BadSource {
            path: target.to_path_buf(),
            msg: "output path has no usable directory name".into(),
        })?
        .to_string();
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

/// Whether an existing `target` may be replaced by a new vindex: with `force`, only a directory
/// that holds `index.json` (a vindex) or is empty; never a file or a directory of other data.
/// A missing target is always fine.
///
/// Errors: [`VindexError::TargetExists`] (exists, no `force`), [`VindexError::TargetNotDir`]
/// (a regular file, a symbolic link or other non-directory), [`VindexError::TargetNotVindex`] (a non-empty
/// directory without `index.json`), [`VindexError::Io`] (cannot be inspected).
pub(crate) fn check_replaceable(target: &Path, force: bool) -> Result<(), VindexError> {
    // `symlink_metadata`: a symbolic link at the target is itself the thing replaced, so it
    // counts as a non-directory (never followed and never replaced).
    let meta = match std::fs::symlink_metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(VindexError::io(target, e)),
    };
    if !force {
        return Err(VindexError::TargetExists {
            path: target.to_path_buf(),
        });
    }
    if !meta.is_dir() {
        return Err(VindexError::TargetNotDir {
            path: target.to_path_buf(),
        });
    }
    if target.join(crate::files::INDEX_JSON).is_file() {
        return Ok(());
    }
    let mut entries = std::fs::read_dir(target).map_err(|e| VindexError::io(target, e))?;
    if entries.next().is_none() {
        return Ok(());
    }
    Err(VindexError::TargetNotVindex {
        path: target.to_path_buf(),
    })
}

impl TempBuildDir {
    /// Refuse an existing `target` unless it may be replaced ([`check_replaceable`]), remove
    /// stale temp dirs of dead builds of the same target, and create `.NAME.tmp-PID` beside it.
    pub fn create(target: &Path, force: bool) -> Result<Self, VindexError> {
        check_replaceable(target, force)?;
        let (parent, name) = split_target(target)?;
        if !parent.is_dir() {
            return Err(VindexError::MissingParent {
                path: target.to_path_buf(),
                parent,
            });
        }
        remove_stale(&parent, &name);
        let dir = parent.join(temp_dir_name(&name, std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| VindexError::io(&dir, e))?;
        }
        // Named by the target, not the hidden temp name (a pseudo or read-only file system such
        // as /proc fails here).
        std::fs::create_dir(&dir).map_err(|e| {
            let what = format!("cannot create a folder in {}: {e}", parent.display());
            VindexError::io(target, std::io::Error::new(e.kind(), what))
        })?;
        Ok(TempBuildDir {
            dir,
            target: target.to_path_buf(),
            committed: false,
        })
    }

    /// The directory to write into.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Move the finished build to the target. With `force`, an existing vindex (or empty
    /// directory) at the target is parked under `.NAME.old-PID`, replaced, then deleted; anything
    /// else at the target is an error ([`check_replaceable`], checked again here because the
    /// target may have changed during the build).
    pub fn commit(mut self, force: bool) -> Result<(), VindexError> {
        let (parent, name) = split_target(&self.target)?;
        let mut parked = None;
        check_replaceable(&self.target, force)?;
        if self.target.exists() {
            let old = parent.join(old_dir_name(&name, std::process::id()));
            if old.exists() {
                std::fs::remove_dir_all(&old).map_err(|e| VindexError::io(&old, e))?;
            }
            std::fs::rename(&self.target, &old).map_err(|e| VindexError::io(&self.target, e))?;
            parked = Some(old);
        }
        if let Err(e) = std::fs::rename(&self.dir, &self.target) {
            if let Some(old) = &parked {
                let _ = std::fs::rename(old, &self.target);
            }
            return Err(VindexError::io(&self.target, e));
        }
        self.committed = true;
        if let Some(old) = parked {
            std::fs::remove_dir_all(&old).map_err(|e| VindexError::io(&old, e))?;
        }
        Ok(())
    }
}

impl Drop for TempBuildDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// True when a process with this id is running (Linux `/proc`; elsewhere assume it is, so
/// nothing live is ever deleted).
fn pid_alive(pid: u32) -> bool {
    let proc_root = Path::new("/proc");
    if proc_root.join("self").exists() {
        proc_root.join(pid.to_string()).exists()
    } else {
        true
    }
}

/// Remove `.NAME.tmp-PID` / `.NAME.old-PID` directories in `parent` left by builds that were
/// killed (their PID no longer runs). Best effort: failures are ignored.
fn remove_stale(parent: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let prefixes = [temp_dir_prefix(name), format!(".{name}.old-")];
    for entry in entries.flatten() {
        let fname = entry.file_name();
        let Some(fname) = fname.to_str() else {
            continue;
        };
        for prefix in &prefixes {
            if let Some(pid) = fname.strip_prefix(prefix.as_str()) {
                if let Ok(pid) = pid.parse::<u32>() {
                    if pid != std::process::id() && !pid_alive(pid) {
                        let _ = std::fs::remove_dir_all(entry.path());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_refuses_then_forces() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("m.vindex");
        let t = TempBuildDir::create(&target, false).unwrap();
        std::fs::write(t.path().join("a"), "1").unwrap();
        std::fs::write(t.path().join(crate::files::INDEX_JSON), "{}").unwrap();
        t.commit(false).unwrap();
        assert!(target.join("a").exists());
        assert!(matches!(
            TempBuildDir::create(&target, false),
            Err(VindexError::TargetExists { .. })
        ));
        let t = TempBuildDir::create(&target, true).unwrap();
        std::fs::write(t.path().join("b"), "2").unwrap();
        t.commit(true).unwrap();
        assert!(target.join("b").exists() && !target.join("a").exists());
        let names: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    /// The output goes only into an existing folder (nothing is created above it), and a
    /// symbolic link at the target is refused even with `force` (its target untouched).
    #[test]
    fn missing_parent_and_symlink_targets_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("no/such/dir/m.vindex");
        let e = TempBuildDir::create(&deep, false).err().expect("refused");
        assert!(matches!(e, VindexError::MissingParent { .. }), "{e}");
        assert!(!root.path().join("no").exists(), "nothing created");
        let real = root.path().join("real.vindex");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join(crate::files::INDEX_JSON), "{}").unwrap();
        let link = root.path().join("link.vindex");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = TempBuildDir::create(&link, true).err().expect("refused");
        assert!(matches!(e, VindexError::TargetNotDir { .. }), "{e}");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(real.join(crate::files::INDEX_JSON).is_file());
    }

    /// `--force` never deletes user data: a file or a non-empty non-vindex directory at the
    /// target is refused (before and at commit) and left untouched; an empty directory is fine.
    #[test]
    fn force_replaces_only_a_vindex_or_an_empty_dir() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("existing.txt");
        std::fs::write(&file, "keep me").unwrap();
        let e = TempBuildDir::create(&file, true)
            .err()
            .expect("file refused");
        assert!(matches!(e, VindexError::TargetNotDir { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("{} exists and is not a directory", file.display())),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");

        let data = root.path().join("important");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("thesis.tex"), "years of work").unwrap();
        let e = TempBuildDir::create(&data, true)
            .err()
            .expect("data refused");
        assert!(matches!(e, VindexError::TargetNotVindex { .. }), "{e}");
        assert!(e.to_string().contains(&data.display().to_string()), "{e}");
        assert!(data.join("thesis.tex").is_file());

        // The target turns into user data while the build runs: commit refuses too.
        let later = root.path().join("later");
        let t = TempBuildDir::create(&later, true).unwrap();
        std::fs::create_dir(&later).unwrap();
        std::fs::write(later.join("notes"), "x").unwrap();
        let e = t.commit(true).unwrap_err();
        assert!(matches!(e, VindexError::TargetNotVindex { .. }), "{e}");
        assert!(later.join("notes").is_file());

        let empty = root.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let t = TempBuildDir::create(&empty, true).unwrap();
        std::fs::write(t.path().join(crate::files::INDEX_JSON), "{}").unwrap();
        t.commit(true).unwrap();
        assert!(empty.join(crate::files::INDEX_JSON).is_file());
        let names: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with('.')),
            "temp dirs left: {names:?}"
        );
    }

    #[test]
    fn dropped_build_leaves_nothing_and_stale_dirs_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("m.vindex");
        // A stale temp dir of a dead process (pid u32::MAX - 1 does not exist).
        let stale = root.path().join(temp_dir_name("m.vindex", u32::MAX - 1));
        std::fs::create_dir(&stale).unwrap();
        let t = TempBuildDir::create(&target, false).unwrap();
        assert!(!stale.exists());
        let tmp = t.path().to_path_buf();
        drop(t);
        assert!(!tmp.exists() && !target.exists());
    }

    #[test]
    fn uncreatable_temp_dir_is_reported_under_the_target_name() {
        // /proc takes no new folders: the error names the target and its folder, not the
        // hidden `.x.vindex.tmp-PID`.
        let e = TempBuildDir::create(Path::new("/proc/x.vindex"), false)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with("/proc/x.vindex: cannot create a folder in /proc: ")
                && !e.contains(".tmp-"),
            "{e}"
        );
    }
}
