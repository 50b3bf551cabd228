//! The programs lab's data: reproducible values (half words, half hex of random bytes) made
//! from a key's index and version, and the two key distributions the requests draw from:
//! uniform, and Zipfian with θ = 0.99 (the YCSB default) scrambled over the key space.
//!
//! Owns: value bytes, key names, the request generators. Calls nothing outside std.

/// Bytes of one value (the default 1 KiB of the redis lab).
pub const VALUE_BYTES: usize = 1024;

/// The Zipfian skew: YCSB's default.
pub const ZIPF_THETA: f64 = 0.99;

/// A small deterministic generator (splitmix64): every stream here is reproducible from its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6A09_E667_F3BC_C908)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// Words the first half of a value is made of: plain English, like the text fields of a
/// cached record (the half that compresses).
const WORDS: [&str; 64] = [
    "account", "address", "amount", "answer", "balance", "banner", "basket", "billing", "branch", "button", "cache",
    "caption", "channel", "checkout", "city", "comment", "company", "country", "coupon", "created", "customer",
    "delivery", "device", "discount", "email", "event", "expires", "feature", "filter", "first", "gallery", "greeting",
    "history", "invoice", "language", "last", "locale", "message", "mobile", "name", "number", "order", "payment",
    "phone", "picture", "price", "product", "profile", "quantity", "rating", "region", "review", "segment", "shipping",
    "status", "street", "summary", "theme", "title", "token", "updated", "user", "version", "window",
];

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The value of key `idx` at `version` (0: as loaded; a SET writes the next version), `len`
/// bytes: the first half words from [`WORDS`] separated by spaces, the second half hex of
/// random bytes. Reproducible and distinct per (key, version).
pub fn value_of(idx: u64, version: u32, len: usize, out: &mut Vec<u8>) {
    out.clear();
    let mut rng = Rng::new(idx.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ ((version as u64) << 40) ^ 0x5851_F42D);
    let words_len = len / 2;
    while out.len() < words_len {
        let mut r = rng.next_u64();
        for _ in 0..10 {
            if out.len() >= words_len {
                break;
            }
            if !out.is_empty() {
                out.push(b' ');
            }
            out.extend_from_slice(WORDS[(r & 63) as usize].as_bytes());
            r >>= 6;
        }
    }
    out.truncate(words_len);
    while out.len() < len {
        let r = rng.next_u64();
        for b in r.to_le_bytes() {
            if out.len() + 2 > len {
                if out.len() < len {
                    out.push(HEX[(b & 15) as usize]);
                }
                break;
            }
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 15) as usize]);
        }
    }
}

/// The name of key `idx` in the servers that name keys (redis, memcached): 16 bytes.
pub fn key_name(idx: u64) -> String {
    format!("key:{idx:012}")
}

/// How the requests pick keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Distribution {
    /// Every key equally likely.
    Uniform,
    /// Zipfian, θ = [`ZIPF_THETA`], ranks scrambled over the key space.
    Zipfian,
}

impl Distribution {
    /// The name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Distribution::Uniform => "uniform",
            Distribution::Zipfian => "zipfian",
        }
    }

    /// Both, in report order.
    pub const ALL: [Distribution; 2] = [Distribution::Uniform, Distribution::Zipfian];
}

/// Draws Zipfian ranks in [0, n) with rank 0 the most popular (the rejection-free method of
/// Gray et al., "Quickly generating billion-record synthetic databases", which YCSB uses).
#[derive(Clone, Debug)]
struct Zipf {
    n: u64,
    theta: f64,
    zeta_n: f64,
    alpha: f64,
    eta: f64,
}

impl Zipf {
    fn new(n: u64, theta: f64) -> Zipf {
        let zeta = |m: u64| (1..=m).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zeta_n = zeta(n);
        let zeta_2 = zeta(2.min(n));
        let eta = if n <= 2 { 0.0 } else { (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta_2 / zeta_n) };
        Zipf { n, theta, zeta_n, alpha: 1.0 / (1.0 - theta), eta }
    }

    fn rank(&self, rng: &mut Rng) -> u64 {
        let u = rng.next_f64();
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.n - 1);
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n - 1)
    }
}

/// A bijection of [0, n) that spreads neighbouring ranks over the key space: `r·a + c mod n`
/// with `a` coprime to n (the popular keys land far apart, as YCSB's scrambling does, and no
/// two ranks share a key).
#[derive(Clone, Debug)]
struct Scramble {
    n: u64,
    a: u64,
    c: u64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Scramble {
    fn new(n: u64) -> Scramble {
        let mut a = (0x9E37_79B9_7F4A_7C15u64 % n.max(1)).max(1);
        while n > 1 && gcd(a, n) != 1 {
            a += 1;
        }
        Scramble { n, a, c: 0x2545_F491_4F6C_DD1D % n.max(1) }
    }

    fn apply(&self, r: u64) -> u64 {
        ((r as u128 * self.a as u128 + self.c as u128) % self.n as u128) as u64
    }
}

/// Picks the keys of a phase: `n` keys, one distribution.
#[derive(Clone, Debug)]
pub struct KeyChooser {
    n: u64,
    zipf: Option<(Zipf, Scramble)>,
}

impl KeyChooser {
    /// A chooser over keys [0, n). Zipfian makes its constant in O(n) once.
    pub fn new(n: u64, dist: Distribution) -> KeyChooser {
        let n = n.max(1);
        let zipf = match dist {
            Distribution::Uniform => None,
            Distribution::Zipfian => Some((Zipf::new(n, ZIPF_THETA), Scramble::new(n))),
        };
        KeyChooser { n, zipf }
    }

    /// The next key.
    pub fn next(&self, rng: &mut Rng) -> u64 {
        match &self.zipf {
            None => rng.below(self.n),
            Some((z, s)) => s.apply(z.rank(rng)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_reproducible_distinct_and_half_words_half_hex() {
        let (mut a, mut b, mut c, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        value_of(42, 0, 1024, &mut a);
        value_of(42, 0, 1024, &mut b);
        value_of(43, 0, 1024, &mut c);
        value_of(42, 1, 1024, &mut d);
        assert_eq!(a.len(), 1024);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d, "a new version is a new value");
        assert!(a[..512].iter().all(|x| x.is_ascii_lowercase() || *x == b' '));
        assert!(a[512..].iter().all(|x| HEX.contains(x)));
        for len in [1, 2, 3, 7, 100, 4097] {
            value_of(9, 3, len, &mut a);
            assert_eq!(a.len(), len);
        }
        assert_eq!(key_name(123), "key:000000000123");
    }

    #[test]
    fn scramble_is_a_bijection() {
        for n in [1u64, 2, 3, 10, 97, 1000, 1024] {
            let s = Scramble::new(n);
            let mut seen = vec![false; n as usize];
            for r in 0..n {
                let k = s.apply(r) as usize;
                assert!(!seen[k], "n={n}: {k} twice");
                seen[k] = true;
            }
        }
    }

    #[test]
    fn zipfian_is_skewed_and_uniform_is_not() {
        let n = 10_000;
        let mut rng = Rng::new(7);
        let count = |c: &KeyChooser, rng: &mut Rng| {
            let mut hits = vec![0u32; n as usize];
            for _ in 0..200_000 {
                let k = c.next(rng);
                assert!(k < n);
                hits[k as usize] += 1;
            }
            hits.sort_unstable_by(|a, b| b.cmp(a));
            // Share of the requests going to the hottest 1 % of the keys.
            hits[..(n as usize / 100)].iter().map(|&h| h as f64).sum::<f64>() / 200_000.0
        };
        let zipf = count(&KeyChooser::new(n, Distribution::Zipfian), &mut rng);
        let uniform = count(&KeyChooser::new(n, Distribution::Uniform), &mut rng);
        // θ = 0.99 over 10,000 keys: the top 1 % takes about half of the requests.
        assert!(zipf > 0.4 && zipf < 0.7, "zipfian top 1 %: {zipf}");
        assert!(uniform < 0.03, "uniform top 1 %: {uniform}");
    }
}
