//! [`StoreError`]: why the store could not be opened, written or read.

use std::path::PathBuf;

/// Why the store could not be opened, written or read. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The data directory or file could not be created or read.
    #[error("history store {path}: {source}; check the path and its permissions (--data-dir)")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file exists but is not an SQLite database; it was left as it is.
    #[error(
        "history store {path} is not an SQLite database (corrupt or another file); it was not \
         modified: move it away or choose another --data-dir"
    )]
    NotADatabase {
        /// The file.
        path: PathBuf,
    },
    /// The file is another application's SQLite database; it was left as it is.
    #[error(
        "history store {path} belongs to another application (SQLite application_id \
         {application_id:#x}, tables: {tables}); it was not modified: choose another --data-dir"
    )]
    Foreign {
        /// The file.
        path: PathBuf,
        /// Its `application_id`.
        application_id: i64,
        /// Its tables, comma-separated.
        tables: String,
    },
    /// The file was written by a newer infertrace (schema version above this build's).
    #[error(
        "history store {path} has schema version {found}, newer than this build's {supported}; \
         upgrade infertrace or choose another --data-dir"
    )]
    NewerSchema {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: i64,
        /// This build's version.
        supported: i64,
    },
    /// SQLite's `quick_check` found the file damaged (a page overwritten, an index that does
    /// not match its table): reads of the damaged part fail. Found by `check-config` only.
    #[error(
        "history store {path} is damaged ({problem}); it was not modified: move it away (or \
         restore a backup) and infertrace starts a new one"
    )]
    Damaged {
        /// The file.
        path: PathBuf,
        /// The first problem `PRAGMA quick_check` names.
        problem: String,
    },
    /// Another collector has the store open (its lock file is locked).
    #[error(
        "history store {path} is in use by another collector: two collectors must not share a \
         store.data_dir (each would overwrite the other's minutes); give each its own"
    )]
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// SQLite refused an operation.
    #[error("history store {path}: {source}")]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// A writer is already running for this store (only one may merge minutes).
    #[error("history store {path}: a writer is already running")]
    WriterRunning {
        /// The file.
        path: PathBuf,
    },
    /// A flush asked for with [`StoreWriter::flush`] failed (the items were dropped and
    /// counted).
    ///
    /// [`StoreWriter::flush`]: super::StoreWriter::flush
    #[error("history store {path}: flush failed: {message}")]
    FlushFailed {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The writer thread has stopped.
    #[error("history store {path}: the writer has stopped")]
    WriterStopped {
        /// The file.
        path: PathBuf,
    },
    /// A history query named an unknown KPI.
    #[error("unknown KPI {kpi:?}: {reason}")]
    UnknownKpi {
        /// The KPI asked for.
        kpi: String,
        /// What is known.
        reason: String,
    },
}

impl StoreError {
    /// Whether this is the disk's trouble (full, or failing reads and writes) rather than a
    /// wrong setting or file: what `collect` runs on without history instead of stopping.
    pub fn is_disk_trouble(&self) -> bool {
        use rusqlite::ErrorCode::{DiskFull, SystemIoFailure};
        match self {
            Self::Sqlite {
                source: rusqlite::Error::SqliteFailure(e, _),
                ..
            } => matches!(e.code, DiskFull | SystemIoFailure),
            Self::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite(code: std::ffi::c_int) -> StoreError {
        StoreError::Sqlite {
            path: "x".into(),
            source: rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None),
        }
    }

    #[test]
    fn a_full_or_failing_disk_is_told_from_a_wrong_file() {
        assert!(sqlite(rusqlite::ffi::SQLITE_FULL).is_disk_trouble());
        assert!(sqlite(rusqlite::ffi::SQLITE_IOERR).is_disk_trouble());
        assert!(!sqlite(rusqlite::ffi::SQLITE_NOTADB).is_disk_trouble());
        assert!(!sqlite(rusqlite::ffi::SQLITE_CANTOPEN).is_disk_trouble());
        assert!(!StoreError::InUse { path: "x".into() }.is_disk_trouble());
    }
}
