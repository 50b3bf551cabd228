//! The lab's Python programs, run by Debian's python3 the way a user runs a script: a dict of
//! ~1 GiB of byte strings with lookups and updates, and a sqlite table of ~1 GiB read by
//! primary key through the sqlite3 module with a page cache large enough to hold the whole
//! table (so the cache is the program's anonymous memory). Both serve the frames of
//! [`super::conns::PipeConn`] on stdin/stdout; the client times and verifies in Rust.
//!
//! Owns: the scripts' text and where they are written. Calls nothing.

use std::path::{Path, PathBuf};

/// The dict program.
pub const KV_DICT: &str = r#""""A dict of byte strings served over stdin/stdout frames (the tierswap lab)."""
import struct
import sys


def main():
    inp = open(0, "rb", buffering=1 << 20, closefd=False)
    out = open(1, "wb", buffering=1 << 20, closefd=False)
    read, write, flush = inp.read, out.write, out.flush
    unpack_from, pack = struct.unpack_from, struct.pack
    missing = pack("<I", 0xFFFFFFFF)
    table = {}
    write(b"R")
    flush()
    while True:
        op = read(1)
        if not op:
            return
        if op == b"G":
            (key,) = unpack_from("<I", read(4))
            value = table.get(key)
            if value is None:
                write(missing)
            else:
                write(pack("<I", len(value)))
                write(value)
            flush()
        elif op == b"S":
            key, n = unpack_from("<II", read(8))
            table[key] = read(n)
            write(b"K")
            flush()
        elif op == b"B":
            count, size = unpack_from("<II", read(8))
            buf = read(size)
            off = 0
            for _ in range(count):
                key, n = unpack_from("<II", buf, off)
                off += 8
                table[key] = buf[off:off + n]
                off += n
            write(b"K")
            flush()
        else:
            sys.exit("kv_dict.py: unknown request %r" % op)


main()
"#;

/// The sqlite program: `kv_sqlite.py build DB CACHE_KIB` makes the table from `B` frames
/// until end of input; `kv_sqlite.py serve DB CACHE_KIB ROWS` reads the whole table into its
/// page cache (the file's own page cache dropped before and after) and answers `G` frames.
pub const KV_SQLITE: &str = r#""""Point selects on a sqlite table, served over stdin/stdout frames (the tierswap lab)."""
import os
import sqlite3
import struct
import sys


def drop_file_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main():
    mode, path, cache_kib = sys.argv[1], sys.argv[2], int(sys.argv[3])
    inp = open(0, "rb", buffering=1 << 20, closefd=False)
    out = open(1, "wb", buffering=1 << 20, closefd=False)
    read, write, flush = inp.read, out.write, out.flush
    unpack_from, pack = struct.unpack_from, struct.pack
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA cache_size=-%d" % cache_kib)
    con.execute("PRAGMA mmap_size=0")
    if mode == "build":
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
        con.execute("BEGIN")
        write(b"R")
        flush()
        while True:
            op = read(1)
            if not op:
                break
            if op != b"B":
                sys.exit("kv_sqlite.py build: unknown request %r" % op)
            count, size = unpack_from("<II", read(8))
            buf = read(size)
            rows, off = [], 0
            for _ in range(count):
                key, n = unpack_from("<II", buf, off)
                off += 8
                rows.append((key, buf[off:off + n]))
                off += n
            con.executemany("INSERT INTO kv VALUES (?, ?)", rows)
            write(b"K")
            flush()
        con.execute("COMMIT")
        con.close()
        drop_file_cache(path)
        return
    want_rows = int(sys.argv[4])
    con.execute("PRAGMA query_only=1")
    drop_file_cache(path)
    (rows,) = con.execute("SELECT count(*) FROM kv WHERE length(v) > 0").fetchone()
    if rows != want_rows:
        sys.exit("kv_sqlite.py: %s holds %d rows, not %d: remove it and run the lab again" % (path, rows, want_rows))
    drop_file_cache(path)
    select = "SELECT v FROM kv WHERE k = ?"
    execute = con.execute
    missing = pack("<I", 0xFFFFFFFF)
    write(b"R")
    flush()
    while True:
        op = read(1)
        if not op:
            return
        if op != b"G":
            sys.exit("kv_sqlite.py serve: unknown request %r (the table is read-only)" % op)
        (key,) = unpack_from("<I", read(4))
        row = execute(select, (key,)).fetchone()
        if row is None:
            write(missing)
        else:
            write(pack("<I", len(row[0])))
            write(row[0])
        flush()


main()
"#;

/// Debian's interpreter: /usr/bin/python3 when it is there (a pyenv or venv python3 earlier
/// in PATH is not the distribution's), else `python3` from PATH.
pub fn python3() -> PathBuf {
    let debian = Path::new("/usr/bin/python3");
    if debian.exists() {
        debian.to_path_buf()
    } else {
        PathBuf::from("python3")
    }
}

/// Writes the two scripts into `dir` (readable by everyone); returns (dict, sqlite) paths.
pub fn write_scripts(dir: &Path) -> Result<(PathBuf, PathBuf), String> {
    use std::os::unix::fs::PermissionsExt;
    let mut paths = Vec::new();
    for (name, text) in [("kv_dict.py", KV_DICT), ("kv_sqlite.py", KV_SQLITE)] {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644));
        paths.push(p);
    }
    Ok((paths[0].clone(), paths[1].clone()))
}

/// Checks that python3 and its sqlite3 module are there.
pub fn check(sqlite: bool) -> Result<(), String> {
    let py = python3();
    let code = if sqlite { "import sqlite3" } else { "pass" };
    match std::process::Command::new(&py).args(["-c", code]).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "{} cannot run the lab's {} program: {}; install python3 (apt-get install python3)",
            py.display(),
            if sqlite { "sqlite" } else { "Python" },
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run {}: {e}; install it with apt-get install python3", py.display())),
    }
}
