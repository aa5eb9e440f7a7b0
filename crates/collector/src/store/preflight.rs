//! [`Store::check`]: whether [`Store::open`] would open a store, found without creating or
//! modifying anything — what `check-config` checks of `store.data_dir`, so that it refuses what
//! `collect` would refuse at its start.

use std::fs::Metadata;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};

use super::error::StoreError;
use super::{DB_FILE_NAME, Store, schema};

impl Store {
    /// Whether [`Store::open`] would open the store at `<dir>/infertrace.db`, found without
    /// creating or modifying anything (`check-config` must have no side effects): an existing
    /// `dir` must be a directory, and a missing one creatable — its nearest existing ancestor a
    /// directory this process may write in; an existing database must be an infertrace store of
    /// a version this build reads (it is opened read-only), and a missing one creatable in
    /// `dir`. The error is the one `open` would give where both can say the same.
    pub fn check(dir: &Path) -> Result<(), StoreError> {
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => check_database(dir),
            Ok(_) => Err(io_error(
                dir,
                ErrorKind::NotADirectory,
                "exists and is not a directory".to_owned(),
            )),
            Err(e) if is_missing(&e) => check_creatable(dir),
            Err(source) => Err(StoreError::Io {
                path: dir.to_path_buf(),
                source,
            }),
        }
    }
}

/// The database in the existing directory `dir`: one `open` accepts and may write, or room to
/// create it (SQLite also writes its `-wal` and `-shm` files beside it).
fn check_database(dir: &Path) -> Result<(), StoreError> {
    let path = dir.join(DB_FILE_NAME);
    let exists = path.try_exists().map_err(|source| StoreError::Io {
        path: path.clone(),
        source,
    })?;
    if exists {
        schema::check_existing(&path)?;
        may_write(&path).map_err(|source| StoreError::Io {
            path: path.clone(),
            source,
        })?;
    }
    may_create_in(dir).map_err(|e| {
        let what = if exists {
            "its -wal and -shm files"
        } else {
            DB_FILE_NAME
        };
        io_error(
            dir,
            e.kind(),
            format!("{what} cannot be created in it: {e}"),
        )
    })
}

/// The missing directory `dir`, which `open` creates with its missing parents: its nearest
/// existing ancestor must be a directory this process may create entries in.
fn check_creatable(dir: &Path) -> Result<(), StoreError> {
    let (ancestor, meta) = nearest_existing(dir).map_err(|source| StoreError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let shown = ancestor.display();
    if !meta.is_dir() {
        let why = format!("cannot be created: {shown} is not a directory");
        return Err(io_error(dir, ErrorKind::NotADirectory, why));
    }
    may_create_in(&ancestor)
        .map_err(|e| io_error(dir, e.kind(), format!("cannot be created in {shown}: {e}")))
}

/// The nearest ancestor of the missing `dir` that exists (`.` for a relative path's start),
/// with its metadata (symbolic links followed, as creating the directory follows them).
fn nearest_existing(dir: &Path) -> io::Result<(PathBuf, Metadata)> {
    for ancestor in dir.ancestors().skip(1) {
        let ancestor = match ancestor.as_os_str().is_empty() {
            true => Path::new("."),
            false => ancestor,
        };
        match std::fs::metadata(ancestor) {
            Ok(meta) => return Ok((ancestor.to_path_buf(), meta)),
            Err(e) if is_missing(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(ErrorKind::NotFound, "no ancestor exists"))
}

/// Whether `e` says a path does not exist: missing, or under something that is no directory.
fn is_missing(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory)
}

/// A [`StoreError::Io`] about `path` that this check found (no system call failed).
fn io_error(path: &Path, kind: ErrorKind, message: String) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(kind, message),
    }
}

/// Whether this process may create files and directories in the directory `dir`: its
/// permissions (`access(2)`, which also says when the file system is read-only), and on Linux
/// not procfs or sysfs, which refuse new entries whatever the permissions say (to root too).
#[cfg(unix)]
fn may_create_in(dir: &Path) -> io::Result<()> {
    use rustix::fs::{Access, access};
    access(dir, Access::WRITE_OK | Access::EXEC_OK)?;
    #[cfg(target_os = "linux")]
    {
        /// `SYSFS_MAGIC` of `statfs(2)` (rustix names only procfs's).
        const SYSFS_MAGIC: rustix::fs::FsWord = 0x6265_6572;
        let kind = rustix::fs::statfs(dir)?.f_type;
        if kind == rustix::fs::PROC_SUPER_MAGIC || kind == SYSFS_MAGIC {
            return Err(io::Error::new(
                ErrorKind::PermissionDenied,
                "procfs and sysfs accept no new files or directories",
            ));
        }
    }
    Ok(())
}

/// Whether this process may create files and directories in the directory `dir`: not
/// read-only (the only permission the standard library reports here).
#[cfg(not(unix))]
fn may_create_in(dir: &Path) -> io::Result<()> {
    may_write(dir)
}

/// Whether this process may read and write the existing file at `path`, as `open` does.
#[cfg(unix)]
fn may_write(path: &Path) -> io::Result<()> {
    use rustix::fs::{Access, access};
    Ok(access(path, Access::READ_OK | Access::WRITE_OK)?)
}

/// Whether the existing file at `path` is writable: not read-only (the only permission the
/// standard library reports here).
#[cfg(not(unix))]
fn may_write(path: &Path) -> io::Result<()> {
    match std::fs::metadata(path)?.permissions().readonly() {
        true => Err(io::Error::new(ErrorKind::PermissionDenied, "read-only")),
        false => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreOptions;

    /// The names in `dir`, sorted: what a check must leave as it found it.
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_missing_directory_that_can_be_created_passes_and_is_not_created() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/data");
        Store::check(&dir).unwrap();
        assert!(listing(tmp.path()).is_empty());
        // A relative path starts from the working directory, which exists.
        Store::check(Path::new("no-such-infertrace-dir/data")).unwrap();
    }

    #[test]
    fn a_file_in_the_way_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let err = Store::check(&file).unwrap_err().to_string();
        assert!(err.contains("exists and is not a directory"), "{err}");
        let err = Store::check(&file.join("x/y")).unwrap_err().to_string();
        assert!(err.contains("is not a directory"), "{err}");
        assert_eq!(listing(tmp.path()), ["file"]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_directory_procfs_cannot_hold_is_refused_even_to_root() {
        let err = Store::check(Path::new("/proc/nonexistent/x"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot be created in /proc"), "{err}");
        let err = Store::check(Path::new("/proc")).unwrap_err().to_string();
        assert!(
            err.contains("infertrace.db cannot be created in it"),
            "{err}"
        );
    }

    #[test]
    fn a_database_open_would_refuse_is_refused_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join(DB_FILE_NAME);
        let text = "not a database, and longer than SQLite's header";
        std::fs::write(&db, text).unwrap();
        let err = Store::check(tmp.path()).unwrap_err();
        assert!(matches!(err, StoreError::NotADatabase { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&db).unwrap(), text);
        assert_eq!(listing(tmp.path()), [DB_FILE_NAME]);
        // Another application's SQLite database.
        std::fs::remove_file(&db).unwrap();
        let other = rusqlite::Connection::open(&db).unwrap();
        other.execute_batch("CREATE TABLE notes (x)").unwrap();
        drop(other);
        let err = Store::check(tmp.path()).unwrap_err();
        assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
    }

    #[test]
    fn a_store_passes_open_or_closed_and_gets_no_new_file() {
        let tmp = tempfile::tempdir().unwrap();
        // Characters a URI gives a meaning to are part of the name.
        let dir = tmp.path().join("a?b#c%41 é");
        let store = Store::open(&dir, StoreOptions::default()).unwrap();
        // Open: its -wal and -shm are there, and stay as they are.
        let before = listing(&dir);
        Store::check(&dir).unwrap();
        assert_eq!(listing(&dir), before);
        drop(store);
        // Closed: SQLite removed them, and the check creates none.
        let before = listing(&dir);
        assert_eq!(before, [DB_FILE_NAME, crate::store::LOCK_FILE_NAME]);
        Store::check(&dir).unwrap();
        assert_eq!(listing(&dir), before);
        assert_eq!(listing(tmp.path()), ["a?b#c%41 é"]);
    }
}
