// 750k objects built, sorted and stringified; prints the size and a digest to compare runs.
const n = +process.argv[2];
let seed = 1;
const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0);
const objs = [];
for (let i = 0; i < n; i++) objs.push({ id: i, key: rnd(), name: 'item-' + rnd().toString(36) + '-' + i, tags: [rnd() % 100, rnd() % 1000, rnd() % 10], payload: 'x'.repeat(50 + rnd() % 100) });
objs.sort((a, b) => a.key - b.key || a.id - b.id);
const s = JSON.stringify(objs);
console.log(n, s.length, require('crypto').createHash('sha256').update(s).digest('hex'));
