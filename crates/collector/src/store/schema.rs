//! The database file: recognising it (or refusing it), creating the schema, retention.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, params};

use super::error::StoreError;
use super::time::{MINUTE_NANOS, sql_time};

/// What one retention pass deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionStats {
    /// Minute rollups.
    pub rollups: usize,
    /// Captured requests.
    pub requests: usize,
    /// Findings and alert transitions.
    pub events: usize,
    /// Critical-path slots.
    pub critical_slots: usize,
    /// Collector runs that ended before the cutoff.
    pub runs: usize,
}

/// `PRAGMA application_id` of an infertrace store: `ITRC`.
pub(super) const APPLICATION_ID: i64 = 0x4954_5243;
/// `PRAGMA user_version` this build writes and reads.
pub(super) const SCHEMA_VERSION: i64 = 1;
/// Page size of a new store.
const PAGE_SIZE: i64 = 16_384;
/// The first 16 bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// The schema. `rollups` is a rowid table: its blobs (a few kB) fit in a 4 KiB page there,
/// where a `WITHOUT ROWID` table would spill every row past ~1 kB to an overflow page (about
/// twice the file).
const SCHEMA: &str = "
CREATE TABLE series (
    id INTEGER PRIMARY KEY,
    service TEXT NOT NULL,
    model TEXT NOT NULL,
    operation TEXT NOT NULL,
    UNIQUE (service, model, operation)
);
CREATE TABLE rollups (
    id INTEGER PRIMARY KEY,
    series_id INTEGER NOT NULL,
    minute INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    acc BLOB NOT NULL,
    UNIQUE (series_id, minute)
);
CREATE INDEX rollups_by_minute ON rollups (minute);
CREATE TABLE requests (
    id INTEGER PRIMARY KEY,
    minute INTEGER NOT NULL,
    reason TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    service TEXT NOT NULL,
    model TEXT NOT NULL,
    operation TEXT NOT NULL,
    outcome TEXT NOT NULL,
    e2e REAL NOT NULL,
    record TEXT NOT NULL,
    critical_path TEXT
);
CREATE INDEX requests_by_minute ON requests (minute, reason, e2e);
CREATE TABLE findings (
    id INTEGER PRIMARY KEY,
    t INTEGER NOT NULL,
    rule_id TEXT NOT NULL,
    service TEXT NOT NULL,
    model TEXT NOT NULL,
    operation TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX findings_by_t ON findings (t);
CREATE TABLE alerts (
    id INTEGER PRIMARY KEY,
    t INTEGER NOT NULL,
    alert TEXT NOT NULL,
    state TEXT NOT NULL,
    service TEXT NOT NULL,
    model TEXT NOT NULL,
    operation TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX alerts_by_t ON alerts (t);
";

/// The tables added since schema version 1: created with the schema in a new store, and by
/// [`add_missing_tables`] in an older one once it is locked. The version stays 1: a build
/// before them ignores them.
/// `critical_slots`: the critical-path windows' slots (`CriticalPathWindows::encode_slot`),
/// one row a slot. `meta`: facts about the store as a whole, `data_since` and `through`
/// (`DataBounds`). `runs`: when each collector that wrote the store ran, from its start to
/// the latest time its data is committed through (`Runs`), so that a query can tell a quiet
/// minute from one no collector saw.
const ADDED_TABLES: &str = "
CREATE TABLE IF NOT EXISTS critical_slots (
    start INTEGER PRIMARY KEY,
    slot BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    since INTEGER PRIMARY KEY,
    through INTEGER NOT NULL
);
";

/// Whether the file at `path` is absent, empty, or starts like an SQLite database.
fn check_header(path: &Path) -> Result<(), StoreError> {
    let io = |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(e)),
    };
    let mut head = Vec::with_capacity(16);
    file.by_ref().take(16).read_to_end(&mut head).map_err(io)?;
    if head.is_empty() || head.as_slice() == SQLITE_HEADER {
        Ok(())
    } else {
        Err(StoreError::NotADatabase {
            path: path.to_path_buf(),
        })
    }
}

/// What SQLite's `source` error on the database at `path` means for the store: a file that is
/// not a database, or another failure.
fn sql_error(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + Copy + '_ {
    move |source| {
        if source.sqlite_error_code() == Some(ErrorCode::NotADatabase) {
            StoreError::NotADatabase {
                path: path.to_path_buf(),
            }
        } else {
            StoreError::Sqlite {
                path: path.to_path_buf(),
                source,
            }
        }
    }
}

/// Opens the store's database at `path`, creating the schema in a new or empty file, and
/// refusing (untouched) anything else that is not an infertrace store of a supported version.
pub(super) fn open(path: &Path) -> Result<Connection, StoreError> {
    check_header(path)?;
    connect(path)
}

/// Another connection to the database the store has open: without [`check_header`]'s plain
/// read of the file, whose close would release every SQLite lock this process holds on it
/// (POSIX locks belong to the process, and closing any descriptor of the file drops them
/// all). Another SQLite client — the `sqlite3` shell, a backup tool — would then find itself
/// the last one, checkpoint and delete the live WAL, and the commits after it would be lost
/// on a crash.
pub(super) fn open_another(path: &Path) -> Result<Connection, StoreError> {
    connect(path)
}

/// [`open`] past the header check.
fn connect(path: &Path) -> Result<Connection, StoreError> {
    let sql = sql_error(path);
    let mut conn = Connection::open(path).map_err(sql)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(sql)?;
    let fresh = recognise(&conn, path)?;
    if fresh {
        // Before anything is written: a stored minute is a few kB, and 16 KiB pages hold
        // several of them where 4 KiB pages hold one (less space a row).
        conn.pragma_update(None, "page_size", PAGE_SIZE)
            .map_err(sql)?;
    }
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(sql)?;
    // In WAL mode NORMAL keeps every commit across a process crash (kill -9); only a power
    // loss may lose the last commits.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sql)?;
    if fresh {
        let tx = conn.transaction().map_err(sql)?;
        tx.execute_batch(SCHEMA).map_err(sql)?;
        tx.execute_batch(ADDED_TABLES).map_err(sql)?;
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(sql)?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(sql)?;
        tx.commit().map_err(sql)?;
    }
    Ok(conn)
}

/// Creates in the store open on `conn` the tables a store written by an earlier build lacks
/// ([`ADDED_TABLES`]). Call once this process holds the store's lock.
pub(super) fn add_missing_tables(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    conn.execute_batch(ADDED_TABLES).map_err(sql_error(path))
}

/// Whether [`open`] would accept the existing file at `path`, found without writing anything:
/// the file is opened read-only and immutable, so that SQLite creates no `-wal` or `-shm` file
/// beside it and takes no lock. What was committed only to a `-wal` goes unseen then: a store
/// whose creation was never checkpointed looks fresh, which `open` accepts as well.
///
/// A checkpoint cut short (a full disk, a crash) can leave the main file readable only with
/// its `-wal`, which `open` replays. So when the immutable read fails and a `-wal` with content
/// and its `-shm` lie beside the file, the file is read again as an ordinary read-only reader
/// (one that creates nothing where both exist), and that answer counts.
pub(super) fn check_existing(path: &Path) -> Result<(), StoreError> {
    check_header(path)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let read = |params: &str| {
        let conn =
            Connection::open_with_flags(file_uri(path, params), flags).map_err(sql_error(path))?;
        recognise(&conn, path)?;
        intact(&conn, path)
    };
    let immutable = read("mode=ro&immutable=1");
    let beside = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        std::fs::metadata(name)
    };
    // Without its `-shm`, a reader would create one: the check then keeps its first answer.
    let wal_readable = beside("-wal").is_ok_and(|m| m.len() > 0) && beside("-shm").is_ok();
    match immutable {
        Err(StoreError::Sqlite { .. }) if wal_readable => read("mode=ro"),
        other => other,
    }
}

/// Whether SQLite's `quick_check` finds the database open on `conn` intact: it reads every
/// page (seconds for a store of gigabytes, so only `check-config` runs it, not a start), and a
/// page overwritten in the middle of the file is found here rather than as a 500 on the first
/// history read that reaches it.
fn intact(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let first: String = conn
        .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
        .map_err(sql_error(path))?;
    if first == "ok" {
        Ok(())
    } else {
        Err(StoreError::Damaged {
            path: path.to_path_buf(),
            problem: first,
        })
    }
}

/// The SQLite URI of `path` with the query `params`, every byte but unreserved ones and `/`
/// percent-encoded (so that `?`, `#` and `%` in a name stay part of it).
fn file_uri(path: &Path, params: &str) -> String {
    let mut uri = String::from(if path.is_absolute() {
        "file://"
    } else {
        "file:"
    });
    for &b in path.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push('?');
    uri.push_str(params);
    uri
}

/// What the database open on `conn` is: `true` when fresh (no table, no application id, no
/// version), `false` when an infertrace store of a version this build reads; another
/// application's database or a newer schema is refused.
fn recognise(conn: &Connection, path: &Path) -> Result<bool, StoreError> {
    let sql = sql_error(path);
    let application_id: i64 = conn
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .map_err(sql)?;
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(sql)?;
    let tables: Vec<String> = {
        let mut stmt = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .map_err(sql)?;
        let names = stmt.query_map([], |r| r.get::<_, String>(0)).map_err(sql)?;
        names.collect::<rusqlite::Result<_>>().map_err(sql)?
    };
    let fresh = application_id == 0 && version == 0 && tables.is_empty();
    if !fresh && application_id != APPLICATION_ID {
        return Err(StoreError::Foreign {
            path: path.to_path_buf(),
            application_id,
            tables: tables.join(", "),
        });
    }
    if version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(fresh)
}

/// Deletes rows older than `now − retention`: minutes that ended before it, requests of those
/// minutes, findings, alert transitions, critical-path slots and collector runs before it.
pub(super) fn enforce_retention(
    conn: &Connection,
    now_unix_nano: u64,
    retention: Duration,
) -> rusqlite::Result<RetentionStats> {
    let retention = u64::try_from(retention.as_nanos()).unwrap_or(u64::MAX);
    let cutoff = now_unix_nano.saturating_sub(retention);
    // A minute [m, m + 1 min) is older than the cutoff when it ended at or before it.
    let last_old_minute = sql_time(cutoff) - sql_time(MINUTE_NANOS);
    let rollups = conn.execute(
        "DELETE FROM rollups WHERE minute <= ?1",
        params![last_old_minute],
    )?;
    let requests = conn.execute(
        "DELETE FROM requests WHERE minute <= ?1",
        params![last_old_minute],
    )?;
    let events = conn.execute(
        "DELETE FROM findings WHERE t < ?1",
        params![sql_time(cutoff)],
    )? + conn.execute("DELETE FROM alerts WHERE t < ?1", params![sql_time(cutoff)])?;
    let critical_slots = conn.execute(
        "DELETE FROM critical_slots WHERE start < ?1",
        params![sql_time(cutoff)],
    )?;
    let runs = conn.execute(
        "DELETE FROM runs WHERE through < ?1",
        params![sql_time(cutoff)],
    )?;
    Ok(RetentionStats {
        rollups,
        requests,
        events,
        critical_slots,
        runs,
    })
}

/// Deletes series no rollup refers to any more; returns how many.
pub(super) fn prune_series(conn: &Connection) -> rusqlite::Result<usize> {
    conn.execute(
        "DELETE FROM series WHERE NOT EXISTS
            (SELECT 1 FROM rollups WHERE rollups.series_id = series.id)",
        [],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_gets_the_schema_and_is_recognised_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        drop(open(&path).unwrap());
        let conn = open(&path).unwrap();
        let id: i64 = conn
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .unwrap();
        assert_eq!(id, APPLICATION_ID);
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let page: i64 = conn
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .unwrap();
        assert_eq!(page, PAGE_SIZE);
    }

    #[test]
    fn a_store_written_before_the_critical_path_slots_gets_their_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let conn = open(&path).unwrap();
        conn.execute_batch("DROP TABLE critical_slots").unwrap();
        drop(conn);
        let conn = open(&path).unwrap();
        add_missing_tables(&conn, &path).unwrap();
        let n: i64 = conn
            .query_row("SELECT count(*) FROM critical_slots", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 0);
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, 1, "still readable by the builds before it");
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let conn = open(&path).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        drop(conn);
        let err = open(&path).unwrap_err();
        assert!(
            matches!(err, StoreError::NewerSchema { found: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("x.db"));
    }

    /// One series and `n` minutes of 2 kB rollups: a store of many pages.
    fn add_minutes(conn: &Connection, n: i64) {
        conn.execute(
            "INSERT INTO series (id, service, model, operation) VALUES (1, 's', 'm', 'o')",
            [],
        )
        .unwrap();
        for minute in 0..n {
            conn.execute(
                "INSERT INTO rollups (series_id, minute, requests, acc) VALUES (1, ?1, 1, ?2)",
                params![minute, vec![7u8; 2000]],
            )
            .unwrap();
        }
    }

    /// A checkpoint that stopped after page 1 (the disk filled as the file grew): the main
    /// file's header counts pages that are only in the `-wal`, so it cannot be read alone. The
    /// check reads it with its `-wal`, as `open` does, instead of calling it malformed.
    #[test]
    fn a_store_readable_only_with_its_wal_passes_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("live.db");
        let conn = open(&live).unwrap();
        conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .unwrap();
        add_minutes(&conn, 200);
        // The crash: copy the files while the writer still holds them, nothing checkpointed.
        let copy = dir.path().join("copy.db");
        for suffix in ["", "-wal", "-shm"] {
            let name = |p: &Path| format!("{}{suffix}", p.display());
            std::fs::copy(name(&live), name(&copy)).unwrap();
        }
        drop(conn);
        // The cut-short checkpoint: the newest page 1 of the WAL written into the main file.
        let wal = std::fs::read(format!("{}-wal", copy.display())).unwrap();
        let page_size = u32::from_be_bytes(wal[8..12].try_into().unwrap()) as usize;
        let mut frames = wal[32..].chunks_exact(24 + page_size);
        let page_one = frames
            .rfind(|f| u32::from_be_bytes(f[..4].try_into().unwrap()) == 1)
            .expect("page 1 in the WAL");
        let mut main = std::fs::read(&copy).unwrap();
        main[..page_size].copy_from_slice(&page_one[24..]);
        std::fs::write(&copy, &main).unwrap();

        let alone = dir.path().join("alone.db");
        std::fs::write(&alone, &main).unwrap();
        assert!(
            check_existing(&alone).is_err(),
            "without its WAL the main file cannot be read"
        );
        check_existing(&copy).unwrap();
        let files = |d: &Path| std::fs::read_dir(d).unwrap().count();
        let before = files(dir.path());
        check_existing(&copy).unwrap();
        assert_eq!(files(dir.path()), before, "the check created no file");
        // Without its -shm the WAL is not read (a reader would create one): the first answer.
        let bare = dir.path().join("bare");
        std::fs::create_dir(&bare).unwrap();
        let bare_db = bare.join("copy.db");
        std::fs::copy(&copy, &bare_db).unwrap();
        std::fs::copy(
            format!("{}-wal", copy.display()),
            format!("{}-wal", bare_db.display()),
        )
        .unwrap();
        assert!(check_existing(&bare_db).is_err());
        assert_eq!(files(&bare), 2, "no -shm created");
        // And `open` reads the same data.
        let conn = open(&copy).unwrap();
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM rollups", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 200);
    }

    /// 8 KiB overwritten in the middle of a store, which reads fine until a history read
    /// reaches the damage: the check names the damage.
    #[test]
    fn a_store_damaged_inside_fails_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let conn = open(&path).unwrap();
        add_minutes(&conn, 300);
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .unwrap();
        drop(conn);
        check_existing(&path).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle..middle + 8192].fill(0xab);
        std::fs::write(&path, &bytes).unwrap();
        let e = check_existing(&path).unwrap_err();
        assert!(
            matches!(e, StoreError::Damaged { .. } | StoreError::Sqlite { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("x.db"), "{e}");
    }

    #[test]
    fn retention_cuts_at_whole_minutes() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir.path().join("x.db")).unwrap();
        conn.execute(
            "INSERT INTO series (id, service, model, operation) VALUES (1, 's', 'm', 'o')",
            [],
        )
        .unwrap();
        let m = MINUTE_NANOS as i64;
        for minute in [0, m, 2 * m] {
            conn.execute(
                "INSERT INTO rollups (series_id, minute, requests, acc) VALUES (1, ?1, 1, x'00')",
                params![minute],
            )
            .unwrap();
        }
        // Cutoff at 2 min: minute 0 and minute 1 (ending exactly at the cutoff) go.
        let stats = enforce_retention(&conn, 3 * MINUTE_NANOS, Duration::from_secs(60)).unwrap();
        assert_eq!(stats.rollups, 2);
        assert_eq!(prune_series(&conn).unwrap(), 0);
        enforce_retention(&conn, 10 * MINUTE_NANOS, Duration::from_secs(60)).unwrap();
        assert_eq!(prune_series(&conn).unwrap(), 1);
    }
}
