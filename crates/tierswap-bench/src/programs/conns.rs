//! The protocols the lab's client speaks: RESP to redis-server, memcached's text protocol,
//! and a length-prefixed frame protocol on a pipe to the lab's Python programs.
//!
//! Owns: one [`Conn`] per protocol. Calls: crate::redis's RESP client.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::process::{ChildStdin, ChildStdout};
use std::time::{Duration, Instant};

use super::client::Conn;
use super::keys::{key_name, value_of};
use crate::redis::{Client, Reply};

fn bad_reply(what: &str, got: impl std::fmt::Debug) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{what} answered {got:?}"))
}

/// A redis-server connection (RESP).
pub struct RespConn(Client);

impl RespConn {
    /// Connects to 127.0.0.1:`port`, waiting up to `wait` for the server.
    pub fn connect(port: u16, wait: Duration) -> std::io::Result<RespConn> {
        Client::connect(port, wait).map(RespConn)
    }
}

impl Conn for RespConn {
    fn get(&mut self, idx: u64, out: &mut Vec<u8>) -> std::io::Result<bool> {
        match self.0.call(&[b"GET", key_name(idx).as_bytes()])? {
            Reply::Bulk(Some(v)) => {
                *out = v;
                Ok(true)
            }
            Reply::Bulk(None) => Ok(false),
            other => Err(bad_reply("GET", other)),
        }
    }

    fn set(&mut self, idx: u64, value: &[u8]) -> std::io::Result<()> {
        match self.0.call(&[b"SET", key_name(idx).as_bytes(), value])? {
            Reply::Simple(_) => Ok(()),
            other => Err(bad_reply("SET", other)),
        }
    }

    fn load(&mut self, first: u64, count: u64, value_bytes: usize) -> std::io::Result<()> {
        let mut v = Vec::with_capacity(value_bytes);
        for k in first..first + count {
            value_of(k, 0, value_bytes, &mut v);
            self.0.send(&[b"SET", key_name(k).as_bytes(), &v])?;
        }
        self.0.flush()?;
        for _ in 0..count {
            match self.0.reply()? {
                Reply::Simple(_) => {}
                other => return Err(bad_reply("SET", other)),
            }
        }
        Ok(())
    }
}

/// A memcached connection, text protocol (`get`, `set`).
pub struct MemcachedConn {
    w: BufWriter<TcpStream>,
    r: BufReader<TcpStream>,
    line: Vec<u8>,
}

impl MemcachedConn {
    /// Connects to 127.0.0.1:`port`, waiting up to `wait` for the server to listen.
    pub fn connect(port: u16, wait: Duration) -> std::io::Result<MemcachedConn> {
        let deadline = Instant::now() + wait;
        let s = loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(600)))?;
        Ok(MemcachedConn {
            r: BufReader::with_capacity(1 << 20, s.try_clone()?),
            w: BufWriter::with_capacity(1 << 20, s),
            line: Vec::new(),
        })
    }

    fn read_line(&mut self) -> std::io::Result<&[u8]> {
        self.line.clear();
        self.r.read_until(b'\n', &mut self.line)?;
        if !self.line.ends_with(b"\r\n") {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "memcached closed the connection"));
        }
        Ok(&self.line[..self.line.len() - 2])
    }

    fn send_set(&mut self, idx: u64, value: &[u8]) -> std::io::Result<()> {
        write!(self.w, "set {} 0 0 {}\r\n", key_name(idx), value.len())?;
        self.w.write_all(value)?;
        self.w.write_all(b"\r\n")
    }

    fn stored(&mut self) -> std::io::Result<()> {
        let line = self.read_line()?;
        if line != b"STORED" {
            return Err(bad_reply("set", String::from_utf8_lossy(line)));
        }
        Ok(())
    }
}

impl Conn for MemcachedConn {
    fn get(&mut self, idx: u64, out: &mut Vec<u8>) -> std::io::Result<bool> {
        write!(self.w, "get {}\r\n", key_name(idx))?;
        self.w.flush()?;
        let line = self.read_line()?;
        if line == b"END" {
            return Ok(false);
        }
        // VALUE <key> <flags> <bytes>
        let text = String::from_utf8_lossy(line).into_owned();
        let bytes = text
            .strip_prefix("VALUE ")
            .and_then(|t| t.split_whitespace().nth(2))
            .and_then(|b| b.parse::<usize>().ok())
            .ok_or_else(|| bad_reply("get", &text))?;
        out.resize(bytes + 2, 0);
        self.r.read_exact(out)?;
        out.truncate(bytes);
        let end = self.read_line()?;
        if end != b"END" {
            return Err(bad_reply("get (after the value)", String::from_utf8_lossy(end)));
        }
        Ok(true)
    }

    fn set(&mut self, idx: u64, value: &[u8]) -> std::io::Result<()> {
        self.send_set(idx, value)?;
        self.w.flush()?;
        self.stored()
    }

    fn load(&mut self, first: u64, count: u64, value_bytes: usize) -> std::io::Result<()> {
        let mut v = Vec::with_capacity(value_bytes);
        for k in first..first + count {
            value_of(k, 0, value_bytes, &mut v);
            self.send_set(k, &v)?;
        }
        self.w.flush()?;
        for _ in 0..count {
            self.stored()?;
        }
        Ok(())
    }
}

/// A pipe to one of the lab's Python programs (`python.rs`). Frames, little-endian:
///
/// ```text
/// request   G | key u32                      -> len u32 (0xFFFF_FFFF: no such key) | bytes
///           S | key u32 | len u32 | bytes    -> K
///           B | count u32 | bytes u32 | count × (key u32 | len u32 | bytes)  -> K
/// ```
pub struct PipeConn {
    w: BufWriter<ChildStdin>,
    r: BufReader<ChildStdout>,
}

/// The length a GET answers for a key the program does not hold.
const NO_SUCH_KEY: u32 = u32::MAX;

impl PipeConn {
    /// Talks to a program over its stdin and stdout.
    pub fn new(stdin: ChildStdin, stdout: ChildStdout) -> PipeConn {
        PipeConn { w: BufWriter::with_capacity(1 << 20, stdin), r: BufReader::with_capacity(1 << 20, stdout) }
    }

    /// Waits for the program's one-byte greeting (`R`: ready), sent once it has set up.
    pub fn wait_ready(&mut self) -> std::io::Result<()> {
        let mut b = [0u8; 1];
        self.r.read_exact(&mut b)?;
        if b[0] != b'R' {
            return Err(bad_reply("the program's start", b[0] as char));
        }
        Ok(())
    }

    fn ack(&mut self, what: &str) -> std::io::Result<()> {
        let mut b = [0u8; 1];
        self.r.read_exact(&mut b)?;
        if b[0] != b'K' {
            return Err(bad_reply(what, b[0] as char));
        }
        Ok(())
    }

    /// Ends the conversation: the program sees end of input and exits.
    pub fn close(self) {
        drop(self.w);
    }
}

fn key_u32(idx: u64) -> std::io::Result<[u8; 4]> {
    u32::try_from(idx)
        .map(u32::to_le_bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("key {idx} does not fit 32 bits")))
}

impl Conn for PipeConn {
    fn get(&mut self, idx: u64, out: &mut Vec<u8>) -> std::io::Result<bool> {
        self.w.write_all(b"G")?;
        self.w.write_all(&key_u32(idx)?)?;
        self.w.flush()?;
        let mut len = [0u8; 4];
        self.r.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len);
        if len == NO_SUCH_KEY {
            return Ok(false);
        }
        out.resize(len as usize, 0);
        self.r.read_exact(out)?;
        Ok(true)
    }

    fn set(&mut self, idx: u64, value: &[u8]) -> std::io::Result<()> {
        self.w.write_all(b"S")?;
        self.w.write_all(&key_u32(idx)?)?;
        self.w.write_all(&(value.len() as u32).to_le_bytes())?;
        self.w.write_all(value)?;
        self.w.flush()?;
        self.ack("S")
    }

    fn load(&mut self, first: u64, count: u64, value_bytes: usize) -> std::io::Result<()> {
        let mut v = Vec::with_capacity(value_bytes);
        let body = count as usize * (8 + value_bytes);
        self.w.write_all(b"B")?;
        self.w.write_all(&(count as u32).to_le_bytes())?;
        self.w.write_all(&(body as u32).to_le_bytes())?;
        for k in first..first + count {
            value_of(k, 0, value_bytes, &mut v);
            self.w.write_all(&key_u32(k)?)?;
            self.w.write_all(&(v.len() as u32).to_le_bytes())?;
            self.w.write_all(&v)?;
        }
        self.w.flush()?;
        self.ack("B")
    }
}
