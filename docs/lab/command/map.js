// A Map of N objects built, read at random 2N times, then digested.
const n = +process.argv[2];
const m = new Map();
let seed = 1;
const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648);
for (let i = 0; i < n; i++) {
  m.set('k' + i, { id: i, name: 'v' + rnd().toString(36).repeat(12), tags: [rnd() % 1000, rnd() % 1000] });
}
let s = 0;
for (let j = 0; j < 2 * n; j++) {
  const v = m.get('k' + (rnd() % n));
  s = (s + v.name.length + v.tags[0]) % 1000000007;
}
const h = require('crypto').createHash('sha256');
for (let i = 0; i < n; i += 7) h.update(JSON.stringify(m.get('k' + i)));
console.log(s, h.digest('hex'));
