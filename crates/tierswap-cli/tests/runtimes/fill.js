// Fills MIB MiB: half in Buffers (1 MiB each, off V8's heap, malloc'd), half in JS arrays
// of small integers (on V8's heap, 128 Ki elements of 8 bytes each), every element set from
// its place; "churn SECONDS" then keeps making short-lived objects (checked before they
// die) and replacing a live array now and then for that long; then every byte and element
// is read back twice. Prints "node ok ..." when all were right, then "vmhwm_kib N" (the
// process's peak resident memory). Exit 1 otherwise.
'use strict';
const fs = require('fs');
const mib = parseInt(process.argv[2], 10);
const want = (i, j) => (Math.imul(i, 0x9e3779b1) ^ Math.imul(j, 0x85ebca77)) >>> 24;
const bufs = [];
const arrays = [];
for (let i = 0; i < mib / 2; i++) {
  const b = Buffer.allocUnsafe(1 << 20);
  for (let j = 0; j < b.length; j++) b[j] = want(i, j);
  bufs.push(b);
  const a = new Array(1 << 17);
  for (let j = 0; j < a.length; j++) a[j] = want(j, i) + j;
  arrays.push(a);
}
let bad = 0;
let churned = 0;
if (process.argv[3] === 'churn') {
  const end = Date.now() + 1000 * parseFloat(process.argv[4]);
  let seed = 7;
  const next = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0);
  while (Date.now() < end) {
    for (let k = 0; k < 64; k++) {
      const i = mib + (next() % 65536);
      const objs = [];
      for (let j = 0; j < 256; j++) objs.push({ i, j, v: want(i, j), s: 'x' + j });
      for (const o of objs) if (o.v !== want(o.i, o.j) || o.s !== 'x' + o.j) bad++;
      churned++;
    }
    if (arrays.length > 0) {
      const v = next() % arrays.length;
      const a = arrays[v];
      for (let j = 0; j < a.length; j++) if (a[j] !== want(j, v) + j) bad++;
      const fresh = new Array(1 << 17);
      for (let j = 0; j < fresh.length; j++) fresh[j] = want(j, v) + j;
      arrays[v] = fresh;
    }
  }
}
for (let pass = 0; pass < 2; pass++) {
  for (let i = 0; i < bufs.length; i++) {
    const b = bufs[i];
    for (let j = 0; j < b.length; j++) if (b[j] !== want(i, j)) bad++;
    const a = arrays[i];
    for (let j = 0; j < a.length; j++) if (a[j] !== want(j, i) + j) bad++;
  }
}
if (bad !== 0) {
  console.error(`MISMATCH node: ${bad} bytes or elements wrong`);
  process.exit(1);
}
console.log(`node ok ${mib} MiB, ${churned} short-lived batches`);
const hwm = fs.readFileSync('/proc/self/status', 'utf8').split('\n').find((l) => l.startsWith('VmHWM:'));
console.log(`vmhwm_kib ${parseInt(hwm.replace(/[^0-9]/g, ''), 10)}`);
