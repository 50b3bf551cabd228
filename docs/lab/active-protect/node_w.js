// Four worker threads each fill a quarter of a 128 MiB SharedArrayBuffer, build 800,000
// small objects, sort them, JSON.stringify and JSON.parse them; prints a SHA-256 per worker
// and of the buffer (compare with an unmanaged run).
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');
const crypto=require('crypto');
if (isMainThread) {
  const sab=new SharedArrayBuffer(128*1024*1024); const u=new Uint8Array(sab);
  let done=0; const res=[];
  for(let k=0;k<4;k++){ const w=new Worker(__filename,{workerData:{k,sab}}); w.on('message',m=>{res[k]=m; if(++done==4){ console.log(res.join('\n')); console.log(crypto.createHash('sha256').update(u).digest('hex'));}}); w.on('error',e=>{console.error(e);process.exit(3)}); }
} else {
  const {k,sab}=workerData; const u=new Uint8Array(sab);
  for(let i=k;i<u.length;i+=4) u[i]=(i*7+k)&255;
  let seed=k+1; const a=[]; for(let i=0;i<800000;i++){ seed=(seed*1103515245+12345)&0x7fffffff; a.push({s:seed, t:'x'+seed}); }
  a.sort((x,y)=>x.s-y.s);
  const j=JSON.stringify(a); const b=JSON.parse(j);
  parentPort.postMessage(k+' '+b.length+' '+crypto.createHash('sha256').update(j).digest('hex'));
}
