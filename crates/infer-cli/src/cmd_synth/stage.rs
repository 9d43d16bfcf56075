//! Atomic output of `infer synth`: write into `.NAME.tmp-PID` beside the target (the name
//! `infer extract` stages under, so [`crate::cmd_vindex::install_interrupt_cleanup`] removes
//! it on Ctrl-C/SIGTERM), rename into place at [`Staged::commit`], remove it on drop otherwise.
//! Every staged folder holds [`MARKER`], so `--force` can tell synth's folders from user data.
//! A file output never replaces anything: an existing path is refused, `--force` or not.
//! `infer export` stages the same way through [`Staged::new_for`] (no marker, and nothing
//! existing is ever replaced, file or folder).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// A staged output file or directory.
pub struct Staged {
    tmp: PathBuf,
    target: PathBuf,
    dir: bool,
    force: bool,
    committed: bool,
    /// The command staging (`infer synth` writes [`MARKER`] and may replace its own folders;
    /// any other command never replaces anything).
    tool: &'static str,
}

/// The command name of `infer synth` (the one tool whose folders `--force` may replace).
const SYNTH: &str = "infer synth";

fn remove_any(p: &Path) {
    let _ = std::fs::remove_dir_all(p).or_else(|_| std::fs::remove_file(p));
}

/// Name of the marker file synth writes into every folder it creates; `--force` replaces a
/// non-empty folder only when it holds this file, so user data (a real HF checkpoint folder,
/// say) is never deleted.
pub const MARKER: &str = ".infer-synth";

/// The error for a file output (GGUF) that already exists: synth never replaces a file, with or
/// without `--force` (a file it did not write cannot be told from one it did).
fn file_exists_error(target: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{} exists; infer synth does not replace files (remove it first)",
        target.display()
    )
}

/// Refuse an existing file target (anything at the path: file, directory, link) whatever
/// `force` says ([`file_exists_error`]). An existing directory target is refused without
/// `force`; with `force` it must be a directory that is empty or holds [`MARKER`] (written by
/// synth). Errors name `target`.
pub fn check_target(target: &Path, dir: bool, force: bool) -> anyhow::Result<()> {
    check_target_as(SYNTH, target, dir, force)
}

/// [`check_target`] for `tool`: any tool other than `infer synth` refuses every existing path
/// ("PATH exists; TOOL does not replace files or folders (remove it first)").
pub fn check_target_as(tool: &str, target: &Path, dir: bool, force: bool) -> anyhow::Result<()> {
    let meta = match std::fs::symlink_metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", target.display())),
    };
    if tool != SYNTH {
        bail!(
            "{} exists; {tool} does not replace files or folders (remove it first)",
            target.display()
        );
    }
    if !dir {
        return Err(file_exists_error(target));
    }
    if !force {
        bail!("{} exists (use --force to replace it)", target.display());
    }
    if !meta.is_dir() {
        bail!(
            "{} exists and is not a directory; refusing to replace it",
            target.display()
        );
    }
    let empty = std::fs::read_dir(target)
        .with_context(|| format!("reading {}", target.display()))?
        .next()
        .is_none();
    if !empty && !target.join(MARKER).is_file() {
        bail!(
            "{} is a non-empty folder not written by infer synth (no {MARKER} marker); \
             --force replaces only empty folders or synth's own; refusing to replace it",
            target.display()
        );
    }
    Ok(())
}

/// Move the finished file `tmp` to `target` without ever replacing a file: a hard link fails
/// with `AlreadyExists` when something appeared at `target` since [`check_target`] (POSIX
/// `link`), then `tmp` is unlinked. Where the filesystem has no hard links, a plain rename
/// (the target was checked absent just before).
fn place_file(tool: &str, tmp: &Path, target: &Path) -> anyhow::Result<()> {
    match std::fs::hard_link(tmp, target) {
        Ok(()) => std::fs::remove_file(tmp).with_context(|| format!("removing {}", tmp.display())),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            check_target_as(tool, target, false, false)?;
            Err(file_exists_error(target))
        }
        Err(_) => std::fs::rename(tmp, target)
            .with_context(|| format!("renaming {} to {}", tmp.display(), target.display())),
    }
}

impl Staged {
    /// Check the target ([`check_target`]) and prepare `.NAME.tmp-PID` beside it (created as a
    /// directory holding only [`MARKER`] when `dir`; for a file, only the path is reserved).
    pub fn new(target: &Path, dir: bool, force: bool) -> anyhow::Result<Staged> {
        Self::new_for(SYNTH, target, dir, force)
    }

    /// [`Staged::new`] for another command `tool` (`infer export`): the target must not exist
    /// ([`check_target_as`]), and a staged folder holds no [`MARKER`].
    pub fn new_for(
        tool: &'static str,
        target: &Path,
        dir: bool,
        force: bool,
    ) -> anyhow::Result<Staged> {
        check_target_as(tool, target, dir, force)?;
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("{}: output path has no usable name", target.display()))?;
        let parent = super::space::output_dir(target);
        let tmp = parent.join(infer_vindex::files::temp_dir_name(name, std::process::id()));
        remove_any(&tmp);
        let staged = Staged {
            tmp,
            target: target.to_path_buf(),
            dir,
            force,
            committed: false,
            tool,
        };
        if dir && tool != SYNTH {
            let tmp = &staged.tmp;
            std::fs::create_dir_all(tmp).with_context(|| format!("creating {}", tmp.display()))?;
        } else if dir {
            let tmp = &staged.tmp;
            std::fs::create_dir_all(tmp).with_context(|| format!("creating {}", tmp.display()))?;
            std::fs::write(
                tmp.join(MARKER),
                "Written by `infer synth` (random weights); `infer synth --force` may replace this folder.\n",
            )
            .with_context(|| format!("writing {}", tmp.join(MARKER).display()))?;
        }
        Ok(staged)
    }

    /// Where to write.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Move the finished output onto the target (checked again: it may have appeared meanwhile;
    /// a file is placed with [`place_file`], which never replaces). A replaced directory is parked under `.NAME.old-PID` and deleted after the swap.
    pub fn commit(mut self) -> anyhow::Result<()> {
        check_target_as(self.tool, &self.target, self.dir, self.force)?;
        let rename = |a: &Path, b: &Path| {
            std::fs::rename(a, b)
                .with_context(|| format!("renaming {} to {}", a.display(), b.display()))
        };
        if self.dir && self.target.exists() {
            let name = self
                .target
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("out");
            let old = self
                .tmp
                .with_file_name(infer_vindex::files::old_dir_name(name, std::process::id()));
            remove_any(&old);
            rename(&self.target, &old)?;
            if let Err(e) = rename(&self.tmp, &self.target) {
                let _ = std::fs::rename(&old, &self.target);
                return Err(e);
            }
            remove_any(&old);
        } else if self.dir {
            rename(&self.tmp, &self.target)?;
        } else {
            place_file(self.tool, &self.tmp, &self.target)?;
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            remove_any(&self.tmp);
        }
    }
}
