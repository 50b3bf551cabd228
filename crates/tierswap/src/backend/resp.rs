//! A small synchronous Redis Cluster client: RESP2 over TCP, the cluster's slot map from
//! `CLUSTER SLOTS`, CRC16 key slots, MOVED/ASK redirections, and pipelining (every command
//! of a batch for one node is written before any reply is read: one round trip per node).
//!
//! Written for the remote tier ([`crate::backend::remote`]): it needs SET with a TTL,
//! GET into a caller's buffer, DEL, WAIT, SCAN; nothing else. Works against Redis and
//! Valkey 7 in cluster mode, and against a single non-cluster server (one node owning
//! every slot).
//!
//! Owns: its TCP connections and slot map. Calls: the OS (sockets).

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Slots of a Redis cluster.
pub const CLUSTER_SLOTS: usize = 16384;
/// Redirection rounds a pipeline follows before giving up.
const MAX_REDIRECT_ROUNDS: usize = 4;
/// [`Conn::read_bulk_into`]'s protocol error for a value longer than the caller's buffer
/// (read whole and dropped, so the connection stays in step).
const TOO_LONG: &str = "value longer than expected";

/// A client error. `Io` and `Down` mean "try again later"; the others are answers.
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    /// A connection failed, timed out or was closed.
    #[error("redis {addr}: {source}")]
    Io {
        /// The node.
        addr: String,
        /// The OS error.
        source: io::Error,
    },
    /// The server sent something that is not RESP2.
    #[error("redis {addr}: malformed reply ({what})")]
    Protocol {
        /// The node.
        addr: String,
        /// What was wrong.
        what: &'static str,
    },
    /// The server answered with an error.
    #[error("redis {addr}: {msg}")]
    Server {
        /// The node.
        addr: String,
        /// The error line.
        msg: String,
    },
    /// No node answered CLUSTER SLOTS, or a slot has no node.
    #[error("redis cluster unreachable: {0}")]
    Down(String),
    /// WAIT returned fewer replicas than asked for: the write is not durable as configured.
    #[error("redis {addr}: only {acked} of {wanted} replicas acknowledged the write in time")]
    NotDurable {
        /// The node.
        addr: String,
        /// Replicas that acknowledged.
        acked: i64,
        /// Replicas asked for.
        wanted: u32,
    },
}

/// A RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Status(String),
    /// `-ERR …`.
    Error(String),
    /// `:n`.
    Int(i64),
    /// `$n` bytes, or `$-1` (nil).
    Bulk(Option<Vec<u8>>),
    /// `*n` replies, or `*-1` (nil).
    Array(Option<Vec<Reply>>),
}

/// The cluster slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag (the part
/// between the first `{` and the next `}`, when not empty), modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let mut k = key;
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                k = &key[open + 1..open + 1 + len];
            }
        }
    }
    crc16(k) % CLUSTER_SLOTS as u16
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// Appends one command in RESP2 form (an array of bulk strings) to `out`.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    push_header(out, b'*', args.len());
    for a in args {
        push_header(out, b'$', a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
}

/// One connection to one node. Its buffers are kept between commands, so a GET on the
/// fault path allocates nothing once the connection exists.
///
/// `owed` counts the replies the server still has to send for commands queued here. Any
/// error part-way through a pipeline (a timeout, a node that failed while another's
/// replies were unread) leaves it above zero, and [`Cluster::conn`] then replaces the
/// connection instead of lending it out: a reply is never read as the answer to a later
/// command.
pub struct Conn {
    addr: String,
    reader: BufReader<TcpStream>,
    wbuf: Vec<u8>,
    line: Vec<u8>,
    owed: usize,
}

impl Conn {
    /// Connects to `addr` (`host:port`) with `timeout` for connecting, reading and writing.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Conn, RespError> {
        let io_err = |source| RespError::Io { addr: addr.to_string(), source };
        let sa = addr
            .to_socket_addrs()
            .map_err(io_err)?
            .next()
            .ok_or_else(|| io_err(io::Error::new(io::ErrorKind::NotFound, "no address")))?;
        let stream = TcpStream::connect_timeout(&sa, timeout).map_err(io_err)?;
        stream.set_read_timeout(Some(timeout)).map_err(io_err)?;
        stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
        stream.set_nodelay(true).map_err(io_err)?;
        Ok(Conn {
            addr: addr.to_string(),
            reader: BufReader::with_capacity(64 << 10, stream),
            wbuf: Vec::with_capacity(64 << 10),
            line: Vec::with_capacity(128),
            owed: 0,
        })
    }

    /// The node's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn io(&self, source: io::Error) -> RespError {
        RespError::Io { addr: self.addr.clone(), source }
    }

    /// Queues a command; nothing is sent until [`Conn::flush`].
    pub fn queue(&mut self, args: &[&[u8]]) {
        encode(&mut self.wbuf, args);
        self.owed += 1;
    }

    /// Whether every reply of every queued command has been read (the next reply read
    /// answers the next command queued).
    pub fn in_step(&self) -> bool {
        self.owed == 0 && self.wbuf.is_empty()
    }

    /// Sends the queued commands.
    pub fn flush(&mut self) -> Result<(), RespError> {
        let r = self.reader.get_mut().write_all(&self.wbuf);
        self.wbuf.clear();
        r.map_err(|e| self.io(e))
    }

    /// One command, one reply.
    pub fn call(&mut self, args: &[&[u8]]) -> Result<Reply, RespError> {
        self.queue(args);
        self.flush()?;
        self.read_reply()
    }

    /// Reads one line without its CRLF into `self.line`.
    fn read_line(&mut self) -> Result<(), RespError> {
        self.line.clear();
        let n = self
            .reader
            .read_until(b'\n', &mut self.line)
            .map_err(|e| RespError::Io { addr: self.addr.clone(), source: e })?;
        if n == 0 {
            return Err(self.io(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed")));
        }
        if self.line.len() < 2 || self.line[self.line.len() - 2] != b'\r' {
            return Err(self.protocol("line without CRLF"));
        }
        self.line.truncate(self.line.len() - 2);
        Ok(())
    }

    fn protocol(&self, what: &'static str) -> RespError {
        RespError::Protocol { addr: self.addr.clone(), what }
    }

    fn line_int(&self) -> Result<i64, RespError> {
        std::str::from_utf8(&self.line[1..])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| self.protocol("bad integer"))
    }

    /// Reads one reply.
    pub fn read_reply(&mut self) -> Result<Reply, RespError> {
        let r = self.parse_reply()?;
        self.owed = self.owed.saturating_sub(1);
        Ok(r)
    }

    /// One reply, arrays recursively; counts nothing (see [`Conn::read_reply`]).
    fn parse_reply(&mut self) -> Result<Reply, RespError> {
        self.read_line()?;
        let kind = *self.line.first().ok_or_else(|| self.protocol("empty line"))?;
        match kind {
            b'+' => Ok(Reply::Status(String::from_utf8_lossy(&self.line[1..]).into_owned())),
            b'-' => Ok(Reply::Error(String::from_utf8_lossy(&self.line[1..]).into_owned())),
            b':' => Ok(Reply::Int(self.line_int()?)),
            b'$' => {
                let n = self.line_int()?;
                if n < 0 {
                    return Ok(Reply::Bulk(None));
                }
                let mut v = vec![0u8; n as usize];
                self.read_exact_crlf(&mut v)?;
                Ok(Reply::Bulk(Some(v)))
            }
            b'*' => {
                let n = self.line_int()?;
                if n < 0 {
                    return Ok(Reply::Array(None));
                }
                let mut items = Vec::with_capacity(n.min(1 << 16) as usize);
                for _ in 0..n {
                    items.push(self.parse_reply()?);
                }
                Ok(Reply::Array(Some(items)))
            }
            _ => Err(self.protocol("unknown reply type")),
        }
    }

    fn read_exact_crlf(&mut self, out: &mut [u8]) -> Result<(), RespError> {
        self.reader.read_exact(out).map_err(|e| RespError::Io { addr: self.addr.clone(), source: e })?;
        let mut crlf = [0u8; 2];
        self.reader.read_exact(&mut crlf).map_err(|e| RespError::Io { addr: self.addr.clone(), source: e })?;
        if crlf != *b"\r\n" {
            return Err(self.protocol("bulk string without CRLF"));
        }
        Ok(())
    }

    /// Reads a reply that should be a bulk string straight into `out`: `Ok(Ok(Some(n)))`
    /// for n bytes, `Ok(Ok(None))` for nil, `Ok(Err(reply))` for anything else (an error
    /// line such as MOVED). A bulk string longer than `out` is read and dropped, and
    /// reported as a protocol error.
    pub fn read_bulk_into(&mut self, out: &mut [u8]) -> Result<Result<Option<usize>, Reply>, RespError> {
        let r = self.parse_bulk_into(out);
        // A value too long for `out` was read whole: the stream is still in step.
        if matches!(r, Ok(_) | Err(RespError::Protocol { what: TOO_LONG, .. })) {
            self.owed = self.owed.saturating_sub(1);
        }
        r
    }

    fn parse_bulk_into(&mut self, out: &mut [u8]) -> Result<Result<Option<usize>, Reply>, RespError> {
        self.read_line()?;
        match self.line.first() {
            Some(b'$') => {
                let n = self.line_int()?;
                if n < 0 {
                    return Ok(Ok(None));
                }
                let n = n as usize;
                if n > out.len() {
                    let mut sink = vec![0u8; n];
                    self.read_exact_crlf(&mut sink)?;
                    return Err(self.protocol(TOO_LONG));
                }
                self.read_exact_crlf(&mut out[..n])?;
                Ok(Ok(Some(n)))
            }
            Some(b'-') => Ok(Err(Reply::Error(String::from_utf8_lossy(&self.line[1..]).into_owned()))),
            Some(b'+') => Ok(Err(Reply::Status(String::from_utf8_lossy(&self.line[1..]).into_owned()))),
            Some(b':') => Ok(Err(Reply::Int(self.line_int()?))),
            Some(b'*') => {
                // Put the header back by parsing the rest as an array.
                let n = self.line_int()?;
                let mut items = Vec::new();
                for _ in 0..n.max(0) {
                    items.push(self.parse_reply()?);
                }
                Ok(Err(Reply::Array((n >= 0).then_some(items))))
            }
            _ => Err(self.protocol("unknown reply type")),
        }
    }
}

/// A redirection the cluster asked for.
#[derive(Debug, PartialEq, Eq)]
enum Redirect {
    /// The slot moved for good: refresh the map.
    Moved(String),
    /// The slot is migrating: ask that node once, preceded by ASKING.
    Ask(String),
    /// The cluster is failing over or resharding: try again shortly.
    Retry,
}

fn redirect_of(msg: &str) -> Option<Redirect> {
    let mut words = msg.split_whitespace();
    match words.next()? {
        "MOVED" => Some(Redirect::Moved(words.nth(1)?.to_string())),
        "ASK" => Some(Redirect::Ask(words.nth(1)?.to_string())),
        "TRYAGAIN" | "CLUSTERDOWN" | "LOADING" => Some(Redirect::Retry),
        _ => None,
    }
}

fn node_of_map(map: &[u16], key: &[u8]) -> u16 {
    map[key_slot(key) as usize]
}

/// One command of a pipeline: its key decides the node.
pub struct Cmd<'a> {
    /// The key (also among `args`).
    pub key: &'a [u8],
    /// The whole command, name first.
    pub args: Vec<&'a [u8]>,
}

/// A client of one cluster: a slot map and a connection per node, used by one thread at a
/// time (the remote tier keeps a few and lends them out).
pub struct ClusterClient {
    seeds: Vec<String>,
    timeout: Duration,
    /// Node address per slot ("" when no node serves it).
    slot_node: Vec<u16>,
    nodes: Vec<String>,
    conns: HashMap<String, Conn>,
    /// The map may be out of date (a redirection or a dead connection was seen).
    stale: bool,
}

impl ClusterClient {
    /// A client for the cluster behind `seeds` (`host:port` each); it reads the slot map
    /// from the first seed that answers.
    pub fn connect(seeds: &[String], timeout: Duration) -> Result<ClusterClient, RespError> {
        let mut c = ClusterClient {
            seeds: seeds.to_vec(),
            timeout,
            slot_node: vec![u16::MAX; CLUSTER_SLOTS],
            nodes: Vec::new(),
            conns: HashMap::new(),
            stale: true,
        };
        c.refresh()?;
        Ok(c)
    }

    /// Primaries serving at least one slot, as the map has them.
    pub fn primaries(&self) -> Vec<String> {
        let mut seen = vec![false; self.nodes.len()];
        for &n in &self.slot_node {
            if (n as usize) < seen.len() {
                seen[n as usize] = true;
            }
        }
        self.nodes.iter().zip(seen).filter(|(_, s)| *s).map(|(a, _)| a.clone()).collect()
    }

    /// The primary serving `key`'s slot.
    pub fn node_for(&self, key: &[u8]) -> Result<&str, RespError> {
        let slot = key_slot(key);
        let n = self.slot_node[slot as usize];
        self.nodes
            .get(n as usize)
            .map(String::as_str)
            .ok_or_else(|| RespError::Down(format!("no node serves slot {slot}")))
    }

    /// Re-reads the slot map from the known nodes, then the seeds.
    pub fn refresh(&mut self) -> Result<(), RespError> {
        let mut candidates: Vec<String> = self.nodes.clone();
        for s in &self.seeds {
            if !candidates.contains(s) {
                candidates.push(s.clone());
            }
        }
        let mut last = String::from("no seeds given");
        for addr in candidates {
            match self.slots_from(&addr) {
                Ok(()) => {
                    self.stale = false;
                    return Ok(());
                }
                Err(e) => {
                    self.conns.remove(&addr);
                    last = e.to_string();
                }
            }
        }
        Err(RespError::Down(last))
    }

    fn slots_from(&mut self, addr: &str) -> Result<(), RespError> {
        let host = addr.rsplit_once(':').map(|(h, _)| h.to_string()).unwrap_or_default();
        let reply = self.conn(addr)?.call(&[b"CLUSTER", b"SLOTS"])?;
        let mut nodes: Vec<String> = Vec::new();
        let mut map = vec![u16::MAX; CLUSTER_SLOTS];
        match reply {
            Reply::Array(Some(ranges)) => {
                for r in ranges {
                    let Reply::Array(Some(f)) = r else { continue };
                    let (Some(Reply::Int(lo)), Some(Reply::Int(hi)), Some(Reply::Array(Some(p)))) =
                        (f.first(), f.get(1), f.get(2))
                    else {
                        continue;
                    };
                    let ip = match p.first() {
                        Some(Reply::Bulk(Some(b))) if !b.is_empty() && b != b"?" => {
                            String::from_utf8_lossy(b).into_owned()
                        }
                        _ => host.clone(),
                    };
                    let Some(Reply::Int(port)) = p.get(1) else { continue };
                    let a = format!("{ip}:{port}");
                    let idx = match nodes.iter().position(|n| *n == a) {
                        Some(i) => i,
                        None => {
                            nodes.push(a);
                            nodes.len() - 1
                        }
                    };
                    for s in (*lo).max(0)..=(*hi).min(CLUSTER_SLOTS as i64 - 1) {
                        map[s as usize] = idx as u16;
                    }
                }
            }
            Reply::Error(msg) if msg.contains("cluster support disabled") => {
                // A single server: it owns every slot.
                nodes.push(addr.to_string());
                map.fill(0);
            }
            Reply::Error(msg) => return Err(RespError::Server { addr: addr.to_string(), msg }),
            _ => return Err(RespError::Protocol { addr: addr.to_string(), what: "CLUSTER SLOTS reply" }),
        }
        if nodes.is_empty() {
            return Err(RespError::Down(format!("{addr} knows no slots yet")));
        }
        self.nodes = nodes;
        self.slot_node = map;
        Ok(())
    }

    /// The connection to `addr`, opened on first use.
    pub fn conn(&mut self, addr: &str) -> Result<&mut Conn, RespError> {
        // A connection that owes replies (an earlier pipeline stopped part-way) would answer
        // the next command with an older command's reply: it is replaced.
        if self.conns.get(addr).is_some_and(|c| !c.in_step()) {
            self.conns.remove(addr);
        }
        if !self.conns.contains_key(addr) {
            let c = Conn::connect(addr, self.timeout)?;
            self.conns.insert(addr.to_string(), c);
        }
        Ok(self.conns.get_mut(addr).expect("inserted above"))
    }

    /// The connection to `addr` a pipeline wrote to, to read its replies (it owes them, so
    /// [`Cluster::conn`] would replace it).
    fn owing_conn(&mut self, addr: &str) -> Result<&mut Conn, RespError> {
        self.conns.get_mut(addr).ok_or_else(|| RespError::Io {
            addr: addr.to_string(),
            source: io::Error::new(io::ErrorKind::NotConnected, "connection lost between writing and reading"),
        })
    }

    /// Forgets a connection after an error (its stream may hold half a reply).
    fn drop_conn(&mut self, addr: &str) {
        self.conns.remove(addr);
        self.stale = true;
    }

    /// GET `key` into `out`: `Ok(Some(n))` for n bytes, `Ok(None)` when the key does not
    /// exist. Follows redirections. One round trip unless the cluster redirects.
    pub fn get_into(&mut self, key: &[u8], out: &mut [u8]) -> Result<Option<usize>, RespError> {
        if self.stale {
            self.refresh()?;
        }
        let mut target = self.node_for(key)?.to_string();
        let mut asking = false;
        for _ in 0..MAX_REDIRECT_ROUNDS {
            let conn = match self.conn(&target) {
                Ok(c) => c,
                Err(e) => {
                    self.drop_conn(&target);
                    return Err(e);
                }
            };
            if asking {
                conn.queue(&[b"ASKING"]);
            }
            conn.queue(&[b"GET", key]);
            let res = conn.flush().and_then(|()| {
                if asking {
                    conn.read_reply()?;
                }
                conn.read_bulk_into(out)
            });
            let reply = match res {
                Ok(r) => r,
                Err(e) => {
                    self.drop_conn(&target);
                    return Err(e);
                }
            };
            match reply {
                Ok(v) => return Ok(v),
                Err(Reply::Error(msg)) => match redirect_of(&msg) {
                    Some(Redirect::Moved(a)) => {
                        self.stale = true;
                        target = a;
                        asking = false;
                    }
                    Some(Redirect::Ask(a)) => {
                        target = a;
                        asking = true;
                    }
                    Some(Redirect::Retry) | None => return Err(RespError::Server { addr: target, msg }),
                },
                Err(_) => return Err(RespError::Protocol { addr: target, what: "GET reply not a bulk string" }),
            }
        }
        Err(RespError::Down(format!("too many redirections for a key on {target}")))
    }

    /// GETs `keys` pipelined, one round trip per node, each value into its own `stride`
    /// bytes of `buf`; `got[i]` says how many bytes key `i` has there (`None`: missing,
    /// redirected, or longer than `stride`; the caller reads those one by one). Allocates
    /// nothing once the connections exist.
    pub fn get_many_into(
        &mut self,
        keys: &[&[u8]],
        buf: &mut [u8],
        stride: usize,
        got: &mut [Option<usize>],
    ) -> Result<(), RespError> {
        if self.stale {
            self.refresh()?;
        }
        got.iter_mut().for_each(|g| *g = None);
        // The maps are taken out while connections are borrowed, and put back at the end.
        let slot_node = std::mem::take(&mut self.slot_node);
        let nodes = std::mem::take(&mut self.nodes);
        let res = self.get_many_with(&slot_node, &nodes, keys, buf, stride, got);
        self.slot_node = slot_node;
        self.nodes = nodes;
        if let Err((addr, e)) = res {
            self.drop_conn(&addr);
            return Err(e);
        }
        Ok(())
    }

    fn get_many_with(
        &mut self,
        slot_node: &[u16],
        nodes: &[String],
        keys: &[&[u8]],
        buf: &mut [u8],
        stride: usize,
        got: &mut [Option<usize>],
    ) -> Result<(), (String, RespError)> {
        // Nodes in order of first appearance (a range's keys share one or two slots).
        let mut order = [u16::MAX; 16];
        let mut n_nodes = 0;
        for k in keys {
            let n = node_of_map(slot_node, k);
            if !order[..n_nodes].contains(&n) {
                if n_nodes == order.len() {
                    break;
                }
                order[n_nodes] = n;
                n_nodes += 1;
            }
        }
        let order = &order[..n_nodes];
        let addr_of = |n: u16| nodes.get(n as usize).map(String::as_str);
        // Write every node's GETs first…
        for &node in order {
            let Some(addr) = addr_of(node) else { continue };
            let conn = self.conn(addr).map_err(|e| (addr.to_string(), e))?;
            for k in keys.iter().filter(|k| node_of_map(slot_node, k) == node) {
                conn.queue(&[b"GET", k]);
            }
            conn.flush().map_err(|e| (addr.to_string(), e))?;
        }
        // …then read every node's replies.
        let mut stale = false;
        for &node in order {
            let Some(addr) = addr_of(node) else { continue };
            let conn = self.owing_conn(addr).map_err(|e| (addr.to_string(), e))?;
            for (i, k) in keys.iter().enumerate() {
                if node_of_map(slot_node, k) != node {
                    continue;
                }
                let out = &mut buf[i * stride..(i + 1) * stride];
                match conn.read_bulk_into(out) {
                    Ok(Ok(n)) => got[i] = n,
                    Ok(Err(Reply::Error(msg))) if redirect_of(&msg).is_some() => stale = true,
                    Ok(Err(_)) => {}
                    Err(RespError::Protocol { what: TOO_LONG, .. }) => {}
                    Err(e) => return Err((addr.to_string(), e)),
                }
            }
        }
        self.stale |= stale;
        Ok(())
    }

    /// Runs `cmds` pipelined: every command for one node is written, followed by
    /// `WAIT replicas timeout` when `wait` is given, before any reply is read, so a batch
    /// costs one round trip per node (the nodes' round trips overlap: all are written
    /// first). Redirected commands go again in another round. Returns each command's reply
    /// in order; error replies other than redirections are returned as replies. A WAIT
    /// that counts fewer replicas than asked is [`RespError::NotDurable`].
    pub fn pipeline(&mut self, cmds: &[Cmd<'_>], wait: Option<(u32, u64)>) -> Result<Vec<Reply>, RespError> {
        if self.stale {
            self.refresh()?;
        }
        let mut out: Vec<Option<Reply>> = vec![None; cmds.len()];
        // (command index, node, asking)
        let mut todo: Vec<(usize, String, bool)> = Vec::with_capacity(cmds.len());
        for (i, c) in cmds.iter().enumerate() {
            todo.push((i, self.node_for(c.key)?.to_string(), false));
        }
        let wait_args = wait.map(|(n, ms)| (n, n.to_string(), ms.to_string()));
        for _ in 0..MAX_REDIRECT_ROUNDS {
            if todo.is_empty() {
                break;
            }
            // Group by node, keeping command order within a node.
            let mut groups: Vec<(String, Vec<(usize, bool)>)> = Vec::new();
            for (i, node, asking) in todo.drain(..) {
                match groups.iter_mut().find(|(n, _)| *n == node) {
                    Some((_, g)) => g.push((i, asking)),
                    None => groups.push((node, vec![(i, asking)])),
                }
            }
            // Write everything first…
            for (node, group) in &groups {
                let conn = match self.conn(node) {
                    Ok(c) => c,
                    Err(e) => {
                        self.drop_conn(node);
                        return Err(e);
                    }
                };
                for &(i, asking) in group {
                    if asking {
                        conn.queue(&[b"ASKING"]);
                    }
                    conn.queue(&cmds[i].args);
                }
                if let Some((_, n, ms)) = &wait_args {
                    conn.queue(&[b"WAIT", n.as_bytes(), ms.as_bytes()]);
                }
                if let Err(e) = conn.flush() {
                    self.drop_conn(node);
                    return Err(e);
                }
            }
            // …then read every node's replies.
            let mut moved = false;
            for (node, group) in groups {
                let res = (|| -> Result<(), RespError> {
                    let conn = self.owing_conn(&node)?;
                    for &(i, asking) in &group {
                        if asking {
                            conn.read_reply()?;
                        }
                        let r = conn.read_reply()?;
                        if let Reply::Error(msg) = &r {
                            match redirect_of(msg) {
                                Some(Redirect::Moved(a)) => {
                                    moved = true;
                                    todo.push((i, a, false));
                                    continue;
                                }
                                Some(Redirect::Ask(a)) => {
                                    todo.push((i, a, true));
                                    continue;
                                }
                                Some(Redirect::Retry) => {
                                    return Err(RespError::Server { addr: node.clone(), msg: msg.clone() })
                                }
                                None => {}
                            }
                        }
                        out[i] = Some(r);
                    }
                    if let Some((wanted, _, _)) = &wait_args {
                        match conn.read_reply()? {
                            Reply::Int(acked) if acked >= *wanted as i64 => {}
                            Reply::Int(acked) => {
                                return Err(RespError::NotDurable { addr: node.clone(), acked, wanted: *wanted })
                            }
                            Reply::Error(msg) => return Err(RespError::Server { addr: node.clone(), msg }),
                            _ => return Err(RespError::Protocol { addr: node.clone(), what: "WAIT reply" }),
                        }
                    }
                    Ok(())
                })();
                if let Err(e) = res {
                    // The stream may hold unread replies: start over on a new connection.
                    self.drop_conn(&node);
                    return Err(e);
                }
            }
            if moved {
                self.stale = true;
            }
        }
        if !todo.is_empty() {
            return Err(RespError::Down("too many redirections in a pipeline".into()));
        }
        Ok(out.into_iter().map(|r| r.unwrap_or(Reply::Bulk(None))).collect())
    }

    /// Every key matching `pattern` on every primary (SCAN, so the servers never block).
    pub fn scan_keys(&mut self, pattern: &[u8]) -> Result<Vec<Vec<u8>>, RespError> {
        if self.stale {
            self.refresh()?;
        }
        let mut keys = Vec::new();
        for node in self.primaries() {
            let conn = self.conn(&node)?;
            let mut cursor = b"0".to_vec();
            loop {
                let r = conn.call(&[b"SCAN", &cursor, b"MATCH", pattern, b"COUNT", b"1000"])?;
                let Reply::Array(Some(mut parts)) = r else {
                    return Err(RespError::Protocol { addr: node.clone(), what: "SCAN reply" });
                };
                if parts.len() != 2 {
                    return Err(RespError::Protocol { addr: node.clone(), what: "SCAN reply" });
                }
                if let Reply::Array(Some(found)) = parts.pop().expect("two parts") {
                    keys.extend(found.into_iter().filter_map(|k| match k {
                        Reply::Bulk(Some(b)) => Some(b),
                        _ => None,
                    }));
                }
                match parts.pop() {
                    Some(Reply::Bulk(Some(c))) => cursor = c,
                    _ => return Err(RespError::Protocol { addr: node.clone(), what: "SCAN cursor" }),
                }
                if cursor == b"0" {
                    break;
                }
            }
        }
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_the_cluster_spec() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"), "empty tag: the whole key");
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn encodes_resp_arrays() {
        let mut v = Vec::new();
        encode(&mut v, &[b"SET", b"k", b""]);
        assert_eq!(v, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
        v.clear();
        encode(&mut v, &[&[7u8; 1234][..]]);
        assert!(v.starts_with(b"*1\r\n$1234\r\n"));
        assert_eq!(v.len(), 4 + 7 + 1234 + 2);
    }

    #[test]
    fn redirections_parse() {
        assert_eq!(redirect_of("MOVED 3999 127.0.0.1:6381"), Some(Redirect::Moved("127.0.0.1:6381".into())));
        assert_eq!(redirect_of("ASK 3999 127.0.0.1:6381"), Some(Redirect::Ask("127.0.0.1:6381".into())));
        assert_eq!(redirect_of("CLUSTERDOWN The cluster is down"), Some(Redirect::Retry));
        assert_eq!(redirect_of("ERR wrong number of arguments"), None);
    }

    /// A listener on a free loopback port for [`serve`].
    fn fake_node() -> (std::net::TcpListener, String) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        (l, addr)
    }

    /// A fake cluster node, to test the client's own stream handling: it answers CLUSTER
    /// SLOTS with `map` (slots 0..8191 on the first node, the rest on the second) and GET
    /// with the key itself as the value, or, when `close_on_get`, hangs up instead.
    fn serve(l: std::net::TcpListener, map: [String; 2], close_on_get: bool) {
        std::thread::spawn(move || {
            for stream in l.incoming() {
                let Ok(stream) = stream else { return };
                let map = map.clone();
                std::thread::spawn(move || {
                    let mut w = stream.try_clone().unwrap();
                    let mut r = BufReader::new(stream);
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let n: usize = line.trim_end()[1..].parse().unwrap();
                        let mut args = Vec::new();
                        for _ in 0..n {
                            line.clear();
                            r.read_line(&mut line).unwrap();
                            let len: usize = line.trim_end()[1..].parse().unwrap();
                            let mut a = vec![0u8; len + 2];
                            r.read_exact(&mut a).unwrap();
                            a.truncate(len);
                            args.push(a);
                        }
                        let reply = match args[0].as_slice() {
                            b"CLUSTER" => {
                                let node = |a: &str| {
                                    let (h, p) = a.rsplit_once(':').unwrap();
                                    format!("*2\r\n${}\r\n{h}\r\n:{p}\r\n", h.len())
                                };
                                format!(
                                    "*2\r\n*3\r\n:0\r\n:8191\r\n{}*3\r\n:8192\r\n:16383\r\n{}",
                                    node(&map[0]),
                                    node(&map[1])
                                )
                                .into_bytes()
                            }
                            b"GET" if close_on_get => return,
                            b"GET" => {
                                let mut v = format!("${}\r\n", args[1].len()).into_bytes();
                                v.extend_from_slice(&args[1]);
                                v.extend_from_slice(b"\r\n");
                                v
                            }
                            _ => b"-ERR unknown\r\n".to_vec(),
                        };
                        w.write_all(&reply).unwrap();
                    }
                });
            }
        });
    }

    /// Regression: a pipelined GET over two nodes whose first node failed left the second
    /// node's replies unread, and the next GET on that node got an older key's value (the
    /// remote tier then reported a corrupt object and the reader got SIGBUS).
    #[test]
    fn a_pipeline_that_fails_part_way_never_hands_out_an_older_reply() {
        let (la, a) = fake_node();
        let (lb, b) = fake_node();
        serve(la, [a.clone(), b.clone()], true);
        serve(lb, [a.clone(), b.clone()], false);
        let mut c = ClusterClient::connect(std::slice::from_ref(&a), Duration::from_secs(2)).unwrap();
        let on_b: Vec<Vec<u8>> =
            (0..).map(|i| format!("k{i}").into_bytes()).filter(|k| key_slot(k) >= 8192).take(3).collect();
        let on_a = (0..).map(|i| format!("k{i}").into_bytes()).find(|k| key_slot(k) < 8192).unwrap();
        assert_eq!(c.node_for(&on_a).unwrap(), a);
        assert_eq!(c.node_for(&on_b[0]).unwrap(), b);

        let keys: [&[u8]; 3] = [&on_a, &on_b[0], &on_b[1]];
        let mut buf = vec![0u8; 3 * 64];
        let mut got = [None; 3];
        assert!(c.get_many_into(&keys, &mut buf, 64, &mut got).is_err(), "the first node hung up");
        // The second node still owes two replies on that connection.
        let mut out = [0u8; 64];
        let n = c.get_into(&on_b[2], &mut out).unwrap().unwrap();
        assert_eq!(&out[..n], &on_b[2][..], "the value of the key asked for, not an earlier reply");
        let n = c.get_into(&on_b[0], &mut out).unwrap().unwrap();
        assert_eq!(&out[..n], &on_b[0][..]);
    }
}
