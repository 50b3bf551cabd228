//! Whether `tierswap run` can reach a program at all.
//!
//! The shim comes in through `LD_PRELOAD`, which only the dynamic loader reads. A program
//! the loader never runs (statically linked, static-pie included), runs in secure mode
//! (setuid or setgid to someone else, file capabilities: it ignores `LD_PRELOAD` then), or
//! cannot load the shim into (a 32-bit or foreign-architecture executable) starts with
//! nothing managed and no word from the shim, which never loads. So `run` looks at the
//! executable before it execs it, following `#!` lines to the interpreter, and says why in
//! one line (`--strict`: exit 2 instead).
//!
//! The ELF program headers are read with goblin from the file's first bytes; the rest is
//! stat(2) and one getxattr(2).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use goblin::elf::program_header::{ProgramHeader, PT_INTERP};

/// `#!` lines followed before giving up (the kernel allows 4 levels too).
const MAX_SCRIPT_DEPTH: usize = 4;
/// Bytes read first: the ELF header and, nearly always, the program headers.
const HEAD_BYTES: usize = 4096;

/// Why the shim cannot reach `prog`, in one line, or `None` when it can (or when `prog`
/// cannot be found or read: exec then says what is wrong with it).
pub fn unreachable_reason(prog: &OsStr) -> Option<String> {
    let mut path = resolve(prog)?;
    let mut via: Vec<String> = Vec::new();
    for _ in 0..=MAX_SCRIPT_DEPTH {
        let head = read_head(&path, HEAD_BYTES)?;
        if let Some(interp) = script_interpreter(&head) {
            via.push(path.display().to_string());
            path = resolve(&interp)?;
            continue;
        }
        let name = if via.is_empty() {
            path.display().to_string()
        } else {
            format!("{} (the interpreter of {})", path.display(), via.join(", run by "))
        };
        return secure_mode(&path).or_else(|| elf_reason(&path, &head)).map(|why| format!("{name} {why}"));
    }
    None
}

/// `prog` as execvp finds it: a name with a slash as it is, else the first executable file
/// of that name on `PATH`.
fn resolve(prog: &OsStr) -> Option<PathBuf> {
    if prog.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(prog));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|d| d.join(prog)).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    p.metadata().is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
}

fn read_head(path: &Path, n: usize) -> Option<Vec<u8>> {
    let mut buf = Vec::with_capacity(n);
    File::open(path).ok()?.take(n as u64).read_to_end(&mut buf).ok()?;
    Some(buf)
}

/// The program a `#!` line runs: its interpreter, or for `/usr/bin/env [-S] NAME` the NAME
/// env looks up on `PATH`.
fn script_interpreter(head: &[u8]) -> Option<std::ffi::OsString> {
    let line = head.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
    let mut words = line.split(|b| b.is_ascii_whitespace()).filter(|w| !w.is_empty());
    let interp = words.next()?;
    if Path::new(OsStr::from_bytes(interp)).file_name() == Some(OsStr::new("env")) {
        // `env NAME`, `env -S NAME ARGS` (one word after -S or glued to it), `env -i NAME`.
        for w in words {
            let w = w.strip_prefix(b"-S").filter(|rest| !rest.is_empty()).unwrap_or(w);
            if !w.starts_with(b"-") && !w.contains(&b'=') {
                return Some(OsStr::from_bytes(w).to_owned());
            }
        }
        return None;
    }
    Some(OsStr::from_bytes(interp).to_owned())
}

/// Why the loader would run `path` in secure mode (ignoring `LD_PRELOAD`), if it would.
fn secure_mode(path: &Path) -> Option<String> {
    let m = path.metadata().ok()?;
    if m.mode() & (libc::S_ISUID | libc::S_ISGID) != 0 && mounted_nosuid(path) {
        return None;
    }
    // SAFETY: getuid/getgid take no arguments and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    if m.mode() & libc::S_ISUID != 0 && m.uid() != uid {
        return Some(format!(
            "is setuid (to uid {}): the loader ignores LD_PRELOAD for it; nothing will be managed",
            m.uid()
        ));
    }
    if m.mode() & libc::S_ISGID != 0 && m.gid() != gid {
        return Some(format!(
            "is setgid (to gid {}): the loader ignores LD_PRELOAD for it; nothing will be managed",
            m.gid()
        ));
    }
    if uid != 0 && has_file_capabilities(path) {
        return Some("has file capabilities: the loader ignores LD_PRELOAD for it; nothing will be managed".into());
    }
    None
}

/// Whether `path` lies on a filesystem mounted nosuid (its setuid and setgid bits do nothing).
fn mounted_nosuid(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return false };
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` room for one statvfs, which the call
    // fills when it returns 0 (only then is it read).
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: statvfs returned 0, so it wrote the whole struct.
    let st = unsafe { st.assume_init() };
    st.f_flag & libc::ST_NOSUID != 0
}

fn has_file_capabilities(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: both strings are NUL-terminated; a null buffer of size 0 asks for the size only.
    let n = unsafe { libc::getxattr(c.as_ptr(), c"security.capability".as_ptr(), std::ptr::null_mut(), 0) };
    n > 0
}

/// Why the loader would not load the shim into the ELF executable whose first bytes are
/// `head`: statically linked, or not this machine's 64-bit kind. `None` for a dynamically
/// linked executable of the shim's kind, and for anything that is not ELF.
fn elf_reason(path: &Path, head: &[u8]) -> Option<String> {
    let header = goblin::elf::Elf::parse_header(head).ok()?;
    let class64 = header.e_ident[goblin::elf::header::EI_CLASS] == goblin::elf::header::ELFCLASS64;
    if !class64 || header.e_machine != host_machine() {
        return Some(format!(
            "is a {} executable for {}, and the shim is {}: the loader cannot load it there; nothing will be managed",
            if class64 { "64-bit" } else { "32-bit" },
            goblin::elf::header::machine_to_str(header.e_machine),
            std::env::consts::ARCH
        ));
    }
    let ctx = goblin::container::Ctx::new(header.container().ok()?, header.endianness().ok()?);
    let end = header.e_phoff as usize + header.e_phnum as usize * header.e_phentsize as usize;
    let bytes = if end <= head.len() { head.to_vec() } else { read_head(path, end)? };
    let phdrs = ProgramHeader::parse(&bytes, header.e_phoff as usize, header.e_phnum as usize, ctx).ok()?;
    if phdrs.iter().any(|p| p.p_type == PT_INTERP) {
        return None;
    }
    Some("is statically linked: LD_PRELOAD cannot reach its memory; nothing will be managed".into())
}

/// The ELF machine this binary (and so the shim beside it) was built for.
fn host_machine() -> u16 {
    use goblin::elf::header::{EM_386, EM_AARCH64, EM_RISCV, EM_X86_64};
    match std::env::consts::ARCH {
        "x86_64" => EM_X86_64,
        "aarch64" => EM_AARCH64,
        "riscv64" => EM_RISCV,
        _ => EM_386,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shebang_lines_name_their_interpreter() {
        let cases: [(&[u8], Option<&str>); 7] = [
            (b"#!/bin/sh\necho", Some("/bin/sh")),
            (b"#! /usr/bin/python3 -u\n", Some("/usr/bin/python3")),
            (b"#!/usr/bin/env node\n", Some("node")),
            (b"#!/usr/bin/env -S java -jar\n", Some("java")),
            (b"#!/usr/bin/env -Sgo run\n", Some("go")),
            (b"#!/usr/bin/env -i A=1 perl\n", Some("perl")),
            (b"\x7fELF", None),
        ];
        for (head, want) in cases {
            let got = script_interpreter(head);
            assert_eq!(got.as_deref(), want.map(OsStr::new), "{}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn this_test_binary_is_reachable_and_a_missing_program_says_nothing() {
        let me = std::env::current_exe().unwrap();
        assert_eq!(unreachable_reason(me.as_os_str()), None);
        assert_eq!(unreachable_reason(OsStr::new("/nonexistent/prog")), None);
        assert_eq!(unreachable_reason(OsStr::new("no-such-program-on-path-xyz")), None);
    }
}
